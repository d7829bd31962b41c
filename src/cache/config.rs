//! [`CacheConfig`]: the knobs of a [`CachingResource`](super::CachingResource).

/// How a [`CachingResource`](super::CachingResource) caches.
///
/// # Examples
/// ```
/// use streamalloc::CacheConfig;
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
    pub(crate) virtual_memory: bool,
    pub(crate) page_multiple: usize,
    pub(crate) max_mapping_bytes: usize,
    pub(crate) slack_percent: usize,
    pub(crate) capture_aware: bool,
    pub(crate) cross_stream: CrossStreamReuse,
    pub(crate) move_memory: bool,
}

/// When an arena range another stream freed may serve a stream
/// ([`CacheConfig::cross_stream`]).
///
/// A range freed on stream `S` serves `S` again at once (stream order puts
/// the new user after the old one). Another stream `T` may take it only
/// once ordered after the free; the two policies differ in how far they go
/// for it.
///
/// # Examples
/// ```
/// use streamalloc::{CacheConfig, CrossStreamReuse};
///
/// // A server whose streams run concurrently: never chain them for memory.
/// let config = CacheConfig::default().cross_stream(CrossStreamReuse::Done);
/// assert_eq!(config.cross_stream_reuse(), CrossStreamReuse::Done);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrossStreamReuse {
    /// The default: memory with memory behind it that the stream may use as
    /// it is comes first; when none fits, any free range serves before new
    /// memory, `T` ordered after `S`'s free with no wait where the host saw
    /// it done, else behind a wait *on the GPU* (`cuStreamWaitEvent`) for a
    /// fence recorded on `S` past the free. The least memory, and where a
    /// block goes never depends on how far the GPU is behind the host: the
    /// simulated replay of a trace holds what a GPU holds, to the page.
    /// But the wait orders everything `S` queued before the free ahead of
    /// `T`'s next work: two streams that would have run side by side run
    /// one after the other for a while.
    #[default]
    Wait,
    /// A range another stream freed serves only where no wait is needed:
    /// the host saw the GPU done with the free (a fence recorded on `S`
    /// past it was queried complete), else `T` uses its own ranges, clean
    /// ones and pages with no memory behind them, or grows the arena, as
    /// PyTorch's allocator grows a stream's pool instead of lending across
    /// streams. No stream ever waits on another for memory, except as the
    /// last resort before out of memory (a growth the device refused: a
    /// range behind a wait then serves rather than an error).
    ///
    /// Not the default, because placement then depends on the GPU's
    /// timing: whether `S`'s fence has completed when `T` asks is a race
    /// between the host and the GPU, so the same program places its blocks
    /// differently on every run and every device, and the simulator's
    /// replay of a trace no longer predicts what a GPU holds. It holds more
    /// where streams take turns with memory (up to a stream's share of the
    /// peak more, per stream), and never chains streams that run
    /// concurrently.
    Done,
}

