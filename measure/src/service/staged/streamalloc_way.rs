//! The staged service on streamalloc: per request, an input and an output
//! [`HostBuffer`](streamalloc::HostBuffer) from a [`HostPool`], three
//! owned device buffers from the [`AsyncResource`], and four things queued
//! on the client's stream: the copy in, the model (one launch), the copy
//! out; only the copy out's future is awaited (stream order puts it after
//! the rest, and the host seeing it complete shows the input's copy done
//! too, so both host buffers go straight back to the pool idle).
//!
//! The pool is warmed by a first pass of the same requests (not measured):
//! a service pins at start, not per request; the measured pass then counts
//! the pins it still made.

use std::sync::Arc;
use std::time::Instant;

use streamalloc::{AllocTag, AsyncResource, DeviceMemoryResource, HostPool, Reaper};

use super::super::clients::join_clients;
use super::super::streamalloc_way::{client_stream, each_buffer, launch_request, release_all};
use super::super::{Dims, ModelKernels, Recorder, Shapes, ThreadSampler};
use super::{StagedError, StagedRow, check_output, input_value};

const TAG: AllocTag = AllocTag("staged");

/// The way's name in the tables.
pub const NAME: &str = "streamalloc+hostpool";

/// One staged level (see [`run_level`]).
#[derive(Debug, Clone, Copy)]
pub struct StagedLevel {
    /// The model's widths.
    pub dims: Dims,
    /// Concurrent clients.
    pub clients: usize,
    /// Requests each client sends, one after another.
    pub requests_per_client: usize,
    /// Seeds the request shapes.
    pub seed: u64,
    /// Check every result on the host (CUDA; the simulator moves no data).
    pub verify: bool,
}

/// One level: first a warm-up pass of two requests per client (the pool
/// pins what the clients need at once; not measured), then `clients`
/// tasks sending `requests_per_client` requests each, client `c` on
/// stream `c mod streams`, from an empty device cache (as the plain
/// service) and a [`Reaper`] running.
///
/// # Errors
/// The first error of a request (an allocation, a copy, the model, a
/// wrong result) or of the set-up.
pub async fn run_level<R, K>(
    res: &AsyncResource<R>,
    pool: &HostPool,
    kernels: &Arc<K>,
    level: StagedLevel,
) -> Result<StagedRow, StagedError>
where
    R: DeviceMemoryResource + ?Sized + 'static,
    K: ModelKernels,
{
    let warm = StagedLevel {
        requests_per_client: level.requests_per_client.min(2),
        ..level
    };
    serve_clients(res, pool, kernels, warm, &Arc::new(Recorder::default())).await?;
    release_all(res).await?;
    res.gpu().reset_memory_held_high()?;
    let pins_before = pool.stats().pins;
    let reaper = Reaper::spawn(res);
    let rec = Arc::new(Recorder::default());
    let threads = ThreadSampler::start();
    let start = Instant::now();
    let served = serve_clients(res, pool, kernels, level, &rec).await;
    let elapsed = start.elapsed();
    let threads = threads.stop();
    reaper.shutdown().await?;
    served?;
    let held = res.gpu().memory_held()?.high;
    release_all(res).await?;
    let stats = pool.stats();
    Ok(StagedRow {
        row: rec.finish(NAME, level.clients, elapsed, held, threads),
        pinned_peak: stats.peak_held_bytes,
        pins: stats.pins - pins_before,
    })
}

/// The clients of `level`, each on its own task; the first error.
async fn serve_clients<R, K>(
    res: &AsyncResource<R>,
    pool: &HostPool,
    kernels: &Arc<K>,
    level: StagedLevel,
    rec: &Arc<Recorder>,
) -> Result<(), StagedError>
where
    R: DeviceMemoryResource + ?Sized + 'static,
    K: ModelKernels,
{
    let tasks: Vec<_> = (0..level.clients)
        .map(|client| {
            let (res, pool, kernels, rec) =
                (res.clone(), pool.clone(), kernels.clone(), rec.clone());
            tokio::spawn(async move {
                let mut shapes = Shapes::new(level.seed, client, level.dims);
                for request in 0..level.requests_per_client {
                    let input = input_value(client, request);
                    serve_one(
                        &res,
                        &pool,
                        &*kernels,
                        &rec,
                        level,
                        client,
                        input,
                        &mut shapes,
                    )
                    .await?;
                }
                Ok::<(), StagedError>(())
            })
        })
        .collect();
    join_clients(tasks).await
}

/// One request: its input written into a pooled host buffer, three device
/// buffers, the copy in, the model, the copy out awaited, the result
/// checked (with `level.verify`), everything dropped.
#[allow(clippy::too_many_arguments)]
async fn serve_one<R, K>(
    res: &AsyncResource<R>,
    pool: &HostPool,
    kernels: &K,
    rec: &Recorder,
    level: StagedLevel,
    client: usize,
    input: f32,
    shapes: &mut Shapes,
) -> Result<(), StagedError>
where
    R: DeviceMemoryResource + ?Sized + 'static,
    K: ModelKernels,
{
    let dims = level.dims;
    let shape = shapes.next_shape();
    let elems = shape.elems(&dims);
    let [nx, _, ny] = elems;
    let stream = client_stream(res, client)?;
    let t = Instant::now();
    let bytes = shape.bytes(&dims);
    let mut staged_in = pool.allocate::<f32>(nx, TAG)?;
    staged_in.as_mut_slice()?.fill(input);
    // [x, h, y]: the input, the activations, the output.
    let mut buffers = each_buffer(res, elems, stream, TAG).await?;
    rec.requested(bytes);
    // Neither awaited: the copy out below comes after them on the stream,
    // and seeing that one complete shows them done.
    drop(res.copy_to_device(&staged_in, &mut buffers[0], stream)?);
    drop(launch_request(
        res,
        stream,
        &mut buffers,
        shape.rows(),
        client,
        |raw, io| kernels.enqueue_model(raw, io),
    )?);
    let mut staged_out = pool.allocate::<f32>(ny, TAG)?;
    res.copy_to_host(&buffers[2], &mut staged_out, stream)?
        .await?;
    // Read on every backend (the race detector sees the host's read on
    // the simulator); checked where the copies move data.
    let result = staged_out.as_slice()?;
    if level.verify {
        check_output(dims, input, result).map_err(|e| format!("{NAME}, client {client}: {e}"))?;
    }
    rec.answered(t.elapsed());
    drop((buffers, staged_in, staged_out));
    rec.released(bytes);
    Ok(())
}
