//! [`Graphs`]: the cache under CUDA graph capture — which capture a call
//! serves, and the release of a graph's memory (see
//! [`GraphPool`](super::pool) for the rules).
//!
//! Every allocation and free the cache serves itself asks the stack below
//! whether the stream is capturing
//! ([`capture_status`](DeviceMemoryResource::capture_status)): memory
//! handed out or freed on a capturing stream goes to that capture's pool.
//! Calls the cache passes down (zero bytes, streams without a shard,
//! requests it does not hold) are the inner resource's business, which
//! counts them as its own graph allocations.

use std::sync::atomic::Ordering;

use crate::cache::arena::tier::ArenaTier;
use crate::cache::shard::{Backing, SlotGuard};
use crate::cache::shards::Shards;
use crate::cache::size_class::tier::{SizeClassTier, release_to_inner};
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::CaptureId;
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, StreamId};

/// The graph-memory duties of a cache, over its parts: the shards (where
/// each stream's graph pools live), the inner resource, and both tiers
/// (a released pool's memory goes back to the tier it came from).
#[derive(Debug)]
pub(crate) struct Graphs<'a, R> {
    pub(crate) shards: &'a Shards,
    pub(crate) inner: &'a R,
    pub(crate) arena: Option<&'a ArenaTier>,
    pub(crate) classes: &'a SizeClassTier,
}

