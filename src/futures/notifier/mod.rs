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

mod launch;
#[cfg(all(test, loom))]
mod loom_tests;
mod signal;

use std::sync::Arc;
use std::task::Waker;

use self::signal::{FRONTIER_GAP, Flight, Signal};
use super::kick::Kick;
use super::wait_stats::{Tally, WaitStats};
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{Gpu, RawEvent, RawStream};
use crate::types::StreamId;
use crate::util::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

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
            signal: Arc::new(Signal::new(kick)),
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
        unsafe { gpu.capture_status(self.user) }
            .map_err(ResourceError::from)?
            .refuse(self.stream)
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
}
