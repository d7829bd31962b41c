//! [`EventFuture`]: completes when the GPU reaches a recorded point.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::core::Core;
use super::gpu_error;
use super::wait_policy::WaitPolicy;
use super::waiter::Waiter;
use crate::error::ResourceResult;
use crate::gpu::RawEvent;
use crate::types::StreamId;

/// A future that completes when the GPU has executed everything queued on
/// one stream before the point it stands for.
///
/// Made by [`AsyncResource::finish_block_use`](super::AsyncResource::finish_block_use)
/// and [`AsyncResource::completion`](super::AsyncResource::completion). It
/// works on any executor: it is `Send + 'static`, and its wake-up comes from
/// a host function or from the [fallback](super::watchdog), never from a
/// runtime's timer or reactor.
///
/// Polling first queries the point's event (cheap when the work is done),
/// then, unless an earlier point of the same stream is still pending,
/// queries for a bounded while as the resource's [`WaitPolicy`] says (busy
/// on the first poll, then yielding to the executor); only then does it park, asking the stream's notifier for a notification
/// if none is in flight. No thread spins while the future is parked.
///
/// It resolves to `Ok(())`, or to the driver's error
/// ([`ResourceError::Driver`](crate::ResourceError::Driver)) when the device
/// faulted: a faulted device never calls host functions, and the fallback
/// turns the dead stream into that error.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use std::sync::Arc;
/// use streamalloc::futures::AsyncResource;
/// use streamalloc::gpu::sim::{MemAccess, SimGpu};
/// use streamalloc::{Access, AllocTag, SimResource};
///
/// let gpu = SimGpu::new();
/// let pool = gpu.stream_pool(1);
/// let res = AsyncResource::new(Arc::new(SimResource::new(gpu.clone(), pool.clone())))?;
/// let s = pool.id(0).unwrap();
/// let block = res.allocate(4096, s, AllocTag("x")).await?;
/// gpu.launch_kernel(pool.raw(s)?, &[MemAccess::write(&block)]).unwrap();
/// res.finish_block_use(block.id(), s, Access::Write)?.await?;
/// res.deallocate(block)?.await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Dropping it never blocks and changes nothing on the GPU: the work it
/// stands for still runs; its waiter is removed and its event returned to the
/// pool.
#[must_use = "an EventFuture does nothing unless awaited; dropping it does not cancel GPU work"]
#[derive(Debug)]
pub struct EventFuture {
    core: Arc<Core>,
    stream: StreamId,
    waiter: Arc<Waiter>,
    event: Option<RawEvent>,
    policy: WaitPolicy,
    first_poll: Option<Instant>,
    result: Option<ResourceResult<()>>,
}

impl EventFuture {
    pub(crate) fn new(
        core: Arc<Core>,
        stream: StreamId,
        waiter: Arc<Waiter>,
        event: Option<RawEvent>,
        policy: WaitPolicy,
    ) -> Self {
        EventFuture {
            core,
            stream,
            waiter,
            event,
            policy,
            first_poll: None,
            result: None,
        }
    }

    /// The stream the point is on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The point's sequence number on its stream (monotonic per stream).
    pub fn seq(&self) -> u64 {
        self.waiter.seq()
    }

    /// Whether the point is known reached, without waiting: queries the
    /// event once.
    ///
    /// # Errors
    /// The driver's error when the query fails (a device fault).
    pub fn is_complete(&self) -> ResourceResult<bool> {
        if let Some(r) = self.waiter.result() {
            return r.map(|()| true);
        }
        match self.event {
            Some(e) => self.core.gpu.event_query(e).map_err(gpu_error),
            None => Ok(false),
        }
    }

    /// One query of the event: `Some` when it settles the outcome.
    fn query(&self) -> Option<ResourceResult<()>> {
        let event = self.event?;
        match self.core.gpu.event_query(event) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(gpu_error(e))),
        }
    }

    fn settle(&mut self, result: ResourceResult<()>) -> Poll<ResourceResult<()>> {
        self.release();
        self.result = Some(result.clone());
        Poll::Ready(result)
    }

    fn release(&mut self) {
        if let Some(event) = self.event.take() {
            self.core.give_event(event);
        }
        if self.waiter.result().is_none()
            && let Ok(n) = self.core.notifier(self.stream)
        {
            n.forget(&self.waiter);
        }
    }
}

impl Future for EventFuture {
    type Output = ResourceResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(r) = &self.result {
            return Poll::Ready(r.clone());
        }
        if let Some(r) = self.waiter.result() {
            return self.settle(r);
        }
        let first = match self.first_poll {
            Some(first) => {
                if let Some(r) = self.query() {
                    return self.settle(r);
                }
                first
            }
            None => {
                let first = Instant::now();
                self.first_poll = Some(first);
                // Behind an earlier point of the same stream that is not
                // known reached, this one cannot be reached either: park
                // without even a query.
                let behind = self
                    .core
                    .notifier(self.stream)
                    .is_ok_and(|n| n.has_earlier_waiter(self.waiter.seq()));
                if behind {
                    return self.park(cx);
                }
                if let Some(r) = self.query() {
                    return self.settle(r);
                }
                while first.elapsed() < self.policy.spin {
                    std::hint::spin_loop();
                    if let Some(r) = self.query() {
                        return self.settle(r);
                    }
                }
                first
            }
        };
        if first.elapsed() < self.policy.yield_for {
            // Let other tasks run, and query again on the next poll; a
            // notification queued by another future may still wake us.
            self.waiter.register(cx.waker());
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.park(cx)
    }
}

impl EventFuture {
    /// Registers the task and makes sure a notification will come.
    fn park(&mut self, cx: &mut Context<'_>) -> Poll<ResourceResult<()>> {
        self.waiter.register(cx.waker());
        // A notification may have landed between the checks and the
        // registration.
        if let Some(r) = self.waiter.result() {
            return self.settle(r);
        }
        if let Ok(n) = self.core.notifier(self.stream) {
            n.request(&*self.core.gpu);
        }
        self.core.kick.pending();
        Poll::Pending
    }
}

impl Drop for EventFuture {
    fn drop(&mut self) {
        self.release();
    }
}
