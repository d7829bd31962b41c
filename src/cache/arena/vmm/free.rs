//! A block's way back: [`VirtualArena::free`] keeps it in the stream's
//! shard ([`kept`](super::super::kept)) while the stream's sizes repeat,
//! else gives it to the arena tagged with a new free of the stream
//! ([`release_range`](VirtualArena::release_range)); a block the host saw
//! the GPU done with goes back clean
//! ([`free_completed`](VirtualArena::free_completed)); a placement no work
//! was queued on is undone, not freed ([`undo`](VirtualArena::undo)); a
//! graph's pool keeps ranges and only tells a checking backend
//! ([`note_reuse`](VirtualArena::note_reuse),
//! [`note_free`](VirtualArena::note_free)). Called by the tier and its
//! leases, with the stream's shard lock held.
//!
//! # Stream ordering
//!
//! A free is made at the current end of the block's stream, after the
//! waits for the block's uses on other streams were queued, so its tag
//! covers them. A kept block given back later is tagged then; fenced
//! then too where others borrow, unless another stream's growth gives it
//! back (then a borrow records the fence when it comes). An undo keeps
//! the tags the range had: the next user is ordered after those frees,
//! not after the work this stream queued since, which never touched the
//! range.

#![forbid(unsafe_code)]

use super::super::freed::Freed;
use super::super::placement::Placed;
use super::shared::SharedArena;
use super::{StreamSlot, VirtualArena};

impl VirtualArena {
    /// Gives back the block at `placed`, freed at the current end of the
    /// stream (after the waits for its uses elsewhere were queued).
    // Always: on the free's hot path, and a call costs as much as this
    // body when the block is kept.
    #[inline(always)]
    pub(crate) fn free(&self, ss: &mut StreamSlot, placed: Placed) {
        self.gpu().note_subfree(self.ptr(placed), ss.raw);
        if let Some(pushed) = ss.kept.keep(placed, &self.kept[ss.slot]) {
            self.release_range(ss, pushed);
        }
    }

    /// Gives back the block at `placed`, which the GPU is done with (every
    /// use of it completed, as the host saw): kept as any free while the
    /// stream's sizes repeat, else back to the arena clean, where every
    /// stream may take it as it is (no fence, no wait on this stream's
    /// queued work).
    pub(crate) fn free_completed(&self, ss: &mut StreamSlot, placed: Placed) {
        self.gpu().note_subfree_completed(self.ptr(placed), ss.raw);
        match ss.kept.keep(placed, &self.kept[ss.slot]) {
            None => {}
            Some(given) if given == placed => self.lock().release_tagged(placed, Freed::CLEAN),
            // An older block pushed out: freed when it was, as any free.
            Some(pushed) => self.release_range(ss, pushed),
        }
    }

    /// Undoes the placement `placed` of `ss`'s stream ([`alloc`](Self::alloc),
    /// outside a capture, no memory moved for it): no work was ever queued
    /// on the block ([`NeverUsed`](crate::NeverUsed)), so the range goes
    /// back to the arena with the tags it had when it was placed (its node
    /// kept them), merging with its free neighbours as any free, and its
    /// pages go back to what they were: their handles keep their tags (a
    /// placement adds none), memory mapped for the block is idle and clean
    /// (no work ever touched it). Not kept by the stream, not tagged as its
    /// free: the next stream to take the range is ordered after the frees
    /// it was ordered after before, not after all the work queued on this
    /// stream since (which never touched it).
    ///
    /// What the placement queued on the stream stays: a wait on the GPU
    /// for another stream's fence cannot be taken back (it only orders the
    /// stream further), and the range keeps that stream's tag, so the next
    /// user is ordered after that free too.
    pub(crate) fn undo(&self, ss: &StreamSlot, placed: Placed) {
        self.gpu()
            .note_suballocation_undone(self.ptr(placed), ss.raw);
        let mut st = self.lock();
        let SharedArena { arena, pages, .. } = &mut *st;
        pages.untouch(placed.off, placed.len, Freed::CLEAN);
        arena.free(placed, None, |_| false);
    }

    /// Releases `placed` to the arena, freed at the current end of the
    /// slot's stream (out of line: most frees keep their block); also a
    /// range a graph's pool kept, once the graph is gone (its free was
    /// noted already).
    pub(crate) fn release_range(&self, ss: &StreamSlot, placed: Placed) {
        self.lock().release(Some(self.gpu()), ss.slot, placed);
    }

    /// Tells a checking backend that the range at `placed`, taken out of a
    /// graph's pool, holds a new allocation of `requested` bytes on the
    /// slot's stream (as [`alloc`](Self::alloc) does for a placement).
    pub(crate) fn note_reuse(&self, ss: &StreamSlot, placed: Placed, requested: usize) {
        self.gpu()
            .note_suballocation(self.ptr(placed), requested.max(1), ss.raw);
    }

    /// Tells a checking backend that the block at `placed` is freed at the
    /// current end of the slot's stream, without giving the range back (a
    /// graph's pool keeps it).
    pub(crate) fn note_free(&self, ss: &StreamSlot, placed: Placed) {
        self.gpu().note_subfree(self.ptr(placed), ss.raw);
    }

    /// Gives the stream's kept blocks back to the arena (under its lock,
    /// `st`); returns how many.
    pub(super) fn release_kept_locked(&self, st: &mut SharedArena, ss: &mut StreamSlot) -> usize {
        let mut given = 0;
        for placed in ss.kept.drain(&self.kept[ss.slot]) {
            st.release(Some(self.gpu()), ss.slot, placed);
            given += 1;
        }
        given
    }

    /// Gives the stream's kept blocks back to the arena.
    pub(crate) fn release_kept(&self, ss: &mut StreamSlot) {
        self.release_kept_locked(&mut self.lock(), ss);
    }
}
