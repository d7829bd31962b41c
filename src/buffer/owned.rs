//! [`Buffer`]: a typed device buffer that owns its block and frees it when
//! dropped.

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

use super::element::DeviceElement;

use super::drop_errors;
use super::guard::{UseGuard, UseGuardMut};
use super::home::{BufferHome, refuse_capturing};
use super::ledger::BufferCore;
use super::refused::RefusedConversion;
use super::view::{BufferView, BufferViewMut, element_range};
use crate::device::deferred_frees::FreeLater;
use crate::error::{ResourceError, ResourceResult};
use crate::types::{AllocTag, BlockId, DeviceBlock, StreamId};

/// `len` elements of `T` in device memory, owned: dropping the buffer queues
/// its stream-ordered free after every use recorded on it.
///
/// A `Buffer` comes from an awaiting allocation
/// ([`AsyncResource::allocate_buffer`](crate::AsyncResource::allocate_buffer))
/// or a plain one ([`StreamOrderedResource::allocate_buffer`](crate::StreamOrderedResource::allocate_buffer),
/// [`Buffer::allocate_in`]). It holds its block and a handle on its
/// resource, so a task cancelled at any await, a panic or a `?` frees it as
/// a `Vec` or cudarc's `CudaSlice` would. [`into_block`](Self::into_block)
/// opts out, handing back the bare [`DeviceBlock`].
///
/// Uses on streams go through guards ([`read_on`](Self::read_on),
/// [`write_on`](Self::write_on)), the safe helpers
/// ([`fill_bytes_on`](Self::fill_bytes_on), [`copy_from_on`](Self::copy_from_on)),
/// a launch ([`AsyncResource::launch`](crate::AsyncResource::launch)),
/// or, on CUDA, cudarc itself ([`CudaBuffer`](super::CudaBuffer)).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use std::sync::Arc;
/// use streamalloc::AsyncResource;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 2);
/// let pool = device.streams().clone();
/// let res = AsyncResource::new(Arc::new(SimResource::new(&device)))?;
/// let (a, b) = (pool.id(0).unwrap(), pool.id(1).unwrap());
///
/// let mut x = res.allocate_buffer::<f32>(1024, a, AllocTag("x")).await?;
/// x.fill_bytes_on(a, 0)?;          // written on a
/// {
///     let read = x.read_on(b)?;    // b waits for the fill
///     // ... queue a kernel reading read.ptr() on b ...
/// }                                // the read is recorded on b
/// drop(x);                         // the free waits for the read on b
/// res.reap_pending().await?;
/// assert_eq!(res.bytes_outstanding(), 0);
/// # Ok(()) }
/// ```
///
/// # Stream ordering
/// The buffer is usable on its [`stream`](Self::stream) from the
/// allocation on; a use on another stream is ordered after the allocation
/// and the last write (and, for a write, every read) by its guard, and the
/// free waits for every use recorded. Resources that cannot track
/// cross-stream uses refuse them with
/// [`TrackingUnsupported`](ResourceError::TrackingUnsupported).
pub struct Buffer<T> {
    pub(crate) core: BufferCore,
    len: usize,
    // Set by `into_block`: the block left, so `Drop` frees nothing.
    released: bool,
    // The device holds the `T`s; the host holds none (always Send + Sync).
    _elem: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("elem", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("core", &self.core)
            .finish()
    }
}

/// Bytes of `len` elements of `T`.
pub(crate) fn byte_len<T>(len: usize) -> ResourceResult<usize> {
    let elem_size = std::mem::size_of::<T>();
    len.checked_mul(elem_size)
        .ok_or(ResourceError::SizeOverflow { len, elem_size })
}

impl<T: DeviceElement> Buffer<T> {
    /// Adopts `block` (live, of `home`) as a buffer of `len` elements.
    pub(crate) fn adopt(block: DeviceBlock, len: usize, home: Arc<dyn BufferHome>) -> Self {
        Buffer {
            core: BufferCore::new(block, home),
            len,
            released: false,
            _elem: PhantomData,
        }
    }

