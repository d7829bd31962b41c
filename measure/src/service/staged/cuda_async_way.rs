//! The staged service on NVIDIA's cuda-async 0.5 (feature
//! `peer-cuda-async`), as well as it allows: cuda-async has no host memory
//! of its own and cuda-core pools none, so each client pins its input and
//! output once (`PinnedHostBuffer`, for its largest request) and moves
//! them into each request's `DeviceOp`, which queues the copy in
//! (`cuMemcpyHtoDAsync`), the model and the copy out on its stream and
//! returns them with the device buffers: the `DeviceFuture` hands them
//! back once the work completed, and the host checks the result.

use std::sync::Arc;
use std::time::Instant;

use cuda_async::device_box::DeviceBox;
use cuda_async::device_operation::{DeviceOp, ExecutionContext, value, with_context};
use cuda_core::PinnedHostBuffer;
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUstream;
use streamalloc::DriverCall;
use streamalloc::gpu::{GpuError, GpuResult};

use super::super::cuda_async_way::CudaAsyncWay;
use super::super::cuda_model::CudaModel;
use super::super::cudarc_way::DefaultPool;
use super::super::{Dims, Recorder, RequestShape, Shapes, ThreadSampler};
use super::{StagedError, StagedRow, check_output, input_value};

/// The way's name in the tables.
pub const NAME: &str = "cuda-async+pinned";

fn peer_error(call: DriverCall, e: impl std::fmt::Debug) -> GpuError {
    GpuError::driver(call, 0, format!("cuda-async: {e:?}"))
}

/// One client's pinned input and output, for its largest request.
struct ClientPins {
    input: PinnedHostBuffer<f32>,
    output: PinnedHostBuffer<f32>,
}

impl std::fmt::Debug for ClientPins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPins")
            .field("input", &self.input.len())
            .field("output", &self.output.len())
            .finish()
    }
}

/// The request's device buffers and its client's pins, handed back by its
/// future.
type Answer = ([DeviceBox<[f32]>; 3], ClientPins);

/// The staged cuda-async side: the plain way's context and streams, and
/// every client's pinned buffers.
#[derive(Debug)]
pub struct StagedCudaAsync {
    way: Arc<CudaAsyncWay>,
    model: Arc<CudaModel>,
    pool: DefaultPool,
    clients: Vec<ClientPins>,
    bytes: usize,
}

impl StagedCudaAsync {
    /// Pins an input and an output of the largest request for each of
    /// `clients` clients, on the plain way's context.
    ///
    /// # Errors
    /// A driver error (out of pinned memory included).
    pub fn new(
        way: Arc<CudaAsyncWay>,
        cudarc: &Arc<CudaContext>,
        model: Arc<CudaModel>,
        clients: usize,
    ) -> GpuResult<Self> {
        let dims = model.dims();
        let (nx, ny) = (dims.max_rows() * dims.hidden, dims.max_rows() * dims.out);
        let pin = |n| {
            PinnedHostBuffer::<f32>::zeroed(way.context(), n)
                .map_err(|e| peer_error(DriverCall::MemHostAlloc, e))
        };
        let clients = (0..clients)
            .map(|_| {
                Ok(ClientPins {
                    input: pin(nx)?,
                    output: pin(ny)?,
                })
            })
            .collect::<GpuResult<Vec<_>>>()?;
        Ok(StagedCudaAsync {
            pool: DefaultPool::of(cudarc)?,
            bytes: clients.len() * (nx + ny) * std::mem::size_of::<f32>(),
            way,
            model,
            clients,
        })
    }

    /// One level, as the plain cuda-async way's, each client staging
    /// through its pinned buffers.
    ///
    /// # Errors
    /// The first error of a request (a wrong result included) or of the
    /// set-up; fewer pinned buffers than clients.
    pub async fn run_level(
        &mut self,
        clients: usize,
        requests_per_client: usize,
        seed: u64,
    ) -> Result<StagedRow, StagedError> {
        if self.clients.len() < clients {
            return Err(format!(
                "{} pinned buffers for {clients} clients",
                self.clients.len()
            )
            .into());
        }
        self.way.synchronize()?;
        self.pool.trim_and_reset()?;
        let rec = Arc::new(Recorder::default());
        let threads = ThreadSampler::start();
        let start = Instant::now();
        let tasks: Vec<_> = self
            .clients
            .drain(..clients)
            .enumerate()
            .map(|(client, pins)| {
                let (way, model, rec) = (self.way.clone(), self.model.clone(), rec.clone());
                tokio::spawn(async move {
                    let mut shapes = Shapes::new(seed, client, model.dims());
                    let mut pins = Some(pins);
                    for request in 0..requests_per_client {
                        let Some(mine) = pins.take() else { break };
                        let input = input_value(client, request);
                        let shape = shapes.next_shape();
                        match serve_one(&way, &model, &rec, mine, client, input, shape).await {
                            Ok(mine) => pins = Some(mine),
                            Err(e) => return (pins, Err(e)),
                        }
                    }
                    (pins, Ok(()))
                })
            })
            .collect();
        let mut first_error = None;
        let mut back = Vec::with_capacity(clients);
        for task in tasks {
            match task.await {
                Ok((pins, status)) => {
                    back.extend(pins);
                    if let Err(e) = status {
                        first_error.get_or_insert(e);
                    }
                }
                Err(join) => std::panic::resume_unwind(join.into_panic()),
            }
        }
        let elapsed = start.elapsed();
        let threads = threads.stop();
        self.clients.splice(0..0, back);
        if let Some(e) = first_error {
            return Err(e);
        }
        self.way.synchronize()?;
        let held = self.pool.reserved_high()?;
        Ok(StagedRow {
            row: rec.finish(NAME, clients, elapsed, held, threads),
            pinned_peak: self.bytes,
            pins: 0,
        })
    }
}

