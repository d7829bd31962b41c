//! [`VirtualArena`]: the virtual-memory arena under the cache's arena tier:
//! one reserved address range that every stream places its blocks in,
//! backed by physical memory mapped where a live block needs it, and
//! given back to the device when idle.
//!
//! # Where the code is
//!
//! This file holds the types, the reservation's opening and closing, and
//! the snapshot; each step below is an `impl VirtualArena` of its own in
//! `vmm/`, with an essay of its own:
//!
//! - `shared.rs`: the state under the tier's lock ([`SharedArena`]), the
//!   streams' fences, and a range given back tagged with its free.
//! - `alloc.rs`: an allocation's way, step by step: a kept block, else a
//!   placement, moved memory past the target, new memory for the rest.
//! - `place.rs`: where a block goes, and how its stream is ordered after
//!   the frees on that range (`order_after`).
//! - `alias.rs`: memory moved from the holes to a block's pages past the
//!   target.
//! - `grow.rs`: new memory: the target, the map-ahead, the budget's gate,
//!   the last resort when the device is short.
//! - `free.rs`: frees, completed frees, undos, the blocks a stream keeps.
//! - `reclaim.rs`: idle memory given back (at a growth, a trim, the last
//!   resort).
//! - `sleep.rs`: what a sleep of the tier needs of the arena.
//!
//! The parts import the types defined here and the state in `shared.rs`;
//! of each other, only `alias.rs` imports the placement's
//! [`AsIs`](place::AsIs). Their calls to each other's methods go through
//! `VirtualArena`.
//!
//! # State
//!
//! - Shared, under the tier's lock ([`SharedArena`]): the reserved range,
//!   its [`Arena`] (which addresses are free, each free range tagged with
//!   the stream that freed it and when: [`Freed`](super::freed::Freed)), its [`PageTable`]
//!   (which pages are mapped, which mappings are idle) and, per stream,
//!   its [`Fences`] (which of its frees the GPU is done with).
//! - Per stream, in its shard ([`StreamSlot`]): the stream and the
//!   blocks it freed last (up to 8 of up to 16 MiB, [`kept`](super::kept)),
//!   kept out of the arena so that a step that frees and allocates the
//!   same sizes on one stream rarely takes the shared lock (only while
//!   its sizes repeat).
//! - Shared counters: physical bytes held (what the device gave the cache:
//!   what `bytes_outstanding` and a budget above see) and the high-water
//!   mark of live bytes.
//!
//! # Who changes it
//!
//! An allocation on stream `S` of the size of a block `S` keeps takes that
//! block back, with no lock but its shard's. Any other places the block in the
//! arena, where a range may serve `S` as it is when `S` freed it or nobody
//! did (or the host saw the GPU done with it when it was freed: a clean
//! free); a range another stream freed serves there only where no memory
//! is behind it (new memory mapped there cannot be in use). Pages it
//! touches that are mapped are used as they are, with no driver call. When
//! some are not, a free range such an allocation may use with memory
//! behind every page serves instead. Else memory another stream freed
//! serves where it is (a good fit over every free range with memory
//! behind it), ordered after the free: with no wait where the host saw
//! the work before the free done (a fence past it, or the stream with
//! nothing left to run), else behind a wait of `S` *on the GPU* for a
//! fence of that stream past the free (no host wait). Otherwise the pages
//! that are not mapped get new physical memory, one handle per run of
//! pages (so a 40 MiB block costs one `cuMemCreate`, one `cuMemMap` and
//! one `cuMemSetAccess`, not twenty of each); the growth maps the free
//! pages after the block too, ahead of the next blocks, up to `slack`
//! over the live high-water mark and never past the room a budget above
//! the cache leaves, which admits every byte a growth creates before it
//! is created (see [`growth_gate`](crate::util::growth_gate)).
//! Where new memory would take the cache past `slack` over the live
//! high-water mark by [`ALIAS_MIN_PAGES`](alias::ALIAS_MIN_PAGES) pages
//! or more, the block's pages past that target are backed, all of them or none, by whole
//! physical handles lying in free ranges that no block touches instead
//! (the stream's own and clean ones first, then other streams', ordered
//! after their frees as a placement there would be; not with
//! [`CacheConfig::move_memory`](crate::CacheConfig::move_memory) off),
//! their memory **mapped again** where the
//! block lies (`cuMemMap` of the whole handle, one call a handle, one
//! `cuMemSetAccess` a run: [`VirtualArena::alias_unbacked`]; the driver
//! maps a handle only from its start: CUDA 13.0's refused every non-zero
//! offset on an H100, and `SimGpu` refuses them too); their
//! old addresses leave the arena until every mapping of that memory is
//! idle and given back together. Else, before creating memory that
//! would take the cache past `slack` over the live high-water mark, idle
//! mappings freed before the previous growth that the GPU is done with (a
//! fence past every free on them has completed, learnt by a query) are
//! unmapped and released. A free puts the block's range back in the
//! arena, tagged with the stream and its free, and leaves pages no live
//! block touches idle but mapped.
//!
//! Free neighbours always merge, whoever freed them: the merged range
//! keeps, per stream, the newest free on it, so a range is as large as the
//! free space around it and still says whom a reuse must wait for.
//!
//! # Decisions the GPU's timing does not change
//!
//! Where a block goes, and which memory a growth gives back, are decided
//! by what the host did (the order of allocations and frees, on which
//! streams), never by how far the GPU is behind: the same program places
//! every block at the same address on every device, and the simulated
//! replay of a trace predicts the memory a GPU holds (CI bounds it there).
//! So a fence seen complete never makes a range usable "as it is" in
//! placement, and a range's tags are not dropped when fences complete;
//! fences decide only *how* a chosen range is ordered after its free (no
//! wait when the host saw the work done, a GPU-side wait otherwise), and
//! a growth gives back only mappings idle since before the previous
//! growth, whose fences (recorded then) have had the time between two
//! growths to complete (see [`VirtualArena::reclaim_at_growth`]): on a GPU
//! that kept up that far, which one replaying a trace always does (a
//! growth's own driver calls take tens of µs), the same ones as on the
//! simulated device. A GPU further behind gives back less: never memory
//! a fence the host saw complete does not cover. The policy before this
//! one took a range another stream freed "as it is" once a query showed
//! its fence complete, and gave back at a growth whatever fences showed
//! done: on two multi-stream traces the simulator said 1.22× and 1.27×
//! where an H100 held 1.47× and 1.09× (issue 33).
//!
//! # Streams that must not wait on each other ([`CrossStreamReuse::Done`])
//!
//! The wait that lends another stream's free orders everything that stream
//! queued before the free ahead of the borrower's next work. In a server
//! whose streams run concurrently (PyTorch serving four requests on four
//! streams) that chains streams the program meant to be independent:
//! PyTorch's own allocator never lends across streams, it grows a stream's
//! pool instead. Under `Done` a range another stream freed serves only
//! where the host saw the GPU done with its free (a fence past it queried
//! complete, [`is_done`](shared::is_done)), with the stream's own ranges first; otherwise
//! the stream grows. Before such a growth every other stream with frees
//! not known done records a fence past its newest free and, from then
//! on, one right after each of its frees, so that its memory serves once
//! the GPU gets past those frees. No wait is queued,
//! except as the last resort when the device refuses a growth
//! ([`VirtualArena::borrow_when_short`]).
//!
//! This gives up the property above: whether a fence has completed when a
//! stream asks is a race between host and GPU, so placement, and the
//! memory held, depend on the GPU's timing, and a simulated replay no
//! longer predicts a GPU's figure. Hence not the default.
//!
//! # Stream ordering
//!
//! - A range freed on `S` is reused at once on `S`: stream order puts the
//!   new user after the old one.
//! - On another stream `T`, a range freed on `S` is used at once, ordered
//!   after the free by one of two facts. Either the host saw the work `S`
//!   queued before the free done: a fence recorded on `S` after the free
//!   has completed (an event query), or `S` had nothing left to run
//!   (`cuStreamQuery`, asked only of a stream not capturing); then `T`
//!   needs no wait. Or `T` waits on the GPU (`cuStreamWaitEvent`) for a
//!   fence recorded on `S` after the free, once: made to wait before,
//!   outside a capture, for that fence or a later one of `S`'s, `T`
//!   needs no second wait, as stream order puts its next work after the
//!   first (noted per pair of streams; relied on only where the cache
//!   asks whether `T` captures). Never on the absence of news:
//!   a range is not taken because nothing said it was busy. Either way no
//!   work queued on `S` before the free can overlap `T`'s. `T`'s own later
//!   free of it tags it with `T`, whose stream order now includes that
//!   wait.
//! - Where the block has memory behind none of its pages, `T` is ordered
//!   after nobody's free: the tags (which spread over such pages when free
//!   neighbours merge) name the users of memory no longer there. A page
//!   loses its memory only once the host saw the GPU done with every free
//!   on it (the unmap of an idle mapping at a growth or a trim, or of a
//!   settled sleep: fences past those frees seen complete by a query, or
//!   after the host waited for the GPU as the last resort), so no queued
//!   work reaches the address. The block gets new memory (a growth), or
//!   memory moved from elsewhere, ordered after its own frees (below).
//! - The fence `T` waits for is recorded right after the free (not when
//!   `T` asks), once another stream had to wait for memory `S` freed:
//!   from then on, `S`'s next frees ([`LENDING_FREES`](shared::LENDING_FREES)) each get one. So
//!   `T` waits for the work `S` queued before the free and for none of
//!   the work `S` queued after it (a fence recorded when `T` asks would
//!   strand the range behind all of it). A stream nobody waits on records
//!   none, and a borrow records its fence when it comes (a block the
//!   stream kept out of the arena, given back later, is fenced then too).
//! - A capturing stream never waits (a wait on an outside event would
//!   invalidate the capture): it uses only ranges the GPU is known done
//!   with and pages with no memory behind them (and its graph's own
//!   temporaries, see `graph/pool.rs`). Not its own recent frees: its
//!   replays may run on another stream, which stream order does not put
//!   after them.
//! - Memory mapped again at a new address (an alias) is a reuse of the
//!   range it came from, under the same rule: the stream's own frees
//!   (stream order) and clean ranges serve as they are; another stream's
//!   once the block's stream is ordered after the free, before the block
//!   is handed out, by the two facts above (a fence past the free seen
//!   complete, or the stream idle: no wait; else a wait on the GPU for a
//!   fence recorded right after the free). Not by fences seen complete
//!   alone: *which* holes move is decided by the host's calls, never by
//!   the GPU's progress; only the number of waits changes with it. Under
//!   [`CrossStreamReuse::Done`], which never waits, only frees the host
//!   saw done serve. The old addresses are out of the arena from then on:
//!   nothing is placed there until that memory is unmapped everywhere.
//!   Where the block covers only part of a page the moved memory lands
//!   on, the rest of that page, free at the new address, takes the moved
//!   memory's free tags, so a block placed there later is ordered after
//!   the old uses too.
//! - A mapping is unmapped only once fences past the last free of every
//!   stream on its pages have completed (queried, never waited for, except
//!   as the last resort before out of memory), so no queued work can touch
//!   it. That one decision rests on the GPU's progress by necessity; a
//!   growth makes it a growth behind (see above).
//! - Uses of a block on other streams are recorded with events (the same
//!   per-stream read events and last write as the resource keeps); the
//!   free makes the block's stream wait for them before the range goes
//!   back to the arena, so its tag covers them.
//!
//! # Lock order
//!
//! A shard's lock, then the tier's. The tier's lock is not held across
//! the driver calls of a growth (`cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`: tens of µs): under it, the growth places its block,
//! touches its pages and marks those with no memory behind them, and the
//! free pages it maps ahead, **pending** ([`PageTable`]); it makes the
//! calls with the lock released, then takes it again to record the
//! mapping (or, on a failure, to give the block and its marks up). While
//! pages are pending no placement uses a range touching one (so no block
//! sees such a page unbacked and maps it again, or backed before it is),
//! no other growth maps ahead over one, and reclaim never sees one (it
//! only unmaps idle handles; a pending page has none). Other streams
//! allocate and free meanwhile, including their own growths elsewhere in
//! the arena; the growing stream's shard lock stays held, so only its own
//! stream's allocations wait for it.
//!
//! Under the tier's lock, though as frequent as the growths they replace:
//! the driver calls of an alias (a few `cuMemMap` and one
//! `cuMemSetAccess`), so that no reclaim gives back the memory being
//! mapped again meanwhile (a finer scheme would mark the handle instead).
//! Still under the tier's lock, because they are rarer than growths: the
//! reclaim a growth makes first to stay under the slack target (queries,
//! and unmapping idle memory the GPU is done with), and, when
//! `cuMemCreate` runs short of memory, the last resort that gives every
//! idle mapping back, waiting for the GPU outside a poll, before creating
//! again. A trim (`trim_idle`, `reclaim_all`) also unmaps under the lock.
//!
//! # Failure
//!
//! A failed driver call while backing a block (or a budget lending the
//! device that refuses the growth) gives the range back to the arena and
//! reports the error; its pages and those it meant to map ahead stop
//! being pending, so the next allocation may use them; memory mapped for
//! it before the failure stays as idle mappings (given back by the next
//! trim, or when memory is short). The placement is undone, not freed: no
//! block was handed out, so the range keeps the tags it had (a free of the
//! growing stream would make the next stream to take it wait for all the
//! work queued there, which never touched it).

