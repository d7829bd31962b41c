//! [`KeptGraphMemory`]: the allocations a capture made and did not free,
//! which a user holds past the capture, and who frees each of their
//! replays' instances on the device.
//!
//! An allocation queued on a capturing stream is a graph memory node
//! (CUDA's): every replay of the graph allocates it again, at the address
//! the capture saw. When the capture also frees it, each replay frees it
//! too, and nobody else has anything to do. When it does not (the user
//! kept the block past the capture, allocated from another thread or
//! returned from the capturing closure), each replay leaves one live
//! instance behind that someone must free before the graph's next launch,
//! or the launch is refused (`CUDA_ERROR_INVALID_VALUE`), and destroying
//! the graph frees none of it. A user's block is freed once; the replays
//! make as many instances as there are launches, and before the first
//! launch there is none to free. So the rule, kept here for every pool
//! stream's captures:
//!
//! - **While the graph lives, the graph frees the instances.** The user's
//!   free frees nothing on the device: the block becomes the graph's (its
//!   bytes count in the graph's tally), and the instance of the last replay,
//!   if any, is freed by the graph's next launch, just before it, or by the
//!   release of the graph's memory, behind its last replay. A launch is
//!   refused while a kept block the user still holds has a live instance
//!   (the driver would refuse it too: that block holds the last replay's
//!   output until it is dropped).
//! - **Once the graph is gone, the user frees the instance**: an ordinary
//!   free when a replay left one (after the stream of that replay, which
//!   wrote it), nothing on the device when none did.
//!
//! A block allocated outside the capture and freed on a capturing stream
//! (by any thread: the capture takes whatever is queued on its stream) is
//! the mirror case: a free node of the graph would free it at every replay,
//! from the second on the memory of whatever was allocated there since. The
//! graph adopts it instead: nothing is queued in the capture, the replays
//! may use it up to that free, and the release of the graph frees it once,
//! behind the last replay, after the block's own stream and its recorded
//! uses on other streams.
//!
//! Every instance is freed exactly once, whatever thread allocated the block
//! and whenever it is dropped. The frees are ordered: the instance free
//! before a launch waits for the end of the stream of the launch before
//! (the replay that made the instance) and for the streams on which users
//! freed kept blocks (where their uses on other streams were waited for).
//!
//! # State
//!
//! Per capture with a kept allocation, or launched: the kept blocks
//! (address, whether a user still holds it, whether a replay left it
//! live), the adopted blocks (address, stream, use events), the stream of
//! the last launch (which a cache asks for the ranges it handed out in the
//! capture: the replays write them), the streams the next instance free
//! must follow, and whether the graph is gone.
//!
//! # Who changes it
//!
//! The stream-ordered resource adds an entry when it allocates on a
//! capturing stream, drops it when the block is freed in its capture,
//! adopts a block from outside a capture freed in it, and settles the
//! user's free and the release of the graph; the crate's graph
//! ([`CapturedGraph`](crate::CapturedGraph)) reports each launch;
//! a cache reads the last launch's stream. All under one mutex, taken
//! before any shard lock of the resource (a cache reads it under its own
//! shard's lock: nothing that holds it calls up into a cache) and never
//! across a driver call that blocks. Launches through the raw seam
//! ([`Gpu::graph_launch`]) are not seen: their caller frees what such a
//! launch leaves behind.
//!
//! # Failure
//!
//! A user's free changes the ledger only once it is done
//! ([`KeptGuard::settle`]); a refused launch changes nothing; an instance
//! whose free failed stays live in the ledger, with the streams its free
//! must follow, for the next launch or release.
//!
//! # Bounded
//!
//! One entry per kept allocation of a capture whose graph lives or whose
//! block a user still holds, and one per launched graph until its release;
//! all end.

#![allow(unsafe_code)]

use std::collections::HashMap;

use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, Gpu, RawEvent};
use crate::types::{RawStream, StreamId};
use crate::util::sync::{Mutex, MutexGuard};

/// One allocation a capture made and did not free.
#[derive(Debug)]
struct Kept {
    ptr: u64,
    /// A user still holds the block.
    held: bool,
    /// A replay left an instance that is not freed yet.
    live: bool,
}

/// A block allocated outside a capture and freed on one of its streams:
/// the graph's until its release (its replays may use it up to that free),
/// then freed on the device once.
#[derive(Debug)]
pub(crate) struct Adopted {
    pub(crate) ptr: u64,
    /// The block's stream, whose work before the capture the free follows.
    pub(crate) stream: StreamId,
    /// Its recorded uses on other streams, which the free waits for (the
    /// stream-ordered resource's events, given back after).
    pub(crate) events: Vec<RawEvent>,
}

