//! "10,000 fills with a spawned task awaiting each", the streamalloc side
//! (the cuda-async side is in `cuda_async_way`, feature `peer-cuda-async`):
//! 4-byte fills round-robin over the streams, each awaited by its own
//! spawned task, per op, with the plain loop (no future) as the control.
//!
//! Two shapes: the fill queued by the submitting loop and only its
//! completion awaited in the task (as `gpu_latency` measures), and the fill
//! queued inside the task before it awaits (the shape of a cuda-async
//! `DeviceFuture`, which queues its work on first poll). Each with either
//! kind of completion point ([`Point`]).

use std::time::{Duration, Instant};

use streamalloc::{
    AllocTag, DeviceBlock, DeviceMemoryResource, RawStream, ResourceResult, StreamId,
};
use streamalloc::{AsyncResource, EventFuture};

/// How a fill's completion future is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// [`AsyncResource::completion`]: an event recorded when it is made.
    Recorded,
    /// [`AsyncResource::completion_lazy`]: the stream asked when polled, an
    /// event recorded only if it is still busy after the first poll's spin
    /// (cuda-async's way: `cuStreamQuery` at the first poll).
    Lazy,
}

impl Point {
    /// Both, in the order the rows print.
    pub const ALL: [Point; 2] = [Point::Recorded, Point::Lazy];

    /// How the rows name it.
    pub fn name(self) -> &'static str {
        match self {
            Point::Recorded => "completion()",
            Point::Lazy => "completion_lazy()",
        }
    }

    /// The completion point of what was queued on `stream` so far.
    ///
    /// # Errors
    /// As [`AsyncResource::completion`].
    pub fn make<R: DeviceMemoryResource + 'static>(
        self,
        res: &AsyncResource<R>,
        stream: StreamId,
    ) -> ResourceResult<EventFuture> {
        match self {
            Point::Recorded => res.completion(stream),
            Point::Lazy => res.completion_lazy(stream),
        }
    }
}

/// Fills per measurement.
pub const FILLS: usize = 10_000;

/// One 256-byte block per stream of `res`'s pool, and the streams' handles.
///
/// # Errors
/// An allocation error.
pub fn fill_targets<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
) -> ResourceResult<Vec<(DeviceBlock, RawStream)>> {
    let pool = res.stream_pool();
    pool.ids()
        .map(|s| Ok((res.try_allocate(256, s, AllocTag("fills"))?, pool.raw(s)?)))
        .collect()
}

fn sync_all<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
    targets: &[(DeviceBlock, RawStream)],
) -> ResourceResult<()> {
    for (_, raw) in targets {
        // SAFETY: a stream of the device's pool, which the resource holds.
        unsafe { res.gpu().stream_synchronize(*raw) }?;
    }
    Ok(())
}

/// The plain loop: `FILLS` fills, then every stream synchronized; per op.
///
/// # Errors
/// A driver error.
pub fn plain<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
    targets: &[(DeviceBlock, RawStream)],
) -> ResourceResult<Duration> {
    sync_all(res, targets)?;
    let t = Instant::now();
    for i in 0..FILLS {
        let (b, raw) = &targets[i % targets.len()];
        // SAFETY: a stream of the device's pool; the block is live (freed later).
        unsafe { res.gpu().memset_async(b.ptr(), 3, 4, *raw) }?;
    }
    sync_all(res, targets)?;
    Ok(t.elapsed() / FILLS as u32)
}

/// Each fill queued by the loop, its completion awaited by a spawned task;
/// per op, every task joined and every stream synchronized.
///
/// # Errors
/// A driver error, or a completion's error.
pub async fn spawned_await<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
    targets: &[(DeviceBlock, RawStream)],
    point: Point,
) -> ResourceResult<Duration> {
    sync_all(res, targets)?;
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(FILLS);
    for i in 0..FILLS {
        let (b, raw) = &targets[i % targets.len()];
        // SAFETY: a stream of the device's pool; the block is live (freed later).
        unsafe { res.gpu().memset_async(b.ptr(), 3, 4, *raw) }?;
        tasks.push(tokio::spawn(point.make(res, b.stream())?));
    }
    for task in tasks {
        task.await.expect("fill task")?;
    }
    sync_all(res, targets)?;
    Ok(t.elapsed() / FILLS as u32)
}

/// Each fill queued by its own spawned task, which then awaits its
/// completion; per op.
///
/// # Errors
/// A driver error, or a completion's error.
pub async fn spawned_fill_and_await<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
    targets: &[(DeviceBlock, RawStream)],
    point: Point,
) -> ResourceResult<Duration> {
    sync_all(res, targets)?;
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(FILLS);
    for i in 0..FILLS {
        let (b, raw) = targets[i % targets.len()].clone();
        let res = res.clone();
        tasks.push(tokio::spawn(async move {
            // SAFETY: a stream of the device's pool; the block is live (freed later).
            unsafe { res.gpu().memset_async(b.ptr(), 3, 4, raw) }?;
            point.make(&res, b.stream())?.await
        }));
    }
    for task in tasks {
        task.await.expect("fill task")?;
    }
    sync_all(res, targets)?;
    Ok(t.elapsed() / FILLS as u32)
}