// Unsafe here: the arena maps, unmaps and releases physical memory at raw addresses, and waits on fences.
#![allow(unsafe_code)]

use crate::observe::SegmentInfo;
use crate::util::sync::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use self::shared::{SharedArena, StreamFences};
use super::by_tag::Offered;
use super::fences::Fences;
use super::kept::{KeptBlocks, KeptNodes};
use super::pages::PageTable;
use super::placement::{Arena, Placed};
use crate::cache::config::{CacheConfig, CrossStreamReuse};
use crate::error::ResourceResult;
use crate::gpu::{Gpu, RawStream};
use crate::resource::DeviceAccess;
use crate::types::StreamId;

// The arena's parts, one concept a file (the essay's "Where the code
// is"): children, as they work on the shared state's private parts.
mod alias;
mod alloc;
mod free;
mod grow;
mod place;
mod reclaim;
mod shared;
mod sleep;

/// One stream's part of the tier; in its shard, guarded by the shard's
/// lock.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    pub(crate) raw: RawStream,
    /// The slot's index (the tag its frees carry).
    slot: usize,
    /// The blocks freed last, not yet given back to the arena: an
    /// allocation of a size one of them has takes it as it is (no
    /// placement, no shared lock). Each is this stream's only while the
    /// slot's entry of [`VirtualArena::kept`] still names it: a growth of any
    /// stream may take it (see [`kept`](super::kept)).
    kept: KeptBlocks,
}

