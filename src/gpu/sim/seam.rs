//! The [`Gpu`] seam on the simulated device: the trait's `unsafe` methods
//! are the inherent safe ones of `calls.rs`, the rest queued or answered
//! here.

use super::SimGpu;
use crate::error::DriverCall;
use crate::gpu::{
    CaptureMode, CaptureStatus, Gpu, GpuResult, HeldMemory, HostFn, HostMemory, RawEvent, RawGraph,
    RawGraphExec, RawPhysical, RawStream,
};
use crate::types::Access;

// Every call is checked by the simulator: the trait's unsafe methods are the
// inherent safe ones.
#[allow(unsafe_code)] // the simulator keeps the seam's contract.
// SAFETY: the simulated device hands out ranges of its own address space,
// never pooled with cudarc streams (its pools hold simulated handles), and
// models stream order, events and host functions as the contract says
// (what its race detector checks the crate against).
unsafe impl Gpu for SimGpu {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    fn context_id(&self) -> u64 {
        self.context_id()
    }

    unsafe fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64> {
        SimGpu::alloc_async(self, bytes, stream)
    }

    unsafe fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()> {
        SimGpu::free_async(self, ptr, stream)
    }

    fn event_create(&self) -> GpuResult<RawEvent> {
        self.queue(DriverCall::EventCreate, |st| {
            Ok(RawEvent::sim(st.event_create()))
        })
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()> {
        SimGpu::event_record(self, event, stream)
    }

    unsafe fn event_query(&self, event: RawEvent) -> GpuResult<bool> {
        SimGpu::event_query(self, event)
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> GpuResult<()> {
        SimGpu::event_synchronize(self, event)
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> GpuResult<()> {
        SimGpu::event_destroy(self, event)
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()> {
        SimGpu::stream_wait_event(self, stream, event)
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()> {
        SimGpu::stream_synchronize(self, stream)
    }

    unsafe fn stream_query(&self, stream: RawStream) -> GpuResult<bool> {
        SimGpu::stream_query(self, stream)
    }

    unsafe fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()> {
        SimGpu::launch_host_fn(self, stream, f)
    }

    unsafe fn memset_async(
        &self,
        ptr: u64,
        value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        SimGpu::memset_async(self, ptr, value, len, stream)
    }

    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        SimGpu::copy_async(self, dst, src, len, stream)
    }

    fn mem_info(&self) -> GpuResult<(usize, usize)> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemGetInfo)?;
        let space = state.space(self.ordinal);
        Ok((space.free_bytes(), space.capacity()))
    }

    fn host_alloc(&self, bytes: usize, numa_node: Option<u32>) -> GpuResult<HostMemory> {
        SimGpu::host_alloc(self, bytes, numa_node)
    }

    unsafe fn host_free(&self, memory: HostMemory) -> GpuResult<()> {
        SimGpu::host_free(self, memory)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        SimGpu::copy_to_device_async(self, dst, src, len, stream)
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        SimGpu::copy_to_host_async(self, dst, src, len, stream)
    }

    fn note_host_access(&self, addr: u64, access: Access) {
        self.shared.lock().host_access(addr, access);
    }

    fn note_host_reuse(&self, addr: u64) {
        self.shared.lock().host_reuse(addr);
    }

    fn vm_granularity(&self) -> GpuResult<usize> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::AddressReserve)?;
        state.vm.supported(DriverCall::AddressReserve)
    }

    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::AddressReserve)?;
        state.vm.reserve(self.ordinal, bytes)
    }

    unsafe fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        SimGpu::address_free(self, addr, bytes)
    }

    fn mem_create(&self, bytes: usize) -> GpuResult<RawPhysical> {
        self.shared.gates.pass(DriverCall::MemCreate);
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemCreate)?;
        state.vm_create(self.ordinal, bytes).map(RawPhysical::new)
    }

    unsafe fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        SimGpu::mem_release(self, handle)
    }

    unsafe fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        SimGpu::mem_map(self, addr, bytes, handle)
    }

    unsafe fn mem_map_part(
        &self,
        addr: u64,
        bytes: usize,
        handle: RawPhysical,
        offset: usize,
    ) -> GpuResult<()> {
        SimGpu::mem_map_part(self, addr, bytes, handle, offset)
    }

    unsafe fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        SimGpu::mem_set_access(self, addr, bytes)
    }

    unsafe fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        SimGpu::mem_unmap(self, addr, bytes)
    }

    fn note_suballocation(&self, addr: u64, bytes: usize, stream: RawStream) {
        self.shared
            .lock()
            .note_suballoc(addr, bytes, self.stream_slot(stream));
        self.notify_work();
    }

    fn note_subfree(&self, addr: u64, stream: RawStream) {
        self.shared
            .lock()
            .note_subfree(addr, self.stream_slot(stream));
        self.notify_work();
    }

    fn note_subfree_completed(&self, addr: u64, stream: RawStream) {
        self.shared
            .lock()
            .note_subfree_completed(addr, self.stream_slot(stream));
    }

    fn note_suballocation_undone(&self, addr: u64, stream: RawStream) {
        self.shared
            .lock()
            .note_suballoc_undone(addr, self.stream_slot(stream));
    }

    fn memory_held(&self) -> GpuResult<HeldMemory> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemGetInfo)?;
        Ok(state.space(self.ordinal).held())
    }

    fn reset_memory_held_high(&self) -> GpuResult<()> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemGetInfo)?;
        if let Some(space) = state.spaces.get_mut(&self.ordinal) {
            space.reset_high();
        }
        Ok(())
    }

    fn create_stream(&self) -> GpuResult<RawStream> {
        // A faulted device refuses new streams, as a poisoned context does.
        self.shared.lock().enter(DriverCall::Init)?;
        Ok(SimGpu::create_stream(self))
    }

    unsafe fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        SimGpu::destroy_stream(self, stream)
    }

    unsafe fn capture_status(&self, stream: RawStream) -> GpuResult<CaptureStatus> {
        SimGpu::capture_status(self, stream)
    }

    unsafe fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> GpuResult<()> {
        SimGpu::begin_capture(self, stream, mode)
    }

    unsafe fn end_capture(&self, stream: RawStream) -> GpuResult<RawGraph> {
        SimGpu::end_capture(self, stream)
    }

    unsafe fn graph_instantiate(&self, graph: RawGraph) -> GpuResult<RawGraphExec> {
        SimGpu::graph_instantiate(self, graph)
    }

    unsafe fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> GpuResult<()> {
        SimGpu::graph_launch(self, exec, stream)
    }

    unsafe fn graph_exec_destroy(&self, exec: RawGraphExec) -> GpuResult<()> {
        SimGpu::graph_exec_destroy(self, exec)
    }

    unsafe fn graph_destroy(&self, graph: RawGraph) -> GpuResult<()> {
        SimGpu::graph_destroy(self, graph)
    }
}
