//! Where a block goes, and how its stream is ordered after the frees on
//! that range ("Who changes it" and "Stream ordering" in the
//! [`vmm`](super) essay): a good fit, memory already mapped before new
//! memory, ranges the stream may use as they are ([`AsIs`]: its own frees
//! and clean ranges) before others; outside a capture, any free range,
//! the stream ordered after the frees on it by
//! [`order_after`](VirtualArena::order_after); under
//! [`CrossStreamReuse::Done`], only frees the host saw done
//! ([`place_when_done`](VirtualArena::place_when_done)). Called by
//! `alloc.rs`; `alias.rs` orders moved memory with `order_after` too.
//!
//! # Stream ordering
//!
//! Which range serves depends on the host's calls only; fences decide
//! only how the stream is ordered after its frees: with no wait where the
//! host saw the work before the free done (a fence past it queried
//! complete, or its stream idle) or the stream already waits on the GPU
//! for a fence past it (a wait it made before, outside a capture, noted
//! per pair of streams: one wait a fence), else behind a wait on the GPU
//! for a fence recorded past the free. Never on the absence of news. A capture
//! never waits: it takes only ranges the GPU is known done with, or pages
//! with no memory behind them. A block with memory behind none of its
//! pages is ordered after nobody (the memory the tags name is gone).

// Unsafe here: the queries and the wait that order a stream after another's free.
#![allow(unsafe_code)]

use super::super::by_tag::Offered;
use super::super::freed::Freed;
use super::super::placement::Placed;
use super::shared::{LENDING_FREES, SharedArena, StreamFences, is_done};
use super::{StreamSlot, Taken, VirtualArena};
use crate::cache::config::CrossStreamReuse;

/// Which free ranges a stream may use as they are, with no wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct AsIs {
    /// The slot whose frees stream order puts before the stream's next
    /// work: the stream's own (`None` in a capture, whose replays may run
    /// on any stream).
    pub(super) own: Option<usize>,
    /// Whether frees the GPU is known done with serve too (fences queried
    /// complete): in a capture, and under [`CrossStreamReuse::Done`].
    pub(super) done: bool,
}

impl VirtualArena {
    /// Where the block goes: a good fit, preferring memory already mapped
    /// (a larger free range with memory behind it before new memory; the
    /// blocks other streams freed last and ranges merged once fences
    /// completed before a growth), and among mapped memory, ranges the
    /// stream may use as they are. Outside a capture, when nothing fits so,
    /// any free range serves before new memory, the stream waiting on the
    /// GPU for the fence of another stream's free where it may still run
    /// (not where the block has memory behind none of its pages: see
    /// "Stream ordering");
    /// under [`CrossStreamReuse::Done`], only ranges whose frees the host
    /// saw done serve so (see [`place_when_done`](Self::place_when_done)).
    /// Returns the placement, whether memory another stream freed serves
    /// it, and the waits on the GPU queued for it.
    pub(super) fn place(
        &self,
        st: &mut SharedArena,
        ss: &mut StreamSlot,
        len: u64,
        capturing: bool,
    ) -> Option<(Placed, bool, u32)> {
        let slot = ss.slot;
        if !capturing && self.cross_stream == CrossStreamReuse::Done {
            let placed = self.place_when_done(st, ss, len)?;
            return Some((placed, Self::borrowed(st, slot, placed), 0));
        }
        let any = !capturing && self.lends;
        // Whose frees count as the stream's own, usable as they are: none
        // in a capture (see `alloc`), which takes frees the GPU is known
        // done with instead.
        let own = AsIs {
            own: (!capturing).then_some(slot),
            done: capturing,
        };
        // Memory with memory behind it that this stream may use as it is
        // comes first. A wait on another stream's fence orders all the
        // work queued there before it ahead of this stream's next work:
        // independent requests on two streams run one after the other.
        // Taking such memory first (the best fit over every free range)
        // serializes independent requests to save a few percent of memory,
        // a bad trade under load (`docs/DESIGN.md`, "Caching tier", has
        // the service's figures).
        // The stream's kept blocks go back to the arena before it waits on
        // another stream: one of them, merged with its free neighbours,
        // may serve as it is.
        let now = match any {
            true => Self::backed_now(st, own, len).or_else(|| {
                (self.release_kept_locked(st, ss) > 0)
                    .then(|| Self::backed_now(st, own, len))
                    .flatten()
            }),
            false => None,
        };
        let (placed, waits) = match now {
            Some(placed) => (placed, 0),
            None => {
                let placed = self.choose(st, own, len, any)?;
                let SharedArena {
                    arena,
                    streams,
                    pages,
                    ..
                } = &mut *st;
                // A block with memory behind none of its pages is ordered
                // after nobody's free ("Stream ordering"): the tags name
                // users of memory no longer there. A page loses its memory
                // only once the host saw the GPU done with every free on
                // it (`take_idle` takes only handles whose tags a fence
                // seen complete covers; a sleep's `release_asleep` unmaps
                // likewise), and pages whose memory moved away stay out of
                // the arena until then too, so no queued work reaches
                // these addresses. What backs them next is new memory (a
                // growth) or memory moved here, which `move_memory` orders
                // the stream after the frees of. Waiting for the tags here
                // (they spread to such pages when free neighbours merge)
                // only chained the streams. Pending pages are not offered
                // (`fit`), so "not mapped" means no memory at all.
                let reaches_memory = pages.backed_in(placed.off, placed.len).0 > 0;
                match any && reaches_memory {
                    false => (placed, 0),
                    true => match self.order_after(streams, ss, arena.freed(placed)) {
                        Some(waits) => (placed, waits),
                        None => {
                            st.arena.free(placed, None, |_| false);
                            (self.choose(st, own, len, false)?, 0)
                        }
                    },
                }
            }
        };
        Some((placed, Self::borrowed(st, slot, placed), waits))
    }

