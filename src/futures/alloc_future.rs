//! [`AllocFuture`]: an allocation that waits, first come first served, in
//! the [wait queue](super::wait_queue) while the device or a budget is full.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::core::Core;
use crate::error::{ResourceError, ResourceResult};
use crate::poll_scope::PollScope;
use crate::types::{AllocTag, DeviceBlock, StreamId};

/// A future allocation: waits, first come first served, while the device (or
/// a budget) is full.
///
/// Made by [`AsyncResource::allocate`](super::AsyncResource::allocate).
///
/// # Errors
/// Errors other than a full device or budget (an unknown stream, a driver
/// error) are returned at once, as is a request larger than the device (or
/// the budget's limit), which waiting could never satisfy.
///
/// # Cancel safety
/// Cancel safe: dropping it gives up its place in the queue and holds no
/// memory; if it had been woken to try, the wake passes to the next waiter.
#[must_use = "an AllocFuture allocates nothing unless awaited"]
#[derive(Debug)]
pub struct AllocFuture {
    core: Arc<Core>,
    bytes: usize,
    stream: StreamId,
    tag: AllocTag,
    ticket: Option<u64>,
    done: bool,
}

impl AllocFuture {
    pub(crate) fn new(core: Arc<Core>, bytes: usize, stream: StreamId, tag: AllocTag) -> Self {
        AllocFuture {
            core,
            bytes,
            stream,
            tag,
            ticket: None,
            done: false,
        }
    }

    /// Whether the allocation is queued, waiting for memory.
    pub fn is_waiting(&self) -> bool {
        self.ticket.is_some()
    }

    /// Whether waiting could ever satisfy the request after `e`.
    fn worth_waiting(&self, e: &ResourceError) -> bool {
        match e {
            ResourceError::OutOfMemory { requested, .. } => {
                self.core.capacity().is_some_and(|c| *requested <= c)
            }
            ResourceError::BudgetExceeded {
                requested, limit, ..
            } => requested <= limit,
            _ => false,
        }
    }

    fn finish(&mut self, r: ResourceResult<DeviceBlock>) -> Poll<ResourceResult<DeviceBlock>> {
        if let Some(t) = self.ticket.take() {
            self.core.allocs.leave(t);
        }
        self.done = true;
        Poll::Ready(r)
    }
}

impl Future for AllocFuture {
    type Output = ResourceResult<DeviceBlock>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _scope = PollScope::enter();
        if self.done {
            return Poll::Ready(Err(ResourceError::Shutdown));
        }
        if self.ticket.is_none() {
            // What waiting could never serve fails at once, even with
            // others queued: a wrong stream, more than the device has.
            if let Err(e) = self.core.check_request(self.bytes, self.stream) {
                return self.finish(Err(e));
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
            let (t, _) = queue.enqueue(cx.waker());
            self.ticket = Some(t);
            return Poll::Pending;
        }
        if !may_try {
            return Poll::Pending;
        }
        // Bounded: each retry needs memory to have come back meanwhile (or
        // this waiter to have just taken its ticket).
        for _ in 0..4 {
            let epoch = self.core.allocs.epoch();
            match self.core.inner.allocate(self.bytes, self.stream, self.tag) {
                Ok(block) => return self.finish(Ok(block)),
                Err(e) if self.worth_waiting(&e) => {
                    // A cache below may have given its idle blocks back on
                    // their own streams, a decorator or the user may have
                    // freed on the inner resource: every free queued below
                    // this layer gets a point, and its notification reaps it.
                    self.core.adopt_frees();
                    if self.ticket.is_none() {
                        let (t, head) = self.core.allocs.enqueue(cx.waker());
                        self.ticket = Some(t);
                        if !head {
                            // Someone queued meanwhile: wait behind them.
                            return Poll::Pending;
                        }
                        // Counted as waiting now, everywhere: memory given
                        // back from here on wakes us. Memory given back
                        // since the failed try did not: try once more.
                        continue;
                    }
                    if self.core.allocs.epoch() == epoch {
                        return Poll::Pending;
                    }
                }
                Err(e) => return self.finish(Err(e)),
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Drop for AllocFuture {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.core.allocs.leave(t);
        }
    }
}