impl StreamSlot {
    /// The blocks the stream keeps out of the arena (for snapshots).
    pub(crate) fn kept_blocks(&self) -> impl Iterator<Item = Placed> + '_ {
        self.kept.kept()
    }
}

/// What the tier shares between streams.
#[derive(Debug)]
pub(crate) struct VirtualArena {
    pub(crate) access: DeviceAccess,
    page: u64,
    arena_len: u64,
    max_run_pages: u32,
    slack_percent: usize,
    /// Whether the backend makes events: a range another stream freed is
    /// used before its fence completed only behind a wait on one.
    lends: bool,
    /// Whether a range another stream freed may serve behind a wait on the
    /// GPU, or only once the host saw the free done.
    cross_stream: CrossStreamReuse,
    /// Whether pages past the target take memory moved from the holes
    /// ([`alias_unbacked`](Self::alias_unbacked)) before they grow
    /// ([`CacheConfig::move_memory`](crate::CacheConfig::move_memory)).
    moves: bool,
    /// Whether the cache asks, at each allocation, whether its stream
    /// captures ([`CacheConfig::capture_aware`]): only then is a stream
    /// known outside a capture where the arena orders it after another's
    /// free, and a wait it already made spares another (see
    /// [`order_after`](Self::order_after)).
    sees_captures: bool,
    state: Mutex<SharedArena>,
    /// The reservation's start (0 until reserved), readable without the
    /// lock.
    base: AtomicU64,
    held: AtomicUsize,
    /// The highest sum of the streams' live bytes seen where memory was
    /// wanted (live bytes are kept per stream, so that the hot path
    /// touches no shared counter; a peak between two such moments was
    /// covered by memory held already).
    live_peak: AtomicUsize,
    /// Per slot, the arena nodes of the blocks its stream keeps (the
    /// shared half of [`kept`](super::kept)): a growth takes them all
    /// back, without the shard locks it may not take.
    kept: Box<[KeptNodes]>,
}

