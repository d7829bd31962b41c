//! `CudaGpu`: the gpu seam on cudarc's driver API.
//!
//! `libcuda` is loaded at run time (cudarc's `fallback-dynamic-loading`), so
//! the crate builds and its simulated path runs on machines without CUDA.
//! cudarc panics when the library is missing, so [`CudaGpu::open`] checks for
//! it first and returns [`ResourceError::DeviceUnavailable`].
//!
//! Allocations come from a dedicated stream-ordered memory pool whose release
//! threshold is raised to "never": with the default threshold of 0 the driver
//! returns memory to the OS at every synchronize, and the next allocation pays
//! for mapping it again.
//!
//! This is the crate's FFI edge: every `unsafe` block of the CUDA path is
//! here, each with the invariant it relies on.

// Unsafe here: the CUDA backend: driver calls through cudarc's `sys` layer.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;

use super::{
    CaptureId, CaptureMode, CaptureStatus, Gpu, GpuError, GpuResult, HeldMemory, HostFn,
    HostMemory, RawEvent, RawGraph, RawGraphExec, RawPhysical, RawStream, capture_code,
    capture_gate,
};
use crate::error::{DriverCall, ResourceError, ResourceResult, driver_code};

/// A cudarc driver error of `call` as the seam's error, with the driver's
/// name for its code.
pub(crate) fn cuda_error(call: DriverCall, e: DriverError) -> GpuError {
    let message = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    GpuError::driver(call, e.0 as i32, message)
}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the
/// current one.
const CU_MEMHOSTALLOC_PORTABLE: std::ffi::c_uint = 0x01;

/// The stream-ordered driver calls of one CUDA device.
#[derive(Debug)]
pub struct CudaGpu {
    ctx: Arc<CudaContext>,
    // Owned: created in `try_new`, destroyed in `Drop`. An `Err` is the
    // sticky set-up error, reported by every allocation.
    pool: Result<sys::CUmemoryPool, GpuError>,
    /// The streams `create_stream` made and `destroy_stream` did not destroy
    /// yet: `destroy_stream` refuses any other (a pool's, or one cudarc owns).
    created: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Physical memory made by `mem_create` and not released: counted in
    /// [`memory_held`](Gpu::memory_held) beside the pool.
    physical: PhysicalTally,
}

/// Bytes of live physical handles, now and at most.
#[derive(Debug, Default)]
struct PhysicalTally {
    sizes: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
    current: std::sync::atomic::AtomicUsize,
    high: std::sync::atomic::AtomicUsize,
}

