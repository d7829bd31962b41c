//! Per-stream coalesced completion notifications.
//!
//! # State (one [`Notifier`] per user stream)
//!
//! - `next_seq`: the last **sequence number** handed out. Every awaited point
//!   and every free queued through the futures layer takes the next one
//!   ([`mark`](Notifier::mark), [`mark_free`](Notifier::mark_free)), *after*
//!   its GPU work was queued.
//! - `reached`: every point at or below it is known done.
//! - `points`: the [points](super::points) not yet settled, in a ring;
//!   `frees`: `(point, free sequence number of the inner resource)` pairs for
//!   the frees not yet known executed; `reap_to`: the free sequence number
//!   through which frees are known executed but not yet applied to the
//!   accounting.
//! - `flight`: at most **one notification in flight** per stream; `wanted`:
//!   a parked point asked for one since the last launch. Points that are
//!   still querying their own event (or were never polled) do not cause a
//!   host function. `watched`: the newest point the host must see reached
//!   with no future on it ([`watch`](Notifier::watch), a pinned host
//!   block's copy): notifications go on until one covers it.
//! - `spare`: events for new points, reused (no driver call to create one
//!   after warm-up, no lock other than this one).
//!
//! # Who adds, who drains
//!
//! Futures and frees add points. [`launch`](Notifier::launch) (called from
//! a future's poll, a free, or the dispatcher, never from a host function)
//! picks what the notification covers: the oldest parked point that
//! registered its own event (a future notified at its own point), unless a
//! query finds it reached already; else `covered = next_seq`, with the
//! event of the point `covered` if it has one (already recorded by whoever
//! made that point) or else the notifier's own event recorded on the user
//! stream. It makes the **notifier lane** (a stream of its own) wait on
//! that event, and queues a host function on the lane. The user's stream never runs the host
//! function, so it is not stalled by it, and each user stream has its own
//! lane, so a slow stream never holds back a fast one's notifications.
//!
//! When the host function runs it calls [`Signal::deliver`]`(covered)`: under
//! the lock it cuts every waiter at or below `covered` off in one
//! `split_off` (and the frees likewise), then wakes them after unlocking. It
//! makes no driver call and drops nothing that owns GPU state. If more is
//! pending it kicks the dispatcher (through the [`Kick`] it was given: the
//! notifier does not know who dispatches), which queues the next
//! notification.
//!
//! Any point marked after `covered` was read is left for the next
//! notification; a point marked before it had its work queued before the
//! event was recorded, so the event covers it.
//!
//! # Failure
//!
//! If recording the event fails, every waiter of the stream fails with the
//! driver error. If queuing the wait or the host function fails, or a device
//! fault means the host function will never be called, the
//! [watchdog](super::watchdog) queries the recorded event while anything is
//! pending: done delivers, an error fails every waiter.

#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;

use super::kick::Kick;
use super::points::Points;
use super::wait_stats::{Tally, WaitStats};
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureStatus, Gpu, RawEvent, RawStream};
use crate::types::StreamId;
use crate::util::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};

/// Where the stream's one notification is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flight {
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
struct SignalState {
    next_seq: u64,
    spare: Vec<RawEvent>,
    /// The newest point with its own recorded event: one query of it can
    /// settle every point of the stream at once.
    frontier: Option<(u64, RawEvent)>,
    points: Points,
    /// A parked point asked for a notification since the last launch
    /// (points still querying, or never polled, do not need one).
    wanted: bool,
    reached: u64,
    /// The newest point the host must see reached though no future waits
    /// on it (a pinned host block a copy used): notifications go on until
    /// one covers it.
    watched: u64,
    flight: Flight,
    frees: VecDeque<(u64, u64)>,
    reap_to: u64,
    launches: u64,
    /// The observed point at which the last query of the frontier said "not
    /// yet" (0: none did).
    frontier_missed_at: u64,
    frontier_queries: u64,
    parks: u64,
    /// Notifications that could not be queued in a row (their event could
    /// not be recorded); after [`RECORD_RETRIES`] the stream is failed.
    record_failures: u32,
    /// The stream's error once its device failed: nothing it waits for will
    /// be reported any more.
    failed: Option<ResourceError>,
}

