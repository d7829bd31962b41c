//! The driver's calls on the simulated device, as safe inherent methods:
//! each checks every handle and address and refuses what is not its own
//! (the [`Gpu`] seam's `unsafe` methods forward here, `seam.rs`).

use super::{SimGpu, sim_event};
use crate::error::DriverCall;
use crate::gpu::{
    CaptureMode, CaptureStatus, GpuResult, HostFn, HostMemory, RawEvent, RawGraph, RawGraphExec,
    RawPhysical, RawStream,
};
use crate::types::Access;

// Named by the docs only.
#[cfg(doc)]
use super::RaceKind;
#[cfg(doc)]
use crate::gpu::Gpu;

impl SimGpu {
    /// Queues an allocation on `stream` (see [`Gpu::alloc_async`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64> {
        self.queue(DriverCall::AllocAsync, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::AllocAsync,
            )?;
            st.alloc(bytes, self.stream_slot(stream))
        })
    }
    /// Queues the free of `ptr` on `stream` (see [`Gpu::free_async`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()> {
        self.queue(DriverCall::FreeAsync, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::FreeAsync,
            )?;
            st.free(ptr, self.stream_slot(stream))
        })
    }
    /// Records `event` on `stream` (see [`Gpu::event_record`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()> {
        self.shared.gates.pass(DriverCall::EventRecord);
        self.queue(DriverCall::EventRecord, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::EventRecord,
            )?;
            st.record(sim_event(event), self.stream_slot(stream))
        })
    }
    /// Whether `event`'s latest record ran (see [`Gpu::event_query`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn event_query(&self, event: RawEvent) -> GpuResult<bool> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::EventQuery)?;
        state.query(sim_event(event), DriverCall::EventQuery)
    }
    /// Blocks until `event` is done (see [`Gpu::event_synchronize`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn event_synchronize(&self, event: RawEvent) -> GpuResult<()> {
        let (generation, clock) = {
            let mut state = self.shared.lock();
            state.enter(DriverCall::EventSynchronize)?;
            state.event_target(sim_event(event))?
        };
        let e = sim_event(event);
        self.block_until(DriverCall::EventSynchronize, |st| {
            st.event_reached(e, generation)
        })?;
        self.shared.lock().host_saw(&clock);
        Ok(())
    }
    /// Destroys `event` (see [`Gpu::event_destroy`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn event_destroy(&self, event: RawEvent) -> GpuResult<()> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::EventDestroy)?;
        state.event_destroy(sim_event(event))
    }
    /// Makes `stream` wait for `event` (see [`Gpu::stream_wait_event`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()> {
        self.queue(DriverCall::StreamWaitEvent, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::StreamWaitEvent,
            )?;
            st.wait(self.stream_slot(stream), sim_event(event))
        })
    }
    /// Blocks until `stream` is idle (see [`Gpu::stream_synchronize`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()> {
        let s = self.stream_slot(stream);
        let clock = {
            let mut state = self.shared.lock();
            state.enter(DriverCall::StreamSynchronize)?;
            state.stream_target(s)?
        };
        self.block_until(DriverCall::StreamSynchronize, |st| st.stream_idle(s))?;
        self.shared.lock().host_saw(&clock);
        Ok(())
    }
    /// Whether `stream` ran everything queued on it (see
    /// [`Gpu::stream_query`]). Safe: the simulator checks every handle and
    /// address, and refuses what is not its own.
    pub fn stream_query(&self, stream: RawStream) -> GpuResult<bool> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::StreamQuery)?;
        state.stream_query(self.stream_slot(stream), self.ordinal)
    }
    /// Queues a host function on `stream` (see [`Gpu::launch_host_fn`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()> {
        self.queue(DriverCall::LaunchHostFunc, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::LaunchHostFunc,
            )?;
            st.host_fn(self.stream_slot(stream), f)
        })
    }
    /// Queues a fill (see [`Gpu::memset_async`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn memset_async(
        &self,
        ptr: u64,
        _value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        if len == 0 {
            return Ok(());
        }
        self.queue(DriverCall::MemsetAsync, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::MemsetAsync,
            )?;
            st.kernel(self.stream_slot(stream), &[(ptr, Access::Write)])
        })
    }
    /// Queues a copy (see [`Gpu::copy_async`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn copy_async(&self, dst: u64, src: u64, len: usize, stream: RawStream) -> GpuResult<()> {
        if len == 0 {
            return Ok(());
        }
        self.queue(DriverCall::CopyAsync, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::CopyAsync,
            )?;
            st.kernel(
                self.stream_slot(stream),
                &[(src, Access::Read), (dst, Access::Write)],
            )
        })
    }
    /// Pins `bytes` of zeroed host memory (see [`Gpu::host_alloc`]): real
    /// bytes the host reads and writes, at a simulated address the copy
    /// calls take. `numa_node` is accepted and ignored (the simulated host
    /// has one node).
    ///
    /// # Errors
    /// Zero bytes (`CUDA_ERROR_INVALID_VALUE`); out of memory past the
    /// simulated host's 64 GiB of pinnable memory; an injected fault.
    pub fn host_alloc(&self, bytes: usize, numa_node: Option<u32>) -> GpuResult<HostMemory> {
        let _ = numa_node;
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemHostAlloc)?;
        state.host_alloc(bytes)
    }
    /// Frees host memory (see [`Gpu::host_free`]). Safe: the simulator
    /// refuses memory it did not pin or freed already, and reports a free
    /// of memory a copy the host has not seen complete may touch as a race.
    pub fn host_free(&self, memory: HostMemory) -> GpuResult<()> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemFreeHost)?;
        state.host_free(memory)
    }
    /// Queues a host → device copy (see [`Gpu::copy_to_device_async`]).
    /// Safe: the simulator refuses a host range it did not pin and checks
    /// both sides with its race detector; no bytes move.
    pub fn copy_to_device_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        self.host_copy(src, dst, len, stream, true)
    }
    /// Queues a device → host copy (see [`Gpu::copy_to_host_async`]).
    /// Safe: as [`copy_to_device_async`](Self::copy_to_device_async).
    pub fn copy_to_host_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        self.host_copy(dst, src, len, stream, false)
    }
    fn host_copy(
        &self,
        host: u64,
        device: u64,
        len: usize,
        stream: RawStream,
        to_device: bool,
    ) -> GpuResult<()> {
        if len == 0 {
            return Ok(());
        }
        let call = DriverCall::MemcpyHostAsync;
        self.queue(call, |st| {
            st.own_stream(self.stream_slot(stream), self.ordinal, call)?;
            st.host_copy(self.stream_slot(stream), host, device, len, to_device)
        })
    }
    /// Pinned host memory held now, in bytes, by every device of this
    /// simulated host.
    pub fn host_bytes(&self) -> usize {
        self.shared.lock().host_memory.held()
    }
    /// Gives back a reservation (see [`Gpu::address_free`]). Safe: the
    /// simulator refuses a range that is not exactly one of its reservations,
    /// or that still has memory mapped in it.
    pub fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::AddressFree)?;
        state.vm.free_reservation(addr, bytes)
    }
    /// Releases physical memory (see [`Gpu::mem_release`]). Safe: the
    /// simulator refuses a handle it did not make or already released.
    pub fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        self.shared.gates.pass(DriverCall::MemRelease);
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemRelease)?;
        state.vm_release(handle.get())
    }
    /// Maps `handle` at `addr` (see [`Gpu::mem_map`]). Safe: the simulator
    /// refuses an unaligned or already mapped range, one outside a
    /// reservation, and a handle that is not live or not of `bytes` bytes.
    pub fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        self.shared.gates.pass(DriverCall::MemMap);
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemMap)?;
        state.vm.map(addr, bytes, handle.get())
    }
    /// Maps part of `handle` at `addr` (see [`Gpu::mem_map_part`]): the
    /// same memory may be mapped at several addresses, and the race
    /// detector checks a new allocation on it against the older ones at
    /// every other address of that memory. Safe: the simulator refuses an
    /// unaligned or already mapped range, one outside a reservation, a
    /// handle that is not live and a part past its end.
    pub fn mem_map_part(
        &self,
        addr: u64,
        bytes: usize,
        handle: RawPhysical,
        offset: usize,
    ) -> GpuResult<()> {
        self.shared.gates.pass(DriverCall::MemMap);
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemMap)?;
        state.vm.map_part(addr, bytes, handle.get(), offset)
    }
    /// Opens a mapped range to the device (see [`Gpu::mem_set_access`]).
    /// Safe: the simulator refuses a range that is not entirely mapped.
    pub fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        self.shared.gates.pass(DriverCall::MemSetAccess);
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemSetAccess)?;
        state.vm.set_access(addr, bytes)
    }
    /// Unmaps whole mappings (see [`Gpu::mem_unmap`]). Safe: the simulator
    /// refuses a range that does not cover whole mappings, and reports
    /// queued work still using the memory as a race
    /// ([`RaceKind::UnmapInUse`]).
    pub fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        self.shared.gates.pass(DriverCall::MemUnmap);
        let mut state = self.shared.lock();
        state.enter(DriverCall::MemUnmap)?;
        state.vm_unmap(addr, bytes)
    }
    /// Whether `stream` is capturing (see [`Gpu::capture_status`]). Safe:
    /// the simulator checks every handle.
    pub fn capture_status(&self, stream: RawStream) -> GpuResult<CaptureStatus> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::StreamGetCaptureInfo)?;
        state.own_stream(
            self.stream_slot(stream),
            self.ordinal,
            DriverCall::StreamGetCaptureInfo,
        )?;
        state.capture_status(self.stream_slot(stream))
    }
    /// Begins capturing `stream` (see [`Gpu::begin_capture`]). Safe: the
    /// simulator checks every handle.
    pub fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> GpuResult<()> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::StreamBeginCapture)?;
        state.own_stream(
            self.stream_slot(stream),
            self.ordinal,
            DriverCall::StreamBeginCapture,
        )?;
        state.begin_capture(self.stream_slot(stream), mode)
    }
    /// Ends the capture begun on `stream` (see [`Gpu::end_capture`]). Safe:
    /// the simulator checks every handle.
    pub fn end_capture(&self, stream: RawStream) -> GpuResult<RawGraph> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::StreamEndCapture)?;
        state.own_stream(
            self.stream_slot(stream),
            self.ordinal,
            DriverCall::StreamEndCapture,
        )?;
        let graph = state.end_capture(self.stream_slot(stream));
        // A failed end may have queued the capture's memory back.
        self.notify_work();
        graph.map(RawGraph::sim)
    }
    /// Instantiates `graph` (see [`Gpu::graph_instantiate`]). Safe: the
    /// simulator refuses a handle it did not make or already destroyed.
    pub fn graph_instantiate(&self, graph: RawGraph) -> GpuResult<RawGraphExec> {
        let mut state = self.shared.lock();
        state.enter(DriverCall::GraphInstantiate)?;
        let g = graph.sim_index().unwrap_or(usize::MAX);
        state.graph_instantiate(g).map(RawGraphExec::sim)
    }
    /// Queues a replay of `exec` on `stream` (see [`Gpu::graph_launch`]):
    /// the recorded work runs there in capture order, checked by the race
    /// detector. Safe: the simulator checks every handle and address.
    pub fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> GpuResult<()> {
        self.queue(DriverCall::GraphLaunch, |st| {
            st.own_stream(
                self.stream_slot(stream),
                self.ordinal,
                DriverCall::GraphLaunch,
            )?;
            st.graph_launch(
                exec.sim_index().unwrap_or(usize::MAX),
                self.stream_slot(stream),
            )
        })
    }
    /// Destroys an executable graph (see [`Gpu::graph_exec_destroy`]);
    /// replays queued still run. Safe: the simulator refuses a handle it did
    /// not make or already destroyed.
    pub fn graph_exec_destroy(&self, exec: RawGraphExec) -> GpuResult<()> {
        let mut state = self.shared.lock();
        // Allowed on a faulted device (tear-down), as stream destruction is.
        let out = state.graph_exec_destroy(exec.sim_index().unwrap_or(usize::MAX));
        drop(state);
        self.notify_work();
        out
    }
    /// Destroys a graph (see [`Gpu::graph_destroy`]). Safe: the simulator
    /// refuses a handle it did not make or already destroyed.
    pub fn graph_destroy(&self, graph: RawGraph) -> GpuResult<()> {
        let mut state = self.shared.lock();
        let out = state.graph_destroy(graph.sim_index().unwrap_or(usize::MAX));
        drop(state);
        self.notify_work();
        out
    }
    /// Destroys `stream` (see [`Gpu::destroy_stream`]). Safe: the simulator checks every
    /// handle and address, and refuses what is not its own.
    pub fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        // Like `cuStreamDestroy`: work still queued runs; the handle is
        // refused from now on. Allowed on a faulted device (tear-down).
        self.shared
            .lock()
            .destroy_stream(self.stream_slot(stream), self.ordinal, DriverCall::Init)
    }
}
