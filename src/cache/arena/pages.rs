//! [`PageTable`]: which pages of the arena have physical memory behind
//! them, and which of that memory no live block touches.
//!
//! # State
//!
//! - **Pages** (the mapping granularity, 2 MiB on the H200): how many live
//!   blocks touch each, and the physical handle mapped there, if any.
//! - **Physical memory**: one entry per `cuMemCreate` (a growth's run of
//!   pages), with the mappings of it.
//! - **Handles** (mappings): one per run of pages mapped together (a growth
//!   maps its physical memory whole; an alias maps part of another's
//!   again, see below), with the count of its pages that live blocks
//!   touch. A handle none of whose pages is touched is **idle**: an
//!   allocation that lands on it again uses it with no driver call, and it
//!   can be given back to the device (unmapped, and the physical memory
//!   released once every mapping of it is idle too) once the GPU is done
//!   with it.
//! - **Dead pages**: pages of a mapping whose physical memory was mapped
//!   again elsewhere ([`alias`](PageTable::alias)): `cuMemUnmap` cannot
//!   unmap part of a mapping, so the old addresses stay mapped, out of the
//!   arena (the caller holds their range), until the whole mapping is
//!   given back. They count in no window, no idle figure and no free
//!   memory.
//! - **Tags per handle**: the newest free of each stream on its pages
//!   ([`Freed`]), since it was mapped: the GPU is done with the handle
//!   once a fence past each has completed (see
//!   [`Fences`](super::fences::Fences)).
//! - **The idle queue**: idle handles in the order they became idle.
//!   Entries are checked when popped, so a handle that became busy again
//!   is skipped, not searched for.
//! - **Pending pages**: pages a growth is mapping memory over, with the
//!   tier's lock released ([`pend`](PageTable::pend)). They belong to that
//!   growth until it records its mapping ([`map`](PageTable::map)) or gives
//!   them up ([`unpend`](PageTable::unpend)): no window this table offers
//!   contains one, [`touch`](PageTable::touch) never returns one as a run
//!   to back and [`free_unbacked_from`](PageTable::free_unbacked_from)
//!   stops at one, so no other block is placed on them and no other growth
//!   maps them. They have no handle, so reclaim never sees them.
//!
//! # Who changes it
//!
//! The tier's shared state, under its lock: `touch` when a block is
//! placed, `untouch` when it is freed, `pend` before a growth's driver
//! calls and `map` (or `unpend`) after them, `take_idle` before an unmap.

use std::collections::VecDeque;

use super::freed::Freed;
use crate::gpu::RawPhysical;

const NONE: u32 = u32::MAX;
/// The handle of a pending page: a growth is mapping memory there.
const PENDING: u32 = u32::MAX - 1;
/// The handle of a dead page: its memory is mapped at another address.
const DEAD: u32 = u32::MAX - 2;
/// Idle handles looked at, at most, for one the GPU is done with (the
/// oldest may wait on a busy stream while a younger one of another stream
/// is done).
const IDLE_SCAN: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Page {
    /// Live blocks touching the page.
    refs: u32,
    /// The handle mapped here, as an index into `handles`; [`NONE`] when
    /// nothing is, [`PENDING`] while a growth maps memory here.
    handle: u32,
}

impl Page {
    /// A page past the table's end: untouched, with no memory.
    const EMPTY: Page = Page {
        refs: 0,
        handle: NONE,
    };

    /// Whether memory is mapped here (not pending, not unbacked, not
    /// dead).
    fn mapped(self) -> bool {
        self.handle < DEAD
    }

    fn pending(self) -> bool {
        self.handle == PENDING
    }
}

/// One mapping of (part of) a physical handle over a run of pages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle {
    pub(crate) raw: RawPhysical,
    pub(crate) first: u32,
    pub(crate) pages: u32,
    /// The physical memory mapped (an index into `PageTable::phys`).
    phys: u32,
    /// Where in it the mapping starts, in pages.
    offset: u32,
    /// Pages of the run whose memory is mapped elsewhere now.
    dead: u32,
    /// Pages of the run that live blocks touch.
    busy: u32,
    /// How many times it became idle (names one idle spell in the queue).
    idle_gen: u32,
    live: bool,
}

/// One `cuMemCreate`: its size and its mappings.
#[derive(Debug, Clone)]
struct Phys {
    raw: RawPhysical,
    pages: u32,
    /// The handles (mappings) of it.
    maps: Vec<u32>,
}

/// A range of dead pages: `count` pages from `first`, whose addresses the
/// caller took out of its arena as `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadRun {
    pub(crate) first: u32,
    pub(crate) count: u32,
    pub(crate) node: u32,
}

/// Physical memory taken out of the table to be given back: unmap every
/// mapping, then release `raw` (of `pages` pages), then give the dead
/// runs' addresses back to the arena (they have no memory behind them
/// any more).
#[derive(Debug, Clone)]
pub(crate) struct Released {
    pub(crate) raw: RawPhysical,
    pub(crate) pages: u32,
    pub(crate) maps: Vec<Handle>,
    pub(crate) dead: Vec<DeadRun>,
}

