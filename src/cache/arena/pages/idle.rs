//! Idle memory leaving the [`PageTable`]: [`take_idle`](PageTable::take_idle)
//! finds physical memory every mapping of which is idle, with every tag
//! on each done as the caller says (among the oldest few idle handles),
//! and takes it out: its pages have no memory behind them from then on,
//! and its dead runs go back to the caller.
//! [`idle_tags`](PageTable::idle_tags) names the frees that fences must
//! pass for every idle handle to go, and [`restore`](PageTable::restore)
//! puts back what the caller could not unmap. Called by the arena's
//! give-back (`vmm/reclaim.rs`), under the tier's lock.
//!
//! # Stream ordering
//!
//! The table never decides that the GPU is done with a handle: `done`
//! does (fences past the frees that the host saw complete). Memory leaves
//! only once every mapping of it is idle and done with, as the driver
//! releases memory only once all its mappings are unmapped.

#![forbid(unsafe_code)]

use super::super::freed::Freed;
use super::{DEAD, DeadRun, IDLE_SCAN, NONE, PageTable, Released, add_tag};

impl PageTable {
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
            // A mapping whose every page is dead goes back only with the
            // mapping its memory moved to, found through that one's entry
            // once it is idle: looking at it here again and again would
            // hide the idle memory queued behind (with more of them than
            // `IDLE_SCAN`, all of it).
            if !h.live || h.busy > 0 || h.idle_gen != generation || h.dead == h.pages {
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

    /// The newest tag of each stream among the idle handles' and the other
    /// mappings of their memory (one per stream): fences past them would
    /// let every idle handle go (memory goes back only once the frees on
    /// every mapping of it are done, those at addresses it moved from
    /// too).
    pub(crate) fn idle_tags(&self) -> Vec<Freed> {
        let mut newest = Vec::new();
        for &(hi, generation) in &self.idle {
            let h = &self.handles[hi as usize];
            if h.live && h.busy == 0 && h.idle_gen == generation {
                for &m in &self.phys[h.phys as usize].maps {
                    for &t in &self.tags[m as usize] {
                        add_tag(&mut newest, t);
                    }
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
