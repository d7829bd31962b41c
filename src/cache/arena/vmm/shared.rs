//! The state every stream shares, under the tier's lock
//! ([`SharedArena`]): the reservation's start, its [`Arena`] (the free
//! ranges, each tagged with the frees on it), its [`PageTable`] (which
//! pages are mapped, which mappings are idle or pending) and, per stream,
//! its fences ([`StreamFences`]: which of its frees the GPU is done with,
//! the horizon a growth gives back up to, how many of its next frees
//! get a fence of their own, and the newest of its fences each other
//! stream was made to wait for).
//!
//! # Who changes it
//!
//! Every verb of the [`VirtualArena`](super::VirtualArena) that takes the
//! tier's lock works on it: placements take ranges out (`place.rs`),
//! growths mark pages pending and record mappings (`grow.rs`), moves map
//! memory again elsewhere (`alias.rs`), give-backs unmap idle memory
//! (`reclaim.rs`), sleeps take handles out (`sleep.rs`). This file holds
//! the state and the steps that need nothing else: fences queried or
//! recorded, a range given back to the arena with its tag
//! ([`SharedArena::release`]).
//!
//! # Stream ordering
//!
//! A range goes back tagged with the stream that freed it and the free's
//! stamp, and keeps that tag whatever the fences say: [`is_done`] and
//! [`settled_before`] only tell what the host has seen the GPU finish. A
//! fence is recorded right after a free only while other streams take
//! what this one frees ([`LENDING_FREES`]), so that a borrower waits for
//! the work queued before the free and for none after it.

#![forbid(unsafe_code)]

use super::super::fences::Fences;
use super::super::freed::Freed;
use super::super::pages::PageTable;
use super::super::placement::{Arena, Placed};
use crate::gpu::{Gpu, RawStream};

/// A stream's fences, in the shared state.
#[derive(Debug)]
pub(super) struct StreamFences {
    pub(super) raw: RawStream,
    pub(super) fences: Fences,
    /// The stream's newest free at the previous growth: a growth gives
    /// back only memory idle since a free at or before it (see
    /// [`VirtualArena::reclaim_at_growth`](super::VirtualArena::reclaim_at_growth)).
    pub(super) horizon: u64,
    /// How many of its next frees get a fence of their own, right after
    /// them: [`LENDING_FREES`] once another stream took memory it freed.
    pub(super) lending: u32,
    /// Per slot of another stream, the newest stamp of this stream's
    /// fences that the other stream was made to wait for on the GPU (0, or
    /// no entry: none): that stream is ordered after every free of this
    /// one up to it, and needs no new wait for them (see
    /// [`waits_already`](Self::waits_already)).
    pub(super) waited_by: Vec<u64>,
}

/// Frees of a stream that get a fence each after another stream took
/// memory it freed. A fence recorded right after the free is what lets
/// the next borrower wait for the work queued before the free and for
/// nothing after it; a stream whose frees nobody takes (a side stream of
/// a training step, most streams of most programs) records none, and a
/// borrow then records one when it comes (later than the free, so the
/// borrower may wait for more of that stream's work than it needed).
pub(super) const LENDING_FREES: u32 = 1024;

impl StreamFences {
    /// Whether the stream of `slot` waits on the GPU already for a fence
    /// of this stream covering the free at `stamp`.
    ///
    /// # Stream ordering
    ///
    /// One wait covers every free up to the stamp it noted: a fence with
    /// stamp `s` is an event recorded on this stream after every free
    /// stamped `s` or less (`Fences::cover` records it once the stream's
    /// stamp is `s`, and recording it again, past the fences in flight,
    /// only moves it later), and a wait binds to the record current when
    /// it is queued (CUDA's rule), so the waiter's later work comes after
    /// all of them. The entry needs no reset: a slot's stream and its
    /// fences live as long as the arena (`open` makes them once; stamps
    /// only grow), and a capture, a sleep or a trim leaves the waiter's
    /// stream order as it was. Only waits in the stream's own order are
    /// noted ([`note_wait`](Self::note_wait)).
    pub(super) fn waits_already(&self, slot: usize, stamp: u64) -> bool {
        self.waited_by.get(slot).is_some_and(|&s| s >= stamp)
    }

    /// The stream of `slot` was made to wait on the GPU for this stream's
    /// fence of stamp `fence`, a wait the driver took outside any capture:
    /// the caller knows its stream was not capturing (a wait there belongs
    /// to the graph, not to the stream, and its replays run after nothing
    /// the stream queued).
    pub(super) fn note_wait(&mut self, slot: usize, fence: u64) {
        if self.waited_by.len() <= slot {
            self.waited_by.resize(slot + 1, 0);
        }
        let newest = &mut self.waited_by[slot];
        *newest = (*newest).max(fence);
    }
}

/// The arena every stream places in; guarded by the tier's lock.
#[derive(Debug)]
pub(super) struct SharedArena {
    /// The reservation's start; 0 until the first stream opens it.
    pub(super) base: u64,
    pub(super) arena: Arena,
    pub(super) pages: PageTable,
    /// Per slot, once its stream opened the arena.
    pub(super) streams: Vec<Option<StreamFences>>,
    /// Bytes growths in their driver calls mean to create (not in `held`
    /// yet): a growth planning its size counts them as held, so that two
    /// at once do not both fill the room under the target.
    pub(super) growing: usize,
}

