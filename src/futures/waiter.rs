//! [`Waiter`]: the place in the [wait queue](super::wait_queue) that an
//! [`AllocFuture`](super::AllocFuture) and a
//! [`ReserveFuture`](super::ReserveFuture) share: first come first served,
//! the head tries, a refused head judges
//! [hold-and-wait](super::hold_wait), a dropped waiter passes its wake on.

use std::sync::Arc;
use std::task::{Context, Poll};

use super::core::Core;
use super::hold_wait::current_owner;
use crate::error::{ResourceError, ResourceResult};

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
    ticket: Option<u64>,
    done: bool,
}

impl Waiter {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        Waiter {
            core,
            ticket: None,
            done: false,
        }
    }

    /// Whether the request is queued, waiting for memory.
    pub(crate) fn is_waiting(&self) -> bool {
        self.ticket.is_some()
    }

    fn finish<T>(&mut self, r: ResourceResult<T>) -> Poll<ResourceResult<T>> {
        if let Some(t) = self.ticket.take() {
            self.core.allocs.leave(t);
        }
        self.done = true;
        Poll::Ready(r)
    }

    /// Polls the request: `check` refuses at once what waiting could never
    /// serve (asked before the request queues), `attempt` is one try.
    pub(crate) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        check: impl FnOnce(&Core) -> ResourceResult<()>,
        mut attempt: impl FnMut(&Core) -> Attempt<T>,
    ) -> Poll<ResourceResult<T>> {
        if self.done {
            return Poll::Ready(Err(ResourceError::Shutdown));
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
            let owner = current_owner();
            let (t, _) = queue.enqueue(cx.waker(), owner);
            self.ticket = Some(t);
            // A task that may hold memory now waits too: the head judges
            // hold-and-wait again.
            if owner.is_some() {
                queue.wake_head();
            }
            return Poll::Pending;
        }
        if !may_try {
            return Poll::Pending;
        }
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
                        let (t, head) = self.core.allocs.enqueue(cx.waker(), current_owner());
                        self.ticket = Some(t);
                        if !head {
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
        if let Some(t) = self.ticket.take() {
            self.core.allocs.leave(t);
        }
    }
}