/// Failed records of a notification's event in a row before the stream's
/// waiters fail: one failed call is retried (by the watchdog), a dead
/// device fails every try.
const RECORD_RETRIES: u32 = 3;

/// A query of the frontier is tried only when it would settle at least this
/// many points, and again only this many points after one that missed: in
/// a pipeline that keeps the stream busy it mostly misses, and each query
/// takes the driver's locks.
const FRONTIER_GAP: u64 = 8;

/// Points kept behind an unsettled one before a notification is asked for
/// them.
const LONG_SPAN: usize = 4096;

impl SignalState {
    /// The stream reached `covered`: settles the points and frees at or
    /// below it. Returns whether anything is left for a notification.
    fn reach(&mut self, covered: u64, wake: &mut Vec<Waker>) -> bool {
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
    fn cover_end(&mut self) -> (u64, Option<RawEvent>) {
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
    fn mark(&mut self) -> (u64, bool) {
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
    state: Mutex<SignalState>,
    /// Every point below it is settled: a copy of the points' base,
    /// published when the lock is released, so that a poll can tell
    /// "settled", "behind a pending point" and "the stream's oldest pending
    /// point" without the lock (the submitting thread takes it for every
    /// new point).
    settled_below: AtomicU64,
    /// Every point at or below it was seen reached by the host (a
    /// delivered notification, a queried event): `SignalState::reached`,
    /// published when the lock is released. Unlike `settled_below`, which
    /// also moves past points whose owners let go, this is a proof.
    reached: AtomicU64,
    /// A point failed: the copy above no longer says "done" for everything
    /// below it, so polls take the lock. Stored before `settled_below`.
    any_failed: AtomicBool,
    /// The stream failed (`SignalState::failed` is set): read without the
    /// lock by every waiting allocation's poll.
    dead: AtomicBool,
    /// The last sequence number handed out (`SignalState::next_seq`),
    /// published when the lock is released: a query that finds the stream
    /// idle after reading it settles every point up to it (their work was
    /// queued before they were marked), without the lock.
    marked: AtomicU64,
    kick: Arc<Kick>,
}

/// The state lock; releasing it publishes the points' base (see
/// [`Signal::settled_below`]).
struct StateGuard<'a> {
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
    fn lock(&self) -> StateGuard<'_> {
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

/// Completion notifications of one user stream. See the [module
/// documentation](self).
#[derive(Debug)]
pub(crate) struct Notifier {
    pub(crate) stream: StreamId,
    user: RawStream,
    /// The stream host functions run on: our own, or `user` when the backend
    /// cannot create streams.
    lane: RawStream,
    owns_lane: bool,
    /// Recorded on `user` for each notification; only re-recorded once the
    /// previous notification landed, so the lane's queued wait is never
    /// redirected.
    event: RawEvent,
    signal: Arc<Signal>,
    /// Highest inner free sequence number reaped through, by any path.
    reaped: AtomicU64,
    /// Held by a reap of the stream from its drain until it noted the drain
    /// (history included): see [`reaping`](Self::reaping).
    reaping: Mutex<()>,
    /// Highest inner free sequence number a point was marked for.
    marked_free: AtomicU64,
    /// What the stream's futures did, folded in as they end.
    pub(crate) tally: Tally,
}

impl Notifier {
    /// A notifier for `stream` (backend handle `user`).
    pub(crate) fn new(
        gpu: &dyn Gpu,
        stream: StreamId,
        user: RawStream,
        kick: Arc<Kick>,
    ) -> Result<Self, ResourceError> {
        let event = gpu.event_create().map_err(ResourceError::from)?;
        let (lane, owns_lane) = match gpu.create_stream() {
            Ok(lane) => (lane, true),
            Err(e) => {
                tracing::warn!(%stream, error = %e,
                    "no notifier stream: host functions will run on the user stream");
                (user, false)
            }
        };
        Ok(Notifier::with_handles(
            stream,
            (user, lane, owns_lane),
            event,
            kick,
        ))
    }

    /// A notifier over handles already made: `(user, lane, owns_lane)` and
    /// the notification event.
    fn with_handles(
        stream: StreamId,
        (user, lane, owns_lane): (RawStream, RawStream, bool),
        event: RawEvent,
        kick: Arc<Kick>,
    ) -> Self {
        Notifier {
            stream,
            user,
            lane,
            owns_lane,
            event,
            reaping: Mutex::new(()),
            signal: Arc::new(Signal {
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
            }),
            reaped: AtomicU64::new(0),
            marked_free: AtomicU64::new(0),
            tally: Tally::default(),
        }
    }

    /// The backend handle of the user stream.
    pub(crate) fn user_stream(&self) -> RawStream {
        self.user
    }

    /// Refuses a completion point while the user stream is being captured
    /// into a graph: its event would be a captured record, which can never
    /// be queried (`CUDA_ERROR_CAPTURED_EVENT`, and the capture is
    /// invalidated), and a notification waiting on it would pull the lane
    /// into the capture. One `capture_status` call.
    ///
    /// # Errors
    /// [`ResourceError::StreamCapturing`]; a driver error asking.
    pub(crate) fn refuse_capturing(&self, gpu: &dyn Gpu) -> ResourceResult<()> {
        // SAFETY: `gpu` is this notifier's backend (every caller passes
        // `Core::gpu`); `self.user` is a stream of the pool `Core` holds,
        // which keeps it alive.
        match unsafe { gpu.capture_status(self.user) }.map_err(ResourceError::from)? {
            CaptureStatus::None => Ok(()),
            status => Err(ResourceError::StreamCapturing {
                stream: self.stream,
                capture: status.id(),
            }),
        }
    }

    /// A new point at the current end of the stream (call after queuing the
    /// work it stands for).
    pub(crate) fn mark(&self) -> u64 {
        let (seq, long) = self.signal.lock().mark();
        self.kick_if(long);
        seq
    }

    fn kick_if(&self, long: bool) {
        if long {
            self.signal.kick.pending();
        }
    }

    /// The last sequence number handed out. Every point at or below it had
    /// its work queued before this returned it: a stream found idle
    /// afterwards has reached them all.
    pub(crate) fn marked(&self) -> u64 {
        self.signal.marked.load(Ordering::Acquire)
    }

    /// A spare event for a point that records one late (`None` when there
    /// is none: the caller creates one).
    pub(crate) fn spare_event(&self) -> Option<RawEvent> {
        self.signal.lock().spare.pop()
    }

    /// Gives back an event taken with [`spare_event`](Self::spare_event)
    /// that was never recorded for a point.
    pub(crate) fn return_spare(&self, event: RawEvent) {
        self.signal.lock().spare.push(event);
    }

    /// [`mark`](Self::mark), also taking a spare event for the point (`None`
    /// when there is none: the caller creates one).
    pub(crate) fn mark_with_event(&self) -> (u64, Option<RawEvent>) {
        let (seq, long, event) = {
            let mut st = self.signal.lock();
            let event = st.spare.pop();
            let (seq, long) = st.mark();
            (seq, long, event)
        };
        self.kick_if(long);
        (seq, event)
    }

    /// A new point covering the inner resource's free `free_seq` (call after
    /// the free was queued). The free stays recorded when the point is
    /// released.
    pub(crate) fn mark_free(&self, free_seq: u64) -> u64 {
        self.marked_free.fetch_max(free_seq, Ordering::AcqRel);
        let (seq, long) = {
            let mut st = self.signal.lock();
            let (seq, long) = st.mark();
            st.frees.push_back((seq, free_seq));
            (seq, long)
        };
        self.kick_if(long);
        seq
    }

    /// [`mark_free`](Self::mark_free) for a free nobody awaits (an owned
    /// buffer's drop, an eviction, a cache giving a block back), unless a
    /// point covers `free_seq` already; whether it marked one. The point is
    /// released at once: the free stays queued until a notification covers
    /// it, and no one's future is held behind a point nobody queries.
    pub(crate) fn mark_free_if_new(&self, free_seq: u64) -> bool {
        if free_seq == 0 || self.marked_free.fetch_max(free_seq, Ordering::AcqRel) >= free_seq {
            return false;
        }
        let seq = self.mark_free(free_seq);
        self.release(seq, None);
        true
    }

    /// The outcome of point `seq` if it is settled, and otherwise whether an
    /// earlier point of the stream is pending too (then, by stream order,
    /// querying `seq` is wasted).
    ///
    /// For the point's owner only: a point let go of reads as settled with
    /// `Ok`, which says nothing about the GPU (see
    /// [`seen_reached`](Self::seen_reached) for a proof).
    pub(crate) fn check(&self, seq: u64) -> Result<ResourceResult<()>, bool> {
        // Without the lock while no point failed: the base is read first, so
        // a failure published before it is seen below.
        let base = self.signal.settled_below.load(Ordering::Acquire);
        if !self.signal.any_failed.load(Ordering::Acquire) {
            return match seq.cmp(&base) {
                std::cmp::Ordering::Less => Ok(Ok(())),
                // The point at the base is pending whenever one exists.
                std::cmp::Ordering::Greater => Err(true),
                std::cmp::Ordering::Equal => Err(false),
            };
        }
        let st = self.signal.lock();
        match st.points.outcome(seq) {
            Some(outcome) => Ok(outcome),
            None => Err(st.points.has_pending_before(seq)),
        }
    }

    /// Whether the host saw the stream reach point `seq`: a notification
    /// covering it was delivered, or an event recorded at or after it was
    /// queried done. The one proof that the work queued before `seq`
    /// completed. A point whose owner let go of it is settled (see
    /// [`check`](Self::check)) but proves nothing, and neither does a
    /// failed one.
    pub(crate) fn seen_reached(&self, seq: u64) -> bool {
        seq != 0 && seq <= self.signal.reached.load(Ordering::Acquire)
    }

    /// The outcome of point `seq` if it is settled.
    pub(crate) fn outcome(&self, seq: u64) -> Option<ResourceResult<()>> {
        self.signal.lock().points.outcome(seq)
    }

    /// Parks `waker` on point `seq` (whose own event, if it has one, is
    /// `event`), or returns its outcome if settled.
    pub(crate) fn register(
        &self,
        seq: u64,
        waker: &Waker,
        event: Option<RawEvent>,
    ) -> Option<ResourceResult<()>> {
        let mut st = self.signal.lock();
        let settled = st.points.register(seq, waker, event);
        if settled.is_none() {
            st.parks += 1;
        }
        settled
    }

    /// The event of point `seq` is recorded: it becomes the frontier.
    /// Events are only ever re-recorded on this stream, later, so a done
    /// query of the frontier's event proves its point reached even after the
    /// event was recycled.
    pub(crate) fn recorded(&self, seq: u64, event: RawEvent) {
        let mut st = self.signal.lock();
        if st.frontier.is_none_or(|(f, _)| f < seq) {
            st.frontier = Some((seq, event));
        }
    }

    /// Point `seq` is known reached (its own event said so): settles it and
    /// every earlier point, as a notification would. If a later point has
    /// an event, one more query of it may settle the rest of the stream.
    pub(crate) fn observe(&self, gpu: &dyn Gpu, seq: u64) {
        let mut wake = Vec::new();
        let (mut more, frontier) = {
            let mut st = self.signal.lock();
            let more = st.reach(seq, &mut wake);
            let missed_at = st.frontier_missed_at;
            let worth = |&(f, _): &(u64, RawEvent)| {
                f >= seq + FRONTIER_GAP && (missed_at == 0 || seq >= missed_at + FRONTIER_GAP)
            };
            (more, st.frontier.filter(worth))
        };
        if let Some((f, event)) = frontier {
            // SAFETY: `gpu` is the backend this notifier was made on (every
            // caller passes `Core::gpu`); the frontier event is one of its
            // points' events, which go back to `spare` and are destroyed only
            // by `release_handles`, when the `Core` owning this notifier drops.
            let done = unsafe { gpu.event_query(event) } == Ok(true);
            let mut st = self.signal.lock();
            st.frontier_queries += 1;
            if done {
                more = st.reach(f, &mut wake);
            } else {
                st.frontier_missed_at = seq;
            }
        }
        wake.into_iter().for_each(Waker::wake);
        if more {
            self.signal.kick.dispatch();
        }
    }

    /// The owner of point `seq` let go of it; its event, if any, goes back
    /// to the spares.
    pub(crate) fn release(&self, seq: u64, event: Option<RawEvent>) {
        let mut st = self.signal.lock();
        st.points.release(seq);
        st.spare.extend(event);
    }

    /// Whether anything waits on a notification of this stream (a parked
    /// point, one in flight, a free, or frees to apply).
    pub(crate) fn has_pending(&self) -> bool {
        let st = self.signal.lock();
        st.wanted
            || st.flight != Flight::Idle
            || !st.frees.is_empty()
            || st.reap_to > 0
            || st.watched > st.reached
    }

    /// Points not known reached (for diagnostics and tests).
    pub(crate) fn waiter_count(&self) -> usize {
        self.signal.lock().points.pending()
    }

    /// Notifications queued so far.
    pub(crate) fn launches(&self) -> u64 {
        self.signal.lock().launches
    }

    /// How this stream's futures waited so far.
    pub(crate) fn stats(&self) -> WaitStats {
        let (queries, spins, yields) = self.tally.read();
        let st = self.signal.lock();
        WaitStats {
            points: st.next_seq,
            queries,
            frontier_queries: st.frontier_queries,
            spins,
            yields,
            parks: st.parks,
            notifications: st.launches,
        }
    }

    /// Puts back a number [`take_reap`](Self::take_reap) returned, when
    /// applying it did not complete (a decorator's `reap_through` panicked):
    /// the next dispatch applies it again.
    pub(crate) fn restore_reap(&self, to: u64) {
        let mut st = self.signal.lock();
        st.reap_to = st.reap_to.max(to);
    }

    /// Takes the free sequence number through which frees are known done.
    pub(crate) fn take_reap(&self) -> Option<u64> {
        let mut st = self.signal.lock();
        let to = std::mem::take(&mut st.reap_to);
        (to > 0).then_some(to)
    }

    /// One reap of the stream at a time. A reap that drains nothing because
    /// another thread drained first must not report the frees done before
    /// that thread recorded them (a free's future resolving, then the
    /// history lacking its completion). The lock covers accounting only: no
    /// driver call is made under it.
    pub(crate) fn reaping(&self) -> MutexGuard<'_, ()> {
        // It guards no data: a reap that panicked leaves nothing half done.
        self.reaping.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that the inner resource was reaped through `free_seq`.
    pub(crate) fn note_reaped(&self, free_seq: u64) {
        self.reaped.fetch_max(free_seq, Ordering::AcqRel);
    }

    /// The stream's error, once its device failed.
    pub(crate) fn failure(&self) -> Option<ResourceError> {
        if !self.signal.dead.load(Ordering::Acquire) {
            return None;
        }
        self.signal.lock().failed.clone()
    }

    /// Asks the device whether it still works (one query of the notifier's
    /// own event); fails every waiter of the stream when it does not.
    /// Returns whether the stream failed.
    pub(crate) fn probe(&self, gpu: &dyn Gpu) -> bool {
        // SAFETY: `gpu` is this notifier's backend (every caller passes
        // `Core::gpu`); `self.event` was made on it by `new` and is
        // destroyed only by `release_handles`, when `Core` drops.
        match unsafe { gpu.event_query(self.event) } {
            Ok(_) => false,
            Err(e) => {
                self.fail_all(ResourceError::from(e));
                true
            }
        }
    }

    /// Highest inner free sequence number known reaped.
    pub(crate) fn reaped(&self) -> u64 {
        self.reaped.load(Ordering::Acquire)
    }

    /// A parked point needs a notification: queues one unless one is in
    /// flight (the landing one then has the next one queued).
    pub(crate) fn request(&self, gpu: &dyn Gpu) {
        self.queue(gpu, true);
    }

    /// The host must see point `seq` reached although no future waits on
    /// it (its owner let go of it): notifications are queued, one after
    /// another, until one covers it (a landing that leaves it uncovered
    /// kicks the dispatcher for the next).
    pub(crate) fn watch(&self, gpu: &dyn Gpu, seq: u64) {
        {
            let mut st = self.signal.lock();
            st.watched = st.watched.max(seq);
        }
        self.queue(gpu, false);
    }

    /// Queues a notification if none is in flight and a parked point, a
    /// free or a watched point needs one. Never called from a host
    /// function (it calls the driver).
    pub(crate) fn launch(&self, gpu: &dyn Gpu) {
        self.queue(gpu, false);
    }

    fn queue(&self, gpu: &dyn Gpu, want: bool) {
        let target = {
            let mut st = self.signal.lock();
            st.wanted |= want;
            let watching = st.watched > st.reached;
            if st.flight != Flight::Idle || (!st.wanted && st.frees.is_empty() && !watching) {
                return;
            }
            st.flight = Flight::Launching;
            st.launches += 1;
            // The oldest parked point with its own event, when it is not
            // the newest point: the notification waits on that event and
            // wakes it as soon as the stream reaches it, so that its task
            // sends its next work while the stream still runs what was
            // queued after it (a notification covering the stream's end
            // would hold every parked task until the stream drains). The
            // points parked after it stay wanted: the landing kicks the
            // next notification.
            match st
                .points
                .oldest_parked()
                .filter(|&(seq, _)| seq < st.next_seq)
            {
                Some((seq, event)) => {
                    st.wanted = st.points.parked_after(seq);
                    Ok((seq, event))
                }
                None => Err(st.cover_end()),
            }
        };
        let (covered, newest) = match target {
            Ok((seq, event)) => {
                // SAFETY: `gpu` is this notifier's backend (every caller
                // passes `Core::gpu`); a parked point's event is one of this
                // notifier's (made by `core.gpu`), destroyed only by
                // `release_handles`.
                if unsafe { gpu.event_query(event) } == Ok(true) {
                    // Already reached: the notifications lag behind the
                    // stream (many short waits). Settle it now and cover
                    // the stream's end, as one notification for them all.
                    let mut wake = Vec::new();
                    let end = {
                        let mut st = self.signal.lock();
                        st.reach(seq, &mut wake);
                        st.cover_end()
                    };
                    wake.into_iter().for_each(Waker::wake);
                    end
                } else {
                    (seq, Some(event))
                }
            }
            Err(end) => end,
        };
        let event = match newest {
            Some(e) => e,
            None => {
                // The event is recorded on the user stream: not while it is
                // captured (the record would be part of the graph, the lane
                // would join the capture, and the host function would be
                // refused or break it). The notification waits for the end
                // of the capture; the watchdog retries meanwhile.
                if self.user_capturing(gpu) {
                    let mut st = self.signal.lock();
                    st.flight = Flight::Idle;
                    // Whatever asked before still asks.
                    st.wanted = true;
                    st.launches -= 1;
                    drop(st);
                    self.signal.kick.pending();
                    return;
                }
                // SAFETY: `gpu` is this notifier's backend (every caller
                // passes `Core::gpu`); `self.event` was made on it by `new`
                // and is destroyed only by `release_handles`; `self.user` is
                // a stream of the pool `Core` holds, which keeps it alive.
                if let Err(e) = unsafe { gpu.event_record(self.event, self.user) } {
                    self.record_failed(ResourceError::from(e));
                    return;
                }
                self.event
            }
        };
        {
            let mut st = self.signal.lock();
            st.flight = Flight::Queued(covered, event);
            st.record_failures = 0;
        }
        if self.lane != self.user
            // SAFETY: `self.lane` was made by `gpu.create_stream` in `new`
            // and is destroyed only by `release_handles`; `event` is
            // `self.event` or a point's event of this notifier (see
            // `observe`), all live until then.
            && let Err(e) = unsafe { gpu.stream_wait_event(self.lane, event) }
        {
            // The event is recorded: the fallback query delivers it. (The
            // watchdog is told before the log line: a subscriber may panic.)
            self.signal.kick.pending();
            tracing::warn!(stream = %self.stream, error = %e, "notifier wait failed");
            return;
        }
        let signal = self.signal.clone();
        let deliver = Box::new(move || signal.deliver(covered));
        // SAFETY: `self.lane` is live until `release_handles` (see above), or
        // is the user stream, kept alive by the pool `Core` holds.
        if let Err(e) = unsafe { gpu.launch_host_fn(self.lane, deliver) } {
            self.signal.kick.pending();
            tracing::warn!(stream = %self.stream, error = %e, "notifier host function failed");
        }
    }

    /// Whether the user stream is inside a capture (an error asking counts
    /// as not: the record or query that follows reports it).
    pub(crate) fn user_capturing(&self, gpu: &dyn Gpu) -> bool {
        // SAFETY: as in `refuse_capturing`.
        unsafe { gpu.capture_status(self.user) }.is_ok_and(CaptureStatus::is_capturing)
    }

    /// The notification's event could not be recorded: nothing was queued.
    /// Once is retried by the watchdog (the frees and parked points stay,
    /// and a notification stays wanted); [`RECORD_RETRIES`] in a row fail
    /// the stream.
    fn record_failed(&self, error: ResourceError) {
        let give_up = {
            let mut st = self.signal.lock();
            st.flight = Flight::Idle;
            st.wanted = true;
            st.record_failures += 1;
            st.record_failures >= RECORD_RETRIES
        };
        if give_up {
            self.fail_all(error);
        } else {
            tracing::warn!(stream = %self.stream, %error, "notification not queued; retried");
            self.signal.kick.pending();
        }
    }

    /// The fallback: delivers an in-flight notification whose event is done,
    /// fails every point when the query fails, launches when idle. Returns
    /// whether the stream failed.
    pub(crate) fn fallback_check(&self, gpu: &dyn Gpu) -> bool {
        let flight = self.signal.lock().flight;
        match flight {
            // SAFETY: the in-flight event is `self.event` or a point's event
            // of this notifier, live until `release_handles`; `gpu` is this
            // notifier's backend.
            Flight::Queued(covered, event) => match unsafe { gpu.event_query(event) } {
                Ok(true) => self.signal.deliver(covered),
                Ok(false) => {}
                Err(e) => {
                    self.fail_all(ResourceError::from(e));
                    return true;
                }
            },
            Flight::Idle => self.launch(gpu),
            Flight::Launching => {}
        }
        false
    }

    /// Fails every pending point with `error`, forgets the pending frees
    /// (they stay counted in the inner resource's pending bytes, since
    /// nothing says they executed) and marks the stream failed, so that the
    /// allocations waiting on this resource fail too (see
    /// [`failure`](Self::failure)).
    pub(crate) fn fail_all(&self, error: ResourceError) {
        let mut wake = Vec::new();
        let (points, frees) = {
            let mut st = self.signal.lock();
            st.flight = Flight::Idle;
            st.wanted = false;
            st.failed.get_or_insert_with(|| error.clone());
            self.signal.dead.store(true, Ordering::Release);
            let frees = std::mem::take(&mut st.frees).len();
            (st.points.fail_pending(&error, &mut wake), frees)
        };
        // Woken before the log line: a subscriber that panics must not
        // leave the failed points' tasks asleep.
        wake.into_iter().for_each(Waker::wake);
        if frees > 0 || points > 0 {
            tracing::error!(stream = %self.stream, %error, points, frees,
                "completion notifications failed");
        }
    }

    /// Releases the notifier's GPU handles. Called once, by the owner's drop.
    pub(crate) fn release_handles(&self, gpu: &dyn Gpu) {
        // An event still awaited by a queued wait is left alone (a destroyed
        // and re-created event could redirect that wait); the driver
        // releases it with the context.
        let (awaited, spare) = {
            let mut st = self.signal.lock();
            let awaited = match st.flight {
                Flight::Queued(_, e) => Some(e),
                Flight::Launching => Some(self.event),
                Flight::Idle => None,
            };
            (awaited, std::mem::take(&mut st.spare))
        };
        for e in spare.into_iter().chain([self.event]) {
            if Some(e) != awaited {
                // SAFETY: this is the one call of `release_handles` (from
                // `Core`'s drop): `self.event` and the spare events were made
                // on `gpu` and are destroyed here once; no point holds them
                // any more (points hold the `Core` alive).
                let _ = unsafe { gpu.event_destroy(e) };
            }
        }
        if self.owns_lane {
            // SAFETY: `self.lane` was made by `gpu.create_stream` in `new`
            // (`owns_lane`), and this one call of `release_handles` destroys
            // it; nothing queues on it afterwards.
            let _ = unsafe { gpu.destroy_stream(self.lane) };
        }
    }
}

/// Loom models of the notifier's lock-free paths (`scripts/model-check.sh`):
/// the settled mirror (`settled_below`, `any_failed`) read without the lock
/// while a notification or a fault settles points under it.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::task::{Wake, Waker};

    use loom::sync::atomic::AtomicBool as LoomBool;

    // Paths from the crate root: a `super::` here would read as an import
    // of the folder above (tools/import-cycles.py sees the file, not the
    // test module).
    use std::sync::Arc;

    use crate::error::{DriverCall, ResourceError, ResourceResult};
    use crate::futures::kick::Kick;
    use crate::futures::notifier::Notifier;
    use crate::gpu::RawEvent;
    use crate::types::{RawStream, StreamId};
    use crate::util::sync::Ordering;

    struct Flag(LoomBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
    }

    fn notifier() -> Notifier {
        let stream = StreamId::new(0, 0);
        let raw = RawStream::sim(0, 0);
        Notifier::with_handles(
            stream,
            (raw, raw, false),
            RawEvent::sim(0),
            Arc::new(Kick::default()),
        )
    }

    /// How a future ends its check-then-park: the outcome, if it saw one.
    fn check_then_park(n: &Notifier, seq: u64, waker: &Waker) -> Option<ResourceResult<()>> {
        match n.check(seq) {
            Ok(outcome) => Some(outcome),
            Err(_) => n.register(seq, waker, None),
        }
    }

    /// A notification lands while a future checks the mirror and parks:
    /// the future sees the point done, or is woken. Never neither.
    #[test]
    fn a_notification_racing_a_check_is_never_lost() {
        loom::model(|| {
            let n = Arc::new(notifier());
            let seq = n.mark();
            let host = {
                let n = n.clone();
                loom::thread::spawn(move || n.signal.deliver(seq))
            };
            let flag = Arc::new(Flag(LoomBool::new(false)));
            let waker = Waker::from(flag.clone());
            let seen = check_then_park(&n, seq, &waker);
            host.join().unwrap();
            match seen {
                Some(outcome) => assert_eq!(outcome, Ok(())),
                None => assert!(flag.0.load(Ordering::Acquire), "parked and never woken"),
            }
            assert_eq!(n.check(seq), Ok(Ok(())));
        });
    }

    /// A device fault fails the stream while a future checks: the future
    /// sees the error or is woken to read it, and never reads "done" for a
    /// point the GPU was not known to reach (the mirror's base moves past
    /// failed points; `any_failed` is published first).
    #[test]
    fn a_fault_racing_a_check_is_never_read_as_done() {
        loom::model(|| {
            let n = Arc::new(notifier());
            let seq = n.mark();
            let error = ResourceError::Driver {
                call: DriverCall::EventQuery,
                code: 700,
                message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            };
            let fallback = {
                let n = n.clone();
                let error = error.clone();
                loom::thread::spawn(move || n.fail_all(error))
            };
            let flag = Arc::new(Flag(LoomBool::new(false)));
            let waker = Waker::from(flag.clone());
            let seen = check_then_park(&n, seq, &waker);
            fallback.join().unwrap();
            match seen {
                Some(outcome) => {
                    assert_eq!(outcome, Err(error.clone()), "a failed point read as done")
                }
                None => assert!(flag.0.load(Ordering::Acquire), "parked and never woken"),
            }
            assert_eq!(n.check(seq), Ok(Err(error)));
            assert!(n.failure().is_some());
        });
    }
}
