//! [`Waiter`]: the place in the [wait queue](super::wait_queue) that an
//! [`AllocFuture`](super::AllocFuture) and a
//! [`ReserveFuture`](super::ReserveFuture) share: first come first served,
//! the head tries, a refused head judges
//! [hold-and-wait](super::hold_wait), a dropped waiter passes its wake on.
//!
//! # What a wait shows
//!
//! A request that queues is counted when it leaves the queue, served,
//! failed or cancelled, with its wait: in the queue's
//! [`QueueStats`](super::QueueStats) and in every
//! [`Stats`](crate::Stats) layer of the stack. With a `tracing`
//! subscriber that wants INFO on [`WAIT_TARGET`], it gets a span
//! `alloc_wait` (`bytes`, `tag`, `request`, `position`: the requests ahead
//! of it when it queued; `wait_ns` and `outcome` recorded when it leaves),
//! entered around its tries, so the layers' events during them are the
//! request's. A request whose [`Tag`] names it gets the span from its first
//! try, queued or not. Nothing of this costs a request served at once
//! without a subscriber but a flag's check.

use std::sync::Arc;
use std::task::{Context, Poll};

use tracing::{Level, Span};

use super::core::Core;
use super::hold_wait::current_owner;
use crate::adaptors::QueueOutcome;
use crate::error::{ResourceError, ResourceResult};
use crate::types::Tag;
use crate::util::poll_scope::WaitingTry;

/// The target of the span of every request that waits (`alloc_wait`).
pub const WAIT_TARGET: &str = "streamalloc::wait";

/// What one try of a waiting request did.
pub(crate) enum Attempt<T> {
    /// Served.
    Served(T),
    /// Refused for lack of memory that waiting may bring back: the error
    /// of the refusal.
    Wait(ResourceError),
    /// Failed for good.
    Fail(ResourceError),
}

/// A request's place in the queue of waiting allocations.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) core: Arc<Core>,
    /// The request's tag (its kind goes to the stack).
    pub(crate) tag: Tag,
    ticket: Option<u64>,
    done: bool,
    /// The request's span, once it queued (or from its first try when its
    /// tag names it), while a subscriber wants it.
    span: Option<Span>,
}

impl Waiter {
    pub(crate) fn new(core: Arc<Core>, tag: Tag) -> Self {
        Waiter {
            core,
            tag,
            ticket: None,
            done: false,
            span: None,
        }
    }

    /// Whether the request is queued, waiting for memory.
    pub(crate) fn is_waiting(&self) -> bool {
        self.ticket.is_some()
    }

