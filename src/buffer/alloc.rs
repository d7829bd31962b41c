//! Where buffers come from: an awaiting allocation on an
//! [`AsyncResource`], a plain one on the synchronous resources.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::element::DeviceElement;

use super::home::BufferHome;
use super::owned::{Buffer, byte_len};
use crate::error::{ResourceError, ResourceResult};
use crate::futures::{AllocFuture, AsyncResource};
use crate::gpu::Gpu;
use crate::resource::{DeviceMemoryResource, StreamOrderedResource};
use crate::types::{AllocTag, StreamId, Tag};

/// The future of [`AsyncResource::allocate_buffer`]: an [`AllocFuture`]
/// whose block becomes a [`Buffer`] in the same poll that allocates it.
///
/// # Cancel safety
/// Cancel safe, as [`AllocFuture`]: dropped while waiting it holds nothing;
/// once it has allocated, the block is already owned by the buffer it
/// returns.
#[must_use = "a BufferFuture allocates nothing unless awaited"]
#[derive(Debug)]
pub struct BufferFuture<T> {
    alloc: Result<AllocFuture, Option<ResourceError>>,
    home: Arc<dyn BufferHome>,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T: DeviceElement> Future for BufferFuture<T> {
    type Output = ResourceResult<Buffer<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.alloc {
            Err(e) => Poll::Ready(Err(e.take().unwrap_or(ResourceError::Shutdown))),
            Ok(alloc) => match Pin::new(alloc).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(r) => {
                    Poll::Ready(r.map(|block| Buffer::adopt(block, this.len, this.home.clone())))
                }
            },
        }
    }
}

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Allocates a buffer of `len` elements of `T` on `stream`, waiting
    /// while the device or budget is full (as [`allocate`](Self::allocate)).
    /// Dropping the buffer frees it, stream-ordered, after its uses.
    ///
    /// # Errors
    /// [`SizeOverflow`](ResourceError::SizeOverflow) when `len` elements do
    /// not fit in `usize` bytes; otherwise as [`AllocFuture`].
    ///
    /// # Cancel safety
    /// Cancel safe (see [`BufferFuture`]).
    pub fn allocate_buffer<T: DeviceElement>(
        &self,
        len: usize,
        stream: StreamId,
        tag: impl Into<Tag>,
    ) -> BufferFuture<T> {
        let alloc = byte_len::<T>(len)
            .map(|bytes| self.allocate(bytes, stream, tag))
            .map_err(Some);
        BufferFuture {
            alloc,
            home: self.core().clone(),
            len,
            _elem: PhantomData,
        }
    }

    /// Allocates a buffer at once, failing when the device or budget is full
    /// (as [`try_allocate`](Self::try_allocate)).
    ///
    /// # Errors
    /// [`SizeOverflow`](ResourceError::SizeOverflow); otherwise as
    /// [`try_allocate`](Self::try_allocate). Nothing changes.
    pub fn try_allocate_buffer<T: DeviceElement>(
        &self,
        len: usize,
        stream: StreamId,
        tag: impl Into<Tag>,
    ) -> ResourceResult<Buffer<T>> {
        let block = self.try_allocate(byte_len::<T>(len)?, stream, tag)?;
        Ok(Buffer::adopt(block, len, self.core().clone()))
    }
}

impl<G: Gpu> StreamOrderedResource<G> {
    /// Allocates a buffer of `len` elements of `T` on `stream`, at once.
    /// Dropping it queues its free (reaped by
    /// [`reap_pending`](DeviceMemoryResource::reap_pending)).
    ///
    /// # Errors
    /// [`SizeOverflow`](ResourceError::SizeOverflow); otherwise as
    /// [`DeviceMemoryResource::allocate`]. Nothing changes.
    pub fn allocate_buffer<T: DeviceElement>(
        self: &Arc<Self>,
        len: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<Buffer<T>> {
        let block = self.allocate(byte_len::<T>(len)?, stream, tag)?;
        Ok(Buffer::adopt(block, len, self.clone()))
    }
}