    /// Allocates `len` elements on `stream` from any synchronous resource
    /// (an adaptor stack, for instance) that allocates on `device`.
    ///
    /// Safe for any resource: its implementation vouched for its blocks
    /// (the trait is `unsafe`), and `stream` must be an id of `device`'s own
    /// pool, which the resource resolves too (it refuses other pools' ids),
    /// so the buffer's work runs on the device instance whose memory the
    /// block is, never on another device of the same ordinal.
    ///
    /// # Errors
    /// [`WrongDevice`](ResourceError::WrongDevice) when `resource` serves
    /// another device; [`ForeignStream`](ResourceError::ForeignStream) when
    /// `stream` is not an id of `device`'s pool, or the resource's pool is
    /// not `device`'s; [`SizeOverflow`](ResourceError::SizeOverflow); or as
    /// [`DeviceMemoryResource::allocate`](crate::DeviceMemoryResource::allocate).
    /// Nothing changes.
    pub fn allocate_in<R, G>(
        resource: Arc<R>,
        device: &crate::Device<G>,
        len: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<Self>
    where
        R: crate::DeviceMemoryResource + 'static,
        G: crate::gpu::Gpu,
    {
        ResourceError::check_device(device.ordinal(), resource.device_ordinal())?;
        // The buffer resolves its streams through `device`'s pool and the
        // resource through its own: one id both accept names one stream.
        device.raw(stream)?;
        let block = resource.allocate(byte_len::<T>(len)?, stream, tag)?;
        let home = super::home::SyncHome {
            resource,
            gpu: device.gpu().clone(),
            pool: device.streams().clone(),
        };
        Ok(Self::adopt(block, len, Arc::new(home)))
    }
}

impl<T> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The block's id (for the resource's hooks and statistics). Uses
    /// begun through an [`AsyncResource`](crate::AsyncResource)'s
    /// hooks keep the buffer's free ordered after them; a use begun on its
    /// inner resource directly is outside what the buffer can see.
    pub fn id(&self) -> BlockId {
        self.core.block.id()
    }

    /// The stream the buffer was allocated on, where it will be freed.
    pub fn stream(&self) -> StreamId {
        self.core.block.stream()
    }

    /// The block, to read its address, size or tag. Using the address
    /// directly bypasses the ordering: prefer the guards, or use it inside
    /// a declared launch ([`AsyncResource::launch`](crate::AsyncResource::launch)).
    /// Work queued with the address outside any declared use is not
    /// ordered against the buffer's free, not even on the buffer's own
    /// stream: once the buffer's last declared launch has completed, its
    /// drop hands the memory to every stream at once.
    pub fn block(&self) -> &DeviceBlock {
        &self.core.block
    }

    /// Gives up ownership: every use recorded so far stays recorded, and the
    /// caller frees the block with
    /// [`DeviceMemoryResource::deallocate`](crate::DeviceMemoryResource::deallocate)
    /// (or never).
    ///
    /// # Errors
    /// An error recording a use made through cudarc; the buffer is handed
    /// back unchanged, still owning its block.
    pub fn into_block(mut self) -> Result<DeviceBlock, RefusedConversion<Self>> {
        if let Err(e) = self.core.finish_all() {
            return Err(RefusedConversion::new(e, self));
        }
        self.released = true;
        Ok(self.core.block.clone())
    }

    /// A read of the whole buffer on `stream`: `stream` waits for the last
    /// write, and the guard's drop records the read, so that later writes and
    /// the free wait for it. Queue the work that reads
    /// [`ptr`](UseGuard::ptr) on `stream` while the guard lives.
    ///
    /// # Errors
    /// An unknown stream, [`TrackingUnsupported`](ResourceError::TrackingUnsupported),
    /// a driver error; nothing is recorded.
    pub fn read_on(&self, stream: StreamId) -> ResourceResult<UseGuard<'_>> {
        UseGuard::begin(&self.core, self.core.block.ptr(), self.num_bytes(), stream)
    }

    /// A write of the whole buffer on `stream`: `stream` waits for every
    /// earlier use, and the guard's drop records the write.
    ///
    /// # Errors
    /// As [`read_on`](Self::read_on).
    pub fn write_on(&mut self, stream: StreamId) -> ResourceResult<UseGuardMut<'_>> {
        let bytes = self.num_bytes();
        UseGuardMut::begin(&self.core, self.core.block.ptr(), bytes, stream)
    }

    /// A view of elements `range`, bound to the buffer's stream.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds) for a range past the end
    /// or reversed.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> ResourceResult<BufferView<'_, T>> {
        let (start, len) = element_range(range, self.len)?;
        Ok(BufferView::new(&self.core, start, len))
    }

    /// A mutable view of elements `range`, bound to the buffer's stream.
    ///
    /// # Errors
    /// As [`slice`](Self::slice).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> ResourceResult<BufferViewMut<'_, T>> {
        let (start, len) = element_range(range, self.len)?;
        Ok(BufferViewMut::new(&self.core, start, len))
    }

    /// Queues, on `stream`, a fill of every byte of the buffer with `value`
    /// (ordered as a write).
    ///
    /// # Errors
    /// As [`write_on`](Self::write_on), and the driver's error.
    pub fn fill_bytes_on(&mut self, stream: StreamId, value: u8) -> ResourceResult<()> {
        self.slice_mut(..)?.fill_bytes_on(stream, value)
    }

    /// Queues, on `stream`, a copy of `src` into this buffer (ordered as a
    /// read of `src` and a write of `self`).
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds) when the lengths differ;
    /// otherwise as [`write_on`](Self::write_on) and the driver's error.
    pub fn copy_from_on(&mut self, stream: StreamId, src: &Buffer<T>) -> ResourceResult<()> {
        let src = src.slice(..)?;
        self.slice_mut(..)?.copy_from_on(stream, &src)
    }
}

