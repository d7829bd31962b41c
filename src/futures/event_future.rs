//! [`EventFuture`]: completes when the GPU reaches a recorded point.

#![allow(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::core::Core;
use super::notifier::Notifier;
use super::wait_policy::{WaitPolicy, WhenBehind};
use super::wait_stats::FutureTally;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::RawEvent;
use crate::types::StreamId;
use crate::util::poll_scope::PollScope;

/// A future that completes when the GPU has executed everything queued on
/// one stream before the point it stands for.
///
/// Made by [`AsyncResource::finish_block_use`](super::AsyncResource::finish_block_use)
/// and [`AsyncResource::completion`](super::AsyncResource::completion),
/// which record an event at the point, and by
/// [`AsyncResource::completion_lazy`](super::AsyncResource::completion_lazy),
/// which records none until polled. It
/// works on any executor: it is `Send + 'static`, and its wake-up comes from
/// a host function or from the fallback ([`FALLBACK_PERIOD`](crate::FALLBACK_PERIOD)), never from a
/// runtime's timer or reactor.
///
/// Polling first queries the point's event (cheap when the work is done; a
/// done query also settles every earlier point of the stream; a lazy point
/// queries its stream instead, until the first poll's spin is over, and
/// then records its event), then
/// queries for a bounded while as the resource's [`WaitPolicy`] says (busy
/// on the first poll, then yielding to the executor); only then does it
/// park, asking the stream's notifier for a notification if none is in
/// flight. While an earlier point of the same stream is pending it does not
/// query at all: it parks or yields, as [`WaitPolicy::behind`] says. No
/// thread spins while the future is parked.
///
/// It resolves to `Ok(())`, or to the driver's error
/// ([`ResourceError::Driver`]) when the device
/// faulted: a faulted device never calls host functions, and the fallback
/// turns the dead stream into that error.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use streamalloc::AsyncResource;
/// use streamalloc::gpu::sim::{MemAccess, SimGpu};
/// use streamalloc::{Device, Access, AllocTag, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let res = AsyncResource::on(&device)?;
/// let s = device.stream(0)?;
/// let block = res.allocate(4096, s, AllocTag("x")).await?;
/// gpu.launch_kernel(device.raw(s)?, &[MemAccess::write(&block)]).unwrap();
/// res.finish_block_use(block.id(), s, Access::Write)?.await?;
/// res.deallocate(block)?.await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Dropping it never blocks and changes nothing on the GPU: the work it
/// stands for still runs; its point is released and its event returned to
/// the stream's spares.
#[must_use = "an EventFuture does nothing unless awaited; dropping it does not cancel GPU work"]
#[derive(Debug)]
pub struct EventFuture {
    core: Arc<Core>,
    stream: StreamId,
    seq: u64,
    event: Option<RawEvent>,
    policy: WaitPolicy,
    phase: Phase,
    result: Option<ResourceResult<()>>,
    tally: FutureTally,
}

/// How far polling got.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Never polled.
    New,
    /// Yielding without queries behind an earlier pending point since
    /// `since` ([`WhenBehind::Yield`]).
    Behind { since: Instant },
    /// Querying (spinning, then yielding) since `since`; last queried at
    /// `last`.
    Querying { since: Instant, last: Instant },
    /// Parked on a notification.
    Parked,
}

impl EventFuture {
    /// A completion point at the current end of `stream`, refused while the
    /// stream is being captured into a graph.
    pub(crate) fn point(core: &Arc<Core>, stream: StreamId) -> ResourceResult<EventFuture> {
        core.notifier(stream)?.refuse_capturing(&*core.gpu)?;
        Self::point_outside_capture(core, stream)
    }

