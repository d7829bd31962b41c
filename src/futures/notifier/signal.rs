//! The part of a notifier that host functions touch: the points' state
//! under one lock ([`SignalState`]), its lock-free mirror for polls
//! ([`Signal`]), and the delivery of a landed notification
//! ([`Signal::deliver`]). Plain memory, no GPU handles: a host function
//! calls into it from the driver's thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;

use crate::error::ResourceError;
use crate::futures::kick::Kick;
use crate::futures::points::Points;
use crate::gpu::RawEvent;
use crate::util::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};

/// Where the stream's one notification is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flight {
    /// None queued.
    Idle,
    /// A thread is queuing one (its event is not recorded yet: the fallback
    /// must not query it).
    Launching,
    /// Queued; it covers every point up to the sequence number, and the
    /// lane waits on the event (the notifier's own, or the newest point's).
    Queued(u64, RawEvent),
}

/// In declaration order (`repr(C)`): what every new point touches first,
/// so that it shares the lock word's cache line and the next one. A point
/// is usually made right after a driver call that evicted all of this.
#[derive(Debug)]
#[repr(C)]
pub(super) struct SignalState {
    pub(super) next_seq: u64,
    pub(super) spare: Vec<RawEvent>,
    /// The newest point with its own recorded event: one query of it can
    /// settle every point of the stream at once.
    pub(super) frontier: Option<(u64, RawEvent)>,
    pub(super) points: Points,
    /// A parked point asked for a notification since the last launch
    /// (points still querying, or never polled, do not need one).
    pub(super) wanted: bool,
    pub(super) reached: u64,
    /// The newest point the host must see reached though no future waits
    /// on it (a pinned host block a copy used): notifications go on until
    /// one covers it.
    pub(super) watched: u64,
    pub(super) flight: Flight,
    pub(super) frees: VecDeque<(u64, u64)>,
    pub(super) reap_to: u64,
    pub(super) launches: u64,
    /// The observed point at which the last query of the frontier said "not
    /// yet" (0: none did).
    pub(super) frontier_missed_at: u64,
    pub(super) frontier_queries: u64,
    pub(super) parks: u64,
    /// Notifications that could not be queued in a row (their event could
    /// not be recorded); after [`RECORD_RETRIES`] the stream is failed.
    pub(super) record_failures: u32,
    /// The stream's error once its device failed: nothing it waits for will
    /// be reported any more.
    pub(super) failed: Option<ResourceError>,
}

/// Failed records of a notification's event in a row before the stream's
/// waiters fail: one failed call is retried (by the watchdog), a dead
/// device fails every try.
pub(super) const RECORD_RETRIES: u32 = 3;

/// A query of the frontier is tried only when it would settle at least this
/// many points, and again only this many points after one that missed: in
/// a pipeline that keeps the stream busy it mostly misses, and each query
/// takes the driver's locks.
pub(super) const FRONTIER_GAP: u64 = 8;

/// Points kept behind an unsettled one before a notification is asked for
/// them.
const LONG_SPAN: usize = 4096;

impl SignalState {
    /// The stream reached `covered`: settles the points and frees at or
    /// below it. Returns whether anything is left for a notification.
    pub(super) fn reach(&mut self, covered: u64, wake: &mut Vec<Waker>) -> bool {
        if covered > self.reached {
            self.reached = covered;
            self.points.reach(covered, wake);
            while let Some(&(point, free_seq)) = self.frees.front() {
                if point > covered {
                    break;
                }
                self.frees.pop_front();
                self.reap_to = self.reap_to.max(free_seq);
            }
            // Whoever asked was covered, unless a point is left.
            if !self.points.any_pending() {
                self.wanted = false;
            }
        }
        self.reap_to > 0 || self.wanted || !self.frees.is_empty() || self.watched > self.reached
    }

    /// A notification for every point made so far: it covers the newest,
    /// and waits on that point's own event when it has one (else the
    /// notifier records its own). Nothing stays wanted.
    pub(super) fn cover_end(&mut self) -> (u64, Option<RawEvent>) {
        self.wanted = false;
        // When the newest point has its own recorded event, the lane waits
        // on that one: no call on the user's stream from this thread, which
        // may not be the one submitting to it. (A wait binds to the event's
        // latest record at the call; a recycled event is only re-recorded
        // later on this stream, so it can only cover more.)
        let newest = self
            .frontier
            .filter(|&(f, _)| f == self.next_seq)
            .map(|(_, e)| e);
        (self.next_seq, newest)
    }

