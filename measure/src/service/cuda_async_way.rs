//! The service on NVIDIA's cuda-async 0.5 (feature `peer-cuda-async`): each
//! request is one `DeviceOp` built with `with_context` and scheduled on its
//! client's stream (a `SingleStream` policy per stream). Its closure
//! allocates the three buffers with `ExecutionContext::alloc_async`
//! (`cuMemAllocAsync`, the device's default pool), owns them as
//! `DeviceBox`es, queues the same [`CudaModel`] work, and returns the boxes
//! as the op's output: the `DeviceFuture` hands them back once the work
//! completed, and dropping them frees them on their stream.
//!
//! How a `DeviceFuture` completes (cuda-async 0.5, `device_future.rs`): the
//! first poll queues the op, then spins on `cuStreamQuery` for up to 20 µs
//! (`CUDA_ASYNC_SPIN_BUDGET_US`); only work still running after that is
//! watched by one process-wide reactor thread, through a
//! `cuStreamWriteValue32` into pinned host memory.
//!
//! Also the cuda-async side of the 10,000 fills row ([`CudaAsyncWay::fills`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_async::device_box::DeviceBox;
use cuda_async::device_operation::{DeviceOp, ExecutionContext, value, with_context};
use cuda_async::scheduling_policies::SingleStream;
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUstream;
use streamalloc::DriverCall;
use streamalloc::gpu::{GpuError, GpuResult};

use super::clients::join_clients;
use super::cuda_model::CudaModel;
use super::cudarc_way::DefaultPool;
use super::fills::FILLS;
use super::{LevelResult, Recorder, RequestShape, Shapes, ThreadSampler};

/// The way's name in the tables.
pub const NAME: &str = "cuda-async";

fn peer_error(call: DriverCall, e: impl std::fmt::Debug) -> GpuError {
    GpuError::driver(call, 0, format!("cuda-async: {e:?}"))
}

/// The three buffers of a request, handed back by its future.
type RequestBoxes = [DeviceBox<[f32]>; 3];

/// The cuda-async side: its context (the device's primary context, as
/// cudarc's), one single-stream policy per stream, the shared model.
pub struct CudaAsyncWay {
    ctx: Arc<cuda_core::Context>,
    policies: Vec<Arc<SingleStream>>,
    model: Arc<CudaModel>,
    pool: DefaultPool,
}

impl std::fmt::Debug for CudaAsyncWay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaAsyncWay")
            .field("streams", &self.policies.len())
            .finish_non_exhaustive()
    }
}

impl CudaAsyncWay {
    /// Opens device 0 through cuda-core and makes `streams` streams.
    ///
    /// # Errors
    /// A driver error.
    pub fn new(
        cudarc: &Arc<CudaContext>,
        model: Arc<CudaModel>,
        streams: usize,
    ) -> GpuResult<Self> {
        let ctx = cuda_core::Context::new(0).map_err(|e| peer_error(DriverCall::Init, e))?;
        let policies = (0..streams.max(1))
            .map(|_| {
                ctx.new_stream()
                    .map(|s| Arc::new(SingleStream::from_stream(s)))
                    .map_err(|e| peer_error(DriverCall::Init, e))
            })
            .collect::<GpuResult<_>>()?;
        Ok(CudaAsyncWay {
            ctx,
            policies,
            model,
            pool: DefaultPool::of(cudarc)?,
        })
    }

    /// Waits for every stream of its context.
    ///
    /// # Errors
    /// A driver error.
    pub fn synchronize(&self) -> GpuResult<()> {
        self.ctx
            .synchronize()
            .map_err(|e| peer_error(DriverCall::StreamSynchronize, e))
    }

    /// Its context (device 0's primary context, through cuda-core).
    pub fn context(&self) -> &Arc<cuda_core::Context> {
        &self.ctx
    }

    /// The scheduling policy of client `client`'s stream.
    pub fn policy(&self, client: usize) -> &SingleStream {
        &self.policies[client % self.policies.len()]
    }

