//! cudarc interop: [`CudaBuffer`] and its views implement cudarc's
//! [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`], and can be kernel
//! arguments ([`PushKernelArg`]), so cudarc's copies, launches and cuBLAS
//! calls take them directly and order themselves.
//!
//! # How a cudarc call is ordered
//! cudarc asks for the pointer with the stream it will queue on
//! (`device_ptr(&stream)`); the buffer maps that `CudaStream` to its
//! [`StreamId`] in the pool (a stream must be
//! [registered](crate::StreamPool::from_cuda_streams)) and prepares the use
//! there: the stream waits for the last write, and for a write also for
//! every read. cudarc's guard ([`SyncOnDrop`]) can only record a cudarc
//! event, so the use is finished at the next conflicting access instead
//! (see the ledger in the [module documentation](super)); Rust's borrows
//! put that access after cudarc queued its work.
//!
//! A kernel argument (`.arg(&buf)`) cannot see the launch's stream (cudarc
//! keeps it private), so it is ordered on the stream the buffer or view is
//! *bound to*: the buffer's allocation stream, or the stream given to
//! [`CudaBuffer::on`]. Launch on that stream.
//!
//! # Failure
//! cudarc's traits cannot return an error. When a use cannot be ordered (an
//! unregistered stream, a driver error), the pointer handed out is null and
//! the error is recorded on the context (cudarc's sticky error, which the
//! next `launch` or call returns before queuing anything) and in
//! [`drop_error_count`](super::drop_error_count): the call fails instead of
//! racing.

// Unsafe here: cudarc's `PushKernelArg` impls hand a buffer's address to a kernel launch.
#![allow(unsafe_code)]

use std::fmt;
use std::ops::{Deref, DerefMut, RangeBounds};
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{CUdeviceptr, CUresult};
use cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop,
};

use super::drop_errors;
use super::ledger::{BufferCore, End};
use super::owned::Buffer;
use super::refused::RefusedConversion;
use super::view::element_range;
use crate::error::{ResourceError, ResourceResult};
use crate::types::{Access, StreamId};

/// The address handed to cudarc when a use could not be ordered.
static NULL: CUdeviceptr = 0;

/// Prepares a use on cudarc's `stream`, deferred; the address to hand out.
fn begin(core: &BufferCore, ptr: CUdeviceptr, stream: &CudaStream, access: Access) -> CUdeviceptr {
    let device = core.block.device();
    let ordered = match core.home.pool().find_cuda(stream) {
        Some(id) => core.begin(id, access, End::Deferred),
        None => Err(ResourceError::UnregisteredStream { device }),
    };
    match ordered {
        Ok(()) => ptr,
        Err(e) => {
            let code = match e {
                ResourceError::UnregisteredStream { .. } => CUresult::CUDA_ERROR_INVALID_HANDLE,
                _ => CUresult::CUDA_ERROR_ILLEGAL_STATE,
            };
            stream.context().record_err::<()>(Err(DriverError(code)));
            drop_errors::report(core.block.id(), "ordering a cudarc use", e);
            NULL
        }
    }
}

/// Prepares a kernel argument's use on its bound stream; a reference to the
/// address cudarc copies when launching (it must outlive the builder).
fn arg_ref<'b>(
    core: &BufferCore,
    ptr: &'b CUdeviceptr,
    stream: StreamId,
    cuda: &CudaStream,
    access: Access,
) -> &'b CUdeviceptr {
    match core.begin(stream, access, End::Deferred) {
        Ok(()) => ptr,
        Err(e) => {
            cuda.context()
                .record_err::<()>(Err(DriverError(CUresult::CUDA_ERROR_ILLEGAL_STATE)));
            drop_errors::report(core.block.id(), "ordering a kernel argument", e);
            &NULL
        }
    }
}

