//! The fallback: a parked thread that turns a dead stream into an error.
//!
//! A host function is never called after a device fault, so a future that
//! relied on notifications alone could hang forever. The watchdog thread
//! exists to prevent that:
//!
//! - **While nothing is pending** it is parked with no timeout: it costs no
//!   CPU at all.
//! - **While something is pending** (a parked waiter, a notification in
//!   flight, or a free on any stream) it
//!   wakes every [`FALLBACK_PERIOD`] and queries each stream's in-flight
//!   notification event: a completed one is delivered as if its host
//!   function had run (so a late or failed host function loses nothing), an
//!   error fails every waiter of that stream.
//! - **When no [`Reaper`](super::Reaper) runs** it is also the dispatcher:
//!   a landed notification unparks it so that completed frees reach the
//!   accounting and the next notification is queued.
//!
//! `Kick` is the wake-up side, shared with host functions: it owns nothing
//! of the GPU, so a host function may hold and drop it. The thread holds the
//! core only weakly, so that dropping the resource ends it (it is never
//! joined: the core may be dropped on the watchdog thread itself).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{OnceLock, Weak};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::core::Core;

/// How often the fallback queries in-flight notifications while something is
/// pending.
pub const FALLBACK_PERIOD: Duration = Duration::from_millis(20);

/// The wake-up side of the dispatcher, shared with host functions.
#[derive(Debug, Default)]
pub(crate) struct Kick {
    /// Running reapers; while there is one, it is the dispatcher.
    pub(crate) reapers: AtomicUsize,
    /// Wakes a reaper (a permit is stored when none waits, so no wake-up is
    /// lost).
    pub(crate) notify: Notify,
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

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
        self.notify.notify_one();
        self.unpark();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn unpark(&self) {
        if let Some(t) = self.watchdog.get() {
            t.unpark();
        }
    }
}

/// Starts the watchdog thread of `core`.
pub(crate) fn spawn(core: Weak<Core>, kick: std::sync::Arc<Kick>) -> std::io::Result<()> {
    let thread_kick = kick.clone();
    let handle = thread::Builder::new()
        .name("streamalloc-watchdog".into())
        .spawn(move || run(core, &thread_kick))?;
    let _ = kick.watchdog.set(handle.thread().clone());
    Ok(())
}

fn run(core: Weak<Core>, kick: &Kick) {
    let mut last_check = Instant::now();
    loop {
        if kick.is_closed() {
            return;
        }
        // The strong reference is dropped before parking: holding it would
        // keep the resource alive.
        let pending = {
            let Some(core) = core.upgrade() else { return };
            core.dispatch();
            if last_check.elapsed() >= FALLBACK_PERIOD {
                core.fallback_check();
                last_check = Instant::now();
            }
            core.has_pending()
        };
        if pending {
            thread::park_timeout(FALLBACK_PERIOD);
            continue;
        }
        kick.idle.store(true, Ordering::SeqCst);
        // Re-check after announcing idleness: a registration that raced with
        // the check above either is seen now or sees `idle` and unparks us.
        let still_idle = core.upgrade().is_some_and(|c| !c.has_pending());
        if still_idle && !kick.is_closed() {
            thread::park();
            last_check = Instant::now();
        }
        kick.idle.store(false, Ordering::SeqCst);
    }
}