    /// One level, as the other ways' (client `c` on stream `c mod streams`).
    ///
    /// # Errors
    /// The first error of a request or of the set-up.
    pub async fn run_level(
        self: &Arc<Self>,
        clients: usize,
        requests_per_client: usize,
        seed: u64,
    ) -> GpuResult<LevelResult> {
        self.synchronize()?;
        self.pool.trim_and_reset()?;
        let rec = Arc::new(Recorder::default());
        let threads = ThreadSampler::start();
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|client| {
                let (way, rec) = (self.clone(), rec.clone());
                tokio::spawn(async move {
                    let mut shapes = Shapes::new(seed, client, way.model.dims());
                    for _ in 0..requests_per_client {
                        way.serve_one(&rec, client, shapes.next_shape()).await?;
                    }
                    GpuResult::Ok(())
                })
            })
            .collect();
        let served = join_clients(tasks).await;
        let elapsed = start.elapsed();
        let threads = threads.stop();
        served?;
        self.synchronize()?;
        let held = self.pool.reserved_high()?;
        Ok(rec.finish(NAME, clients, elapsed, held, threads))
    }

    async fn serve_one(&self, rec: &Recorder, client: usize, shape: RequestShape) -> GpuResult<()> {
        let dims = self.model.dims();
        let policy = &self.policies[client % self.policies.len()];
        let model = self.model.clone();
        let bytes = shape.bytes(&dims);
        let t = Instant::now();
        // Counted from the request on, as in the other ways (the op
        // allocates them when first polled, at once).
        rec.requested(bytes);
        let op =
            with_context(move |ctx: &ExecutionContext| value(enqueue(ctx, &model, shape, client)));
        let answer = match op.schedule(&**policy) {
            Ok(future) => match future.await {
                Ok(boxes) => boxes,
                Err(e) => Err(peer_error(DriverCall::Launch, e)),
            },
            Err(e) => Err(peer_error(DriverCall::Launch, e)),
        };
        if answer.is_ok() {
            rec.answered(t.elapsed());
        }
        // Dropping the boxes queues their frees on the stream.
        let status = answer.map(drop);
        rec.released(bytes);
        status
    }

    /// 10,000 4-byte fills round-robin over the streams, each a `DeviceOp`
    /// scheduled on its stream and awaited by its own spawned task (the op
    /// queues its fill on first poll); per op, every task joined and every
    /// stream synchronized.
    ///
    /// # Errors
    /// A driver error.
    pub async fn fills(&self) -> GpuResult<Duration> {
        let mut targets = Vec::new();
        for policy in &self.policies {
            let stream = policy.stream().clone();
            // SAFETY: a live stream of this context; freed below after a synchronize.
            let ptr = unsafe { cuda_core::malloc_async(256, &stream) }
                .map_err(|e| peer_error(DriverCall::AllocAsync, e))?;
            targets.push((policy.clone(), ptr));
        }
        self.synchronize()?;
        let t = Instant::now();
        let mut tasks = Vec::with_capacity(FILLS);
        for i in 0..FILLS {
            let (policy, ptr) = &targets[i % targets.len()];
            let ptr = *ptr;
            let op = with_context(move |ctx: &ExecutionContext| {
                // SAFETY: `ptr` holds 256 bytes until the free below, which
                // follows a synchronize of every stream.
                value(unsafe { cuda_core::memset_d8_async(ptr, 3, 4, ctx.get_cuda_stream()) })
            });
            let future = op
                .schedule(&**policy)
                .map_err(|e| peer_error(DriverCall::MemsetAsync, e))?;
            tasks.push(tokio::spawn(future));
        }
        let mut first_error = None;
        for task in tasks {
            match task.await.expect("fill task") {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(peer_error(DriverCall::MemsetAsync, e));
                }
                Err(e) => {
                    first_error.get_or_insert(peer_error(DriverCall::MemsetAsync, e));
                }
            }
        }
        self.synchronize()?;
        let per_op = t.elapsed() / FILLS as u32;
        for (policy, ptr) in &targets {
            // SAFETY: allocated above, unused since the synchronize.
            let _ = unsafe { cuda_core::free_async(*ptr, policy.stream()) };
        }
        self.synchronize()?;
        first_error.map_or(Ok(per_op), Err)
    }
}

/// The op's body: the three buffers on the op's stream, the model's work
/// queued after them.
fn enqueue(
    ctx: &ExecutionContext,
    model: &CudaModel,
    shape: RequestShape,
    client: usize,
) -> GpuResult<RequestBoxes> {
    let stream = ctx.get_cuda_stream();
    let alloc = |n: usize| -> GpuResult<DeviceBox<[f32]>> {
        // SAFETY: the op's stream is live while the op executes.
        let ptr =
            unsafe { ctx.alloc_async(n * 4) }.map_err(|e| peer_error(DriverCall::AllocAsync, e))?;
        // SAFETY: `ptr` holds n floats, allocated on `stream` just now;
        // the model writes every element before reading it, on this stream.
        Ok(unsafe { DeviceBox::<[f32]>::from_raw_parts(ptr, n, stream.clone()) })
    };
    let [nx, nh, ny] = shape.elems(&model.dims());
    let boxes = [alloc(nx)?, alloc(nh)?, alloc(ny)?];
    let raw = stream.cu_stream() as usize as CUstream;
    let ptrs = [
        boxes[0].cu_deviceptr(),
        boxes[1].cu_deviceptr(),
        boxes[2].cu_deviceptr(),
    ];
    // SAFETY: the op's stream is a live stream of the device's primary
    // context (the model's); the boxes were allocated on it with the sizes of
    // `shape` and are the op's output, kept by its future until the work
    // completed and by the request after; the client awaits it before
    // sending again.
    unsafe { model.enqueue_raw(raw, ptrs, shape.rows(), client)? };
    Ok(boxes)
}