/// A [`Buffer`] on a CUDA device, with the cudarc stream it is bound to:
/// what cudarc's copies, launches and cuBLAS take.
///
/// It derefs to the [`Buffer`] (guards, helpers, its id and stream), and
/// dropping it frees the buffer as a `Buffer` would.
///
/// # Examples
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use streamalloc::CudaBuffer;
/// use streamalloc::{AllocTag, AsyncCudaResource, Device};
///
/// let device = Device::open_cuda(0, 2)?;
/// let pool = device.streams();
/// let res = Arc::new(AsyncCudaResource::new(&device));
/// let (s0, s1) = (pool.cuda_stream(pool.id(0).unwrap())?, pool.cuda_stream(pool.id(1).unwrap())?);
///
/// let buf = res.allocate_buffer::<f32>(4, pool.id(0).unwrap(), AllocTag::UNTAGGED)?;
/// let mut x = CudaBuffer::new(buf)?;
/// s0.memcpy_htod(&[1.0f32, 2.0, 3.0, 4.0], &mut x)?;  // a write on s0
/// let back = s1.clone_dtoh(&x)?;                       // s1 waits for it
/// s1.synchronize()?;
/// assert_eq!(back, [1.0, 2.0, 3.0, 4.0]);
/// # Ok(()) }
/// ```
pub struct CudaBuffer<T> {
    buf: Buffer<T>,
    cuda: Arc<CudaStream>,
    // The address, where `PushKernelArg` can point cudarc at it.
    ptr: CUdeviceptr,
}

impl<T> CudaBuffer<T> {
    /// Binds `buf` to the cudarc stream of its allocation stream.
    ///
    /// # Errors
    /// [`UnknownStream`](ResourceError::UnknownStream) when its pool holds no
    /// cudarc stream (a simulated device); the buffer comes back unchanged.
    pub fn new(buf: Buffer<T>) -> Result<Self, RefusedConversion<Buffer<T>>> {
        match buf.core.home.pool().cuda_stream(buf.stream()) {
            Ok(cuda) => Ok(CudaBuffer {
                cuda: cuda.clone(),
                ptr: buf.block().ptr(),
                buf,
            }),
            Err(e) => Err(RefusedConversion::new(e, buf)),
        }
    }

    /// The plain buffer.
    pub fn into_buffer(self) -> Buffer<T> {
        self.buf
    }

    /// The whole buffer bound to `stream` (a stream of the buffer's pool),
    /// for kernel arguments of a launch on `stream`.
    ///
    /// # Errors
    /// [`UnregisteredStream`](ResourceError::UnregisteredStream).
    pub fn on<'a>(&'a self, stream: &'a Arc<CudaStream>) -> ResourceResult<CudaView<'a, T>> {
        CudaView::bind(&self.buf.core, self.ptr, self.buf.len(), stream)
    }

    /// As [`on`](Self::on), for writes.
    ///
    /// # Errors
    /// [`UnregisteredStream`](ResourceError::UnregisteredStream).
    pub fn on_mut<'a>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> ResourceResult<CudaViewMut<'a, T>> {
        let len = self.buf.len();
        CudaViewMut::bind(&self.buf.core, self.ptr, len, stream)
    }

    /// Elements `range`, bound to the buffer's stream.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> ResourceResult<CudaView<'_, T>> {
        self.on(&self.cuda)?.slice(range)
    }

    /// Elements `range`, bound to the buffer's stream, for writes.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> ResourceResult<CudaViewMut<'_, T>> {
        let (start, len) = element_range(range, self.buf.len())?;
        let ptr = self.ptr + (start * std::mem::size_of::<T>()) as u64;
        CudaViewMut::bind(&self.buf.core, ptr, len, &self.cuda)
    }
}

impl<T> Deref for CudaBuffer<T> {
    type Target = Buffer<T>;
    fn deref(&self) -> &Buffer<T> {
        &self.buf
    }
}

impl<T> DerefMut for CudaBuffer<T> {
    fn deref_mut(&mut self) -> &mut Buffer<T> {
        &mut self.buf
    }
}

/// Elements of a [`CudaBuffer`] bound to a stream, for reads: cudarc's
/// `CudaView`, ordered by the crate.
pub struct CudaView<'a, T> {
    core: &'a BufferCore,
    ptr: CUdeviceptr,
    len: usize,
    stream: StreamId,
    cuda: &'a Arc<CudaStream>,
    _elem: std::marker::PhantomData<fn() -> T>,
}

/// Elements of a [`CudaBuffer`] bound to a stream, for writes: cudarc's
/// `CudaViewMut`, ordered by the crate.
pub struct CudaViewMut<'a, T> {
    view: CudaView<'a, T>,
}

impl<'a, T> CudaView<'a, T> {
    fn bind(
        core: &'a BufferCore,
        ptr: CUdeviceptr,
        len: usize,
        cuda: &'a Arc<CudaStream>,
    ) -> ResourceResult<Self> {
        let stream = core
            .home
            .pool()
            .find_cuda(cuda)
            .ok_or(ResourceError::UnregisteredStream {
                device: core.block.device(),
            })?;
        Ok(CudaView {
            core,
            ptr,
            len,
            stream,
            cuda,
            _elem: std::marker::PhantomData,
        })
    }

