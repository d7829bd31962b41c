//! The block-use hooks: how a use of a block on another stream is ordered
//! after the block's allocation and earlier writes
//! ([`queue_waits`](StreamOrderedResource::queue_waits)), how its end is
//! recorded for the free to wait on
//! ([`record_use`](StreamOrderedResource::record_use)), and how a use of a
//! block a capture allocated and kept follows the graph's replays
//! ([`with_backed`](StreamOrderedResource::with_backed)).
//!
//! A record's uses are one read event per stream plus the last write
//! ([`BlockUses`](crate::resource::block_uses::BlockUses)), from the
//! resource's event pool. They are changed under the record's shard lock,
//! so that a wait never sees an event being re-recorded for another use;
//! a record whose free is in flight is
//! [`FreeInFlight`](crate::error::ResourceError::FreeInFlight) to a hook,
//! which changes nothing.
//!
//! # Stream ordering
//!
//! A stream being captured into a graph may not wait on an event recorded
//! outside its capture (the driver would invalidate the user's capture):
//! such a wait is refused (`StreamCapturing`) before anything is queued.
//! A use queued on a capturing stream records nothing: it runs at each
//! replay, which the launch orders.

// Unsafe here: capture queries, event records and waits on raw handles of
// the `Gpu` seam.
#![allow(unsafe_code)]

use super::StreamOrderedResource;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{Gpu, RawStream};
use crate::resource::shard::BlockRecord;
use crate::types::{Access, BlockId, StreamId};

impl<G: Gpu> StreamOrderedResource<G> {
    /// Runs `f` on the live record of `block` under its shard lock.
    ///
    /// A block whose free is in flight on another thread is
    /// [`FreeInFlight`](ResourceError::FreeInFlight): that free may still
    /// fail and leave the block live, so the hook is told neither "live" nor
    /// "freed", and changes nothing.
    fn with_live<T>(
        &self,
        block: BlockId,
        f: impl FnOnce(&mut BlockRecord) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let (slot, seq) = self.locate(block)?;
        let mut guard = slot.lock();
        let shard = &mut *guard;
        match shard.blocks.get_mut(seq) {
            Some(record) if record.freeing => Err(ResourceError::FreeInFlight { block }),
            Some(record) => f(record),
            None => Err(Self::missing(shard, seq, block)),
        }
    }

    /// `StreamCapturing` when `stream` is being captured into a graph (on
    /// CUDA a driver call only while a capture begun through the crate is
    /// underway, `gpu::capture_gate`).
    fn refuse_capturing(&self, stream: StreamId, raw: RawStream) -> ResourceResult<()> {
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        unsafe { self.gpu.capture_status(raw) }?.refuse(stream)
    }

    /// Queues the waits `use_stream` needs before `access` to `record`.
    pub(super) fn queue_waits(
        &self,
        record: &mut BlockRecord,
        use_stream: StreamId,
        raw_use: RawStream,
        access: Access,
    ) -> ResourceResult<()> {
        let first_elsewhere = record.uses.last_write.is_none() && use_stream != record.stream;
        if first_elsewhere || record.uses.waits_for(use_stream, access).next().is_some() {
            // A capturing stream may not wait on an event recorded outside
            // its capture: the driver refuses with STREAM_CAPTURE_ISOLATION
            // and invalidates the user's capture (`tests/cuda/graph.rs`
            // checks that it does).
            self.refuse_capturing(use_stream, raw_use)?;
        }
        let mut allocation_point = None;
        if first_elsewhere {
            // The allocation point is recorded on the block's stream: were
            // that stream capturing, the event would be captured, and a wait
            // on it from `use_stream` would pull `use_stream` into the
            // capture. Refused until the capture ends.
            self.refuse_capturing(record.stream, record.raw_stream)?;
            // First use on another stream: order it after the allocation by
            // recording where the allocation stream is now.
            let event = self.events.take().map_err(ResourceError::from)?;
            // SAFETY: the event comes from this resource's pool, which made it
            // on `self.gpu` and destroys it only when dropped; the stream is
            // the record's, resolved through `self.stream_pool`, which this
            // resource holds and which keeps its streams alive (its
            // constructors' contract).
            if let Err(e) = unsafe { self.gpu.event_record(event, record.raw_stream) } {
                self.events.give([event]);
                return Err(ResourceError::from(e));
            }
            record.uses.last_write = Some((record.stream, event));
            allocation_point = Some(event);
        }
        let failed = record
            .uses
            .waits_for(use_stream, access)
            // SAFETY: `raw_use` was resolved through `self.stream_pool` (kept
            // alive with it); the events are the record's, taken from this
            // resource's pool and live until given back to it.
            .find_map(|event| unsafe { self.gpu.stream_wait_event(raw_use, event) }.err());
        match failed {
            None => Ok(()),
            Some(e) => {
                // A failed call changes nothing: the allocation point goes
                // back to the pool (the waits already queued only order more).
                if let Some(event) = allocation_point {
                    record.uses.last_write = None;
                    self.events.give([event]);
                }
                Err(ResourceError::from(e))
            }
        }
    }

