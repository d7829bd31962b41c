//! [`CapturedGraph`]: an instantiated graph, replayed on the pool's streams
//! and awaited with the crate's futures.

#![allow(unsafe_code)]

use crate::util::sync::Mutex;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::graph_memory::free_instances;
use crate::error::driver_code::INVALID_VALUE;
use crate::error::{DriverCall, ResourceError, ResourceResult};
use crate::futures::{AsyncResource, EventFuture};
use crate::gpu::{CaptureId, Gpu, GraphExec};
use crate::resource::DeviceMemoryResource;
use crate::types::StreamId;

/// Tells the resource stack that the graph of capture `id` is gone, so that
/// memory handed out during the capture (the graph's) serves others again
/// once `after` passes the graph's last replay
/// ([`AsyncResource::release_capture`]). A failure is logged: what was not
/// returned stays with the graph's tally.
pub(super) fn release_capture<R: DeviceMemoryResource + ?Sized + 'static>(
    res: &AsyncResource<R>,
    id: CaptureId,
    after: StreamId,
) {
    if let Err(e) = res.release_capture(id, after) {
        tracing::warn!(capture = %id, %after, error = %e, "releasing a capture's memory failed");
    }
}

/// A captured, instantiated CUDA graph: [`launch`](Self::launch) replays it
/// on a stream of the pool and returns a future of that replay's
/// completion.
///
/// Made by [`GraphCapture::end`](super::GraphCapture::end) or
/// [`AsyncResource::capture_graph`]. Dropping it destroys the executable
/// graph (replays already queued still run) and then tells the resource
/// stack to release the memory of its capture behind the stream of the last
/// replay ([`AsyncResource::release_capture`]).
pub struct CapturedGraph<R: DeviceMemoryResource + ?Sized + 'static> {
    res: AsyncResource<R>,
    exec: ManuallyDrop<GraphExec<dyn Gpu>>,
    origin: StreamId,
    /// The stream of the last replay: the capture's memory is released
    /// behind it (CUDA runs the launches of one executable in order, so it
    /// is behind every replay).
    last_launch: Mutex<Option<StreamId>>,
    launches: AtomicU64,
}

