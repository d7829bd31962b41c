//! One stream's shard of the cache: its free lists, the blocks leased on it,
//! and its tallies.
//!
//! A shard is only ever touched under its own mutex, and a thread that works
//! on one stream only takes that stream's mutex on the hot path, so threads
//! on different streams do not contend. The one shared counter, the cap
//! reservation, is touched only when a shard needs more of the cap than it
//! already holds (see [`CachingResource`](super::CachingResource)).
//!
//! A block's serial says where its lease is: the shard in the low
//! [`SHARD_BITS`] bits, and above them the key of the lease in the shard's
//! [`Slab`] (its index there, then its generation: see the slab's docs).
//! Finding a lease is a shift, one index and one compare, with no hash
//! and no shared counter; a stale serial names an older generation and
//! finds nothing.

use crate::util::sync::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::arena::placement::Placed;
use super::arena::vmm::StreamSlot;
use super::graph::pool::GraphPool;
use super::size_class::SizeClass;
use super::slab::{GENERATION_BITS, INDEX_BITS, Occupied, Slab};
use super::stats::CacheStats;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::CaptureId;
use crate::resource::block_uses::BlockUses;
use crate::types::{Access, AllocTag, BlockId, DeviceBlock, StreamId};

/// Low bits of a cache serial name the shard that handed the block out; the
/// high bits are the lease's key in the shard, so that serials are unique
/// without a shared counter. 16 bits leave 48 for the key: 2^16 - 1 shards
/// are far more than a cache makes (each holds its own free lists).
pub(crate) const SHARD_BITS: u32 = 16;
pub(crate) const SHARD_MASK: u64 = (1 << SHARD_BITS) - 1;
const _: () = assert!(SHARD_BITS + INDEX_BITS + GENERATION_BITS <= u64::BITS);

/// A range of the arena handed to a user, and its uses on other streams
/// (events the lease's stream waits on before the range is reused).
#[derive(Debug)]
pub(crate) struct Mapped {
    pub(crate) placed: Placed,
    pub(crate) ptr: u64,
    /// Its uses on other streams; boxed on the first such use, so that the
    /// lease of a block used on its own stream only stays small (it moves
    /// in and out of the shard's slab on every allocation and free).
    pub(crate) uses: Option<Box<BlockUses>>,
    /// Uses on the lease's own stream finished since its last event there
    /// (the strongest access): stream order already puts them before the
    /// free and before later uses on that stream, so no event is recorded
    /// for them until a use on another stream needs one to wait on.
    pub(crate) home_unrecorded: Option<Access>,
    /// The block's tag is asleep ([`CachingResource::sleep`]): its pages
    /// may have no memory behind them, every use is refused, and its free
    /// gives the range straight back to the arena (never kept by the
    /// stream, whose kept blocks are taken back with no check).
    ///
    /// [`CachingResource::sleep`]: crate::CachingResource::sleep
    pub(crate) asleep: bool,
    /// Uses begun ([`prepare_block_use`]) and not yet finished: work on
    /// the block may be queued, or about to be, on a stream the lease does
    /// not know yet, so a sleep of the block is refused until they end
    /// (an unmap under such work would fault the device).
    ///
    /// [`prepare_block_use`]: crate::DeviceMemoryResource::prepare_block_use
    pub(crate) uses_begun: u32,
    /// The caller's tag, for snapshots and for a sleep, which takes blocks
    /// by tag (a size-class lease's inner block carries its own).
    pub(crate) tag: AllocTag,
    /// The range was placed for this lease in the arena (not a block the
    /// stream kept, nor a graph's), with no memory moved for it: given back
    /// unused, the placement is undone
    /// ([`VirtualArena::undo`](crate::cache::arena::vmm::VirtualArena::undo)).
    pub(crate) undoable: bool,
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
}

