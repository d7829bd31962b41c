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
//!   a landed notification unparks it (through the dispatcher's kick) so that
//!   completed frees reach the accounting and the next notification is
//!   queued.
//!
//! A panic in the code it patrols (a wrapped resource's `reap_through`) is
//! caught and logged: the thread goes on.
//!
//! It patrols whatever it is handed (a `Patrolled` target): it names nothing
//! above it. It holds that only weakly, so that dropping the resource ends
//! the thread (it is never joined: the resource may be dropped on the
//! watchdog thread itself).

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::kick::Kick;

/// How often the fallback queries in-flight notifications while something is
/// pending.
pub const FALLBACK_PERIOD: Duration = Duration::from_millis(20);

/// What the watchdog patrols: the dispatcher's work, and the fallback
/// queries.
pub(crate) trait Patrolled: Send + Sync {
    /// Applies landed notifications and queues the next ones; with
    /// `fallback`, first queries every in-flight notification (done:
    /// delivered; an error: the stream's waiters fail).
    fn patrol(&self, fallback: bool);

    /// Whether anything waits on a notification or on the fallback (then
    /// the watchdog keeps waking every [`FALLBACK_PERIOD`]).
    fn has_pending(&self) -> bool;
}

/// Starts the watchdog thread patrolling `target`, woken through `kick`.
pub(crate) fn spawn(target: Weak<dyn Patrolled>, kick: Arc<Kick>) -> std::io::Result<()> {
    let thread_kick = kick.clone();
    let handle = thread::Builder::new()
        .name("streamalloc-watchdog".into())
        .spawn(move || run(target, &thread_kick))?;
    kick.set_watchdog(handle.thread().clone());
    Ok(())
}

fn run(target: Weak<dyn Patrolled>, kick: &Kick) {
    let mut last_check = Instant::now();
    loop {
        if kick.is_closed() {
            return;
        }
        // The strong reference is dropped before parking: holding it would
        // keep the resource alive.
        let pending = {
            let Some(target) = target.upgrade() else {
                return;
            };
            let fallback = last_check.elapsed() >= FALLBACK_PERIOD;
            // The patrol calls user code (a decorator's `reap_through`): a
            // panic there must not end the thread that ends every waiter
            // after a fault. The state it leaves is consistent (every lock
            // of the layer recovers from poisoning); the next patrol goes on.
            let patrolled = panic::catch_unwind(AssertUnwindSafe(|| target.patrol(fallback)));
            if patrolled.is_err() {
                tracing::error!("a panic inside the watchdog's patrol (in a wrapped resource?)");
            }
            if fallback {
                last_check = Instant::now();
            }
            panic::catch_unwind(AssertUnwindSafe(|| target.has_pending())).unwrap_or(true)
        };
        if pending {
            thread::park_timeout(FALLBACK_PERIOD);
            continue;
        }
        kick.set_idle(true);
        // Re-check after announcing idleness: a registration that raced with
        // the check above either is seen now or sees `idle` and unparks us.
        let still_idle = target.upgrade().is_some_and(|t| !t.has_pending());
        if still_idle && !kick.is_closed() {
            thread::park();
            last_check = Instant::now();
        }
        kick.set_idle(false);
    }
}
