//! [`DeviceAllocator`]: one device's cache, its streams, its live blocks and
//! its counters.
//!
//! # State
//!
//! - the device's [open-ended](StreamPool::open_ended) stream pool, which
//!   PyTorch's streams join as they appear ([`streams`](crate::streams));
//! - the stack `RetryOnOomResource<CachingResource<StreamOrderedResource>>` on it:
//!   the cache (one virtual-memory arena for every stream) over the
//!   stream-ordered bookkeeping, and a retry that reaps completed frees
//!   before an out-of-memory error is final;
//! - the [`BlockTable`] of live blocks by address;
//! - counters: bytes PyTorch holds and their peak, the peak of bytes held
//!   from the device, the limit a memory fraction sets; and per shard of
//!   threads (a thread's calls count in a cache line of their own) calls,
//!   time spent in `alloc` and `free` (estimated from one call in eight of
//!   each thread), failures.
//!
//! # What a call costs
//!
//! PyTorch makes hundreds of thousands of calls a second on a decoder, so
//! every call's own work counts: a cached pair of the cache is about 100
//! ns. Around it a call finds its device (the thread's last one, kept in
//! the thread), looks up the stream (a scan of the streams PyTorch used),
//! keeps the block in the table (one shard's lock), and counts: one shared
//! counter (the bytes PyTorch holds, for its peak), the rest in the
//! thread's shard, so that four threads serving four streams do not pass
//! the counters' cache lines between them at every call. It reads the
//! clock only on the calls it times, and the bytes held from the device
//! only when they may have grown (see `note_reserved`; whether a block is
//! the arena's is read from its address, with no lock).
//!
//! # Who changes it
//!
//! The C functions of [`ffi`](crate::ffi), from any thread: the stack and
//! the table are thread-safe, the counters are atomics (a shard's, shared
//! by its threads past the sixteenth).
//!
//! # Failure
//!
//! Every method returns the error as a value; the C layer keeps it for
//! `streamalloc_torch_last_error`. A refused allocation changes no
//! counter but the failures; a free the resource refuses keeps its block
//! in the table (leaked, never handed out twice).
//!
//! # Bounded
//!
//! By `STREAMS` (192) streams per device: PyTorch makes at most 32 per
//! priority (four priorities in 2.x) besides the default stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use streamalloc::RetryOnOomResource;
use streamalloc::gpu::Gpu;
use streamalloc::{AllocTag, DeviceBlock, StreamId};
use streamalloc::{
    Backend, Device, DeviceMemoryResource, ResourceError, StreamOrderedResource, StreamPool,
};
use streamalloc::{CacheConfig, CachingResource, CrossStreamReuse};

use crate::blocks::BlockTable;
use crate::config::STREAMS;
use crate::context::KeepCurrentContext;
use crate::streams::TorchStream;

/// Every block PyTorch asks for carries this tag.
const TAG: AllocTag = AllocTag("torch");

type Stack = RetryOnOomResource<CachingResource<StreamOrderedResource<Backend>>>;

/// Why an allocator call failed.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The library's error.
    Resource(ResourceError),
    /// `cudaStreamPerThread`, which names no one stream.
    PerThreadStream,
    /// A size PyTorch cannot mean (negative).
    BadSize(isize),
    /// Over the limit `set_memory_fraction` set, after idle memory was
    /// given back.
    OverFraction {
        /// Bytes asked for.
        requested: usize,
        /// Bytes held from the device.
        held: usize,
        /// The limit.
        limit: usize,
    },
    /// A pointer this allocator has no live block at.
    UnknownPointer(u64),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Resource(e) => write!(f, "{e}"),
            Refusal::PerThreadStream => write!(
                f,
                "cudaStreamPerThread is another stream on every thread: not supported"
            ),
            Refusal::BadSize(size) => write!(f, "size {size} is negative"),
            Refusal::OverFraction {
                requested,
                held,
                limit,
            } => write!(
                f,
                "{requested} B more would pass the memory fraction's limit of {limit} B ({held} B held)"
            ),
            Refusal::UnknownPointer(ptr) => {
                write!(f, "{ptr:#x} is not a live allocation of this allocator")
            }
        }
    }
}

