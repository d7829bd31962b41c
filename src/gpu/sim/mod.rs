//! `SimGpu`: a simulated CUDA device that runs on any CPU.
//!
//! It exists so that stream-ordered code can be tested where there is no GPU
//! (CI, laptops) and so that the bugs a GPU would only show now and then show
//! every time:
//!
//! - **Streams** execute their queued operations in order; **events**,
//!   **cross-stream waits** and **host functions** behave as CUDA documents
//!   them (a wait sees the latest record at the time it is queued; a host
//!   function blocks its stream while it runs and is never called after a
//!   device fault).
//! - The **address space** reuses freed memory as early as CUDA's pool does:
//!   at once on the freeing stream, on another stream once it is ordered after
//!   the free or the free has executed.
//! - A **race detector** reports, as [`RaceReport`]s a test can read, every
//!   access ordered after a free, and every pair of accesses on different
//!   streams, one a write, that no event or synchronize orders. It works on
//!   happens-before clocks, so what it finds does not depend on timing.
//! - **Stream capture** ([`SimGpu::begin_capture`]): work queued on a
//!   capturing stream is recorded into a graph, not run; the calls CUDA
//!   forbids during a capture fail with its codes and invalidate the
//!   capture; a replay ([`SimGpu::graph_launch`]) queues the recorded work on
//!   the launch stream, where the race detector checks it, after the
//!   executable's previous launch (CUDA runs one launch of an executable at
//!   a time), and memory the graph allocated stays the graph's until it is
//!   destroyed.
//! - **Fault injection**: [`SimGpu::fail_nth`] makes the N-th call of a kind
//!   fail; [`SimGpu::inject_device_fault`] poisons the device as an illegal
//!   address would. [`SimGpu::gate_nth`] holds the N-th virtual-memory
//!   call of a kind before it runs, so that a test can act while a thread
//!   is inside it.
//! - **Progress**: in [`Progress::Threaded`] mode (the default) a device
//!   thread executes queued work as a GPU would, and runs host functions; in
//!   [`Progress::Manual`] mode nothing runs until the host synchronizes or
//!   calls [`SimGpu::step`], and the order is fixed by the seed.
//!
//! Kernels are declared by the memory they touch ([`SimGpu::launch_kernel`]);
//! no data is stored.
//!
//! # Examples
//! ```
//! use streamalloc::gpu::sim::{MemAccess, SimGpu};
//! use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
//!
//! let gpu = SimGpu::builder().manual().build();
//! let device = Device::simulated(&gpu, 2);
//! let resource = SimResource::new(&device);
//! let (a, b) = (device.stream(0)?, device.stream(1)?);
//!
//! let block = resource.allocate(1024, a, AllocTag::UNTAGGED)?;
//! // Read on stream b without ordering it after the allocation on a: a race.
//! gpu.launch_kernel(device.raw(b)?, &[MemAccess::read(&block)])?;
//! assert_eq!(gpu.races().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

mod address_space;
mod clock;
mod device;
mod fault;
mod gate;
mod race;
mod virtual_memory;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

pub use gate::CallGate;
pub use race::{RaceKind, RaceReport, SimOp};

use self::device::{State, Step};
use crate::device::stream_pool::StreamPool;
use crate::error::DriverCall;
use crate::gpu::{
    CaptureMode, CaptureStatus, Gpu, GpuError, GpuResult, HeldMemory, HostFn, HostMemory, RawEvent,
    RawGraph, RawGraphExec, RawPhysical, RawStream,
};
use crate::types::{Access, DeviceBlock};

/// How queued work makes progress on a [`SimGpu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// A device thread executes work as soon as it can and runs host
    /// functions, as a GPU and its driver thread would.
    Threaded,
    /// Work runs only inside [`SimGpu::step`], [`SimGpu::run_until_idle`] and
    /// the synchronize calls, on the calling thread, in an order fixed by the
    /// seed.
    Manual,
}

/// One memory range a simulated kernel touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemAccess {
    /// Address touched (any address inside an allocation names it).
    pub ptr: u64,
    /// Read or write.
    pub access: Access,
}

