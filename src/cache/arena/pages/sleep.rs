//! What a sleep of the arena tier takes out of the [`PageTable`] (see
//! `arena/sleep.rs` and `vmm/sleep.rs`): [`sleepable`](PageTable::sleepable)
//! finds the handles under the sleeping blocks that no other block
//! touches, [`take_asleep`](PageTable::take_asleep) takes one out with its
//! tags, its pages pending until the wake maps them again, and
//! [`add_tags`](PageTable::add_tags) gives a handle put back its tags.
//! Called under the tier's lock.
//!
//! # Stream ordering
//!
//! A handle taken for a sleep carries the frees on its pages: the caller
//! unmaps it only once fences past them, and past the sleeping blocks'
//! last uses, have completed. Its pages stay pending meanwhile, so no
//! block is placed on them and no growth maps them.

#![forbid(unsafe_code)]

use super::super::freed::Freed;
use super::{Handle, PENDING, PageTable, add_tag};

impl PageTable {
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
}