/// Whether the GPU is done with what `freed` names, as far as the fences
/// seen complete say.
pub(super) fn is_done(streams: &[Option<StreamFences>], freed: Freed) -> bool {
    match freed.slot() {
        None => true,
        Some(s) => streams
            .get(s)
            .and_then(Option::as_ref)
            .is_some_and(|f| f.fences.done() >= freed.stamp()),
    }
}

/// Whether `freed` was made at or before its stream's horizon (the
/// previous growth) and the GPU is known done with it.
pub(super) fn settled_before(streams: &[Option<StreamFences>], freed: Freed) -> bool {
    match freed.slot() {
        None => true,
        Some(s) => streams
            .get(s)
            .and_then(Option::as_ref)
            .is_some_and(|f| freed.stamp() <= f.horizon && f.fences.done() >= freed.stamp()),
    }
}

impl SharedArena {
    /// Queries every stream's fences.
    pub(super) fn poll_all(&mut self, gpu: &dyn Gpu) {
        for s in self.streams.iter_mut().flatten() {
            let _ = s.fences.poll(gpu);
        }
    }

    /// Before a growth of `slot`'s stream under
    /// [`CrossStreamReuse::Done`](crate::cache::config::CrossStreamReuse::Done):
    /// every other stream with frees the host has not seen done gets a
    /// fence past its newest free (where none in flight covers it), and
    /// from then on a fence right after each of its frees, so that a
    /// later placement, querying them, finds its memory done once the GPU
    /// got there (and no later). For good, not for
    /// [`LENDING_FREES`]: with no wait to fall back on, a free without a
    /// fence serves no other stream until the next growth fences it (the
    /// simulated replay of BERT's training step, two streams, held 1.054×
    /// its live peak with 1,024 fenced frees per growth, 1.023× with all,
    /// what the default holds). A fence costs one `cuEventRecord` (0.25
    /// µs on the H200) per free that reaches the arena: 0.19 per
    /// operation on the four-stream Llama trace. One fence in flight per
    /// stream, recorded when another stream looks, cost a hundredth of
    /// that but held 1.07× on BERT once the GPU ran 16 operations behind.
    pub(super) fn fence_others(&mut self, gpu: &dyn Gpu, slot: usize) {
        for (i, s) in self.streams.iter_mut().enumerate() {
            let Some(s) = s.as_mut().filter(|_| i != slot) else {
                continue;
            };
            if s.fences.done() < s.fences.stamp() {
                s.lending = u32::MAX;
                let _ = s.fences.cover(gpu, s.raw, s.fences.stamp());
            }
        }
    }

    /// Records fences past the newest free of each stream on idle handles
    /// (where none in flight covers it), so that a later look finds them
    /// done.
    pub(super) fn cover_idle(&mut self, gpu: &dyn Gpu) {
        for tag in self.pages.idle_tags() {
            if let Some(s) = tag
                .slot()
                .and_then(|i| self.streams.get_mut(i))
                .and_then(Option::as_mut)
            {
                let _ = s.fences.cover(gpu, s.raw, tag.stamp());
            }
        }
    }

    /// The range goes back to the arena tagged `freed`; pages it leaves
    /// untouched go idle with that tag ([`Freed::CLEAN`]: no queued work
    /// touches it, free to unmap at once).
    ///
    /// The range's tags are kept whatever the fences say (see "Decisions
    /// the GPU's timing does not change" in the module's essay): only the
    /// stream's pages learn from fences, for giving memory back.
    pub(super) fn release_tagged(&mut self, placed: Placed, freed: Freed) {
        self.pages.untouch(placed.off, placed.len, freed);
        self.arena.free(placed, Some(freed), |_| false);
    }

    /// The range goes back to the arena tagged with a new free of `slot`;
    /// pages it leaves untouched go idle. With `fence` (the tier's backend;
    /// given where the free is made now, on the caller's stream), while
    /// other streams take what this one frees ([`LENDING_FREES`]), a fence
    /// is recorded on the stream right after the free, so that another
    /// stream that takes the range waits for the work queued before the
    /// free and for nothing queued after it. Without (a block the stream
    /// kept, given back by a growth on another thread), a borrow records
    /// one later.
    pub(super) fn release(&mut self, fence: Option<&dyn Gpu>, slot: usize, placed: Placed) {
        let Some(Some(s)) = self.streams.get_mut(slot) else {
            unreachable!("a stream places in the arena only once it opened it");
        };
        let stamp = s.fences.next_stamp();
        if let (Some(gpu), true) = (fence, s.lending > 0) {
            s.lending -= 1;
            // A failed record leaves the free uncovered: a later borrow
            // covers it then (`order_after`), later than it could have.
            let _ = s.fences.cover(gpu, s.raw, stamp);
        }
        self.release_tagged(placed, Freed::by(slot, stamp));
    }
}
