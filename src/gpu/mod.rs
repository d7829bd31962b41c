//! The gpu seam: the dozen driver calls the bookkeeping needs, and nothing
//! else.
//!
//! [`StreamOrderedResource`](crate::StreamOrderedResource) is written once
//! against the [`Gpu`] trait. Two backends implement it:
//!
//! - [`CudaGpu`](cuda::CudaGpu): cudarc's driver API, with `libcuda` loaded at
//!   run time, allocating from a dedicated stream-ordered memory pool;
//! - [`SimGpu`](sim::SimGpu): a simulated device that runs on any CPU, with a
//!   race detector and fault injection, for tests, CI and users without a GPU.
//!
//! Handles ([`RawStream`], [`RawEvent`], device addresses) are plain `Copy`
//! values, which no backend can check: on CUDA a stale `CUstream` or
//! `CUevent`, or an address that is not a live device allocation (under
//! unified addressing it may be host memory Rust owns), is undefined
//! behaviour. So every method that takes one is an `unsafe fn`, and its
//! caller proves the handles live (see [Handles](Gpu#handles)). The crate's
//! own callers take streams from a [`StreamPool`](crate::StreamPool), which
//! keeps them alive, events from their own pools, and addresses from live
//! block records. [`SimGpu`](sim::SimGpu) checks every handle and address
//! itself, so it offers the same calls as safe inherent methods.

#![deny(unsafe_code)]

mod capture;
// Only the CUDA backend asks the gate; without it the gate stands unused.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod capture_gate;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod graph;
mod held;
pub mod sim;

pub(crate) use capture::CaptureId;
pub use capture::{CaptureMode, CaptureStatus, RawGraph, RawGraphExec, capture_code};
pub use capture_gate::detect_foreign_captures;
pub use graph::{Graph, GraphExec};
pub use held::HeldMemory;

use crate::error::DriverCall;
pub use crate::error::driver_code;
pub(crate) use crate::types::RawStream;
pub use error::{GpuError, GpuResult};

/// A backend event handle (a `CUevent`, or a tagged index on the simulated
/// device), made only by [`Gpu::event_create`]. Events are created with
/// timing disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawEvent(u64);

impl RawEvent {
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(event: u64) -> Self {
        RawEvent(event)
    }

    pub(crate) fn sim(index: usize) -> Self {
        RawEvent(crate::types::SIM_HANDLE | index as u64)
    }

    /// The handle's bits.
    pub fn get(self) -> u64 {
        self.0
    }

    pub(crate) fn sim_index(self) -> Option<usize> {
        (self.0 & crate::types::SIM_HANDLE != 0)
            .then_some((self.0 & !crate::types::SIM_HANDLE) as usize)
    }
}

/// A handle to physical device memory made by [`Gpu::mem_create`] (a
/// `CUmemGenericAllocationHandle`, or an index on the simulated device): it
/// holds memory but no address until it is mapped into a reserved range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawPhysical(u64);

impl RawPhysical {
    /// A handle of a backend outside the crate, from its bits. Passing one
    /// to another backend's calls is refused by their safety contracts
    /// (every call taking a handle is `unsafe fn`).
    pub fn new(bits: u64) -> Self {
        RawPhysical(bits)
    }

    /// The handle's bits.
    pub fn get(self) -> u64 {
        self.0
    }
}

fn vm_unsupported(call: DriverCall) -> GpuError {
    GpuError::driver(
        call,
        801,
        "CUDA_ERROR_NOT_SUPPORTED: this backend has no virtual memory management",
    )
}

fn host_unsupported(call: DriverCall) -> GpuError {
    GpuError::driver(
        call,
        driver_code::NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED: this backend has no pinned host memory",
    )
}