/// Where [`VirtualArena::alloc`] placed a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) placed: Placed,
    pub(crate) ptr: u64,
    /// Memory another stream freed, used behind its fence (a wait on the
    /// GPU when the fence had not completed).
    pub(crate) borrowed: bool,
    /// Waits on the GPU queued for it: the stream's for fences of the
    /// streams that freed the range.
    pub(crate) waits: u32,
    /// Whether the placement can be undone ([`VirtualArena::undo`]): made
    /// outside a capture, with no memory moved for it.
    pub(crate) undoable: bool,
}

impl VirtualArena {
    /// A tier over `access` for `slots` streams (slots `0..slots`), as
    /// `config` sets it up, or `None` when the device has no virtual
    /// memory management.
    pub(crate) fn new(slots: usize, access: DeviceAccess, config: &CacheConfig) -> Option<Self> {
        let granularity = access.gpu.vm_granularity().ok()?.max(1);
        let page = (granularity * config.page_multiple.max(1)) as u64;
        // Capped, so that a backend reporting no limit (a null backend)
        // does not get a page table the size of its claim.
        let total = (access.gpu.mem_info().ok()?.1 as u64).min(256 << 30);
        // Twice the device, so that scattered free ranges never run the
        // arena out of addresses before the device runs out of memory.
        let arena_len = (2 * total.max(page)).next_multiple_of(page);
        let lends = match access.gpu.event_create() {
            // SAFETY: the event was just made on this backend, and nothing
            // else has it.
            Ok(event) => unsafe { access.gpu.event_destroy(event) }.is_ok(),
            Err(_) => false,
        };
        Some(VirtualArena {
            access,
            page,
            arena_len,
            max_run_pages: (config.max_mapping_bytes as u64 / page).clamp(1, u32::MAX as u64)
                as u32,
            slack_percent: config.slack_percent,
            lends,
            cross_stream: config.cross_stream,
            moves: config.move_memory,
            sees_captures: config.capture_aware,
            state: Mutex::new(SharedArena {
                base: 0,
                arena: Arena::new(arena_len),
                pages: PageTable::new(arena_len, page),
                streams: Vec::new(),
                growing: 0,
            }),
            base: AtomicU64::new(0),
            held: AtomicUsize::new(0),
            live_peak: AtomicUsize::new(0),
            kept: (0..slots).map(|_| KeptNodes::default()).collect(),
        })
    }