impl PhysicalTally {
    fn created(&self, handle: u64, bytes: usize) {
        use std::sync::atomic::Ordering;
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, bytes);
        let now = self.current.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.high.fetch_max(now, Ordering::AcqRel);
    }

    fn released(&self, handle: u64) {
        use std::sync::atomic::Ordering;
        let bytes = self
            .sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle);
        if let Some(bytes) = bytes {
            self.current.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

// SAFETY: `pool` is a driver handle; the driver API is thread-safe for memory
// pools, and the handle is only destroyed in `Drop`, after the last use.
unsafe impl Send for CudaGpu {}
// SAFETY: as for `Send`; no method mutates `self`.
unsafe impl Sync for CudaGpu {}

impl CudaGpu {
    /// Opens device `ordinal`'s primary context, checking first that
    /// `libcuda` can be loaded.
    ///
    /// # Errors
    /// [`ResourceError::DeviceUnavailable`] when there is no driver or no such
    /// device.
    pub fn open(ordinal: u32) -> ResourceResult<Arc<CudaContext>> {
        if !cuda_present() {
            return Err(ResourceError::DeviceUnavailable {
                device: ordinal,
                reason: "libcuda could not be loaded (no NVIDIA driver on this machine)".into(),
            });
        }
        CudaContext::new(ordinal as usize).map_err(|e| ResourceError::DeviceUnavailable {
            device: ordinal,
            reason: cuda_error(DriverCall::Init, e).to_string(),
        })
    }

    /// The seam for `ctx`'s device, with a dedicated memory pool. If the pool
    /// cannot be set up, the error is kept and every allocation reports it
    /// (cudarc's sticky-error habit); [`CudaGpu::try_new`] reports it at once.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        let pool = Self::create_pool(&ctx);
        if let Err(e) = &pool {
            tracing::error!(device = ctx.ordinal(), error = ?e, "memory pool set-up failed");
        }
        CudaGpu {
            ctx,
            pool,
            created: Default::default(),
            physical: PhysicalTally::default(),
        }
    }

    /// As [`CudaGpu::new`], failing at once when the pool cannot be set up.
    ///
    /// # Errors
    /// [`ResourceError::Driver`] when the device has no memory pools or the
    /// pool cannot be created.
    pub fn try_new(ctx: Arc<CudaContext>) -> ResourceResult<Self> {
        let pool = Self::create_pool(&ctx)?;
        Ok(CudaGpu {
            ctx,
            pool: Ok(pool),
            created: Default::default(),
            physical: PhysicalTally::default(),
        })
    }

    fn create_pool(ctx: &CudaContext) -> GpuResult<sys::CUmemoryPool> {
        let init = |e| cuda_error(DriverCall::Init, e);
        ctx.bind_to_thread().map_err(init)?;
        if !ctx.has_async_alloc() {
            return Err(GpuError::driver(
                DriverCall::Init,
                driver_code::NOT_SUPPORTED,
                "CUDA_ERROR_NOT_SUPPORTED: no stream-ordered memory pools",
            ));
        }
        // SAFETY: zeroed props are the documented "no options" value; we set
        // the three fields the driver requires.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.ordinal() as i32;
        // SAFETY: `props` is a valid, initialised CUmemPoolProps.
        let pool = unsafe { cu::mem_pool::create(&props) }.map_err(init)?;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: `pool` was just created; RELEASE_THRESHOLD takes a cuuint64_t.
        let set = unsafe {
            cu::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast::<c_void>(),
            )
        };
        if let Err(e) = set {
            // SAFETY: nothing was allocated from the pool yet.
            let _ = unsafe { cu::mem_pool::destroy(pool) };
            return Err(init(e));
        }
        Ok(pool)
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn bind(&self, call: DriverCall) -> GpuResult<()> {
        self.ctx.bind_to_thread().map_err(|e| cuda_error(call, e))
    }

    /// A handle's bits for the driver, or the driver's own error for a
    /// simulated device's handle (`what`), which it would not recognise.
    fn real(sim: Option<usize>, bits: u64, call: DriverCall, what: &str) -> GpuResult<u64> {
        match sim {
            Some(_) => Err(GpuError::driver(
                call,
                driver_code::INVALID_HANDLE,
                format!("CUDA_ERROR_INVALID_HANDLE: a simulated {what}"),
            )),
            None => Ok(bits),
        }
    }

    fn stream(stream: RawStream, call: DriverCall) -> GpuResult<sys::CUstream> {
        Self::real(stream.sim_index(), stream.get(), call, "stream").map(|b| b as sys::CUstream)
    }

    fn graph(graph: RawGraph, call: DriverCall) -> GpuResult<sys::CUgraph> {
        Self::real(graph.sim_index(), graph.get(), call, "graph").map(|b| b as sys::CUgraph)
    }

    fn graph_exec(exec: RawGraphExec, call: DriverCall) -> GpuResult<sys::CUgraphExec> {
        Self::real(exec.sim_index(), exec.get(), call, "graph").map(|b| b as sys::CUgraphExec)
    }

    fn event(event: RawEvent, call: DriverCall) -> GpuResult<sys::CUevent> {
        Self::real(event.sim_index(), event.get(), call, "event").map(|b| b as sys::CUevent)
    }
}

impl CudaGpu {
    /// Physical memory pinned on this device, no export handles.
    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: all-zero is the documented "no options" value of every
        // field (null metadata pointer, no flags); the type and location
        // are set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ctx.ordinal() as i32;
        prop
    }

    fn check(call: DriverCall, r: sys::CUresult) -> GpuResult<()> {
        r.result().map_err(|e| cuda_error(call, e))
    }
}

