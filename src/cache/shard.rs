//! One stream's shard of the cache: its free lists, the blocks leased on it,
//! and its tallies.
//!
//! A shard is only ever touched under its own mutex, and a thread that works
//! on one stream only takes that stream's mutex on the hot path, so threads
//! on different streams do not contend. The one shared counter, the cap
//! reservation, is touched only when a shard needs more of the cap than it
//! already holds (see [`CachingResource`](super::CachingResource)).

use std::collections::hash_map::{Entry, OccupiedEntry};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::arena::Placed;
use super::graph_pool::GraphPool;
use super::size_class::SizeClass;
use super::stats::CacheStats;
use super::vmm::StreamSlot;
use crate::error::ResourceError;
use crate::fast_hash::FastMap;
use crate::gpu::{CaptureId, RawEvent};
use crate::resource::block_uses::BlockUses;
use crate::types::{Access, BlockId, DeviceBlock, StreamId};

/// Low bits of a cache serial name the shard that handed the block out; the
/// high bits count within the shard, so that serials are unique without a
/// shared counter.
pub(crate) const SHARD_BITS: u32 = 20;
pub(crate) const SHARD_MASK: u64 = (1 << SHARD_BITS) - 1;

/// A range of the arena handed to a user, and its uses on other streams
/// (events the lease's stream waits on before the range is reused).
#[derive(Debug)]
pub(crate) struct Mapped {
    pub(crate) placed: Placed,
    pub(crate) ptr: u64,
    /// Its uses on other streams; boxed on the first such use, so that the
    /// lease of a block used on its own stream only stays small (it moves
    /// in and out of the shard's map on every allocation and free).
    pub(crate) uses: Option<Box<BlockUses>>,
    /// Uses on the lease's own stream finished since its last event there
    /// (the strongest access): stream order already puts them before the
    /// free and before later uses on that stream, so no event is recorded
    /// for them until a use on another stream needs one to wait on.
    pub(crate) home_unrecorded: Option<Access>,
}

impl Mapped {
    /// Events recorded for uses on other streams.
    #[inline]
    pub(crate) fn event_count(&self) -> usize {
        self.uses.as_ref().map_or(0, |u| u.event_count())
    }

    /// The uses, made on first need.
    pub(crate) fn uses_mut(&mut self) -> &mut BlockUses {
        self.uses.get_or_insert_default()
    }

    /// Every event recorded, leaving none.
    pub(crate) fn take_events(&mut self) -> Vec<(StreamId, RawEvent)> {
        self.uses.as_mut().map(|u| u.take_all()).unwrap_or_default()
    }
}

/// What is behind a lease.
#[derive(Debug)]
pub(crate) enum Backing {
    /// The inner resource's block (allocated at the class size, on the
    /// stream it was first allocated on, where it will finally be freed).
    Inner(DeviceBlock),
    /// A range of the virtual-memory arena.
    Mapped(Mapped),
}

impl Backing {
    #[inline]
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Backing::Inner(b) => b.ptr(),
            Backing::Mapped(m) => m.ptr,
        }
    }
}

/// A block handed to a user: what is behind it and what the user was told.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) backing: Backing,
    /// The stream the user got the block on.
    pub(crate) stream: StreamId,
    /// The size the user asked for.
    pub(crate) size: usize,
    /// `None` for blocks that bypass the cache or live in the arena.
    pub(crate) class: Option<SizeClass>,
    /// Whether the lease stream's position has been recorded as the block's
    /// last write in the inner resource (done before the first wait of
    /// another stream, so that it waits for this lease's work and not for a
    /// stale record of an earlier lease).
    pub(crate) home_marked: bool,
    /// Whether a use on another stream was recorded: the lease stream must
    /// then wait for it before the block is cached again.
    pub(crate) cross_used: bool,
    /// The capture the block was handed out in: its graph owns the memory
    /// (the free puts it in the capture's [`GraphPool`]) until released.
    pub(crate) capture: Option<CaptureId>,
}