impl From<ResourceError> for Refusal {
    fn from(e: ResourceError) -> Self {
        Refusal::Resource(e)
    }
}

/// One call in `TIMED_ONE_IN` is timed, its time counted that many times.
const TIMED_ONE_IN: u64 = 8;

/// Counter shards: the calls of a thread count in one shard of their own
/// (while there are no more threads than shards), so that threads calling
/// at once do not pass cache lines back and forth.
const COUNTER_SHARDS: usize = 16;

thread_local! {
    /// The calling thread's calls so far, for choosing the timed ones, and
    /// its counter shard (`usize::MAX` until its first call).
    static THREAD: std::cell::Cell<(u64, usize)> = const { std::cell::Cell::new((0, usize::MAX)) };
}

/// The shard the next thread takes.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// Counts of the calls one shard's threads made; a cache line of its own
/// (two: adjacent lines are fetched in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct CallCounts {
    alloc_nanos: AtomicU64,
    free_nanos: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
    failures: AtomicU64,
}

/// Counters of one device, all relaxed atomics (each is read alone).
#[derive(Debug, Default)]
struct Counters {
    allocated: AtomicUsize,
    peak_allocated: AtomicUsize,
    peak_reserved: AtomicUsize,
    /// The arena's physical bytes when `peak_reserved` last read the
    /// stack's held bytes: while they are the same and no block came from
    /// below the arena, the held bytes cannot have grown.
    physical_seen: AtomicUsize,
    /// Per shard of threads: calls, their times, failures.
    calls: [CallCounts; COUNTER_SHARDS],
}

impl Counters {
    /// Whether the calling thread's call is one of the timed ones (one in
    /// `TIMED_ONE_IN`, chosen by the top bits of the thread's call number
    /// times the golden ratio, a Weyl sequence, so that no period of the
    /// program's calls, a step's allocations, lines up with the choice, as
    /// every `n`th call could), and the thread's counter shard.
    #[inline]
    fn timed(&self) -> (bool, &CallCounts) {
        let (n, shard) = THREAD.with(|t| {
            let (n, mut shard) = t.get();
            if shard == usize::MAX {
                shard = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % COUNTER_SHARDS;
            }
            t.set((n.wrapping_add(1), shard));
            (n, shard)
        });
        const SHIFT: u32 = 64 - TIMED_ONE_IN.trailing_zeros();
        let timed = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> SHIFT) == 0;
        (timed, &self.calls[shard])
    }

    /// Adds a timed call's `started.elapsed()` to `total`, for every call
    /// it stands for.
    fn add_time(total: &AtomicU64, started: Option<Instant>) {
        if let Some(started) = started {
            let nanos = started.elapsed().as_nanos() as u64;
            total.fetch_add(nanos * TIMED_ONE_IN, Ordering::Relaxed);
        }
    }

    /// The sum over the shards of `field`.
    fn sum(&self, field: impl Fn(&CallCounts) -> &AtomicU64) -> u64 {
        self.calls
            .iter()
            .map(|c| field(c).load(Ordering::Relaxed))
            .sum()
    }
}