/// The pages of one arena.
#[derive(Debug)]
pub(crate) struct PageTable {
    page: u64,
    /// `page`'s log2 when it is a power of two (always on CUDA: the
    /// granularity is), so that finding a page shifts instead of divides.
    shift: Option<u32>,
    /// The pages up to the highest one a block touched so far: the arena
    /// places blocks from its start, so this follows what the stream
    /// used, not the reservation (twice the device: 1.1 MiB of entries
    /// on the H200 that a first allocation would otherwise write). Pages
    /// past the end are unbacked and untouched.
    pages: Vec<Page>,
    /// Pages in the arena.
    capacity: usize,
    handles: Vec<Handle>,
    /// Per handle, the newest free of each stream on its pages.
    tags: Vec<Vec<Freed>>,
    /// Per handle, its dead runs.
    dead: Vec<Vec<DeadRun>>,
    phys: Vec<Phys>,
    spare_phys: Vec<u32>,
    spare_handles: Vec<u32>,
    idle: VecDeque<(u32, u32)>,
    /// Idle handles, in pages.
    idle_pages: usize,
    /// Mapped pages (dead ones too: their addresses are still mapped).
    mapped_pages: usize,
    /// Mapped pages, not dead, that no live block touches: memory an
    /// alias could move.
    free_mapped: usize,
    /// Pending pages (a growth maps memory there): while none is, windows
    /// need not look for them.
    pending_pages: usize,
}

impl PageTable {
    /// A table for an arena of `len` bytes in pages of `page` bytes.
    pub(crate) fn new(len: u64, page: u64) -> Self {
        PageTable {
            page,
            shift: page.is_power_of_two().then(|| page.trailing_zeros()),
            pages: Vec::new(),
            capacity: len.div_ceil(page) as usize,
            handles: Vec::new(),
            tags: Vec::new(),
            dead: Vec::new(),
            phys: Vec::new(),
            spare_phys: Vec::new(),
            spare_handles: Vec::new(),
            idle: VecDeque::new(),
            idle_pages: 0,
            mapped_pages: 0,
            free_mapped: 0,
            pending_pages: 0,
        }
    }

    /// The page holding byte `off`.
    #[inline]
    fn page_of(&self, off: u64) -> usize {
        match self.shift {
            Some(shift) => (off >> shift) as usize,
            None => (off / self.page) as usize,
        }
    }

    /// The pages `[off, off + len)` touches.
    #[inline]
    fn span(&self, off: u64, len: u64) -> std::ops::Range<usize> {
        let end = off + len;
        let end = match self.shift {
            Some(shift) => (end >> shift) as usize + usize::from(end & (self.page - 1) != 0),
            None => end.div_ceil(self.page) as usize,
        };
        self.page_of(off)..end
    }

    /// Extends the table over the pages before `end`.
    fn cover(&mut self, end: usize) {
        debug_assert!(end <= self.capacity);
        if end > self.pages.len() {
            self.pages.resize(end, Page::EMPTY);
        }
    }

    /// Whether the page at `off` has memory behind it.
    pub(crate) fn backed(&self, off: u64) -> bool {
        self.pages
            .get(self.page_of(off))
            .is_some_and(|p| p.mapped())
    }

    /// How many pages from `first` on (at most `max`) have no memory
    /// behind them, no block on them and no growth mapping them: room to
    /// map ahead of a block.
    pub(crate) fn free_unbacked_from(&self, first: u32, max: u32) -> u32 {
        let (first, max) = (first as usize, max as usize);
        let known = self
            .pages
            .iter()
            .skip(first)
            .take(max)
            .take_while(|p| p.handle == NONE && p.refs == 0)
            .count();
        let past = first.max(self.pages.len());
        if first + known < past {
            return known as u32;
        }
        // Every known page from `first` on is free: the pages past the
        // table's end are too, up to the arena's end.
        (known + (max - known).min(self.capacity.saturating_sub(past))) as u32
    }

    /// Whether every page of `[off, off + len)` has memory behind it.
    pub(crate) fn all_backed(&self, off: u64, len: u64) -> bool {
        let span = self.span(off, len);
        if span.end > self.pages.len() {
            return false;
        }
        // One look per handle: a handle is mapped over all its pages.
        let mut i = span.start;
        while i < span.end {
            let p = self.pages[i];
            if !p.mapped() {
                return false;
            }
            let end = self.run_end(p.handle);
            debug_assert!(end > i, "page {i} outside its handle's run");
            i = end;
        }
        true
    }

    /// The page after the last of the run handle `hi` is mapped over.
    #[inline]
    fn run_end(&self, hi: u32) -> usize {
        let h = &self.handles[hi as usize];
        (h.first + h.pages) as usize
    }

    /// The lowest offset `o` in `[start, end - len]`, `start` or a page
    /// boundary, such that no page of `[o, o + len)` is one `bad` rejects
    /// (pages past the table's end are [`Page::EMPTY`]); `None` if there is
    /// none.
    fn window(&self, start: u64, end: u64, len: u64, bad: impl Fn(Page) -> bool) -> Option<u64> {
        let past_bad = bad(Page::EMPTY);
        let mut at = start;
        while at + len <= end {
            let span = self.span(at, len);
            if span.start >= self.pages.len() {
                return (!past_bad).then_some(at);
            }
            let last_bad = span
                .rev()
                .find(|&i| bad(self.pages.get(i).copied().unwrap_or(Page::EMPTY)));
            match last_bad {
                None => return Some(at),
                Some(i) => at = (i as u64 + 1) * self.page,
            }
        }
        None
    }

    /// The lowest offset `o` in `[start, end - len]`, `start` or a page
    /// boundary, such that every page of `[o, o + len)` has memory behind
    /// it (pending pages have none yet); `None` if there is none.
    pub(crate) fn backed_window(&self, start: u64, end: u64, len: u64) -> Option<u64> {
        self.window(start, end, len, |p| !p.mapped())
    }

    /// The lowest offset `o` in `[start, end - len]`, `start` or a page
    /// boundary, such that no page of `[o, o + len)` has memory behind it
    /// (so no queued work can touch it: memory is unmapped only once the
    /// GPU is done with it) or is pending; `None` if there is none.
    pub(crate) fn unbacked_window(&self, start: u64, end: u64, len: u64) -> Option<u64> {
        self.window(start, end, len, |p| p.handle != NONE)
    }