impl<R: DeviceMemoryResource + ?Sized + 'static> CapturedGraph<R> {
    pub(super) fn new(res: AsyncResource<R>, exec: GraphExec<dyn Gpu>, origin: StreamId) -> Self {
        CapturedGraph {
            res,
            exec: ManuallyDrop::new(exec),
            origin,
            last_launch: Mutex::new(None),
            launches: AtomicU64::new(0),
        }
    }

    /// Queues one replay on `stream` (any stream of the pool, not
    /// capturing) and returns a future that completes when the GPU has run
    /// it: a point recorded right after the launch.
    ///
    /// Before the launch, it frees the instances the last replay left of
    /// blocks the capture allocated and their users dropped since (see
    /// "A block the capture allocated and did not free" in the essay of
    /// `src/graph/`),
    /// on `stream`, after the last replay's stream and the streams those
    /// blocks were freed on.
    ///
    /// # Errors
    /// [`UnknownStream`](crate::ResourceError::UnknownStream);
    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing) when
    /// `stream` is being captured itself (nothing is queued);
    /// [`Driver`](crate::ResourceError::Driver) with
    /// `CUDA_ERROR_INVALID_VALUE` when a block the capture allocated is
    /// still held and holds the last replay's output (nothing is queued:
    /// drop it first); the driver's error freeing an instance or launching.
    /// An error means the replay was not queued. Once it is queued the call
    /// succeeds, whatever fails after: were it to say `Err`, the caller
    /// would take the replay as not launched and reuse what it touches
    /// while it runs. So the completion point is made so that it cannot
    /// fail: its event is recorded right after the launch, or, when that
    /// record fails, when the future is first polled (the point is then a
    /// lazy one, [`completion_lazy`](AsyncResource::completion_lazy)), and
    /// that error is the future's.
    ///
    /// # Safety
    /// 1. Every memory range the captured work touches that was not
    ///    allocated inside the capture is still allocated (not freed, not
    ///    handed to another allocation) when the replay runs: keep the
    ///    buffers a graph uses alive until its last replay has completed
    ///    (awaiting the future this returns, or dropping the graph after
    ///    the buffers' frees are ordered after it).
    /// 2. Work the user queued after the last replay on a block the
    ///    capture allocated and the replays write again (a cache's range
    ///    the graph keeps) is ordered before this launch: awaited, or
    ///    queued on `stream`. (A block the graph memory holds is freed
    ///    after its uses by the crate, and made again by the replay.)
    /// 3. Work the user queues after this launch on a block the capture
    ///    allocated, on another stream than `stream`, without the crate's
    ///    block-use hooks (not through a buffer's launch or
    ///    [`prepare_block_use`](crate::DeviceMemoryResource::prepare_block_use)),
    ///    comes after the replay: await the future this returns first.
    ///    (Through the hooks the crate orders it after the last replay: the
    ///    bottom resource for its graph memory, a cache for a range it
    ///    handed out in the capture; on `stream`, stream order does.)
    pub unsafe fn launch(&self, stream: StreamId) -> ResourceResult<EventFuture> {
        let pool = self.res.stream_pool();
        let raw = pool.raw(stream)?;
        // Frees of this graph's kept blocks a capture refused go first: the
        // launch is refused while such a block is held.
        pool.deferred_frees().retry();
        // Every step that may fail comes before the replay is queued: once
        // it is, the books say so and the call succeeds (the point of its
        // completion cannot fail to be made, `EventFuture::point_after`).
        let core = self.res.core();
        let notifier = core.notifier(stream)?;
        notifier.refuse_capturing(&**self.res.gpu())?;
        // Held across the launch: the ledger's view of this graph's
        // instances changes only here, one launch at a time.
        let mut last_launch = self.last_launch.lock().unwrap_or_else(|p| p.into_inner());
        let capture = self.capture();
        let kept = pool.kept_graph_memory();
        let frees = kept
            .lock()
            .before_launch(capture)
            .map_err(|ptr| ResourceError::Driver {
                call: DriverCall::GraphLaunch,
                code: INVALID_VALUE,
                message: format!(
                    "CUDA_ERROR_INVALID_VALUE: the block at {ptr:#x}, allocated in the capture, \
                     still holds the last replay's output: drop it before the next launch"
                ),
            })?;
        if !frees.ptrs.is_empty() {
            // SAFETY: the pool is the resource's, of its gpu; the addresses
            // are instances the last replay left of blocks no user holds
            // any more, and the frees follow that replay's stream and the
            // streams where those blocks' uses were waited for.
            let (done, queued) =
                unsafe { free_instances(&**self.res.gpu(), |s| pool.raw(s), stream, &frees) };
            kept.lock().instances_freed(capture, &frees.ptrs[..done]);
            queued?;
        }
        // SAFETY: `raw` is a stream of the pool the resource holds (alive);
        // the memory the graph touches is live (this fn's Safety 1), and the
        // graph's own allocations are the graph's (the last replay's
        // instances freed above, or refused while held; their uses ordered
        // before, Safety 2).
        unsafe { self.exec.launch(raw) }?;
        kept.lock().launched(capture, stream);
        *last_launch = Some(stream);
        drop(last_launch);
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(EventFuture::point_after(core, stream, notifier))
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
}

impl<R: DeviceMemoryResource + ?Sized + 'static> Drop for CapturedGraph<R> {
    fn drop(&mut self) {
        let capture = self.capture();
        let after = self
            .last_launch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(self.origin);
        // SAFETY: dropped once, here, and not used afterwards. Replays
        // already queued still run (the driver frees the executable after
        // them).
        unsafe { ManuallyDrop::drop(&mut self.exec) };
        release_capture(&self.res, capture, after);
    }
}

impl<R: DeviceMemoryResource + ?Sized + 'static> std::fmt::Debug for CapturedGraph<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("capture", &self.capture())
            .field("origin", &self.origin)
            .field("launches", &self.launches())
            .finish()
    }
}
