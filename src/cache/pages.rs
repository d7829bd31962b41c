//! [`PageTable`]: which pages of one stream's arena have physical memory
//! behind them, and which of that memory no live block touches.
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
//! - **The idle queue**: idle handles in the order they became idle, each
//!   with the stamp of the free that made it idle (the stream's free count
//!   then; see [`Fences`](super::fences::Fences)). Entries are checked when
//!   popped, so a handle that became busy again is skipped, not searched
//!   for.
//!
//! # Who changes it
//!
//! The owning stream's shard, under its lock: `touch` when a block is
//! placed, `untouch` when it is freed, `map`/`take_idle` around the driver
//! calls the tier makes.

use std::collections::VecDeque;

use crate::gpu::RawPhysical;

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Page {
    /// Live blocks touching the page.
    refs: u32,
    /// The handle mapped here, as an index into `handles`.
    handle: u32,
}

/// One physical handle mapped over a run of pages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle {
    pub(crate) raw: RawPhysical,
    pub(crate) first: u32,
    pub(crate) pages: u32,
    /// Pages of the run that live blocks touch.
    busy: u32,
    /// The free stamp at which it last became idle.
    idle_stamp: u64,
    live: bool,
}

/// The pages of one arena.
#[derive(Debug)]
pub(crate) struct PageTable {
    page: u64,
    /// The pages up to the highest one a block touched so far: the arena
    /// places blocks from its start, so this follows what the stream
    /// used, not the reservation (twice the device: 1.1 MiB of entries
    /// on the H200 that a first allocation would otherwise write). Pages
    /// past the end are unbacked and untouched.
    pages: Vec<Page>,
    /// Pages in the arena.
    capacity: usize,
    handles: Vec<Handle>,
    spare_handles: Vec<u32>,
    idle: VecDeque<(u32, u64)>,
    /// Idle handles, in pages.
    idle_pages: usize,
    /// Mapped pages.
    mapped_pages: usize,
}

impl PageTable {
    /// A table for an arena of `len` bytes in pages of `page` bytes.
    pub(crate) fn new(len: u64, page: u64) -> Self {
        PageTable {
            page,
            pages: Vec::new(),
            capacity: len.div_ceil(page) as usize,
            handles: Vec::new(),
            spare_handles: Vec::new(),
            idle: VecDeque::new(),
            idle_pages: 0,
            mapped_pages: 0,
        }
    }

    fn span(&self, off: u64, len: u64) -> std::ops::Range<usize> {
        (off / self.page) as usize..(off + len).div_ceil(self.page) as usize
    }

    /// Extends the table over the pages before `end`.
    fn cover(&mut self, end: usize) {
        debug_assert!(end <= self.capacity);
        if end > self.pages.len() {
            self.pages.resize(
                end,
                Page {
                    refs: 0,
                    handle: NONE,
                },
            );
        }
    }

    /// Whether the page at `off` has memory behind it.
    pub(crate) fn backed(&self, off: u64) -> bool {
        self.pages
            .get((off / self.page) as usize)
            .is_some_and(|p| p.handle != NONE)
    }

