//! An allocation's way through the arena, the steps in the order the
//! tier ([`ArenaTier`](super::super::tier::ArenaTier)) makes them, with
//! its stream's shard lock held: [`VirtualArena::take_kept`] (a block the
//! stream kept, under no other lock), then [`VirtualArena::alloc`] under
//! the tier's lock: a placement (`place.rs`), the block's pages with no
//! memory behind them marked pending, memory moved from the holes for the
//! pages past the target (`alias.rs`), new memory for the rest
//! (`grow.rs`), and where a growth fails, the placement undone and, under
//! [`CrossStreamReuse::Done`](crate::cache::config::CrossStreamReuse::Done), a last borrow
//! (`place.rs`).
//!
//! # Stream ordering
//!
//! The block is handed out only once its stream is ordered after every
//! free on the memory it reaches: the placement or the move queued what
//! that takes (no wait where the host saw the work done, else a wait on
//! the GPU) before `alloc` returns, and new memory has no earlier user.
//! A failed growth undoes its placement, never frees it: no block was
//! handed out, so the range keeps the tags it had.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::super::freed::Freed;
use super::super::placement::Placed;
use super::shared::SharedArena;
use super::{StreamSlot, Taken, VirtualArena};
use crate::error::ResourceResult;
use crate::types::StreamId;

impl VirtualArena {
    /// Whether `ss`'s stream kept a block of exactly `len` bytes (a look:
    /// nothing is taken).
    pub(crate) fn keeps_len(&self, ss: &StreamSlot, len: u64) -> bool {
        ss.kept.holds(len)
    }

    /// Takes back a block of `len` bytes (already rounded) that `ss`'s
    /// stream keeps, for `requested` bytes: the first step of every
    /// allocation, with no lock but the shard's (it counts the allocation
    /// in the stream's history, so it is made once per allocation, and
    /// [`alloc`](Self::alloc) follows when it finds nothing). Returns the
    /// block and its address.
    // Always: on the allocation's hot path, and a call costs as much as
    // this body when it finds a block.
    #[inline(always)]
    pub(crate) fn take_kept(
        &self,
        ss: &mut StreamSlot,
        len: u64,
        requested: usize,
    ) -> Option<(Placed, u64)> {
        let kept = ss.kept.take(len, &self.kept[ss.slot])?;
        let ptr = self.ptr(kept);
        self.gpu().note_suballocation(ptr, requested.max(1), ss.raw);
        Some((kept, ptr))
    }

    /// Places and backs `len` bytes (already rounded) on `ss`'s stream,
    /// after [`take_kept`](Self::take_kept) found nothing. `None` when the
    /// arena has no room (the caller falls back).
    ///
    /// `capturing`: the stream is in a capture. Else it may wait on the GPU
    /// for another stream's fence, to use memory that stream freed, and
    /// reuse its own frees as they are (stream order puts its next work
    /// after them). A capture does neither: a wait on an outside event
    /// would invalidate it, and its replays may run on any stream, after
    /// nothing this stream queued before: it takes only ranges no queued
    /// work can touch (frees the GPU is known done with, or none).
    /// `live_total` sums the bytes users hold on every stream, for the
    /// slack target.
    pub(crate) fn alloc(
        &self,
        ss: &mut StreamSlot,
        len: u64,
        requested: usize,
        stream: StreamId,
        live_total: &dyn Fn() -> usize,
        capturing: bool,
    ) -> ResourceResult<Option<Taken>> {
        let mut st = self.lock();
        if !ss.kept.keeps() {
            // The stream's sizes stopped repeating: what it keeps goes
            // back, for this block and the next to be placed around less.
            self.release_kept_locked(&mut st, ss);
        }
        let Some((placed, mut borrowed, mut waits)) = self.place(&mut st, ss, len, capturing)
        else {
            return Ok(None);
        };
        let mut undoable = !capturing;
        let unbacked = st.pages.touch(placed.off, placed.len);
        if !unbacked.is_empty() {
            let live = live_total();
            // The block's pages with no memory behind them are this
            // growth's from now on: no other block is placed on them and no
            // other growth maps them while the lock is released for the
            // driver calls.
            for &(first, count) in &unbacked {
                st.pages.pend(first, count);
            }
            // Past the target, memory no block uses elsewhere serves,
            // mapped again here (not in a capture: its replays may run on
            // streams stream order does not cover).
            let unbacked = match capturing || !self.moves {
                true => unbacked,
                false => {
                    let pages = |runs: &[(u32, u32)]| runs.iter().map(|r| r.1).sum::<u32>();
                    let wanted = pages(&unbacked);
                    let moved = self.alias_unbacked(&mut st, ss, placed, unbacked, live);
                    borrowed |= moved.lent;
                    waits += moved.waits;
                    // Memory moved here leaves its old addresses for good:
                    // that cannot be undone.
                    undoable &= pages(&moved.unbacked) == wanted;
                    moved.unbacked
                }
            };
            for &(first, count) in &unbacked {
                let mut at = first;
                while at < first + count {
                    let n = (first + count - at).min(self.max_run_pages);
                    let grown;
                    (st, grown) = self.back(st, at, n, live, stream);
                    if let Err(e) = grown {
                        let SharedArena { arena, pages, .. } = &mut *st;
                        // The placement is undone: nothing used the range
                        // (no block was handed out), so it keeps the tags
                        // it had, and its mapped pages theirs. Tagging it
                        // as a free of this stream would make the next
                        // stream to take it wait on the GPU for all the
                        // work queued here, though none of it touched the
                        // range: under a full budget every refused growth
                        // did, and chained the streams (BENCHMARKS.md,
                        // "Under a budget"). Clears what is still pending
                        // of the block (the runs not mapped yet) with the
                        // counts.
                        pages.untouch_failed(placed.off, placed.len, Freed::CLEAN);
                        arena.free(placed, None, |_| false);
                        return match self.borrow_when_short(&mut st, ss, len, capturing, &e) {
                            Some(taken) => {
                                self.gpu()
                                    .note_suballocation(taken.ptr, requested.max(1), ss.raw);
                                Ok(Some(taken))
                            }
                            None => Err(e),
                        };
                    }
                    at += n;
                }
            }
            self.live_peak.fetch_max(live, Ordering::AcqRel);
        }
        let ptr = st.base + placed.off;
        self.gpu().note_suballocation(ptr, requested.max(1), ss.raw);
        Ok(Some(Taken {
            placed,
            ptr,
            borrowed,
            waits,
            undoable,
        }))
    }
}