impl MemAccess {
    /// The kernel reads `block`.
    pub fn read(block: &DeviceBlock) -> Self {
        MemAccess {
            ptr: block.ptr(),
            access: Access::Read,
        }
    }

    /// The kernel writes `block`.
    pub fn write(block: &DeviceBlock) -> Self {
        MemAccess {
            ptr: block.ptr(),
            access: Access::Write,
        }
    }
}

/// Builds a [`SimGpu`].
#[derive(Debug, Clone)]
pub struct SimGpuBuilder {
    ordinal: u32,
    capacity: usize,
    seed: u64,
    progress: Progress,
    op_latency: Duration,
    vm_granularity: usize,
}

impl SimGpuBuilder {
    /// Granularity of virtual-memory mappings (default 2 MiB, as on the
    /// H200); 0 builds a device without virtual memory management, whose
    /// [`Gpu::vm_granularity`] reports `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn vm_granularity(mut self, bytes: usize) -> Self {
        self.vm_granularity = bytes;
        self
    }

    /// Device ordinal (default 0).
    pub fn ordinal(mut self, ordinal: u32) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// Device memory in bytes (default 16 GiB; nothing is really allocated).
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    /// Seed of the scheduling order (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// [`Progress::Manual`]: deterministic, nothing runs by itself.
    pub fn manual(mut self) -> Self {
        self.progress = Progress::Manual;
        self
    }

    /// How queued work makes progress (default [`Progress::Threaded`]).
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// How long each simulated kernel takes in threaded mode (default 0).
    pub fn op_latency(mut self, latency: Duration) -> Self {
        self.op_latency = latency;
        self
    }

    /// Creates the device (and its device thread in threaded mode).
    pub fn build(self) -> Arc<SimGpu> {
        self.build_host(1).pop().expect("one device")
    }

    /// Creates `devices` devices of one simulated host, with ordinals
    /// `ordinal..ordinal + devices`, each with `capacity` bytes. They share
    /// one happens-before order and race detector, so events recorded on one
    /// device can be waited on by another's streams and copies may cross
    /// devices (as with peer access enabled).
    pub fn build_host(self, devices: u32) -> Vec<Arc<SimGpu>> {
        let ordinals: Vec<u32> = (self.ordinal..self.ordinal + devices.max(1)).collect();
        let spec: Vec<(u32, usize)> = ordinals.iter().map(|&o| (o, self.capacity)).collect();
        let shared = Arc::new(Shared {
            host: fresh_host(),
            state: Mutex::new(State::new(&spec, self.seed, self.vm_granularity)),
            work: Condvar::new(),
            progress_made: Condvar::new(),
            shutdown: std::sync::atomic::AtomicBool::new(false),
            handles: std::sync::atomic::AtomicUsize::new(ordinals.len()),
            thread: Mutex::new(None),
            op_latency: self.op_latency,
            host_fn_panics: std::sync::atomic::AtomicU64::new(0),
            blocking_in_polls: std::sync::atomic::AtomicU64::new(0),
            gates: gate::Gates::default(),
        });
        let thread = (self.progress == Progress::Threaded).then(|| {
            let thread_shared = shared.clone();
            thread::Builder::new()
                .name(format!("simgpu-host-{}", self.ordinal))
                .spawn(move || device_thread(&thread_shared))
                .expect("spawning the simulated device thread")
        });
        *shared.thread.lock().unwrap_or_else(|p| p.into_inner()) = thread;
        ordinals
            .into_iter()
            .map(|ordinal| {
                Arc::new(SimGpu {
                    shared: shared.clone(),
                    ordinal,
                    progress: self.progress,
                })
            })
            .collect()
    }
}

