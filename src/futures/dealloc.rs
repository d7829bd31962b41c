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
use crate::error::ResourceResult;
use crate::types::StreamId;
use crate::util::poll_scope::PollScope;

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
    /// The point covering the free on the notifier of `stream`.
    point: u64,
    result: Option<ResourceResult<()>>,
}

impl DeallocHandle {
    pub(crate) fn new(core: Arc<Core>, stream: StreamId, free_seq: u64, point: u64) -> Self {
        DeallocHandle {
            core,
            stream,
            free_seq,
            point,
            result: None,
        }
    }

    fn outcome(&self) -> Option<ResourceResult<()>> {
        self.core
            .checked_notifier(self.stream)
            .and_then(|n| n.outcome(self.point))
    }

    /// The stream the free is queued on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Whether the free is known executed and applied, without waiting:
    /// when it says `true`, the bytes are out of
    /// [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding).
    /// A free known executed whose bytes the dispatcher has not applied yet
    /// is applied here (as awaiting the handle would).
    pub fn is_complete(&self) -> bool {
        match &self.result {
            Some(r) => r.is_ok(),
            None => {
                let done = matches!(self.outcome(), Some(Ok(())));
                if done {
                    // Idempotent: the dispatcher may have applied it already.
                    self.core.reap(self.stream, self.free_seq);
                }
                done
            }
        }
    }
}

impl Future for DeallocHandle {
    type Output = ResourceResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _scope = PollScope::enter();
        if let Some(r) = &self.result {
            return Poll::Ready(r.clone());
        }
        let Some(n) = self.core.checked_notifier(self.stream) else {
            return Poll::Ready(Err(crate::ResourceError::Shutdown));
        };
        let Some(r) = n.register(self.point, cx.waker(), None) else {
            n.request(&*self.core.gpu);
            self.core.kick.pending();
            return Poll::Pending;
        };
        n.release(self.point, None);
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
        if self.result.is_none()
            && let Some(n) = self.core.checked_notifier(self.stream)
        {
            // The free itself stays queued in the notifier.
            n.release(self.point, None);
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
    parts: Vec<(StreamId, u64, u64)>,
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
        let _scope = PollScope::enter();
        let core = self.core.clone();
        let mut error = None;
        self.parts.retain(|&(stream, free_seq, point)| {
            let Some(n) = core.checked_notifier(stream) else {
                return false;
            };
            let outcome = n.register(point, cx.waker(), None);
            if outcome.is_none() {
                n.request(&*core.gpu);
                return true;
            }
            n.release(point, None);
            match outcome {
                Some(Err(e)) => {
                    error.get_or_insert(e);
                }
                _ => core.reap(stream, free_seq),
            }
            false
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
        for &(stream, _, point) in &self.parts {
            if let Some(n) = self.core.checked_notifier(stream) {
                n.release(point, None);
            }
        }
    }
}