    /// [`point`](Self::point) on a stream the caller just found not
    /// capturing.
    pub(crate) fn point_outside_capture(
        core: &Arc<Core>,
        stream: StreamId,
    ) -> ResourceResult<EventFuture> {
        let notifier = core.notifier(stream)?;
        let (seq, spare) = notifier.mark_with_event();
        let event = match spare {
            Some(e) => e,
            None => match core.gpu.event_create() {
                Ok(e) => e,
                Err(e) => {
                    notifier.release(seq, None);
                    return Err(ResourceError::from(e));
                }
            },
        };
        // The point's work was queued before `mark`, so an event recorded
        // after it covers that work (and possibly a little more, never
        // less).
        // SAFETY: `event` was made by `core.gpu` (a spare of this notifier
        // or just created) and is destroyed only by `release_handles`, when
        // `core` drops; the user stream is kept alive by `core.pool`.
        if let Err(e) = unsafe { core.gpu.event_record(event, notifier.user_stream()) } {
            notifier.release(seq, Some(event));
            return Err(ResourceError::from(e));
        }
        notifier.recorded(seq, event);
        Ok(EventFuture::new(
            core.clone(),
            stream,
            seq,
            Some(event),
            core.policy.get(),
        ))
    }

    /// A completion point at the current end of `stream` that records no
    /// event yet (see [`AsyncResource::completion_lazy`](super::AsyncResource::completion_lazy)),
    /// refused while the stream is being captured into a graph.
    pub(crate) fn lazy_point(core: &Arc<Core>, stream: StreamId) -> ResourceResult<EventFuture> {
        let notifier = core.notifier(stream)?;
        notifier.refuse_capturing(&*core.gpu)?;
        Ok(Self::marked(core, stream, notifier))
    }

    /// A completion point at the current end of `stream`, made after work
    /// that cannot be taken back (a graph's replay): it cannot fail. Its
    /// event is recorded now; when that fails, the point is lazy instead
    /// (a mark, which cannot fail), and the record is tried again when it
    /// is polled, whose error the future then returns. `notifier` is
    /// `stream`'s, found by the caller before that work was queued.
    pub(crate) fn point_after(
        core: &Arc<Core>,
        stream: StreamId,
        notifier: &Notifier,
    ) -> EventFuture {
        Self::point_outside_capture(core, stream)
            .unwrap_or_else(|_| Self::marked(core, stream, notifier))
    }

    /// A lazy point at the current end of `stream` (its notifier
    /// checked by the caller): a mark, no event yet.
    fn marked(core: &Arc<Core>, stream: StreamId, notifier: &Notifier) -> EventFuture {
        let seq = notifier.mark();
        EventFuture::new(core.clone(), stream, seq, None, core.policy.get())
    }

    fn new(
        core: Arc<Core>,
        stream: StreamId,
        seq: u64,
        event: Option<RawEvent>,
        policy: WaitPolicy,
    ) -> Self {
        EventFuture {
            core,
            stream,
            seq,
            event,
            policy,
            phase: Phase::New,
            result: None,
            tally: FutureTally::default(),
        }
    }

    /// The stream the point is on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The point's sequence number on its stream (monotonic per stream).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether the point is known reached, without waiting: queries the
    /// event once (a lazy point that has recorded none: its stream, unless
    /// the stream is being captured; nothing is recorded).
    ///
    /// # Errors
    /// The driver's error when the query fails (a device fault).
    pub fn is_complete(&self) -> ResourceResult<bool> {
        if let Some(r) = &self.result {
            return r.clone().map(|()| true);
        }
        if let Some(r) = self
            .core
            .checked_notifier(self.stream)
            .and_then(|n| n.outcome(self.seq))
        {
            return r.map(|()| true);
        }
        Ok(self.query_once().transpose()?.is_some())
    }

    /// One query: `Some` when it settles the outcome. A done query settles
    /// every earlier point of the stream too.
    fn query(&mut self) -> Option<ResourceResult<()>> {
        self.tally.queries = self.tally.queries.saturating_add(1);
        self.query_once()
    }

    /// Of the point's event, or of the stream while a lazy point has none.
    fn query_once(&self) -> Option<ResourceResult<()>> {
        match self.event {
            Some(_) => self.query_event(),
            None => self.query_stream(),
        }
    }