impl<R: DeviceMemoryResource> Graphs<'_, R> {
    /// The capture `stream` (of slot `index`) is in, if any. An invalidated
    /// capture counts as none: its graph never replays. When the stream is
    /// not capturing, finishes the releases that waited for that.
    pub(crate) fn capture_on(
        &self,
        stream: StreamId,
        index: usize,
    ) -> ResourceResult<Option<CaptureId>> {
        let slots = &self.shards.slots;
        if !self.shards.config.capture_aware {
            return Ok(None);
        }
        let capture = self.inner.capture_status(stream)?.id();
        if capture.is_none() && slots[index].deferred.load(Ordering::Relaxed) {
            let mut shard = slots[index].lock();
            // Best effort: a failure keeps the pool for a later call, and
            // this call goes on.
            if let Err(e) = self.finish_deferred(index, &mut shard) {
                tracing::debug!(error = %e, %stream, "releasing a graph's memory failed; kept");
            }
        }
        Ok(capture)
    }

    /// [`release_capture`](DeviceMemoryResource::release_capture) for the
    /// cache's own pools: marks `capture`'s pool released on every shard
    /// and returns what it can now; the inner resource is told after.
    pub(crate) fn release_capture_pools(
        &self,
        capture: CaptureId,
        after: StreamId,
    ) -> ResourceResult<()> {
        ResourceError::check_device(self.shards.device, after.device())?;
        self.inner.capture_status(after)?.refuse(after)?;
        let mut first_err = None;
        for (index, slot) in self.shards.slots.iter().enumerate() {
            let mut shard = slot.lock();
            let Some(pool) = shard.graph_mut(capture) else {
                continue;
            };
            pool.released = Some(after);
            slot.deferred.store(true, Ordering::Relaxed);
            if let Err(e) = self.finish_deferred(index, &mut shard) {
                first_err.get_or_insert(e);
            }
        }
        let below = self.inner.release_capture(capture, after);
        match first_err {
            Some(e) => Err(e),
            None => below,
        }
    }

    /// Returns every released pool of slot `index` to general use, unless
    /// its stream (or the stream a pool's replays are ordered on) is
    /// capturing now.
    pub(crate) fn finish_deferred(
        &self,
        index: usize,
        shard: &mut SlotGuard<'_>,
    ) -> ResourceResult<()> {
        let stream = shard.stream;
        let released: Vec<(CaptureId, StreamId)> = shard
            .graphs
            .iter()
            .filter_map(|g| g.released.map(|after| (g.capture, after)))
            .collect();
        let mut result = Ok(());
        for (capture, after) in released {
            // A wait queued on a capturing stream would join its capture;
            // an event recorded on one would be captured.
            if self.inner.capture_status(stream)?.is_capturing()
                || self.inner.capture_status(after)?.is_capturing()
            {
                continue;
            }
            if let Err(e) = self.return_pool(shard, capture, after) {
                result = Err(e);
                break;
            }
        }
        let waiting = shard.graphs.iter().any(|g| g.released.is_some());
        self.shards.slots[index]
            .deferred
            .store(waiting, Ordering::Relaxed);
        result
    }

    /// Orders the shard's stream after `after` (the last replay), then gives
    /// `capture`'s pool back as freed at that point: arena ranges to the
    /// arena, size-class blocks to the free lists. Leases the capture handed
    /// out become ordinary ones, their free ordered after the replays too.
    ///
    /// # Errors
    /// A driver error ordering the stream: the pool stays, released, for a
    /// later call.
    fn return_pool(
        &self,
        shard: &mut SlotGuard<'_>,
        capture: CaptureId,
        after: StreamId,
    ) -> ResourceResult<()> {
        let stream = shard.stream;
        if stream != after {
            self.order_after(shard, capture, after)?;
        }
        if let Some(arena) = self.arena {
            // Now after the last replay (by the wait above, or as its
            // stream): the arena leases the capture handed out get their
            // last write here.
            for lease in shard.leases_mut() {
                if lease.capture == Some(capture)
                    && let Backing::Mapped(m) = &mut lease.backing
                {
                    arena.settle_replays(m, lease.stream)?;
                }
            }
        }
        let Some(pool) = shard.remove_graph(capture) else {
            return Ok(());
        };
        for lease in shard.leases_mut() {
            if lease.capture == Some(capture) {
                lease.capture = None;
            }
        }
        if !pool.ranges.is_empty()
            && let (Some(tier), Some(arena)) = (self.arena, shard.arena.as_mut())
        {
            let tier = &tier.vm;
            let mut bytes = 0;
            for (placed, noted) in pool.ranges {
                bytes += placed.len as usize;
                if !noted {
                    // Freed here, after the wait for the last replay.
                    tier.note_free(arena, placed);
                }
                tier.release_range(arena, placed);
            }
            let index = self.shards.slot_index(stream.index());
            self.shards.slots[index].add_arena_live(-(bytes as isize));
        }
        for (class, block) in pool.blocks {
            if self.classes.reserve(self.shards, shard, block.size()) {
                shard.push(class, block);
            } else if let Err(e) = release_to_inner(self.inner, &block, stream) {
                // Kept cached past the cap rather than lost, as a failed
                // trim does.
                tracing::debug!(error = %e, %stream, "evicting a graph's block failed; cached");
                shard.push(class, block);
            } else {
                shard.stats.evictions += 1;
            }
        }
        tracing::debug!(%capture, %stream, %after, "graph memory returned");
        Ok(())
    }

    /// Makes the shard's stream wait for `after`'s current end before it
    /// reuses what `capture`'s graph held: one event wait for the arena
    /// (a range is reused only in the stream's order, or elsewhere behind a
    /// fence on it); for size-class blocks, a recorded write on `after`
    /// that the stream waits for now (pooled blocks) or at their free
    /// (blocks users hold).
    fn order_after(
        &self,
        shard: &mut SlotGuard<'_>,
        capture: CaptureId,
        after: StreamId,
    ) -> ResourceResult<()> {
        let stream = shard.stream;
        if let (Some(tier), Some(arena)) = (self.arena, &shard.arena) {
            tier.order_after(arena, stream, after)?;
        }
        let Some(pool) = shard.graph_mut(capture) else {
            return Ok(());
        };
        for (_, block) in &pool.blocks {
            self.inner
                .finish_block_use(block.id(), after, Access::Write)?;
            self.inner
                .prepare_block_use(block.id(), stream, Access::Write)?;
        }
        for lease in shard.leases_mut() {
            if lease.capture != Some(capture) {
                continue;
            }
            if let Backing::Inner(inner) = &lease.backing {
                self.inner
                    .finish_block_use(inner.id(), after, Access::Write)?;
                lease.cross_used = true;
            }
        }
        Ok(())
    }
}