    /// The same elements bound to `stream`.
    ///
    /// # Errors
    /// [`UnregisteredStream`](ResourceError::UnregisteredStream).
    pub fn on(&self, stream: &'a Arc<CudaStream>) -> ResourceResult<CudaView<'a, T>> {
        CudaView::bind(self.core, self.ptr, self.len, stream)
    }

    /// Elements `range` of this view, bound to the same stream.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> ResourceResult<CudaView<'a, T>> {
        let (start, len) = element_range(range, self.len)?;
        Ok(CudaView {
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len,
            ..*self
        })
    }

    /// The stream the view is bound to.
    pub fn bound_stream(&self) -> StreamId {
        self.stream
    }
}

impl<T> Clone for CudaView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for CudaView<'_, T> {}

impl<'a, T> CudaViewMut<'a, T> {
    fn bind(
        core: &'a BufferCore,
        ptr: CUdeviceptr,
        len: usize,
        cuda: &'a Arc<CudaStream>,
    ) -> ResourceResult<Self> {
        CudaView::bind(core, ptr, len, cuda).map(|view| CudaViewMut { view })
    }

    /// The stream the view is bound to.
    pub fn bound_stream(&self) -> StreamId {
        self.view.stream
    }
}

impl<T> DeviceSlice<T> for CudaBuffer<T> {
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.cuda
    }
}

impl<T> DeviceSlice<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.cuda
    }
}

impl<T> DeviceSlice<T> for CudaViewMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.view.cuda
    }
}

impl<T> DevicePtr<T> for CudaBuffer<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let ptr = begin(&self.buf.core, self.ptr, stream, Access::Read);
        (ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for CudaBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let ptr = begin(&self.buf.core, self.ptr, stream, Access::Write);
        (ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtr<T> for CudaView<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let ptr = begin(self.core, self.ptr, stream, Access::Read);
        (ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtr<T> for CudaViewMut<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.view.device_ptr(stream)
    }
}

impl<T> DevicePtrMut<T> for CudaViewMut<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let v = &self.view;
        let ptr = begin(v.core, v.ptr, stream, Access::Write);
        (ptr, SyncOnDrop::Record(None))
    }
}

// SAFETY: cudarc reads the pushed pointer (a `CUdeviceptr`, `DeviceRepr`)
// when `launch` runs; it points into the buffer (or the static null), which
// the `'b` borrow keeps alive and unmoved for as long as the builder `'a`.
// The kernel's mutation of device memory through a shared reference is
// cudarc's own contract for `&CudaSlice` (its `launch` is `unsafe`).
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b CudaBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaBuffer<T>) -> &mut Self {
        let stream = arg.buf.stream();
        self.arg(arg_ref(
            &arg.buf.core,
            &arg.ptr,
            stream,
            &arg.cuda,
            Access::Read,
        ))
    }
}

// SAFETY: as for `&CudaBuffer`; the exclusive borrow also keeps every other
// use of the buffer out until the builder is gone.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut CudaBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudaBuffer<T>) -> &mut Self {
        let arg: &'b CudaBuffer<T> = arg;
        let stream = arg.buf.stream();
        self.arg(arg_ref(
            &arg.buf.core,
            &arg.ptr,
            stream,
            &arg.cuda,
            Access::Write,
        ))
    }
}

// SAFETY: as for `&CudaBuffer`: the view's address field lives as long as
// the `'b` borrow of the view.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        self.arg(arg_ref(
            arg.core,
            &arg.ptr,
            arg.stream,
            arg.cuda,
            Access::Read,
        ))
    }
}

// SAFETY: as for `&mut CudaBuffer`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        let v: &'b CudaView<'c, T> = &arg.view;
        self.arg(arg_ref(v.core, &v.ptr, v.stream, v.cuda, Access::Write))
    }
}

impl<T> fmt::Debug for CudaBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("buf", &self.buf)
            .finish()
    }
}

impl<T> fmt::Debug for CudaView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaView")
            .field("block", &self.core.block.id())
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("stream", &self.stream)
            .finish()
    }
}

impl<T> fmt::Debug for CudaViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaViewMut")
            .field("view", &self.view)
            .finish()
    }
}