    /// A lazy point's query: whether its stream is idle. An idle stream has
    /// run everything queued before every point marked so far, so the
    /// query settles them all. A busy one says nothing about this point
    /// (work queued after it may be running): `None`. A capturing stream is
    /// not asked (a query would invalidate the capture): `None`, and the
    /// point waits for a notification after the capture.
    fn query_stream(&self) -> Option<ResourceResult<()>> {
        let gpu = &*self.core.gpu;
        let n = self.core.checked_notifier(self.stream)?;
        if n.user_capturing(gpu) {
            return None;
        }
        // Read before the query: only points marked by then are known to
        // have had their work queued before it.
        let through = n.marked().max(self.seq);
        // SAFETY: `gpu` is the notifier's backend (`Core::gpu`); the user
        // stream is a stream of the pool `core` holds, which keeps it alive,
        // and it was found not capturing just above.
        match unsafe { gpu.stream_query(n.user_stream()) } {
            Ok(true) => {
                n.observe(gpu, through);
                Some(Ok(()))
            }
            Ok(false) => None,
            // A capture begun since the check refused the query: wait for
            // it to end, as above.
            Err(_) if n.user_capturing(gpu) => None,
            Err(e) => Some(Err(ResourceError::from(e))),
        }
    }

    /// A lazy point stops querying its stream: it records its event now
    /// and waits on that from here on, as a point made by
    /// [`completion`](super::AsyncResource::completion) does. The event
    /// covers the point's work and whatever was queued on the stream since
    /// the point was made. Nothing is recorded while the stream is being
    /// captured: the point then waits for a notification after the
    /// capture.
    fn record_now(&mut self) -> ResourceResult<()> {
        if self.event.is_some() {
            return Ok(());
        }
        let Some(n) = self.core.checked_notifier(self.stream) else {
            return Err(ResourceError::Shutdown);
        };
        let gpu = &*self.core.gpu;
        if n.user_capturing(gpu) {
            return Ok(());
        }
        let event = match n.spare_event() {
            Some(e) => e,
            None => gpu.event_create().map_err(ResourceError::from)?,
        };
        // SAFETY: `event` was made by `core.gpu` (a spare of this notifier
        // or just created) and is destroyed only by `release_handles`, when
        // `core` drops; the user stream is kept alive by `core.pool`, and
        // was found not capturing just above.
        if let Err(e) = unsafe { gpu.event_record(event, n.user_stream()) } {
            n.return_spare(event);
            return Err(ResourceError::from(e));
        }
        n.recorded(self.seq, event);
        self.event = Some(event);
        Ok(())
    }

    fn query_event(&self) -> Option<ResourceResult<()>> {
        let event = self.event?;
        // SAFETY: the point's event was made by `core.gpu` and is destroyed
        // only when `core` drops, which this future keeps alive.
        match unsafe { self.core.gpu.event_query(event) } {
            Ok(true) => {
                if let Some(n) = self.core.checked_notifier(self.stream) {
                    n.observe(&*self.core.gpu, self.seq);
                }
                Some(Ok(()))
            }
            Ok(false) => None,
            Err(e) => Some(Err(ResourceError::from(e))),
        }
    }

    fn settle(&mut self, result: ResourceResult<()>) -> Poll<ResourceResult<()>> {
        self.release();
        if matches!(self.phase, Phase::Parked)
            && let Some(n) = self.core.checked_notifier(self.stream)
        {
            // Woken by a notification: the points parked after this one
            // want the next, which this task can queue now rather than
            // wait for the dispatcher to be scheduled (nothing when one is
            // in flight or none is wanted).
            n.launch(&*self.core.gpu);
        }
        self.result = Some(result.clone());
        Poll::Ready(result)
    }

    /// Lets go of the point and returns the event (once).
    fn release(&mut self) {
        if self.result.is_some() {
            return;
        }
        if let Some(n) = self.core.checked_notifier(self.stream) {
            n.release(self.seq, self.event.take());
        }
    }