    /// [`place`](Self::place) under [`CrossStreamReuse::Done`], outside a
    /// capture: the stream's own ranges with memory behind them first (no
    /// driver call), then, its fences queried, also ranges whose frees the
    /// host saw done, then its kept blocks given back to the arena, then
    /// any such range or pages with no memory behind them (a growth). No
    /// wait is ever queued. Before a growth, every other stream with frees
    /// not known done gets a fence past its newest free (and each of its
    /// next frees one right after it), so that its memory serves here
    /// once the GPU gets past them.
    fn place_when_done(
        &self,
        st: &mut SharedArena,
        ss: &mut StreamSlot,
        len: u64,
    ) -> Option<Placed> {
        let slot = ss.slot;
        let mine = AsIs {
            own: Some(slot),
            done: false,
        };
        if let Some(placed) = Self::backed_now(st, mine, len) {
            return Some(placed);
        }
        let gpu = self.gpu();
        st.poll_all(gpu);
        let seen = AsIs {
            own: Some(slot),
            done: true,
        };
        let now = Self::backed_now(st, seen, len).or_else(|| {
            (self.release_kept_locked(st, ss) > 0)
                .then(|| Self::backed_now(st, seen, len))
                .flatten()
        });
        if let Some(placed) = now {
            return Some(placed);
        }
        let placed = self.choose(st, seen, len, false)?;
        if self.lends && !st.pages.all_backed(placed.off, placed.len) {
            st.fence_others(gpu, slot);
        }
        Some(placed)
    }

    /// A good fit on memory mapped already that a stream may use as it is
    /// (as `own` says), if there is one.
    fn backed_now(st: &mut SharedArena, own: AsIs, len: u64) -> Option<Placed> {
        // Only ranges usable as they are: a window with no memory in
        // another's would not be backed (and looking for one walks pages).
        let placed = Self::fit(st, own, len, false, false)?;
        if st.pages.all_backed(placed.off, placed.len) {
            return Some(placed);
        }
        st.arena.free(placed, None, |_| false);
        Self::backed_fit(st, own, len, false)
    }

    /// A good fit (see [`place`](Self::place)); `any`: on any free range,
    /// else only where the stream may use it as it is.
    fn choose(&self, st: &mut SharedArena, own: AsIs, len: u64, any: bool) -> Option<Placed> {
        let placed = Self::fit(st, own, len, any, true)?;
        if st.pages.all_backed(placed.off, placed.len) {
            return Some(placed);
        }
        if let Some(backed) = Self::backed_fit(st, own, len, any) {
            st.arena.free(placed, None, |_| false);
            return Some(backed);
        }
        // The block would grow the arena. The blocks other streams freed
        // last go back to it (they may hold it, or merge into a range that
        // does), and fences may have completed since.
        let mut flushed = false;
        for (i, kept) in self.kept.iter().enumerate() {
            for node in kept.take_all() {
                let placed = st.arena.placed(node);
                st.release(None, i, placed);
                flushed = true;
            }
        }
        if !flushed {
            return Some(placed);
        }
        st.arena.free(placed, None, |_| false);
        let placed = Self::fit(st, own, len, any, true)?;
        if st.pages.all_backed(placed.off, placed.len) {
            return Some(placed);
        }
        match Self::backed_fit(st, own, len, any) {
            Some(backed) => {
                st.arena.free(placed, None, |_| false);
                Some(backed)
            }
            None => Some(placed),
        }
    }

