//! The service on cudarc alone, as a Rust user writes it today: a
//! `CudaSlice` per buffer (`cuMemAllocAsync` from the device's default
//! pool, freed on drop), and the result awaited with
//! `stream.synchronize()` inside `tokio::task::spawn_blocking`.
//!
//! Also [`DefaultPool`]: the memory the device's default pool holds, which
//! both peers allocate from.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self as cu, CUmemoryPool};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut, DriverError};
use streamalloc::DriverCall;
use streamalloc::gpu::{GpuError, GpuResult};

use super::clients::join_clients;
use super::cuda_model::CudaModel;
use super::{Dims, LevelResult, Recorder, Shapes, ThreadSampler};

/// The way's name in the tables.
pub const NAME: &str = "cudarc";

/// A cudarc driver error as the error of `call`.
pub(super) fn driver(call: DriverCall, e: DriverError) -> GpuError {
    GpuError::driver(call, e.0 as i32, format!("{e:?}"))
}

/// A request's three device slices of `elems` floats (input,
/// activations, output), allocated on `stream` from the device's default
/// pool.
///
/// # Errors
/// The driver's allocation error.
///
/// # Safety
/// The slices are uninitialised: the request's work on `stream` writes
/// each before anything reads it.
pub(super) unsafe fn alloc_request(
    stream: &Arc<CudaStream>,
    [nx, nh, ny]: [usize; 3],
) -> GpuResult<[CudaSlice<f32>; 3]> {
    let alloc = |e| driver(DriverCall::AllocAsync, e);
    // SAFETY: the caller writes each slice before reading it.
    unsafe {
        Ok([
            stream.alloc::<f32>(nx).map_err(alloc)?,
            stream.alloc::<f32>(nh).map_err(alloc)?,
            stream.alloc::<f32>(ny).map_err(alloc)?,
        ])
    }
}

/// Awaits everything queued on `stream` as a cudarc user does: its
/// `synchronize` in `spawn_blocking`, the thread counted as blocked in
/// `rec` while it waits.
///
/// # Errors
/// The synchronize's error, or the blocking task's failure.
pub(super) async fn synchronize_blocking(
    stream: &Arc<CudaStream>,
    rec: &Arc<Recorder>,
) -> GpuResult<()> {
    let (s, r) = (stream.clone(), rec.clone());
    tokio::task::spawn_blocking(move || r.blocked_in(|| s.synchronize()))
        .await
        .map_err(|e| {
            GpuError::driver(
                DriverCall::StreamSynchronize,
                0,
                format!("blocking task: {e}"),
            )
        })?
        .map_err(|e| driver(DriverCall::StreamSynchronize, e))
}

/// The default memory pool of a device (what `cuMemAllocAsync` draws
/// from): its reserved bytes' high-water mark, reset and trimmed between
/// levels.
#[derive(Debug, Clone, Copy)]
pub struct DefaultPool(CUmemoryPool);

// SAFETY: a pool handle is a driver object usable from any thread.
unsafe impl Send for DefaultPool {}
// SAFETY: as for `Send`.
unsafe impl Sync for DefaultPool {}

impl DefaultPool {
    /// The default pool of `ctx`'s device.
    ///
    /// # Errors
    /// A driver error.
    pub fn of(ctx: &Arc<CudaContext>) -> GpuResult<Self> {
        ctx.bind_to_thread()
            .map_err(|e| driver(DriverCall::Init, e))?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes one handle into `pool`; the device is `ctx`'s.
        unsafe { cu::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
            .result()
            .map_err(|e| driver(DriverCall::Init, e))?;
        Ok(DefaultPool(pool))
    }

    /// Gives the pool's idle memory back to the device and resets its
    /// high-water mark (call with nothing in flight).
    ///
    /// # Errors
    /// A driver error.
    pub fn trim_and_reset(&self) -> GpuResult<()> {
        let mut zero = 0u64;
        // SAFETY: a live pool; `zero` outlives the call, and is the only
        // value the driver accepts for resetting the high-water mark.
        unsafe {
            cu::cuMemPoolTrimTo(self.0, 0).result().and_then(|()| {
                cu::cuMemPoolSetAttribute(
                    self.0,
                    cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                )
                .result()
            })
        }
        .map_err(|e| driver(DriverCall::MemGetInfo, e))
    }

    /// The most bytes the pool reserved since the last reset.
    ///
    /// # Errors
    /// A driver error.
    pub fn reserved_high(&self) -> GpuResult<usize> {
        let mut value = 0u64;
        // SAFETY: a live pool; the attribute is a u64 written into `value`.
        unsafe {
            cu::cuMemPoolGetAttribute(
                self.0,
                cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| driver(DriverCall::MemGetInfo, e))?;
        Ok(value as usize)
    }
}

/// One level: `clients` tasks sending `requests_per_client` requests each,
/// client `c` on `streams[c mod len]`. Starts from a trimmed default pool.
///
/// # Errors
/// The first error of a request or of the set-up.
pub async fn run_level(
    ctx: &Arc<CudaContext>,
    streams: &[Arc<CudaStream>],
    model: &Arc<CudaModel>,
    clients: usize,
    requests_per_client: usize,
    seed: u64,
) -> GpuResult<LevelResult> {
    let pool = DefaultPool::of(ctx)?;
    ctx.synchronize()
        .map_err(|e| driver(DriverCall::StreamSynchronize, e))?;
    pool.trim_and_reset()?;
    let rec = Arc::new(Recorder::default());
    let threads = ThreadSampler::start();
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let stream = streams[client % streams.len().max(1)].clone();
            let (model, rec) = (model.clone(), rec.clone());
            tokio::spawn(async move {
                let mut shapes = Shapes::new(seed, client, model.dims());
                for _ in 0..requests_per_client {
                    serve_one(&stream, &model, &rec, client, &mut shapes).await?;
                }
                GpuResult::Ok(())
            })
        })
        .collect();
    let served = join_clients(tasks).await;
    let elapsed = start.elapsed();
    let threads = threads.stop();
    served?;
    ctx.synchronize()
        .map_err(|e| driver(DriverCall::StreamSynchronize, e))?;
    let held = pool.reserved_high()?;
    Ok(rec.finish(NAME, clients, elapsed, held, threads))
}

async fn serve_one(
    stream: &Arc<CudaStream>,
    model: &Arc<CudaModel>,
    rec: &Arc<Recorder>,
    client: usize,
    shapes: &mut Shapes,
) -> GpuResult<()> {
    let dims: Dims = model.dims();
    let shape = shapes.next_shape();
    let [nx, nh, ny] = shape.elems(&dims);
    let t = Instant::now();
    // SAFETY: the model writes x (the copy in), h and y before reading them.
    let [mut x, mut h, mut y] = unsafe { alloc_request(stream, [nx, nh, ny])? };
    let bytes = shape.bytes(&dims);
    rec.requested(bytes);
    {
        // cudarc's guards order the uses on `stream` (they record its events
        // when they drop, after the work is queued).
        let (xp, _gx) = x.device_ptr_mut(stream);
        let (hp, _gh) = h.device_ptr_mut(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        // SAFETY: `stream` is a live stream of the model's context; the
        // slices were allocated on it, hold the sizes of `shape` and live
        // until after the synchronize below, which also ends this client's
        // request.
        unsafe { model.enqueue_raw(stream.cu_stream(), [xp, hp, yp], shape.rows(), client)? };
    }
    synchronize_blocking(stream, rec).await?;
    rec.answered(t.elapsed());
    drop((x, h, y));
    rec.released(bytes);
    Ok(())
}