/// What the end of an arena lease needs of it, read in the shard's slab
/// (the lease itself, over a hundred bytes, is dropped where it is rather
/// than moved out at every free).
#[derive(Debug)]
pub(crate) struct EndedMapped {
    pub(crate) placed: Placed,
    /// The size the user asked for.
    pub(crate) size: usize,
    /// The capture the block was handed out in.
    pub(crate) capture: Option<CaptureId>,
    /// Its uses on other streams, if any was ever recorded.
    pub(crate) uses: Option<Box<BlockUses>>,
    /// The block was asleep: its range goes straight back to the arena.
    pub(crate) asleep: bool,
    /// Its placement can be undone ([`Mapped::undoable`]).
    pub(crate) undoable: bool,
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
    /// The stream whose blocks this shard caches: until the inner resource
    /// (or the arena's pool) accepted an id of it, a name in no pool
    /// ([`StreamId::new`]), which nothing resolves; then that id, whose
    /// pool a request must match to be served from the shard (see
    /// [`serves`](Self::serves)).
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
    /// The blocks handed out, by serial (less the shard bits).
    leases: Slab<Lease>,
    index: u64,
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
    /// Whether a request on `stream` may take this shard's memory without
    /// asking the inner resource: only on the very id (pool included) the
    /// inner resource already accepted. Any other id (of another pool, or
    /// made by hand, with the same index) goes below, which refuses it.
    #[inline]
    pub(crate) fn serves(&self, stream: StreamId) -> bool {
        self.stream.is(stream)
    }

    /// `stream` was accepted by the inner resource (or the arena's pool)
    /// for this shard: requests on it may be served from here.
    #[inline]
    pub(crate) fn learn(&mut self, stream: StreamId) {
        self.stream = stream;
    }

    fn new(stream: StreamId, index: usize, classes: usize) -> Self {
        Shard {
            stream,
            seen: false,
            arena: None,
            arena_failed: false,
            free: (0..classes).map(|_| Vec::new()).collect(),
            leases: Slab::default(),
            index: index as u64,
            cached: 0,
            leased: 0,
            reserved: 0,
            stats: CacheStats::default(),
            graphs: Vec::new(),
        }
    }

    /// The blocks handed out (for snapshots).
    pub(crate) fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// The blocks in the free lists (for snapshots).
    pub(crate) fn free_blocks(&self) -> impl Iterator<Item = &DeviceBlock> {
        self.free.iter().flatten()
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

    /// Takes free blocks, the largest class first, until they add up to
    /// `bytes` (or none is left).
    pub(crate) fn take_largest(&mut self, bytes: usize) -> Vec<(SizeClass, DeviceBlock)> {
        let mut taken = Vec::new();
        let mut sum = 0;
        for (i, list) in self.free.iter_mut().enumerate().rev() {
            while sum < bytes
                && let Some(block) = list.pop()
            {
                sum += block.size();
                taken.push((SizeClass::from_index(i), block));
            }
        }
        self.cached -= sum;
        taken
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

    /// Records a new lease and returns its serial; `Err` (with the lease)
    /// when the shard has no serial left (see [`Shard::room`]).
    #[inline]
    pub(crate) fn lease(&mut self, lease: Lease) -> Result<u64, Lease> {
        let size = lease.size;
        let key = self.leases.insert(lease)?;
        self.leased += size;
        Ok((key << SHARD_BITS) | self.index)
    }

    /// `Ok` when [`Shard::lease`] will take a lease: 2^24 leases live at
    /// once, and some 2^48 in all (see the slab's limits), are past it.
    #[inline]
    pub(crate) fn room(&self) -> ResourceResult<()> {
        match self.leases.has_room() {
            true => Ok(()),
            false => Err(self.full()),
        }
    }

    /// What a lease refused by [`Shard::lease`] reports.
    pub(crate) fn full(&self) -> ResourceError {
        ResourceError::BlockIdsExhausted {
            stream: self.stream,
            live: self.leases.len(),
        }
    }

    /// The lease `serial`, found with one lookup: read it, then end it
    /// ([`LeaseEntry::end`]) without looking it up again (the free's hot
    /// path).
    #[inline]
    pub(crate) fn lease_entry(&mut self, serial: u64) -> Option<LeaseEntry<'_>> {
        Some(LeaseEntry {
            entry: self.leases.entry(serial >> SHARD_BITS)?,
            leased: &mut self.leased,
            graphs: &self.graphs,
        })
    }

    #[inline]
    pub(crate) fn lease_mut(&mut self, serial: u64) -> Option<&mut Lease> {
        self.leases.get_mut(serial >> SHARD_BITS)
    }

    /// Ends a lease.
    #[inline]
    pub(crate) fn end_lease(&mut self, serial: u64) -> Option<Lease> {
        self.lease_entry(serial).map(LeaseEntry::end)
    }

    /// Ends the arena lease `serial` (as [`LeaseEntry::end_arena_lease`]).
    #[inline]
    pub(crate) fn end_arena_lease(&mut self, serial: u64) -> Option<EndedMapped> {
        self.lease_entry(serial).map(LeaseEntry::end_arena_lease)
    }

    pub(crate) fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// Why `block` (of this shard) has no lease: freed already, or never
    /// handed out.
    pub(crate) fn missing(&self, block: BlockId) -> ResourceError {
        if self.leases.issued(block.serial() >> SHARD_BITS) {
            ResourceError::DoubleFree { block }
        } else {
            ResourceError::UnknownBlock { block }
        }
    }
}

/// A lease found by [`Shard::lease_entry`].
pub(crate) struct LeaseEntry<'a> {
    entry: Occupied<'a, Lease, GENERATION_BITS>,
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