    /// Orders the stream of `ss` after the frees `freed` names that may
    /// still be running: at once where a fence past one has completed (or
    /// completes at a query right after it is recorded) or the stream
    /// waits already for a fence past it, else behind a wait on the GPU
    /// for that fence. Returns the waits queued; `None` when that cannot
    /// be done (the waits queued before stay: they only order the stream
    /// further). Called outside a capture only.
    pub(super) fn order_after(
        &self,
        streams: &mut [Option<StreamFences>],
        ss: &StreamSlot,
        freed: &[Freed],
    ) -> Option<u32> {
        let gpu = self.gpu();
        let mut waits = 0;
        let ordered = freed.iter().all(|&f| {
            if f.slot().is_none_or(|s| s == ss.slot) {
                return true;
            }
            let home = f
                .slot()
                .and_then(|i| streams.get_mut(i))
                .and_then(Option::as_mut);
            home.is_some_and(|h| {
                if h.fences.done() >= f.stamp() {
                    return true;
                }
                // The stream waits on the GPU already for a fence of this
                // one past the free: stream order puts its next work after
                // that wait (see `StreamFences::waits_already`). Only
                // where the cache asked whether the stream captures (a
                // stream capturing unbeknown to it would take the range
                // into a graph whose replays nothing orders after the
                // free; the wait tried instead fails and spoils the
                // capture, as it always did).
                if self.sees_captures && h.waits_already(ss.slot, f.stamp()) {
                    return true;
                }
                // A stream with nothing left to run has run its frees:
                // the host sees it, no wait is needed. Not asked of a
                // capturing stream (the query would invalidate its
                // capture).
                // SAFETY: `h.raw` is a stream of the tier's device pool,
                // which the tier holds.
                let idle = unsafe { gpu.capture_status(h.raw) }.is_ok_and(|c| !c.is_capturing())
                    && unsafe { gpu.stream_query(h.raw) }.unwrap_or(false);
                if idle {
                    h.fences.settle();
                    return true;
                }
                // Another stream waits for what this one frees: its next
                // frees get a fence each (see `SharedArena::release`).
                h.lending = h.lending.max(LENDING_FREES);
                // A fence over the free, queried at once: a stream with
                // nothing queued has run past it already.
                let _ = h.fences.cover(gpu, h.raw, f.stamp());
                let done = h.fences.poll(gpu).unwrap_or(h.fences.done());
                if done >= f.stamp() {
                    return true;
                }
                let waited = h.fences.covering(f.stamp()).is_some_and(|(e, fence)| {
                    // SAFETY: `ss.raw` is a stream of the tier's device pool
                    // (the slot's), the event a live fence of the tier's
                    // backend (destroyed only when the tier closes).
                    let queued = unsafe { gpu.stream_wait_event(ss.raw, e) }.is_ok();
                    // A wait the driver took is in the stream's own order:
                    // a fence is never recorded in a capture (`cover`), and
                    // a capturing stream's wait on an event recorded
                    // outside it is refused (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
                    if queued {
                        h.note_wait(ss.slot, fence);
                    }
                    queued
                });
                waits += u32::from(waited);
                waited
            })
        });
        ordered.then_some(waits)
    }

    /// Whether a stream may use a range with tags `freed` as it is: clean
    /// (no tag), or only the frees of `own.own` (its slot), which stream
    /// order puts before its next work. By default a fence seen complete
    /// does not make a range usable here (see "Decisions the GPU's timing
    /// does not change"): it only spares the wait once the range is
    /// chosen. In a capture (`own.own` is `None`), which may not wait, and
    /// under [`CrossStreamReuse::Done`] (`own.done`), frees the GPU is
    /// known done with are usable too.
    pub(super) fn usable_now(streams: &[Option<StreamFences>], own: AsIs, freed: &[Freed]) -> bool {
        freed.iter().all(|&f| {
            own.own.is_some_and(|o| f.slot() == Some(o)) || (own.done && is_done(streams, f))
        })
    }