/// `cuStreamGetCaptureInfo`: the status and the capture id. CUDA 12.3
/// added edge data to the call (`_v3`, the only one cudarc binds for CUDA
/// 13); older versions have `_v2`. Only status and id are asked for: every
/// other out-pointer may be null.
///
/// # Safety
/// 1. `s` is a live stream.
unsafe fn capture_info(s: sys::CUstream) -> Result<(sys::CUstreamCaptureStatus, u64), DriverError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    #[cfg(any(
        feature = "cuda-11040",
        feature = "cuda-11050",
        feature = "cuda-11060",
        feature = "cuda-11070",
        feature = "cuda-11080",
        feature = "cuda-12000",
        feature = "cuda-12010",
        feature = "cuda-12020"
    ))]
    // SAFETY: `s` is live (Safety 1); `status` and `id` are valid
    // out-pointers; the graph and dependency outputs are optional (null).
    let r = unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            s,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    #[cfg(not(any(
        feature = "cuda-11040",
        feature = "cuda-11050",
        feature = "cuda-11060",
        feature = "cuda-11070",
        feature = "cuda-11080",
        feature = "cuda-12000",
        feature = "cuda-12010",
        feature = "cuda-12020"
    )))]
    // SAFETY: as above; the edge-data output is optional (null) too.
    let r = unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    r.result()?;
    Ok((status, id))
}

/// Whether `libcuda` can be loaded on this machine.
pub fn cuda_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        if let Ok(pool) = self.pool
            && self.ctx.bind_to_thread().is_ok()
        {
            // SAFETY: the pool is ours and no method can run any more; the
            // driver releases it once outstanding allocations are freed.
            let _ = unsafe { cu::mem_pool::destroy(pool) };
        }
    }
}

