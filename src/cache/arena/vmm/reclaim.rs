//! Giving idle memory back: a mapping no live block touches stays mapped
//! (the next block there maps nothing) until the tier gives it back: a
//! growth, to stay under its target, gives back what has been idle since
//! before the previous growth
//! ([`reclaim_at_growth`](VirtualArena::reclaim_at_growth)); a trim
//! ([`trim_idle`](VirtualArena::trim_idle),
//! [`reclaim_all`](VirtualArena::reclaim_all)) and the last resort before
//! out of memory give back whatever the GPU is done with. Each give-back
//! unmaps every mapping of one handle and releases it
//! ([`give_back`](VirtualArena::give_back)); its dead pages (memory moved
//! away, `alias.rs`) become the arena's again.
//!
//! # Stream ordering
//!
//! A mapping is unmapped only once fences past the last free of every
//! stream on its pages have completed, seen by a query (waited for only
//! as the last resort): no queued work can touch it. That decision rests
//! on the GPU's progress; a growth makes it a growth behind, so that a GPU
//! that keeps up gives back what the simulated replay does.

// Unsafe here: the unmap and release of idle memory.
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;

use super::super::freed::Freed;
use super::super::pages::Released;
use super::VirtualArena;
use super::shared::{SharedArena, is_done, settled_before};
use crate::observe::history::{self, MemoryAction, MemoryEvent};

impl VirtualArena {
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
    pub(super) fn reclaim_at_growth(&self, st: &mut SharedArena, enough: impl Fn(&Self) -> bool) {
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
    pub(super) fn reclaim_locked(&self, st: &mut SharedArena, wait: bool) -> usize {
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
}