impl Default for CacheConfig {
    /// No cap on cached bytes (memory is still given back before an
    /// out-of-memory error), 64 stream slots, the virtual-memory arena
    /// where the device has it (pages of the device's granularity, up to
    /// 1 GiB mapped per physical allocation, 7% slack over the live
    /// high-water mark), else size classes for blocks up to 64 MiB.
    fn default() -> Self {
        CacheConfig {
            max_cached_bytes: usize::MAX,
            max_block_size: 64 << 20,
            streams: 64,
            virtual_memory: true,
            page_multiple: 1,
            max_mapping_bytes: 1 << 30,
            slack_percent: 7,
            capture_aware: true,
            cross_stream: CrossStreamReuse::Wait,
            move_memory: true,
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

    /// With size classes, requests above this size bypass the cache: they
    /// are allocated from and freed to the inner resource directly, at
    /// their exact size. The arena takes requests of any size.
    pub fn max_block_size(mut self, bytes: usize) -> Self {
        self.max_block_size = bytes;
        self
    }

    /// How many streams get a cache shard: streams of index `0..streams`
    /// (at most 2^16 - 2). Blocks on streams past them bypass the cache.
    pub fn streams(mut self, streams: usize) -> Self {
        self.streams = streams;
        self
    }

    /// Whether to use the virtual-memory arena where the inner resource
    /// lends its device ([`device_access`]) and the device has virtual
    /// memory management (default true). Without it, or when it is
    /// unavailable, blocks are cached in exact size classes.
    ///
    /// [`device_access`]: crate::DeviceMemoryResource::device_access
    pub fn virtual_memory(mut self, on: bool) -> Self {
        self.virtual_memory = on;
        self
    }

    /// The arena's page, in multiples of the device's mapping granularity
    /// (default 1: 2 MiB on the H200). Memory is held and given back by
    /// whole pages.
    pub fn page_multiple(mut self, multiple: usize) -> Self {
        self.page_multiple = multiple.max(1);
        self
    }

    /// The most bytes one physical allocation covers (default 1 GiB): a
    /// block that needs more new pages than that gets several. Creating,
    /// mapping and granting access to one allocation costs about the same
    /// whatever its size (tens of µs: BENCHMARKS.md, "What the driver's
    /// virtual-memory calls cost"), so larger means
    /// fewer, cheaper growths; smaller means idle memory is given back in
    /// finer pieces (an allocation goes back only when no live block
    /// touches any of its pages).
    pub fn max_mapping_bytes(mut self, bytes: usize) -> Self {
        self.max_mapping_bytes = bytes;
        self
    }

    /// How far, in percent of the high-water mark of live bytes, the arena
    /// may hold memory (default 7): when it grows it maps ahead up to
    /// there, and before it would go past it, it gives idle memory back to
    /// make room for new memory. A growing workload grows in geometric
    /// steps of up to this fraction, each costing one growth's driver calls
    /// whatever its size. More slack means fewer driver calls, less means
    /// less memory held.
    pub fn slack_percent(mut self, percent: usize) -> Self {
        self.slack_percent = percent;
        self
    }

    /// Whether every allocation and free the cache serves asks the driver
    /// whether its stream is being captured into a CUDA graph
    /// (`cuStreamGetCaptureInfo`, default true), so that the memory of a
    /// capture stays its graph's until
    /// [`release_capture`](crate::DeviceMemoryResource::release_capture)
    /// (see the [module documentation](super#graph-capture)). On CUDA the
    /// question reaches the driver only while a capture begun through the
    /// crate is underway, or always after
    /// [`detect_foreign_captures(true)`](crate::gpu::detect_foreign_captures)
    /// (`src/gpu/capture_gate.rs`).
    ///
    /// Off, the cache makes no such call on its hot path, and memory
    /// handed out or freed during a capture is treated as any other: a
    /// block freed in a capture may then be handed to another allocation
    /// while the graph's replays still use it. Turn it off only for a
    /// program that never captures a stream the cache serves.
    pub fn capture_aware(mut self, on: bool) -> Self {
        self.capture_aware = on;
        self
    }

    /// When an arena range another stream freed may serve a stream
    /// (default [`CrossStreamReuse::Wait`]: behind a wait on the GPU when
    /// nothing else fits; [`CrossStreamReuse::Done`]: only once the host
    /// saw the GPU done with it). Size classes follow it too: under
    /// `Done` a stream takes no block cached on another stream (a steal
    /// always waits on the GPU) except when the inner resource is out of
    /// memory.
    pub fn cross_stream(mut self, reuse: CrossStreamReuse) -> Self {
        self.cross_stream = reuse;
        self
    }

    /// When an arena range another stream freed may serve a stream.
    pub fn cross_stream_reuse(&self) -> CrossStreamReuse {
        self.cross_stream
    }

    /// Whether the pages of a block that new memory would take 64 MiB or
    /// more past the slack target take the physical memory of whole idle
    /// handles in the arena's holes instead, mapped again where the block
    /// lies (default true): no new memory, a `cuMemMap` per handle moved
    /// (made under the arena's lock). Off, such a block grows, and the
    /// arena gives idle memory back only where whole mappings go idle
    /// (`trace_replay --no-move` shows the difference on a trace).
    pub fn move_memory(mut self, on: bool) -> Self {
        self.move_memory = on;
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
