//! [`Backend`]: CUDA or the simulator, chosen at run time, behind one type.

// Unsafe here: the backend forwards every `unsafe fn` of the `Gpu` seam to CUDA or the simulator.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "cuda")]
use crate::gpu::cuda::CudaGpu;
use crate::gpu::sim::SimGpu;
use crate::gpu::{
    CaptureMode, CaptureStatus, Gpu, GpuResult, HeldMemory, HostFn, HostMemory, RawEvent, RawGraph,
    RawGraphExec, RawPhysical, RawStream,
};

/// The backend of a [`Device`](crate::Device) opened at run time: a CUDA
/// device, or the simulated one.
///
/// Every [`Gpu`] call is forwarded by one `match` (the essay of
/// `src/device/` says what it costs).
#[non_exhaustive]
pub enum Backend {
    /// A CUDA device, through cudarc.
    #[cfg(feature = "cuda")]
    Cuda(CudaGpu),
    /// The simulated device (shared: its race detector and fault injection
    /// are read through the same `Arc`).
    Sim(Arc<SimGpu>),
}

impl Backend {
    /// The simulated device, when this is one.
    pub fn simulator(&self) -> Option<&Arc<SimGpu>> {
        match self {
            Backend::Sim(sim) => Some(sim),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => None,
        }
    }

    /// The CUDA device, when this is one.
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&CudaGpu> {
        match self {
            Backend::Cuda(cuda) => Some(cuda),
            Backend::Sim(_) => None,
        }
    }
}

/// Forwards one [`Gpu`] call to the backend (called by its trait path, so
/// that `SimGpu`'s inherent methods of the same name are not picked).
macro_rules! forward {
    ($self:ident.$method:ident($($arg:expr),*)) => {
        match $self {
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => Gpu::$method(gpu, $($arg),*),
            Backend::Sim(gpu) => Gpu::$method(gpu.as_ref(), $($arg),*),
        }
    };
}

/// As `forward!`, for the unsafe methods: the caller's contract (this
/// method's `# Safety`) is the backend's, since the handles are its.
macro_rules! forward_unsafe {
    ($self:ident.$method:ident($($arg:expr),*)) => {
        match $self {
            // SAFETY: the caller upholds this method's Safety list, which is
            // the same list for the backend the call goes to.
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => unsafe { Gpu::$method(gpu, $($arg),*) },
            // SAFETY: as above.
            Backend::Sim(gpu) => unsafe { Gpu::$method(gpu.as_ref(), $($arg),*) },
        }
    };
}

// SAFETY: each call is the call of the backend it holds (CUDA or the
// simulator), which keeps the contract.
unsafe impl Gpu for Backend {
    fn ordinal(&self) -> u32 {
        forward!(self.ordinal())
    }

    fn context_id(&self) -> u64 {
        forward!(self.context_id())
    }

    unsafe fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64> {
        forward_unsafe!(self.alloc_async(bytes, stream))
    }

    unsafe fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()> {
        forward_unsafe!(self.free_async(ptr, stream))
    }

    fn event_create(&self) -> GpuResult<RawEvent> {
        forward!(self.event_create())
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()> {
        forward_unsafe!(self.event_record(event, stream))
    }

    unsafe fn event_query(&self, event: RawEvent) -> GpuResult<bool> {
        forward_unsafe!(self.event_query(event))
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> GpuResult<()> {
        forward_unsafe!(self.event_synchronize(event))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> GpuResult<()> {
        forward_unsafe!(self.event_destroy(event))
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()> {
        forward_unsafe!(self.stream_wait_event(stream, event))
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()> {
        forward_unsafe!(self.stream_synchronize(stream))
    }

    unsafe fn stream_query(&self, stream: RawStream) -> GpuResult<bool> {
        forward_unsafe!(self.stream_query(stream))
    }

    unsafe fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()> {
        forward_unsafe!(self.launch_host_fn(stream, f))
    }

    unsafe fn memset_async(
        &self,
        ptr: u64,
        value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        forward_unsafe!(self.memset_async(ptr, value, len, stream))
    }

    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        forward_unsafe!(self.copy_async(dst, src, len, stream))
    }

    fn mem_info(&self) -> GpuResult<(usize, usize)> {
        forward!(self.mem_info())
    }

    fn host_alloc(&self, bytes: usize, numa_node: Option<u32>) -> GpuResult<HostMemory> {
        forward!(self.host_alloc(bytes, numa_node))
    }

    unsafe fn host_free(&self, memory: HostMemory) -> GpuResult<()> {
        forward_unsafe!(self.host_free(memory))
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        forward_unsafe!(self.copy_to_device_async(dst, src, len, stream))
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        forward_unsafe!(self.copy_to_host_async(dst, src, len, stream))
    }

    fn note_host_access(&self, addr: u64, access: crate::types::Access) {
        forward!(self.note_host_access(addr, access))
    }

    fn note_host_reuse(&self, addr: u64) {
        forward!(self.note_host_reuse(addr))
    }

    fn create_stream(&self) -> GpuResult<RawStream> {
        forward!(self.create_stream())
    }

    fn vm_granularity(&self) -> GpuResult<usize> {
        forward!(self.vm_granularity())
    }

    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        forward!(self.address_reserve(bytes))
    }

    unsafe fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps `Gpu::address_free`'s contract, which is
        // the backend's own (the same call on the same device).
        unsafe { forward!(self.address_free(addr, bytes)) }
    }

    fn mem_create(&self, bytes: usize) -> GpuResult<RawPhysical> {
        forward!(self.mem_create(bytes))
    }

    unsafe fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        // SAFETY: as in `address_free`, for `Gpu::mem_release`.
        unsafe { forward!(self.mem_release(handle)) }
    }

    unsafe fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        // SAFETY: as in `address_free`, for `Gpu::mem_map`.
        unsafe { forward!(self.mem_map(addr, bytes, handle)) }
    }

