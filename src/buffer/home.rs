//! A buffer's home: the resource it came from, seen through the few calls a
//! buffer makes on it.
//!
//! [`BufferHome`] is object safe, so that one [`Buffer`](super::Buffer) type
//! serves every resource: a synchronous resource or adaptor stack
//! ([`SyncHome`]), or an [`AsyncResource`](crate::AsyncResource), whose frees reach the
//! accounting through completion notifications, without a synchronize.

// Unsafe here: one capture-status query of a stream of the home's pool.
#![allow(unsafe_code)]

use std::sync::Arc;

use crate::device::StreamPool;
use crate::error::{ResourceError, ResourceResult};
use crate::futures::{Core, DoneAt, deallocate_detached};
use crate::gpu::Gpu;
use crate::resource::{DeviceMemoryResource, StreamOrderedResource};
use crate::types::{Access, BlockId, DeviceBlock, StreamId};

/// Refuses with [`StreamCapturing`](ResourceError::StreamCapturing) when
/// `stream` is inside a capture now: a use queued there before the capture
/// can be finished (an event recorded after it) only once the capture
/// ended, since an event recorded during it is captured, not recorded.
///
/// # Errors
/// That refusal; the pool's error for a stream it does not know; the
/// driver's error asking.
pub(crate) fn refuse_capturing(home: &dyn BufferHome, stream: StreamId) -> ResourceResult<()> {
    let raw = home.pool().raw(stream)?;
    // SAFETY: `raw` was resolved through the home's pool, which keeps its
    // streams alive, and belongs to the home's backend.
    unsafe { home.gpu().capture_status(raw) }
        .map_err(ResourceError::from)?
        .refuse(stream)
}

/// What a buffer asks of the resource that owns its block.
pub(crate) trait BufferHome: Send + Sync {
    /// The backend, for the fill and copy helpers.
    fn gpu(&self) -> &dyn Gpu;
    /// The pool that resolves the buffer's streams.
    fn pool(&self) -> &Arc<StreamPool>;
    /// Whether the stack tracks cross-stream uses.
    fn tracks_uses(&self) -> bool;
    /// [`DeviceMemoryResource::prepare_block_use`].
    fn prepare(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()>;
    /// [`DeviceMemoryResource::finish_block_use`].
    fn finish(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()>;
    /// Queues the stream-ordered free of `block`. `done_at`: a point of the
    /// block's stream whose settling means the GPU is done with the block
    /// (see [`BufferCore::done_at`](super::ledger::BufferCore::done_at)); a
    /// home that knows its points may then free it as completed.
    fn free(&self, block: DeviceBlock, done_at: Option<DoneAt>) -> ResourceResult<()>;
}

impl std::fmt::Debug for dyn BufferHome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BufferHome")
    }
}

/// A synchronous resource (or adaptor stack) with the backend and pool its
/// buffers need.
pub(crate) struct SyncHome<R: ?Sized> {
    pub(crate) resource: Arc<R>,
    pub(crate) gpu: Arc<dyn Gpu>,
    pub(crate) pool: Arc<StreamPool>,
}

impl<R: DeviceMemoryResource + ?Sized> BufferHome for SyncHome<R> {
    fn gpu(&self) -> &dyn Gpu {
        &*self.gpu
    }
    fn pool(&self) -> &Arc<StreamPool> {
        &self.pool
    }
    fn tracks_uses(&self) -> bool {
        self.resource.supports_block_use_tracking()
    }
    fn prepare(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.resource.prepare_block_use(block, stream, access)
    }
    fn finish(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.resource.finish_block_use(block, stream, access)
    }
    fn free(&self, block: DeviceBlock, _: Option<DoneAt>) -> ResourceResult<()> {
        self.resource.deallocate(block)
    }
}

/// The stream-ordered resource is its own home: a buffer holds an `Arc` of
/// it, with no allocation of its own.
impl<G: Gpu> BufferHome for StreamOrderedResource<G> {
    fn gpu(&self) -> &dyn Gpu {
        &**StreamOrderedResource::gpu(self)
    }
    fn pool(&self) -> &Arc<StreamPool> {
        self.stream_pool()
    }
    fn tracks_uses(&self) -> bool {
        self.supports_block_use_tracking()
    }
    fn prepare(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.prepare_block_use(block, stream, access)
    }
    fn finish(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.finish_block_use(block, stream, access)
    }
    fn free(&self, block: DeviceBlock, _: Option<DoneAt>) -> ResourceResult<()> {
        self.deallocate(block)
    }
}

/// An [`AsyncResource`](crate::AsyncResource)'s buffers hold its core (shared, no allocation of
/// their own), whose `inner` is the same resource, erased; their frees go
/// through the notifications as [`AsyncResource::deallocate`](crate::AsyncResource::deallocate)'s do.
impl BufferHome for Core {
    fn gpu(&self) -> &dyn Gpu {
        &*self.gpu
    }
    fn pool(&self) -> &Arc<StreamPool> {
        &self.pool
    }
    fn tracks_uses(&self) -> bool {
        self.inner.supports_block_use_tracking()
    }
    fn prepare(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.inner.prepare_block_use(block, stream, access)
    }
    fn finish(&self, block: BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.inner.finish_block_use(block, stream, access)
    }
    fn free(&self, block: DeviceBlock, done_at: Option<DoneAt>) -> ResourceResult<()> {
        deallocate_detached(self, block, done_at)
    }
}
