//! [`VirtualArena`]: the virtual-memory arena under the cache's arena tier:
//! one reserved address range that every stream places its blocks in,
//! backed by physical memory mapped where a live block needs it, and
//! given back to the device when idle.
//!
//! # State
//!
//! - Shared, under the tier's lock ([`SharedArena`]): the reserved range,
//!   its [`Arena`] (which addresses are free, each free range tagged with
//!   the stream that freed it and when: [`Freed`]), its [`PageTable`]
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
//! high-water mark by [`ALIAS_MIN_PAGES`] pages or more, the block's
//! pages past that target are backed, all of them or none, by whole
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
//! complete, [`is_done`]), with the stream's own ranges first; otherwise
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
//!   fence recorded on `S` after the free. Never on the absence of news:
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
//!   from then on, `S`'s next frees ([`LENDING_FREES`]) each get one. So
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
use crate::observe::history::{self, MemoryAction, MemoryEvent};
use crate::util::sync::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::by_tag::Offered;
use super::fences::Fences;
use super::freed::Freed;
use super::kept::{KeptBlocks, KeptNodes};
use super::pages::{PageTable, Released};
use super::placement::{Arena, Placed};
use crate::cache::config::CrossStreamReuse;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{Gpu, GpuError, RawStream};
use crate::resource::DeviceAccess;
use crate::types::StreamId;
use crate::util::growth_gate;

// What a sleep needs of the arena (`vmm/sleep.rs`): a child module, as
// it works on the shared state's private parts.
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

/// A stream's fences, in the shared state.
#[derive(Debug)]
struct StreamFences {
    raw: RawStream,
    fences: Fences,
    /// The stream's newest free at the previous growth: a growth gives
    /// back only memory idle since a free at or before it (see
    /// [`VirtualArena::reclaim_at_growth`]).
    horizon: u64,
    /// How many of its next frees get a fence of their own, right after
    /// them: [`LENDING_FREES`] once another stream took memory it freed.
    lending: u32,
}

/// Frees of a stream that get a fence each after another stream took
/// memory it freed. A fence recorded right after the free is what lets
/// the next borrower wait for the work queued before the free and for
/// nothing after it; a stream whose frees nobody takes (a side stream of
/// a training step, most streams of most programs) records none, and a
/// borrow then records one when it comes (later than the free, so the
/// borrower may wait for more of that stream's work than it needed).
const LENDING_FREES: u32 = 1024;

/// Pages of new memory past the target a block must need, at least,
/// before it takes memory mapped elsewhere instead (an alias, see
/// [`VirtualArena::alias_unbacked`]): 64 MiB on 2 MiB pages. Holes are
/// where the next blocks of a steady state land as they are (placement
/// prefers memory mapped already); a block that takes them by aliasing
/// makes those blocks grow instead. Measured (`notes/fragmentation-floors.md`):
/// from 8 pages the four-stream Llama trace held 1.14× (1.09× without),
/// from 16 the eight-stream churn of `trace_unseen.rs`'s seed 17 1.205×
/// (1.171×, though seed 14 went 1.168× → 1.149× and a ResNet cut 1.053×
/// → 1.015×); from 32 no trace but the sawtooth moves.
const ALIAS_MIN_PAGES: u32 = 32;

/// Pages one part of an alias maps on average, at least: an alias of `n`
/// pages makes at most `n / ALIAS_PART_PAGES` `cuMemMap` calls. Each part
/// costs a map and one more handle in its run's `cuMemSetAccess` (about
/// 4 + 25 µs on the H200, `notes/vmm-costs.md`), where a growth costs
/// about 55 µs whatever its size (and its memory a give-back later): so
/// moving memory costs at most ~2 µs per MiB, and memory in crumbs stays
/// where it is.
const ALIAS_PART_PAGES: u32 = 8;

/// The arena every stream places in; guarded by the tier's lock.
#[derive(Debug)]
pub(crate) struct SharedArena {
    /// The reservation's start; 0 until the first stream opens it.
    base: u64,
    arena: Arena,
    pages: PageTable,
    /// Per slot, once its stream opened the arena.
    streams: Vec<Option<StreamFences>>,
    /// Bytes growths in their driver calls mean to create (not in `held`
    /// yet): a growth planning its size counts them as held, so that two
    /// at once do not both fill the room under the target.
    growing: usize,
}

/// Whether the GPU is done with what `freed` names, as far as the fences
/// seen complete say.
fn is_done(streams: &[Option<StreamFences>], freed: Freed) -> bool {
    match freed.slot() {
        None => true,
        Some(s) => streams
            .get(s)
            .and_then(Option::as_ref)
            .is_some_and(|f| f.fences.done() >= freed.stamp()),
    }
}

/// Whether `freed` was made at or before its stream's horizon (the
/// previous growth) and the GPU is known done with it.
fn settled_before(streams: &[Option<StreamFences>], freed: Freed) -> bool {
    match freed.slot() {
        None => true,
        Some(s) => streams
            .get(s)
            .and_then(Option::as_ref)
            .is_some_and(|f| freed.stamp() <= f.horizon && f.fences.done() >= freed.stamp()),
    }
}

impl SharedArena {
    /// Queries every stream's fences.
    fn poll_all(&mut self, gpu: &dyn Gpu) {
        for s in self.streams.iter_mut().flatten() {
            let _ = s.fences.poll(gpu);
        }
    }

    /// Before a growth of `slot`'s stream under
    /// [`CrossStreamReuse::Done`]: every other stream with frees the host
    /// has not seen done gets a fence past its newest free (where none in
    /// flight covers it), and from then on a fence right after each of its
    /// frees, so that a later placement, querying them, finds its memory
    /// done once the GPU got there (and no later). For good, not for
    /// [`LENDING_FREES`]: with no wait to fall back on, a free without a
    /// fence serves no other stream until the next growth fences it (the
    /// simulated replay of BERT's training step, two streams, held 1.054×
    /// its live peak with 1,024 fenced frees per growth, 1.023× with all,
    /// what the default holds). A fence costs one `cuEventRecord` (0.25
    /// µs on the H200) per free that reaches the arena: 0.19 per
    /// operation on the four-stream Llama trace. One fence in flight per
    /// stream, recorded when another stream looks, cost a hundredth of
    /// that but held 1.07× on BERT once the GPU ran 16 operations behind.
    fn fence_others(&mut self, gpu: &dyn Gpu, slot: usize) {
        for (i, s) in self.streams.iter_mut().enumerate() {
            let Some(s) = s.as_mut().filter(|_| i != slot) else {
                continue;
            };
            if s.fences.done() < s.fences.stamp() {
                s.lending = u32::MAX;
                let _ = s.fences.cover(gpu, s.raw, s.fences.stamp());
            }
        }
    }

    /// Records fences past the newest free of each stream on idle handles
    /// (where none in flight covers it), so that a later look finds them
    /// done.
    fn cover_idle(&mut self, gpu: &dyn Gpu) {
        for tag in self.pages.idle_tags() {
            if let Some(s) = tag
                .slot()
                .and_then(|i| self.streams.get_mut(i))
                .and_then(Option::as_mut)
            {
                let _ = s.fences.cover(gpu, s.raw, tag.stamp());
            }
        }
    }

    /// The range goes back to the arena tagged `freed`; pages it leaves
    /// untouched go idle with that tag ([`Freed::CLEAN`]: no queued work
    /// touches it, free to unmap at once).
    ///
    /// The range's tags are kept whatever the fences say (see "Decisions
    /// the GPU's timing does not change" in the module's essay): only the
    /// stream's pages learn from fences, for giving memory back.
    fn release_tagged(&mut self, placed: Placed, freed: Freed) {
        self.pages.untouch(placed.off, placed.len, freed);
        self.arena.free(placed, Some(freed), |_| false);
    }

