//! A block's way out: its free
//! ([`deallocate`](crate::resource::DeviceMemoryResource::deallocate), here
//! [`free_block`](StreamOrderedResource::free_block)) and the reaps that
//! learn the GPU ran it ([`drain`](StreamOrderedResource::drain),
//! [`reap_streams`](StreamOrderedResource::reap_streams)).
//!
//! A free marks the record as being freed and takes its uses under the
//! shard lock, then queues, without the lock, the waits of the block's
//! stream on its uses elsewhere and the free itself; the record moves from
//! live to pending (or to a graph's tally, for a free in a capture) once
//! the free is queued, and a failed driver call puts the uses back and
//! takes the mark off. A block a capture allocated and kept, or one a
//! capture adopts, is settled with the pool's ledger
//! ([`KeptGraphMemory`](crate::device::graph_memory::KeptGraphMemory)).
//!
//! # Stream ordering
//!
//! The free is queued on the block's allocation stream, after waits on
//! every use recorded on other streams, so the memory goes back only
//! after the last use the hooks saw. Pending bytes leave the tallies only
//! when the host learns the stream passed the free: a stream synchronize
//! in [`reap_pending`](crate::resource::DeviceMemoryResource::reap_pending), or a
//! completion notification through
//! [`reap_through`](crate::resource::DeviceMemoryResource::reap_through), never on
//! absence of news.

// Unsafe here: capture queries, waits, frees and synchronizes on raw
// handles of the `Gpu` seam.
#![allow(unsafe_code)]

use super::StreamOrderedResource;
use crate::device::graph_memory::{Adopted, KeptFree};
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::Gpu;
use crate::resource::block_uses::BlockUses;
use crate::types::{DeviceBlock, StreamId};

