//! [`CacheStats`]: what the cache did, summed over its stream shards.

/// Counters of a [`CachingResource`](super::CachingResource), summed over its
/// shards by [`stats`](super::CachingResource::stats). Each shard counts
/// under its own lock, so reading them costs one lock per shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Allocations served with no driver call: from the stream's own free
    /// list, or placed in the stream's arena on memory already mapped.
    pub hits: u64,
    /// Allocations served by a block cached on another stream, behind an
    /// event wait.
    pub steals: u64,
    /// Allocations served, with no driver call but events, by mapped
    /// memory another stream freed, where it lies in the shared arena
    /// (behind a wait on the GPU for that stream's fence, unless a query
    /// showed it done).
    pub borrows: u64,
    /// Waits *on the GPU* queued for memory another stream freed: a stream
    /// made to wait (`cuStreamWaitEvent`) for a fence of the stream that
    /// freed an arena range it borrows, or for the last use of a block it
    /// steals (every steal waits). Each orders all the work queued on the
    /// other stream before it ahead of the borrower's next work. None under
    /// [`CrossStreamReuse::Done`](crate::CrossStreamReuse::Done) but the
    /// last resort before out of memory.
    pub cross_stream_waits: u64,
    /// Allocations that went to the inner resource at a class size, or
    /// that mapped new memory in the arena.
    pub misses: u64,
    /// Allocations that bypassed the cache (zero bytes, a stream without a
    /// shard, too large for the size classes, or no room in the arena).
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
        self.borrows += other.borrows;
        self.cross_stream_waits += other.cross_stream_waits;
        self.misses += other.misses;
        self.bypasses += other.bypasses;
        self.evictions += other.evictions;
        self.trimmed += other.trimmed;
    }
}
