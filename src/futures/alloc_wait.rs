//! The FIFO queue of allocations waiting for memory.
//!
//! # State
//!
//! [`AllocQueue`] holds one ticket per waiting [`AllocFuture`], in arrival
//! order, with the waker of its task, and an `epoch` counter that moves
//! every time memory may have come back.
//!
//! # Who adds, who drains
//!
//! An allocation that finds the device full (or a budget exhausted) takes a
//! ticket at the tail. A newcomer never overtakes: while anyone waits, it
//! queues without trying. Only the **head** tries again, when it is woken by
//! [`memory_returned`](AllocQueue::memory_returned) (a reap drained bytes, a
//! free was queued — memory freed on a stream is reusable on that stream at
//! once — or a stream failed). When the head succeeds, it leaves and wakes
//! the next head, which tries in turn: one return of memory can serve several
//! waiters, in order.
//!
//! # Cancellation
//!
//! A dropped waiter removes its ticket. If it was the head, it passes the
//! wake-up on to the next head, so that a wake delivered to a task that was
//! cancelled before it ran is never lost (tokio's `Acquire::drop` does the
//! same for semaphore permits). A waiter holds no memory while it waits, so
//! dropping it leaks nothing.
//!
//! A lost wake-up between a failed try and taking the ticket is prevented by
//! the epoch: the waiter reads it before trying, and tries again at once if
//! it moved.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::core::Core;
use crate::error::{ResourceError, ResourceResult};
use crate::types::{AllocTag, DeviceBlock, StreamId};

#[derive(Debug, Default)]
struct QueueState {
    next_ticket: u64,
    waiting: VecDeque<(u64, Waker)>,
}

/// Allocations waiting for memory, first come first served. See the
/// [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct AllocQueue {
    state: Mutex<QueueState>,
    epoch: AtomicU64,
}

impl AllocQueue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of waiting allocations.
    pub(crate) fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Memory may have come back: wakes the head (after unlocking).
    pub(crate) fn memory_returned(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let head = self.lock().waiting.front().map(|(_, w)| w.clone());
        if let Some(w) = head {
            w.wake();
        }
    }

    /// Queues a ticket at the tail; returns it and whether it is the head.
    fn enqueue(&self, waker: &Waker) -> (u64, bool) {
        let mut st = self.lock();
        st.next_ticket += 1;
        let ticket = st.next_ticket;
        st.waiting.push_back((ticket, waker.clone()));
        (ticket, st.waiting.len() == 1)
    }

    /// Refreshes the ticket's waker; whether it is the head.
    fn refresh(&self, ticket: u64, waker: &Waker) -> bool {
        let mut st = self.lock();
        let head = st.waiting.front().is_some_and(|(t, _)| *t == ticket);
        if let Some((_, w)) = st.waiting.iter_mut().find(|(t, _)| *t == ticket)
            && !w.will_wake(waker)
        {
            *w = waker.clone();
        }
        head
    }

    /// Removes the ticket; if it was the head, wakes the next head.
    fn leave(&self, ticket: u64) {
        let next = {
            let mut st = self.lock();
            let Some(i) = st.waiting.iter().position(|(t, _)| *t == ticket) else {
                return;
            };
            st.waiting.remove(i);
            (i == 0)
                .then(|| st.waiting.front().map(|(_, w)| w.clone()))
                .flatten()
        };
        if let Some(w) = next {
            w.wake();
        }
    }
}

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
            ResourceError::OutOfMemory { requested, .. } => *requested <= self.core.capacity,
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
        if self.done {
            return Poll::Ready(Err(ResourceError::Shutdown));
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
        // Bounded: each retry needs memory to have come back meanwhile.
        for _ in 0..4 {
            let epoch = self.core.allocs.epoch();
            match self.core.inner.allocate(self.bytes, self.stream, self.tag) {
                Ok(block) => return self.finish(Ok(block)),
                Err(e) if self.worth_waiting(&e) => {
                    // A cache below may have given its idle blocks back,
                    // on their own streams: their notifications reap them.
                    self.core.mark_frees_elsewhere(None);
                    if self.ticket.is_none() {
                        let (t, head) = self.core.allocs.enqueue(cx.waker());
                        self.ticket = Some(t);
                        if !head {
                            // Someone queued meanwhile: wait behind them.
                            return Poll::Pending;
                        }
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