    /// The free ranges a search may skip without asking about them: where
    /// only ranges a stream may use as they are serve (not `any`, and
    /// none other serves elsewhere), outside a capture and unless frees
    /// the GPU is known done with serve too, those its own slot's index
    /// names ([`Offered::CleanOr`], the test of
    /// [`usable_now`](Self::usable_now) then).
    fn offered(own: AsIs, any: bool, elsewhere: bool) -> Offered {
        match own.own {
            Some(slot) if !own.done && !any && !elsewhere => Offered::CleanOr(slot),
            _ => Offered::Any,
        }
    }

    /// A good fit a stream may use now: where its tag allows (see
    /// [`usable_now`](Self::usable_now); every range with `any`), at the
    /// end with memory behind it if only one end has; elsewhere, with
    /// `unbacked_elsewhere`, on pages with no memory. Never on a page a
    /// growth is mapping (pending).
    fn fit(
        st: &mut SharedArena,
        own: AsIs,
        len: u64,
        any: bool,
        unbacked_elsewhere: bool,
    ) -> Option<Placed> {
        let SharedArena {
            arena,
            pages,
            streams,
            ..
        } = st;
        let offered = Self::offered(own, any, unbacked_elsewhere);
        arena.alloc(len, offered, |start, end, freed| {
            if any || Self::usable_now(streams, own, freed) {
                let at_end = end - start > len && !pages.backed(start) && pages.backed(end - 1);
                let at = if at_end { end - len } else { start };
                // Never on a page a growth is mapping (it would be seen
                // unbacked, and mapped twice, or backed before it is).
                match pages.settled(at, len) {
                    true => Some(at),
                    false => pages.settled_window(start, end, len),
                }
            } else if unbacked_elsewhere {
                // Pending pages are not free of memory: skipped too.
                pages.unbacked_window(start, end, len)
            } else {
                None
            }
        })
    }

    /// A free range a stream may use now (as [`fit`](Self::fit) judges
    /// `own`) with memory behind every page the block needs (so on no
    /// pending page: those have none yet).
    fn backed_fit(st: &mut SharedArena, own: AsIs, len: u64, any: bool) -> Option<Placed> {
        let SharedArena {
            arena,
            pages,
            streams,
            ..
        } = st;
        arena.lend(len, Self::offered(own, any, false), |start, end, freed| {
            (any || Self::usable_now(streams, own, freed))
                .then(|| pages.backed_window(start, end, len))
                .flatten()
        })
    }

    /// Under [`CrossStreamReuse::Done`], after a growth failed for lack of
    /// memory (`e`): a range with memory behind it that another stream
    /// freed serves, behind a wait on the GPU where the free may still
    /// run, rather than an error (the last resort, as giving idle memory
    /// back is). `None` under `Wait` (its placement looked there first), in
    /// a capture, or when no such range fits.
    pub(super) fn borrow_when_short(
        &self,
        st: &mut SharedArena,
        ss: &StreamSlot,
        len: u64,
        capturing: bool,
        e: &crate::error::ResourceError,
    ) -> Option<Taken> {
        if capturing
            || !self.lends
            || self.cross_stream != CrossStreamReuse::Done
            || !e.is_lack_of_memory()
        {
            return None;
        }
        let own = AsIs {
            own: Some(ss.slot),
            done: true,
        };
        let placed = Self::backed_fit(st, own, len, true)?;
        let SharedArena { arena, streams, .. } = &mut *st;
        let Some(waits) = self.order_after(streams, ss, arena.freed(placed)) else {
            arena.free(placed, None, |_| false);
            return None;
        };
        st.pages.touch(placed.off, placed.len);
        let borrowed = Self::borrowed(st, ss.slot, placed);
        Some(Taken {
            placed,
            ptr: st.base + placed.off,
            borrowed,
            waits,
            undoable: true,
        })
    }

    /// Whether memory another stream freed serves `placed`: a range
    /// another stream freed, with memory behind some of it (pages with none
    /// are new memory, whoever freed the addresses).
    fn borrowed(st: &SharedArena, slot: usize, placed: Placed) -> bool {
        st.arena
            .freed(placed)
            .iter()
            .any(|f| f.slot() != Some(slot))
            && st.pages.backed_in(placed.off, placed.len).0 > 0
    }
}
