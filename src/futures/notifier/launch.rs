//! Queuing a notification ([`Notifier::launch`]): what it covers, the
//! event the lane waits on, the host function; and what happens when the
//! driver refuses (the watchdog's fallback query, failing every waiter).

use std::task::Waker;

use super::Notifier;
use super::signal::{Flight, RECORD_RETRIES};
use crate::error::ResourceError;
use crate::gpu::{CaptureStatus, Gpu};
use crate::util::sync::Ordering;

impl Notifier {
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
                    self.after_the_capture();
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
                // A capture another thread began between the look above and
                // the record may hold the record: a lane waiting on it
                // would join the capture, which could then not end. No
                // capture now means any later one began after the record,
                // which is then a record of the stream's work.
                if self.user_capturing(gpu) {
                    self.after_the_capture();
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

    /// The user stream is captured: no notification now (a record there
    /// would be captured). It stays wanted, and the watchdog retries.
    fn after_the_capture(&self) {
        let mut st = self.signal.lock();
        st.flight = Flight::Idle;
        // Whatever asked before still asks.
        st.wanted = true;
        st.launches -= 1;
        drop(st);
        self.signal.kick.pending();
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
