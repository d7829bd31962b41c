//! [`CacheConfig`]: the knobs of a [`CachingResource`](super::CachingResource).

/// How a [`CachingResource`](super::CachingResource) caches.
///
/// # Examples
/// ```
/// use streamalloc::cache::CacheConfig;
///
/// let config = CacheConfig::default()
///     .max_cached_bytes(1 << 30)
///     .max_block_size(16 << 20)
///     .streams(8);
/// assert_eq!(config.cap(), 1 << 30);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub(crate) max_cached_bytes: usize,
    pub(crate) max_block_size: usize,
    pub(crate) streams: usize,
}

impl Default for CacheConfig {
    /// No cap on cached bytes (memory is still given back before an
    /// out-of-memory error), blocks up to 64 MiB cached, 64 stream slots.
    fn default() -> Self {
        CacheConfig {
            max_cached_bytes: usize::MAX,
            max_block_size: 64 << 20,
            streams: 64,
        }
    }
}

impl CacheConfig {
    /// The most bytes the cache keeps idle; a block freed while the cache is
    /// full goes back to the inner resource instead.
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// Requests above this size bypass the cache: they are allocated from
    /// and freed to the inner resource directly, at their exact size.
    pub fn max_block_size(mut self, bytes: usize) -> Self {
        self.max_block_size = bytes;
        self
    }

    /// How many streams get a cache shard: streams of index `0..streams`.
    /// Blocks on streams past them bypass the cache.
    pub fn streams(mut self, streams: usize) -> Self {
        self.streams = streams;
        self
    }

    /// The cap on cached bytes.
    pub fn cap(&self) -> usize {
        self.max_cached_bytes
    }

    /// The largest request that is cached.
    pub fn block_size_limit(&self) -> usize {
        self.max_block_size
    }

    /// The number of streams with a cache shard.
    pub fn stream_slots(&self) -> usize {
        self.streams
    }
}
