//! New memory: the tier's target (`slack` over the live high-water mark,
//! [`target`](VirtualArena::target)) and the growth
//! ([`back`](VirtualArena::back)): idle memory given back first to stay
//! under the target, the free pages after the block mapped ahead up to
//! it, the bytes charged to the layers lending the device and admitted by
//! the budgets above the cache before they are created
//! ([`charge_growth`](VirtualArena::charge_growth), see
//! [`growth_gate`]), then `cuMemCreate`, `cuMemMap` and `cuMemSetAccess`
//! with the tier's lock released over pending pages, and the last resort
//! when the device is short ([`create_when_short`](VirtualArena::create_when_short)).
//! Called by `alloc.rs` for the runs no placement or move backed.
//!
//! # Stream ordering
//!
//! New memory has no earlier user: the block needs no wait. The pages a
//! growth maps are pending from its placement to the record of the
//! mapping, so no other block sees them unbacked (and maps them again)
//! or backed before they are.

// Unsafe here: the map and release of a growth's new memory.
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;

use super::VirtualArena;
use super::shared::SharedArena;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::GpuError;
use crate::observe::history::{self, MemoryAction, MemoryEvent};
use crate::types::StreamId;
use crate::util::growth_gate;
use crate::util::sync::MutexGuard;

impl VirtualArena {
    /// The most the tier means to hold: `slack` over the live high-water
    /// mark (counting `live`, the live bytes with the block being backed),
    /// and never less than one page.
    pub(super) fn target(&self, live: usize) -> usize {
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
    pub(super) fn back<'a>(
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
}
