//! [`Kick`]: the wake-up side of the dispatcher, the small callback the
//! [notifiers](super::notifier) are given.
//!
//! A host function (or a future's poll) that leaves work for the dispatcher
//! calls [`dispatch`](Kick::dispatch); one that leaves something pending
//! calls [`pending`](Kick::pending) so that the fallback is armed. The kick
//! reaches whoever dispatches: a running [`Reaper`](super::Reaper) task
//! (through a [`Notify`] that stores a permit when none waits), or else the
//! [watchdog](super::watchdog) thread (unparked).
//!
//! It owns nothing of the GPU and names nothing above it, so a host function
//! may hold and drop it, and the notifier need not know who dispatches.

use std::sync::OnceLock;
use std::thread::Thread;

use tokio::sync::Notify;

use crate::util::sync::{AtomicBool, AtomicUsize, Ordering};

/// The wake-up side of the dispatcher, shared with host functions. See the
/// [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Kick {
    /// Running reapers; while there is one, it is the dispatcher.
    pub(crate) reapers: AtomicUsize,
    /// Wakes a reaper (a permit is stored when none waits, so no wake-up is
    /// lost).
    pub(crate) notify: Notify,
    /// The watchdog thread, once started.
    watchdog: OnceLock<Thread>,
    /// Set by the watchdog before it parks with no timeout.
    idle: AtomicBool,
    /// The core is gone: every dispatcher stops.
    closed: AtomicBool,
}

impl Kick {
    /// Asks the dispatcher to apply landed notifications and queue the next.
    pub(crate) fn dispatch(&self) {
        if self.reapers.load(Ordering::Acquire) > 0 {
            self.notify.notify_one();
        } else {
            self.unpark();
        }
    }

    /// Something became pending: make sure the fallback is armed.
    pub(crate) fn pending(&self) {
        if self.idle.swap(false, Ordering::SeqCst) {
            self.unpark();
        }
    }

    /// Stops every dispatcher.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
        self.notify.notify_one();
        self.unpark();
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Names the watchdog thread (once, when it starts).
    pub(crate) fn set_watchdog(&self, thread: Thread) {
        let _ = self.watchdog.set(thread);
    }

    /// The watchdog is about to park with no timeout (it re-checks for
    /// pending work after this, so a racing [`pending`](Self::pending)
    /// either is seen or unparks it).
    pub(crate) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::SeqCst);
    }

    fn unpark(&self) {
        if let Some(t) = self.watchdog.get() {
            t.unpark();
        }
    }
}
