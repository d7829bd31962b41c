//! The poll-time harness: a wrapper that fails the test when one poll of
//! the wrapped future takes longer than [`POLL_BOUND`], so that a blocking
//! call (a synchronize, a sleep, a lock held across driver work) inside any
//! poll of the crate's futures cannot come back unnoticed.
//!
//! The simulated device runs its work (and sleeps its op latency) on its own
//! thread, so a poll never pays that latency itself: the bound is far below
//! the op latencies the tests use (100 ms and up), and far above what a
//! non-blocking poll costs even on a loaded machine.

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
        let start = Instant::now();
        let out = Pin::new(&mut self.inner).poll(cx);
        let took = start.elapsed();
        assert!(
            took <= POLL_BOUND,
            "one poll of {} took {took:?} (bound {POLL_BOUND:?}): something in it blocks",
            self.what
        );
        out
    }
}

/// `.bounded("what")` on any of the crate's futures.
pub trait BoundedExt: Future + Unpin + Sized {
    /// Times every poll of `self` (see [`Bounded`]).
    fn bounded(self, what: &'static str) -> Bounded<Self> {
        Bounded { inner: self, what }
    }
}

impl<F: Future + Unpin> BoundedExt for F {}