    #[inline]
    fn gpu(&self) -> &dyn Gpu {
        &*self.access.gpu
    }

    fn lock(&self) -> MutexGuard<'_, SharedArena> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Physical bytes the tier holds.
    #[inline]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The page size.
    pub(crate) fn page(&self) -> usize {
        self.page as usize
    }

    /// The address of a placement.
    #[inline]
    pub(crate) fn ptr(&self, placed: Placed) -> u64 {
        self.base.load(Ordering::Acquire) + placed.off
    }

    /// Refuses `stream` when the tier's pool does not resolve it.
    pub(crate) fn check_stream(&self, stream: StreamId) -> ResourceResult<()> {
        self.access.streams.raw(stream).map(drop)
    }

    /// Opens the arena to `stream` (of slot `slot`), reserving it on the
    /// first call.
    pub(crate) fn open(&self, stream: StreamId, slot: usize) -> ResourceResult<StreamSlot> {
        debug_assert!(slot < self.kept.len(), "slot {slot} out of range");
        let raw = self.access.streams.raw(stream)?;
        let mut st = self.lock();
        if st.base == 0 {
            st.base = self
                .gpu()
                .address_reserve(self.arena_len as usize)
                .map_err(|e| e.for_request(0, stream))?;
            self.base.store(st.base, Ordering::Release);
        }
        if st.streams.len() <= slot {
            st.streams.resize_with(slot + 1, || None);
        }
        st.streams[slot].get_or_insert(StreamFences {
            raw,
            fences: Fences::default(),
            horizon: 0,
            lending: 0,
            waited_by: Vec::new(),
        });
        Ok(StreamSlot {
            raw,
            slot,
            kept: KeptBlocks::default(),
        })
    }