impl<T> Drop for Buffer<T> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let block = self.core.block.id();
        // Record the uses cudarc made, then free after all of them. When a
        // use cannot be recorded, freeing could race it on the GPU: the
        // block is leaked instead (the device is most likely faulted), and
        // the error kept. A use on a stream being captured now is recorded
        // once the capture ended, and the block freed after it then.
        match self.core.finish_all() {
            Ok(()) => {}
            Err(ResourceError::StreamCapturing { .. }) => {
                let later = FinishThenFree {
                    uses: std::sync::Mutex::new(self.core.take_deferred()),
                    home: self.core.home.clone(),
                };
                let deferred = self.core.home.pool().deferred_frees();
                deferred.defer(Arc::new(later), self.core.block.clone());
                deferred.retry();
                return;
            }
            Err(e) => {
                drop_errors::report(block, "recording a use before the free (block leaked)", e);
                return;
            }
        }
        let done_at = self.core.done_at();
        let deferred = self.core.home.pool().deferred_frees();
        match self.core.home.free(self.core.block.clone(), done_at) {
            Ok(()) => {}
            // A free a capture refused (the block stays live) is kept on
            // the pool and applied once the capture ends: a drop never
            // leaks for a capture (`device::deferred_frees`).
            Err(ResourceError::StreamCapturing { .. }) => {
                let home = Arc::new(HomeFree(self.core.home.clone()));
                deferred.defer(home, self.core.block.clone());
            }
            Err(e) => drop_errors::report(block, "freeing on drop", e),
        }
        deferred.retry();
    }
}

/// A dropped buffer whose uses on a capturing stream could not be
/// recorded ([`BufferCore::finish_all`]): once no stream of them captures,
/// each is finished (an event recorded after it), then the block freed
/// after them, as the drop would have. Kept on the pool's deferred frees
/// until then ([`FreeLater`]).
struct FinishThenFree {
    home: Arc<dyn BufferHome>,
    /// The uses not finished yet.
    uses: std::sync::Mutex<Vec<(StreamId, crate::types::Access)>>,
}

impl FreeLater for FinishThenFree {
    fn free_later(&self, block: DeviceBlock) -> ResourceResult<()> {
        let mut uses = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(&(stream, access)) = uses.last() {
            refuse_capturing(&*self.home, stream)?;
            self.home.finish(block.id(), stream, access)?;
            uses.pop();
        }
        self.home.free(block, None)
    }

    fn report(&self, block: &DeviceBlock, error: ResourceError) {
        drop_errors::report(
            block.id(),
            "recording a use before the free, after a capture (block leaked)",
            error,
        );
    }
}

/// A buffer's home, as where the pool frees a block a capture refused
/// ([`FreeLater`]).
struct HomeFree(Arc<dyn BufferHome>);

impl FreeLater for HomeFree {
    fn free_later(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.0.free(block, None)
    }

    fn report(&self, block: &DeviceBlock, error: ResourceError) {
        drop_errors::report(block.id(), "freeing on drop, after a capture", error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_len_overflow_is_an_error() {
        assert_eq!(byte_len::<u32>(4), Ok(16));
        assert!(matches!(
            byte_len::<u64>(usize::MAX / 2),
            Err(ResourceError::SizeOverflow { elem_size: 8, .. })
        ));
    }

    #[test]
    fn buffers_are_send_and_sync() {
        fn check<X: Send + Sync>() {}
        check::<Buffer<f32>>();
        check::<BufferView<'static, f32>>();
        check::<BufferViewMut<'static, f32>>();
    }
}