/// Raises `peak` to `now` (a load first: the read-modify-write only when
/// it rises, which is rare).
fn raise(peak: &AtomicUsize, now: usize) {
    if now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// A snapshot of one device's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct TorchAllocStats {
    /// Bytes PyTorch holds now (the sizes it asked for).
    pub allocated_bytes: u64,
    /// The most it held since the last peak reset.
    pub peak_allocated_bytes: u64,
    /// Bytes held from the device now: mapped by the cache's arena, or
    /// allocated from the driver's pool, live or idle.
    pub reserved_bytes: u64,
    /// The most held from the device since the last peak reset, read after
    /// every allocation that may have taken memory from the device.
    pub peak_reserved_bytes: u64,
    /// Allocations served.
    pub allocs: u64,
    /// Frees taken.
    pub frees: u64,
    /// Nanoseconds spent in `alloc` calls, on the calling threads:
    /// estimated from one call in 8 of each thread (chosen throughout the
    /// run), each timed call counted 8 times: two clock reads in every
    /// call took about 300 of the 1,133 instructions this library added to
    /// a cached pair (BENCHMARKS.md, "What a call of the C functions
    /// costs").
    pub alloc_nanos: u64,
    /// Nanoseconds spent in `free` calls, estimated as `alloc_nanos`.
    pub free_nanos: u64,
    /// Calls refused (null returned, or a free refused).
    pub failures: u64,
    /// Allocations the cache served from memory it held for the stream,
    /// with no driver call (its [`hits`](streamalloc::CacheStats::hits)).
    pub cache_hits: u64,
    /// Allocations served by memory another stream freed, ordered after
    /// that free by an event or a fence: a wait on the GPU unless a query
    /// showed the free done, which may hold one of PyTorch's streams
    /// behind another (the cache's `borrows` and `steals`).
    pub cache_borrows: u64,
    /// Allocations that took new memory: mapped in the arena, or from the
    /// resource below the cache (the cache's `misses` and `bypasses`).
    pub cache_misses: u64,
    /// When another stream's free may serve a stream
    /// ([`config`](crate::config)): 1 for `done` (only once the host saw
    /// the GPU done with it), 0 for `wait` (behind a wait on the GPU).
    pub cross_stream_done: u64,
    /// Waits on the GPU queued for memory another stream freed: each holds
    /// one of PyTorch's streams behind another's work (the cache's
    /// [`cross_stream_waits`](streamalloc::CacheStats::cross_stream_waits);
    /// 0 under `done` but as the last resort before out of memory).
    pub cache_cross_stream_waits: u64,
}

/// One device's allocator.
pub(crate) struct DeviceAllocator {
    pool: Arc<StreamPool>,
    stack: Stack,
    blocks: BlockTable,
    counters: Counters,
    /// Bytes held from the device that a memory fraction allows
    /// (`usize::MAX`: none set).
    limit: AtomicUsize,
    /// The device's memory, for a fraction (0 when the driver could not say).
    total: usize,
    /// The backend, for its CUDA context (whose calls change the thread's
    /// current context).
    gpu: Arc<Backend>,
    /// The cache's policy for memory another stream freed, for the stats.
    cross_stream: CrossStreamReuse,
}

