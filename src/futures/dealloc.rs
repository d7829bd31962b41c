//! Frees as futures: [`DeallocHandle`] for one free, [`ReapFuture`] for
//! every free pending at a moment.
//!
//! A free queued through [`AsyncResource::deallocate`](super::AsyncResource::deallocate)
//! is a point on its stream's notifier, paired with the inner resource's
//! free sequence number. When a notification covers the point, the bytes
//! leave the inner resource's pending tally (`reap_through`) — whether or
//! not anyone awaits the handle.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::core::Core;
use super::waiter::Waiter;
use crate::error::ResourceResult;
use crate::types::StreamId;

/// The free of one block, queued on its stream.
///
/// Awaiting it resolves once the GPU has executed the free and the bytes are
/// back in the accounting (out of
/// [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding)).
/// Dropping it is fine: the free is already queued, and the
/// [dispatcher](super::Reaper) applies it to the accounting when its
/// notification lands.
///
/// # Errors
/// The driver's error when the device faulted before the free was known to
/// execute (the bytes then stay counted as pending).
///
/// # Cancel safety
/// Cancel safe: dropping it loses nothing, blocks nothing and frees nothing
/// early.
#[derive(Debug)]
pub struct DeallocHandle {
    core: Arc<Core>,
    stream: StreamId,
    free_seq: u64,
    waiter: Arc<Waiter>,
    result: Option<ResourceResult<()>>,
}

impl DeallocHandle {
    pub(crate) fn new(
        core: Arc<Core>,
        stream: StreamId,
        free_seq: u64,
        waiter: Arc<Waiter>,
    ) -> Self {
        DeallocHandle {
            core,
            stream,
            free_seq,
            waiter,
            result: None,
        }
    }

    /// The stream the free is queued on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Whether the free is known executed and applied, without waiting.
    pub fn is_complete(&self) -> bool {
        matches!(self.waiter.result(), Some(Ok(())))
    }
}

impl Future for DeallocHandle {
    type Output = ResourceResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(r) = &self.result {
            return Poll::Ready(r.clone());
        }
        let mut outcome = self.waiter.result();
        if outcome.is_none() {
            self.waiter.register(cx.waker());
            outcome = self.waiter.result();
        }
        let Some(r) = outcome else {
            if let Ok(n) = self.core.notifier(self.stream) {
                n.request(&*self.core.gpu);
            }
            self.core.kick.pending();
            return Poll::Pending;
        };
        if r.is_ok() {
            // Idempotent: the dispatcher may have applied it already.
            self.core.reap(self.stream, self.free_seq);
        }
        self.result = Some(r.clone());
        Poll::Ready(r)
    }
}

impl Drop for DeallocHandle {
    fn drop(&mut self) {
        if self.waiter.result().is_none()
            && let Ok(n) = self.core.notifier(self.stream)
        {
            // The free itself stays queued in the notifier.
            n.forget(&self.waiter);
        }
    }
}

/// Resolves when every free pending at the call of
/// [`AsyncResource::reap_pending`](super::AsyncResource::reap_pending) has
/// executed and left the accounting, without synchronizing a stream or
/// parking a thread.
///
/// # Errors
/// The first driver error of a stream whose device faulted.
///
/// # Cancel safety
/// Cancel safe: dropping it loses nothing; the frees are applied anyway.
#[must_use = "a ReapFuture does nothing unless awaited"]
#[derive(Debug)]
pub struct ReapFuture {
    core: Arc<Core>,
    /// `(stream, inner free sequence number, point)` per stream with frees.
    parts: Vec<(StreamId, u64, Arc<Waiter>)>,
}

impl ReapFuture {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        let mut parts = Vec::new();
        for n in core.notifiers() {
            let free_seq = core.inner.pending_free_seq(n.stream);
            if free_seq > n.reaped() {
                parts.push((n.stream, free_seq, n.mark()));
            }
        }
        ReapFuture { core, parts }
    }

    /// Streams whose frees are still awaited.
    pub fn pending_streams(&self) -> usize {
        self.parts.len()
    }
}

impl Future for ReapFuture {
    type Output = ResourceResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = self.core.clone();
        let mut error = None;
        self.parts.retain(|(stream, free_seq, waiter)| {
            waiter.register(cx.waker());
            match waiter.result() {
                None => {
                    if let Ok(n) = core.notifier(*stream) {
                        n.request(&*core.gpu);
                    }
                    true
                }
                Some(Ok(())) => {
                    core.reap(*stream, *free_seq);
                    false
                }
                Some(Err(e)) => {
                    error.get_or_insert(e);
                    false
                }
            }
        });
        if let Some(e) = error {
            return Poll::Ready(Err(e));
        }
        if self.parts.is_empty() {
            return Poll::Ready(Ok(()));
        }
        core.kick.pending();
        Poll::Pending
    }
}

impl Drop for ReapFuture {
    fn drop(&mut self) {
        for (stream, _, waiter) in &self.parts {
            if waiter.result().is_none()
                && let Ok(n) = self.core.notifier(*stream)
            {
                n.forget(waiter);
            }
        }
    }
}