extern "C" fn run_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the `Box<HostFn>` leaked by `launch_host_fn`, and the
    // driver calls this trampoline exactly once for it.
    let f = unsafe { Box::from_raw(data.cast::<HostFn>()) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

// SAFETY: every call is the CUDA driver's own on this backend's context,
// whose answers are the contract's (the driver's memory pool hands out the
// addresses, its events and streams order the work).
unsafe impl Gpu for CudaGpu {
    fn ordinal(&self) -> u32 {
        self.ctx.ordinal() as u32
    }

    fn context_id(&self) -> u64 {
        self.ctx.cu_ctx() as u64
    }

    unsafe fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64> {
        let call = DriverCall::AllocAsync;
        let s = Self::stream(stream, call)?;
        let pool = self.pool.clone()?;
        self.bind(call)?;
        // SAFETY: the pool is alive (owned until `Drop`); `s` is a live
        // stream of this context (this fn's Safety 1); the returned memory is
        // not read here.
        match unsafe { cu::mem_pool::alloc_async(pool, bytes, s) } {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let available = cu::mem_get_info().map(|(free, _)| free).unwrap_or(0);
                Err(GpuError::OutOfMemory { available })
            }
            Err(e) => Err(cuda_error(call, e)),
        }
    }

    unsafe fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()> {
        let call = DriverCall::FreeAsync;
        let s = Self::stream(stream, call)?;
        if ptr == 0 {
            return Ok(());
        }
        self.bind(call)?;
        // SAFETY: `s` is a live stream and `ptr` an allocation of this
        // backend, freed once (this fn's Safety 1-2).
        unsafe { cu::free_async(ptr, s) }.map_err(|e| cuda_error(call, e))
    }

    fn event_create(&self) -> GpuResult<RawEvent> {
        let call = DriverCall::EventCreate;
        self.bind(call)?;
        cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(|e| RawEvent::cuda(e as u64))
            .map_err(|e| cuda_error(call, e))
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()> {
        let call = DriverCall::EventRecord;
        let (e, s) = (Self::event(event, call)?, Self::stream(stream, call)?);
        self.bind(call)?;
        // SAFETY: `e` is a live event and `s` a live stream of this backend
        // (this fn's Safety 1).
        unsafe { cu::event::record(e, s) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn event_query(&self, event: RawEvent) -> GpuResult<bool> {
        let call = DriverCall::EventQuery;
        let e = Self::event(event, call)?;
        self.bind(call)?;
        // SAFETY: `e` is a live event (this fn's Safety 1).
        match unsafe { cu::event::query(e) } {
            Ok(()) => Ok(true),
            Err(err) if err.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(err) => Err(cuda_error(call, err)),
        }
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> GpuResult<()> {
        let call = DriverCall::EventSynchronize;
        let e = Self::event(event, call)?;
        self.bind(call)?;
        // SAFETY: `e` is a live event (this fn's Safety 1).
        unsafe { cu::event::synchronize(e) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> GpuResult<()> {
        let call = DriverCall::EventDestroy;
        let e = Self::event(event, call)?;
        self.bind(call)?;
        // SAFETY: `e` is a live event, not used afterwards (this fn's Safety
        // 1-2).
        unsafe { cu::event::destroy(e) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()> {
        let call = DriverCall::StreamWaitEvent;
        let (s, e) = (Self::stream(stream, call)?, Self::event(event, call)?);
        self.bind(call)?;
        // SAFETY: `s` is a live stream and `e` a live event (this fn's
        // Safety 1).
        unsafe { cu::stream::wait_event(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| cuda_error(call, e))
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()> {
        let call = DriverCall::StreamSynchronize;
        let s = Self::stream(stream, call)?;
        self.bind(call)?;
        // SAFETY: `s` is a live stream (this fn's Safety 1).
        unsafe { cu::stream::synchronize(s) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn stream_query(&self, stream: RawStream) -> GpuResult<bool> {
        let call = DriverCall::StreamQuery;
        let s = Self::stream(stream, call)?;
        self.bind(call)?;
        // SAFETY: `s` is a live stream (this fn's Safety 1).
        match unsafe { sys::cuStreamQuery(s) }.result() {
            Ok(()) => Ok(true),
            Err(err) if err.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(err) => Err(cuda_error(call, err)),
        }
    }

    unsafe fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()> {
        let call = DriverCall::LaunchHostFunc;
        let s = Self::stream(stream, call)?;
        self.bind(call)?;
        // A host function captured into a graph would run at every replay,
        // and the trampoline takes back its box once: refuse it (without
        // touching the capture). One cheap query, on the notifier's path.
        // SAFETY: `s` is a live stream (this fn's Safety 1).
        let capturing = unsafe { cu::stream::is_capturing(s) }.map_err(|e| cuda_error(call, e))?;
        if capturing != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(GpuError::driver(
                call,
                capture_code::UNSUPPORTED,
                "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: a host function runs once, a captured one at every replay",
            ));
        }
        let data = Box::into_raw(Box::new(f)).cast::<c_void>();
        // SAFETY: `s` is a live stream (this fn's Safety 1); `run_host_fn`
        // takes back ownership of `data` exactly once when the driver calls
        // it; on failure the driver never will.
        let launched = unsafe { cu::stream::launch_host_function(s, run_host_fn, data) };
        if let Err(e) = launched {
            // SAFETY: the launch failed, so `data` is still ours alone.
            drop(unsafe { Box::from_raw(data.cast::<HostFn>()) });
            return Err(cuda_error(call, e));
        }
        Ok(())
    }

    unsafe fn memset_async(
        &self,
        ptr: u64,
        value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        let call = DriverCall::MemsetAsync;
        let s = Self::stream(stream, call)?;
        if len == 0 {
            return Ok(());
        }
        self.bind(call)?;
        // SAFETY: `s` is a live stream and the range a live range of this
        // backend (this fn's Safety 1-2).
        unsafe { cu::memset_d8_async(ptr, value, len, s) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        let call = DriverCall::CopyAsync;
        let s = Self::stream(stream, call)?;
        if len == 0 {
            return Ok(());
        }
        self.bind(call)?;
        // SAFETY: `s` is a live stream, both ranges live ranges (this fn's
        // Safety 1-2).
        unsafe { cu::memcpy_dtod_async(dst, src, len, s) }.map_err(|e| cuda_error(call, e))
    }

    fn host_alloc(&self, bytes: usize, numa_node: Option<u32>) -> GpuResult<HostMemory> {
        let call = DriverCall::MemHostAlloc;
        // Placement on a NUMA node is best-effort (see
        // `HostPoolConfig::numa_node`): the driver pins the pages where the
        // kernel put them, which first touch decides.
        let _ = numa_node;
        if bytes == 0 {
            return Err(GpuError::driver(
                call,
                driver_code::INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE: zero bytes",
            ));
        }
        self.bind(call)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; `CU_MEMHOSTALLOC_PORTABLE`
        // makes the memory pinned for every context, so copies on any
        // device's streams may use it.
        let r = unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, CU_MEMHOSTALLOC_PORTABLE) };
        Self::check(call, r)?;
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>()).ok_or_else(|| {
            GpuError::driver(call, driver_code::UNKNOWN, "cuMemHostAlloc returned null")
        })?;
        Ok(HostMemory {
            ptr,
            addr: ptr.as_ptr() as u64,
            bytes,
        })
    }

    unsafe fn host_free(&self, memory: HostMemory) -> GpuResult<()> {
        let call = DriverCall::MemFreeHost;
        self.bind(call)?;
        // SAFETY: `memory` is what `host_alloc` (cuMemHostAlloc) returned,
        // freed once and idle, as this fn's Safety 1-2 require.
        let r = unsafe { sys::cuMemFreeHost(memory.ptr.as_ptr().cast::<c_void>()) };
        Self::check(call, r)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        let call = DriverCall::MemcpyHostAsync;
        let s = Self::stream(stream, call)?;
        if len == 0 {
            return Ok(());
        }
        self.bind(call)?;
        // SAFETY: `s` is a live stream, `dst` a live device range and `src`
        // a live range of pinned host memory that the host does not write
        // until the copy completed (this fn's Safety 1-3).
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, s) };
        Self::check(call, r)
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        let call = DriverCall::MemcpyHostAsync;
        let s = Self::stream(stream, call)?;
        if len == 0 {
            return Ok(());
        }
        self.bind(call)?;
        // SAFETY: `s` is a live stream, `src` a live device range and `dst`
        // a live range of pinned host memory that the host does not touch
        // until the copy completed (this fn's Safety 1-3).
        let r = unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, s) };
        Self::check(call, r)
    }

    fn mem_info(&self) -> GpuResult<(usize, usize)> {
        let call = DriverCall::MemGetInfo;
        self.bind(call)?;
        cu::mem_get_info().map_err(|e| cuda_error(call, e))
    }

    fn vm_granularity(&self) -> GpuResult<usize> {
        let call = DriverCall::AddressReserve;
        self.bind(call)?;
        let prop = self.allocation_prop();
        let mut granularity = 0usize;
        // SAFETY: both pointers are valid for the call; `prop` is initialised.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        Self::check(call, r)?;
        Ok(granularity)
    }

    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        let call = DriverCall::AddressReserve;
        self.bind(call)?;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: `addr` is a valid out-pointer; no fixed address, default
        // alignment (the granularity), no flags.
        let r = unsafe { sys::cuMemAddressReserve(&mut addr, bytes, 0, 0, 0) };
        Self::check(call, r)?;
        Ok(addr)
    }

    unsafe fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let call = DriverCall::AddressFree;
        self.bind(call)?;
        // SAFETY: the caller passes exactly a live reservation of this
        // backend with no mapping left in it (items 1 and 2 of the contract).
        Self::check(call, unsafe { sys::cuMemAddressFree(addr, bytes) })
    }

    fn mem_create(&self, bytes: usize) -> GpuResult<RawPhysical> {
        let call = DriverCall::MemCreate;
        self.bind(call)?;
        let prop = self.allocation_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer and `prop` is initialised.
        match unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) }.result() {
            Ok(()) => {
                self.physical.created(handle, bytes);
                Ok(RawPhysical::new(handle))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let available = cu::mem_get_info().map(|(free, _)| free).unwrap_or(0);
                Err(GpuError::OutOfMemory { available })
            }
            Err(e) => Err(cuda_error(call, e)),
        }
    }

    unsafe fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        let call = DriverCall::MemRelease;
        self.bind(call)?;
        // SAFETY: the handle is a live physical handle of this backend, so
        // it is released once (item 1 of the contract).
        Self::check(call, unsafe { sys::cuMemRelease(handle.get()) })?;
        self.physical.released(handle.get());
        Ok(())
    }

    unsafe fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        let call = DriverCall::MemMap;
        self.bind(call)?;
        // SAFETY: the range is aligned, inside a live reservation and not
        // mapped, and the handle is live and of `bytes` bytes (items 1 to 3
        // of the contract).
        Self::check(call, unsafe {
            sys::cuMemMap(addr, bytes, 0, handle.get(), 0)
        })
    }

    unsafe fn mem_map_part(
        &self,
        addr: u64,
        bytes: usize,
        handle: RawPhysical,
        offset: usize,
    ) -> GpuResult<()> {
        let call = DriverCall::MemMap;
        self.bind(call)?;
        // SAFETY: the range is aligned, inside a live reservation and not
        // mapped, the handle is live and `offset + bytes` lies inside it
        // (items 1 to 3 of the contract); the caller orders the uses of the
        // two addresses (item 4).
        Self::check(call, unsafe {
            sys::cuMemMap(addr, bytes, offset, handle.get(), 0)
        })
    }

    unsafe fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let call = DriverCall::MemSetAccess;
        self.bind(call)?;
        let desc = sys::CUmemAccessDesc {
            location: self.allocation_prop().location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is inside a live reservation and entirely mapped
        // (item 1 of the contract); `desc` is one valid descriptor.
        Self::check(call, unsafe { sys::cuMemSetAccess(addr, bytes, &desc, 1) })
    }

    unsafe fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let call = DriverCall::MemUnmap;
        self.bind(call)?;
        // SAFETY: the range covers whole mappings of a live reservation
        // (item 1) and is idle, so no queued work faults on it (item 2).
        Self::check(call, unsafe { sys::cuMemUnmap(addr, bytes) })
    }

    fn memory_held(&self) -> GpuResult<HeldMemory> {
        let call = DriverCall::MemGetInfo;
        let pool = self.pool.clone()?;
        self.bind(call)?;
        let read = |attr| {
            let mut value: u64 = 0;
            // SAFETY: the pool is alive (owned); the RESERVED_MEM attributes
            // are cuuint64_t values, written into `value`.
            unsafe { cu::mem_pool::get_attribute(pool, attr, (&mut value as *mut u64).cast()) }
                .map(|()| usize::try_from(value).unwrap_or(usize::MAX))
                .map_err(|e| cuda_error(call, e))
        };
        // Physical handles (the cache's arena) count beside the pool. The
        // high mark is the sum of the two marks: exact when one of them is
        // idle (a replay through the arena, or through the pool alone), an
        // upper bound otherwise.
        use std::sync::atomic::Ordering;
        Ok(HeldMemory {
            current: read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?
                + self.physical.current.load(Ordering::Acquire),
            high: read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?
                + self.physical.high.load(Ordering::Acquire),
        })
    }

    fn reset_memory_held_high(&self) -> GpuResult<()> {
        let call = DriverCall::MemGetInfo;
        let pool = self.pool.clone()?;
        self.bind(call)?;
        use std::sync::atomic::Ordering;
        let now = self.physical.current.load(Ordering::Acquire);
        self.physical.high.store(now, Ordering::Release);
        // The driver accepts only 0, which restarts the mark from the
        // current value.
        let mut zero: u64 = 0;
        // SAFETY: the pool is alive (owned); RESERVED_MEM_HIGH takes a
        // cuuint64_t, read from `zero`.
        unsafe {
            cu::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        }
        .map_err(|e| cuda_error(call, e))
    }

    fn create_stream(&self) -> GpuResult<RawStream> {
        let call = DriverCall::Init;
        self.bind(call)?;
        let s = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| cuda_error(call, e))?;
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(s as u64);
        // SAFETY: `s` was just created on this context and stays valid until
        // the caller hands it to `destroy_stream`.
        Ok(unsafe { RawStream::from_cuda(s) })
    }

    unsafe fn capture_status(&self, stream: RawStream) -> GpuResult<CaptureStatus> {
        let call = DriverCall::StreamGetCaptureInfo;
        let s = Self::stream(stream, call)?;
        if !capture_gate::must_ask() {
            // No capture begun through the crate is underway, and foreign
            // ones were not asked for: the stream is not capturing.
            return Ok(CaptureStatus::None);
        }
        self.bind(call)?;
        // SAFETY: `s` is a live stream (this fn's Safety 1).
        let (status, id) = unsafe { capture_info(s) }.map_err(|e| cuda_error(call, e))?;
        Ok(match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => {
                CaptureStatus::Active(CaptureId::new(id))
            }
            _ => CaptureStatus::Invalidated,
        })
    }

    unsafe fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> GpuResult<()> {
        let call = DriverCall::StreamBeginCapture;
        let s = Self::stream(stream, call)?;
        self.bind(call)?;
        let mode = match mode {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // Counted before the capture begins, so that no query after it
        // skips the driver.
        capture_gate::begin();
        // SAFETY: `s` is a live stream (this fn's Safety 1).
        let begun = unsafe { cu::stream::begin_capture(s, mode) }.map_err(|e| cuda_error(call, e));
        if begun.is_err() {
            capture_gate::end();
        }
        begun
    }

    unsafe fn end_capture(&self, stream: RawStream) -> GpuResult<RawGraph> {
        let call = DriverCall::StreamEndCapture;
        let s = Self::stream(stream, call)?;
        self.bind(call)?;
        // SAFETY: `s` is a live stream (this fn's Safety 1).
        let ended = unsafe { cu::stream::end_capture(s) }.map_err(|e| cuda_error(call, e));
        // The capture is over when the driver gave a graph or reported it
        // invalidated; any other error (a stream that was not capturing, the
        // wrong thread) leaves the count as it was.
        let over = match &ended {
            Ok(_) => true,
            Err(e) => e.code() == capture_code::INVALIDATED,
        };
        if over {
            capture_gate::end();
        }
        let graph = ended?;
        if graph.is_null() {
            return Err(GpuError::driver(
                call,
                capture_code::INVALIDATED,
                "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: the capture produced no graph",
            ));
        }
        Ok(RawGraph::cuda(graph as u64))
    }

    unsafe fn graph_instantiate(&self, graph: RawGraph) -> GpuResult<RawGraphExec> {
        let call = DriverCall::GraphInstantiate;
        let g = Self::graph(graph, call)?;
        self.bind(call)?;
        // SAFETY: `g` is a live graph of this backend, not used concurrently
        // (this fn's Safety 1-2).
        unsafe { cu::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) }
            .map(|x| RawGraphExec::cuda(x as u64))
            .map_err(|e| cuda_error(call, e))
    }

    unsafe fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> GpuResult<()> {
        let call = DriverCall::GraphLaunch;
        let (x, s) = (Self::graph_exec(exec, call)?, Self::stream(stream, call)?);
        self.bind(call)?;
        // SAFETY: `x` is a live executable graph and `s` a live stream, the
        // memory the graph touches is live, and no other call uses `x`
        // meanwhile (this fn's Safety 1-3).
        unsafe { cu::graph::launch(x, s) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn graph_exec_destroy(&self, exec: RawGraphExec) -> GpuResult<()> {
        let call = DriverCall::GraphDestroy;
        let x = Self::graph_exec(exec, call)?;
        self.bind(call)?;
        // SAFETY: `x` is a live executable graph, not used afterwards (this
        // fn's Safety 1); the driver frees it once queued replays are done.
        unsafe { cu::graph::exec_destroy(x) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn graph_destroy(&self, graph: RawGraph) -> GpuResult<()> {
        let call = DriverCall::GraphDestroy;
        let g = Self::graph(graph, call)?;
        self.bind(call)?;
        // SAFETY: `g` is a live graph, not used afterwards (this fn's Safety
        // 1).
        unsafe { cu::graph::destroy(g) }.map_err(|e| cuda_error(call, e))
    }

    unsafe fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        let call = DriverCall::Init;
        let s = Self::stream(stream, call)?;
        self.bind(call)?;
        if !self
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(s as u64))
        {
            return Err(GpuError::driver(
                call,
                driver_code::INVALID_HANDLE,
                "CUDA_ERROR_INVALID_HANDLE: not a stream this backend created",
            ));
        }
        // SAFETY: `s` was created by this backend's `create_stream` (checked
        // just above against the set of streams it made, so a stream cudarc
        // or a pool owns is refused whatever the caller says) and is not used
        // afterwards (this fn's Safety 2). The driver releases it once work
        // queued on it has completed.
        unsafe { cu::stream::destroy(s) }.map_err(|e| cuda_error(call, e))
    }
}

/// Allocates `len` bytes through cudarc's own path (`CudaStream::alloc`, from
/// the device's default pool, with cudarc's per-buffer event tracking), so
/// that benchmarks can compare the crate against it. Dropping the slice frees
/// it the cudarc way.
///
/// # Errors
/// [`ResourceError::Driver`] when cudarc's allocation fails.
pub fn cudarc_alloc(
    stream: &Arc<cudarc::driver::CudaStream>,
    len: usize,
) -> ResourceResult<cudarc::driver::CudaSlice<u8>> {
    // SAFETY: cudarc marks `alloc` unsafe only because the memory is left
    // uninitialised; `u8` has no invalid bit patterns, and the slice is
    // handed to the caller, who must write it before reading (benchmarks
    // only allocate and drop it).
    unsafe { stream.alloc::<u8>(len) }.map_err(|e| cuda_error(DriverCall::AllocAsync, e).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_codes_are_cudas() {
        use sys::CUresult as R;
        for (named, cuda) in [
            (driver_code::INVALID_VALUE, R::CUDA_ERROR_INVALID_VALUE),
            (driver_code::OUT_OF_MEMORY, R::CUDA_ERROR_OUT_OF_MEMORY),
            (driver_code::INVALID_HANDLE, R::CUDA_ERROR_INVALID_HANDLE),
            (driver_code::NOT_READY, R::CUDA_ERROR_NOT_READY),
            (driver_code::ILLEGAL_ADDRESS, R::CUDA_ERROR_ILLEGAL_ADDRESS),
            (driver_code::NOT_SUPPORTED, R::CUDA_ERROR_NOT_SUPPORTED),
            (driver_code::UNKNOWN, R::CUDA_ERROR_UNKNOWN),
        ] {
            assert_eq!(named, cuda as i32, "{cuda:?}");
        }
        for (named, cuda) in [
            (capture_code::ILLEGAL_STATE, R::CUDA_ERROR_ILLEGAL_STATE),
            (
                capture_code::UNSUPPORTED,
                R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            ),
            (
                capture_code::INVALIDATED,
                R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            ),
            (
                capture_code::UNMATCHED,
                R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            ),
            (
                capture_code::UNJOINED,
                R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            ),
            (
                capture_code::ISOLATION,
                R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            ),
            (capture_code::CAPTURED_EVENT, R::CUDA_ERROR_CAPTURED_EVENT),
            (
                capture_code::WRONG_THREAD,
                R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            ),
        ] {
            assert_eq!(named, cuda as i32, "{cuda:?}");
        }
    }
}