    /// Whether no page of `[off, off + len)` is pending: a block may be
    /// placed there.
    pub(crate) fn settled(&self, off: u64, len: u64) -> bool {
        if self.pending_pages == 0 {
            return true;
        }
        let span = self.span(off, len);
        let end = span.end.min(self.pages.len());
        self.pages
            .get(span.start.min(end)..end)
            .is_none_or(|ps| !ps.iter().any(|p| p.pending()))
    }

    /// The lowest offset `o` in `[start, end - len]`, `start` or a page
    /// boundary, such that no page of `[o, o + len)` is pending; `None` if
    /// there is none.
    pub(crate) fn settled_window(&self, start: u64, end: u64, len: u64) -> Option<u64> {
        if self.pending_pages == 0 {
            return (start + len <= end).then_some(start);
        }
        self.window(start, end, len, Page::pending)
    }

    /// Marks pages `first..first + n`, which have no memory behind them
    /// and no other growth's mark, as pending: the calling growth maps
    /// memory over them with the tier's lock released.
    pub(crate) fn pend(&mut self, first: u32, n: u32) {
        let range = first as usize..(first + n) as usize;
        self.cover(range.end);
        for p in &mut self.pages[range] {
            debug_assert_eq!(p.handle, NONE, "pending twice, or mapped");
            p.handle = PENDING;
        }
        self.pending_pages += n as usize;
    }

    /// Gives up the pending mark of pages `first..first + n` (those that
    /// have one): the growth did not map them.
    pub(crate) fn unpend(&mut self, first: u32, n: u32) {
        let end = ((first + n) as usize).min(self.pages.len());
        for p in self
            .pages
            .get_mut(first as usize..end)
            .into_iter()
            .flatten()
        {
            if p.pending() {
                p.handle = NONE;
                self.pending_pages -= 1;
            }
        }
    }

    /// Pages pending now (none once every growth finished).
    pub(crate) fn pending_pages(&self) -> usize {
        self.pending_pages
    }

    /// Bytes of idle handles.
    pub(crate) fn idle_bytes(&self) -> usize {
        self.idle_pages * self.page as usize
    }

    /// Bytes from the arena's start up to the last page a block touched
    /// so far: past it nothing is mapped or used.
    pub(crate) fn extent(&self) -> u64 {
        self.pages.len() as u64 * self.page
    }

    /// Of `[off, off + len)`: the bytes with memory behind them, and the
    /// longest run of such bytes.
    pub(crate) fn backed_in(&self, off: u64, len: u64) -> (u64, u64) {
        let (mut total, mut run, mut longest) = (0, 0, 0);
        for i in self.span(off, len) {
            let start = (i as u64 * self.page).max(off);
            let end = ((i as u64 + 1) * self.page).min(off + len);
            if self.pages.get(i).is_some_and(|p| p.mapped()) {
                total += end - start;
                run += end - start;
                longest = longest.max(run);
            } else {
                run = 0;
            }
        }
        (total, longest)
    }

