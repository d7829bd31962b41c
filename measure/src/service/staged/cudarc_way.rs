//! The staged service on cudarc alone, as well as cudarc allows: cudarc
//! pools no pinned memory, so each client pins its own input and output
//! once (`alloc_pinned`, the input write-combined as cudarc's default
//! suits a buffer only the host writes and the GPU reads; the output
//! plain, since the host reads it) for its largest request, and reuses
//! them. Per request: a `CudaSlice` per buffer, the input written into the
//! pinned slice, `memcpy_htod` of the request's part, the model,
//! `memcpy_dtoh` into the pinned output, `stream.synchronize()` in
//! `spawn_blocking`, the result checked.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream, DevicePtrMut, PinnedHostSlice};
use streamalloc::DriverCall;
use streamalloc::gpu::GpuResult;

use super::super::cuda_model::CudaModel;
use super::super::cudarc_way::{DefaultPool, alloc_request, driver, synchronize_blocking};
use super::super::{Dims, Recorder, Shapes, ThreadSampler};
use super::{StagedError, StagedRow, check_output, input_value};

/// The way's name in the tables.
pub const NAME: &str = "cudarc+pinned";

/// One client's pinned input and output, for its largest request.
#[derive(Debug)]
pub struct ClientPins {
    input: PinnedHostSlice<f32>,
    output: PinnedHostSlice<f32>,
}

/// The pinned buffers of every client, pinned once.
#[derive(Debug)]
pub struct Pins {
    clients: Vec<ClientPins>,
    bytes: usize,
}

impl Pins {
    /// Pins an input and an output of the largest request of `dims` for
    /// each of `clients` clients on `ctx`.
    ///
    /// # Errors
    /// A driver error (out of pinned memory included).
    pub fn new(ctx: &Arc<CudaContext>, dims: Dims, clients: usize) -> GpuResult<Self> {
        let pin = |e| driver(DriverCall::MemHostAlloc, e);
        let (nx, ny) = (dims.max_rows() * dims.hidden, dims.max_rows() * dims.out);
        let clients = (0..clients)
            .map(|_| {
                // SAFETY: `f32` is valid for any bits; the host writes the
                // input before any copy reads it, and the copy out writes
                // the output before the host reads it.
                Ok(unsafe {
                    ClientPins {
                        input: ctx.alloc_pinned::<f32>(nx).map_err(pin)?,
                        output: ctx.alloc_pinned_with_flags::<f32>(ny, 0).map_err(pin)?,
                    }
                })
            })
            .collect::<GpuResult<Vec<_>>>()?;
        let bytes = clients.len() * (nx + ny) * std::mem::size_of::<f32>();
        Ok(Pins { clients, bytes })
    }

    /// The pinned bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One level, as the plain cudarc way's, with each client staging through
/// its pinned buffers (taken from `pins` for the level and put back).
///
/// # Errors
/// The first error of a request (a wrong result included) or of the
/// set-up; fewer pinned buffers than clients.
pub async fn run_level(
    ctx: &Arc<CudaContext>,
    streams: &[Arc<CudaStream>],
    model: &Arc<CudaModel>,
    pins: &mut Pins,
    clients: usize,
    requests_per_client: usize,
    seed: u64,
) -> Result<StagedRow, StagedError> {
    if pins.clients.len() < clients {
        return Err(format!(
            "{} pinned buffers for {clients} clients",
            pins.clients.len()
        )
        .into());
    }
    let pool = DefaultPool::of(ctx)?;
    ctx.synchronize()
        .map_err(|e| driver(DriverCall::StreamSynchronize, e))?;
    pool.trim_and_reset()?;
    let rec = Arc::new(Recorder::default());
    let threads = ThreadSampler::start();
    let start = Instant::now();
    let tasks: Vec<_> = pins
        .clients
        .drain(..clients)
        .enumerate()
        .map(|(client, mut mine)| {
            let stream = streams[client % streams.len().max(1)].clone();
            let (model, rec) = (model.clone(), rec.clone());
            tokio::spawn(async move {
                let mut shapes = Shapes::new(seed, client, model.dims());
                let mut status = Ok(());
                for request in 0..requests_per_client {
                    let input = input_value(client, request);
                    status =
                        serve_one(&stream, &model, &rec, &mut mine, client, input, &mut shapes)
                            .await;
                    if status.is_err() {
                        break;
                    }
                }
                (mine, status)
            })
        })
        .collect();
    let mut first_error = None;
    let mut back = Vec::with_capacity(clients);
    for task in tasks {
        match task.await {
            Ok((mine, status)) => {
                back.push(mine);
                if let Err(e) = status {
                    first_error.get_or_insert(e);
                }
            }
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    let elapsed = start.elapsed();
    let threads = threads.stop();
    pins.clients.splice(0..0, back);
    if let Some(e) = first_error {
        return Err(e);
    }
    ctx.synchronize()
        .map_err(|e| driver(DriverCall::StreamSynchronize, e))?;
    let held = pool.reserved_high()?;
    Ok(StagedRow {
        row: rec.finish(NAME, clients, elapsed, held, threads),
        pinned_peak: pins.bytes,
        pins: 0,
    })
}

async fn serve_one(
    stream: &Arc<CudaStream>,
    model: &Arc<CudaModel>,
    rec: &Arc<Recorder>,
    mine: &mut ClientPins,
    client: usize,
    input: f32,
    shapes: &mut Shapes,
) -> Result<(), StagedError> {
    let dims: Dims = model.dims();
    let shape = shapes.next_shape();
    let [nx, nh, ny] = shape.elems(&dims);
    let copy = |e| driver(DriverCall::MemcpyHostAsync, e);
    let t = Instant::now();
    // The client's last request was synchronized: the event `as_mut_slice`
    // waits on is complete.
    let staged_in = mine.input.as_mut_slice().map_err(copy)?;
    staged_in[..nx].fill(input);
    // SAFETY: the copy in writes x, the model writes h and y, before any read.
    let [mut x, mut h, mut y] = unsafe { alloc_request(stream, [nx, nh, ny])? };
    let bytes = shape.bytes(&dims);
    rec.requested(bytes);
    // The request's part of the pinned input, as a plain slice (cudarc
    // copies a `PinnedHostSlice` whole, into a device slice at least as
    // long): still pinned memory, so the copy is asynchronous, and the
    // synchronize below ends it before the host writes the slice again.
    stream
        .memcpy_htod(&mine.input.as_mut_slice().map_err(copy)?[..nx], &mut x)
        .map_err(copy)?;
    {
        let (xp, _gx) = x.device_ptr_mut(stream);
        let (hp, _gh) = h.device_ptr_mut(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        // SAFETY: `stream` is a live stream of the model's context; the
        // slices were allocated on it with the sizes of `shape`, the copy
        // into x was queued on it before, and they live until after the
        // synchronize below.
        unsafe { model.enqueue_model_raw(stream.cu_stream(), [xp, hp, yp], shape.rows())? };
    }
    stream
        .memcpy_dtoh(&y, &mut mine.output.as_mut_slice().map_err(copy)?[..ny])
        .map_err(copy)?;
    synchronize_blocking(stream, rec).await?;
    let result = &mine.output.as_slice().map_err(copy)?[..ny];
    check_output(dims, input, result).map_err(|e| format!("{NAME}, client {client}: {e}"))?;
    rec.answered(t.elapsed());
    drop((x, h, y));
    rec.released(bytes);
    Ok(())
}