struct Shared {
    /// This host's identity, carried by its stream handles.
    host: u32,
    state: Mutex<State>,
    /// Signalled when work is queued (the device thread waits on it).
    work: Condvar,
    /// Signalled when work ran (synchronizing threads wait on it).
    progress_made: Condvar,
    shutdown: std::sync::atomic::AtomicBool,
    /// Live `SimGpu` handles; the device thread stops with the last.
    handles: std::sync::atomic::AtomicUsize,
    /// The device thread in threaded mode; the last handle joins it, so that
    /// nothing the device holds (queued host functions) outlives it.
    thread: Mutex<Option<thread::JoinHandle<()>>>,
    op_latency: Duration,
    /// Host functions that panicked (caught).
    host_fn_panics: std::sync::atomic::AtomicU64,
    /// Synchronizes called inside a poll of the crate's futures.
    blocking_in_polls: std::sync::atomic::AtomicU64,
    /// Gates on virtual-memory calls ([`SimGpu::gate_nth`]).
    gates: gate::Gates,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic inside a host function must not wedge the device.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a host function (user code) without the state lock. A panic in
    /// it is caught and counted: it must not kill the device thread (or, in
    /// manual mode, unwind out of a synchronize and leave the stream busy),
    /// as it must not unwind into the driver on a real GPU.
    fn run_host_fn(&self, f: HostFn) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            self.host_fn_panics
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

fn device_thread(shared: &Shared) {
    use std::sync::atomic::Ordering;
    let mut state = shared.lock();
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        match state.step() {
            Step::Idle | Step::Blocked => {
                state = shared.work.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            Step::Ran { kernel } => {
                shared.progress_made.notify_all();
                if kernel && !shared.op_latency.is_zero() {
                    drop(state);
                    thread::sleep(shared.op_latency);
                    state = shared.lock();
                }
            }
            Step::Host(s, f) => {
                drop(state);
                shared.run_host_fn(f);
                state = shared.lock();
                state.host_done(s);
                shared.progress_made.notify_all();
            }
        }
    }
}

/// A simulated CUDA device. See the [module documentation](self).
pub struct SimGpu {
    shared: Arc<Shared>,
    ordinal: u32,
    progress: Progress,
}

impl std::fmt::Debug for SimGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGpu")
            .field("ordinal", &self.ordinal)
            .field("progress", &self.progress)
            .finish()
    }
}

impl Drop for SimGpu {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _state = self.shared.lock();
            self.shared.work.notify_all();
        }
        let handle = self
            .shared
            .thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(handle) = handle {
            // The last handle may be dropped by a host function, on the
            // device thread itself: it exits on its own after returning.
            if handle.thread().id() != thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

/// A host identity for a new simulated host (31 bits: it wraps after two
/// billion hosts, far more than a process builds).
fn fresh_host() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << 31) - 1)
}

fn sim_event(event: RawEvent) -> usize {
    event.sim_index().unwrap_or(usize::MAX)
}

impl SimGpu {
    /// A threaded simulated device 0 with 16 GiB.
    pub fn new() -> Arc<SimGpu> {
        Self::builder().build()
    }

    /// A builder with the defaults: device 0, 16 GiB, seed 0, threaded.
    pub fn builder() -> SimGpuBuilder {
        SimGpuBuilder {
            ordinal: 0,
            capacity: 16 << 30,
            seed: 0,
            progress: Progress::Threaded,
            op_latency: Duration::ZERO,
            vm_granularity: 2 << 20,
        }
    }

    /// How this device makes progress.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// The identity of this simulated context (its host), which its
    /// stream pools carry: see [`Gpu::context_id`].
    pub fn context_id(&self) -> u64 {
        u64::from(self.shared.host)
    }

    /// Creates one stream on this device.
    pub fn create_stream(&self) -> RawStream {
        RawStream::sim(
            self.shared.host,
            self.shared.lock().create_stream(self.ordinal),
        )
    }

    /// The slot of `stream` in this device's host, or `usize::MAX`, which
    /// no stream has (every call refuses it as an invalid handle), for a
    /// stream of another simulated host or a handle that is not simulated
    /// (a CUDA one): two `SimGpu`s of the same ordinal do not take each
    /// other's streams of the same index.
    fn stream_slot(&self, stream: RawStream) -> usize {
        match stream.sim_parts() {
            Some((host, index)) if host == self.shared.host => index,
            _ => usize::MAX,
        }
    }