    /// Registers the task and makes sure a notification will come.
    fn park(&mut self, cx: &mut Context<'_>) -> Poll<ResourceResult<()>> {
        self.phase = Phase::Parked;
        let Some(n) = self.core.checked_notifier(self.stream) else {
            return self.settle(Err(crate::ResourceError::Shutdown));
        };
        // A notification may have landed since the last check: `register`
        // says so under the same lock the notification takes.
        // WhenBehind::Yield futures are notified at their own point (see
        // `WhenBehind`): the notifier targets points registered with an event.
        let own = self
            .event
            .filter(|_| self.policy.behind == WhenBehind::Yield);
        if let Some(r) = n.register(self.seq, cx.waker(), own) {
            return self.settle(r);
        }
        n.request(&*self.core.gpu);
        self.core.kick.pending();
        Poll::Pending
    }
}

impl EventFuture {
    /// First poll, not behind: one query, then busy-querying for
    /// [`WaitPolicy::spin`].
    fn first_query(&mut self) -> Result<Instant, Poll<ResourceResult<()>>> {
        if let Some(r) = self.query() {
            return Err(self.settle(r));
        }
        let since = Instant::now();
        let mut last = since;
        if !self.policy.spin.is_zero() {
            self.tally.spins = self.tally.spins.saturating_add(1);
            loop {
                std::hint::spin_loop();
                let now = Instant::now();
                if now - since >= self.policy.spin {
                    break;
                }
                if now - last >= self.policy.query_every {
                    last = now;
                    if let Some(r) = self.query() {
                        return Err(self.settle(r));
                    }
                }
            }
        }
        if let Err(e) = self.record_now() {
            return Err(self.settle(Err(e)));
        }
        self.phase = Phase::Querying { since, last };
        Ok(since)
    }

    /// Lets other tasks run and polls again soon; a notification or another
    /// future's query may settle this one first.
    fn yield_now(&mut self, cx: &mut Context<'_>) -> Poll<ResourceResult<()>> {
        self.tally.yields = self.tally.yields.saturating_add(1);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Future for EventFuture {
    type Output = ResourceResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _scope = PollScope::enter();
        if let Some(r) = &self.result {
            return Poll::Ready(r.clone());
        }
        let behind = match self.core.checked_notifier(self.stream) {
            Some(n) => match n.check(self.seq) {
                Ok(r) => return self.settle(r),
                Err(behind) => behind,
            },
            None => return self.settle(Err(crate::ResourceError::Shutdown)),
        };
        let since = match self.phase {
            Phase::Parked if behind => return self.park(cx),
            Phase::Parked => {
                // Polled again while parked (a spurious or a foreign wake):
                // one query is cheaper than waiting for the notification.
                if let Some(r) = self.query() {
                    return self.settle(r);
                }
                return self.park(cx);
            }
            // Behind an earlier pending point of the same stream, this one
            // cannot be reached either: no query.
            Phase::New if behind => match self.policy.behind {
                WhenBehind::Park => return self.park(cx),
                WhenBehind::Yield => {
                    let since = Instant::now();
                    self.phase = Phase::Behind { since };
                    since
                }
            },
            Phase::New => match self.first_query() {
                Ok(since) => since,
                Err(ready) => return ready,
            },
            Phase::Behind { since } if behind => since,
            // The points before it settled: query as from now on.
            Phase::Behind { since } => {
                let now = Instant::now();
                self.phase = Phase::Querying { since, last: now };
                if let Some(r) = self.query() {
                    return self.settle(r);
                }
                if let Err(e) = self.record_now() {
                    return self.settle(Err(e));
                }
                since
            }
            Phase::Querying { since, last } => {
                let now = Instant::now();
                if now - last >= self.policy.query_every {
                    self.phase = Phase::Querying { since, last: now };
                    if let Some(r) = self.query() {
                        return self.settle(r);
                    }
                }
                since
            }
        };
        if since.elapsed() < self.policy.yield_for {
            return self.yield_now(cx);
        }
        self.park(cx)
    }
}

impl Drop for EventFuture {
    fn drop(&mut self) {
        self.release();
        if let Some(n) = self.core.checked_notifier(self.stream) {
            n.tally.fold(self.tally);
        }
    }
}
