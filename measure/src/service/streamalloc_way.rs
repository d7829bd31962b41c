//! The service on streamalloc: owned buffers from an
//! [`AsyncResource`] over the caching tier, one launch and one
//! [`EventFuture`](streamalloc::futures::EventFuture) per request, frees on
//! drop, returned by a [`Reaper`].

use std::sync::Arc;
use std::time::Instant;

use streamalloc::futures::{AsyncResource, Reaper};
use streamalloc::{AllocTag, DeviceMemoryResource, ResourceError, ResourceResult};

use super::{Dims, LevelResult, Recorder, RequestIo, RequestKernels, Shapes, ThreadSampler};

const TAG: AllocTag = AllocTag("service");

/// The way's name in the tables.
pub const NAME: &str = "streamalloc";

/// One level: `clients` tasks sending `requests_per_client` requests each,
/// client `c` on stream `c mod streams`, with request shapes seeded by
/// `seed`. Starts from an empty cache (idle memory released, the backend's
/// high-water mark reset) and runs a [`Reaper`] for the level's length.
///
/// # Errors
/// The first error of a request (an allocation, a launch, a completion) or
/// of the set-up; the level's figures are then lost.
pub async fn run_level<R, K>(
    res: &AsyncResource<R>,
    kernels: &Arc<K>,
    dims: Dims,
    clients: usize,
    requests_per_client: usize,
    seed: u64,
) -> ResourceResult<LevelResult>
where
    R: DeviceMemoryResource + 'static,
    K: RequestKernels,
{
    let level = Level {
        dims,
        clients,
        requests_per_client,
        seed,
    };
    run_level_observed(res, kernels, level, &mut |_| {}).await
}

/// The shape of one level (see [`run_level`]).
#[derive(Debug, Clone, Copy)]
pub struct Level {
    /// The model's widths.
    pub dims: Dims,
    /// Concurrent clients.
    pub clients: usize,
    /// Requests each client sends, one after another.
    pub requests_per_client: usize,
    /// Seeds the request shapes.
    pub seed: u64,
}

/// Where a level is, for [`run_level_observed`]'s observer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// The clients are about to start (set-up done).
    Start,
    /// Every client is done (before the level's memory is given back).
    End,
}

/// [`run_level`], calling `observe` right before the clients start and
/// right after the last one ended, so that counters read there cover the
/// served requests only (not the set-up or the release after).
///
/// # Errors
/// As [`run_level`].
pub async fn run_level_observed<R, K>(
    res: &AsyncResource<R>,
    kernels: &Arc<K>,
    level: Level,
    observe: &mut (dyn FnMut(Edge) + Send),
) -> ResourceResult<LevelResult>
where
    R: DeviceMemoryResource + 'static,
    K: RequestKernels,
{
    let Level {
        dims,
        clients,
        requests_per_client,
        seed,
    } = level;
    release_all(res).await?;
    res.gpu().reset_memory_held_high()?;
    let reaper = Reaper::spawn(res);
    let rec = Arc::new(Recorder::default());
    let threads = ThreadSampler::start();
    observe(Edge::Start);
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (res, kernels, rec) = (res.clone(), kernels.clone(), rec.clone());
            tokio::spawn(async move {
                let mut shapes = Shapes::new(seed, client, dims);
                for _ in 0..requests_per_client {
                    serve_one(&res, &*kernels, &rec, dims, client, &mut shapes).await?;
                }
                ResourceResult::Ok(())
            })
        })
        .collect();
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    let elapsed = start.elapsed();
    observe(Edge::End);
    let threads = threads.stop();
    reaper.shutdown().await?;
    if let Some(e) = first_error {
        return Err(e);
    }
    let held = res.gpu().memory_held()?.high;
    release_all(res).await?;
    Ok(rec.finish(NAME, clients, elapsed, held, threads))
}

/// Gives every idle byte back to the device, and returns the bytes still
/// outstanding (0 once every buffer is dropped): pending frees are reaped
/// into the cache, the cache releases what it holds, those frees are
/// reaped. Idle pages of the cache's virtual-memory arena are released only
/// once the arena has seen their last use complete, which no future
/// awaits: this retries, 5 ms apart, for up to a second.
///
/// # Errors
/// A reap's or release's error.
pub async fn release_all<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
) -> ResourceResult<usize> {
    for _ in 0..200 {
        res.reap_pending().await?;
        res.inner().release_idle()?;
        res.reap_pending().await?;
        if res.bytes_outstanding() == 0 {
            return Ok(0);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(res.bytes_outstanding())
}

/// One request: three buffers, one launch (copy in, model, copy out), its
/// completion awaited, the buffers dropped.
async fn serve_one<R, K>(
    res: &AsyncResource<R>,
    kernels: &K,
    rec: &Recorder,
    dims: Dims,
    client: usize,
    shapes: &mut Shapes,
) -> ResourceResult<()>
where
    R: DeviceMemoryResource + 'static,
    K: RequestKernels,
{
    let shape = shapes.next_shape();
    let [nx, nh, ny] = shape.elems(&dims);
    let pool = res.stream_pool();
    // An empty pool (no stream to serve on) answers as a shut-down resource.
    let stream = pool
        .id(client % pool.len().max(1))
        .ok_or(ResourceError::Shutdown)?;
    let t = Instant::now();
    let mut x = res.allocate_buffer::<f32>(nx, stream, TAG).await?;
    let mut h = res.allocate_buffer::<f32>(nh, stream, TAG).await?;
    let mut y = res.allocate_buffer::<f32>(ny, stream, TAG).await?;
    let bytes = shape.bytes(&dims);
    rec.requested(bytes);
    let (bx, bh, by) = (x.block().clone(), h.block().clone(), y.block().clone());
    let launched = res
        .launch(stream)
        .write(&mut x)
        .write(&mut h)
        .write(&mut y)
        .enqueue(|raw| {
            let io = RequestIo {
                x: &bx,
                h: &bh,
                y: &by,
                rows: shape.rows(),
                client,
            };
            kernels.enqueue(raw, io).map_err(ResourceError::from)
        });
    let result = match launched {
        Ok(((), done)) => done.await,
        Err(e) => Err(e),
    };
    if result.is_ok() {
        rec.answered(t.elapsed());
    }
    drop((x, h, y));
    rec.released(bytes);
    result
}