/// Page-locked (pinned) host memory made by [`Gpu::host_alloc`]: a
/// descriptor, like an address; it owns nothing, and only
/// [`Gpu::host_free`] gives the memory back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// Where the host reads and writes the memory.
    pub ptr: std::ptr::NonNull<u8>,
    /// The address the backend's host copy calls
    /// ([`copy_to_device_async`](Gpu::copy_to_device_async),
    /// [`copy_to_host_async`](Gpu::copy_to_host_async)) take for it: `ptr`
    /// itself on CUDA (unified addressing), a simulated address on
    /// [`SimGpu`](sim::SimGpu), whose copies touch no real memory.
    pub addr: u64,
    /// Its length in bytes.
    pub bytes: usize,
}

#[allow(unsafe_code)] // a descriptor's auto traits, argued below.
// SAFETY: a descriptor, as a `u64` address is: nothing reads or writes
// through `ptr` without an `unsafe` block that argues the memory is live and
// not touched by the device at the same time (the host pool's buffers).
unsafe impl Send for HostMemory {}
#[allow(unsafe_code)] // as for `Send`.
// SAFETY: as for `Send`: shared references give no access to the memory.
unsafe impl Sync for HostMemory {}

fn capture_unsupported(call: DriverCall) -> GpuError {
    GpuError::driver(
        call,
        driver_code::NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED: this backend cannot capture graphs",
    )
}

