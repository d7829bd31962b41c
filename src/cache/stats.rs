//! [`CacheStats`]: what the cache did, summed over its stream shards.

/// Counters of a [`CachingResource`](super::CachingResource), summed over its
/// shards by [`stats`](super::CachingResource::stats). Each shard counts
/// under its own lock, so reading them costs one lock per shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Allocations served from the stream's own free list (no driver call).
    pub hits: u64,
    /// Allocations served by a block cached on another stream, behind an
    /// event wait.
    pub steals: u64,
    /// Allocations that went to the inner resource at a class size.
    pub misses: u64,
    /// Allocations that bypassed the cache (too large, zero bytes, or a
    /// stream without a shard).
    pub bypasses: u64,
    /// Blocks given back to the inner resource because the cache was full.
    pub evictions: u64,
    /// Blocks given back to the inner resource by a trim (explicit, or
    /// before reporting out-of-memory).
    pub trimmed: u64,
}

impl CacheStats {
    pub(crate) fn add(&mut self, other: &CacheStats) {
        self.hits += other.hits;
        self.steals += other.steals;
        self.misses += other.misses;
        self.bypasses += other.bypasses;
        self.evictions += other.evictions;
        self.trimmed += other.trimmed;
    }
}