    /// The length of each stream's reserved range: no block is longer.
    pub(crate) fn arena_len(&self) -> u64 {
        self.arena_len
    }

    /// Whether `ptr` lies in the arena's reservation (no lock: its start is
    /// an atomic, set once).
    #[inline]
    pub(crate) fn contains(&self, ptr: u64) -> bool {
        let base = self.base.load(Ordering::Acquire);
        base != 0 && ptr >= base && ptr - base < self.arena_len
    }

    /// The arena as a snapshot's segment, under the tier's lock: its range
    /// up to the last page a block touched (the reservation's untouched
    /// tail left out), the bytes mapped, and its free ranges with the
    /// memory behind each; `kept`, the blocks the streams keep out of the
    /// arena, count as free ranges too (they are idle). `None` before any
    /// stream opened it.
    pub(crate) fn segment(&self, kept: &[Placed]) -> Option<SegmentInfo> {
        let st = self.lock();
        if st.base == 0 {
            return None;
        }
        let extent = st.pages.extent();
        let free = st.arena.free_ranges();
        // A kept block a growth took back meanwhile is free in the arena
        // already: counted once.
        let kept = kept
            .iter()
            .map(|p| (p.off, p.len))
            .filter(|&(off, _)| !free.iter().any(|&(f, l)| f <= off && off < f + l));
        let mut ranges: Vec<(u64, usize, usize)> = Vec::new();
        let mut largest = 0;
        for (off, len) in free.iter().copied().chain(kept) {
            if off >= extent {
                continue;
            }
            let len = len.min(extent - off);
            let (backed, run) = st.pages.backed_in(off, len);
            largest = largest.max(run);
            ranges.push((st.base + off, len as usize, backed as usize));
        }
        ranges.sort_by_key(|r| r.0);
        Some(SegmentInfo {
            layer: "cache",
            address: st.base,
            reserved: extent as usize,
            mapped: st.pages.physical_bytes(),
            idle: ranges.iter().map(|r| r.2).sum(),
            largest_idle: largest as usize,
            stream: None,
            expandable: true,
            free_ranges: ranges,
        })
    }

    /// Bytes of idle mappings.
    pub(crate) fn idle_bytes(&self) -> usize {
        self.lock().pages.idle_bytes()
    }