    /// How many pages from `first` on (at most `max`) have no memory
    /// behind them and no block on them: room to map ahead of a block.
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
        self.pages
            .get(span)
            .is_some_and(|ps| ps.iter().all(|p| p.handle != NONE))
    }

    /// The lowest offset `o` in `[start, end - len]`, `start` or a page
    /// boundary, such that every page of `[o, o + len)` has memory behind
    /// it; `None` if there is none.
    pub(crate) fn backed_window(&self, start: u64, end: u64, len: u64) -> Option<u64> {
        let mut at = start;
        while at + len <= end {
            if (at / self.page) as usize >= self.pages.len() {
                return None;
            }
            let span = self.span(at, len);
            let last_unbacked = span
                .clone()
                .rev()
                .find(|&i| self.pages.get(i).is_none_or(|p| p.handle == NONE));
            match last_unbacked {
                None => return Some(at),
                Some(i) => at = (i as u64 + 1) * self.page,
            }
        }
        None
    }

    /// Bytes of idle handles.
    pub(crate) fn idle_bytes(&self) -> usize {
        self.idle_pages * self.page as usize
    }

    /// Bytes mapped.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.mapped_pages * self.page as usize
    }

    /// A block now covers `[off, off + len)`: counts it on its pages and
    /// returns the runs of pages (first, count) with no memory behind them,
    /// which the caller must map before handing the block out.
    pub(crate) fn touch(&mut self, off: u64, len: u64) -> Vec<(u32, u32)> {
        let mut unbacked: Vec<(u32, u32)> = Vec::new();
        let span = self.span(off, len);
        self.cover(span.end);
        for i in span {
            let p = &mut self.pages[i];
            p.refs += 1;
            if p.handle == NONE {
                match unbacked.last_mut() {
                    Some((first, n)) if *first + *n == i as u32 => *n += 1,
                    _ => unbacked.push((i as u32, 1)),
                }
                continue;
            }
            if p.refs == 1 {
                let h = &mut self.handles[p.handle as usize];
                if h.busy == 0 {
                    self.idle_pages -= h.pages as usize;
                }
                h.busy += 1;
            }
        }
        unbacked
    }

    /// The block on `[off, off + len)` is gone, freed at `stamp`: handles
    /// it leaves untouched become idle.
    pub(crate) fn untouch(&mut self, off: u64, len: u64, stamp: u64) {
        for i in self.span(off, len) {
            let p = &mut self.pages[i];
            p.refs -= 1;
            if p.refs > 0 {
                continue;
            }
            if p.handle == NONE {
                continue;
            }
            let hi = p.handle;
            let h = &mut self.handles[hi as usize];
            h.busy -= 1;
            if h.busy == 0 {
                h.idle_stamp = stamp;
                self.idle_pages += h.pages as usize;
                self.idle.push_back((hi, stamp));
            }
        }
        if self.idle.len() > 64 + 2 * self.handles.len() {
            // Entries of handles that became busy again are skipped when
            // popped; drop them here so that a loop that idles and reuses
            // one mapping does not grow the queue (amortised: at least half
            // the entries go).
            let handles = &self.handles;
            self.idle.retain(|&(hi, stamp)| {
                let h = &handles[hi as usize];
                h.live && h.busy == 0 && h.idle_stamp == stamp
            });
        }
    }

    /// Records that `raw` is mapped over pages `first..first + pages`,
    /// which a block now touches.
    pub(crate) fn map(&mut self, first: u32, pages: u32, raw: RawPhysical) {
        let handle = Handle {
            raw,
            first,
            pages,
            busy: 0,
            idle_stamp: 0,
            live: true,
        };
        let hi = match self.spare_handles.pop() {
            Some(i) => {
                self.handles[i as usize] = handle;
                i
            }
            None => {
                self.handles.push(handle);
                (self.handles.len() - 1) as u32
            }
        };
        let mut busy = 0;
        self.cover((first + pages) as usize);
        for p in &mut self.pages[first as usize..(first + pages) as usize] {
            debug_assert_eq!(p.handle, NONE);
            p.handle = hi;
            busy += u32::from(p.refs > 0);
        }
        self.handles[hi as usize].busy = busy;
        self.mapped_pages += pages as usize;
    }

    /// Undoes [`touch`](Self::touch) for a block that could not be backed:
    /// the counts go back, nothing becomes idle that was not (pages mapped
    /// by `map` for it stay mapped and are idle now, stamped `stamp`).
    pub(crate) fn untouch_failed(&mut self, off: u64, len: u64, stamp: u64) {
        self.untouch(off, len, stamp);
    }

    /// The oldest idle handle whose idle stamp is at most `done` (the GPU
    /// finished every use of it), taken out of the table: its pages have
    /// no memory behind them any more. The caller unmaps and releases it.
    pub(crate) fn take_idle(&mut self, done: u64) -> Option<Handle> {
        while let Some(&(hi, stamp)) = self.idle.front() {
            let h = self.handles[hi as usize];
            if !h.live || h.busy > 0 || h.idle_stamp != stamp {
                self.idle.pop_front();
                continue;
            }
            if stamp > done {
                return None;
            }
            self.idle.pop_front();
            self.remove(hi);
            return Some(h);
        }
        None
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

    /// Puts back a handle [`take_idle`](Self::take_idle) took, when giving
    /// it back to the device failed.
    pub(crate) fn restore(&mut self, h: Handle) {
        self.map(h.first, h.pages, h.raw);
        let hi = self.pages[h.first as usize].handle;
        let handle = &mut self.handles[hi as usize];
        handle.idle_stamp = h.idle_stamp;
        self.idle_pages += h.pages as usize;
        self.idle.push_front((hi, h.idle_stamp));
    }

    /// The newest idle stamp (0 when nothing is idle): a fence at or after
    /// it covers every idle handle.
    pub(crate) fn newest_idle_stamp(&self) -> u64 {
        if self.idle_pages == 0 {
            return 0;
        }
        self.idle.back().map_or(0, |&(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    #[test]
    fn handles_go_idle_when_no_block_touches_them() {
        let mut t = PageTable::new(16 * P, P);
        // A block over pages 0..3 (ends inside page 2).
        assert_eq!(t.touch(100, 2 * P + 5), vec![(0, 3)]);
        t.map(0, 3, RawPhysical::new(7));
        // A second block on page 2 only: already backed.
        assert!(t.touch(2 * P + 4096, 512).is_empty());
        assert_eq!(t.idle_bytes(), 0);
        t.untouch(100, 2 * P + 5, 1);
        assert_eq!(t.idle_bytes(), 0, "page 2 is still touched");
        t.untouch(2 * P + 4096, 512, 2);
        assert_eq!(t.idle_bytes(), 3 * P as usize);
        assert!(t.take_idle(1).is_none(), "idle since stamp 2");
        let h = t.take_idle(2).unwrap();
        assert_eq!((h.first, h.pages, h.raw.get()), (0, 3, 7));
        assert_eq!((t.idle_bytes(), t.mapped_bytes()), (0, 0));
        assert!(!t.backed(0));
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
    fn a_backed_window_skips_pages_with_no_memory() {
        let mut t = PageTable::new(16 * P, P);
        assert_eq!(t.touch(0, 6 * P), vec![(0, 6)]);
        t.map(0, 1, RawPhysical::new(1));
        t.map(2, 3, RawPhysical::new(2));
        t.untouch(0, 6 * P, 1);
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
    }

    #[test]
    fn a_handle_touched_again_is_not_taken() {
        let mut t = PageTable::new(4 * P, P);
        assert_eq!(t.touch(0, P), vec![(0, 1)]);
        t.map(0, 1, RawPhysical::new(1));
        t.untouch(0, P, 1);
        assert!(t.touch(0, 512).is_empty());
        assert!(t.take_idle(u64::MAX).is_none());
        t.untouch(0, 512, 2);
        assert!(t.take_idle(u64::MAX).is_some());
    }
}