    /// Bytes of address space mapped (dead pages too).
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.mapped_pages * self.page as usize
    }

    /// Bytes of physical memory mapped: each mapping's pages but its dead
    /// ones, so that memory mapped at two addresses counts once, where it
    /// is used. Walks the handles (for snapshots, not the hot path).
    pub(crate) fn physical_bytes(&self) -> usize {
        let pages: usize = self
            .handles
            .iter()
            .filter(|h| h.live)
            .map(|h| (h.pages - h.dead) as usize)
            .sum();
        pages * self.page as usize
    }

    /// A block now covers `[off, off + len)` (where no page is pending:
    /// see [`settled`](Self::settled)): counts it on its pages and returns
    /// the runs of pages (first, count) with no memory behind them, which
    /// the caller must map before handing the block out.
    pub(crate) fn touch(&mut self, off: u64, len: u64) -> Vec<(u32, u32)> {
        let mut unbacked: Vec<(u32, u32)> = Vec::new();
        let span = self.span(off, len);
        self.cover(span.end);
        let mut i = span.start;
        while i < span.end {
            let p = self.pages[i];
            if p.mapped() {
                // The pages of one handle at once: a large block covers a
                // few handles, not hundreds of separate pages.
                let end = self.run_end(p.handle).min(span.end);
                let mut newly_busy = 0;
                for q in &mut self.pages[i..end] {
                    newly_busy += u32::from(q.refs == 0);
                    q.refs += 1;
                }
                let h = &mut self.handles[p.handle as usize];
                if newly_busy > 0 {
                    if h.busy == 0 {
                        self.idle_pages -= (h.pages - h.dead) as usize;
                    }
                    h.busy += newly_busy;
                    self.free_mapped -= newly_busy as usize;
                }
                i = end;
                continue;
            }
            self.pages[i].refs += 1;
            // Placement keeps blocks off pending pages: another growth
            // maps them, this block must not map them too.
            debug_assert!(!p.pending(), "a block placed on a pending page");
            if !p.pending() {
                match unbacked.last_mut() {
                    Some((first, n)) if *first + *n == i as u32 => *n += 1,
                    _ => unbacked.push((i as u32, 1)),
                }
            }
            i += 1;
        }
        unbacked
    }

    /// The block on `[off, off + len)` is gone, freed as `freed` says: the
    /// handles under it keep the tag, and those it leaves untouched become
    /// idle.
    pub(crate) fn untouch(&mut self, off: u64, len: u64, freed: Freed) {
        let span = self.span(off, len);
        let mut i = span.start;
        while i < span.end {
            let p = self.pages[i];
            if !p.mapped() {
                self.pages[i].refs -= 1;
                i += 1;
                continue;
            }
            // The pages of one handle at once, tagged once.
            let hi = p.handle;
            let end = self.run_end(hi).min(span.end);
            let mut now_idle = 0;
            for q in &mut self.pages[i..end] {
                q.refs -= 1;
                now_idle += u32::from(q.refs == 0);
            }
            add_tag(&mut self.tags[hi as usize], freed);
            let h = &mut self.handles[hi as usize];
            if now_idle > 0 {
                h.busy -= now_idle;
                self.free_mapped += now_idle as usize;
                if h.busy == 0 {
                    h.idle_gen = h.idle_gen.wrapping_add(1);
                    self.idle_pages += (h.pages - h.dead) as usize;
                    self.idle.push_back((hi, h.idle_gen));
                }
            }
            i = end;
        }
        if self.idle.len() > 64 + 2 * self.handles.len() {
            // Entries of handles that became busy again are skipped when
            // popped; drop them here so that a loop that idles and reuses
            // one mapping does not grow the queue (amortised: at least half
            // the entries go).
            let handles = &self.handles;
            self.idle.retain(|&(hi, generation)| {
                let h = &handles[hi as usize];
                h.live && h.busy == 0 && h.idle_gen == generation
            });
        }
    }

    /// Records that `raw`, new physical memory of `pages` pages, is mapped
    /// whole over pages `first..first + pages` (pending ones stop being
    /// pending).
    pub(crate) fn map(&mut self, first: u32, pages: u32, raw: RawPhysical) {
        let pi = self.add_phys(raw, pages);
        self.insert(first, pages, pi, 0);
    }

    /// Records one `cuMemCreate` of `pages` pages, with no mapping yet, in
    /// a spare slot if there is one; returns its index.
    fn add_phys(&mut self, raw: RawPhysical, pages: u32) -> u32 {
        let entry = Phys {
            raw,
            pages,
            maps: Vec::new(),
        };
        match self.spare_phys.pop() {
            Some(i) => {
                self.phys[i as usize] = entry;
                i
            }
            None => {
                self.phys.push(entry);
                (self.phys.len() - 1) as u32
            }
        }
    }

    /// Records that pages `offset..offset + pages` of the physical memory
    /// the dead page `source` was mapped to are mapped again over pages
    /// `first..first + pages` (pending: a block's, see
    /// [`alias_source`](Self::alias_source)). Nothing is added to what is
    /// held: the memory is the same.
    pub(crate) fn alias(&mut self, first: u32, pages: u32, source: AliasSource) {
        self.insert(first, pages, source.phys, source.offset);
    }

    /// A new mapping of pages `offset..offset + pages` of `phys` over pages
    /// `first..first + pages`.
    fn insert(&mut self, first: u32, pages: u32, phys: u32, offset: u32) {
        let handle = Handle {
            raw: self.phys[phys as usize].raw,
            first,
            pages,
            phys,
            offset,
            dead: 0,
            busy: 0,
            idle_gen: 0,
            live: true,
        };
        let hi = match self.spare_handles.pop() {
            Some(i) => {
                self.handles[i as usize] = handle;
                self.tags[i as usize].clear();
                self.dead[i as usize].clear();
                i
            }
            None => {
                self.handles.push(handle);
                self.tags.push(Vec::new());
                self.dead.push(Vec::new());
                (self.handles.len() - 1) as u32
            }
        };
        self.phys[phys as usize].maps.push(hi);
        let mut busy = 0;
        self.cover((first + pages) as usize);
        for p in &mut self.pages[first as usize..(first + pages) as usize] {
            debug_assert!(!p.mapped(), "mapped twice");
            if p.pending() {
                self.pending_pages -= 1;
            }
            p.handle = hi;
            busy += u32::from(p.refs > 0);
        }
        self.handles[hi as usize].busy = busy;
        self.mapped_pages += pages as usize;
        self.free_mapped += (pages - busy) as usize;
    }

    /// Undoes [`touch`](Self::touch) for a block that could not be backed:
    /// its pages still pending (only its own growth marks pages a block
    /// touches) stop being pending, the counts go back, nothing becomes
    /// idle that was not (pages mapped by `map` for it stay mapped and are
    /// idle now, tagged `freed`).
    pub(crate) fn untouch_failed(&mut self, off: u64, len: u64, freed: Freed) {
        let span = self.span(off, len);
        self.unpend(span.start as u32, (span.end - span.start) as u32);
        self.untouch(off, len, freed);
    }

    /// Physical memory every mapping of which is idle, with every tag
    /// `done` says the GPU finished (found from the oldest idle handles
    /// first, among the first few), taken out of the table: its pages have
    /// no memory behind them any more, and its dead runs go back to the
    /// caller. The caller unmaps every mapping and releases the memory.
    pub(crate) fn take_idle(&mut self, done: impl Fn(Freed) -> bool) -> Option<Released> {
        let mut i = 0;
        let mut looked = 0;
        while i < self.idle.len() && looked < IDLE_SCAN {
            let (hi, generation) = self.idle[i];
            let h = self.handles[hi as usize];
            if !h.live || h.busy > 0 || h.idle_gen != generation {
                self.idle.remove(i);
                continue;
            }
            looked += 1;
            // Every mapping of the memory must be idle and done: the driver
            // gives memory back only once all are unmapped.
            let maps = self.phys[h.phys as usize].maps.clone();
            let mut all_done = true;
            for &m in &maps {
                let tags = &mut self.tags[m as usize];
                tags.retain(|&t| !done(t));
                all_done &= self.handles[m as usize].busy == 0 && tags.is_empty();
            }
            if !all_done {
                i += 1;
                continue;
            }
            self.idle.remove(i);
            let phys = self.phys[h.phys as usize].clone();
            let mut released = Released {
                raw: phys.raw,
                pages: phys.pages,
                maps: Vec::with_capacity(maps.len()),
                dead: Vec::new(),
            };
            for &m in &maps {
                released.maps.push(self.handles[m as usize]);
                released.dead.append(&mut self.dead[m as usize]);
                self.remove(m);
            }
            self.phys[h.phys as usize].maps.clear();
            self.spare_phys.push(h.phys);
            return Some(released);
        }
        None
    }

    /// The newest tag of each stream among the idle handles' (one per
    /// stream): fences past them would let every idle handle go.
    pub(crate) fn idle_tags(&self) -> Vec<Freed> {
        let mut newest = Vec::new();
        for &(hi, generation) in &self.idle {
            let h = &self.handles[hi as usize];
            if h.live && h.busy == 0 && h.idle_gen == generation {
                for &t in &self.tags[hi as usize] {
                    add_tag(&mut newest, t);
                }
            }
        }
        newest
    }

    /// Takes idle handle `hi` out (its dead pages too).
    fn remove(&mut self, hi: u32) {
        let h = &mut self.handles[hi as usize];
        h.live = false;
        let (first, pages, dead) = (h.first, h.pages, h.dead);
        for p in &mut self.pages[first as usize..(first + pages) as usize] {
            p.handle = NONE;
        }
        self.idle_pages -= (pages - dead) as usize;
        self.free_mapped -= (pages - dead) as usize;
        self.mapped_pages -= pages as usize;
        self.spare_handles.push(hi);
    }

    /// Mapped pages, not dead, that no live block touches.
    pub(crate) fn free_mapped_pages(&self) -> usize {
        self.free_mapped
    }

    /// The physical allocations lying whole inside `[start, end)` (a free
    /// range of the arena: no live block touches them), each as the run of
    /// pages of its one live mapping (first page, count): what an alias
    /// can map again elsewhere. Whole, because the driver maps a handle
    /// only from its start (`cuMemMap` at a non-zero offset is refused by
    /// CUDA 13.0's driver); so a run of a mapping with dead pages, a
    /// mapping of part of its handle, or one that reaches past the range
    /// is not one.
    pub(crate) fn alias_runs(&self, start: u64, end: u64) -> Vec<(u32, u32)> {
        let first = start.div_ceil(self.page) as usize;
        let last = ((end / self.page) as usize).min(self.pages.len());
        let mut runs: Vec<(u32, u32)> = Vec::new();
        let mut i = first;
        while i < last {
            let p = self.pages[i];
            if !p.mapped() {
                i += 1;
                continue;
            }
            let h = &self.handles[p.handle as usize];
            let run_end = self.run_end(p.handle);
            let whole = h.first as usize == i
                && run_end <= last
                && h.offset == 0
                && h.dead == 0
                && h.pages == self.phys[h.phys as usize].pages;
            if whole {
                debug_assert!(
                    self.pages[i..run_end].iter().all(|q| q.refs == 0),
                    "pages of a free range touched"
                );
                runs.push((i as u32, h.pages));
            }
            i = run_end.max(i + 1);
        }
        runs
    }

    /// Marks pages `first..first + count` (one mapping's, untouched: see
    /// [`alias_runs`](Self::alias_runs)) dead, their addresses held by the
    /// caller as arena node `node`, and returns where their memory is,
    /// for [`alias`](Self::alias) once it is mapped again.
    pub(crate) fn kill(&mut self, first: u32, count: u32, node: u32) -> AliasSource {
        let hi = self.pages[first as usize].handle;
        debug_assert!(
            self.pages[first as usize].mapped(),
            "page {first} has no memory"
        );
        for p in &mut self.pages[first as usize..(first + count) as usize] {
            debug_assert!(p.handle == hi && p.refs == 0, "not one untouched run");
            p.handle = DEAD;
        }
        let h = &mut self.handles[hi as usize];
        h.dead += count;
        if h.busy == 0 {
            self.idle_pages -= count as usize;
        }
        self.free_mapped -= count as usize;
        self.dead[hi as usize].push(DeadRun { first, count, node });
        AliasSource {
            raw: h.raw,
            phys: h.phys,
            offset: h.offset + (first - h.first),
            handle: hi,
        }
    }

    /// Undoes [`kill`](Self::kill) (the memory could not be mapped again):
    /// the pages are the handle's again; returns the arena node the caller
    /// gives back.
    pub(crate) fn revive(&mut self, source: AliasSource, first: u32) -> u32 {
        let hi = source.handle;
        let runs = &mut self.dead[hi as usize];
        let at = runs
            .iter()
            .position(|r| r.first == first)
            .expect("a dead run of the handle");
        let run = runs.swap_remove(at);
        for p in &mut self.pages[first as usize..(first + run.count) as usize] {
            p.handle = hi;
        }
        let h = &mut self.handles[hi as usize];
        h.dead -= run.count;
        if h.busy == 0 {
            self.idle_pages += run.count as usize;
        }
        self.free_mapped += run.count as usize;
        run.node
    }

    /// The handles a sleep may take out from under the blocks on `spans`
    /// (offset, length): those over which every live block is one of
    /// them (a page's count of blocks is exactly the spans on it). A
    /// handle a block of another tag touches stays mapped, with every
    /// block on it.
    pub(crate) fn sleepable(&self, spans: &[(u64, u64)]) -> Vec<u32> {
        let mut asleep: std::collections::HashMap<usize, u32> = Default::default();
        for &(off, len) in spans {
            for i in self.span(off, len) {
                *asleep.entry(i).or_default() += 1;
            }
        }
        let mut handles: Vec<u32> = asleep
            .keys()
            .filter_map(|&i| self.pages.get(i).filter(|p| p.mapped()).map(|p| p.handle))
            .collect();
        handles.sort_unstable();
        handles.dedup();
        handles.retain(|&hi| {
            let h = &self.handles[hi as usize];
            // Memory mapped at two addresses, or a mapping with dead pages,
            // stays: a sleep releases the memory of the handles it takes.
            h.dead == 0
                && self.phys[h.phys as usize].maps.len() == 1
                && (h.first..h.first + h.pages).all(|i| {
                    let refs = self.pages[i as usize].refs;
                    refs == 0 || asleep.get(&(i as usize)) == Some(&refs)
                })
        });
        handles
    }

    /// Takes handle `hi` out of the table for a sleep, with its tags (the
    /// frees on its pages the GPU must be done with before it is
    /// unmapped): its pages become pending, so that no block is placed on
    /// them and no growth maps them until [`map`](Self::map) backs them
    /// again at the wake (or [`unpend`](Self::unpend) gives them up).
    pub(crate) fn take_asleep(&mut self, hi: u32) -> (Handle, Vec<Freed>) {
        let h = self.handles[hi as usize];
        debug_assert!(h.live, "a handle taken twice");
        self.handles[hi as usize].live = false;
        for p in &mut self.pages[h.first as usize..(h.first + h.pages) as usize] {
            p.handle = PENDING;
        }
        if h.busy == 0 {
            self.idle_pages -= h.pages as usize;
        }
        self.free_mapped -= (h.pages - h.busy) as usize;
        self.mapped_pages -= h.pages as usize;
        self.pending_pages += h.pages as usize;
        self.spare_handles.push(hi);
        // Its one mapping (see `sleepable`): the memory goes with it.
        self.phys[h.phys as usize].maps.clear();
        self.spare_phys.push(h.phys);
        (h, std::mem::take(&mut self.tags[hi as usize]))
    }

    /// Adds `tags` to the handle mapped at page `first` (a handle a sleep
    /// took and put back keeps the frees the GPU may not be done with).
    pub(crate) fn add_tags(&mut self, first: u32, tags: &[Freed]) {
        let hi = self.pages[first as usize].handle;
        debug_assert!(self.pages[first as usize].mapped(), "no handle at {first}");
        for &t in tags {
            add_tag(&mut self.tags[hi as usize], t);
        }
    }

    /// Puts back physical memory [`take_idle`](Self::take_idle) took, with
    /// the mappings of it not unmapped (`mapped`, of `released.maps`), when
    /// giving it back failed (idle, with no tag: the GPU was done with it).
    /// Their dead runs stay dead; the others' are returned (their addresses
    /// have no memory behind them: the caller gives them back).
    pub(crate) fn restore(&mut self, released: Released, mapped: &[bool]) -> Vec<DeadRun> {
        let pi = self.add_phys(released.raw, released.pages);
        let mut dead = released.dead;
        for (h, _) in released.maps.iter().zip(mapped).filter(|(_, m)| **m) {
            self.insert(h.first, h.pages, pi, h.offset);
            let hi = self.pages[h.first as usize].handle;
            let range = h.first..h.first + h.pages;
            let (mine, rest): (Vec<DeadRun>, Vec<DeadRun>) =
                dead.into_iter().partition(|r| range.contains(&r.first));
            dead = rest;
            for r in mine {
                for p in &mut self.pages[r.first as usize..(r.first + r.count) as usize] {
                    p.handle = DEAD;
                }
                self.handles[hi as usize].dead += r.count;
                self.free_mapped -= r.count as usize;
                self.dead[hi as usize].push(r);
            }
            let handle = &mut self.handles[hi as usize];
            handle.idle_gen = handle.idle_gen.wrapping_add(1);
            self.idle_pages += (handle.pages - handle.dead) as usize;
            self.idle.push_front((hi, handle.idle_gen));
        }
        dead
    }
}

