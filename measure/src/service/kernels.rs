//! The work of one request, queued on one stream: what the streamalloc way
//! runs on CUDA ([`CudaModel`](super::cuda_model::CudaModel)) and on the
//! simulated device ([`SimKernels`]): the whole request
//! ([`RequestKernels`]), or the model alone between copies the way makes
//! itself ([`ModelKernels`], the staged service).

use std::sync::Arc;

use streamalloc::gpu::GpuResult;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{DeviceBlock, RawStream};

/// The buffers and size of one request.
#[derive(Debug, Clone, Copy)]
pub struct RequestIo<'a> {
    /// Input, then the middle projection: `rows × hidden` floats.
    pub x: &'a DeviceBlock,
    /// The inner activations: `rows × inner` floats.
    pub h: &'a DeviceBlock,
    /// The output: `rows × out` floats.
    pub y: &'a DeviceBlock,
    /// Rows of the request.
    pub rows: usize,
    /// The client sending it (whose pinned output buffer receives `y`).
    pub client: usize,
}

/// Queues a whole request on a stream: input copied in, the model, the
/// output copied out. It queues only; the caller orders and awaits.
pub trait RequestKernels: Send + Sync + 'static {
    /// Queues the request's work on `stream`.
    ///
    /// # Errors
    /// A driver (or simulated driver) error; work queued before it stays
    /// queued.
    fn enqueue(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()>;
}

/// Queues the model alone on a stream: the input already copied into `x`,
/// the result left in `y` (the staged service copies in and out itself).
pub trait ModelKernels: Send + Sync + 'static {
    /// Queues the model's work on `stream`; `io.client` is not used.
    ///
    /// # Errors
    /// A driver (or simulated driver) error; work queued before it stays
    /// queued.
    fn enqueue_model(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()>;
}

/// The request's work on the simulated device: every copy, GEMM and
/// activation is a simulated kernel declaring the buffers it reads and
/// writes, so that the race detector checks each against the allocations,
/// the other streams and the frees.
#[derive(Debug, Clone)]
pub struct SimKernels {
    gpu: Arc<SimGpu>,
}

impl SimKernels {
    /// Kernels on `gpu`.
    pub fn new(gpu: Arc<SimGpu>) -> Self {
        SimKernels { gpu }
    }
}

impl RequestKernels for SimKernels {
    fn enqueue(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()> {
        let (r, w) = (MemAccess::read, MemAccess::write);
        let launch = |accesses: &[MemAccess]| self.gpu.launch_kernel(stream, accesses);
        launch(&[w(io.x)])?; // input, host to device
        self.enqueue_model(stream, io)?;
        launch(&[r(io.y)]) // output, device to host
    }
}

impl ModelKernels for SimKernels {
    fn enqueue_model(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()> {
        let (r, w) = (MemAccess::read, MemAccess::write);
        let launch = |accesses: &[MemAccess]| self.gpu.launch_kernel(stream, accesses);
        launch(&[r(io.x), w(io.h)])?; // GEMM 1
        launch(&[w(io.h)])?; // ReLU
        launch(&[r(io.h), w(io.x)])?; // GEMM 2
        launch(&[r(io.x), w(io.h)])?; // GEMM 3
        launch(&[w(io.h)])?; // ReLU
        launch(&[r(io.h), w(io.y)]) // GEMM 4
    }
}