    /// A new point. When the points since the oldest pending one grow past
    /// [`LONG_SPAN`] (that one is never polled while later ones are made
    /// and dropped), a notification is wanted: it settles them all, so the
    /// ring cannot grow without bound. Returns the point and whether the
    /// dispatcher must be kicked for that.
    pub(super) fn mark(&mut self) -> (u64, bool) {
        self.next_seq += 1;
        self.points.push(self.next_seq);
        let long = self.points.span() > LONG_SPAN && !self.wanted;
        if long {
            self.wanted = true;
        }
        (self.next_seq, long)
    }
}

/// The part of a notifier that host functions touch: plain memory, no GPU
/// handles.
#[derive(Debug)]
pub(crate) struct Signal {
    pub(super) state: Mutex<SignalState>,
    /// Every point below it is settled: a copy of the points' base,
    /// published when the lock is released, so that a poll can tell
    /// "settled", "behind a pending point" and "the stream's oldest pending
    /// point" without the lock (the submitting thread takes it for every
    /// new point).
    pub(super) settled_below: AtomicU64,
    /// Every point at or below it was seen reached by the host (a
    /// delivered notification, a queried event): `SignalState::reached`,
    /// published when the lock is released. Unlike `settled_below`, which
    /// also moves past points whose owners let go, this is a proof.
    pub(super) reached: AtomicU64,
    /// A point failed: the copy above no longer says "done" for everything
    /// below it, so polls take the lock. Stored before `settled_below`.
    pub(super) any_failed: AtomicBool,
    /// The stream failed (`SignalState::failed` is set): read without the
    /// lock by every waiting allocation's poll.
    pub(super) dead: AtomicBool,
    /// The last sequence number handed out (`SignalState::next_seq`),
    /// published when the lock is released: a query that finds the stream
    /// idle after reading it settles every point up to it (their work was
    /// queued before they were marked), without the lock.
    pub(super) marked: AtomicU64,
    pub(super) kick: Arc<Kick>,
}

/// The state lock; releasing it publishes the points' base (see
/// [`Signal::settled_below`]).
pub(super) struct StateGuard<'a> {
    state: MutexGuard<'a, SignalState>,
    signal: &'a Signal,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = SignalState;
    fn deref(&self) -> &SignalState {
        &self.state
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut SignalState {
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if self.state.points.any_failed() && !self.signal.any_failed.load(Ordering::Relaxed) {
            self.signal.any_failed.store(true, Ordering::Release);
        }
        let base = self.state.points.base();
        if self.signal.settled_below.load(Ordering::Relaxed) != base {
            self.signal.settled_below.store(base, Ordering::Release);
        }
        let reached = self.state.reached;
        if self.signal.reached.load(Ordering::Relaxed) != reached {
            self.signal.reached.store(reached, Ordering::Release);
        }
        let marked = self.state.next_seq;
        if self.signal.marked.load(Ordering::Relaxed) != marked {
            self.signal.marked.store(marked, Ordering::Release);
        }
    }
}

impl Signal {
    /// A signal with no point made yet, kicking `kick` when a landing leaves
    /// work for the dispatcher.
    pub(super) fn new(kick: Arc<Kick>) -> Self {
        Signal {
            settled_below: AtomicU64::new(Points::default().base()),
            reached: AtomicU64::new(0),
            any_failed: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            marked: AtomicU64::new(0),
            state: Mutex::new(SignalState {
                next_seq: 0,
                reached: 0,
                watched: 0,
                flight: Flight::Idle,
                points: Points::default(),
                frees: VecDeque::new(),
                reap_to: 0,
                wanted: false,
                launches: 0,
                spare: Vec::new(),
                frontier: None,
                frontier_missed_at: 0,
                frontier_queries: 0,
                parks: 0,
                record_failures: 0,
                failed: None,
            }),
            kick,
        }
    }

    pub(super) fn lock(&self) -> StateGuard<'_> {
        StateGuard {
            state: self.state.lock().unwrap_or_else(|p| p.into_inner()),
            signal: self,
        }
    }

    /// The stream reached `covered`: settles every point at or below it and
    /// wakes the parked ones after unlocking. Safe to call from a host
    /// function; a stale or repeated delivery is a no-op.
    pub(crate) fn deliver(&self, covered: u64) {
        let mut wake = Vec::new();
        let more = {
            let mut st = self.lock();
            if let Flight::Queued(c, _) = st.flight
                && c <= covered
            {
                st.flight = Flight::Idle;
            }
            st.reach(covered, &mut wake)
        };
        wake.into_iter().for_each(Waker::wake);
        if more {
            self.kick.dispatch();
        }
    }
}