impl std::fmt::Debug for DeviceAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAllocator")
            .field("streams", &self.pool.len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl DeviceAllocator {
    /// The allocator of `gpu`'s device, with no stream yet, its cache
    /// configured by `config`.
    pub(crate) fn new(gpu: Arc<Backend>, config: CacheConfig) -> Result<Self, ResourceError> {
        let pool = StreamPool::open_ended(gpu.ordinal(), STREAMS);
        let total = gpu.mem_info().map_or(0, |(_, total)| total);
        let device = Device::new(gpu.clone(), pool.clone())?;
        let cache = CachingResource::with_config(StreamOrderedResource::new(&device), config);
        Ok(DeviceAllocator {
            pool,
            stack: RetryOnOomResource::new(cache),
            blocks: BlockTable::default(),
            counters: Counters::default(),
            limit: AtomicUsize::new(usize::MAX),
            total,
            gpu,
            cross_stream: config.cross_stream_reuse(),
        })
    }

    /// A guard that puts the thread's current CUDA context back when a
    /// call of this allocator is done (`None` on the simulator).
    pub(crate) fn keep_context(&self) -> Option<KeepCurrentContext> {
        let own = self.gpu.cuda()?.context().cu_ctx();
        Some(KeepCurrentContext::new(own))
    }

    /// The id of PyTorch's stream `stream`, registering it the first time.
    fn stream(&self, stream: usize) -> Result<StreamId, Refusal> {
        let torch = TorchStream::new(stream).ok_or(Refusal::PerThreadStream)?;
        // SAFETY: `torch` is a handle PyTorch passed to its allocator for
        // this device: a stream of the primary context this device's
        // backend was opened on, alive for the rest of the process, one
        // stream on every thread (see `crate::streams`); or, on the
        // simulated device, a handle the test gives as its simulator's.
        let raw = unsafe { torch.raw() };
        if let Some(id) = self.pool.find(raw) {
            return Ok(id);
        }
        // SAFETY: as above.
        Ok(unsafe { self.pool.register(raw) }?)
    }

    /// A block of `size` bytes for work on `stream`; its address.
    pub(crate) fn alloc(&self, size: isize, stream: usize) -> Result<u64, Refusal> {
        let (timed, calls) = self.counters.timed();
        let started = timed.then(Instant::now);
        let result = self.alloc_inner(size, stream);
        Counters::add_time(&calls.alloc_nanos, started);
        match result {
            Ok(_) => calls.allocs.fetch_add(1, Ordering::Relaxed),
            Err(_) => calls.failures.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    fn alloc_inner(&self, size: isize, stream: usize) -> Result<u64, Refusal> {
        let size = usize::try_from(size).map_err(|_| Refusal::BadSize(size))?;
        let stream = self.stream(stream)?;
        self.within_fraction(size)?;
        let block = match self.stack.allocate(size, stream, TAG) {
            Ok(block) => block,
            Err(ResourceError::OutOfMemory { .. }) => {
                // Idle memory of every stream back, then once more.
                self.stack.release_idle()?;
                self.stack.allocate(size, stream, TAG)?
            }
            Err(e) => return Err(e.into()),
        };
        let ptr = block.ptr();
        self.note_reserved(&block);
        self.blocks.insert(block);
        let c = &self.counters;
        let now = c.allocated.fetch_add(size, Ordering::Relaxed) + size;
        raise(&c.peak_allocated, now);
        Ok(ptr)
    }

    /// Raises the peak of bytes held from the device after `block` was
    /// allocated. Held bytes are the arena's physical bytes plus what the
    /// resource below the cache holds; they grow only when the arena maps
    /// memory (its physical bytes change) or a block comes from below the
    /// arena (size classes, or the arena could not place it). Otherwise
    /// the sum, a load per shard of the resource below (64 cache lines
    /// for PyTorch's streams), is not read. Whether the block is the
    /// arena's is read from its address, with no lock.
    fn note_reserved(&self, block: &DeviceBlock) {
        let cache = self.stack.inner();
        let c = &self.counters;
        let physical = cache.physical_bytes();
        if physical == c.physical_seen.load(Ordering::Relaxed) && cache.in_arena(block) {
            return;
        }
        c.physical_seen.store(physical, Ordering::Relaxed);
        raise(&c.peak_reserved, self.stack.bytes_outstanding());
    }

    /// Refuses `size` more bytes past the memory fraction's limit, after
    /// giving idle memory back.
    fn within_fraction(&self, size: usize) -> Result<(), Refusal> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == usize::MAX {
            return Ok(());
        }
        let held = self.stack.bytes_outstanding();
        if held.saturating_add(size) <= limit {
            return Ok(());
        }
        self.stack.release_idle()?;
        let held = self.stack.bytes_outstanding();
        if held.saturating_add(size) <= limit {
            return Ok(());
        }
        Err(Refusal::OverFraction {
            requested: size,
            held,
            limit,
        })
    }

    /// Frees the block at `ptr`, after the uses `record_stream` named.
    pub(crate) fn free(&self, ptr: u64) -> Result<(), Refusal> {
        let (timed, calls) = self.counters.timed();
        let started = timed.then(Instant::now);
        let result = self.free_inner(ptr);
        Counters::add_time(&calls.free_nanos, started);
        match result {
            Ok(()) => calls.frees.fetch_add(1, Ordering::Relaxed),
            Err(_) => calls.failures.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    fn free_inner(&self, ptr: u64) -> Result<(), Refusal> {
        let entry = self
            .blocks
            .remove(ptr)
            .ok_or(Refusal::UnknownPointer(ptr))?;
        // The uses are recorded now, at the free, as PyTorch's allocator
        // records its events: the free waits for everything queued on
        // those streams so far.
        for &stream in &entry.uses {
            if let Err(e) = self.stack.record_block_use(&entry.block, stream) {
                self.blocks.restore(entry);
                return Err(e.into());
            }
        }
        let size = entry.block.size();
        let block = entry.block.clone();
        match self.stack.deallocate(block) {
            Ok(()) => {
                self.counters.allocated.fetch_sub(size, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // Not freed: the block stays taken (leaked), never handed out
                // twice.
                self.blocks.restore(entry);
                Err(e.into())
            }
        }
    }

    /// Notes that the block at `ptr` is used on `stream` too.
    pub(crate) fn record_stream(&self, ptr: u64, stream: usize) -> Result<(), Refusal> {
        let stream = self.stream(stream)?;
        if self.blocks.record_use(ptr, stream) {
            Ok(())
        } else {
            Err(Refusal::UnknownPointer(ptr))
        }
    }

    /// Whether a live block of this device starts at `ptr`.
    pub(crate) fn owns(&self, ptr: u64) -> bool {
        self.blocks.contains(ptr)
    }

    /// Gives idle memory back to the device; the bytes given back.
    pub(crate) fn empty_cache(&self) -> Result<usize, Refusal> {
        Ok(self.stack.release_idle()?)
    }

    /// Limits the bytes held from the device to `fraction` of its memory
    /// (1.0 or more, or NaN: no limit).
    pub(crate) fn set_memory_fraction(&self, fraction: f64) {
        let limit = if fraction.is_nan() || fraction >= 1.0 || self.total == 0 {
            usize::MAX
        } else {
            (self.total as f64 * fraction.max(0.0)) as usize
        };
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The counters now (the cache's take one lock per stream slot).
    pub(crate) fn stats(&self) -> TorchAllocStats {
        let c = &self.counters;
        let load = |a: &AtomicUsize| a.load(Ordering::Relaxed) as u64;
        let cache = self.stack.inner().stats();
        TorchAllocStats {
            allocated_bytes: load(&c.allocated),
            peak_allocated_bytes: load(&c.peak_allocated),
            reserved_bytes: self.stack.bytes_outstanding() as u64,
            peak_reserved_bytes: load(&c.peak_reserved),
            allocs: c.sum(|c| &c.allocs),
            frees: c.sum(|c| &c.frees),
            alloc_nanos: c.sum(|c| &c.alloc_nanos),
            free_nanos: c.sum(|c| &c.free_nanos),
            failures: c.sum(|c| &c.failures),
            cache_hits: cache.hits,
            cache_borrows: cache.borrows + cache.steals,
            cache_misses: cache.misses + cache.bypasses,
            cross_stream_done: u64::from(self.cross_stream == CrossStreamReuse::Done),
            cache_cross_stream_waits: cache.cross_stream_waits,
        }
    }

    /// Starts the peaks again from what is held now, and zeroes the times.
    pub(crate) fn reset_peaks(&self) {
        let c = &self.counters;
        c.peak_allocated
            .store(c.allocated.load(Ordering::Relaxed), Ordering::Relaxed);
        c.physical_seen
            .store(self.stack.inner().physical_bytes(), Ordering::Relaxed);
        c.peak_reserved
            .store(self.stack.bytes_outstanding(), Ordering::Relaxed);
        for shard in &c.calls {
            shard.alloc_nanos.store(0, Ordering::Relaxed);
            shard.free_nanos.store(0, Ordering::Relaxed);
        }
    }
}