impl<G: Gpu> StreamOrderedResource<G> {
    /// [`deallocate`](crate::resource::DeviceMemoryResource::deallocate): marks the record
    /// as being freed, queues the waits on its uses on other streams and
    /// the free on its stream (or settles a kept or adopted block with the
    /// pool's ledger), then moves its bytes from live to pending.
    ///
    /// # Errors
    ///
    /// `ForeignBlock`, `UnknownBlock`, `DoubleFree`, `FreeInFlight`, and
    /// `StreamCapturing` where the free would join a capture to work
    /// outside it; a driver error. Every failure leaves the block live,
    /// with its uses.
    pub(super) fn free_block(&self, block: DeviceBlock) -> ResourceResult<()> {
        ResourceError::check_device(self.device_ordinal, block.device())?;
        let id = block.id();
        let (slot, seq) = self.locate(id)?;
        // Mark the record as being freed and take its uses (one lock); the
        // waits and the free are queued without the lock. The record stays
        // where it is: on failure the uses go back and the mark comes off,
        // and meanwhile a hook or a second free gets `FreeInFlight`, and
        // neither touches it.
        let (size, stream, raw, uses, kept) = {
            let mut guard = slot.lock();
            let shard = &mut *guard;
            let Some(record) = shard.blocks.get_mut(seq) else {
                return Err(Self::missing(shard, seq, id));
            };
            if record.ptr != block.ptr()
                || record.size != block.size()
                || !record.stream.is(block.stream())
            {
                return Err(ResourceError::UnknownBlock { block: id });
            }
            // That free may still fail and leave the block live: not a
            // double free (yet).
            if record.freeing {
                return Err(ResourceError::FreeInFlight { block: id });
            }
            record.freeing = true;
            let uses = std::mem::take(&mut record.uses);
            let kept = record.capture;
            (record.size, record.stream, record.raw_stream, uses, kept)
        };
        let restore = |uses: BlockUses| {
            if let Some(record) = slot.lock().blocks.get_mut(seq) {
                record.uses = uses;
                record.freeing = false;
            }
        };
        // A free queued on a capturing stream is a node of the capture's
        // graph: it runs at every replay, and the memory stays the graph's
        // until the graph is released.
        // SAFETY: `raw` is the record's pool stream (kept alive by
        // `self.stream_pool`).
        let capture = match unsafe { self.gpu.capture_status(raw) } {
            Ok(status) => status.id(),
            Err(e) => {
                restore(uses);
                return Err(ResourceError::from(e));
            }
        };
        // A block a capture allocated (a graph memory node) and did not free
        // in it: inside another capture its free would be a node of that
        // graph too, of memory the first graph re-allocates at every replay
        // (refused, the block stays live); outside any, the pool's ledger
        // says who frees what the replays made.
        let kept_free = match (kept, capture) {
            (Some(k), Some(c)) if k != c => {
                restore(uses);
                return Err(ResourceError::StreamCapturing {
                    stream,
                    capture: Some(c),
                });
            }
            (Some(k), None) => Some((k, self.stream_pool.kept_graph_memory().lock())),
            _ => None,
        };
        let how = kept_free
            .as_ref()
            .map(|(k, ledger)| ledger.user_free(*k, block.ptr()));
        // A block from outside the capture freed on a capturing stream (by
        // any thread: the capture takes whatever is queued on its stream):
        // a free node of the graph would free it at every replay, the
        // second time someone else's memory. The graph adopts it instead:
        // nothing is queued now, its replays may use it up to this free,
        // and its release frees it once, behind the last replay.
        let adopt = match (kept, capture) {
            (None, Some(c)) => Some(c),
            _ => None,
        };
        let mut others = uses
            .reads
            .iter()
            .chain(&uses.last_write)
            .filter(|(s, _)| *s != stream)
            .map(|&(_, e)| e)
            .peekable();
        if let (Some(c), Some(_), None) = (capture, others.peek(), adopt) {
            // Waiting for the uses on other streams would wait, from the
            // capture, on events recorded outside it: the driver refuses
            // (STREAM_CAPTURE_ISOLATION) and invalidates the capture.
            // Refused instead; the block stays live, to be freed after.
            drop(others);
            restore(uses);
            return Err(ResourceError::StreamCapturing {
                stream,
                capture: Some(c),
            });
        }
        for event in others.filter(|_| adopt.is_none()) {
            // SAFETY: `raw` is the record's pool stream (kept alive by
            // `self.stream_pool`); the event is one of the block's uses, from
            // this resource's pool, live until given back below.
            if let Err(e) = unsafe { self.gpu.stream_wait_event(raw, event) } {
                restore(uses);
                return Err(ResourceError::from(e));
            }
        }
        // A kept block whose graph lives frees nothing on the device (the
        // graph frees each replay's instance, after this stream, which now
        // waits for the block's uses); one whose graph is gone frees the
        // instance a replay left, if any.
        let device_free = adopt.is_none() && matches!(how, None | Some(KeptFree::Ordinary));
        // An ordinary free of a kept block (its graph gone) frees the
        // instance the last replay made, on whatever stream it ran: after
        // that stream's work so far.
        if let (Some((k, ledger)), Some(KeptFree::Ordinary)) = (&kept_free, how)
            && let Some(last) = ledger.last_launch(*k).filter(|&l| l != stream)
            && let Err(e) = self.follow(last, raw)
        {
            restore(uses);
            return Err(e);
        }
        // SAFETY: `raw` is the record's pool stream; `block.ptr()` equals the
        // record's address (checked above), which `alloc_async` of this gpu
        // returned, and is live (not a kept block, or the live instance of
        // one); the record is marked as being freed under its shard lock, so
        // no other call frees it, and it leaves the live set below.
        if device_free && let Err(e) = unsafe { self.gpu.free_async(block.ptr(), raw) } {
            restore(uses);
            return Err(e.for_request(size, stream));
        }
        // Live to pending within the shard, under its lock; `outstanding`
        // does not change, so no reader can miss the block meanwhile.
        let (_, local) = self.place(stream);
        let to_graph = match (how, capture) {
            (Some(KeptFree::ToGraph), _) => kept,
            (_, captured) => captured,
        };
        let retired = match to_graph {
            Some(capture) => slot.lock().retire_to_graph(seq, capture),
            None => slot.lock().retire(seq, local),
        };
        debug_assert!(retired, "a record marked as being freed vanished");
        match (kept_free, how) {
            (Some((k, mut ledger)), Some(how)) => ledger.settle(k, block.ptr(), how, stream),
            _ => {
                if let (Some(k), Some(_)) = (kept, capture) {
                    self.stream_pool
                        .kept_graph_memory()
                        .lock()
                        .freed_in_capture(k, block.ptr());
                }
            }
        }
        let mut uses = uses;
        if let Some(c) = adopt {
            // The uses on other streams are the release's to wait for.
            let (elsewhere, here): (Vec<_>, Vec<_>) =
                uses.take_all().into_iter().partition(|(s, _)| *s != stream);
            self.events.give(here.into_iter().map(|(_, e)| e));
            let adopted = Adopted {
                ptr: block.ptr(),
                stream,
                events: elsewhere.into_iter().map(|(_, e)| e).collect(),
            };
            self.stream_pool
                .kept_graph_memory()
                .lock()
                .adopt(c, adopted);
        }
        if uses.event_count() > 0 {
            self.events
                .give(uses.take_all().into_iter().map(|(_, e)| e));
        }
        tracing::trace!(bytes = size, %stream, ptr = block.ptr(), "deallocate");
        Ok(())
    }