    /// Makes `raw_on` wait for the work queued on `earlier` so far.
    /// Refused (`StreamCapturing`, nothing queued) while `earlier`
    /// captures: the event would be recorded in that capture, and the wait
    /// would join `raw_on` to it.
    pub(super) fn follow(&self, earlier: StreamId, raw_on: RawStream) -> ResourceResult<()> {
        let raw = self.raw_stream(earlier)?;
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        unsafe { self.gpu.capture_status(raw) }?.refuse(earlier)?;
        let event = self.events.take().map_err(ResourceError::from)?;
        // SAFETY: a pooled event of this gpu; `raw` and `raw_on` are streams
        // of this resource's pool (alive). The event goes back to the pool
        // once the wait is queued: a wait keeps the record it saw.
        let ordered = unsafe { self.gpu.event_record(event, raw) }
            .and_then(|()| unsafe { self.gpu.stream_wait_event(raw_on, event) });
        self.events.give([event]);
        ordered.map_err(ResourceError::from)
    }

    /// [`with_live`](Self::with_live) for a use on `raw_use`, refused
    /// when the block is one its capture allocated and kept (a graph memory
    /// node) with no replay's instance live, unless the use is itself
    /// captured into that capture: outside its graph's replays there is no
    /// memory at its address then. A block of no capture (the common case)
    /// takes its shard's lock once.
    ///
    /// With `before: Some(use_stream)` (a use about to be queued there), a
    /// use of a kept block outside its capture is first ordered after the
    /// graph's last replay, which wrote the block: `use_stream` waits for
    /// the work queued so far on the stream of that replay (nothing when
    /// it is `use_stream`, whose order does it). The replay records no use
    /// of the block (it is queued by the graph, not through a hook), so
    /// nothing else would order it; refused (`StreamCapturing`, nothing
    /// queued) while either stream captures.
    pub(super) fn with_backed<T>(
        &self,
        block: BlockId,
        raw_use: RawStream,
        before: Option<StreamId>,
        mut f: impl FnMut(&mut BlockRecord) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let kept = self.with_live(block, |r| match r.capture {
            None => f(r).map(Ok),
            Some(c) => Ok(Err((c, r.ptr))),
        })?;
        let (capture, ptr) = match kept {
            Ok(done) => return Ok(done),
            Err(kept) => kept,
        };
        // SAFETY: `raw_use` was resolved through `self.stream_pool`, which
        // keeps its streams alive.
        let inside = unsafe { self.gpu.capture_status(raw_use) }?.id() == Some(capture);
        if inside {
            return self.with_live(block, f);
        }
        // The ledger's lock is taken before any shard lock, never inside.
        let last_launch = {
            let ledger = self.stream_pool.kept_graph_memory().lock();
            if !ledger.backed(capture, ptr) {
                return Err(ResourceError::GraphMemoryUnbacked { block });
            }
            ledger.last_launch(capture)
        };
        if let Some(use_stream) = before
            && let Some(last) = last_launch.filter(|&l| l != use_stream)
        {
            // A capturing `use_stream` may not wait on an event recorded
            // outside its capture (the driver would invalidate it).
            self.refuse_capturing(use_stream, raw_use)?;
            self.follow(last, raw_use)?;
        }
        // Backed until the user lets the block go (a launch that would free
        // its instance is refused while the user holds it).
        self.with_live(block, f)
    }

    /// Records the end of a use of `access` on `use_stream`.
    pub(super) fn record_use(
        &self,
        record: &mut BlockRecord,
        use_stream: StreamId,
        raw_use: RawStream,
        access: Access,
    ) -> ResourceResult<()> {
        // A use queued on a capturing stream runs at each replay of the
        // graph, not now, and an event recorded there would be captured: a
        // wait on it after the capture fails (`CUDA_ERROR_CAPTURED_EVENT`),
        // and one from another stream during it joins that stream to the
        // capture. Nothing is recorded, and the uses recorded before stay:
        // ordering later work after the replays is the launch's contract
        // (`CapturedGraph::launch`).
        // SAFETY: `raw_use` was resolved through `self.stream_pool`, which
        // keeps its streams alive.
        if unsafe { self.gpu.capture_status(raw_use) }?.is_capturing() {
            return Ok(());
        }
        let (event, fresh) = match record.uses.slot(use_stream, access) {
            Some(e) => (e, false),
            None => (self.events.take().map_err(ResourceError::from)?, true),
        };
        // SAFETY: as in `queue_waits`: a pooled event, a pool stream.
        if let Err(e) = unsafe { self.gpu.event_record(event, raw_use) } {
            if fresh {
                self.events.give([event]);
            }
            return Err(ResourceError::from(e));
        }
        if let Some(old) = record.uses.store(use_stream, access, event) {
            self.events.give([old]);
        }
        Ok(())
    }
}
