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
//! It patrols whatever it is handed (a `Patrolled` target): it names nothing
//! above it. It holds that only weakly, so that dropping the resource ends
//! the thread (it is never joined: the resource may be dropped on the
//! watchdog thread itself).

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
            // The patrol calls the inner resource, user decorators included:
            // one that panics must not end the thread every completion
            // relies on. What it was applying is put back (see
            // `Core::dispatch`) and retried on the next round. (The panic
            // hook has reported it; a log line here could reach a panicking
            // subscriber again.)
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.patrol(fallback)));
            if fallback {
                last_check = Instant::now();
            }
            target.has_pending()
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