    /// Stream `(shard, local)` reached `seq`: drains its frees through it;
    /// returns the bytes drained.
    pub(super) fn drain(&self, shard: usize, local: usize, seq: u64) -> usize {
        let slot = &self.shards[shard];
        let mut guard = slot.lock();
        let drained = guard.drain_through(local, seq);
        slot.sub_outstanding(&guard, drained);
        drop(guard);
        if drained > 0 {
            // The device has these bytes back: an allocation waiting on
            // this device, in any queue of the process, may fit now.
            crate::waiters::memory_returned(crate::waiters::Scope::Device {
                ordinal: self.gpu.ordinal(),
                context: self.gpu.context_id(),
            });
        }
        drained
    }

    /// [`reap_pending`](crate::resource::DeviceMemoryResource::reap_pending): synchronizes
    /// each stream with queued frees that is not capturing, then drains
    /// it; nothing inside a poll of the crate's futures.
    pub(super) fn reap_streams(&self) -> ResourceResult<()> {
        if crate::util::poll_scope::in_poll() {
            return Ok(());
        }
        let mut marks = Vec::new();
        for (index, slot) in self.shards.iter().enumerate() {
            let mut shard = slot.lock();
            for local in 0..shard.streams().len() {
                if let Some(seq) = shard.stream(local).high_water() {
                    marks.push((index, local, seq));
                }
            }
        }
        for (index, local, seq) in marks {
            let stream = self
                .stream_pool
                .id((local << self.shard_bits) | index)
                .ok_or(ResourceError::UnknownStream {
                    stream: StreamId::new(
                        self.device_ordinal,
                        ((local << self.shard_bits) | index) as u32,
                    ),
                    pool_len: self.stream_pool.len(),
                })?;
            let raw = self.raw_stream(stream)?;
            // SAFETY: `raw` was resolved through `self.stream_pool`, which
            // keeps its streams alive.
            if unsafe { self.gpu.capture_status(raw) }
                .map_err(ResourceError::from)?
                .is_capturing()
            {
                continue;
            }
            // SAFETY: as above.
            unsafe { self.gpu.stream_synchronize(raw) }.map_err(ResourceError::from)?;
            if self.drain(index, local, seq) > 0 {
                // Possibly behind budgets above the caller (`sync_drains`).
                crate::util::sync_drains::drained();
            }
        }
        Ok(())
    }
}
