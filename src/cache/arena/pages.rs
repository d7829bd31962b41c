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
//!
//! # Where the code is
//!
//! This file holds the table, its counts and windows, and a block's
//! touch, free and growth (`touch`, `untouch`, `pend`, `map`); in
//! `pages/`, each with an essay of its own: `idle.rs` (idle memory taken
//! out to be given back, or put back), `alias.rs` (memory mapped again
//! elsewhere: dead pages), `sleep.rs` (handles a sleep takes out), and
//! the unit tests (`tests.rs`).

use std::collections::VecDeque;

use super::freed::Freed;
use crate::gpu::RawPhysical;

// The table's other verbs, each a child module (they work on its private
// parts): see "Where the code is".
mod alias;
mod idle;
mod sleep;

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
mod tests;
