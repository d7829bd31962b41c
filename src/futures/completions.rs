//! Uses and completion points of an [`AsyncResource`]: the block-use
//! hooks, the futures that complete when a stream reaches a point, and the
//! [`WaitPolicy`] those futures wait by.
//!
//! A launch on a block goes `prepare_block_use` (the waits it needs),
//! the work, `finish_block_use` (the use recorded below, and an
//! [`EventFuture`] for its end). [`completion`](AsyncResource::completion)
//! makes the same future for everything queued on a stream, with an event
//! recorded now; [`completion_lazy`](AsyncResource::completion_lazy)
//! asks the stream itself when first polled and records an event only if
//! it is still busy. Every use named to these hooks is counted
//! (`hook_uses`): a free that rests on "nothing used the block since"
//! ([`frees`](super::frees)) reads that count.
//!
//! None of them is made inside a CUDA graph capture: a point's event would
//! be part of the graph (see each method's `# Captures`).

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::async_resource::AsyncResource;
use super::event_future::EventFuture;
use super::wait_policy::WaitPolicy;
use crate::error::ResourceResult;
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, BlockId, BlockState, DeviceBlock, StreamId};

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Before queuing work on `use_stream` that touches `block`: queues the
    /// waits it needs (forwards to the inner resource).
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::prepare_block_use`].
    pub fn prepare_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.core().hook_uses.fetch_add(1, Ordering::SeqCst);
        self.inner().prepare_block_use(block, use_stream, access)
    }

    /// Records a use of `block` on `use_stream` (forwards to the inner
    /// resource).
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::record_block_use`].
    pub fn record_block_use(
        &self,
        block: &DeviceBlock,
        use_stream: StreamId,
    ) -> ResourceResult<()> {
        self.core().hook_uses.fetch_add(1, Ordering::SeqCst);
        self.inner().record_block_use(block, use_stream)
    }

    /// After queuing work on `use_stream` that touches `block`: records the
    /// use in the inner resource and returns a future that completes when
    /// the GPU has executed that work.
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::finish_block_use`]; an unknown stream, and
    /// a stream being captured into a CUDA graph
    /// ([`StreamCapturing`](crate::ResourceError::StreamCapturing)), are
    /// refused before the inner resource is touched. Inside a capture, a
    /// use runs at each replay, not now: the stream-ordered resource
    /// records no event for it ([`record_block_use`](Self::record_block_use)
    /// is accepted and keeps the uses recorded before); await the graph's
    /// launch instead. On any error no use is recorded (the completion
    /// point is made first and let go if the inner resource refuses): the
    /// work queued on `use_stream` is not ordered before the block's free,
    /// so call again, or keep the block until that work is known done.
    ///
    /// # Stream ordering
    /// The future covers everything queued on `use_stream` before the call.
    pub fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<EventFuture> {
        self.core()
            .notifier(use_stream)?
            .refuse_capturing(&*self.core().gpu)?;
        // Counted before the use is visible, and kept on failure: a count
        // too high only makes a later drop's free an ordinary one.
        self.core().hook_uses.fetch_add(1, Ordering::SeqCst);
        if !matches!(
            self.inner().block_state(block),
            Some(BlockState::Live) | None
        ) {
            // A block known not live is refused below; no point is made
            // for it, so bad input makes no driver call.
            self.inner().finish_block_use(block, use_stream, access)?;
            return EventFuture::point_outside_capture(self.core(), use_stream);
        }
        // The point first: its event, recorded after the work, covers it
        // whichever is recorded first, and a point that cannot be made
        // leaves nothing behind. A refused use drops the point (released).
        let done = EventFuture::point_outside_capture(self.core(), use_stream)?;
        self.inner().finish_block_use(block, use_stream, access)?;
        Ok(done)
    }

    /// A future that completes when the GPU has executed everything queued
    /// on `stream` before the call.
    ///
    /// # Errors
    /// [`UnknownStream`](crate::ResourceError::UnknownStream),
    /// [`WrongDevice`](crate::ResourceError::WrongDevice), a driver error;
    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing) while
    /// `stream` is being captured into a CUDA graph (the point's event
    /// would be part of the graph and could never be awaited without
    /// invalidating the capture): await the graph's launch instead.
    ///
    /// # Captures
    /// Refused at creation rather than completed at a replay: a replay's
    /// completion is a point recorded after the launch, outside the capture
    /// (see [`CapturedGraph::launch`](crate::CapturedGraph::launch)). One `cuStreamGetCaptureInfo` per call tells.
    pub fn completion(&self, stream: StreamId) -> ResourceResult<EventFuture> {
        EventFuture::point(self.core(), stream)
    }

    /// A future that completes when the GPU has executed everything queued
    /// on `stream` before the call, and that records nothing until it is
    /// polled: for a completion awaited right away, as a task that queues
    /// work and awaits it does.
    ///
    /// Making it costs no driver call (but the capture check of
    /// [`completion`](Self::completion)). Its polls ask the stream
    /// (`cuStreamQuery`) where a [`completion`](Self::completion) queries
    /// the event it recorded: on the first poll once, then for
    /// [`WaitPolicy::spin`]. When the stream is idle the future is done
    /// with that one call and no event at all, and every point of the
    /// stream made before the query is settled with it. When the stream is
    /// still busy after the spin, the future records its event then and
    /// waits on it as a [`completion`](Self::completion) does (yielding,
    /// then parking on a notification).
    ///
    /// # Completes later than its point, when others feed the stream
    /// The stream is idle only once everything queued on it has run, and
    /// the event recorded after the spin covers what was queued until
    /// then: work queued on `stream` after the call and before the first
    /// poll's spin ends (by this thread or another) delays it. Made long
    /// before it is polled, in a loop that queues more behind it, it may
    /// complete only when the stream drains: use
    /// [`completion`](Self::completion) there, whose event marks the point
    /// exactly.
    ///
    /// # Errors
    /// As [`completion`](Self::completion) when made; when polled, the
    /// driver's error of the query or of the late record (a device fault).
    ///
    /// # Captures
    /// Refused at creation as [`completion`](Self::completion) is. A stream
    /// that begins a capture before the first poll is never queried (a
    /// query would invalidate the capture): the future then completes
    /// after the capture ends, by a notification.
    pub fn completion_lazy(&self, stream: StreamId) -> ResourceResult<EventFuture> {
        EventFuture::lazy_point(self.core(), stream)
    }

    /// [`completion`](Self::completion) on a stream the caller just found
    /// not capturing.
    pub(crate) fn completion_outside_capture(
        &self,
        stream: StreamId,
    ) -> ResourceResult<EventFuture> {
        EventFuture::point_outside_capture(self.core(), stream)
    }

    /// How completion futures made from now on wait before parking on a
    /// notification (default [`WaitPolicy::DEFAULT`]).
    pub fn set_wait_policy(&self, policy: WaitPolicy) {
        self.core().policy.set(policy);
    }

    /// The current [`WaitPolicy`].
    pub fn wait_policy(&self) -> WaitPolicy {
        self.core().policy.get()
    }
}