/// The state of one stream's shard; guarded by the mutex of its [`Slot`].
#[derive(Debug)]
pub(crate) struct Shard {
    /// The stream whose blocks this shard caches.
    pub(crate) stream: StreamId,
    /// Whether the inner resource accepted this stream (an allocation on it
    /// succeeded): only then may blocks of other streams be moved to it,
    /// since a move queues a wait on it before the inner resource sees it.
    pub(crate) seen: bool,
    /// The stream's part of the virtual-memory tier, once it allocated
    /// there.
    pub(crate) arena: Option<StreamSlot>,
    /// Reserving the arena failed: the stream uses the size classes.
    pub(crate) arena_failed: bool,
    /// Free blocks per size class, most recently freed last (the hottest).
    free: Vec<Vec<DeviceBlock>>,
    leases: FastMap<u64, Lease>,
    index: u64,
    next_local: u64,
    /// Bytes in the free lists (class sizes).
    pub(crate) cached: usize,
    /// Bytes leased to users (requested sizes).
    pub(crate) leased: usize,
    /// The part of the global cap this shard holds; `cached <= reserved`
    /// except after a failed trim put a block back.
    pub(crate) reserved: usize,
    pub(crate) stats: CacheStats,
    /// The memory of captures' graphs on this stream (few: one per live
    /// graph that allocated or freed here).
    pub(crate) graphs: Vec<GraphPool>,
}

impl Shard {
    fn new(stream: StreamId, index: usize, classes: usize) -> Self {
        Shard {
            stream,
            seen: false,
            arena: None,
            arena_failed: false,
            free: (0..classes).map(|_| Vec::new()).collect(),
            leases: FastMap::default(),
            index: index as u64,
            next_local: 1,
            cached: 0,
            leased: 0,
            reserved: 0,
            stats: CacheStats::default(),
            graphs: Vec::new(),
        }
    }

    /// Takes the hottest free block of `class`.
    pub(crate) fn pop(&mut self, class: SizeClass) -> Option<DeviceBlock> {
        let block = self.free.get_mut(class.index())?.pop()?;
        self.cached -= block.size();
        Some(block)
    }

    /// Whether a free block of `class` is cached here.
    pub(crate) fn holds(&self, class: SizeClass) -> bool {
        self.free
            .get(class.index())
            .is_some_and(|list| !list.is_empty())
    }

    /// Puts `block` (of `class`) on its free list.
    pub(crate) fn push(&mut self, class: SizeClass, block: DeviceBlock) {
        self.cached += block.size();
        self.free[class.index()].push(block);
    }

    /// Empties every free list.
    pub(crate) fn take_all(&mut self) -> Vec<(SizeClass, DeviceBlock)> {
        let mut all = Vec::new();
        for (i, list) in self.free.iter_mut().enumerate() {
            let class = SizeClass::from_index(i);
            all.extend(list.drain(..).map(|b| (class, b)));
        }
        self.cached = 0;
        all
    }

    /// Number of blocks in the free lists.
    pub(crate) fn cached_blocks(&self) -> usize {
        self.free.iter().map(Vec::len).sum()
    }

    /// The pool of `capture`, if it has one here.
    pub(crate) fn graph_mut(&mut self, capture: CaptureId) -> Option<&mut GraphPool> {
        self.graphs.iter_mut().find(|g| g.capture == capture)
    }

    /// The pool of `capture`, made if it has none here.
    pub(crate) fn graph_entry(&mut self, capture: CaptureId) -> &mut GraphPool {
        match self.graphs.iter().position(|g| g.capture == capture) {
            Some(i) => &mut self.graphs[i],
            None => {
                self.graphs.push(GraphPool::new(capture));
                self.graphs.last_mut().expect("just pushed")
            }
        }
    }

    /// Takes the pool of `capture` out of the shard.
    pub(crate) fn remove_graph(&mut self, capture: CaptureId) -> Option<GraphPool> {
        let i = self.graphs.iter().position(|g| g.capture == capture)?;
        Some(self.graphs.swap_remove(i))
    }

    /// The leases held by users.
    pub(crate) fn leases_mut(&mut self) -> impl Iterator<Item = &mut Lease> {
        self.leases.values_mut()
    }

    /// Records a new lease and returns its serial.
    #[inline]
    pub(crate) fn lease(&mut self, lease: Lease) -> u64 {
        let serial = (self.next_local << SHARD_BITS) | self.index;
        self.next_local += 1;
        self.leased += lease.size;
        self.leases.insert(serial, lease);
        serial
    }

