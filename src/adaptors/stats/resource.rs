//! [`StatsResource`]: the decorator that counts.

use super::Stats;
use crate::error::ResourceResult;
use crate::forward_to_inner;
use crate::resource::DeviceMemoryResource;
use crate::types::{AllocTag, CompletedUses, DeviceBlock, NeverUsed, StreamId};
use crate::util::poll_scope::in_waiting_try;

/// Counts allocations and deallocations of the inner resource into a
/// [`Stats`]; forwards everything else unchanged.
///
/// See [`Stats`] for an example.
#[derive(Debug)]
pub struct StatsResource<R> {
    inner: R,
    stats: Stats,
}

/// Counts an allocation's outcome when dropped, which is after the result
/// has moved to the caller's return place.
///
/// Counting while the result still lay in a local (`match &result`, then
/// `result`) cost a copy of the block (80 bytes) on every allocation: the
/// compiler could not tell that the counters' stores miss the caller's
/// return place, so it had the inner resource write the block into a
/// local and copied it out after the counting, with 16-byte loads of what
/// the inner resource stored 8 bytes at a time, which the processor
/// cannot forward from its store buffer. Counted from here, nothing comes
/// between the inner resource's write and the move, and the block is
/// written where the caller wants it.
struct CountOnReturn<'a, R> {
    stats: &'a StatsResource<R>,
    bytes: usize,
    tag: AllocTag,
    /// `None` for an allocation made; for a refusal, whether it was for
    /// lack of memory.
    refused: Option<bool>,
}

impl<R> Drop for CountOnReturn<'_, R> {
    #[inline(always)]
    fn drop(&mut self) {
        match self.refused {
            None => self.stats.stats.record_allocate(self.bytes, self.tag),
            Some(lack_of_memory) => self.stats.count_refused(self.tag, lack_of_memory),
        }
    }
}

impl<R> StatsResource<R> {
    /// Counts an allocation the inner resource refused: a refusal its
    /// request waits out is back-pressure, anything else a failure.
    #[cold]
    #[inline(never)]
    fn count_refused(&self, tag: AllocTag, lack_of_memory: bool) {
        if lack_of_memory && in_waiting_try() {
            self.stats.record_refusal(tag);
        } else {
            self.stats.record_failure(tag);
        }
    }

    /// Wraps `inner`, counting into `stats`.
    pub fn new(inner: R, stats: &Stats) -> Self {
        StatsResource {
            inner,
            stats: stats.clone(),
        }
    }

    /// The inner resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it.
#[allow(unsafe_code)]
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for StatsResource<R> {
    forward_to_inner!(inner; device_ordinal, bytes_outstanding, reap_pending, pending_free_seq, reap_through, supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use, block_state, allocation_cost, allocation_cost_is_exact, frees_across_streams, frees_only_queue, release_idle, allocation_limit, budget_reliefs, capture_status, release_capture, snapshot_into, begin_sleep, settle_sleep, wake);
    #[inline]
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let result = self.inner.allocate(bytes, stream, tag);
        // Counted by a guard, after the result has moved to the caller:
        // see `CountOnReturn`.
        let _count = CountOnReturn {
            stats: self,
            bytes,
            tag,
            refused: match &result {
                Ok(_) => None,
                Err(e) => Some(e.is_lack_of_memory()),
            },
        };
        result
    }

    fn visit_layers(&self, visit: &mut dyn FnMut(&dyn std::any::Any)) {
        visit(&self.stats);
        self.inner.visit_layers(visit)
    }

    #[inline]
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        let (bytes, tag) = (block.size(), block.tag());
        self.inner.deallocate(block)?;
        self.stats.record_deallocate(bytes, tag);
        Ok(())
    }

    #[inline]
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        let (bytes, tag) = (block.size(), block.tag());
        self.inner.deallocate_completed(block, completed)?;
        self.stats.record_deallocate(bytes, tag);
        Ok(())
    }

    #[inline]
    fn deallocate_unused(&self, block: DeviceBlock, unused: NeverUsed) -> ResourceResult<()> {
        let (bytes, tag) = (block.size(), block.tag());
        self.inner.deallocate_unused(block, unused)?;
        self.stats.record_deallocate(bytes, tag);
        Ok(())
    }
}
