//! [`AllocFuture`]: an allocation that waits, first come first served, in
//! the [wait queue](super::wait_queue) while the device or a budget is full.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::core::Core;
use super::hold_wait::current_owner;
use super::waiter::{Attempt, Waiter};
use crate::error::{ResourceError, ResourceResult};
use crate::observe::history::{self, MemoryAction, MemoryEvent};
use crate::types::{AllocTag, DeviceBlock, StreamId, Tag};
use crate::util::poll_scope::PollScope;

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
/// [`HoldAndWait`](ResourceError::HoldAndWait) when every byte it waits
/// for is held by tasks that wait themselves, and this is the newest
/// waiter whose task holds memory (see
/// [`AsyncResource::set_hold_and_wait_check`](super::AsyncResource::set_hold_and_wait_check)).
///
/// # Cancel safety
/// Cancel safe: dropping it gives up its place in the queue and holds no
/// memory; if it had been woken to try, the wake passes to the next waiter.
#[must_use = "an AllocFuture allocates nothing unless awaited"]
#[derive(Debug)]
pub struct AllocFuture {
    waiter: Waiter,
    bytes: usize,
    stream: StreamId,
}

impl AllocFuture {
    pub(crate) fn new(core: Arc<Core>, bytes: usize, stream: StreamId, tag: Tag) -> Self {
        AllocFuture {
            waiter: Waiter::new(core, tag),
            bytes,
            stream,
        }
    }

    /// Whether the allocation is queued, waiting for memory.
    pub fn is_waiting(&self) -> bool {
        self.waiter.is_waiting()
    }
}

/// Whether waiting could ever satisfy a request refused with `e`.
pub(crate) fn worth_waiting(core: &Core, e: &ResourceError) -> bool {
    match e {
        ResourceError::OutOfMemory { requested, .. } => {
            core.capacity().is_some_and(|c| *requested <= c)
        }
        ResourceError::BudgetExceeded {
            requested, limit, ..
        } => requested <= limit,
        _ => false,
    }
}

impl Future for AllocFuture {
    type Output = ResourceResult<DeviceBlock>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _scope = PollScope::enter();
        let (bytes, stream) = (self.bytes, self.stream);
        let tag = self.waiter.tag.kind();
        let was_waiting = self.waiter.is_waiting();
        let poll = self.waiter.poll(
            cx,
            bytes,
            |core| core.check_request(bytes, stream),
            |core| match core.inner.allocate(bytes, stream, tag) {
                Ok(block) => {
                    if core.tracks_holdings() {
                        core.holdings.served(block.id(), bytes, current_owner());
                    }
                    Attempt::Served(block)
                }
                Err(e) if worth_waiting(core, &e) => Attempt::Wait(e),
                Err(e) => Attempt::Fail(e),
            },
        );
        if history::recording() {
            let device = stream.device();
            match &poll {
                Poll::Ready(Ok(block)) => {
                    if was_waiting {
                        history::record(|| {
                            MemoryEvent::new(MemoryAction::WaitServed, device)
                                .on(stream)
                                .at(block.ptr(), bytes)
                                .tagged(tag)
                        });
                    }
                    record_alloc(block, bytes);
                }
                Poll::Ready(Err(e)) => record_oom(e, stream, tag),
                Poll::Pending if !was_waiting && self.waiter.is_waiting() => {
                    history::record(|| {
                        MemoryEvent::new(MemoryAction::WaitBegun, device)
                            .on(stream)
                            .at(0, bytes)
                            .tagged(tag)
                    });
                }
                Poll::Pending => {}
            }
        }
        poll
    }
}

/// Records `block`'s allocation (asked for `requested` bytes) in the
/// history, if it is on.
pub(crate) fn record_alloc(block: &DeviceBlock, requested: usize) {
    history::record(|| {
        MemoryEvent::new(MemoryAction::Alloc, block.stream().device())
            .on(block.stream())
            .at(block.ptr(), block.size().max(requested))
            .tagged(block.tag())
    });
}

/// Records an allocation that failed for memory (device or budget) in the
/// history, if it is on; other errors are not memory's.
pub(crate) fn record_oom(e: &ResourceError, stream: StreamId, tag: AllocTag) {
    let (requested, free) = match *e {
        ResourceError::OutOfMemory {
            requested,
            available,
            ..
        } => (requested, available),
        ResourceError::BudgetExceeded {
            requested,
            limit,
            in_use,
        } => (requested, limit.saturating_sub(in_use)),
        _ => return,
    };
    history::record(|| {
        MemoryEvent::new(MemoryAction::Oom, stream.device())
            .on(stream)
            .at(0, requested)
            .tagged(tag)
            .with_free(free)
    });
}
