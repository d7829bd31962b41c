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
//! - **Time**: each kernel may take [`SimGpuBuilder::op_latency`]; by
//!   default one kernel runs at a time, and with
//!   [`SimGpuBuilder::concurrent_kernels`] kernels of several streams run
//!   side by side, as a GPU's SMs run small kernels, so that a wait on
//!   another stream's fence costs the overlap it does on a GPU; with
//!   [`SimGpuBuilder::host_fn_latency`] host functions come that long
//!   after their streams reach them, on a thread of their own, as the
//!   driver's callback thread runs them.
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
mod callbacks;
mod calls;
mod clock;
mod device;
mod fault;
mod gate;
mod race;
mod seam;
mod virtual_memory;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

pub use gate::CallGate;
pub use race::{RaceKind, RaceReport, SimOp};

use self::device::{KernelSlots, State, Step};
use crate::device::stream_pool::StreamPool;
use crate::error::DriverCall;
#[cfg(doc)]
use crate::gpu::Gpu;
use crate::gpu::{GpuError, GpuResult, HostFn, RawEvent, RawStream};
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
    concurrent_kernels: usize,
    host_fn_latency: Duration,
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

    /// How many streams' kernels run at once in threaded mode with an
    /// [`op_latency`](Self::op_latency) (default 1). At 1 the device thread
    /// runs one operation at a time and sleeps each kernel's latency, so
    /// every stream waits while a kernel runs. Above 1 a kernel occupies
    /// only its own stream for the latency while the other streams go on,
    /// up to this many kernels at once, as a GPU runs small kernels of
    /// several streams side by side: work that waits on another stream's
    /// fence then visibly loses the overlap it would have had.
    pub fn concurrent_kernels(mut self, kernels: usize) -> Self {
        self.concurrent_kernels = kernels;
        self
    }

    /// How long after its stream reaches it a host function runs, in
    /// threaded mode (default 0: at once, on the device thread). Above 0
    /// host functions run on a thread of their own, one after another in
    /// the order their streams reached them, as the driver's callback
    /// thread runs them; the stream waits for its host function, the
    /// others go on. What a notification brings back (a free's bytes, a
    /// parked future's wake-up) comes that much later.
    pub fn host_fn_latency(mut self, latency: Duration) -> Self {
        self.host_fn_latency = latency;
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
        let mut state = State::new(&spec, self.seed, self.vm_granularity);
        if self.progress == Progress::Threaded
            && self.concurrent_kernels > 1
            && !self.op_latency.is_zero()
        {
            state.set_kernel_slots(KernelSlots::new(self.op_latency, self.concurrent_kernels));
        }
        let shared = Arc::new(Shared {
            host: fresh_host(),
            state: Mutex::new(state),
            work: Condvar::new(),
            progress_made: Condvar::new(),
            shutdown: std::sync::atomic::AtomicBool::new(false),
            handles: std::sync::atomic::AtomicUsize::new(ordinals.len()),
            thread: Mutex::new(None),
            callback_thread: Mutex::new(None),
            callbacks: callbacks::Callbacks::default(),
            host_fn_latency: self.host_fn_latency,
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
        let callback_thread =
            (self.progress == Progress::Threaded && !self.host_fn_latency.is_zero()).then(|| {
                let thread_shared = shared.clone();
                thread::Builder::new()
                    .name(format!("simgpu-callbacks-{}", self.ordinal))
                    .spawn(move || callback_thread(&thread_shared))
                    .expect("spawning the simulated callback thread")
            });
        *shared
            .callback_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = callback_thread;
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
    /// The thread that runs host functions when they take time to come
    /// (`host_fn_latency` above 0), joined as the device thread is.
    callback_thread: Mutex<Option<thread::JoinHandle<()>>>,
    callbacks: callbacks::Callbacks,
    host_fn_latency: Duration,
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
            Step::Until(then) => {
                let left = then.saturating_duration_since(std::time::Instant::now());
                state = shared
                    .work
                    .wait_timeout(state, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Step::Ran => shared.progress_made.notify_all(),
            Step::Kernel(s) => {
                shared.progress_made.notify_all();
                if !shared.op_latency.is_zero() {
                    state.hold(s);
                    drop(state);
                    thread::sleep(shared.op_latency);
                    state = shared.lock();
                    state.host_done(s);
                    shared.progress_made.notify_all();
                }
            }
            Step::Host(s, f) if !shared.host_fn_latency.is_zero() => {
                // The stream stays busy until the callback thread ran it.
                shared.callbacks.hand_over(s, f, shared.host_fn_latency);
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

/// The driver's callback thread (see [`callbacks`]): runs each host
/// function handed over once due, then lets its stream go on.
fn callback_thread(shared: &Shared) {
    use std::sync::atomic::Ordering;
    while let Some((s, f)) = shared
        .callbacks
        .next(|| shared.shutdown.load(Ordering::Acquire))
    {
        shared.run_host_fn(f);
        let mut state = shared.lock();
        state.host_done(s);
        shared.progress_made.notify_all();
        shared.work.notify_all();
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
        self.shared.callbacks.wake();
        for slot in [&self.shared.thread, &self.shared.callback_thread] {
            let handle = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(handle) = handle {
                // The last handle may be dropped by a host function, on the
                // device or callback thread itself: it exits on its own
                // after returning.
                if handle.thread().id() != thread::current().id() {
                    let _ = handle.join();
                }
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
            concurrent_kernels: 1,
            host_fn_latency: Duration::ZERO,
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
            // `Until` comes only with kernel slots, which manual mode has not.
            Step::Idle | Step::Blocked | Step::Until(_) => false,
            Step::Ran | Step::Kernel(_) => true,
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
    /// `MemUnmap`, `MemRelease`) and to `EventRecord`; on other kinds the
    /// gate is never reached.
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

    /// Kernels running now, side by side (always 0 unless
    /// [`concurrent_kernels`](SimGpuBuilder::concurrent_kernels) is above 1).
    pub fn kernels_running(&self) -> usize {
        self.shared.lock().kernels_running()
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