/// Where the memory of dead pages is ([`PageTable::kill`]), to map it again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AliasSource {
    /// The physical handle.
    pub(crate) raw: RawPhysical,
    phys: u32,
    /// Where in it, in pages.
    pub(crate) offset: u32,
    /// The mapping the pages were dead in.
    handle: u32,
}

/// Adds `freed` to a handle's tags: the newer of one stream's frees, one
/// entry per stream.
fn add_tag(tags: &mut Vec<Freed>, freed: Freed) {
    if freed.is_clean() {
        return;
    }
    match tags.iter_mut().find(|t| t.slot() == freed.slot()) {
        Some(t) => *t = t.join(freed).unwrap_or(freed),
        None => tags.push(freed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    fn by(slot: usize, stamp: u64) -> Freed {
        Freed::by(slot, stamp)
    }

    /// Done up to `stamp` on every stream.
    fn upto(stamp: u64) -> impl Fn(Freed) -> bool {
        move |f: Freed| f.stamp() <= stamp
    }

    #[test]
    fn handles_go_idle_when_no_block_touches_them() {
        let mut t = PageTable::new(16 * P, P);
        // A block over pages 0..3 (ends inside page 2).
        assert_eq!(t.touch(100, 2 * P + 5), vec![(0, 3)]);
        t.map(0, 3, RawPhysical::new(7));
        // A second block on page 2 only: already backed.
        assert!(t.touch(2 * P + 4096, 512).is_empty());
        assert_eq!(t.idle_bytes(), 0);
        t.untouch(100, 2 * P + 5, by(0, 1));
        assert_eq!(t.idle_bytes(), 0, "page 2 is still touched");
        t.untouch(2 * P + 4096, 512, by(0, 2));
        assert_eq!(t.idle_bytes(), 3 * P as usize);
        assert!(t.take_idle(upto(1)).is_none(), "idle since stamp 2");
        let h = t.take_idle(upto(2)).unwrap();
        assert_eq!((h.maps[0].first, h.maps[0].pages, h.raw.get()), (0, 3, 7));
        assert_eq!((h.pages, h.maps.len()), (3, 1));
        assert_eq!((t.idle_bytes(), t.mapped_bytes()), (0, 0));
        assert!(!t.backed(0));
    }

    #[test]
    fn an_idle_handle_waits_for_every_stream_that_freed_on_it() {
        let mut t = PageTable::new(16 * P, P);
        assert_eq!(t.touch(0, 512), vec![(0, 1)]);
        t.map(0, 1, RawPhysical::new(7));
        assert!(t.touch(4096, 512).is_empty());
        // Stream 1 frees first, while stream 0's block keeps the page busy.
        t.untouch(4096, 512, by(1, 9));
        t.untouch(0, 512, by(0, 3));
        let mut tags = t.idle_tags();
        tags.sort_by_key(|f| f.slot());
        assert_eq!(tags, [by(0, 3), by(1, 9)]);
        assert!(
            t.take_idle(|f| f.slot() == Some(0)).is_none(),
            "stream 1's work may still use it"
        );
        assert_eq!(t.idle_tags(), [by(1, 9)], "done tags dropped");
        assert!(t.take_idle(|f| f.slot() == Some(1)).is_some());
    }

    #[test]
    fn the_table_grows_with_the_pages_used_and_past_it_all_is_free() {
        let mut t = PageTable::new(1024 * P, P);
        assert!(t.pages.is_empty(), "nothing written before a block");
        assert_eq!(t.free_unbacked_from(0, 8), 8);
        assert_eq!(t.free_unbacked_from(1020, 8), 4, "the arena's end");
        assert_eq!(t.touch(P, P), vec![(1, 1)]);
        t.map(1, 1, RawPhysical::new(3));
        assert_eq!(t.pages.len(), 2);
        assert_eq!(t.free_unbacked_from(0, 8), 1, "page 1 is mapped");
        assert_eq!(t.free_unbacked_from(2, 8), 8, "past the table");
        assert!(t.backed(P) && !t.backed(5 * P));
    }

    #[test]
    fn windows_skip_pages_with_and_without_memory() {
        let mut t = PageTable::new(16 * P, P);
        assert_eq!(t.touch(0, 6 * P), vec![(0, 6)]);
        t.map(0, 1, RawPhysical::new(1));
        t.map(2, 3, RawPhysical::new(2));
        t.untouch(0, 6 * P, by(0, 1));
        // Page 1 and page 5 have no memory: pages 2..5 do.
        assert_eq!(t.backed_window(0, 6 * P, P / 2), Some(0));
        assert_eq!(t.backed_window(512, 6 * P, P), Some(2 * P));
        assert_eq!(t.backed_window(0, 6 * P, 3 * P), Some(2 * P));
        assert_eq!(t.backed_window(0, 6 * P, 3 * P + 512), None);
        assert_eq!(
            t.backed_window(0, 4 * P, 3 * P),
            None,
            "the range ends first"
        );
        assert_eq!(t.backed_window(6 * P, 16 * P, P), None, "past the table");
        assert_eq!(t.unbacked_window(0, 16 * P, P), Some(P));
        assert_eq!(t.unbacked_window(0, 16 * P, P + 512), Some(5 * P));
        assert_eq!(t.unbacked_window(0, 6 * P, P + 512), None);
        assert_eq!(t.unbacked_window(7 * P, 16 * P, 9 * P), Some(7 * P));
    }

    #[test]
    fn a_handle_touched_again_is_not_taken() {
        let mut t = PageTable::new(4 * P, P);
        assert_eq!(t.touch(0, P), vec![(0, 1)]);
        t.map(0, 1, RawPhysical::new(1));
        t.untouch(0, P, by(0, 1));
        assert!(t.touch(0, 512).is_empty());
        assert!(t.take_idle(upto(u64::MAX)).is_none());
        t.untouch(0, 512, by(0, 2));
        assert!(t.take_idle(upto(u64::MAX)).is_some());
    }

    #[test]
    fn pending_pages_are_in_no_window_and_no_run() {
        let mut t = PageTable::new(16 * P, P);
        // A growth over pages 1..3, mapping ahead over 3..5.
        assert_eq!(t.touch(P, 2 * P), vec![(1, 2)]);
        t.pend(1, 2);
        assert_eq!(t.free_unbacked_from(3, 8), 8);
        t.pend(3, 2);
        assert_eq!(t.pending_pages(), 4);
        // No other growth takes them ahead, no placement offers them.
        assert_eq!(t.free_unbacked_from(0, 8), 1, "page 0, then pending");
        assert_eq!(t.free_unbacked_from(3, 8), 0);
        assert!(!t.settled(P / 2, P) && t.settled(0, P) && t.settled(5 * P, P));
        assert_eq!(t.settled_window(0, 16 * P, 2 * P), Some(5 * P));
        assert_eq!(t.unbacked_window(0, 16 * P, 2 * P), Some(5 * P));
        assert_eq!(t.backed_window(0, 16 * P, P), None);
        assert!(!t.backed(P) && !t.all_backed(P, P));
        // Mapped: the block's pages and two ahead; nothing pending.
        t.map(1, 4, RawPhysical::new(9));
        assert_eq!(t.pending_pages(), 0);
        assert!(t.all_backed(P, 4 * P));
        assert_eq!(t.settled_window(0, 16 * P, 2 * P), Some(0));
        t.untouch(P, 2 * P, by(0, 1));
        assert_eq!(t.idle_bytes(), 4 * P as usize);
    }

    /// Pages of an idle part of a mapping, mapped again over a block's
    /// pending pages: dead where they were, no longer free memory; the
    /// memory goes back only with every mapping of it, dead runs and all.
    #[test]
    fn memory_mapped_again_goes_back_with_its_last_mapping() {
        let mut t = PageTable::new(32 * P, P);
        // One handle over pages 0..3, another over 3..6; a block stays on
        // pages 0..2.
        assert_eq!(t.touch(0, 6 * P), vec![(0, 6)]);
        t.map(0, 3, RawPhysical::new(6));
        t.map(3, 3, RawPhysical::new(7));
        assert!(t.touch(0, 2 * P).is_empty());
        t.untouch(0, 6 * P, by(0, 1));
        let idle = 3 * P as usize;
        assert_eq!((t.free_mapped_pages(), t.idle_bytes()), (4, idle));
        assert_eq!(
            t.alias_runs(P + 512, 6 * P),
            vec![(3, 3)],
            "whole handles only"
        );
        assert_eq!(t.alias_runs(3 * P, 5 * P), vec![], "not past the range");
        // A block on pages 10..13 takes pages 3..6.
        assert_eq!(t.touch(10 * P, 3 * P), vec![(10, 3)]);
        t.pend(10, 3);
        let source = t.kill(3, 3, 99);
        assert_eq!((source.raw.get(), source.offset), (7, 0));
        assert_eq!(t.free_mapped_pages(), 1);
        assert!(!t.backed(3 * P) && t.backed(2 * P));
        assert_eq!(t.alias_runs(2 * P, 6 * P), vec![], "dead pages are not");
        t.alias(10, 3, source);
        assert_eq!(t.pending_pages(), 0);
        assert!(t.all_backed(10 * P, 3 * P));
        assert_eq!(t.mapped_bytes(), 9 * P as usize, "addresses mapped");
        assert_eq!(t.physical_bytes(), 6 * P as usize, "memory, once");
        // The first handle goes idle and back; the second's first mapping,
        // all dead, stays: the block at page 10 uses its memory.
        t.untouch(0, 2 * P, by(0, 2));
        assert_eq!(t.idle_bytes(), 3 * P as usize, "the first handle's");
        let first = t.take_idle(upto(u64::MAX)).unwrap();
        assert_eq!((first.raw.get(), first.pages, first.maps.len()), (6, 3, 1));
        assert!(t.take_idle(upto(u64::MAX)).is_none(), "mapped at page 10");
        t.untouch(10 * P, 3 * P, by(0, 3));
        assert!(t.take_idle(upto(2)).is_none(), "freed at stamp 3 there");
        let r = t.take_idle(upto(3)).unwrap();
        assert_eq!((r.raw.get(), r.pages, r.maps.len()), (7, 3, 2));
        assert_eq!(
            r.dead,
            vec![DeadRun {
                first: 3,
                count: 3,
                node: 99
            }]
        );
        assert_eq!(
            (t.mapped_bytes(), t.idle_bytes(), t.free_mapped_pages()),
            (0, 0, 0)
        );
    }

    /// An alias that could not be mapped gives the pages back to their
    /// mapping; a give-back that unmapped only some mappings puts the
    /// others back, idle, with their dead runs.
    #[test]
    fn a_failed_alias_and_a_failed_unmap_undo_what_they_did() {
        let mut t = PageTable::new(32 * P, P);
        assert_eq!(t.touch(0, 4 * P), vec![(0, 4)]);
        t.map(0, 4, RawPhysical::new(5));
        t.untouch(0, 4 * P, by(0, 1));
        let source = t.kill(0, 2, 42);
        assert_eq!(t.idle_bytes(), 2 * P as usize);
        assert_eq!(t.revive(source, 0), 42);
        assert_eq!((t.idle_bytes(), t.free_mapped_pages()), (4 * P as usize, 4));
        // Mapped again at page 8, then both idle.
        assert_eq!(t.touch(8 * P, 2 * P), vec![(8, 2)]);
        t.pend(8, 2);
        let source = t.kill(0, 2, 43);
        t.alias(8, 2, source);
        t.untouch(8 * P, 2 * P, by(0, 2));
        let r = t.take_idle(upto(2)).unwrap();
        // The mapping at page 0 could not be unmapped, the other was.
        let at_zero: Vec<bool> = r.maps.iter().map(|h| h.first == 0).collect();
        let freed = t.restore(r, &at_zero);
        assert!(freed.is_empty(), "its dead run stays dead");
        assert!(t.backed(2 * P) && !t.backed(0) && !t.backed(8 * P));
        assert_eq!((t.idle_bytes(), t.free_mapped_pages()), (2 * P as usize, 2));
        let r = t.take_idle(upto(2)).unwrap();
        assert_eq!((r.maps.len(), r.dead.len()), (1, 1));
    }

    #[test]
    fn a_failed_growth_leaves_nothing_pending() {
        let mut t = PageTable::new(16 * P, P);
        assert_eq!(t.touch(0, 3 * P), vec![(0, 3)]);
        t.pend(0, 3);
        t.pend(3, 2);
        // The first page got memory, the rest could not.
        t.map(0, 1, RawPhysical::new(4));
        t.unpend(3, 2);
        t.untouch_failed(0, 3 * P, by(0, 1));
        assert_eq!(t.pending_pages(), 0);
        assert_eq!(t.unbacked_window(0, 16 * P, 4 * P), Some(P));
        assert_eq!(t.touch(P, 4 * P), vec![(1, 4)], "backed again from page 1");
        assert_eq!(t.idle_bytes(), P as usize, "page 0 stays mapped, idle");
    }
}