    /// Ends an arena lease, returning what its end needs of it.
    ///
    /// # Panics
    /// When the lease is not of the arena (the caller matched it).
    // Always: on the free's hot path, where a call would return the ended
    // lease through memory.
    #[inline(always)]
    pub(crate) fn end_arena_lease(mut self) -> EndedMapped {
        let lease = self.entry.get_mut();
        let Backing::Mapped(m) = &mut lease.backing else {
            unreachable!("end_arena_lease is called for arena leases only");
        };
        let ended = EndedMapped {
            placed: m.placed,
            size: lease.size,
            capture: lease.capture,
            uses: m.uses.take(),
            asleep: m.asleep,
            undoable: m.undoable,
        };
        self.entry.discard();
        *self.leased -= ended.size;
        ended
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AllocTag, ResourceId};

    const SHARD: usize = 3;

    fn shard() -> Shard {
        Shard::new(StreamId::new(0, SHARD as u32), SHARD, 1)
    }

    fn lease(size: usize) -> Lease {
        let id = BlockId::new(ResourceId::fresh(), 1);
        let stream = StreamId::new(0, SHARD as u32);
        Lease {
            backing: Backing::Inner(DeviceBlock::new(id, 0x1000, size, stream, AllocTag("t"))),
            stream,
            size,
            class: None,
            home_marked: false,
            cross_used: false,
            capture: None,
        }
    }

    fn block(serial: u64) -> BlockId {
        BlockId::new(ResourceId::fresh(), serial)
    }

    #[test]
    fn a_serial_names_its_shard_and_finds_its_lease() {
        let mut s = shard();
        let a = s.lease(lease(10)).unwrap();
        let b = s.lease(lease(20)).unwrap();
        assert_eq!(
            (a & SHARD_MASK, b & SHARD_MASK),
            (SHARD as u64, SHARD as u64)
        );
        assert_eq!((s.lease_count(), s.leased), (2, 30));
        assert_eq!(s.lease_mut(b).map(|l| l.size), Some(20));
        let found = s.lease_entry(a).unwrap();
        assert_eq!(found.get().size, 10);
        assert_eq!(found.end().size, 10);
        assert_eq!((s.lease_count(), s.leased), (1, 20));
        assert!(s.room().is_ok());
    }

    #[test]
    fn a_stale_serial_is_a_double_free_even_when_its_index_is_reused() {
        let mut s = shard();
        let old = s.lease(lease(10)).unwrap();
        assert!(s.end_lease(old).is_some());
        let new = s.lease(lease(20)).unwrap();
        assert_ne!(old, new, "same index, next generation");
        assert!(s.lease_mut(old).is_none());
        assert!(s.lease_entry(old).is_none());
        assert!(s.end_lease(old).is_none(), "the new lease stays");
        assert_eq!(s.lease_mut(new).map(|l| l.size), Some(20));
        let id = block(old);
        assert_eq!(s.missing(id), ResourceError::DoubleFree { block: id });
    }

    #[test]
    fn a_serial_never_handed_out_is_unknown() {
        let mut s = shard();
        let live = s.lease(lease(10)).unwrap();
        let next_generation = live + (1 << (SHARD_BITS + INDEX_BITS));
        let next_index = live + (1 << SHARD_BITS);
        let no_generation = SHARD as u64;
        for serial in [next_generation, next_index, no_generation, u64::MAX] {
            assert!(s.lease_mut(serial).is_none(), "{serial:#x}");
            let id = block(serial);
            assert_eq!(s.missing(id), ResourceError::UnknownBlock { block: id });
        }
    }
}
