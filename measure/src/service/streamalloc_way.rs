//! The service on streamalloc: owned buffers from an
//! [`AsyncResource`] over the caching tier, one launch and one
//! [`EventFuture`](streamalloc::EventFuture) per request, frees on
//! drop, returned by a [`Reaper`].
//!
//! A request takes three buffers (input, activations, output). By default
//! it awaits them one by one ([`Memory::EachBuffer`]); under a budget
//! below the peak demand that is hold-and-wait, so the service then asks
//! for them as one unit ([`Memory::Reserved`], `allocate_buffers`), or,
//! as a user without reservations would, puts a tokio `Semaphore` that
//! mirrors the budget in front ([`Memory::Semaphore`]).

use std::sync::Arc;
use std::time::Instant;

use streamalloc::gpu::GpuResult;
use streamalloc::{AllocTag, Buffer, DeviceMemoryResource, ResourceError, ResourceResult};
use streamalloc::{AsyncResource, EventFuture, RawStream, Reaper, StreamId};
use tokio::sync::Semaphore;

use super::clients::join_clients;
use super::{Dims, LevelResult, Recorder, RequestIo, RequestKernels, Shapes, ThreadSampler};

const TAG: AllocTag = AllocTag("service");

/// The way's name in the tables.
pub const NAME: &str = "streamalloc";

/// How a request obtains its three buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Memory {
    /// One awaited allocation per buffer: the service's default, and
    /// hold-and-wait under a budget below the peak demand.
    #[default]
    EachBuffer,
    /// The three as one unit (`AsyncResource::allocate_buffers`): served
    /// first come first served, holding nothing while it waits.
    Reserved,
    /// A tokio `Semaphore` of `permits` KiB in front (a request acquires
    /// its requested KiB, then awaits its buffers one by one): what a user
    /// without reservations writes.
    Semaphore {
        /// KiB of requested bytes admitted at once.
        permits: u32,
    },
}

impl Memory {
    /// The way's name in the tables.
    pub fn way_name(&self) -> &'static str {
        match self {
            Memory::EachBuffer => NAME,
            Memory::Reserved => "streamalloc+reserve",
            Memory::Semaphore { .. } => "streamalloc+semaphore",
        }
    }
}

/// The largest request of `dims`, in bytes (all three buffers).
pub fn max_request_bytes(dims: &Dims) -> usize {
    dims.max_rows() * (dims.hidden + dims.inner + dims.out) * std::mem::size_of::<f32>()
}

/// The budget of a level of `clients` whose requests are gated: a quarter
/// of the peak demand (every client's largest request at once), and at
/// least two of the largest requests (so that one always fits, rounded
/// up to the cache's size classes).
pub fn quarter_budget(dims: &Dims, clients: usize) -> usize {
    let largest = max_request_bytes(dims);
    (clients * largest / 4).max(2 * largest)
}

/// The permits of the semaphore that mirrors `budget`: half of it, in
/// KiB of requested bytes, since the stack rounds each buffer up to its
/// size class (at most doubling it) and keeps idle blocks of other sizes.
pub fn semaphore_permits(budget: usize) -> u32 {
    u32::try_from(budget / 2 / 1024).unwrap_or(u32::MAX)
}

