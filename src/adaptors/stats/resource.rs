//! [`StatsResource`]: the decorator that counts.

use super::Stats;
use crate::error::ResourceResult;
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, AllocTag, BlockId, BlockState, DeviceBlock, StreamId};

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

impl<R: DeviceMemoryResource> DeviceMemoryResource for StatsResource<R> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        match self.inner.allocate(bytes, stream, tag) {
            Ok(block) => {
                self.stats.record_allocate(bytes, tag);
                Ok(block)
            }
            Err(e) => {
                self.stats.record_failure(tag);
                Err(e)
            }
        }
    }

    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        let (bytes, tag) = (block.size(), block.tag());
        self.inner.deallocate(block)?;
        self.stats.record_deallocate(bytes, tag);
        Ok(())
    }

    fn device_ordinal(&self) -> u32 {
        self.inner.device_ordinal()
    }

    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding()
    }

    fn reap_pending(&self) -> ResourceResult<()> {
        self.inner.reap_pending()
    }

    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.inner.pending_free_seq(stream)
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.inner.reap_through(stream, seq)
    }

    fn supports_block_use_tracking(&self) -> bool {
        self.inner.supports_block_use_tracking()
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.inner.record_block_use(block, use_stream)
    }

    fn prepare_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.inner.prepare_block_use(b, s, a)
    }

    fn finish_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.inner.finish_block_use(b, s, a)
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        self.inner.block_state(block)
    }
}
