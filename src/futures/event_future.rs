//! [`EventFuture`]: completes when the GPU reaches a recorded point.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::core::Core;
use super::gpu_error;
use super::waiter::Waiter;
use crate::error::ResourceResult;
use crate::gpu::RawEvent;
use crate::types::StreamId;

/// How long the first poll keeps querying the event before parking. A
/// query costs about 0.25 µs and a host-function wake-up about 22 µs, so a
/// few microseconds of queries catch short operations at a fraction of the
/// cost, while bounding the time a worker thread is held.
pub const SPIN_BUDGET: Duration = Duration::from_micros(4);

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
/// then, on the first poll only and unless an earlier point of the same
/// stream is still pending, keeps querying for at most [`SPIN_BUDGET`];
/// only then does it park, asking the stream's notifier for a notification
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
    spun: bool,
    result: Option<ResourceResult<()>>,
}

impl EventFuture {
    pub(crate) fn new(
        core: Arc<Core>,
        stream: StreamId,
        waiter: Arc<Waiter>,
        event: Option<RawEvent>,
    ) -> Self {
        EventFuture {
            core,
            stream,
            waiter,
            event,
            spun: false,
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
        if let Some(r) = self.query() {
            return self.settle(r);
        }
        if !self.spun {
            self.spun = true;
            // Behind an earlier point of the same stream that is not known
            // reached, this one cannot be reached either: park at once.
            let behind = self
                .core
                .notifier(self.stream)
                .is_ok_and(|n| n.has_earlier_waiter(self.waiter.seq()));
            if behind {
                return self.park(cx);
            }
            let start = Instant::now();
            while start.elapsed() < SPIN_BUDGET {
                std::hint::spin_loop();
                if let Some(r) = self.query() {
                    return self.settle(r);
                }
            }
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
            n.launch(&*self.core.gpu);
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