/// What gates a level's requests (see [`Memory`]).
enum Gate {
    Each,
    Reserved,
    Semaphore(Arc<Semaphore>),
}

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
    R: DeviceMemoryResource + ?Sized + 'static,
    K: RequestKernels,
{
    let level = Level {
        dims,
        clients,
        requests_per_client,
        seed,
        memory: Memory::EachBuffer,
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
    /// How a request obtains its buffers.
    pub memory: Memory,
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
    R: DeviceMemoryResource + ?Sized + 'static,
    K: RequestKernels,
{
    let Level {
        dims,
        clients,
        requests_per_client,
        seed,
        memory,
    } = level;
    let gate = Arc::new(match memory {
        Memory::EachBuffer => Gate::Each,
        Memory::Reserved => Gate::Reserved,
        Memory::Semaphore { permits } => {
            Gate::Semaphore(Arc::new(Semaphore::new(permits as usize)))
        }
    });
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
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut shapes = Shapes::new(seed, client, dims);
                for _ in 0..requests_per_client {
                    serve_one(&res, &*kernels, &rec, &gate, dims, client, &mut shapes).await?;
                }
                ResourceResult::Ok(())
            })
        })
        .collect();
    let served = join_clients(tasks).await;
    let elapsed = start.elapsed();
    observe(Edge::End);
    let threads = threads.stop();
    reaper.shutdown().await?;
    served?;
    let held = res.gpu().memory_held()?.high;
    release_all(res).await?;
    Ok(rec.finish(memory.way_name(), clients, elapsed, held, threads))
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
pub async fn release_all<R: DeviceMemoryResource + ?Sized + 'static>(
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
    gate: &Gate,
    dims: Dims,
    client: usize,
    shapes: &mut Shapes,
) -> ResourceResult<()>
where
    R: DeviceMemoryResource + ?Sized + 'static,
    K: RequestKernels,
{
    let shape = shapes.next_shape();
    let elems = shape.elems(&dims);
    let stream = client_stream(res, client)?;
    let t = Instant::now();
    let bytes = shape.bytes(&dims);
    // Held until the buffers are dropped, at the end.
    let _permit = match gate {
        Gate::Semaphore(sem) => Some(
            sem.clone()
                .acquire_many_owned(u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX))
                .await
                .map_err(|_| ResourceError::Closed)?,
        ),
        _ => None,
    };
    let mut buffers: [Buffer<f32>; 3] = match gate {
        Gate::Reserved => res
            .allocate_buffers::<f32>(&elems, stream, TAG)
            .await?
            .try_into()
            .map_err(|_| ResourceError::Closed)?,
        Gate::Each | Gate::Semaphore(_) => each_buffer(res, elems, stream, TAG).await?,
    };
    rec.requested(bytes);
    let launched = launch_request(
        res,
        stream,
        &mut buffers,
        shape.rows(),
        client,
        |raw, io| kernels.enqueue(raw, io),
    );
    let result = match launched {
        Ok(done) => done.await,
        Err(e) => Err(e),
    };
    if result.is_ok() {
        rec.answered(t.elapsed());
    }
    drop(buffers);
    rec.released(bytes);
    result
}

/// The stream client `client` sends its requests on: `client mod streams`
/// of the resource's pool.
///
/// # Errors
/// [`ResourceError::Shutdown`] for an empty pool (no stream to serve on).
pub(super) fn client_stream<R: DeviceMemoryResource + ?Sized + 'static>(
    res: &AsyncResource<R>,
    client: usize,
) -> ResourceResult<StreamId> {
    let pool = res.stream_pool();
    pool.id(client % pool.len().max(1))
        .ok_or(ResourceError::Shutdown)
}

/// A request's three buffers of `elems` floats (input, activations,
/// output) on `stream`, awaited one by one.
///
/// # Errors
/// The first allocation's error (the buffers allocated before it are
/// dropped).
pub(super) async fn each_buffer<R: DeviceMemoryResource + ?Sized + 'static>(
    res: &AsyncResource<R>,
    [nx, nh, ny]: [usize; 3],
    stream: StreamId,
    tag: AllocTag,
) -> ResourceResult<[Buffer<f32>; 3]> {
    Ok([
        res.allocate_buffer::<f32>(nx, stream, tag).await?,
        res.allocate_buffer::<f32>(nh, stream, tag).await?,
        res.allocate_buffer::<f32>(ny, stream, tag).await?,
    ])
}

/// Queues one launch on `stream` that writes a request's three buffers
/// (`[x, h, y]`, ordered against their other uses): `enqueue` queues the
/// work, given their blocks, the request's `rows` and its `client`.
/// Returns the launch's completion.
///
/// # Errors
/// The ordering's or `enqueue`'s error; nothing is queued after it.
pub(super) fn launch_request<R: DeviceMemoryResource + ?Sized + 'static>(
    res: &AsyncResource<R>,
    stream: StreamId,
    [x, h, y]: &mut [Buffer<f32>; 3],
    rows: usize,
    client: usize,
    enqueue: impl FnOnce(RawStream, RequestIo<'_>) -> GpuResult<()>,
) -> ResourceResult<EventFuture> {
    let (bx, bh, by) = (x.block().clone(), h.block().clone(), y.block().clone());
    let ((), done) = res
        .launch(stream)
        .write(x)
        .write(h)
        .write(y)
        .enqueue(|raw| {
            let io = RequestIo {
                x: &bx,
                h: &bh,
                y: &by,
                rows,
                client,
            };
            enqueue(raw, io).map_err(ResourceError::from)
        })?;
    Ok(done)
}
