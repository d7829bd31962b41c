//! PyTorch's `cudaStream_t` values, and why registering them keeps the
//! contract of [`StreamPool::register`].
//!
//! # The handles PyTorch passes
//!
//! `CUDAPluggableAllocator::malloc` passes
//! `c10::cuda::getCurrentCUDAStream(device)`, a runtime-API `cudaStream_t`,
//! which is the driver's `CUstream` of the same stream (the runtime and
//! the driver share handles). Its values:
//!
//! - null, the legacy default stream of the device's primary context; and
//!   `cudaStreamLegacy` (`0x1`), another name for the same stream, which
//!   [`TorchStream::new`] maps to null so that one stream has one id;
//! - the pool streams of `c10/cuda/CUDAStream.cpp`: created once per device
//!   and priority the first time a `torch.cuda.Stream()` is asked for, on
//!   the primary context, and never destroyed (PyTorch leaks them on
//!   purpose so that they outlive every static destructor);
//! - an `ExternalStream`'s handle, which the user vouches for to PyTorch
//!   (it must outlive every tensor allocated on it);
//! - `cudaStreamPerThread` (`0x2`), a different stream on every thread:
//!   one handle cannot name it, so it is refused.
//!
//! The allocator's device is opened on the primary context
//! (`CudaContext::new(ordinal)` retains it), the context PyTorch's runtime
//! calls use, so every handle above is a stream of the resource's context.
//!
//! [`StreamPool::register`]: streamalloc::StreamPool::register

use streamalloc::RawStream;

/// `cudaStreamLegacy`: the legacy default stream, by another name than null.
const STREAM_LEGACY: usize = 0x1;
/// `cudaStreamPerThread`: the calling thread's default stream.
const STREAM_PER_THREAD: usize = 0x2;

/// A stream handle PyTorch passed, checked to name one stream for every
/// thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TorchStream(usize);

impl TorchStream {
    /// The handle `stream`, with `cudaStreamLegacy` read as null (the same
    /// stream); `None` for `cudaStreamPerThread`.
    pub fn new(stream: usize) -> Option<Self> {
        match stream {
            STREAM_PER_THREAD => None,
            STREAM_LEGACY => Some(TorchStream(0)),
            other => Some(TorchStream(other)),
        }
    }

    /// The handle's bits.
    pub fn get(self) -> usize {
        self.0
    }

    /// The backend handle to register.
    ///
    /// # Safety
    /// The caller vouches that the handle is a stream of the allocator's
    /// device: on CUDA, one PyTorch passed to the allocator (see the
    /// [module documentation](self)); on the simulated device, a handle of
    /// that simulator.
    pub(crate) unsafe fn raw(self) -> RawStream {
        // SAFETY: the caller's contract; `RawStream::from_cuda` only wraps
        // the bits (a simulated handle keeps its tag bit, which the
        // simulator checks at every call).
        unsafe { RawStream::from_cuda(self.0 as cudarc::driver::sys::CUstream) }
    }
}