/// A host function queued on a stream: runs once, when the stream reaches it.
///
/// It runs on a driver thread: it must not call the driver, and should only
/// flip a flag and wake someone.
pub type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// The driver calls that stream-ordered bookkeeping needs.
///
/// Every method is thread-safe and none blocks except the two
/// `*_synchronize` calls. Stream-ordered methods (`alloc_async`, `free_async`,
/// `event_record`, `stream_wait_event`, `launch_host_fn`, `memset_async`,
/// `copy_async`) only queue work and return.
///
/// # Handles
///
/// The methods that take a handle or an address are `unsafe fn`. Their
/// `# Safety` lists use these terms:
///
/// - a **live stream** is a handle of a stream of this backend's device that
///   has not been destroyed and will not be while the call runs: one of a
///   [`StreamPool`](crate::StreamPool) the caller holds, or one
///   [`create_stream`](Gpu::create_stream) returned and
///   [`destroy_stream`](Gpu::destroy_stream) was not called on;
/// - a **live event** is one [`event_create`](Gpu::event_create) of this
///   backend returned and [`event_destroy`](Gpu::event_destroy) was not
///   called on;
/// - a **live range** is `len` bytes inside one allocation that
///   [`alloc_async`](Gpu::alloc_async) of this backend returned and whose
///   free is not queued before the work being queued (in stream order).
///
/// The virtual-memory calls add:
///
/// - a **live reservation** is a range that
///   [`address_reserve`](Gpu::address_reserve) of this backend returned,
///   with the length it was asked for, and that
///   [`address_free`](Gpu::address_free) was not called on;
/// - a **live physical handle** is one [`mem_create`](Gpu::mem_create) of
///   this backend returned and [`mem_release`](Gpu::mem_release) was not
///   called on;
/// - a **mapping** is the range one [`mem_map`](Gpu::mem_map) call mapped,
///   until a [`mem_unmap`](Gpu::mem_unmap) covering it;
/// - memory is **idle** when no work queued on the device touches it any
///   more: the host has seen complete an event recorded after the last
///   operation on it (in stream order on every stream that used it).
///
/// The pinned host memory calls add:
///
/// - a **live host range** is `len` bytes at an address inside one
///   [`HostMemory`] that [`host_alloc`](Gpu::host_alloc) of this backend
///   returned (its [`addr`](HostMemory::addr) side) and that
///   [`host_free`](Gpu::host_free) was not called on.
///
/// [`note_suballocation`](Gpu::note_suballocation) and
/// [`note_subfree`](Gpu::note_subfree) take addresses too but stay safe:
/// they are bookkeeping hints that no backend passes to the driver (CUDA
/// ignores them; the simulated device checks them).
///
/// # Safety
/// The crate builds safe calls on what a backend returns and answers, so
/// an implementation promises:
/// 1. an address [`alloc_async`](Gpu::alloc_async) returns (and a range
///    [`mem_map`](Gpu::mem_map) mapped into a reservation
///    [`address_reserve`](Gpu::address_reserve) returned) is `bytes` bytes
///    of memory of device [`ordinal`](Gpu::ordinal) that nothing else uses
///    until the crate queues its free (or unmap): its own memory calls
///    ([`memset_async`](Gpu::memset_async), [`copy_async`](Gpu::copy_async))
///    and, when the backend is used with a [`StreamPool`](crate::StreamPool)
///    of cudarc streams, cudarc's calls on those streams
///    ([`CudaBuffer`](crate::CudaBuffer)) may write it. A backend without
///    real memory (a null or simulated one) is never paired with a pool of
///    cudarc streams;
/// 2. [`event_query`](Gpu::event_query) and
///    [`stream_query`](Gpu::stream_query) answer "done" only once the work
///    queued before the record (or on the stream) has completed, and a
///    host function runs only once the work queued before it has: the
///    crate hands memory on when they say so;
/// 3. work queued on one stream runs in its order, and a
///    [`stream_wait_event`](Gpu::stream_wait_event) orders the stream's
///    later work after the event's record;
/// 4. a handle a create call returned (stream, event, physical memory,
///    graph) stays valid for the calls taking it until its destroy call;
/// 5. a [`HostMemory`] [`host_alloc`](Gpu::host_alloc) returns is `bytes`
///    bytes at `ptr`, readable and writable by the host, aligned to at
///    least 256 bytes, that nothing else uses until the crate calls
///    [`host_free`](Gpu::host_free) on it, and the host copy calls touch
///    only the ranges they are given, in stream order.
#[allow(unsafe_code)] // the seam's contract: the crate trusts what a backend returns.
pub unsafe trait Gpu: Send + Sync + 'static {
    /// Device ordinal.
    fn ordinal(&self) -> u32;

    /// The identity of the context whose streams and memory this backend
    /// uses (the `CUcontext` of a CUDA backend, the host of a simulated
    /// one): two backends of one ordinal with different contexts do not
    /// take each other's streams. [`Device::new`](crate::Device::new)
    /// compares it with the context of a stream pool the crate made.
    fn context_id(&self) -> u64;

    /// Queues an allocation of `bytes` on `stream`; the address is usable on
    /// `stream` from this point of its order. Zero bytes returns address 0.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64>;

    /// Queues the free of `ptr` on `stream`.
    ///
    /// # Safety
    /// 1. `stream` is a live stream;
    /// 2. `ptr` was returned by [`alloc_async`](Gpu::alloc_async) of this backend
    ///    and its free was not queued before.
    unsafe fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()>;

    /// Creates an event with timing disabled.
    fn event_create(&self) -> GpuResult<RawEvent>;

    /// Records `event` at the current end of `stream` (replacing an earlier
    /// record; waits queued before keep the record they saw).
    ///
    /// # Safety
    /// 1. `event` is a live event and `stream` a live stream.
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()>;

    /// Whether the work captured by the latest record of `event` is done (a
    /// never-recorded event is done).
    ///
    /// # Safety
    /// 1. `event` is a live event.
    unsafe fn event_query(&self, event: RawEvent) -> GpuResult<bool>;

    /// Blocks the calling thread until `event` is done.
    ///
    /// # Safety
    /// 1. `event` is a live event.
    unsafe fn event_synchronize(&self, event: RawEvent) -> GpuResult<()>;

    /// Destroys `event`.
    ///
    /// # Safety
    /// 1. `event` is a live event;
    /// 2. it is not used afterwards (a wait already queued on it may still run).
    unsafe fn event_destroy(&self, event: RawEvent) -> GpuResult<()>;

    /// Makes later work on `stream` wait for the latest record of `event`.
    ///
    /// # Safety
    /// 1. `stream` is a live stream and `event` a live event.
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()>;

    /// Blocks the calling thread until `stream` is idle.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()>;

    /// Whether everything queued on `stream` so far has executed, without
    /// waiting (`cuStreamQuery`).
    ///
    /// Refused on a capturing stream with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and the capture is
    /// invalidated: ask [`capture_status`](Self::capture_status) first.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn stream_query(&self, stream: RawStream) -> GpuResult<bool>;

    /// Queues a host function on `stream`. Not called after a device fault.
    ///
    /// Refused on a capturing stream with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, without invalidating the
    /// capture: a captured host function would run at every replay, and a
    /// [`HostFn`] runs once.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()>;

    /// Queues a fill of `len` bytes at `ptr` with `value` (used for poisoning).
    ///
    /// # Safety
    /// 1. `stream` is a live stream;
    /// 2. `ptr..ptr + len` is a live range.
    unsafe fn memset_async(
        &self,
        ptr: u64,
        value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()>;

    /// Queues a device-to-device copy of `len` bytes.
    ///
    /// # Safety
    /// 1. `stream` is a live stream;
    /// 2. `dst..dst + len` and `src..src + len` are live ranges.
    unsafe fn copy_async(&self, dst: u64, src: u64, len: usize, stream: RawStream)
    -> GpuResult<()>;

    /// Free and total device memory, in bytes.
    fn mem_info(&self) -> GpuResult<(usize, usize)>;

    /// Allocates `bytes` of page-locked host memory that any context's
    /// streams may copy from and to asynchronously (`cuMemHostAlloc` with
    /// `CU_MEMHOSTALLOC_PORTABLE`). The contents are undefined.
    ///
    /// `numa_node` asks for the memory on that host NUMA node; backends
    /// place it as best they can (see [`HostPoolConfig::numa_node`]).
    /// The default reports `CUDA_ERROR_NOT_SUPPORTED`.
    ///
    /// [`HostPoolConfig::numa_node`]: crate::HostPoolConfig::numa_node
    fn host_alloc(&self, bytes: usize, numa_node: Option<u32>) -> GpuResult<HostMemory> {
        let _ = (bytes, numa_node);
        Err(host_unsupported(DriverCall::MemHostAlloc))
    }

    /// Unpins and frees host memory made by [`host_alloc`](Gpu::host_alloc)
    /// (`cuMemFreeHost`).
    ///
    /// # Safety
    /// 1. `memory` is exactly what [`host_alloc`](Gpu::host_alloc) of this
    ///    backend returned, not freed before, and not used afterwards;
    /// 2. it is idle: no copy queued on the device touches it any more (the
    ///    host has seen an event recorded after each complete).
    unsafe fn host_free(&self, memory: HostMemory) -> GpuResult<()> {
        let _ = memory;
        Err(host_unsupported(DriverCall::MemFreeHost))
    }

    /// Queues a copy of `len` bytes from pinned host memory to the device
    /// (`cuMemcpyHtoDAsync`): the device reads `src` when the stream gets
    /// there, not now.
    ///
    /// # Safety
    /// 1. `stream` is a live stream;
    /// 2. `dst..dst + len` is a live range, `src..src + len` a live host
    ///    range;
    /// 3. the host does not write `src..src + len` until the copy completed.
    unsafe fn copy_to_device_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        let _ = (dst, src, len, stream);
        Err(host_unsupported(DriverCall::MemcpyHostAsync))
    }

    /// Queues a copy of `len` bytes from the device to pinned host memory
    /// (`cuMemcpyDtoHAsync`): the device writes `dst` when the stream gets
    /// there, not now.
    ///
    /// # Safety
    /// 1. `stream` is a live stream;
    /// 2. `src..src + len` is a live range, `dst..dst + len` a live host
    ///    range;
    /// 3. the host neither reads nor writes `dst..dst + len` until the
    ///    copy completed.
    unsafe fn copy_to_host_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        let _ = (dst, src, len, stream);
        Err(host_unsupported(DriverCall::MemcpyHostAsync))
    }

    /// Tells a checking backend that the host is about to read or write
    /// (`access`) the host memory at `addr` (the [`HostMemory::addr`] side),
    /// so that a copy the host has not seen complete shows as a race. The
    /// simulated device checks it; CUDA and the default do nothing.
    fn note_host_access(&self, addr: u64, access: crate::types::Access) {
        let _ = (addr, access);
    }

    /// Tells a checking backend that the host memory at `addr` changes
    /// owner (a pool hands it out again), the caller claiming every copy
    /// of it complete: the simulated device checks the claim against what
    /// the host has seen complete and reports a race when it is false.
    /// CUDA and the default do nothing.
    fn note_host_reuse(&self, addr: u64) {
        let _ = addr;
    }

    /// Creates a new non-blocking stream owned by the caller, who destroys it
    /// with [`destroy_stream`](Gpu::destroy_stream). The futures layer uses
    /// one per user stream to carry completion notifications without
    /// stalling the user's stream.
    ///
    /// The default reports `CUDA_ERROR_NOT_SUPPORTED` (as [`DriverCall::Init`]),
    /// so that backends written before this method keep compiling; callers
    /// then fall back to the user's stream.
    fn create_stream(&self) -> GpuResult<RawStream> {
        Err(GpuError::driver(
            DriverCall::Init,
            driver_code::NOT_SUPPORTED,
            "CUDA_ERROR_NOT_SUPPORTED: this backend cannot create streams",
        ))
    }

    /// The granularity of virtual-memory mappings: the size and alignment
    /// unit of [`mem_create`](Gpu::mem_create), [`mem_map`](Gpu::mem_map)
    /// and [`address_reserve`](Gpu::address_reserve). The default reports
    /// `CUDA_ERROR_NOT_SUPPORTED`: the backend has no virtual memory
    /// management, and callers fall back to stream-ordered allocation.
    fn vm_granularity(&self) -> GpuResult<usize> {
        Err(vm_unsupported(DriverCall::AddressReserve))
    }

    /// Reserves `bytes` (a multiple of the granularity) of virtual address
    /// space, with no memory behind it (`cuMemAddressReserve`).
    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        let _ = bytes;
        Err(vm_unsupported(DriverCall::AddressReserve))
    }

    /// Gives back a reservation (`cuMemAddressFree`).
    ///
    /// # Safety
    /// 1. `[addr, addr + bytes)` is exactly a live reservation (its start and
    ///    its whole length), and it is not used afterwards;
    /// 2. no mapping is left in it.
    unsafe fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let _ = (addr, bytes);
        Err(vm_unsupported(DriverCall::AddressFree))
    }

    /// Creates `bytes` (a multiple of the granularity) of physical memory on
    /// this device (`cuMemCreate`). Out of memory is
    /// [`GpuError::OutOfMemory`].
    fn mem_create(&self, bytes: usize) -> GpuResult<RawPhysical> {
        let _ = bytes;
        Err(vm_unsupported(DriverCall::MemCreate))
    }

    /// Releases physical memory (`cuMemRelease`); the device gets it back
    /// once it is also unmapped everywhere.
    ///
    /// # Safety
    /// 1. `handle` is a live physical handle (so it is released once);
    /// 2. it is not passed to [`mem_map`](Gpu::mem_map) afterwards (its
    ///    mappings may stay until they are unmapped).
    unsafe fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        let _ = handle;
        Err(vm_unsupported(DriverCall::MemRelease))
    }

    /// Maps the whole of `handle` (of `bytes` bytes) at `addr` (`cuMemMap`).
    /// The memory is not accessible until
    /// [`mem_set_access`](Gpu::mem_set_access) covers it.
    ///
    /// # Safety
    /// 1. `[addr, addr + bytes)` lies inside one live reservation, `addr`
    ///    and `bytes` are multiples of the granularity;
    /// 2. no mapping overlaps the range;
    /// 3. `handle` is a live physical handle of exactly `bytes` bytes.
    unsafe fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        let _ = (addr, bytes, handle);
        Err(vm_unsupported(DriverCall::MemMap))
    }

    /// Maps `bytes` of `handle`, from `offset` bytes into it, at `addr`
    /// (`cuMemMap` with an offset): a part of physical memory that may be
    /// mapped elsewhere too, so that one handle backs two addresses (the
    /// driver releases the memory only once every mapping of it is
    /// unmapped and the handle released). Not accessible until
    /// [`mem_set_access`](Gpu::mem_set_access) covers it. The default
    /// reports `CUDA_ERROR_NOT_SUPPORTED`. CUDA 13.0's driver (580.159, on
    /// an H100) refuses a non-zero `offset`, as its older documentation
    /// says ("currently must be zero"), and [`SimGpu`](crate::gpu::sim::SimGpu)
    /// does the same: map whole handles from their start.
    ///
    /// # Safety
    /// 1. `[addr, addr + bytes)` lies inside one live reservation, `addr`,
    ///    `bytes` and `offset` are multiples of the granularity;
    /// 2. no mapping overlaps the range;
    /// 3. `handle` is a live physical handle of at least `offset + bytes`
    ///    bytes;
    /// 4. every use of the new range is ordered after every use of the same
    ///    memory through the handle's other mappings (it is the same memory
    ///    at two addresses), and nothing uses those addresses of it again.
    unsafe fn mem_map_part(
        &self,
        addr: u64,
        bytes: usize,
        handle: RawPhysical,
        offset: usize,
    ) -> GpuResult<()> {
        let _ = (addr, bytes, handle, offset);
        Err(vm_unsupported(DriverCall::MemMap))
    }

    /// Makes `[addr, addr + bytes)`, mapped by [`mem_map`](Gpu::mem_map)
    /// calls, readable and writable by this device (`cuMemSetAccess`); one
    /// call may cover several adjacent mappings.
    ///
    /// # Safety
    /// 1. `[addr, addr + bytes)` lies inside one live reservation and is
    ///    entirely covered by mappings.
    unsafe fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let _ = (addr, bytes);
        Err(vm_unsupported(DriverCall::MemSetAccess))
    }

    /// Unmaps `[addr, addr + bytes)` (`cuMemUnmap`); it may cover several
    /// whole mappings.
    ///
    /// # Safety
    /// 1. `[addr, addr + bytes)` lies inside one live reservation and covers
    ///    whole mappings only (none cut in part);
    /// 2. the range is idle: unmapping does not wait for queued work, and
    ///    the device would fault on it;
    /// 3. no address in the range is used afterwards (no block handed out
    ///    over it stays live) until it is mapped again.
    unsafe fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let _ = (addr, bytes);
        Err(vm_unsupported(DriverCall::MemUnmap))
    }

    /// Tells a checking backend that `[addr, addr + bytes)`, carved by the
    /// caller out of memory it manages (a virtual-memory arena), now holds a
    /// new allocation ordered on `stream`, so that uses of it can be checked
    /// for races. The simulated device registers it with its race detector
    /// (and reports a reuse not ordered after the previous free; on a
    /// capturing stream it records the note into the graph, and every replay
    /// makes it again); CUDA and the default do nothing.
    fn note_suballocation(&self, addr: u64, bytes: usize, stream: RawStream) {
        let _ = (addr, bytes, stream);
    }

    /// Tells a checking backend that the allocation noted at `addr` by
    /// [`note_suballocation`](Gpu::note_suballocation) is freed at the
    /// current end of `stream` (a use ordered after it is a use after free).
    /// CUDA and the default do nothing.
    fn note_subfree(&self, addr: u64, stream: RawStream) {
        let _ = (addr, stream);
    }

    /// [`note_subfree`](Gpu::note_subfree) of an allocation whose every
    /// use the caller saw complete (the crate frees such memory for every
    /// stream at once): the simulated device checks that claim against
    /// what the host has seen complete, and reports it when false. The
    /// default is `note_subfree`; CUDA does nothing.
    fn note_subfree_completed(&self, addr: u64, stream: RawStream) {
        self.note_subfree(addr, stream);
    }

    /// Tells a checking backend that the allocation noted at `addr` by
    /// [`note_suballocation`](Gpu::note_suballocation) on `stream` is undone:
    /// no operation ever touched it (a block the crate never let out of
    /// its hands, [`NeverUsed`](crate::NeverUsed)), and
    /// its range is the caller's again as it was before, ordered after the
    /// frees it was ordered after then. The simulated device checks the
    /// claim (an access or a free of the allocation is reported) and puts
    /// back the histories the allocation replaced, so that the next
    /// allocation there must be ordered after their frees again. The
    /// default is `note_subfree`; CUDA does nothing.
    fn note_suballocation_undone(&self, addr: u64, stream: RawStream) {
        self.note_subfree(addr, stream);
    }

    /// How much device memory this backend holds for the process now and at
    /// most (see [`HeldMemory`]). CUDA: the reserved memory of the backend's
    /// memory pool (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and `_HIGH`); a
    /// backend that also holds memory outside its pool (virtual-memory pages)
    /// counts it here too. The simulated device: the bytes it has handed out
    /// and not had back, and their high-water mark.
    ///
    /// The default reports `CUDA_ERROR_NOT_SUPPORTED` (as
    /// [`DriverCall::MemGetInfo`]), so that backends written before this
    /// method keep compiling.
    fn memory_held(&self) -> GpuResult<HeldMemory> {
        Err(GpuError::driver(
            DriverCall::MemGetInfo,
            driver_code::NOT_SUPPORTED,
            "CUDA_ERROR_NOT_SUPPORTED: this backend does not report the memory it holds",
        ))
    }

    /// Starts the high-water mark of [`memory_held`](Gpu::memory_held) again
    /// from the memory held now. The default reports
    /// `CUDA_ERROR_NOT_SUPPORTED`, as `memory_held` does.
    fn reset_memory_held_high(&self) -> GpuResult<()> {
        Err(GpuError::driver(
            DriverCall::MemGetInfo,
            driver_code::NOT_SUPPORTED,
            "CUDA_ERROR_NOT_SUPPORTED: this backend does not report the memory it holds",
        ))
    }

    /// Whether `stream` is being captured into a graph, and by which capture
    /// (`cuStreamGetCaptureInfo`). Cheap (no synchronization, a few hundred
    /// nanoseconds on CUDA) but not free: callers ask once per operation,
    /// before an event query, a synchronize or a host function would be
    /// made on the stream's behalf (see [`CaptureStatus`]).
    ///
    /// The default reports [`CaptureStatus::None`]: a backend that cannot
    /// capture never has a capturing stream.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn capture_status(&self, stream: RawStream) -> GpuResult<CaptureStatus> {
        let _ = stream;
        Ok(CaptureStatus::None)
    }

    /// Begins capturing `stream` into a new graph (`cuStreamBeginCapture`):
    /// work queued on it from now on is recorded, not run, until
    /// [`end_capture`](Gpu::end_capture). Another stream that waits on an
    /// event recorded in the capture joins it, and must be joined back
    /// (the origin waits on an event recorded on it) before the end.
    ///
    /// # Errors
    /// `CUDA_ERROR_ILLEGAL_STATE` when the stream is already capturing; the
    /// default reports `CUDA_ERROR_NOT_SUPPORTED`.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> GpuResult<()> {
        let _ = (stream, mode);
        Err(capture_unsupported(DriverCall::StreamBeginCapture))
    }

    /// Ends the capture begun on `stream` and returns its graph
    /// (`cuStreamEndCapture`); every stream that joined it stops capturing.
    /// The caller owns the graph and destroys it with
    /// [`graph_destroy`](Gpu::graph_destroy) ([`Graph`] does).
    ///
    /// # Errors
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when an illegal call
    /// invalidated the capture (it ends all the same, with no graph);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` when the capture was not begun
    /// on `stream`; `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` when a joined stream
    /// was not joined back; `CUDA_ERROR_ILLEGAL_STATE` when `stream` is not
    /// capturing. The default reports `CUDA_ERROR_NOT_SUPPORTED`.
    ///
    /// # Safety
    /// 1. `stream` is a live stream.
    unsafe fn end_capture(&self, stream: RawStream) -> GpuResult<RawGraph> {
        let _ = stream;
        Err(capture_unsupported(DriverCall::StreamEndCapture))
    }

    /// Instantiates `graph` into an executable graph (`cuGraphInstantiate`),
    /// which the caller owns and destroys with
    /// [`graph_exec_destroy`](Gpu::graph_exec_destroy). The graph may be
    /// destroyed before its executable.
    ///
    /// # Safety
    /// 1. `graph` is a live graph: one [`end_capture`](Gpu::end_capture) of
    ///    this backend returned and [`graph_destroy`](Gpu::graph_destroy)
    ///    was not called on;
    /// 2. no other call on `graph` runs at the same time (the driver does
    ///    not synchronize graph objects).
    unsafe fn graph_instantiate(&self, graph: RawGraph) -> GpuResult<RawGraphExec> {
        let _ = graph;
        Err(capture_unsupported(DriverCall::GraphInstantiate))
    }

    /// Queues one replay of `exec` on `stream` (`cuGraphLaunch`): ordered
    /// after the work queued on `stream` before it, and the work queued
    /// after it waits for the whole replay.
    ///
    /// # Errors
    /// `CUDA_ERROR_INVALID_VALUE` when an allocation the graph made and did
    /// not free in its last replay has not been freed since.
    ///
    /// # Safety
    /// 1. `stream` is a live stream and `exec` a live executable graph (one
    ///    [`graph_instantiate`](Gpu::graph_instantiate) of this backend
    ///    returned, not destroyed);
    /// 2. every memory range the graph's work touches that the graph did not
    ///    allocate itself is a live range when the replay runs;
    /// 3. no other call on `exec` runs at the same time.
    ///
    /// # Stream ordering
    /// The launches of one executable run one at a time, in the order they
    /// were queued, whatever their streams: a launch on `stream` comes after
    /// the executable's previous launch (and so does the work queued on
    /// `stream` after it). Launches of two executables are ordered only as
    /// their streams are.
    unsafe fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> GpuResult<()> {
        let _ = (exec, stream);
        Err(capture_unsupported(DriverCall::GraphLaunch))
    }

    /// Destroys an executable graph (`cuGraphExecDestroy`); replays already
    /// queued still run, and its resources go back when they have.
    ///
    /// # Safety
    /// 1. `exec` is a live executable graph of this backend, not used
    ///    afterwards.
    unsafe fn graph_exec_destroy(&self, exec: RawGraphExec) -> GpuResult<()> {
        let _ = exec;
        Err(capture_unsupported(DriverCall::GraphDestroy))
    }

    /// Destroys a graph (`cuGraphDestroy`); executables instantiated from
    /// it stay valid.
    ///
    /// # Safety
    /// 1. `graph` is a live graph of this backend, not used afterwards.
    unsafe fn graph_destroy(&self, graph: RawGraph) -> GpuResult<()> {
        let _ = graph;
        Err(capture_unsupported(DriverCall::GraphDestroy))
    }

    /// Destroys a stream made by [`create_stream`](Gpu::create_stream). Work
    /// still queued on it completes first (as `cuStreamDestroy` documents).
    /// The default does nothing.
    ///
    /// # Safety
    /// 1. `stream` was returned by [`create_stream`](Gpu::create_stream) of this
    ///    backend and was not destroyed before;
    /// 2. it is not used afterwards.
    unsafe fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        let _ = stream;
        Ok(())
    }
}