    /// The lease `serial`, found with one lookup: read it, then end it
    /// ([`LeaseEntry::end`]) without looking it up again (the free's hot
    /// path).
    #[inline]
    pub(crate) fn lease_entry(&mut self, serial: u64) -> Option<LeaseEntry<'_>> {
        match self.leases.entry(serial) {
            Entry::Occupied(entry) => Some(LeaseEntry {
                entry,
                leased: &mut self.leased,
                graphs: &self.graphs,
            }),
            Entry::Vacant(_) => None,
        }
    }

    #[inline]
    pub(crate) fn lease_mut(&mut self, serial: u64) -> Option<&mut Lease> {
        self.leases.get_mut(&serial)
    }

    /// Ends a lease.
    #[inline]
    pub(crate) fn end_lease(&mut self, serial: u64) -> Option<Lease> {
        self.lease_entry(serial).map(LeaseEntry::end)
    }

    pub(crate) fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// Why `block` (of this shard) has no lease: freed already, or never
    /// handed out.
    pub(crate) fn missing(&self, block: BlockId) -> ResourceError {
        let local = block.serial() >> SHARD_BITS;
        if local >= 1 && local < self.next_local {
            ResourceError::DoubleFree { block }
        } else {
            ResourceError::UnknownBlock { block }
        }
    }
}

/// A lease found by [`Shard::lease_entry`].
pub(crate) struct LeaseEntry<'a> {
    entry: OccupiedEntry<'a, u64, Lease>,
    leased: &'a mut usize,
    graphs: &'a [GraphPool],
}

impl LeaseEntry<'_> {
    /// The lease.
    #[inline]
    pub(crate) fn get(&self) -> &Lease {
        self.entry.get()
    }

    /// Whether `capture` has a pool in the shard.
    #[inline]
    pub(crate) fn has_graph(&self, capture: CaptureId) -> bool {
        self.graphs.iter().any(|g| g.capture == capture)
    }

    /// Ends the lease (as [`Shard::end_lease`]).
    #[inline]
    pub(crate) fn end(self) -> Lease {
        let lease = self.entry.remove();
        *self.leased -= lease.size;
        lease
    }
}

/// A shard and its lock, alone on their cache lines so that two streams'
/// shards never share one.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Slot {
    shard: Mutex<Shard>,
    /// Whether the free lists hold a block, readable without the lock: a
    /// thread looking for a block to move from another stream skips empty
    /// shards.
    nonempty: AtomicBool,
    /// Whether a released graph pool waits here for the stream to leave a
    /// capture; written under the shard lock, read without it.
    pub(crate) deferred: AtomicBool,
    /// Bytes users hold in the stream's arena; written under the shard
    /// lock only (a load and a store, no shared read-modify-write on the
    /// hot path), read without it when the tier sums them.
    pub(crate) arena_live: AtomicUsize,
}

impl Slot {
    pub(crate) fn new(stream: StreamId, index: usize, classes: usize) -> Self {
        Slot {
            shard: Mutex::new(Shard::new(stream, index, classes)),
            nonempty: AtomicBool::new(false),
            deferred: AtomicBool::new(false),
            arena_live: AtomicUsize::new(0),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SlotGuard<'_> {
        SlotGuard {
            guard: self.shard.lock().unwrap_or_else(|p| p.into_inner()),
            nonempty: &self.nonempty,
        }
    }

    /// The lock, if no one holds it.
    pub(crate) fn try_lock(&self) -> Option<SlotGuard<'_>> {
        let guard = match self.shard.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(SlotGuard {
            guard,
            nonempty: &self.nonempty,
        })
    }

    /// Adds `delta` bytes (negative: subtracts) to the arena's live bytes;
    /// call under the shard lock.
    #[inline]
    pub(crate) fn add_arena_live(&self, delta: isize) {
        let now = self.arena_live.load(Ordering::Relaxed);
        self.arena_live
            .store(now.wrapping_add_signed(delta), Ordering::Relaxed);
    }

    /// Whether the shard's free lists were empty when last unlocked.
    pub(crate) fn looks_empty(&self) -> bool {
        !self.nonempty.load(Ordering::Relaxed)
    }
}

/// The locked shard; publishes its block count when unlocked.
pub(crate) struct SlotGuard<'a> {
    guard: MutexGuard<'a, Shard>,
    nonempty: &'a AtomicBool,
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = Shard;
    #[inline]
    fn deref(&self) -> &Shard {
        &self.guard
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Shard {
        &mut self.guard
    }
}

impl Drop for SlotGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // A hint only (read relaxed, without the lock): a stale value costs a
        // useless try_lock or a missed move, never a wrong one.
        let nonempty = self.guard.cached > 0;
        if self.nonempty.load(Ordering::Relaxed) != nonempty {
            self.nonempty.store(nonempty, Ordering::Relaxed);
        }
    }
}
