//! The simulated device's state and its execution engine.
//!
//! State: streams (each a queue of operations and a vector clock), events
//! (latest record generation, completed generation, captured clock), the
//! address space, the race detector and the fault plan, all behind one mutex.
//! Host calls *queue* operations and check races at once; the engine
//! *executes* queued operations, one stream head at a time, chosen by a
//! seeded generator among the runnable heads: a stream whose head waits on an
//! event not yet reached, or which is running a host function, is not
//! runnable. Host functions run with the mutex released.

mod capture;
mod host;
mod kernels;

use std::collections::VecDeque;
use std::time::Instant;

pub(crate) use self::kernels::KernelSlots;
use super::address_space::AddressSpace;
use super::clock::{Epoch, VectorClock};
use super::fault::{FaultPlan, ILLEGAL_ADDRESS, INJECTED};
use super::race::{RaceDetector, SimOp};
use super::virtual_memory::VirtualMemory;
use crate::error::DriverCall;
use crate::error::driver_code::{INVALID_HANDLE, INVALID_VALUE};
use crate::gpu::{GpuError, GpuResult, HostFn};
use crate::types::Access;

pub(crate) enum OpKind {
    /// The allocation itself: nothing to do when it runs.
    Alloc,
    Free {
        device: u32,
        addr: u64,
        len: usize,
        free_id: u64,
    },
    Kernel,
    Record {
        event: usize,
        generation: u64,
    },
    Wait {
        event: usize,
        generation: u64,
    },
    Host(HostFn, VectorClock),
}

#[derive(Default)]
pub(crate) struct SimStream {
    device: u32,
    clock: VectorClock,
    queue: VecDeque<OpKind>,
    busy: bool,
    /// A kernel occupies the stream until then (see [`kernels`]).
    running_until: Option<Instant>,
    /// Destroyed by its owner: refused by every call; what was queued still
    /// runs, and once it has the slot may serve a new stream.
    destroyed: bool,
    /// The capture it takes part in: what is queued on it is recorded.
    capture: Option<u64>,
}

impl SimStream {
    /// Nothing queued, no host function or kernel running.
    fn drained(&self) -> bool {
        self.queue.is_empty() && !self.busy && self.running_until.is_none()
    }
}

#[derive(Default)]
struct SimEvent {
    recorded: u64,
    completed: u64,
    /// `recorded` when this event was created: a slot reused for a new event
    /// keeps counting generations, so that waits queued on the destroyed
    /// event still see theirs complete.
    base: u64,
    clock: VectorClock,
    alive: bool,
    /// Where the latest record was captured, when it was: such a record
    /// never completes, and querying it is illegal.
    captured: Option<capture::Captured>,
}

/// What one engine step did.
pub(crate) enum Step {
    /// Nothing queued anywhere.
    Idle,
    /// Work is queued but nothing can run now (a host function is running,
    /// or the device faulted).
    Blocked,
    /// An operation ran.
    Ran,
    /// A kernel ran on the stream, on the one-at-a-time engine: the device
    /// thread holds the stream busy ([`State::hold`]) while it sleeps the
    /// kernel's latency, so that the host sees the kernel end after it.
    Kernel(usize),
    /// Nothing can run before a running kernel's time is up, then.
    Until(Instant),
    /// A host function must be run, with the mutex released, then
    /// [`State::host_done`] called.
    Host(usize, HostFn),
}

pub(crate) struct State {
    streams: Vec<SimStream>,
    events: Vec<SimEvent>,
    free_event_slots: Vec<usize>,
    /// Destroyed streams, whose slots a new stream may take once their
    /// queues have drained.
    free_stream_slots: Vec<usize>,
    host: VectorClock,
    /// One address space per simulated device, keyed by ordinal.
    pub(crate) spaces: std::collections::BTreeMap<u32, AddressSpace>,
    pub(crate) races: RaceDetector,
    pub(crate) faults: FaultPlan,
    rng: fastrand::Rng,
    next_free_id: u64,
    /// Addresses of live allocations: size and device.
    live: std::collections::HashMap<u64, (usize, u32)>,
    /// Reservations, physical handles and mappings.
    pub(crate) vm: VirtualMemory,
    /// Stream captures in progress, graphs and their memory.
    captures: capture::Captures,
    /// Pinned host memory and the host stream (see [`host`]).
    pub(crate) host_memory: host::HostMemories,
    /// Kernels that take time side by side; `None`: one operation at a
    /// time, the device thread sleeping each kernel's latency.
    kernels: Option<KernelSlots>,
}