    /// Whether a block of `len` bytes (rounded; `pages` bytes in whole
    /// pages) finds memory mapped already: idle mappings of at least
    /// `pages` bytes, or a free range with memory behind a window of
    /// `len`, as [`place`](Self::place) looks for one outside a capture
    /// (on any stream's free range, the same ranges its lend looks at).
    ///
    /// Not only idle mappings: the pages a growth maps ahead of its block
    /// share the block's handle, so they are not idle while it lives, yet
    /// a block placed there maps nothing. A cost that charged them as new
    /// had a budget above the cache, which the map-ahead had taken past
    /// its limit, refuse every block that memory would serve.
    pub(crate) fn maps_nothing_for(&self, len: u64, pages: usize) -> bool {
        let st = self.lock();
        if st.pages.idle_bytes() >= pages {
            return true;
        }
        let SharedArena { arena, pages, .. } = &*st;
        arena.could_lend(len, Offered::Any, |start, end, _| {
            pages.backed_window(start, end, len)
        })
    }

    /// Gives back what no block uses any more, waiting for the GPU first,
    /// and the reservation too when nothing is live in it; returns whether
    /// the reservation went. Called once, when the cache goes, after every
    /// stream's kept blocks were given back.
    pub(crate) fn close(&self) -> bool {
        let mut st = self.lock();
        if st.base == 0 {
            return true;
        }
        // `close` runs from the cache's drop: no allocation, so no growth,
        // is in flight.
        debug_assert_eq!(st.pages.pending_pages(), 0, "a growth in flight");
        let gpu = self.gpu();
        self.reclaim_locked(&mut st, true);
        for s in st.streams.iter_mut().flatten() {
            s.fences.destroy(gpu);
        }
        if st.pages.mapped_bytes() > 0 {
            return false;
        }
        // SAFETY: (1) `st.base` and `arena_len` are exactly what `open` asked
        // of `address_reserve` and got; `close` runs once, from the cache's
        // drop (`close_mapped`), so the reservation is live and never used
        // after; (2) the page table has no mapped page left, and its handles
        // are exactly the mappings made in the arena.
        unsafe { gpu.address_free(st.base, self.arena_len as usize) }.is_ok()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The arena's shared lock under every interleaving with at most three
    //! preemptions: two streams allocate from one reserved range, free, and
    //! allocate again, each on its own thread (about 7 s in release).
    use std::sync::Arc;

    use crate::cache::CachingResource;
    use crate::device::Device;
    use crate::gpu::sim::SimGpu;
    use crate::resource::{DeviceMemoryResource, SimResource};
    use crate::types::AllocTag;

    const T: AllocTag = AllocTag("loom");

    /// Two streams' growths, frees and reuses of one arena: every live
    /// block has its own range, and everything comes back.
    #[test]
    fn two_streams_share_one_arena() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        // One allocation walks the cache's atomics many times over.
        model.max_branches = 50_000;
        model.check(|| {
            let gpu = SimGpu::builder().manual().vm_granularity(64 << 10).build();
            let device = Device::simulated(&gpu, 2);
            let cache = Arc::new(CachingResource::new(SimResource::new(&device)));
            let streams: Vec<_> = device.streams().ids().collect();
            let other = {
                let (cache, s) = (cache.clone(), streams[1]);
                loom::thread::spawn(move || {
                    let a = cache.allocate(100 << 10, s, T).unwrap();
                    let ptr = a.ptr();
                    cache.deallocate(a).unwrap();
                    let b = cache.allocate(100 << 10, s, T).unwrap();
                    (ptr, b)
                })
            };
            let mine = cache.allocate(100 << 10, streams[0], T).unwrap();
            let (_, theirs) = other.join().unwrap();
            let (m, t) = (mine.ptr(), theirs.ptr());
            assert!(
                m + (100 << 10) <= t || t + (100 << 10) <= m,
                "two live blocks overlap: {m:#x} and {t:#x}"
            );
            cache.deallocate(mine).unwrap();
            cache.deallocate(theirs).unwrap();
            gpu.run_until_idle();
            cache.reap_pending().unwrap();
            cache.release_idle().unwrap();
            gpu.run_until_idle();
            assert!(gpu.races().is_empty(), "{:?}", gpu.races());
        });
    }
}
