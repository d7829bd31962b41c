//! What a sleep needs of the [`VirtualArena`] (see `arena/sleep.rs`):
//! handles taken out from under sleeping blocks, fences past the work
//! queued before the sleep, the unmap once those completed, and new memory
//! at the wake. A child of `vmm`, as it works on the shared state's
//! private parts under the tier's lock.

// Unsafe here: the unmap, release and map of a sleep's handles.
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;

use super::super::freed::Freed;
use super::super::pages::Handle;
use super::super::placement::Placed;
use super::shared::is_done;
use super::{StreamSlot, VirtualArena};
use crate::error::ResourceResult;

impl VirtualArena {
    /// Takes out of the page table the handles under the blocks on
    /// `spans` that no other live block touches
    /// ([`PageTable::sleepable`](super::super::pages::PageTable::sleepable)),
    /// each with the frees on it the GPU must be done with before it is
    /// unmapped. Their pages are pending from now on: nothing is placed
    /// on them and no growth maps them, whatever is freed meanwhile.
    pub(crate) fn take_for_sleep(&self, spans: &[(u64, u64)]) -> Vec<(Handle, Vec<Freed>)> {
        let mut st = self.lock();
        let taken = st.pages.sleepable(spans);
        taken
            .into_iter()
            .map(|hi| st.pages.take_asleep(hi))
            .collect()
    }

    /// Puts back handles [`take_for_sleep`](Self::take_for_sleep) took and
    /// nobody unmapped (a wake before the sleep settled, or a sleep that
    /// failed after taking them): mapped as before, with their frees.
    pub(crate) fn put_back(&self, runs: &[(Handle, Vec<Freed>)]) {
        let mut st = self.lock();
        for (h, tags) in runs {
            st.pages.map(h.first, h.pages, h.raw);
            st.pages.add_tags(h.first, tags);
        }
    }

    /// A new free of `slot`'s stream at its current end, with a fence
    /// recorded there past it: once the host sees the fence complete
    /// ([`done_with`](Self::done_with)), every work queued on the stream
    /// before this call is done.
    pub(crate) fn fence(&self, slot: usize) -> ResourceResult<Freed> {
        let gpu = self.gpu();
        let mut st = self.lock();
        let Some(Some(s)) = st.streams.get_mut(slot) else {
            unreachable!("a stream with arena blocks opened the arena");
        };
        let stamp = s.fences.next_stamp();
        s.fences.cover(gpu, s.raw, stamp)?;
        Ok(Freed::by(slot, stamp))
    }

    /// Whether the host has seen the GPU done with every free `tags`
    /// names (the streams' fences are queried, never waited for).
    pub(crate) fn done_with(&self, tags: &[Freed]) -> bool {
        let mut st = self.lock();
        st.poll_all(self.gpu());
        tags.iter().all(|&t| is_done(&st.streams, t))
    }

    /// Waits, parking the thread, for the fences of the streams `tags`
    /// name (each stream's newest, which covers every stamp taken before
    /// it).
    pub(crate) fn wait_for(&self, tags: &[Freed]) -> ResourceResult<()> {
        let gpu = self.gpu();
        let mut st = self.lock();
        for slot in tags.iter().filter_map(|t| t.slot()) {
            if let Some(Some(s)) = st.streams.get_mut(slot) {
                s.fences.wait_all(gpu)?;
            }
        }
        Ok(())
    }

    /// Unmaps and releases a handle [`take_for_sleep`](Self::take_for_sleep)
    /// took, once [`done_with`](Self::done_with) its frees and the
    /// sleep's fences said true. Its pages stay pending, without memory,
    /// until [`wake_run`](Self::wake_run) (or [`forget_run`](Self::forget_run)).
    pub(crate) fn release_asleep(&self, h: Handle) -> ResourceResult<()> {
        let gpu = self.gpu();
        let st = self.lock();
        let addr = st.base + u64::from(h.first) * self.page;
        let bytes = h.pages as usize * self.page as usize;
        // SAFETY: (1) `h` was the one mapping of pages `h.first..h.first +
        // h.pages` of the live reservation (live until `close`) when
        // `take_for_sleep` took it out of the table; (2) the GPU is done
        // with it: the caller saw, by a query, the fences past every free
        // on its pages and past every use of the blocks on it complete (the
        // sleep queued each block's stream's waits for its uses elsewhere,
        // and its offload copy, before its fence), and the blocks are
        // asleep, so no hook queues new work on them; (3) its pages are
        // pending, so nothing else maps or places there.
        unsafe { gpu.mem_unmap(addr, bytes) }?;
        // SAFETY: (1) `h.raw` came from `mem_create`, was held by the table
        // until `take_for_sleep` and is released exactly once, here; (2)
        // unmapped just above, it is never mapped again.
        if let Err(e) = unsafe { gpu.mem_release(h.raw) } {
            tracing::warn!(error = %e, "releasing slept memory failed; leaked");
        }
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        self.access.release_charge(bytes);
        Ok(())
    }

    /// Maps new memory over pages `first..first + pages`, which a sleep
    /// released (pending since): the wake. A failure maps nothing.
    pub(crate) fn wake_run(&self, first: u32, pages: u32) -> ResourceResult<()> {
        let gpu = self.gpu();
        let bytes = pages as usize * self.page as usize;
        // Charged before the lock: a lending budget's refusal asks the
        // resources under it for idle memory.
        self.access.try_charge(bytes)?;
        let mut st = self.lock();
        let addr = st.base + u64::from(first) * self.page;
        let handle = match gpu.mem_create(bytes) {
            Ok(handle) => handle,
            Err(e) => {
                self.access.release_charge(bytes);
                return Err(e.into());
            }
        };
        // SAFETY: (1) the range is a run of whole pages of the live
        // reservation, granularity-aligned; (2) nothing is mapped there:
        // `release_asleep` unmapped it and its pages stayed pending, which
        // no placement, growth or reclaim touches; (3) `handle` was just
        // created with exactly `bytes`.
        let mapped = unsafe { gpu.mem_map(addr, bytes, handle) }.and_then(|()| {
            // SAFETY: (1) exactly the mapping just made.
            let access = unsafe { gpu.mem_set_access(addr, bytes) };
            if access.is_err() {
                // SAFETY: (1) the mapping just made; (2) nothing was queued
                // on it; (3) nothing records it.
                let _ = unsafe { gpu.mem_unmap(addr, bytes) };
            }
            access
        });
        if let Err(e) = mapped {
            // SAFETY: (1) created above, not released; (2) never mapped
            // again.
            let _ = unsafe { gpu.mem_release(handle) };
            self.access.release_charge(bytes);
            return Err(e.into());
        }
        st.pages.map(first, pages, handle);
        self.held.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }

    /// Gives up pages a sleep released without mapping them again (the
    /// cache goes while asleep): they stop being pending.
    pub(crate) fn forget_run(&self, first: u32, pages: u32) {
        self.lock().pages.unpend(first, pages);
    }

    /// Gives back the range of a block freed while asleep: straight to
    /// the arena, tagged with a free of the stream (its pages stay pending
    /// until the wake maps them), never kept by the stream.
    pub(crate) fn free_asleep(&self, ss: &StreamSlot, placed: Placed) {
        let mut st = self.lock();
        // A checking backend forgot the block where its memory was
        // unmapped (or will be: a sleep's pending pages); it hears of the
        // free only where the memory stayed.
        if st.pages.all_backed(placed.off, placed.len) {
            self.gpu().note_subfree(self.ptr(placed), ss.raw);
        }
        st.release(Some(self.gpu()), ss.slot, placed);
    }
}
