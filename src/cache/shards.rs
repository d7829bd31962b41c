//! [`Shards`]: what both tiers of the cache share — its identity, its
//! configuration and its per-stream [`Slot`]s (each a [`Shard`] behind its
//! lock, holding the leases of both tiers).
//!
//! The tiers ([`ArenaTier`](super::arena::tier::ArenaTier),
//! [`SizeClassTier`](super::size_class::tier::SizeClassTier)) and the graph
//! pools ([`graph`](super::graph)) each get the shards as an argument
//! rather than a reference to the [`CachingResource`](super::CachingResource)
//! that owns them: the cache dispatches to the tiers, and nothing below it
//! calls back up.
//!
//! [`Shard`]: super::shard::Shard

use super::config::CacheConfig;
use super::shard::{Lease, SHARD_MASK, Slot};
use crate::error::{ResourceError, ResourceResult};
use crate::types::{BlockId, ResourceId};

/// The cache's identity, configuration and per-stream slots.
#[derive(Debug)]
pub(crate) struct Shards {
    /// The cache's identity (the blocks it hands out carry it).
    pub(crate) id: ResourceId,
    pub(crate) config: CacheConfig,
    /// The device of the inner resource.
    pub(crate) device: u32,
    /// One slot per cached stream, plus a last one holding the leases of
    /// streams past `config.streams` (which are never cached).
    pub(crate) slots: Box<[Slot]>,
}

impl Shards {
    /// The slot of a cached stream's index, or the overflow slot.
    #[inline]
    pub(crate) fn slot_index(&self, stream_index: u32) -> usize {
        (stream_index as usize).min(self.config.streams)
    }

    /// The slot and serial of one of this cache's blocks.
    pub(crate) fn locate(&self, block: BlockId) -> ResourceResult<(&Slot, u64)> {
        if block.resource() != self.id {
            return Err(ResourceError::ForeignBlock { block });
        }
        let serial = block.serial();
        match self.slots.get((serial & SHARD_MASK) as usize) {
            Some(slot) => Ok((slot, serial)),
            None => Err(ResourceError::UnknownBlock { block }),
        }
    }

    /// Runs `f` on the lease of `block` under its shard lock (held across
    /// the inner hooks `f` calls, so that a concurrent free cannot hand the
    /// block to someone else in between).
    pub(crate) fn with_lease<T>(
        &self,
        block: BlockId,
        f: impl FnOnce(&mut Lease) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let (slot, serial) = self.locate(block)?;
        let mut shard = slot.lock();
        if let Some(lease) = shard.lease_mut(serial) {
            return f(lease);
        }
        Err(shard.missing(block))
    }

    /// Bytes users hold in the arena on every stream (each shard's count,
    /// read without its lock).
    pub(crate) fn arena_live(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.arena_live.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}