fn invalid(call: DriverCall) -> GpuError {
    GpuError::driver(call, INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE")
}

impl State {
    /// A system of devices `(ordinal, capacity)` sharing one host.
    pub(crate) fn new(devices: &[(u32, usize)], seed: u64, granularity: usize) -> Self {
        State {
            streams: Vec::new(),
            events: Vec::new(),
            free_event_slots: Vec::new(),
            free_stream_slots: Vec::new(),
            host: VectorClock::default(),
            spaces: devices
                .iter()
                .map(|&(ordinal, capacity)| (ordinal, AddressSpace::new(ordinal, capacity)))
                .collect(),
            races: RaceDetector::default(),
            faults: FaultPlan::default(),
            rng: fastrand::Rng::with_seed(seed),
            next_free_id: 1,
            live: Default::default(),
            vm: VirtualMemory::new(granularity),
            captures: capture::Captures::default(),
            host_memory: host::HostMemories::default(),
            kernels: None,
        }
    }

    /// Runs kernels side by side with `slots` (see [`kernels`]).
    pub(crate) fn set_kernel_slots(&mut self, slots: KernelSlots) {
        self.kernels = Some(slots);
    }

    /// Counts a call and applies the fault plan.
    pub(crate) fn enter(&mut self, call: DriverCall) -> GpuResult<()> {
        let injected = self.faults.on_call(call);
        if self.faults.device_fault {
            return Err(GpuError::driver(
                call,
                ILLEGAL_ADDRESS,
                "CUDA_ERROR_ILLEGAL_ADDRESS",
            ));
        }
        if injected {
            return Err(GpuError::driver(call, INJECTED, "injected fault"));
        }
        Ok(())
    }

    pub(crate) fn create_stream(&mut self, device: u32) -> usize {
        // A destroyed stream's slot is reused once everything queued on it
        // ran (its frees executed, so no reuse rule of the address space
        // still names it). Its own clock component keeps counting, so every
        // epoch stays unique and what other streams saw of the old stream
        // never covers the new one's work; the rest of its clock is
        // forgotten, as a new stream has seen nothing.
        let reusable = self
            .free_stream_slots
            .iter()
            .position(|&slot| self.streams[slot].drained());
        if let Some(i) = reusable {
            let slot = self.free_stream_slots.swap_remove(i);
            let st = &mut self.streams[slot];
            st.clock = st.clock.own_part(slot);
            st.device = device;
            st.destroyed = false;
            st.capture = None;
            return slot;
        }
        self.streams.push(SimStream {
            device,
            ..SimStream::default()
        });
        self.streams.len() - 1
    }

    /// Destroys stream `s` of `device`; work queued on it still runs.
    pub(crate) fn destroy_stream(
        &mut self,
        s: usize,
        device: u32,
        call: DriverCall,
    ) -> GpuResult<()> {
        self.own_stream(s, device, call)?;
        self.streams[s].destroyed = true;
        self.free_stream_slots.push(s);
        Ok(())
    }

    /// Fails unless stream `s` exists, is not destroyed, and belongs to
    /// `device`.
    pub(crate) fn own_stream(&self, s: usize, device: u32, call: DriverCall) -> GpuResult<()> {
        match self.streams.get(s) {
            Some(st) if st.device == device && !st.destroyed => Ok(()),
            _ => Err(invalid(call)),
        }
    }

    /// Streams created and not destroyed.
    pub(crate) fn live_stream_count(&self) -> usize {
        self.streams.iter().filter(|st| !st.destroyed).count()
    }

    /// The address space of `device`.
    pub(crate) fn space(&self, device: u32) -> &AddressSpace {
        &self.spaces[&device]
    }

    fn stream(&self, s: usize, call: DriverCall) -> GpuResult<&SimStream> {
        self.streams
            .get(s)
            .filter(|st| !st.destroyed)
            .ok_or_else(|| invalid(call))
    }

    fn event(&mut self, e: usize, call: DriverCall) -> GpuResult<&mut SimEvent> {
        match self.events.get_mut(e) {
            Some(ev) if ev.alive => Ok(ev),
            _ => Err(invalid(call)),
        }
    }

    /// Queues `op` on stream `s`, ordered after everything the host has seen
    /// complete; returns the op's epoch and the stream clock after it.
    fn enqueue(&mut self, s: usize, op: impl FnOnce(&VectorClock) -> OpKind) -> Epoch {
        let stream = &mut self.streams[s];
        stream.clock.join(&self.host);
        let tick = stream.clock.tick(s);
        let op = op(&stream.clock);
        stream.queue.push_back(op);
        Epoch { stream: s, tick }
    }

    pub(crate) fn alloc(&mut self, bytes: usize, s: usize) -> GpuResult<u64> {
        self.stream(s, DriverCall::AllocAsync)?;
        if bytes == 0 {
            return Ok(0);
        }
        if let Some(id) = self.capturing(s) {
            return self.captured_alloc(id, s, bytes);
        }
        let device = self.streams[s].device;
        let mut clock = self.streams[s].clock.clone();
        clock.join(&self.host);
        let addr = self
            .spaces
            .get_mut(&device)
            .ok_or_else(|| invalid(DriverCall::AllocAsync))?
            .alloc(bytes, s, &clock)
            .map_err(|available| GpuError::OutOfMemory { available })?;
        let at = self.enqueue(s, |_| OpKind::Alloc);
        self.races.on_alloc(addr, bytes, at);
        self.live.insert(addr, (bytes, device));
        Ok(addr)
    }

    pub(crate) fn free(&mut self, addr: u64, s: usize) -> GpuResult<()> {
        self.stream(s, DriverCall::FreeAsync)?;
        if addr == 0 {
            return Ok(());
        }
        if let Some(id) = self.capturing(s) {
            return self.captured_free(id, s, addr);
        }
        if self.graph_reserved(addr) {
            // Allocated by a graph's replay: the address stays the graph's.
            if self.live.remove(&addr).is_none() {
                return Err(GpuError::driver(
                    DriverCall::FreeAsync,
                    INVALID_VALUE,
                    "CUDA_ERROR_INVALID_VALUE: not a live allocation",
                ));
            }
            self.free_unchecked(addr, s);
            return Ok(());
        }
        let Some((len, device)) = self.live.remove(&addr) else {
            return Err(GpuError::driver(
                DriverCall::FreeAsync,
                INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE: not a live allocation",
            ));
        };
        let free_id = self.next_free_id;
        self.next_free_id += 1;
        let at = self.enqueue(s, |_| OpKind::Free {
            device,
            addr,
            len,
            free_id,
        });
        let clock = self.streams[s].clock.clone();
        self.races.on_access(addr, SimOp::Free, at, &clock);
        if let Some(space) = self.spaces.get_mut(&device) {
            space.free_queued(addr, len, free_id, at);
        }
        Ok(())
    }

    pub(crate) fn kernel(&mut self, s: usize, accesses: &[(u64, Access)]) -> GpuResult<()> {
        self.stream(s, DriverCall::Launch)?;
        if let Some(id) = self.capturing(s) {
            return self.captured_kernel(id, s, accesses);
        }
        let at = self.enqueue(s, |_| OpKind::Kernel);
        let clock = self.streams[s].clock.clone();
        for &(ptr, access) in accesses {
            if self.vm.reserved(ptr) && !self.vm.accessible(ptr) {
                self.races.push_invalid(ptr, SimOp::Kernel(access), s);
                continue;
            }
            self.races.on_access(ptr, SimOp::Kernel(access), at, &clock);
        }
        Ok(())
    }

    /// Physical memory for a mapping, taken from the device at once.
    pub(crate) fn vm_create(&mut self, device: u32, bytes: usize) -> GpuResult<u64> {
        let g = self.vm.supported(DriverCall::MemCreate)?;
        if bytes == 0 || !bytes.is_multiple_of(g) {
            return Err(GpuError::driver(
                DriverCall::MemCreate,
                1,
                "CUDA_ERROR_INVALID_VALUE: not a positive multiple of the granularity",
            ));
        }
        let space = self
            .spaces
            .get_mut(&device)
            .ok_or_else(|| invalid(DriverCall::MemCreate))?;
        let phys = space
            .take_now(bytes)
            .map_err(|available| GpuError::OutOfMemory { available })?;
        Ok(self.vm.create(device, phys, bytes))
    }

    fn give_back(&mut self, freed: impl IntoIterator<Item = (u32, u64, usize)>) {
        for (device, phys, len) in freed {
            if let Some(space) = self.spaces.get_mut(&device) {
                space.give_now(phys, len);
            }
        }
    }

    pub(crate) fn vm_release(&mut self, handle: u64) -> GpuResult<()> {
        let freed = self.vm.release(handle)?;
        self.give_back(freed);
        Ok(())
    }

    /// Unmaps; what queued work still uses is reported as a race.
    pub(crate) fn vm_unmap(&mut self, addr: u64, bytes: usize) -> GpuResult<()> {
        let freed = self.vm.unmap(addr, bytes)?;
        self.races.on_unmap(addr, bytes, &self.host);
        self.give_back(freed);
        Ok(())
    }

    /// A caller-managed allocation at `addr` on stream `s` (see
    /// [`Gpu::note_suballocation`](crate::gpu::Gpu::note_suballocation)).
    pub(crate) fn note_suballoc(&mut self, addr: u64, bytes: usize, s: usize) {
        if self.streams.get(s).is_none() || bytes == 0 {
            return;
        }
        if let Some(id) = self.capturing(s) {
            let op = capture::GraphOp::SubAlloc { addr, len: bytes };
            return self.captured_note(id, s, op);
        }
        let at = self.enqueue(s, |_| OpKind::Alloc);
        let clock = self.streams[s].clock.clone();
        self.suballoc_checked(addr, bytes, at, &clock);
    }

    /// Registers a caller-managed allocation with the race detector,
    /// checked against the older allocations at its addresses and at every
    /// other address of the same memory (a handle mapped twice).
    pub(crate) fn suballoc_checked(
        &mut self,
        addr: u64,
        bytes: usize,
        at: Epoch,
        clock: &VectorClock,
    ) {
        let aliases = self.vm.aliases(addr, bytes);
        self.races.on_suballoc(addr, bytes, &aliases, at, clock);
    }

    /// The caller-managed allocation at `addr` on stream `s` is undone, never
    /// used (see [`Gpu::note_suballocation_undone`](crate::gpu::Gpu::note_suballocation_undone)):
    /// checked, and the histories it replaced come back. On a capturing
    /// stream, recorded as a free into the graph (no undo there).
    pub(crate) fn note_suballoc_undone(&mut self, addr: u64, s: usize) {
        if self.streams.get(s).is_none() || addr == 0 {
            return;
        }
        if self.capturing(s).is_some() {
            return self.note_subfree(addr, s);
        }
        self.races.on_suballoc_undone(addr, s);
    }

    /// The free of a caller-managed allocation, at the end of stream `s`.
    /// [`note_subfree`](Self::note_subfree) of memory the host says the GPU
    /// is done with: checked against what the host saw complete, then
    /// forgotten (a capture keeps the stream-ordered note).
    pub(crate) fn note_subfree_completed(&mut self, addr: u64, s: usize) {
        if self.streams.get(s).is_none() || addr == 0 {
            return;
        }
        if self.capturing(s).is_some() {
            return self.note_subfree(addr, s);
        }
        self.races.on_host_free(addr, &self.host);
    }

    pub(crate) fn note_subfree(&mut self, addr: u64, s: usize) {
        if self.streams.get(s).is_none() || addr == 0 {
            return;
        }
        if let Some(id) = self.capturing(s)
            && !self.frees_now_in_spoilt_capture(id, addr)
        {
            return self.captured_note(id, s, capture::GraphOp::SubFree { addr });
        }
        let at = self.enqueue(s, |_| OpKind::Alloc);
        let clock = self.streams[s].clock.clone();
        self.races.on_access(addr, SimOp::Free, at, &clock);
    }

    pub(crate) fn event_create(&mut self) -> usize {
        // A destroyed event's slot is reused only once its records have all
        // run, and keeps its generation counters: a wait queued on the old
        // event (CUDA allows destroying an event with waits queued) still
        // finds its generation complete, and no new record can complete it
        // early.
        let reusable = self.free_event_slots.iter().position(|&slot| {
            let ev = &self.events[slot];
            ev.completed >= ev.recorded
        });
        match reusable {
            Some(i) => {
                let slot = self.free_event_slots.swap_remove(i);
                let ev = &mut self.events[slot];
                ev.alive = true;
                ev.base = ev.recorded;
                ev.clock = VectorClock::default();
                ev.captured = None;
                slot
            }
            None => {
                self.events.push(SimEvent {
                    alive: true,
                    ..SimEvent::default()
                });
                self.events.len() - 1
            }
        }
    }

    pub(crate) fn event_destroy(&mut self, e: usize) -> GpuResult<()> {
        self.event(e, DriverCall::EventDestroy)?.alive = false;
        self.free_event_slots.push(e);
        Ok(())
    }

    pub(crate) fn record(&mut self, e: usize, s: usize) -> GpuResult<()> {
        self.stream(s, DriverCall::EventRecord)?;
        if let Some(id) = self.capturing(s) {
            return self.captured_record(id, s, e);
        }
        let ev = self.event(e, DriverCall::EventRecord)?;
        ev.captured = None;
        ev.recorded += 1;
        let generation = ev.recorded;
        let mut captured = VectorClock::default();
        self.enqueue(s, |clock| {
            captured = clock.clone();
            OpKind::Record {
                event: e,
                generation,
            }
        });
        self.events[e].clock = captured;
        Ok(())
    }

    pub(crate) fn wait(&mut self, s: usize, e: usize) -> GpuResult<()> {
        self.stream(s, DriverCall::StreamWaitEvent)?;
        self.event(e, DriverCall::StreamWaitEvent)?;
        if self.captured_wait(s, e)? {
            return Ok(());
        }
        let ev = self.event(e, DriverCall::StreamWaitEvent)?;
        let generation = ev.recorded;
        let clock = ev.clock.clone();
        if generation == ev.base {
            // Never recorded since it was created: waiting is a no-op.
            return Ok(());
        }
        self.streams[s].clock.join(&clock);
        self.enqueue(s, |_| OpKind::Wait {
            event: e,
            generation,
        });
        Ok(())
    }

    pub(crate) fn host_fn(&mut self, s: usize, f: HostFn) -> GpuResult<()> {
        self.stream(s, DriverCall::LaunchHostFunc)?;
        self.check_host_fn_allowed(s)?;
        self.enqueue(s, |clock| OpKind::Host(f, clock.clone()));
        Ok(())
    }

    /// `Some(done)` for a live event: whether its latest record ran.
    pub(crate) fn query(&mut self, e: usize, call: DriverCall) -> GpuResult<bool> {
        self.event(e, call)?;
        self.check_event_not_captured(e, call)?;
        let ev = self.event(e, call)?;
        let done = ev.completed >= ev.recorded;
        if done {
            let clock = ev.clock.clone();
            self.host.join(&clock);
        }
        Ok(done)
    }

    /// The generation a synchronize on `e` must see, and its clock.
    pub(crate) fn event_target(&mut self, e: usize) -> GpuResult<(u64, VectorClock)> {
        self.event(e, DriverCall::EventSynchronize)?;
        self.check_event_not_captured(e, DriverCall::EventSynchronize)?;
        self.check_synchronize_allowed(None, DriverCall::EventSynchronize)?;
        let ev = self.event(e, DriverCall::EventSynchronize)?;
        Ok((ev.recorded, ev.clock.clone()))
    }

    pub(crate) fn event_reached(&self, e: usize, generation: u64) -> bool {
        self.events
            .get(e)
            .is_none_or(|ev| ev.completed >= generation)
    }

    pub(crate) fn stream_target(&mut self, s: usize) -> GpuResult<VectorClock> {
        self.stream(s, DriverCall::StreamSynchronize)?;
        self.check_synchronize_allowed(Some(s), DriverCall::StreamSynchronize)?;
        Ok(self.stream(s, DriverCall::StreamSynchronize)?.clock.clone())
    }

    /// Whether stream `s` ran everything queued on it (`cuStreamQuery`);
    /// when it did, the host has seen all of it.
    pub(crate) fn stream_query(&mut self, s: usize, device: u32) -> GpuResult<bool> {
        self.own_stream(s, device, DriverCall::StreamQuery)?;
        self.check_query_allowed(s)?;
        let idle = self.stream_idle(s);
        if idle {
            let clock = self.streams[s].clock.clone();
            self.host.join(&clock);
        }
        Ok(idle)
    }

    pub(crate) fn stream_idle(&self, s: usize) -> bool {
        self.streams.get(s).is_none_or(SimStream::drained)
    }

    pub(crate) fn host_saw(&mut self, clock: &VectorClock) {
        self.host.join(clock);
    }

    pub(crate) fn all_idle(&self) -> bool {
        self.streams.iter().all(SimStream::drained)
    }

    fn runnable(&self, s: usize) -> bool {
        let st = &self.streams[s];
        if st.busy || st.running_until.is_some() {
            return false;
        }
        match st.queue.front() {
            None => false,
            Some(OpKind::Wait { event, generation }) => self.event_reached(*event, *generation),
            Some(OpKind::Kernel) => self.kernels.as_ref().is_none_or(KernelSlots::free),
            Some(_) => true,
        }
    }

    /// Kernels running now, side by side.
    pub(crate) fn kernels_running(&self) -> usize {
        self.kernels.as_ref().map_or(0, KernelSlots::running)
    }

    /// Ends the kernels whose time is up; whether any did.
    fn finish_kernels(&mut self, now: Instant) -> bool {
        let Some(kernels) = &mut self.kernels else {
            return false;
        };
        let mut any = false;
        for st in &mut self.streams {
            if st.running_until.is_some_and(|t| t <= now) {
                st.running_until = None;
                kernels.finish();
                any = true;
            }
        }
        any
    }

    /// Runs one operation of one runnable stream head.
    pub(crate) fn step(&mut self) -> Step {
        if self.kernels.is_some() && self.finish_kernels(Instant::now()) {
            return Step::Ran;
        }
        if self.all_idle() {
            return Step::Idle;
        }
        if self.faults.device_fault {
            return Step::Blocked;
        }
        let runnable: Vec<usize> = (0..self.streams.len())
            .filter(|&s| self.runnable(s))
            .collect();
        if runnable.is_empty() {
            let next_end = self.streams.iter().filter_map(|st| st.running_until).min();
            return next_end.map_or(Step::Blocked, Step::Until);
        }
        let s = runnable[self.rng.usize(..runnable.len())];
        let op = self.streams[s].queue.pop_front().expect("runnable");
        match op {
            OpKind::Alloc | OpKind::Wait { .. } => Step::Ran,
            OpKind::Kernel => match &mut self.kernels {
                Some(kernels) => {
                    self.streams[s].running_until = Some(kernels.start(Instant::now()));
                    Step::Ran
                }
                None => Step::Kernel(s),
            },
            OpKind::Free {
                device,
                addr,
                len,
                free_id,
            } => {
                if let Some(space) = self.spaces.get_mut(&device) {
                    space.free_executed(addr, len, free_id);
                }
                Step::Ran
            }
            OpKind::Record { event, generation } => {
                if let Some(ev) = self.events.get_mut(event) {
                    ev.completed = ev.completed.max(generation);
                }
                Step::Ran
            }
            OpKind::Host(f, clock) => {
                self.streams[s].busy = true;
                // Whatever the host function makes happen is ordered after
                // the work before it.
                self.host.join(&clock);
                Step::Host(s, f)
            }
        }
    }

    pub(crate) fn host_done(&mut self, s: usize) {
        self.streams[s].busy = false;
    }

    /// Stream `s` runs a kernel until [`host_done`](Self::host_done): it is
    /// not idle meanwhile.
    pub(crate) fn hold(&mut self, s: usize) {
        self.streams[s].busy = true;
    }

    pub(crate) fn stream_count(&self) -> usize {
        self.streams.len()
    }
}