    /// The range goes back to the arena tagged with a new free of `slot`;
    /// pages it leaves untouched go idle. With `fence` (the tier's backend;
    /// given where the free is made now, on the caller's stream), while
    /// other streams take what this one frees ([`LENDING_FREES`]), a fence
    /// is recorded on the stream right after the free, so that another
    /// stream that takes the range waits for the work queued before the
    /// free and for nothing queued after it. Without (a block the stream
    /// kept, given back by a growth on another thread), a borrow records
    /// one later.
    fn release(&mut self, fence: Option<&dyn Gpu>, slot: usize, placed: Placed) {
        let Some(Some(s)) = self.streams.get_mut(slot) else {
            unreachable!("a stream places in the arena only once it opened it");
        };
        let stamp = s.fences.next_stamp();
        if let (Some(gpu), true) = (fence, s.lending > 0) {
            s.lending -= 1;
            // A failed record leaves the free uncovered: a later borrow
            // covers it then (`order_after`), later than it could have.
            let _ = s.fences.cover(gpu, s.raw, stamp);
        }
        self.release_tagged(placed, Freed::by(slot, stamp));
    }
}

/// Runs of pages, `(first, count)`, in order.
type Runs = Vec<(u32, u32)>;

/// Splits runs of pages into those before the last `pages` pages and
/// those last pages, each in order.
fn split_last(runs: Runs, pages: u32) -> (Runs, Runs) {
    let (mut front, mut back) = (Vec::new(), Vec::new());
    let mut left = pages;
    for (first, n) in runs.into_iter().rev() {
        let take = n.min(left);
        if take > 0 {
            back.push((first + n - take, take));
        }
        if take < n {
            front.push((first, n - take));
        }
        left -= take;
    }
    front.reverse();
    back.reverse();
    (front, back)
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

/// What [`VirtualArena::alias_unbacked`] did.
#[derive(Debug)]
struct Moved {
    /// The runs of pages still without memory (for a growth).
    unbacked: Vec<(u32, u32)>,
    /// Whether memory another stream freed was moved.
    lent: bool,
    /// Waits on the GPU queued for that memory.
    waits: u32,
}

impl Moved {
    /// Nothing moved, no wait queued.
    fn none(unbacked: Vec<(u32, u32)>) -> Self {
        Self {
            unbacked,
            lent: false,
            waits: 0,
        }
    }
}

/// Which free ranges a stream may use as they are, with no wait.
#[derive(Debug, Clone, Copy)]
struct AsIs {
    /// The slot whose frees stream order puts before the stream's next
    /// work: the stream's own (`None` in a capture, whose replays may run
    /// on any stream).
    own: Option<usize>,
    /// Whether frees the GPU is known done with serve too (fences queried
    /// complete): in a capture, and under [`CrossStreamReuse::Done`].
    done: bool,
}

impl VirtualArena {
    /// A tier over `access` for `slots` streams (slots `0..slots`), or
    /// `None` when the device has no virtual memory management.
    pub(crate) fn new(
        slots: usize,
        access: DeviceAccess,
        page_multiple: usize,
        max_run_bytes: usize,
        slack_percent: usize,
        cross_stream: CrossStreamReuse,
        moves: bool,
    ) -> Option<Self> {
        let granularity = access.gpu.vm_granularity().ok()?.max(1);
        let page = (granularity * page_multiple.max(1)) as u64;
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
            max_run_pages: (max_run_bytes as u64 / page).clamp(1, u32::MAX as u64) as u32,
            slack_percent,
            lends,
            cross_stream,
            moves,
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
        });
        Ok(StreamSlot {
            raw,
            slot,
            kept: KeptBlocks::default(),
        })
    }

    /// Takes back a block of `len` bytes (already rounded) that `ss`'s
    /// stream keeps, for `requested` bytes: the first step of every
    /// allocation, with no lock but the shard's (it counts the allocation
    /// in the stream's history, so it is made once per allocation, and
    /// [`alloc`](Self::alloc) follows when it finds nothing). Returns the
    /// block and its address.
    // Always: on the allocation's hot path, and a call costs as much as
    // this body when it finds a block.
    #[inline(always)]
    /// Whether `ss`'s stream kept a block of exactly `len` bytes (a look:
    /// nothing is taken).
    pub(crate) fn keeps_len(&self, ss: &StreamSlot, len: u64) -> bool {
        ss.kept.holds(len)
    }

    pub(crate) fn take_kept(
        &self,
        ss: &mut StreamSlot,
        len: u64,
        requested: usize,
    ) -> Option<(Placed, u64)> {
        let kept = ss.kept.take(len, &self.kept[ss.slot])?;
        let ptr = self.ptr(kept);
        self.gpu().note_suballocation(ptr, requested.max(1), ss.raw);
        Some((kept, ptr))
    }

    /// Places and backs `len` bytes (already rounded) on `ss`'s stream,
    /// after [`take_kept`](Self::take_kept) found nothing. `None` when the
    /// arena has no room (the caller falls back).
    ///
    /// `capturing`: the stream is in a capture. Else it may wait on the GPU
    /// for another stream's fence, to use memory that stream freed, and
    /// reuse its own frees as they are (stream order puts its next work
    /// after them). A capture does neither: a wait on an outside event
    /// would invalidate it, and its replays may run on any stream, after
    /// nothing this stream queued before: it takes only ranges no queued
    /// work can touch (frees the GPU is known done with, or none).
    /// `live_total` sums the bytes users hold on every stream, for the
    /// slack target.
    pub(crate) fn alloc(
        &self,
        ss: &mut StreamSlot,
        len: u64,
        requested: usize,
        stream: StreamId,
        live_total: &dyn Fn() -> usize,
        capturing: bool,
    ) -> ResourceResult<Option<Taken>> {
        let mut st = self.lock();
        if !ss.kept.keeps() {
            // The stream's sizes stopped repeating: what it keeps goes
            // back, for this block and the next to be placed around less.
            self.release_kept_locked(&mut st, ss);
        }
        let Some((placed, mut borrowed, mut waits)) = self.place(&mut st, ss, len, capturing)
        else {
            return Ok(None);
        };
        let mut undoable = !capturing;
        let unbacked = st.pages.touch(placed.off, placed.len);
        if !unbacked.is_empty() {
            let live = live_total();
            // The block's pages with no memory behind them are this
            // growth's from now on: no other block is placed on them and no
            // other growth maps them while the lock is released for the
            // driver calls.
            for &(first, count) in &unbacked {
                st.pages.pend(first, count);
            }
            // Past the target, memory no block uses elsewhere serves,
            // mapped again here (not in a capture: its replays may run on
            // streams stream order does not cover).
            let unbacked = match capturing || !self.moves {
                true => unbacked,
                false => {
                    let pages = |runs: &[(u32, u32)]| runs.iter().map(|r| r.1).sum::<u32>();
                    let wanted = pages(&unbacked);
                    let moved = self.alias_unbacked(&mut st, ss, placed, unbacked, live);
                    borrowed |= moved.lent;
                    waits += moved.waits;
                    // Memory moved here leaves its old addresses for good:
                    // that cannot be undone.
                    undoable &= pages(&moved.unbacked) == wanted;
                    moved.unbacked
                }
            };
            for &(first, count) in &unbacked {
                let mut at = first;
                while at < first + count {
                    let n = (first + count - at).min(self.max_run_pages);
                    let grown;
                    (st, grown) = self.back(st, at, n, live, stream);
                    if let Err(e) = grown {
                        let SharedArena { arena, pages, .. } = &mut *st;
                        // The placement is undone: nothing used the range
                        // (no block was handed out), so it keeps the tags
                        // it had, and its mapped pages theirs. Tagging it
                        // as a free of this stream would make the next
                        // stream to take it wait on the GPU for all the
                        // work queued here, though none of it touched the
                        // range: under a full budget every refused growth
                        // did, and chained the streams (BENCHMARKS.md,
                        // "Under a budget"). Clears what is still pending
                        // of the block (the runs not mapped yet) with the
                        // counts.
                        pages.untouch_failed(placed.off, placed.len, Freed::CLEAN);
                        arena.free(placed, None, |_| false);
                        return match self.borrow_when_short(&mut st, ss, len, capturing, &e) {
                            Some(taken) => {
                                self.gpu()
                                    .note_suballocation(taken.ptr, requested.max(1), ss.raw);
                                Ok(Some(taken))
                            }
                            None => Err(e),
                        };
                    }
                    at += n;
                }
            }
            self.live_peak.fetch_max(live, Ordering::AcqRel);
        }
        let ptr = st.base + placed.off;
        self.gpu().note_suballocation(ptr, requested.max(1), ss.raw);
        Ok(Some(Taken {
            placed,
            ptr,
            borrowed,
            waits,
            undoable,
        }))
    }

    /// Backs the last pages of a block's runs with no memory (`runs`,
    /// pending: the block's), those new memory would take the tier past
    /// its target (counting `live`), by memory mapped elsewhere that no
    /// block uses, mapped again here; returns the runs, or the parts of
    /// them, still without memory (for a growth: up to the target, and
    /// what could not be moved).
    ///
    /// Memory held at the target while memory no block touches would
    /// cover the block is memory in the wrong places, not too little:
    /// moving it keeps the tier at its target where a growth would pass
    /// it. Up to the target a growth serves: a workload still growing
    /// needs the memory anyway, and its holes are where its next blocks
    /// land as they are (on a ResNet training cut, moving the whole block
    /// of 16 pages or more whenever new memory would pass the target held
    /// 1.070× where growing held 1.053×; `notes/fragmentation-floors.md`).
    ///
    /// The memory is whole physical handles, each mapped once and lying
    /// whole in a free range (so no live or kept block touches it; the
    /// driver maps a handle only from offset 0), in free ranges the stream
    /// may use as they are: its own frees (stream order puts the block's
    /// work after every use before them) and clean ranges (no queued work
    /// touches them), and under [`CrossStreamReuse::Done`] another
    /// stream's frees a fence seen complete covers (the host saw the GPU
    /// done with them), as that mode's placement uses them; the longest
    /// handle that fits what is left of a run first, and every page past
    /// the target covered or nothing moved (a block part moved and part
    /// grown pays for both). Then other streams' frees (by default, not
    /// under `Done`), the block's stream ordered after each first by
    /// [`order_after`](Self::order_after) (no wait where the host saw the
    /// work before the free done, else a wait on the GPU for a fence right
    /// after the free). The memory is the same, only its address changes,
    /// so this is the same ordering as any reuse of those ranges; which
    /// pieces move depends on the host's calls only, never on whether a
    /// fence has completed. (With parts of handles, which the driver
    /// refuses, taking other streams' holes whole blocks at a time held
    /// 1.26× on the eight-stream churn, and every page past the target
    /// 1.07×: `notes/fragmentation-floors.md`.) Nothing is done when
    /// fewer than [`ALIAS_MIN_PAGES`] pages are past the target, or the
    /// memory would come in parts of fewer than [`ALIAS_PART_PAGES`] pages
    /// on average.
    ///
    /// The old pages go dead ([`PageTable::kill`]): their range leaves the
    /// arena (held as a placement) and their mapping stays until all of
    /// its handle's mappings are idle and given back together
    /// (`cuMemUnmap` cannot unmap part of a mapping, and the driver
    /// releases memory only once its last mapping is unmapped). Held
    /// memory does not change: the handle counts once.
    ///
    /// Costs one `cuMemMap` a part and one `cuMemSetAccess` a run, made
    /// with the tier's lock held (as reclaim does): they replace a growth
    /// (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), or a give-back and a
    /// growth where a growth behind had idle memory to give.
    fn alias_unbacked(
        &self,
        st: &mut SharedArena,
        ss: &StreamSlot,
        placed: Placed,
        runs: Vec<(u32, u32)>,
        live: usize,
    ) -> Moved {
        let page = self.page as usize;
        let wanted: usize = runs.iter().map(|r| r.1 as usize).sum();
        // New memory serves up to the target; only the pages past it are
        // moved memory (the block's last ones): below the target memory is
        // short in sum (a workload still growing), and the holes are where
        // its next blocks land as they are.
        let over = (self.held() + st.growing + wanted * page)
            .saturating_sub(self.target(live))
            .div_ceil(page)
            .min(wanted) as u32;
        if over < ALIAS_MIN_PAGES || st.pages.free_mapped_pages() < over as usize {
            return Moved::none(runs);
        }
        self.move_memory(st, ss, placed, runs, over)
    }

    /// The part of [`alias_unbacked`](Self::alias_unbacked) that moves
    /// memory: backs the last `need` pages of `runs` with whole handles of
    /// free ranges, mapped again here, or none of them; returns the runs,
    /// or the parts of them, still without memory.
    fn move_memory(
        &self,
        st: &mut SharedArena,
        ss: &StreamSlot,
        placed: Placed,
        runs: Vec<(u32, u32)>,
        need: u32,
    ) -> Moved {
        let page = self.page as usize;
        let whole = runs.clone();
        let (mut grown, runs) = split_last(runs, need);
        // The ranges this stream's placement may use as they are: its own
        // frees and clean ones; under `CrossStreamReuse::Done`, frees the
        // host saw the GPU done with too.
        let as_is = AsIs {
            own: Some(ss.slot),
            done: self.cross_stream == CrossStreamReuse::Done,
        };
        // Other streams' frees serve too, ordered after the free (see
        // below), where the backend makes events to wait on and waits are
        // allowed (not under `CrossStreamReuse::Done`, which never waits).
        let lend = self.lends && self.cross_stream == CrossStreamReuse::Wait;
        // Pieces of memory to move: (node, first page, pages, whether
        // another stream freed it), those usable as they are first, then
        // the longest first.
        let mut pieces: Vec<(u32, u32, u32, bool)> = Vec::new();
        {
            let SharedArena {
                arena,
                pages,
                streams,
                ..
            } = &*st;
            for (node, off, len) in arena.free_nodes_of_at_least(self.page, pages.extent()) {
                let lent = !Self::usable_now(streams, as_is, arena.free_tags(node));
                if !lent || lend {
                    pieces.extend(
                        pages
                            .alias_runs(off, off + len)
                            .into_iter()
                            .map(|(first, count)| (node, first, count, lent)),
                    );
                }
            }
        }
        pieces.sort_unstable_by_key(|&(_, first, count, lent)| {
            (lent, std::cmp::Reverse(count), first)
        });
        let max_parts = (need / ALIAS_PART_PAGES) as usize;
        // The plan: per run, its parts (at, piece, first source page,
        // pages), each a whole piece (a handle maps only whole), the
        // longest that fits what is left of the run first. All or
        // nothing: a block part moved and part grown pays for both, maps
        // and a growth.
        let mut plan: Vec<(u32, usize, u32, u32)> = Vec::new();
        let mut used = vec![false; pieces.len()];
        for &(first, n) in &runs {
            let mut at = first;
            let end = first + n;
            while at < end {
                let fit = (plan.len() < max_parts)
                    .then(|| (0..pieces.len()).find(|&k| !used[k] && pieces[k].2 <= end - at))
                    .flatten();
                let Some(k) = fit else {
                    return Moved::none(whole);
                };
                used[k] = true;
                plan.push((at, k, pieces[k].1, pieces[k].2));
                at += pieces[k].2;
            }
        }
        // Another stream's holes: the block's stream is ordered after
        // their frees before any of it moves, as a placement on them would
        // be (`order_after`: at once where the host saw the work before
        // the free done, else behind a wait on the GPU for a fence past
        // it). Which holes move does not depend on that, only how.
        let mut lent_nodes: Vec<u32> = plan
            .iter()
            .filter(|p| pieces[p.1].3)
            .map(|p| pieces[p.1].0)
            .collect();
        lent_nodes.sort_unstable();
        lent_nodes.dedup();
        let mut waits = 0;
        for &node in &lent_nodes {
            let SharedArena { arena, streams, .. } = &mut *st;
            match self.order_after(streams, ss, arena.free_tags(node)) {
                Some(w) => waits += w,
                // No fence to order after (an event that could not be
                // recorded): the block grows instead; the waits queued
                // stay (they only order the stream further).
                None => {
                    return Moved {
                        unbacked: whole,
                        lent: false,
                        waits,
                    };
                }
            }
        }
        // The old addresses leave the arena, from the highest down so that
        // each free range's node keeps naming the part before.
        let mut order: Vec<usize> = (0..plan.len()).collect();
        order.sort_unstable_by_key(|&i| std::cmp::Reverse(plan[i].2));
        let mut sources = vec![None; plan.len()];
        // The frees the moved memory's old uses end with (the newest of
        // each stream), for the free parts of the block's end pages.
        let mut moved_tags: Vec<Freed> = Vec::new();
        for i in order {
            let (_, p, src, take) = plan[i];
            let node = pieces[p].0;
            for &t in st.arena.free_tags(node) {
                match moved_tags.iter_mut().find(|u| u.slot() == t.slot()) {
                    Some(u) => *u = u.join(t).unwrap_or(t),
                    None => moved_tags.push(t),
                }
            }
            let taken = st.arena.take(
                node,
                u64::from(src) * self.page,
                u64::from(take) * self.page,
            );
            sources[i] = Some(st.pages.kill(src, take, taken.node));
        }
        let gpu = self.gpu();
        let mut left = Vec::new();
        let mut next = 0;
        for &(first, n) in &runs {
            let parts: Vec<usize> = (next..plan.len())
                .take_while(|&i| plan[i].0 < first + n)
                .collect();
            next += parts.len();
            let mut mapped = 0;
            for &i in &parts {
                let (at, _, _, take) = plan[i];
                let source = sources[i].expect("killed above");
                // SAFETY: (1) pages `at..at + take` lie in the live
                // reservation (the arena is inside it), aligned to the
                // granularity (a page is a multiple of it), and so is the
                // offset; (2) they are pending, this block's: nothing is
                // mapped there (pages with memory are never pending); (3)
                // the handle is live (the page table holds it: its memory
                // is given back only once every mapping is idle, and the
                // source pages are mapped) and the part lies inside it
                // (pages of one mapping of it); (4) the block's stream is
                // ordered after every free on the source pages (its own or
                // clean, or `order_after` above), and the source addresses
                // left the arena (dead), so no block uses them again.
                let ok = unsafe {
                    gpu.mem_map_part(
                        st.base + u64::from(at) * self.page,
                        take as usize * page,
                        source.raw,
                        source.offset as usize * page,
                    )
                }
                .is_ok();
                if !ok {
                    break;
                }
                mapped += 1;
            }
            let addr = st.base + u64::from(first) * self.page;
            let span: u32 = parts[..mapped].iter().map(|&i| plan[i].3).sum();
            // SAFETY: (1) the parts mapped just above tile pages
            // `first..first + span` of the live reservation.
            let access =
                mapped > 0 && unsafe { gpu.mem_set_access(addr, span as usize * page) }.is_ok();
            for (k, &i) in parts.iter().enumerate() {
                let (at, _, src, take) = plan[i];
                let source = sources[i].expect("killed above");
                if access && k < mapped {
                    st.pages.alias(at, take, source);
                    self.tag_end_pages(st, placed, at, take, &moved_tags);
                    continue;
                }
                if k < mapped {
                    // SAFETY: (1) exactly the mapping made above, in the
                    // live reservation; (2) idle: its pages are pending, no
                    // block was handed out over them; (3) nothing records
                    // it.
                    let _ = unsafe {
                        gpu.mem_unmap(st.base + u64::from(at) * self.page, take as usize * page)
                    };
                }
                let node = st.pages.revive(source, src);
                let placed = st.arena.placed(node);
                // Back with the tags it had: nothing used it meanwhile.
                st.arena.free(placed, None, |_| false);
                left.push((at, take));
            }
        }
        grown.extend(left);
        Moved {
            unbacked: grown,
            lent: !lent_nodes.is_empty(),
            waits,
        }
    }

    /// Where moved memory lands on pages `at..at + take` and the block
    /// `placed` covers only part of its first or last page, the rest of
    /// that page is free, at the block's side: that free range gets the
    /// tags of the moved memory's frees (`tags`), so that a block placed
    /// there later is ordered after its old uses as the block was (else a
    /// range clean or freed by another stream at the new address would
    /// hand it out with no ordering: the simulated device reported such
    /// races on eight streams). The whole range gets them, a little more
    /// ordering than the page needs.
    fn tag_end_pages(
        &self,
        st: &mut SharedArena,
        placed: Placed,
        at: u32,
        take: u32,
        tags: &[Freed],
    ) {
        let (start, end) = (u64::from(at) * self.page, u64::from(at + take) * self.page);
        let head = start < placed.off;
        let tail = end > placed.off + placed.len;
        for (partial, after) in [(head, false), (tail, true)] {
            if !partial {
                continue;
            }
            match st.arena.free_neighbour(placed, after) {
                Some(node) => st.arena.add_tags(node, tags),
                // Nothing else lies on a page with no memory behind it
                // but free space and the block.
                None => debug_assert!(false, "the rest of an end page is not free"),
            }
        }
    }

    /// Under [`CrossStreamReuse::Done`], after a growth failed for lack of
    /// memory (`e`): a range with memory behind it that another stream
    /// freed serves, behind a wait on the GPU where the free may still
    /// run, rather than an error (the last resort, as giving idle memory
    /// back is). `None` under `Wait` (its placement looked there first), in
    /// a capture, or when no such range fits.
    fn borrow_when_short(
        &self,
        st: &mut SharedArena,
        ss: &StreamSlot,
        len: u64,
        capturing: bool,
        e: &crate::error::ResourceError,
    ) -> Option<Taken> {
        if capturing
            || !self.lends
            || self.cross_stream != CrossStreamReuse::Done
            || !e.is_lack_of_memory()
        {
            return None;
        }
        let own = AsIs {
            own: Some(ss.slot),
            done: true,
        };
        let placed = Self::backed_fit(st, own, len, true)?;
        let SharedArena { arena, streams, .. } = &mut *st;
        let Some(waits) = self.order_after(streams, ss, arena.freed(placed)) else {
            arena.free(placed, None, |_| false);
            return None;
        };
        st.pages.touch(placed.off, placed.len);
        let borrowed = Self::borrowed(st, ss.slot, placed);
        Some(Taken {
            placed,
            ptr: st.base + placed.off,
            borrowed,
            waits,
            undoable: true,
        })
    }

    /// Whether memory another stream freed serves `placed`: a range
    /// another stream freed, with memory behind some of it (pages with none
    /// are new memory, whoever freed the addresses).
    fn borrowed(st: &SharedArena, slot: usize, placed: Placed) -> bool {
        st.arena
            .freed(placed)
            .iter()
            .any(|f| f.slot() != Some(slot))
            && st.pages.backed_in(placed.off, placed.len).0 > 0
    }

    /// Where the block goes: a good fit, preferring memory already mapped
    /// (a larger free range with memory behind it before new memory; the
    /// blocks other streams freed last and ranges merged once fences
    /// completed before a growth), and among mapped memory, ranges the
    /// stream may use as they are. Outside a capture, when nothing fits so,
    /// any free range serves before new memory, the stream waiting on the
    /// GPU for the fence of another stream's free where it may still run
    /// (not where the block has memory behind none of its pages: see
    /// "Stream ordering");
    /// under [`CrossStreamReuse::Done`], only ranges whose frees the host
    /// saw done serve so (see [`place_when_done`](Self::place_when_done)).
    /// Returns the placement, whether memory another stream freed serves
    /// it, and the waits on the GPU queued for it.
    fn place(
        &self,
        st: &mut SharedArena,
        ss: &mut StreamSlot,
        len: u64,
        capturing: bool,
    ) -> Option<(Placed, bool, u32)> {
        let slot = ss.slot;
        if !capturing && self.cross_stream == CrossStreamReuse::Done {
            let placed = self.place_when_done(st, ss, len)?;
            return Some((placed, Self::borrowed(st, slot, placed), 0));
        }
        let any = !capturing && self.lends;
        // Whose frees count as the stream's own, usable as they are: none
        // in a capture (see `alloc`), which takes frees the GPU is known
        // done with instead.
        let own = AsIs {
            own: (!capturing).then_some(slot),
            done: capturing,
        };
        // Memory with memory behind it that this stream may use as it is
        // comes first. A wait on another stream's fence orders all the
        // work queued there before it ahead of this stream's next work:
        // independent requests on two streams run one after the other.
        // Taking such memory first (the best fit over every free range)
        // serializes independent requests to save a few percent of memory,
        // a bad trade under load (`docs/DESIGN.md`, "Caching tier", has
        // the service's figures).
        // The stream's kept blocks go back to the arena before it waits on
        // another stream: one of them, merged with its free neighbours,
        // may serve as it is.
        let now = match any {
            true => Self::backed_now(st, own, len).or_else(|| {
                (self.release_kept_locked(st, ss) > 0)
                    .then(|| Self::backed_now(st, own, len))
                    .flatten()
            }),
            false => None,
        };
        let (placed, waits) = match now {
            Some(placed) => (placed, 0),
            None => {
                let placed = self.choose(st, own, len, any)?;
                let SharedArena {
                    arena,
                    streams,
                    pages,
                    ..
                } = &mut *st;
                // A block with memory behind none of its pages is ordered
                // after nobody's free ("Stream ordering"): the tags name
                // users of memory no longer there. A page loses its memory
                // only once the host saw the GPU done with every free on
                // it (`take_idle` takes only handles whose tags a fence
                // seen complete covers; a sleep's `release_asleep` unmaps
                // likewise), and pages whose memory moved away stay out of
                // the arena until then too, so no queued work reaches
                // these addresses. What backs them next is new memory (a
                // growth) or memory moved here, which `move_memory` orders
                // the stream after the frees of. Waiting for the tags here
                // (they spread to such pages when free neighbours merge)
                // only chained the streams. Pending pages are not offered
                // (`fit`), so "not mapped" means no memory at all.
                let reaches_memory = pages.backed_in(placed.off, placed.len).0 > 0;
                match any && reaches_memory {
                    false => (placed, 0),
                    true => match self.order_after(streams, ss, arena.freed(placed)) {
                        Some(waits) => (placed, waits),
                        None => {
                            st.arena.free(placed, None, |_| false);
                            (self.choose(st, own, len, false)?, 0)
                        }
                    },
                }
            }
        };
        Some((placed, Self::borrowed(st, slot, placed), waits))
    }

    /// [`place`](Self::place) under [`CrossStreamReuse::Done`], outside a
    /// capture: the stream's own ranges with memory behind them first (no
    /// driver call), then, its fences queried, also ranges whose frees the
    /// host saw done, then its kept blocks given back to the arena, then
    /// any such range or pages with no memory behind them (a growth). No
    /// wait is ever queued. Before a growth, every other stream with frees
    /// not known done gets a fence past its newest free (and each of its
    /// next frees one right after it), so that its memory serves here
    /// once the GPU gets past them.
    fn place_when_done(
        &self,
        st: &mut SharedArena,
        ss: &mut StreamSlot,
        len: u64,
    ) -> Option<Placed> {
        let slot = ss.slot;
        let mine = AsIs {
            own: Some(slot),
            done: false,
        };
        if let Some(placed) = Self::backed_now(st, mine, len) {
            return Some(placed);
        }
        let gpu = self.gpu();
        st.poll_all(gpu);
        let seen = AsIs {
            own: Some(slot),
            done: true,
        };
        let now = Self::backed_now(st, seen, len).or_else(|| {
            (self.release_kept_locked(st, ss) > 0)
                .then(|| Self::backed_now(st, seen, len))
                .flatten()
        });
        if let Some(placed) = now {
            return Some(placed);
        }
        let placed = self.choose(st, seen, len, false)?;
        if self.lends && !st.pages.all_backed(placed.off, placed.len) {
            st.fence_others(gpu, slot);
        }
        Some(placed)
    }

    /// A good fit on memory mapped already that a stream may use as it is
    /// (as `own` says), if there is one.
    fn backed_now(st: &mut SharedArena, own: AsIs, len: u64) -> Option<Placed> {
        // Only ranges usable as they are: a window with no memory in
        // another's would not be backed (and looking for one walks pages).
        let placed = Self::fit(st, own, len, false, false)?;
        if st.pages.all_backed(placed.off, placed.len) {
            return Some(placed);
        }
        st.arena.free(placed, None, |_| false);
        Self::backed_fit(st, own, len, false)
    }

    /// A good fit (see [`place`](Self::place)); `any`: on any free range,
    /// else only where the stream may use it as it is.
    fn choose(&self, st: &mut SharedArena, own: AsIs, len: u64, any: bool) -> Option<Placed> {
        let placed = Self::fit(st, own, len, any, true)?;
        if st.pages.all_backed(placed.off, placed.len) {
            return Some(placed);
        }
        if let Some(backed) = Self::backed_fit(st, own, len, any) {
            st.arena.free(placed, None, |_| false);
            return Some(backed);
        }
        // The block would grow the arena. The blocks other streams freed
        // last go back to it (they may hold it, or merge into a range that
        // does), and fences may have completed since.
        let mut flushed = false;
        for (i, kept) in self.kept.iter().enumerate() {
            for node in kept.take_all() {
                let placed = st.arena.placed(node);
                st.release(None, i, placed);
                flushed = true;
            }
        }
        if !flushed {
            return Some(placed);
        }
        st.arena.free(placed, None, |_| false);
        let placed = Self::fit(st, own, len, any, true)?;
        if st.pages.all_backed(placed.off, placed.len) {
            return Some(placed);
        }
        match Self::backed_fit(st, own, len, any) {
            Some(backed) => {
                st.arena.free(placed, None, |_| false);
                Some(backed)
            }
            None => Some(placed),
        }
    }

    /// Orders the stream of `ss` after the frees `freed` names that may
    /// still be running: at once where a fence past one has completed (or
    /// completes at a query right after it is recorded), else behind a
    /// wait on the GPU for that fence. Returns the waits queued; `None`
    /// when that cannot be done (the waits queued before stay: they only
    /// order the stream further).
    fn order_after(
        &self,
        streams: &mut [Option<StreamFences>],
        ss: &StreamSlot,
        freed: &[Freed],
    ) -> Option<u32> {
        let gpu = self.gpu();
        let mut waits = 0;
        let ordered = freed.iter().all(|&f| {
            if f.slot().is_none_or(|s| s == ss.slot) {
                return true;
            }
            let home = f
                .slot()
                .and_then(|i| streams.get_mut(i))
                .and_then(Option::as_mut);
            home.is_some_and(|h| {
                if h.fences.done() >= f.stamp() {
                    return true;
                }
                // A stream with nothing left to run has run its frees:
                // the host sees it, no wait is needed. Not asked of a
                // capturing stream (the query would invalidate its
                // capture).
                // SAFETY: `h.raw` is a stream of the tier's device pool,
                // which the tier holds.
                let idle = unsafe { gpu.capture_status(h.raw) }.is_ok_and(|c| !c.is_capturing())
                    && unsafe { gpu.stream_query(h.raw) }.unwrap_or(false);
                if idle {
                    h.fences.settle();
                    return true;
                }
                // Another stream waits for what this one frees: its next
                // frees get a fence each (see `SharedArena::release`).
                h.lending = h.lending.max(LENDING_FREES);
                // A fence over the free, queried at once: a stream with
                // nothing queued has run past it already.
                let _ = h.fences.cover(gpu, h.raw, f.stamp());
                let done = h.fences.poll(gpu).unwrap_or(h.fences.done());
                if done >= f.stamp() {
                    return true;
                }
                let waited = h.fences.covering(f.stamp()).is_some_and(|e| {
                    // SAFETY: `ss.raw` is a stream of the tier's device pool
                    // (the slot's), the event a live fence of the tier's
                    // backend (destroyed only when the tier closes).
                    unsafe { gpu.stream_wait_event(ss.raw, e) }.is_ok()
                });
                waits += u32::from(waited);
                waited
            })
        });
        ordered.then_some(waits)
    }

    /// Whether a stream may use a range with tags `freed` as it is: clean
    /// (no tag), or only the frees of `own.own` (its slot), which stream
    /// order puts before its next work. By default a fence seen complete
    /// does not make a range usable here (see "Decisions the GPU's timing
    /// does not change"): it only spares the wait once the range is
    /// chosen. In a capture (`own.own` is `None`), which may not wait, and
    /// under [`CrossStreamReuse::Done`] (`own.done`), frees the GPU is
    /// known done with are usable too.
    fn usable_now(streams: &[Option<StreamFences>], own: AsIs, freed: &[Freed]) -> bool {
        freed.iter().all(|&f| {
            own.own.is_some_and(|o| f.slot() == Some(o)) || (own.done && is_done(streams, f))
        })
    }

    /// The free ranges a search may skip without asking about them: where
    /// only ranges a stream may use as they are serve (not `any`, and
    /// none other serves elsewhere), outside a capture and unless frees
    /// the GPU is known done with serve too, those its own slot's index
    /// names ([`Offered::CleanOr`], the test of
    /// [`usable_now`](Self::usable_now) then).
    fn offered(own: AsIs, any: bool, elsewhere: bool) -> Offered {
        match own.own {
            Some(slot) if !own.done && !any && !elsewhere => Offered::CleanOr(slot),
            _ => Offered::Any,
        }
    }

    /// A good fit a stream may use now: where its tag allows (see
    /// [`usable_now`](Self::usable_now); every range with `any`), at the
    /// end with memory behind it if only one end has; elsewhere, with
    /// `unbacked_elsewhere`, on pages with no memory. Never on a page a
    /// growth is mapping (pending).
    fn fit(
        st: &mut SharedArena,
        own: AsIs,
        len: u64,
        any: bool,
        unbacked_elsewhere: bool,
    ) -> Option<Placed> {
        let SharedArena {
            arena,
            pages,
            streams,
            ..
        } = st;
        let offered = Self::offered(own, any, unbacked_elsewhere);
        arena.alloc(len, offered, |start, end, freed| {
            if any || Self::usable_now(streams, own, freed) {
                let at_end = end - start > len && !pages.backed(start) && pages.backed(end - 1);
                let at = if at_end { end - len } else { start };
                // Never on a page a growth is mapping (it would be seen
                // unbacked, and mapped twice, or backed before it is).
                match pages.settled(at, len) {
                    true => Some(at),
                    false => pages.settled_window(start, end, len),
                }
            } else if unbacked_elsewhere {
                // Pending pages are not free of memory: skipped too.
                pages.unbacked_window(start, end, len)
            } else {
                None
            }
        })
    }

    /// A free range a stream may use now (as [`fit`](Self::fit) judges
    /// `own`) with memory behind every page the block needs (so on no
    /// pending page: those have none yet).
    fn backed_fit(st: &mut SharedArena, own: AsIs, len: u64, any: bool) -> Option<Placed> {
        let SharedArena {
            arena,
            pages,
            streams,
            ..
        } = st;
        arena.lend(len, Self::offered(own, any, false), |start, end, freed| {
            (any || Self::usable_now(streams, own, freed))
                .then(|| pages.backed_window(start, end, len))
                .flatten()
        })
    }

    /// Gives back the block at `placed`, freed at the current end of the
    /// stream (after the waits for its uses elsewhere were queued).
    // Always: on the free's hot path, and a call costs as much as this
    // body when the block is kept.
    #[inline(always)]
    pub(crate) fn free(&self, ss: &mut StreamSlot, placed: Placed) {
        self.gpu().note_subfree(self.ptr(placed), ss.raw);
        if let Some(pushed) = ss.kept.keep(placed, &self.kept[ss.slot]) {
            self.release_range(ss, pushed);
        }
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

    /// Gives back the block at `placed`, which the GPU is done with (every
    /// use of it completed, as the host saw): kept as any free while the
    /// stream's sizes repeat, else back to the arena clean, where every
    /// stream may take it as it is (no fence, no wait on this stream's
    /// queued work).
    pub(crate) fn free_completed(&self, ss: &mut StreamSlot, placed: Placed) {
        self.gpu().note_subfree_completed(self.ptr(placed), ss.raw);
        match ss.kept.keep(placed, &self.kept[ss.slot]) {
            None => {}
            Some(given) if given == placed => self.lock().release_tagged(placed, Freed::CLEAN),
            // An older block pushed out: freed when it was, as any free.
            Some(pushed) => self.release_range(ss, pushed),
        }
    }

    /// Undoes the placement `placed` of `ss`'s stream ([`alloc`](Self::alloc),
    /// outside a capture, no memory moved for it): no work was ever queued
    /// on the block ([`NeverUsed`](crate::NeverUsed)), so the range goes
    /// back to the arena with the tags it had when it was placed (its node
    /// kept them), merging with its free neighbours as any free, and its
    /// pages go back to what they were: their handles keep their tags (a
    /// placement adds none), memory mapped for the block is idle and clean
    /// (no work ever touched it). Not kept by the stream, not tagged as its
    /// free: the next stream to take the range is ordered after the frees
    /// it was ordered after before, not after all the work queued on this
    /// stream since (which never touched it).
    ///
    /// What the placement queued on the stream stays: a wait on the GPU
    /// for another stream's fence cannot be taken back (it only orders the
    /// stream further), and the range keeps that stream's tag, so the next
    /// user is ordered after that free too.
    pub(crate) fn undo(&self, ss: &StreamSlot, placed: Placed) {
        self.gpu()
            .note_suballocation_undone(self.ptr(placed), ss.raw);
        let mut st = self.lock();
        let SharedArena { arena, pages, .. } = &mut *st;
        pages.untouch(placed.off, placed.len, Freed::CLEAN);
        arena.free(placed, None, |_| false);
    }

    /// Releases `placed` to the arena, freed at the current end of the
    /// slot's stream (out of line: most frees keep their block); also a
    /// range a graph's pool kept, once the graph is gone (its free was
    /// noted already).
    pub(crate) fn release_range(&self, ss: &StreamSlot, placed: Placed) {
        self.lock().release(Some(self.gpu()), ss.slot, placed);
    }

    /// Tells a checking backend that the range at `placed`, taken out of a
    /// graph's pool, holds a new allocation of `requested` bytes on the
    /// slot's stream (as [`alloc`](Self::alloc) does for a placement).
    pub(crate) fn note_reuse(&self, ss: &StreamSlot, placed: Placed, requested: usize) {
        self.gpu()
            .note_suballocation(self.ptr(placed), requested.max(1), ss.raw);
    }

    /// Tells a checking backend that the block at `placed` is freed at the
    /// current end of the slot's stream, without giving the range back (a
    /// graph's pool keeps it).
    pub(crate) fn note_free(&self, ss: &StreamSlot, placed: Placed) {
        self.gpu().note_subfree(self.ptr(placed), ss.raw);
    }

    /// Gives the stream's kept blocks back to the arena (under its lock,
    /// `st`); returns how many.
    fn release_kept_locked(&self, st: &mut SharedArena, ss: &mut StreamSlot) -> usize {
        let mut given = 0;
        for placed in ss.kept.drain(&self.kept[ss.slot]) {
            st.release(Some(self.gpu()), ss.slot, placed);
            given += 1;
        }
        given
    }

    /// Gives the stream's kept blocks back to the arena.
    pub(crate) fn release_kept(&self, ss: &mut StreamSlot) {
        self.release_kept_locked(&mut self.lock(), ss);
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

    /// The most the tier means to hold: `slack` over the live high-water
    /// mark (counting `live`, the live bytes with the block being backed),
    /// and never less than one page.
    fn target(&self, live: usize) -> usize {
        let peak = self.live_peak.load(Ordering::Acquire).max(live);
        (peak + peak / 100 * self.slack_percent).max(self.page as usize)
    }

    /// Maps new memory over pages `first..first + n` of the arena, which
    /// are pending (this growth's), and over free pages after them (map
    /// ahead). The driver calls run with the lock released; `st` is given
    /// back held again, with the result. Pages mapped are recorded, the
    /// rest marked pending here stop being pending; pages
    /// `first..first + n` stay pending on an error (the caller gives the
    /// block up, which clears them).
    fn back<'a>(
        &'a self,
        mut st: MutexGuard<'a, SharedArena>,
        first: u32,
        n: u32,
        live: usize,
        stream: StreamId,
    ) -> (MutexGuard<'a, SharedArena>, ResourceResult<()>) {
        let page = self.page as usize;
        let need = n as usize * page;
        // What other growths are creating counts as held already.
        let growing = st.growing;
        // Under the lock: rarer than a growth (see "Lock order").
        self.reclaim_at_growth(&mut st, |tier| {
            tier.held() + growing + need <= tier.target(live)
        });
        // Map ahead, up to the target: the free pages right after the block,
        // where the next block placed at the end of the arena lands. A
        // growth costs the same driver calls whatever its size
        // (BENCHMARKS.md, "What the driver's virtual-memory calls cost"),
        // so a workload that keeps growing grows in geometric steps of up
        // to `slack` of what is live: about
        // ln(peak / start) / ln(1 + slack) growths in all, instead of one
        // per block. The target bounds what this adds to the peak held:
        // `slack` over the live high-water mark, which the memory held at
        // any time already may reach. A budget above the cache bounds it
        // too: it counts the pages ahead, which share the block's handle
        // and cannot be given back while the block lives, so past its
        // limit they would stay counted there (`util::growth_gate`, which
        // then admits them in `charge_growth`).
        let room = self
            .target(live)
            .saturating_sub(self.held() + growing + need)
            .min(growth_gate::room().saturating_sub(need))
            / page;
        let ahead_max =
            (room.min(u32::MAX as usize) as u32).min(self.max_run_pages.saturating_sub(n));
        // Stops at pages with memory, a block, or another growth's mark.
        let mut ahead = st.pages.free_unbacked_from(first + n, ahead_max);
        st.pages.pend(first + n, ahead);
        let planned = need + ahead as usize * page;
        st.growing += planned;
        let base = st.base;
        drop(st);

        // Unlocked from here: pages `first..first + n + ahead` are pending,
        // so no other thread places a block on them, maps them, or takes
        // them for another growth's map-ahead.
        let gpu = self.gpu();
        // The layers lending the device (a budget below the cache) count
        // the memory before it exists: `charge` is what they count now,
        // given back below if nothing is mapped in the end.
        let mut charge = 0;
        let created = match self.charge_growth(planned, need, first + n, &mut ahead) {
            Err(refused) => Err(refused),
            Ok(charged) => {
                charge = charged;
                match gpu.mem_create(charged) {
                    Ok(h) => Ok(Some((h, n + ahead))),
                    // Short of memory: what the block needs, nothing ahead.
                    Err(GpuError::OutOfMemory { .. }) if charged > need => {
                        self.uncharge(charged - need);
                        charge = need;
                        match gpu.mem_create(need) {
                            Ok(h) => Ok(Some((h, n))),
                            Err(GpuError::OutOfMemory { .. }) => Ok(None),
                            Err(e) => Err(e.for_request(need, stream)),
                        }
                    }
                    Err(GpuError::OutOfMemory { .. }) => Ok(None),
                    Err(e) => Err(e.for_request(need, stream)),
                }
            }
        };
        let created = match created {
            Ok(Some(made)) => Ok(made),
            // The last resort gives idle memory back (and may wait for the
            // GPU): under the lock, as in "Lock order". The pages ahead go
            // first; nothing is mapped ahead now.
            Ok(None) => {
                let mut st = self.lock();
                st.pages.unpend(first + n, ahead);
                ahead = 0;
                let made = self.create_when_short(&mut st, need, stream);
                made.map(|h| (h, n))
            }
            Err(e) => Err(e),
        };
        let mapped = created.and_then(|(handle, pages)| {
            let bytes = pages as usize * page;
            let addr = base + u64::from(first) * self.page;
            // SAFETY: (1) `base..base + arena_len` is a live reservation:
            // `open` got it from `address_reserve` of this tier's backend
            // and only `close`, when the cache is dropped (so with no
            // allocation in flight), frees it; pages are granularity-sized
            // (`page` is a multiple of `vm_granularity`) and `first + pages`
            // stays inside the arena's page table, so the range is aligned
            // and inside it. (2) nothing is mapped there and nothing else
            // maps there meanwhile: pages `first..first + pages` were marked
            // pending under the lock by this growth (`pend`), over pages
            // `touch` found with no handle, extended only over pages
            // `free_unbacked_from` found with no handle, no block and no
            // mark; a pending page is in no window placement offers, no
            // `touch` or `free_unbacked_from` of another growth returns it,
            // it has no handle for `take_idle` to unmap, and only this
            // growth clears its mark; the table's handles are exactly the
            // live mappings (`map` records each, `take_idle` drops one
            // before it is unmapped). (3) `handle` was created just above,
            // of exactly `bytes` (the pages chosen with it), and not
            // released.
            let mapped = unsafe { gpu.mem_map(addr, bytes, handle) }.and_then(|()| {
                // SAFETY: (1) the range lies in the live reservation (as
                // above) and is exactly the mapping just made.
                let access = unsafe { gpu.mem_set_access(addr, bytes) };
                if access.is_err() {
                    // SAFETY: (1) exactly the mapping just made, in the live
                    // reservation; (2) idle: its pages are pending, so no
                    // block was handed out over them and no work was queued
                    // on them; (3) nothing records it.
                    let _ = unsafe { gpu.mem_unmap(addr, bytes) };
                }
                access
            });
            match mapped {
                Ok(()) => Ok((handle, pages)),
                Err(e) => {
                    // SAFETY: (1) `handle` was created above and not
                    // released; (2) it is dropped here, never mapped again
                    // (the page table never saw it).
                    let _ = unsafe { gpu.mem_release(handle) };
                    Err(e.for_request(bytes, stream))
                }
            }
        });

        if mapped.is_err() {
            // Nothing was mapped: the memory charged for it never was, or
            // was released above.
            self.uncharge(charge);
        }
        let mut st = self.lock();
        st.growing -= planned;
        let result = mapped.map(|(handle, pages)| {
            st.pages.map(first, pages, handle);
            self.held.fetch_add(pages as usize * page, Ordering::AcqRel);
            history::record(|| {
                MemoryEvent::new(MemoryAction::SegmentMap, self.access.gpu.ordinal())
                    .on(stream)
                    .at(base + u64::from(first) * self.page, pages as usize * page)
            });
        });
        // The pages ahead that were not mapped (all of them on an error, or
        // when only the block's pages could be created) are free again;
        // the block's own stay pending on an error, for the caller.
        st.pages.unpend(first + n, ahead);
        (st, result)
    }

    /// Charges the layers lending the device (a budget below the cache)
    /// and the gates of the budgets above it (`util::growth_gate`) for a
    /// growth of `planned` bytes, and returns the bytes charged.
    /// When they refuse that, the pages ahead (`*ahead` of them from
    /// `ahead_at`) stop being pending and only `need` is asked for; when
    /// they refuse that too, idle mappings are given back (the budget gets
    /// their bytes) and it is asked again, once more after waiting for the
    /// GPU's fences outside a poll, as for the device's own out of memory.
    /// Called with the tier's lock released: a budget's refusal first asks
    /// the other resources under it for idle memory.
    ///
    /// # Errors
    /// The last refusal (a budget's
    /// [`BudgetExceeded`](crate::ResourceError::BudgetExceeded)); nothing
    /// is charged then.
    fn charge_growth(
        &self,
        planned: usize,
        need: usize,
        ahead_at: u32,
        ahead: &mut u32,
    ) -> ResourceResult<usize> {
        if self.charge(planned).is_ok() {
            return Ok(planned);
        }
        if *ahead > 0 {
            self.lock().pages.unpend(ahead_at, *ahead);
            *ahead = 0;
        }
        let mut refused = match self.charge(need) {
            Ok(()) => return Ok(need),
            Err(e) => e,
        };
        // Waiting parks the thread: never inside a poll of the crate's
        // futures (their allocation waits are woken by the release).
        let waits: &[bool] = if crate::util::poll_scope::in_poll() {
            &[false]
        } else {
            &[false, true]
        };
        for &wait in waits {
            if self.reclaim_all(wait) == 0 {
                continue;
            }
            match self.charge(need) {
                Ok(()) => return Ok(need),
                Err(e) => refused = e,
            }
        }
        Err(refused)
    }

    /// Charges `bytes` of new memory to the layers lending the device,
    /// then has the budgets above the cache admit them; nothing stays
    /// charged on a refusal.
    ///
    /// # Errors
    /// The first refusal, as
    /// [`BudgetExceeded`](crate::ResourceError::BudgetExceeded).
    fn charge(&self, bytes: usize) -> ResourceResult<()> {
        self.access.try_charge(bytes)?;
        growth_gate::try_take(bytes).map_err(|refused| {
            self.access.release_charge(bytes);
            ResourceError::BudgetExceeded {
                requested: refused.requested,
                limit: refused.limit,
                in_use: refused.in_use,
            }
        })
    }

    /// Gives back what [`charge`](Self::charge) took for memory never
    /// created.
    fn uncharge(&self, bytes: usize) {
        self.access.release_charge(bytes);
        growth_gate::give_back(bytes);
    }

    /// `mem_create` failed for lack of memory: gives back every idle
    /// mapping the GPU is done with, then (the last resort, and never
    /// inside a poll) waits for the fences in flight and gives back the
    /// rest, retrying after each.
    fn create_when_short(
        &self,
        st: &mut SharedArena,
        bytes: usize,
        stream: StreamId,
    ) -> ResourceResult<crate::gpu::RawPhysical> {
        let gpu = self.gpu();
        let mut last = GpuError::OutOfMemory { available: 0 };
        // Waiting parks the thread: never inside a poll of the crate's
        // futures (their allocation waits are woken by frees instead).
        let waits: &[bool] = if crate::util::poll_scope::in_poll() {
            &[false]
        } else {
            &[false, true]
        };
        for &wait in waits {
            let released = self.reclaim_locked(st, wait);
            tracing::debug!(
                released,
                bytes,
                wait,
                "out of memory: gave idle mappings back"
            );
            match gpu.mem_create(bytes) {
                Ok(h) => return Ok(h),
                Err(e @ GpuError::OutOfMemory { .. }) => last = e,
                Err(e) => return Err(e.for_request(bytes, stream)),
            }
        }
        Err(last.for_request(bytes, stream))
    }

    /// Gives back idle mappings the GPU is done with until `enough` holds.
    /// Fences are recorded where idle mappings are not covered yet, so
    /// that a later call finds them; true once `enough` holds.
    fn reclaim(&self, st: &mut SharedArena, enough: impl Fn(&Self) -> bool) -> bool {
        if st.pages.idle_bytes() == 0 {
            return enough(self);
        }
        let gpu = self.gpu();
        st.poll_all(gpu);
        while !enough(self) {
            let SharedArena { pages, streams, .. } = &mut *st;
            let Some(h) = pages.take_idle(|f| is_done(streams, f)) else {
                break;
            };
            self.give_back(st, h);
        }
        if !enough(self) {
            // Ask for fences over what stays idle, for the next time.
            st.cover_idle(gpu);
        }
        enough(self)
    }

    /// What a growth gives back first, to stay under the slack target
    /// (until `enough` holds): idle mappings whose every free was made at
    /// or before the *previous* growth (each stream's `horizon`) and is
    /// covered by a fence the host has seen complete. Then it records
    /// fences over what is idle now and moves the horizons to now, for the
    /// next growth.
    ///
    /// Why a growth behind: whether a fence recorded a moment ago has
    /// completed depends on how far the GPU is behind the host, which the
    /// same program meets differently on every device and every run. A
    /// fence recorded at the previous growth has had the time between two
    /// growths (thousands of operations on a model trace) to complete: a
    /// GPU that keeps up that far gives back exactly the same mappings, so
    /// the memory held, and the placements that follow, do not depend on
    /// its timing (the simulated replay predicts the GPU's figure). A GPU
    /// further behind gives back less (never anything its fences do not
    /// cover).
    fn reclaim_at_growth(&self, st: &mut SharedArena, enough: impl Fn(&Self) -> bool) {
        let gpu = self.gpu();
        if !enough(self) && st.pages.idle_bytes() > 0 {
            st.poll_all(gpu);
            while !enough(self) {
                let SharedArena { pages, streams, .. } = &mut *st;
                let Some(h) = pages.take_idle(|f| settled_before(streams, f)) else {
                    break;
                };
                self.give_back(st, h);
            }
        }
        if st.pages.idle_bytes() > 0 {
            st.cover_idle(gpu);
        }
        for s in st.streams.iter_mut().flatten() {
            s.horizon = s.fences.stamp();
        }
    }

    /// Unmaps every mapping of idle physical memory the GPU is done with,
    /// and releases it.
    fn give_back(&self, st: &mut SharedArena, r: Released) {
        let gpu = self.gpu();
        let mut mapped = vec![true; r.maps.len()];
        for (h, still) in r.maps.iter().zip(mapped.iter_mut()) {
            let addr = st.base + u64::from(h.first) * self.page;
            let bytes = h.pages as usize * self.page as usize;
            // SAFETY: (1) the page table's handle `h` is one whole mapping
            // of pages `h.first..h.first + h.pages` of the reservation,
            // which is live until `close`; (2) idle: `take_idle` returned
            // its memory only because no live block touches a page of any
            // mapping of it and every tag of each (the frees on its pages,
            // the dead ones' too: they were freed there before their memory
            // moved) is covered by a fence that has completed; (3)
            // `take_idle` took it out of the table, so no block is placed
            // on these pages until they are mapped again (dead pages are
            // the arena's again only after this).
            match unsafe { gpu.mem_unmap(addr, bytes) } {
                Ok(()) => *still = false,
                Err(e) => tracing::warn!(error = %e, "unmapping an idle mapping failed; kept"),
            }
        }
        if mapped.iter().any(|&m| m) {
            // The memory stays held, behind the mappings left.
            for d in st.pages.restore(r, &mapped) {
                let placed = st.arena.placed(d.node);
                st.arena.free(placed, Some(Freed::CLEAN), |_| false);
            }
            return;
        }
        // SAFETY: (1) `r.raw` came from `mem_create` and the page table held
        // it until `take_idle` gave it up here, so it is live and released
        // exactly once; (2) every mapping of it was unmapped just above and
        // it is not restored, so it is never mapped again.
        if let Err(e) = unsafe { gpu.mem_release(r.raw) } {
            tracing::warn!(error = %e, "releasing physical memory failed; leaked");
        }
        let bytes = r.pages as usize * self.page as usize;
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        // After the release: a lending budget never counts as free memory
        // the device still holds.
        self.access.release_charge(bytes);
        // The dead pages' addresses have no memory behind them now: any
        // stream may place there (new memory, no queued work on it).
        for d in &r.dead {
            let placed = st.arena.placed(d.node);
            st.arena.free(placed, Some(Freed::CLEAN), |_| false);
        }
        let addr = st.base + u64::from(r.maps[0].first) * self.page;
        history::record(|| {
            MemoryEvent::new(MemoryAction::SegmentUnmap, gpu.ordinal()).at(addr, bytes)
        });
    }

    /// Gives back every idle mapping the GPU is done with (waiting for the
    /// fences in flight first when `wait`); returns the bytes given back.
    fn reclaim_locked(&self, st: &mut SharedArena, wait: bool) -> usize {
        let before = self.held();
        if st.pages.idle_bytes() > 0 {
            let gpu = self.gpu();
            st.cover_idle(gpu);
            if wait {
                for s in st.streams.iter_mut().flatten() {
                    let _ = s.fences.wait_all(gpu);
                }
            }
            self.reclaim(st, |_| false);
        }
        before.saturating_sub(self.held())
    }

    /// Gives back every idle mapping the GPU is done with (waiting for the
    /// fences in flight first when `wait`; fences are recorded over the
    /// others, so that a later call finds them); returns the bytes given
    /// back. The streams' kept blocks are not in it: give them back first.
    pub(crate) fn reclaim_all(&self, wait: bool) -> usize {
        self.reclaim_locked(&mut self.lock(), wait)
    }

    /// Gives back the idle mappings the GPU is done with, and records
    /// fences over the others (the cache's cap was passed).
    pub(crate) fn trim_idle(&self) {
        self.reclaim(&mut self.lock(), |_| false);
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