    unsafe fn mem_map_part(
        &self,
        addr: u64,
        bytes: usize,
        handle: RawPhysical,
        offset: usize,
    ) -> GpuResult<()> {
        // SAFETY: as in `address_free`, for `Gpu::mem_map_part`.
        unsafe { forward!(self.mem_map_part(addr, bytes, handle, offset)) }
    }

    unsafe fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        // SAFETY: as in `address_free`, for `Gpu::mem_set_access`.
        unsafe { forward!(self.mem_set_access(addr, bytes)) }
    }

    unsafe fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        // SAFETY: as in `address_free`, for `Gpu::mem_unmap`.
        unsafe { forward!(self.mem_unmap(addr, bytes)) }
    }

    fn note_suballocation(&self, addr: u64, bytes: usize, stream: RawStream) {
        forward!(self.note_suballocation(addr, bytes, stream))
    }

    fn note_subfree(&self, addr: u64, stream: RawStream) {
        forward!(self.note_subfree(addr, stream))
    }

    fn note_subfree_completed(&self, addr: u64, stream: RawStream) {
        forward!(self.note_subfree_completed(addr, stream))
    }

    fn note_suballocation_undone(&self, addr: u64, stream: RawStream) {
        forward!(self.note_suballocation_undone(addr, stream))
    }

    fn memory_held(&self) -> GpuResult<HeldMemory> {
        forward!(self.memory_held())
    }

    fn reset_memory_held_high(&self) -> GpuResult<()> {
        forward!(self.reset_memory_held_high())
    }

    unsafe fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        forward_unsafe!(self.destroy_stream(stream))
    }

    unsafe fn capture_status(&self, stream: RawStream) -> GpuResult<CaptureStatus> {
        forward_unsafe!(self.capture_status(stream))
    }

    unsafe fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> GpuResult<()> {
        forward_unsafe!(self.begin_capture(stream, mode))
    }

    unsafe fn end_capture(&self, stream: RawStream) -> GpuResult<RawGraph> {
        forward_unsafe!(self.end_capture(stream))
    }

    unsafe fn graph_instantiate(&self, graph: RawGraph) -> GpuResult<RawGraphExec> {
        forward_unsafe!(self.graph_instantiate(graph))
    }

    unsafe fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> GpuResult<()> {
        forward_unsafe!(self.graph_launch(exec, stream))
    }

    unsafe fn graph_exec_destroy(&self, exec: RawGraphExec) -> GpuResult<()> {
        forward_unsafe!(self.graph_exec_destroy(exec))
    }

    unsafe fn graph_destroy(&self, graph: RawGraph) -> GpuResult<()> {
        forward_unsafe!(self.graph_destroy(graph))
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => f.debug_tuple("Cuda").field(gpu).finish(),
            Backend::Sim(gpu) => f.debug_tuple("Sim").field(gpu).finish(),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => {
                let name = gpu.context().name().unwrap_or_default();
                write!(f, "CUDA device {} {name}", gpu.ordinal())
            }
            Backend::Sim(gpu) => write!(f, "simulated device {}", Gpu::ordinal(gpu.as_ref())),
        }
    }
}