/// One request: the input written into the client's pinned buffer, one
/// `DeviceOp` (allocations, copy in, model, copy out) awaited, the result
/// checked; the pins come back for the client's next request (lost with
/// the op when it fails).
async fn serve_one(
    way: &CudaAsyncWay,
    model: &Arc<CudaModel>,
    rec: &Recorder,
    mut mine: ClientPins,
    client: usize,
    input: f32,
    shape: RequestShape,
) -> Result<ClientPins, StagedError> {
    let dims = model.dims();
    let [nx, _, ny] = shape.elems(&dims);
    let t = Instant::now();
    // The client's last op completed before its future handed these back.
    mine.input.as_mut_slice()[..nx].fill(input);
    let bytes = shape.bytes(&dims);
    rec.requested(bytes);
    let op_model = model.clone();
    let op =
        with_context(move |ctx: &ExecutionContext| value(enqueue(ctx, &op_model, shape, mine)));
    let answer: Answer = op
        .schedule(way.policy(client))
        .map_err(|e| peer_error(DriverCall::Launch, e))?
        .await
        .map_err(|e| peer_error(DriverCall::Launch, e))??;
    let (boxes, mine) = answer;
    check_output(dims, input, &mine.output.as_slice()[..ny])
        .map_err(|e| format!("{NAME}, client {client}: {e}"))?;
    rec.answered(t.elapsed());
    // Dropping the boxes queues their frees on the stream.
    drop(boxes);
    rec.released(bytes);
    Ok(mine)
}

/// The op's body: the three buffers on the op's stream, the copy in, the
/// model, the copy out.
fn enqueue(
    ctx: &ExecutionContext,
    model: &CudaModel,
    shape: RequestShape,
    mut mine: ClientPins,
) -> GpuResult<Answer> {
    let stream = ctx.get_cuda_stream();
    let dims: Dims = model.dims();
    let alloc = |n: usize| -> GpuResult<DeviceBox<[f32]>> {
        // SAFETY: the op's stream is live while the op executes.
        let ptr =
            unsafe { ctx.alloc_async(n * 4) }.map_err(|e| peer_error(DriverCall::AllocAsync, e))?;
        // SAFETY: `ptr` holds n floats, allocated on `stream` just now; the
        // copy in writes x, the model h and y, before any read, on this
        // stream.
        Ok(unsafe { DeviceBox::<[f32]>::from_raw_parts(ptr, n, stream.clone()) })
    };
    let [nx, nh, ny] = shape.elems(&dims);
    let boxes = [alloc(nx)?, alloc(nh)?, alloc(ny)?];
    let raw = stream.cu_stream();
    let [x, h, y] = [
        boxes[0].cu_deviceptr(),
        boxes[1].cu_deviceptr(),
        boxes[2].cu_deviceptr(),
    ];
    let copy = |e| peer_error(DriverCall::MemcpyHostAsync, e);
    // SAFETY: `x` holds nx floats, the pinned input at least nx (the
    // largest request's); the input is the op's (moved in) and comes back
    // only through its future, after the stream ran the copy.
    unsafe { cuda_core::memory::memcpy_htod_async(x, mine.input.as_ptr(), nx * 4, raw) }
        .map_err(copy)?;
    // SAFETY: the op's stream is a live stream of the device's primary
    // context (the model's); the boxes were allocated on it with the sizes
    // of `shape`, the copy into x queued before, and they are the op's
    // output, kept by its future until the work completed.
    unsafe { model.enqueue_model_raw(raw as usize as CUstream, [x, h, y], shape.rows())? };
    // SAFETY: `y` holds ny floats, the pinned output at least ny; the
    // output is the op's until its future hands it back, after the copy.
    unsafe { cuda_core::memory::memcpy_dtoh_async(mine.output.as_mut_ptr(), y, ny * 4, raw) }
        .map_err(copy)?;
    Ok((boxes, mine))
}
