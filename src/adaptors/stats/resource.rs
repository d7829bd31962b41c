//! [`StatsResource`]: the decorator that counts.

use super::Stats;
use crate::error::{ResourceError, ResourceResult};
use crate::forward_to_inner;
use crate::resource::DeviceMemoryResource;
use crate::types::{AllocTag, CompletedUses, DeviceBlock, StreamId};
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

impl<R> StatsResource<R> {
    /// Counts an allocation the inner resource refused: a refusal its
    /// request waits out is back-pressure, anything else a failure.
    #[cold]
    #[inline(never)]
    fn count_refused(&self, tag: AllocTag, e: &ResourceError) {
        if e.is_lack_of_memory() && in_waiting_try() {
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
        // Looked at where it lies: handing back another value on the
        // refusal's path would cost a copy of the block on the hot path.
        let result = self.inner.allocate(bytes, stream, tag);
        match &result {
            Ok(_) => self.stats.record_allocate(bytes, tag),
            Err(e) => self.count_refused(tag, e),
        }
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
}