    /// Opens the request's span, if a subscriber wants it.
    fn open_span(&mut self, bytes: usize, position: usize) {
        if self.span.is_some() || !tracing::enabled!(target: WAIT_TARGET, Level::INFO) {
            return;
        }
        let span = tracing::info_span!(
            target: WAIT_TARGET,
            "alloc_wait",
            bytes,
            tag = %self.tag.kind(),
            request = tracing::field::Empty,
            position,
            wait_ns = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let Some(id) = self.tag.request() {
            span.record("request", id);
        }
        self.span = Some(span);
    }

    /// Takes the request out of the queue, counting how it left.
    fn leave(&mut self, outcome: QueueOutcome) {
        let waited = self
            .ticket
            .take()
            .and_then(|t| self.core.allocs.leave(t, outcome));
        if let Some(wait) = waited {
            for stats in self.core.stats() {
                stats.record_wait(self.tag.kind(), wait, outcome);
            }
        }
        if let Some(span) = self.span.take() {
            let name = match outcome {
                QueueOutcome::Served => "served",
                QueueOutcome::Failed => "failed",
                QueueOutcome::Cancelled => "cancelled",
            };
            let wait_ns = waited.map_or(0, |w| w.as_nanos() as u64);
            span.record("wait_ns", wait_ns);
            span.record("outcome", name);
            tracing::info!(target: WAIT_TARGET, parent: &span, wait_ns, outcome = name, "left the wait queue");
        }
    }

    fn finish<T>(&mut self, r: ResourceResult<T>) -> Poll<ResourceResult<T>> {
        let outcome = match r {
            Ok(_) => QueueOutcome::Served,
            Err(_) => QueueOutcome::Failed,
        };
        self.leave(outcome);
        self.done = true;
        Poll::Ready(r)
    }

    /// Queues the request; whether it is the head.
    fn enqueue(&mut self, cx: &Context<'_>, bytes: usize) -> bool {
        let owner = current_owner();
        let (t, head) = self.core.allocs.enqueue(cx.waker(), owner);
        self.ticket = Some(t);
        self.open_span(bytes, self.core.allocs.len().saturating_sub(1));
        head
    }

    /// Polls the request of `bytes` (in all): `check` refuses at once what
    /// waiting could never serve (asked before the request queues),
    /// `attempt` is one try.
    pub(crate) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        bytes: usize,
        check: impl FnOnce(&Core) -> ResourceResult<()>,
        mut attempt: impl FnMut(&Core) -> Attempt<T>,
    ) -> Poll<ResourceResult<T>> {
        if self.done {
            return Poll::Ready(Err(ResourceError::Shutdown));
        }
        // Closed: nothing new is served, and the waiting fail.
        if let Err(e) = self.core.check_open() {
            return self.finish(Err(e));
        }
        match self.ticket {
            None => {
                // What waiting could never serve fails at once, even with
                // others queued: a wrong stream, more than the device has.
                if let Err(e) = check(&self.core) {
                    return self.finish(Err(e));
                }
            }
            // Chosen to fail: its task holds memory the queue waits for.
            Some(t) => {
                if let Some(e) = self.core.allocs.take_failure(t) {
                    return self.finish(Err(e));
                }
            }
        }
        // A failed device reports no more frees: nothing can come back.
        if let Some(e) = self.core.failure() {
            return self.finish(Err(e));
        }
        let queue = &self.core.allocs;
        let may_try = match self.ticket {
            None => queue.len() == 0,
            Some(t) => queue.refresh(t, cx.waker()),
        };
        if !may_try && self.ticket.is_none() {
            self.enqueue(cx, bytes);
            // A task that may hold memory now waits too: the head judges
            // hold-and-wait again.
            if current_owner().is_some() {
                self.core.allocs.wake_head();
            }
            return Poll::Pending;
        }
        if !may_try {
            return Poll::Pending;
        }
        if self.tag.request().is_some() {
            self.open_span(bytes, 0);
        }
        // The layers' events during the tries are the request's, and their
        // refusals are back-pressure, not failures.
        let span = self.span.clone();
        let _entered = span.as_ref().map(Span::enter);
        let _try = WaitingTry::enter();
        // Bounded: each retry needs memory to have come back meanwhile (or
        // this waiter to have just taken its ticket).
        for _ in 0..4 {
            let epoch = self.core.allocs.epoch();
            match attempt(&self.core) {
                Attempt::Served(v) => return self.finish(Ok(v)),
                Attempt::Wait(refusal) => {
                    // A cache below may have given its idle blocks back on
                    // their own streams, a decorator or the user may have
                    // freed on the inner resource: every free queued below
                    // this layer gets a point, and its notification reaps it.
                    self.core.adopt_frees();
                    let Some(ticket) = self.ticket else {
                        if !self.enqueue(cx, bytes) {
                            // Someone queued meanwhile: wait behind them.
                            return Poll::Pending;
                        }
                        // Counted as waiting now, everywhere: memory given
                        // back from here on wakes us. Memory given back
                        // since the failed try did not: try once more.
                        continue;
                    };
                    if self.core.allocs.epoch() == epoch {
                        if let Some((victim, e)) = self.core.judge_hold_and_wait(&refusal) {
                            if victim == ticket {
                                return self.finish(Err(e));
                            }
                            self.core.allocs.fail(victim, e);
                        }
                        return Poll::Pending;
                    }
                }
                Attempt::Fail(e) => return self.finish(Err(e)),
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.ticket.is_some() {
            self.leave(QueueOutcome::Cancelled);
        }
    }
}
