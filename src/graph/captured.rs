//! [`CapturedGraph`]: an instantiated graph, replayed on the pool's streams
//! and awaited with the crate's futures.

#![allow(unsafe_code)]

use std::mem::ManuallyDrop;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ResourceResult;
use crate::futures::{AsyncResource, EventFuture};
use crate::gpu::{CaptureId, Gpu, GraphExec};
use crate::resource::DeviceMemoryResource;
use crate::types::{RawStream, StreamId};

/// Tells the resource stack that the graph of capture `id` is gone, so that
/// memory handed out during the capture (graph-private memory) can serve
/// others again.
pub(super) fn release_capture<R: DeviceMemoryResource + ?Sized>(inner: &R, id: CaptureId) {
    // ISSUE 19, PART 2 (branch `graphcache`): the resource stack's
    // `DeviceMemoryResource::release_capture(&self, CaptureId)` lands with
    // the cache's graph-private memory. Until it has, nothing of the stack
    // holds memory per capture and there is nothing to release; once it has,
    // this is the one call site:
    //     if let Err(e) = inner.release_capture(id) {
    //         tracing::warn!(capture = %id, error = %e, "releasing a capture's memory failed");
    //     }
    let _ = (inner, id);
}

/// A captured, instantiated CUDA graph: [`launch`](Self::launch) replays it
/// on a stream of the pool and returns a future of that replay's
/// completion.
///
/// Made by [`GraphCapture::end`](super::GraphCapture::end) or
/// [`AsyncResource::capture_graph`]. Dropping it destroys the executable
/// graph (replays already queued still run) and then tells the resource
/// stack to release the memory of its capture, ordered after the last
/// replay.
pub struct CapturedGraph<R: DeviceMemoryResource + 'static> {
    res: AsyncResource<R>,
    exec: ManuallyDrop<GraphExec<dyn Gpu>>,
    origin: StreamId,
    origin_raw: RawStream,
    /// The stream of the last replay: the release is ordered after it.
    last_launch: Mutex<Option<RawStream>>,
    launches: AtomicU64,
}

impl<R: DeviceMemoryResource + 'static> CapturedGraph<R> {
    pub(super) fn new(
        res: AsyncResource<R>,
        exec: GraphExec<dyn Gpu>,
        origin: StreamId,
        origin_raw: RawStream,
    ) -> Self {
        CapturedGraph {
            res,
            exec: ManuallyDrop::new(exec),
            origin,
            origin_raw,
            last_launch: Mutex::new(None),
            launches: AtomicU64::new(0),
        }
    }

    /// Queues one replay on `stream` (any stream of the pool, not
    /// capturing) and returns a future that completes when the GPU has run
    /// it: a point recorded right after the launch.
    ///
    /// # Errors
    /// [`UnknownStream`](crate::ResourceError::UnknownStream);
    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing) when
    /// `stream` is being captured itself (nothing is queued); the driver's
    /// error launching (`CUDA_ERROR_INVALID_VALUE` when an allocation the
    /// graph made and did not free is still live from the last replay).
    ///
    /// # Safety
    /// 1. Every memory range the captured work touches that was not
    ///    allocated inside the capture is still allocated (not freed, not
    ///    handed to another allocation) when the replay runs: keep the
    ///    buffers a graph uses alive until its last replay has completed
    ///    (awaiting the future this returns, or dropping the graph after
    ///    the buffers' frees are ordered after it).
    pub unsafe fn launch(&self, stream: StreamId) -> ResourceResult<EventFuture> {
        let raw = self.res.stream_pool().raw(stream)?;
        self.res
            .core()
            .notifier(stream)?
            .refuse_capturing(&**self.res.gpu())?;
        // SAFETY: `raw` is a stream of the pool the resource holds (alive);
        // the memory the graph touches is live (this fn's Safety 1), and the
        // graph's own allocations are the graph's.
        unsafe { self.exec.launch(raw) }?;
        *self.last_launch.lock().unwrap_or_else(|p| p.into_inner()) = Some(raw);
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.res.completion_outside_capture(stream)
    }

    /// The capture that recorded the graph.
    pub fn capture(&self) -> CaptureId {
        self.exec.capture()
    }

    /// The stream the graph was captured on.
    pub fn origin(&self) -> StreamId {
        self.origin
    }

    /// Replays queued so far.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Orders the origin stream after the last replay, when that ran on
    /// another stream: the capture's memory is given back in the origin's
    /// order, and must not be reused before the replays touching it ran.
    fn order_release_after_replays(&self) {
        let last = *self.last_launch.lock().unwrap_or_else(|p| p.into_inner());
        let Some(last) = last.filter(|&l| l != self.origin_raw) else {
            return;
        };
        let gpu = self.res.gpu();
        let ordered = gpu.event_create().and_then(|event| {
            // SAFETY: `event` was just made on `gpu`; both streams are of
            // the pool the resource holds. CUDA allows destroying an event
            // with a wait on it queued: the wait keeps the record it saw.
            unsafe {
                let r = gpu
                    .event_record(event, last)
                    .and_then(|()| gpu.stream_wait_event(self.origin_raw, event));
                let _ = gpu.event_destroy(event);
                r
            }
        });
        if let Err(e) = ordered {
            tracing::warn!(capture = %self.capture(), error = %e,
                "could not order a graph's release after its replays");
        }
    }
}

impl<R: DeviceMemoryResource + 'static> Drop for CapturedGraph<R> {
    fn drop(&mut self) {
        let capture = self.capture();
        self.order_release_after_replays();
        // SAFETY: dropped once, here, and not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.exec) };
        release_capture(&**self.res.inner(), capture);
    }
}

impl<R: DeviceMemoryResource + 'static> std::fmt::Debug for CapturedGraph<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("capture", &self.capture())
            .field("origin", &self.origin)
            .field("launches", &self.launches())
            .finish()
    }
}