    /// Creates `count` streams and a pool that resolves them.
    pub fn stream_pool(&self, count: usize) -> Arc<StreamPool> {
        let ordinal = self.ordinal;
        let raw = (0..count).map(|_| self.create_stream()).collect();
        Arc::new(StreamPool::from_checked(ordinal, raw, Vec::new()).in_context(self.context_id()))
    }

    /// Queues a kernel on `stream` that touches `accesses`; races are
    /// checked now.
    ///
    /// # Errors
    /// An unknown stream, an injected fault or a device fault.
    pub fn launch_kernel(&self, stream: RawStream, accesses: &[MemAccess]) -> GpuResult<()> {
        let list: Vec<(u64, Access)> = accesses.iter().map(|a| (a.ptr, a.access)).collect();
        self.queue(DriverCall::Launch, |st| {
            st.own_stream(self.stream_slot(stream), self.ordinal, DriverCall::Launch)?;
            st.kernel(self.stream_slot(stream), &list)
        })
    }

    /// Runs one queued operation on the calling thread; false when nothing
    /// could run. Meant for [`Progress::Manual`].
    pub fn step(&self) -> bool {
        self.step_locked(self.shared.lock()).1
    }

    /// One engine step on the calling thread; host functions run unlocked.
    fn step_locked<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, bool) {
        let ran = match state.step() {
            Step::Idle | Step::Blocked => false,
            Step::Ran { .. } => true,
            Step::Host(s, f) => {
                drop(state);
                self.shared.run_host_fn(f);
                state = self.shared.lock();
                state.host_done(s);
                true
            }
        };
        if ran {
            self.shared.progress_made.notify_all();
        }
        (state, ran)
    }

    /// Runs (or, in threaded mode, waits for) everything queued.
    pub fn run_until_idle(&self) {
        let mut state = self.shared.lock();
        loop {
            if state.all_idle() || state.faults.device_fault {
                return;
            }
            if self.progress == Progress::Manual {
                let (next, ran) = self.step_locked(state);
                if !ran {
                    return;
                }
                state = next;
            } else {
                state = self.wait_progress(state);
            }
        }
    }

    /// Whether no work is queued or running.
    pub fn is_idle(&self) -> bool {
        self.shared.lock().all_idle()
    }

    /// Every race found so far.
    pub fn races(&self) -> Vec<RaceReport> {
        self.shared.lock().races.reports().to_vec()
    }

    /// Every race found so far, clearing the list.
    pub fn take_races(&self) -> Vec<RaceReport> {
        self.shared.lock().races.take_reports()
    }

    /// Makes the `nth` call of kind `call` from now on fail (1 = the next).
    pub fn fail_nth(&self, call: DriverCall, nth: u64) {
        self.shared.lock().faults.fail_nth(call, nth);
    }

    /// Makes the `nth` call of kind `call` from now on (1 = the next) wait,
    /// before it does anything and without the device's lock, until the
    /// returned gate is opened or dropped: a test can then act while
    /// another thread is inside that call. Gates apply to the
    /// virtual-memory calls (`MemCreate`, `MemMap`, `MemSetAccess`,
    /// `MemUnmap`, `MemRelease`); on other kinds the gate is never
    /// reached.
    pub fn gate_nth(&self, call: DriverCall, nth: u64) -> CallGate {
        self.shared.gates.add(call, nth)
    }

    /// Faults the device as an illegal address would: every later call
    /// fails, queued work never completes, host functions are not called.
    pub fn inject_device_fault(&self) {
        self.shared.lock().faults.device_fault = true;
        self.shared.progress_made.notify_all();
    }

    /// How many calls of kind `call` were made.
    pub fn call_count(&self, call: DriverCall) -> u64 {
        self.shared.lock().faults.count(call)
    }

    /// Number of stream slots the device holds: streams created, less the
    /// destroyed ones whose slot a new stream took over.
    pub fn stream_count(&self) -> usize {
        self.shared.lock().stream_count()
    }

    /// Host functions that panicked so far. The panic is caught where the
    /// function ran (the device thread, or the thread that made progress in
    /// manual mode); the stream goes on.
    pub fn host_fn_panics(&self) -> u64 {
        self.shared
            .host_fn_panics
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Number of streams created and not destroyed.
    pub fn live_stream_count(&self) -> usize {
        self.shared.lock().live_stream_count()
    }

    /// Memory the device has given out now: pool allocations, frees not
    /// executed yet, and physical memory for mappings.
    pub fn held_bytes(&self) -> usize {
        self.shared.lock().space(self.ordinal).held_bytes()
    }

    /// The high-water mark of [`held_bytes`](Self::held_bytes) since the
    /// device was built or [`reset_peak_held`](Self::reset_peak_held): what
    /// the process took from the device at its peak.
    pub fn peak_held_bytes(&self) -> usize {
        self.shared.lock().space(self.ordinal).peak_held()
    }

    /// Restarts [`peak_held_bytes`](Self::peak_held_bytes) from what is held
    /// now.
    pub fn reset_peak_held(&self) {
        if let Some(space) = self.shared.lock().spaces.get_mut(&self.ordinal) {
            space.reset_peak_held();
        }
    }

    /// Physical handles made by [`Gpu::mem_create`] not yet given back
    /// (released and unmapped).
    pub fn physical_handles(&self) -> usize {
        self.shared.lock().vm.handle_count()
    }

    /// Bytes of physical memory this device holds for handles made by
    /// [`Gpu::mem_create`] and not yet given back: the part of
    /// [`held_bytes`](Self::held_bytes) that backs mappings rather than
    /// pool allocations.
    pub fn physical_bytes(&self) -> usize {
        self.shared.lock().vm.handle_bytes(self.ordinal)
    }

    /// Simulated memory of this device not allocated and not waiting for a
    /// free.
    pub fn free_bytes(&self) -> usize {
        self.shared.lock().space(self.ordinal).free_bytes()
    }

    /// Synchronizes (of streams or events) called inside a poll of the
    /// crate's futures, where nothing may block: a test asserts it stays 0.
    /// A poll that synchronizes parks the executor thread (a current-thread
    /// runtime stops altogether) for as long as the GPU work takes.
    pub fn blocking_calls_in_polls(&self) -> u64 {
        self.shared
            .blocking_in_polls
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn queue<T>(
        &self,
        call: DriverCall,
        f: impl FnOnce(&mut State) -> GpuResult<T>,
    ) -> GpuResult<T> {
        let mut state = self.shared.lock();
        state.enter(call)?;
        let out = f(&mut state)?;
        if self.progress == Progress::Threaded {
            self.shared.work.notify_one();
        }
        Ok(out)
    }

    /// Wakes the device thread for work queued outside [`queue`](Self::queue).
    fn notify_work(&self) {
        if self.progress == Progress::Threaded {
            self.shared.work.notify_one();
        }
    }

    fn wait_progress<'a>(&'a self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.shared
            .progress_made
            .wait_timeout(state, Duration::from_millis(50))
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// Blocks until `done` holds, making progress in manual mode.
    fn block_until(&self, call: DriverCall, mut done: impl FnMut(&State) -> bool) -> GpuResult<()> {
        if crate::util::poll_scope::in_poll() {
            self.shared
                .blocking_in_polls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(?call, "a synchronize inside a poll of the crate's futures");
        }
        let mut state = self.shared.lock();
        loop {
            if state.faults.device_fault {
                return Err(GpuError::driver(
                    call,
                    fault::ILLEGAL_ADDRESS,
                    "CUDA_ERROR_ILLEGAL_ADDRESS",
                ));
            }
            if done(&state) {
                return Ok(());
            }
            if self.progress == Progress::Manual {
                let (next, ran) = self.step_locked(state);
                state = next;
                if !ran {
                    return Err(GpuError::driver(
                        call,
                        fault::INJECTED,
                        "simulated deadlock: nothing can run",
                    ));
                }
            } else {
                state = self.wait_progress(state);
            }
        }
    }
}

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