/// The kept allocations of one capture.
#[derive(Debug, Default)]
struct Capture {
    kept: Vec<Kept>,
    /// Blocks from outside the capture freed in it.
    adopted: Vec<Adopted>,
    /// The stream of the last launch, once there was one.
    last_launch: Option<StreamId>,
    /// Streams whose current end the next instance free must follow.
    follow: Vec<StreamId>,
    /// The graph is gone (destroyed, or the capture made none).
    gone: bool,
}

/// What a user's free of a kept block does (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeptFree {
    /// The graph lives: nothing on the device; the block is the graph's.
    ToGraph,
    /// The graph is gone and a replay left an instance: an ordinary free.
    Ordinary,
    /// The graph is gone and no replay left an instance: nothing to free.
    Nothing,
}

/// The instance frees a launch or a release must queue first.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct InstanceFrees {
    /// Addresses whose instance to free.
    pub(crate) ptrs: Vec<u64>,
    /// Streams whose current end those frees must follow.
    pub(crate) follow: Vec<StreamId>,
}

/// The kept allocations of the captures on one pool's streams; see the
/// module docs.
#[derive(Debug)]
pub(crate) struct KeptGraphMemory {
    // Guards the map; see "Who changes it". Behind the loom switch with
    // the rest of the resource layer's state (`crate::util::sync`).
    captures: Mutex<HashMap<CaptureId, Capture>>,
}

impl Default for KeptGraphMemory {
    fn default() -> Self {
        KeptGraphMemory {
            captures: Mutex::new(HashMap::new()),
        }
    }
}

/// The ledger, locked.
pub(crate) struct KeptGuard<'a>(MutexGuard<'a, HashMap<CaptureId, Capture>>);

