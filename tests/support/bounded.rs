//! The poll-time harness: a wrapper that fails the test when one poll of
//! the wrapped future takes longer than [`POLL_BOUND`], so that a blocking
//! call (a synchronize, a sleep, a lock held across driver work) inside any
//! poll of the crate's futures cannot come back unnoticed.
//!
//! The simulated device runs its work (and sleeps its op latency) on its own
//! thread, so a poll never pays that latency itself: the bound is below the
//! op latencies the tests use (100 ms and up), and far above what a
//! non-blocking poll costs.
//!
//! What is timed is the poll's wall time less the time its thread spent
//! runnable but not running (Linux's `/proc/thread-self/schedstat`): on a
//! loaded machine the scheduler may preempt a poll for tens of
//! milliseconds, which says nothing about the poll. Blocking (a
//! synchronize, a sleep, a lock wait) is not runnable time, so it still
//! counts in full. Where that file does not exist, the wall time is used.
//!
//! Under Miri the polls are not timed: the interpreter runs them some
//! hundred times slower than compiled code, so the time says nothing about
//! blocking, and Miri cannot read `/proc`. What Miri runs is the futures'
//! memory safety; the bound is checked by every ordinary `cargo test`, and
//! the tests that count synchronizes inside polls
//! (`SimGpu::blocking_calls_in_polls`) still count them under Miri.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The longest one poll may take.
pub const POLL_BOUND: Duration = Duration::from_millis(50);

/// A future whose every poll is timed. See the [module documentation](self).
pub struct Bounded<F> {
    inner: F,
    what: &'static str,
}

impl<F: Future + Unpin> Future for Bounded<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if cfg!(miri) {
            return Pin::new(&mut self.inner).poll(cx);
        }
        let waited = runqueue_wait();
        let start = Instant::now();
        let out = Pin::new(&mut self.inner).poll(cx);
        let preempted = runqueue_wait().saturating_sub(waited);
        let took = start.elapsed().saturating_sub(preempted);
        assert!(
            took <= POLL_BOUND,
            "one poll of {} took {took:?} (bound {POLL_BOUND:?}): something in it blocks",
            self.what
        );
        out
    }
}

/// Time this thread has spent runnable but waiting for a CPU.
fn runqueue_wait() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// `.bounded("what")` on any of the crate's futures.
pub trait BoundedExt: Future + Unpin + Sized {
    /// Times every poll of `self` (see [`Bounded`]).
    fn bounded(self, what: &'static str) -> Bounded<Self> {
        Bounded { inner: self, what }
    }
}

impl<F: Future + Unpin> BoundedExt for F {}
