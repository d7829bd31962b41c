//! Memory mapped again elsewhere (an alias, see the arena's
//! `vmm/alias.rs`): [`alias_runs`](PageTable::alias_runs) lists the
//! physical allocations lying whole in a free range (what can move),
//! [`kill`](PageTable::kill) marks their pages dead and says where the
//! memory is, [`alias`](PageTable::alias) records its new mapping, and
//! [`revive`](PageTable::revive) undoes a kill that could not be mapped.
//! Called under the tier's lock.
//!
//! # Stream ordering
//!
//! Dead pages keep their handle and its tags: the memory goes back to the
//! device only with its last mapping, once every tag of every mapping of
//! it is done (`idle.rs`), and the caller holds the dead addresses out of
//! its arena until then, so no block is placed where queued work may
//! still reach the old mapping.

#![forbid(unsafe_code)]

use super::{AliasSource, DEAD, DeadRun, PageTable};

impl PageTable {
    /// Records that pages `offset..offset + pages` of the physical memory
    /// the dead page `source` was mapped to are mapped again over pages
    /// `first..first + pages` (pending: a block's, see
    /// [`kill`](Self::kill)). Nothing is added to what is
    /// held: the memory is the same.
    pub(crate) fn alias(&mut self, first: u32, pages: u32, source: AliasSource) {
        self.insert(first, pages, source.phys, source.offset);
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
            // Queued again (with its age: idle as long as before), since
            // `take_idle` drops the entry of a mapping all of whose pages
            // were dead.
            h.idle_gen = h.idle_gen.wrapping_add(1);
            self.idle.push_front((hi, h.idle_gen));
        }
        self.free_mapped += run.count as usize;
        run.node
    }
}
