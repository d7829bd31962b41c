//! [`PageTable`]: which pages of the arena have physical memory behind
//! them, and which of that memory no live block touches.
//!
//! # State
//!
//! - **Pages** (the mapping granularity, 2 MiB on the H200): how many live
//!   blocks touch each, and the physical handle mapped there, if any.
//! - **Handles**: one per run of pages mapped together (a handle covers
//!   the unbacked pages one allocation needed, up to a maximum run), with
//!   the count of its pages that live blocks touch. A handle none of whose
//!   pages is touched is **idle**: an allocation that lands on it again
//!   uses it with no driver call, and it can be given back to the device
//!   (unmapped and released) once the GPU is done with it.
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

    /// Whether memory is mapped here (not pending, not unbacked).
    fn mapped(self) -> bool {
        self.handle < PENDING
    }

    fn pending(self) -> bool {
        self.handle == PENDING
    }
}

/// One physical handle mapped over a run of pages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle {
    pub(crate) raw: RawPhysical,
    pub(crate) first: u32,
    pub(crate) pages: u32,
    /// Pages of the run that live blocks touch.
    busy: u32,
    /// How many times it became idle (names one idle spell in the queue).
    idle_gen: u32,
    live: bool,
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
    spare_handles: Vec<u32>,
    idle: VecDeque<(u32, u32)>,
    /// Idle handles, in pages.
    idle_pages: usize,
    /// Mapped pages.
    mapped_pages: usize,
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
            spare_handles: Vec::new(),
            idle: VecDeque::new(),
            idle_pages: 0,
            mapped_pages: 0,
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

    /// Bytes mapped.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.mapped_pages * self.page as usize
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
                        self.idle_pages -= h.pages as usize;
                    }
                    h.busy += newly_busy;
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
                if h.busy == 0 {
                    h.idle_gen = h.idle_gen.wrapping_add(1);
                    self.idle_pages += h.pages as usize;
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

    /// Records that `raw` is mapped over pages `first..first + pages`
    /// (pending ones stop being pending).
    pub(crate) fn map(&mut self, first: u32, pages: u32, raw: RawPhysical) {
        let handle = Handle {
            raw,
            first,
            pages,
            busy: 0,
            idle_gen: 0,
            live: true,
        };
        let hi = match self.spare_handles.pop() {
            Some(i) => {
                self.handles[i as usize] = handle;
                self.tags[i as usize].clear();
                i
            }
            None => {
                self.handles.push(handle);
                self.tags.push(Vec::new());
                (self.handles.len() - 1) as u32
            }
        };
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

    /// An idle handle every tag of which `done` says the GPU finished (the
    /// oldest such among the first few idle), taken out of the table: its
    /// pages have no memory behind them any more. The caller unmaps and
    /// releases it.
    pub(crate) fn take_idle(&mut self, done: impl Fn(Freed) -> bool) -> Option<Handle> {
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
            let tags = &mut self.tags[hi as usize];
            tags.retain(|&t| !done(t));
            if !tags.is_empty() {
                i += 1;
                continue;
            }
            self.idle.remove(i);
            self.remove(hi);
            return Some(h);
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

    fn remove(&mut self, hi: u32) {
        let h = &mut self.handles[hi as usize];
        h.live = false;
        let (first, pages) = (h.first, h.pages);
        for p in &mut self.pages[first as usize..(first + pages) as usize] {
            p.handle = NONE;
        }
        self.idle_pages -= pages as usize;
        self.mapped_pages -= pages as usize;
        self.spare_handles.push(hi);
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
            (h.first..h.first + h.pages).all(|i| {
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
        self.mapped_pages -= h.pages as usize;
        self.pending_pages += h.pages as usize;
        self.spare_handles.push(hi);
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

    /// Puts back a handle [`take_idle`](Self::take_idle) took, when giving
    /// it back to the device failed (idle, with no tag: the GPU was done
    /// with it).
    pub(crate) fn restore(&mut self, h: Handle) {
        self.map(h.first, h.pages, h.raw);
        let hi = self.pages[h.first as usize].handle;
        let handle = &mut self.handles[hi as usize];
        handle.idle_gen = handle.idle_gen.wrapping_add(1);
        self.idle_pages += h.pages as usize;
        self.idle.push_front((hi, handle.idle_gen));
    }
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
        assert_eq!((h.first, h.pages, h.raw.get()), (0, 3, 7));
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