impl KeptGraphMemory {
    /// Locks the ledger (before any shard lock).
    pub(crate) fn lock(&self) -> KeptGuard<'_> {
        KeptGuard(self.captures.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl KeptGuard<'_> {
    /// `capture` allocated `ptr`; a user holds it.
    pub(crate) fn allocated(&mut self, capture: CaptureId, ptr: u64) {
        self.0.entry(capture).or_default().kept.push(Kept {
            ptr,
            held: true,
            live: false,
        });
    }

    /// Whether the allocation `ptr` of `capture` has memory behind it now:
    /// a replay left an instance that is not freed yet.
    pub(crate) fn backed(&self, capture: CaptureId, ptr: u64) -> bool {
        self.0
            .get(&capture)
            .is_some_and(|c| c.kept.iter().any(|k| k.ptr == ptr && k.live))
    }

    /// `capture` freed `ptr` itself: every replay frees it.
    pub(crate) fn freed_in_capture(&mut self, capture: CaptureId, ptr: u64) {
        if let Some(c) = self.0.get_mut(&capture) {
            c.kept.retain(|k| k.ptr != ptr);
            if c.kept.is_empty() && c.adopted.is_empty() {
                self.0.remove(&capture);
            }
        }
    }

    /// What the user's free of `ptr`, kept by `capture`, must do. Changes
    /// nothing: [`settle`](Self::settle) does, once the free is done.
    pub(crate) fn user_free(&self, capture: CaptureId, ptr: u64) -> KeptFree {
        let Some(c) = self.0.get(&capture) else {
            // Never registered or already settled: the capture is long
            // gone, and so is anything a replay made.
            return KeptFree::Nothing;
        };
        let live = c.kept.iter().any(|k| k.ptr == ptr && k.live);
        match (c.gone, live) {
            (false, _) => KeptFree::ToGraph,
            (true, true) => KeptFree::Ordinary,
            (true, false) => KeptFree::Nothing,
        }
    }

    /// The stream of the last launch of `capture`'s graph, whose replay
    /// made the live instances: an ordinary free of one follows it.
    pub(crate) fn last_launch(&self, capture: CaptureId) -> Option<StreamId> {
        self.0.get(&capture).and_then(|c| c.last_launch)
    }

    /// The user's free of `ptr` is done, as `how` said; `stream` is the
    /// stream it was ordered on (where the uses of the block on other
    /// streams were waited for).
    pub(crate) fn settle(&mut self, capture: CaptureId, ptr: u64, how: KeptFree, stream: StreamId) {
        let Some(c) = self.0.get_mut(&capture) else {
            return;
        };
        match how {
            KeptFree::ToGraph => {
                if let Some(k) = c.kept.iter_mut().find(|k| k.ptr == ptr) {
                    k.held = false;
                }
                if !c.follow.contains(&stream) {
                    c.follow.push(stream);
                }
            }
            KeptFree::Ordinary | KeptFree::Nothing => {
                c.kept.retain(|k| k.ptr != ptr);
                if c.kept.is_empty() && c.adopted.is_empty() {
                    self.0.remove(&capture);
                }
            }
        }
    }

    /// Before a launch of `capture`'s graph: `Err(ptr)` when a kept block a
    /// user holds is still live from the last replay (the launch would be
    /// refused; nothing changes); else the instances nobody holds, to be
    /// freed before the launch, and the streams those frees must follow.
    pub(crate) fn before_launch(&self, capture: CaptureId) -> Result<InstanceFrees, u64> {
        let Some(c) = self.0.get(&capture) else {
            return Ok(InstanceFrees::default());
        };
        if let Some(k) = c.kept.iter().find(|k| k.held && k.live) {
            return Err(k.ptr);
        }
        Ok(Self::unheld_live(c))
    }

    /// The instances of `c` nobody holds, and what their frees follow.
    fn unheld_live(c: &Capture) -> InstanceFrees {
        let ptrs: Vec<u64> = c
            .kept
            .iter()
            .filter(|k| !k.held && k.live)
            .map(|k| k.ptr)
            .collect();
        if ptrs.is_empty() {
            return InstanceFrees::default();
        }
        let mut follow = c.follow.clone();
        if let Some(last) = c.last_launch
            && !follow.contains(&last)
        {
            follow.push(last);
        }
        InstanceFrees { ptrs, follow }
    }

    /// The frees [`before_launch`](Self::before_launch) returned are queued:
    /// those instances are gone.
    pub(crate) fn instances_freed(&mut self, capture: CaptureId, ptrs: &[u64]) {
        if let Some(c) = self.0.get_mut(&capture) {
            for k in c.kept.iter_mut().filter(|k| ptrs.contains(&k.ptr)) {
                k.live = false;
            }
            // Kept while an instance is left to free (a free failed part
            // way): its free still follows those streams.
            if !c.kept.iter().any(|k| !k.held && k.live) {
                c.follow.clear();
            }
        }
    }

    /// `capture`'s graph was launched on `stream`: every kept block has a
    /// live instance again. Recorded for every capture, kept blocks or
    /// not: a cache asks where the last replay ran for the ranges it handed
    /// out in the capture (the replays write them).
    pub(crate) fn launched(&mut self, capture: CaptureId, stream: StreamId) {
        let c = self.0.entry(capture).or_default();
        for k in &mut c.kept {
            k.live = true;
        }
        c.last_launch = Some(stream);
    }

    /// `capture`'s graph is gone: the blocks users hold are theirs to free
    /// from now on; returns the instances nobody holds, which the caller
    /// frees behind the last replay, then [`forgets`](Self::forget) (a later
    /// release returns those it could not free).
    pub(crate) fn release(&mut self, capture: CaptureId) -> InstanceFrees {
        let Some(c) = self.0.get_mut(&capture) else {
            return InstanceFrees::default();
        };
        c.gone = true;
        let frees = Self::unheld_live(c);
        c.kept.retain(|k| k.held || k.live);
        if c.kept.is_empty() && c.adopted.is_empty() {
            self.0.remove(&capture);
        }
        frees
    }

    /// `capture` freed `adopted`, a block allocated outside it: the graph's
    /// until its release.
    pub(crate) fn adopt(&mut self, capture: CaptureId, adopted: Adopted) {
        self.0.entry(capture).or_default().adopted.push(adopted);
    }

    /// The blocks `capture` adopted, to free at its release (the caller
    /// hands back with [`readopt`](Self::readopt) those it could not).
    pub(crate) fn take_adopted(&mut self, capture: CaptureId) -> Vec<Adopted> {
        let Some(c) = self.0.get_mut(&capture) else {
            return Vec::new();
        };
        let adopted = std::mem::take(&mut c.adopted);
        if c.kept.is_empty() {
            self.0.remove(&capture);
        }
        adopted
    }

    /// Hands back adopted blocks a release could not free yet.
    pub(crate) fn readopt(&mut self, capture: CaptureId, adopted: Vec<Adopted>) {
        if !adopted.is_empty() {
            self.0.entry(capture).or_default().adopted.extend(adopted);
        }
    }

    /// The instances `ptrs` of the gone graph of `capture` are freed.
    pub(crate) fn forget(&mut self, capture: CaptureId, ptrs: &[u64]) {
        if let Some(c) = self.0.get_mut(&capture) {
            c.kept.retain(|k| k.held || !ptrs.contains(&k.ptr));
            if c.kept.is_empty() && c.adopted.is_empty() {
                self.0.remove(&capture);
            }
        }
    }
}

/// Queues on `on` the frees of the instances `frees` names, after the end
/// of every stream they must follow (one event each, made and destroyed
/// here: this runs once per launch or release of a graph with kept blocks
/// nobody holds). Returns how many frees were queued, in order, and the
/// first error (nothing is queued after it).
///
/// `raw` resolves a stream of the pool (`StreamPool::raw`).
///
/// # Safety
/// 1. `raw` resolves streams of `gpu`'s pool, alive;
/// 2. every address of `frees` is a live instance of a graph allocation of
///    `gpu` that nothing uses after the streams in `frees.follow` and the
///    work already queued on `on`.
pub(crate) unsafe fn free_instances<G: Gpu + ?Sized>(
    gpu: &G,
    raw: impl Fn(StreamId) -> ResourceResult<RawStream>,
    on: StreamId,
    frees: &InstanceFrees,
) -> (usize, ResourceResult<()>) {
    let ordered = (|| {
        let stream_on = raw(on)?;
        for &stream in frees.follow.iter().filter(|&&s| s != on) {
            let earlier = raw(stream)?;
            let event = gpu.event_create().map_err(ResourceError::from)?;
            // SAFETY: `event` was just made on `gpu`; `earlier` and
            // `stream_on` are streams of its pool (Safety 1). A wait keeps the record
            // it saw, so the event may be destroyed once the wait is queued.
            let queued = unsafe { gpu.event_record(event, earlier) }
                .and_then(|()| unsafe { gpu.stream_wait_event(stream_on, event) });
            // SAFETY: as above; not used after this.
            let _ = unsafe { gpu.event_destroy(event) };
            queued.map_err(ResourceError::from)?;
        }
        Ok(stream_on)
    })();
    let stream_on = match ordered {
        Ok(raw) => raw,
        Err(e) => return (0, Err(e)),
    };
    for (done, &ptr) in frees.ptrs.iter().enumerate() {
        // SAFETY: `ptr` is a live instance nothing uses after what `raw`
        // now waits for (Safety 2); `stream_on` is a stream of `gpu`
        // (Safety 1).
        if let Err(e) = unsafe { gpu.free_async(ptr, stream_on) } {
            return (done, Err(e.for_request(0, on)));
        }
    }
    (frees.ptrs.len(), Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u32) -> StreamId {
        StreamId::new(0, i)
    }

    #[test]
    fn a_block_dropped_between_replays_is_freed_by_the_next_launch() {
        let ledger = KeptGraphMemory::default();
        let c = CaptureId::new(1);
        let mut g = ledger.lock();
        g.allocated(c, 0x1000);
        assert_eq!(g.before_launch(c), Ok(InstanceFrees::default()));
        g.launched(c, s(0));
        assert_eq!(g.before_launch(c), Err(0x1000), "held and live");
        assert_eq!(g.user_free(c, 0x1000), KeptFree::ToGraph);
        g.settle(c, 0x1000, KeptFree::ToGraph, s(2));
        let frees = g.before_launch(c).unwrap();
        assert_eq!(frees.ptrs, [0x1000]);
        assert_eq!(frees.follow, [s(2), s(0)]);
        g.instances_freed(c, &frees.ptrs);
        g.launched(c, s(1));
        let frees = g.release(c);
        assert_eq!((&frees.ptrs, &frees.follow), (&vec![0x1000], &vec![s(1)]));
        assert_eq!(g.release(c), frees, "returned again until forgotten");
        g.forget(c, &frees.ptrs);
        assert!(g.0.is_empty(), "{:?}", g.0);
    }

    #[test]
    fn after_the_graph_the_user_frees_what_a_replay_left() {
        let ledger = KeptGraphMemory::default();
        let (c, d) = (CaptureId::new(1), CaptureId::new(2));
        let mut g = ledger.lock();
        g.allocated(c, 0x1000);
        g.launched(c, s(0));
        g.allocated(d, 0x2000);
        assert_eq!(g.release(c), InstanceFrees::default(), "held");
        assert_eq!(g.release(d), InstanceFrees::default());
        assert_eq!(g.user_free(c, 0x1000), KeptFree::Ordinary);
        assert_eq!(g.user_free(d, 0x2000), KeptFree::Nothing, "never ran");
        g.settle(c, 0x1000, KeptFree::Ordinary, s(0));
        g.settle(d, 0x2000, KeptFree::Nothing, s(0));
        assert!(g.0.is_empty(), "{:?}", g.0);
    }

    #[test]
    fn a_block_freed_in_its_capture_is_forgotten() {
        let ledger = KeptGraphMemory::default();
        let c = CaptureId::new(1);
        let mut g = ledger.lock();
        g.allocated(c, 0x1000);
        g.freed_in_capture(c, 0x1000);
        assert!(g.0.is_empty());
        assert_eq!(g.before_launch(c), Ok(InstanceFrees::default()));
    }
}
