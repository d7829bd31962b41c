//! The whole API, driven at random: stacks of every layer over a simulated
//! device, requests from several tasks, cancellation at every await point,
//! drops on other threads and runtimes, driver faults and panicking user
//! closures, checked after every step against what the device holds.
//!
//! # What a case is
//! A [`Stack`] (any sequence of the builder's layers, the futures layer on
//! top, a [`Reaper`] or not, maybe a second device sharing its outermost
//! budget: [`twin`]) over a manual [`SimGpu`] with [`STREAMS`]
//! streams, and a list of [`Op`]s run one after the other by a harness
//! that plays many callers at once: it holds buffers, completion futures,
//! free handles and spawned request tasks in slots, and each op picks
//! among them (indices are taken modulo what exists, so every list is
//! valid and shrinks well). The device runs only when an op lets it
//! (`Step`, `Tick`, and any await, which runs the device between polls):
//! work queued on a stream stays queued while other streams allocate,
//! free and launch, as on a busy GPU.
//!
//! Besides buffers, launches and frees, the ops capture steps into CUDA
//! graphs and replay them ([`graphs`]), allocate on the second device
//! ([`twin`]), and hand entry points streams of other pools or of none
//! ([`foreign`]).
//!
//! # What is checked
//! After every op ([`World::check`]):
//! - the simulator's race detector reports nothing;
//! - every budget counts what the device holds below it (the bottom
//!   resource's outstanding bytes plus the physical memory behind the
//!   cache's mappings);
//! - no buffer drop reported an error unless a driver fault was injected;
//! - a library call failed only where a fault was injected or the answer
//!   is a refusal the caller must expect (memory full, tracking
//!   unsupported), and a budget's refusal reports numbers that refuse.
//!
//! Every await runs under a watchdog: a completion, a free, a reap or a
//! reaper's shutdown must settle within [`GUARD`] while the device runs;
//! an allocation may wait only while the harness holds memory (after which
//! the wait is dropped: a cancellation), and must be served when nothing is
//! held and the request fits every budget and the device. After the last
//! op the harness drains (aborts its tasks, drops everything, reaps,
//! releases idle memory, drops the stack) and then nothing may be left:
//! no byte outstanding or mapped, every budget at 0, the device's whole
//! capacity free, no race.
//!
//! # Running more
//! `PROPTEST_CASES=N` or `scripts/api-fuzz.sh N` runs as many cases as
//! you like. Every bug it found is fixed but the open classes: the
//! harness steers around an open class unless `API_FUZZ_OPEN` names it
//! (`API_FUZZ_OPEN=CLASS scripts/api-fuzz.sh 1000`), and its written-out
//! case is an ignored test that fails until it is fixed. None is open:
//! `use-after-replay` under a cache and
//! `capture-unjoined` (a use recorded twice by a launch that panicked,
//! one case in 30,000) were the last, both fixed and written out in
//! [`regressions`]; at 30,000 cases on 2026-12-07 three more (a
//! deferred use skipped on a capturing stream, two budget counts left
//! high) and `capture-unjoined-free` (a block used on a capturing
//! stream, freed during the capture under a size-class cache over the
//! arena), all fixed and written out.
//!
//! The minimal case of each bug this harness found is written out in
//! [`regressions`] (`tests/model/api_model/regressions.rs`); proptest also persists its seeds in
//! `tests/model/api_model.proptest-regressions`.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use streamalloc::CacheConfig;
use streamalloc::drop_error_count;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{AsyncResource, DeallocHandle, EventFuture, MemoryReservation, Reaper};
use streamalloc::{Budget, GuardConfig};
#[path = "api_model/foreign.rs"]
mod foreign;
#[path = "api_model/graphs.rs"]
mod graphs;
#[path = "api_model/reserve.rs"]
mod reserve;
#[path = "api_model/twin.rs"]
mod twin;

use foreign::{Entry, Stranger};
use graphs::{GraphSlot, Keep};
use twin::{Twin, TwinStack};

use streamalloc::{
    AllocTag, BlockId, Buffer, Device, DeviceBlock, DeviceMemoryResource, DriverCall,
    ResourceBuilder, ResourceError, ResourceResult, SimResource, StreamId,
};

const STREAMS: usize = 3;
const TAG: AllocTag = AllocTag("api-model");
/// The simulated device's memory.
const CAPACITY: usize = 16 << 20;
/// How long an await that must settle may take while the device runs: a
/// hang guard, never a timing assertion.
const GUARD: Duration = Duration::from_secs(5);
/// How long the harness waits for an allocation that may legitimately
/// wait (memory is held) before it cancels the wait.
const PATIENCE: Duration = Duration::from_millis(20);
const SIZES: [usize; 8] = [0, 1, 100, 4096, 5000, 65536, 200_000, 1 << 20];
const LIMITS: [usize; 3] = [1 << 20, 4 << 20, 12 << 20];
/// The device's mapping granularity (the cache's arena page).
const GRANULARITIES: [usize; 3] = [4 << 10, 64 << 10, 2 << 20];
/// Sizes no device has: each must be refused with an error, and change
/// nothing.
const HUGE: [usize; 4] = [usize::MAX, usize::MAX - 4095, usize::MAX / 2 + 1, 1 << 60];
/// The driver calls a fault may hit.
const FAULTS: [DriverCall; 8] = [
    DriverCall::AllocAsync,
    DriverCall::FreeAsync,
    DriverCall::EventRecord,
    DriverCall::StreamWaitEvent,
    DriverCall::LaunchHostFunc,
    DriverCall::EventQuery,
    DriverCall::MemCreate,
    DriverCall::MemMap,
];

#[path = "api_model/case.rs"]
mod case;

use case::{AllocHow, Kind, Op, Place, Stack, Then};

// ---------------------------------------------------------------------
// The world the ops act on
// ---------------------------------------------------------------------

type Top = Arc<dyn DeviceMemoryResource>;

/// A request task.
struct Task {
    handle: tokio::task::JoinHandle<ResourceResult<()>>,
}

struct World {
    gpu: Arc<SimGpu>,
    streams: Vec<StreamId>,
    bottom: Arc<SimResource>,
    res: Option<AsyncResource<Top>>,
    budgets: Vec<Budget>,
    /// The index in `budgets` of the one the second device shares.
    shared: Option<usize>,
    twin: Option<Twin>,
    /// Pools this resource's streams are not of (see [`foreign`]).
    strangers: foreign::Strangers,
    /// The executor of the requests and of every await of the harness.
    rt: tokio::runtime::Runtime,
    /// Another runtime, to drop things on.
    other: tokio::runtime::Runtime,
    reaper: Option<Reaper>,
    buffers: Vec<Buffer<u8>>,
    reservations: Vec<MemoryReservation>,
    points: Vec<EventFuture>,
    frees: Vec<DeallocHandle>,
    tasks: Vec<Task>,
    graphs: Vec<GraphSlot>,
    /// The blocks captures kept past their end (their buffers may be
    /// refused as unbacked).
    graph_blocks: Vec<BlockId>,
    /// A driver fault was injected: calls may fail from now on.
    faulted: bool,
    /// The stack holds a debug guard.
    guard: bool,
    /// The stack holds a cache.
    cache: bool,
    /// The stack, to see that it is gone after the drain.
    weak_top: std::sync::Weak<dyn DeviceMemoryResource>,
    /// 1 when the stack has no layer: then it is `bottom`, which the
    /// harness holds.
    bare: usize,

    drop_errors: u64,
    log: Vec<String>,
}

/// A user's layer, written as the crate's docs show: its own `allocate`,
/// everything else forwarded by the checked macro (a method left out is a
/// compile error, never a silent default).
struct UserLayer(Top);

// SAFETY: blocks and streams are the inner resource's, unchanged.
unsafe impl DeviceMemoryResource for UserLayer {
    fn allocate(&self, bytes: usize, s: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.0.allocate(bytes, s, tag)
    }
    streamalloc::forward_to_inner!(0; all_but_allocate);
}

/// A failure of the case, with the step that found it.
type Verdict = Result<(), String>;

fn fail<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

impl World {
    fn new(stack: &Stack) -> World {
        let gpu = SimGpu::builder()
            .manual()
            .capacity(CAPACITY)
            .vm_granularity(stack.granularity)
            .build();
        let device = Device::simulated(&gpu, STREAMS);
        let streams: Vec<StreamId> = device.streams().ids().collect();
        let bottom = Arc::new(SimResource::new(&device));
        let mut budgets = Vec::new();
        // The outermost budget, shared with the second device if any.
        let shared_at = stack.twin.and(
            stack
                .kinds
                .iter()
                .position(|k| matches!(k, Kind::Budget(_))),
        );
        let mut shared = None;
        let mut top: Top = bottom.clone();
        for (at, kind) in stack.kinds.iter().enumerate().rev() {
            let b = ResourceBuilder::new();
            top = match *kind {
                Kind::Budget(i) => {
                    let budget = Budget::new(LIMITS[i]);
                    if shared_at == Some(at) {
                        shared = Some(budgets.len());
                    }
                    budgets.push(budget.clone());
                    Arc::new(b.budget(&budget).build(top))
                }
                Kind::Cache { arena } => Arc::new(
                    b.cache(CacheConfig::default().virtual_memory(arena))
                        .build(top),
                ),
                Kind::Guard => Arc::new(b.debug_guard(GuardConfig::new().max_blocks(2)).build(top)),
                Kind::Retry => Arc::new(b.retry_on_oom().build(top)),
                Kind::Stats => Arc::new(b.stats().build(top)),
                Kind::Tracing => Arc::new(b.tracing().build(top)),
                Kind::User => Arc::new(UserLayer(top)),
            };
        }
        // SAFETY: the bottom of the stack was made on `device` just above,
        // every layer built over it allocates only through it, and each
        // resolves its streams through the bottom, that is `device`'s pool.
        let weak_top = Arc::downgrade(&top);
        let res = unsafe { AsyncResource::with_device(top, &device) }.expect("futures layer");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let reaper = stack.reaper.then(|| Reaper::spawn_on(&res, rt.handle()));
        let twin = match (stack.twin, shared) {
            (Some(t), Some(i)) => Some(Twin::new(t, &budgets[i], stack.granularity)),
            _ => None,
        };
        World {
            strangers: foreign::Strangers::new(&gpu),
            gpu,
            streams,
            bottom,
            res: Some(res),
            budgets,
            shared,
            twin,
            rt,
            other,
            reaper,
            buffers: Vec::new(),
            reservations: Vec::new(),
            points: Vec::new(),
            frees: Vec::new(),
            tasks: Vec::new(),
            graphs: Vec::new(),
            graph_blocks: Vec::new(),
            faulted: false,
            weak_top,
            guard: stack.kinds.contains(&Kind::Guard),
            cache: stack.kinds.iter().any(|k| matches!(k, Kind::Cache { .. })),
            bare: usize::from(stack.kinds.is_empty()),

            drop_errors: drop_error_count(),
            log: Vec::new(),
        }
    }

    fn res(&self) -> &AsyncResource<Top> {
        self.res.as_ref().expect("the stack is up")
    }

    fn stream(&self, i: usize) -> StreamId {
        self.streams[i % STREAMS]
    }

    /// Whether the harness (its slots, its tasks, its graphs, the second
    /// device's slots) holds memory.
    fn holds_memory(&self) -> bool {
        self.buffers.iter().any(|b| b.num_bytes() > 0)
            || self.tasks.iter().any(|t| !t.handle.is_finished())
            || !self.graphs.is_empty()
            || !self.reservations.is_empty()
            || self.twin.as_ref().is_some_and(Twin::holds_memory)
    }

    /// Whether `bytes` fit every budget and the device with room for a
    /// page of rounding and a cache's slack on each side.
    fn fits(&self, bytes: usize, granularity: usize) -> bool {
        let need = bytes.saturating_mul(2).saturating_add(2 * granularity);
        need <= CAPACITY && self.budgets.iter().all(|b| need <= b.limit())
    }

    /// Polls `fut` once inside the executor (so that spawned tasks run
    /// too), then runs one device operation. `Some` once it is ready.
    fn poll_step<F: Future + Unpin>(&self, fut: &mut F) -> Option<F::Output> {
        let out = self.rt.block_on(async {
            tokio::select! {
                biased;
                out = &mut *fut => Some(out),
                () = tokio::task::yield_now() => None,
            }
        });
        if out.is_none() && !self.gpu.step() {
            // Nothing left to run on the device: the rest is the host's
            // (the futures' fallback thread).
            std::thread::sleep(Duration::from_micros(200));
        }
        out
    }

    /// Awaits `fut` while the device runs; `None` after `patience`.
    fn drive<F: Future + Unpin>(&self, fut: &mut F, patience: Duration) -> Option<F::Output> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(out) = self.poll_step(fut) {
                return Some(out);
            }
            if Instant::now() > deadline {
                return None;
            }
        }
    }

    /// Awaits `fut`, which must settle: a hang fails the case.
    fn settle<F: Future + Unpin>(&self, fut: &mut F, what: &str) -> Result<F::Output, String> {
        self.drive(fut, GUARD)
            .ok_or_else(|| format!("hang: {what} did not settle within {GUARD:?}"))
    }

    /// An error of a library call: allowed once a fault was injected, or
    /// when `expected` says the caller must expect it.
    fn judge(&self, what: &str, e: &ResourceError, expected: bool) -> Verdict {
        if let ResourceError::BudgetExceeded {
            requested,
            limit,
            in_use,
        } = *e
        {
            if requested.saturating_add(in_use) <= limit {
                return fail(format!(
                    "{what}: {e:?}: the budget refused numbers that fit ({requested} + {in_use} <= {limit})"
                ));
            }
            // What the device would hold for it exceeds the limit alone:
            // refused at once, whoever asks.
            if requested > limit {
                return Ok(());
            }
        }
        if self.faulted || expected {
            return Ok(());
        }
        fail(format!("{what}: unexpected error {e:?}"))
    }

    fn dispose<T: Send + 'static>(&self, value: T, at: Place) {
        match at {
            Place::Here => drop(value),
            Place::Thread => std::thread::spawn(move || drop(value)).join().unwrap(),
            Place::Runtime => {
                let task = self.other.spawn(async move { drop(value) });
                self.other.block_on(task).unwrap();
            }
        }
    }

    fn take<T>(v: &mut Vec<T>, slot: usize) -> Option<T> {
        (!v.is_empty()).then(|| {
            let n = v.len();
            v.swap_remove(slot % n)
        })
    }

    fn apply(&mut self, op: &Op, granularity: usize) -> Verdict {
        match *op {
            Op::Alloc { size, stream, how } => self.alloc(size, stream, how, granularity),
            Op::Launch {
                write,
                read,
                stream,
                then,
                panic,
            } => self.launch(write, read, stream, then, panic),
            Op::DropBuffer { slot, at } => {
                if let Some(b) = Self::take(&mut self.buffers, slot) {
                    self.dispose(b, at);
                }
                Ok(())
            }
            Op::Free { slot, then } => {
                let Some(b) = Self::take(&mut self.buffers, slot) else {
                    return Ok(());
                };
                let block = match b.into_block() {
                    Ok(block) => block,
                    Err(refused) => {
                        let e = refused.error.clone();
                        self.buffers.push(*refused.buffer);
                        return self.judge("into_block", &e, false);
                    }
                };
                match self.res().deallocate(block) {
                    Ok(handle) => self.then_free(handle, then),
                    Err(e) => self.judge("deallocate", &e, false),
                }
            }
            Op::DropPoint { slot, at } => {
                if let Some(p) = Self::take(&mut self.points, slot) {
                    self.dispose(p, at);
                }
                Ok(())
            }
            Op::AwaitPoint { slot } => match Self::take(&mut self.points, slot) {
                Some(mut p) => match self.settle(&mut p, "a completion")? {
                    Ok(()) => Ok(()),
                    Err(e) => self.judge("completion", &e, false),
                },
                None => Ok(()),
            },
            Op::DropFree { slot, at } => {
                if let Some(f) = Self::take(&mut self.frees, slot) {
                    self.dispose(f, at);
                }
                Ok(())
            }
            Op::AwaitFree { slot } => match Self::take(&mut self.frees, slot) {
                Some(f) => self.then_free(f, Then::Await),
                None => Ok(()),
            },
            Op::Spawn {
                size,
                stream,
                other,
            } => {
                self.spawn(size, stream, other);
                Ok(())
            }
            Op::Abort { slot, ticks } => {
                for _ in 0..ticks {
                    self.tick(1);
                }
                if let Some(t) = Self::take(&mut self.tasks, slot) {
                    t.handle.abort();
                    let mut handle = t.handle;
                    match self.settle(&mut handle, "an aborted task")? {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => self.judge("request task", &e, false)?,
                        Err(join) if join.is_cancelled() => {}
                        Err(join) => return fail(format!("request task panicked: {join}")),
                    }
                }
                Ok(())
            }
            Op::Tick { n } => {
                self.tick(n);
                self.reap_finished_tasks()
            }
            Op::Step { n } => {
                for _ in 0..n {
                    self.gpu.step();
                }
                Ok(())
            }
            Op::Reap => {
                let mut reap = self.res().reap_pending();
                match self.settle(&mut reap, "reap_pending")? {
                    Ok(()) => Ok(()),
                    Err(e) => self.judge("reap_pending", &e, false),
                }
            }
            Op::ReleaseIdle => match self.res().inner().release_idle() {
                Ok(_) => Ok(()),
                Err(e) => self.judge("release_idle", &e, false),
            },
            Op::Fault { call, nth } => {
                let call = FAULTS[call % FAULTS.len()];
                self.gpu.fail_nth(call, u64::from(nth) + 1);
                self.faulted = true;
                Ok(())
            }
            Op::Huge { which } => self.huge(HUGE[which % HUGE.len()]),
            Op::Capture {
                stream,
                size,
                temps,
                keep,
                adopt,
            } => self.capture(stream, size, temps, keep, adopt),
            Op::Replay { slot, stream, then } => self.replay(slot, stream, then),
            Op::DropGraph { slot, at } => {
                if let Some(g) = Self::take(&mut self.graphs, slot) {
                    self.dispose(g, at);
                }
                Ok(())
            }
            Op::TwinAlloc { size, how } => self.twin_alloc(size, how, granularity),
            Op::TwinDrop { slot, at } => {
                if let Some(b) = self
                    .twin
                    .as_mut()
                    .and_then(|t| Self::take(&mut t.buffers, slot))
                {
                    self.dispose(b, at);
                }
                Ok(())
            }
            Op::Foreign { from, index, call } => self.foreign(from, index, call),
            Op::Reserve {
                sizes,
                stream,
                polls,
                take,
                keep,
            } => self.reserve(sizes, stream, polls, take, keep),
            Op::TakeReserved { slot } => self.take_reserved(slot),
            Op::DropReservation { slot, at } => {
                if let Some(r) = Self::take(&mut self.reservations, slot) {
                    self.dispose(r, at);
                }
                Ok(())
            }
        }
    }

    fn tick(&self, n: u8) {
        self.rt.block_on(tokio::task::yield_now());
        for _ in 0..n {
            self.gpu.step();
        }
    }

    fn reap_finished_tasks(&mut self) -> Verdict {
        let mut i = 0;
        while i < self.tasks.len() {
            if self.tasks[i].handle.is_finished() {
                let mut t = self.tasks.swap_remove(i);
                match self.settle(&mut t.handle, "a finished task")? {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => self.judge("request task", &e, false)?,
                    Err(join) => return fail(format!("request task failed: {join}")),
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn alloc(&mut self, size: usize, stream: usize, how: AllocHow, granularity: usize) -> Verdict {
        let s = self.stream(stream);
        let refusal = |e: &ResourceError| {
            matches!(
                e,
                ResourceError::BudgetExceeded { .. }
                    | ResourceError::OutOfMemory { .. }
                    | ResourceError::AllocationsWaiting { .. }
            )
        };
        match how {
            AllocHow::Try => match self.res().try_allocate_buffer::<u8>(size, s, TAG) {
                Ok(b) => self.buffers.push(b),
                Err(e) => {
                    let expected = refusal(&e);
                    self.judge("try_allocate_buffer", &e, expected)?
                }
            },
            AllocHow::Await => {
                // A debug guard's quarantine holds freed blocks by design:
                // behind it an allocation may wait for good.
                let must = !self.holds_memory() && !self.guard && self.fits(size, granularity);
                let mut fut = self.res().allocate_buffer::<u8>(size, s, TAG);
                let patience = if must { GUARD } else { PATIENCE };
                match self.drive(&mut fut, patience) {
                    Some(Ok(b)) => self.buffers.push(b),
                    // An allocation that cannot fit fails at once.
                    Some(Err(e)) => {
                        let expected = !must && refusal(&e);
                        self.judge("allocate_buffer", &e, expected)?
                    }
                    None if must && !self.faulted => {
                        return fail(format!(
                            "hang: an allocation of {size} B waited {GUARD:?} with nothing held \
                             (budgets {:?}, outstanding {}, device free {})",
                            self.budgets.iter().map(Budget::in_use).collect::<Vec<_>>(),
                            self.bottom.bytes_outstanding(),
                            self.gpu.free_bytes(),
                        ));
                    }
                    None => {} // dropped: a cancelled wait
                }
            }
            AllocHow::Cancel { polls } => {
                let mut fut = self.res().allocate_buffer::<u8>(size, s, TAG);
                for _ in 0..polls {
                    match self.poll_step(&mut fut) {
                        Some(Ok(b)) => {
                            self.buffers.push(b);
                            return Ok(());
                        }
                        Some(Err(e)) => {
                            let expected = refusal(&e);
                            return self.judge("allocate_buffer", &e, expected);
                        }
                        None => {}
                    }
                }
            }
        }
        Ok(())
    }

    fn launch(
        &mut self,
        write: usize,
        read: Option<usize>,
        stream: usize,
        then: Then,
        panic: bool,
    ) -> Verdict {
        let n = self.buffers.len();
        if n == 0 {
            return Ok(());
        }
        let w = write % n;
        let r = read.map(|r| r % n).filter(|&r| r != w);
        let s = self.stream(stream);
        let raw = self.res().stream_pool().raw(s).unwrap();
        let mut touches = vec![MemAccess::write(self.buffers[w].block())];
        if let Some(r) = r {
            touches.push(MemAccess::read(self.buffers[r].block()));
        }
        // A kernel cannot touch a 0-byte buffer (address 0).
        touches.retain(|t| t.ptr != 0);
        let kept = std::iter::once(w)
            .chain(r)
            .any(|i| self.graph_blocks.contains(&self.buffers[i].id()));
        let res = self.res.clone().unwrap();
        let gpu = self.gpu.clone();
        // Both borrowed at once: the written one mutably.
        let (wb, rb) = match r {
            Some(r) if r < w => {
                let (lo, hi) = self.buffers.split_at_mut(w);
                (&mut hi[0], Some(&lo[r]))
            }
            Some(r) => {
                let (lo, hi) = self.buffers.split_at_mut(r);
                (&mut lo[w], Some(&hi[0]))
            }
            None => (&mut self.buffers[w], None),
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut l = res.launch(s).write(wb);
            if let Some(rb) = rb {
                l = l.read(rb);
            }
            l.enqueue(|raw_s| -> Result<(), ResourceError> {
                assert_eq!(raw_s, raw);
                if panic {
                    std::panic::panic_any(InjectedPanic);
                }
                gpu.launch_kernel(raw_s, &touches)
                    .map_err(|e| e.for_request(0, s))
            })
        }));
        match outcome {
            Err(payload) if payload.is::<InjectedPanic>() => Ok(()),
            Err(payload) => fail(format!("launch panicked: {:?}", panic_message(&payload))),
            Ok(Err(e)) => {
                let expected = match e {
                    ResourceError::TrackingUnsupported { .. } => true,
                    // A block a capture kept has no memory before a replay
                    // made it, nor after the graph freed it.
                    ResourceError::GraphMemoryUnbacked { .. } => kept,
                    _ => false,
                };
                self.judge("launch", &e, expected)
            }
            Ok(Ok(((), done))) => self.then_point(done, then),
        }
    }

    /// Keeps, drops or awaits the completion of a launch.
    fn then_point(&mut self, mut done: EventFuture, then: Then) -> Verdict {
        match then {
            Then::Keep => {
                self.points.push(done);
                Ok(())
            }
            Then::Drop => {
                drop(done);
                Ok(())
            }
            Then::Await => match self.settle(&mut done, "a launch's completion")? {
                Ok(()) => Ok(()),
                Err(e) => self.judge("completion", &e, false),
            },
        }
    }

    fn then_free(&mut self, mut handle: DeallocHandle, then: Then) -> Verdict {
        if handle.is_complete() {
            // Complete means applied: polling it changes no books.
            let before = self.bottom.bytes_outstanding();
            let polled = std::pin::pin!(&mut handle)
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
            let after = self.bottom.bytes_outstanding();
            if !matches!(polled, Poll::Ready(Ok(()))) || before != after {
                return fail(format!(
                    "DeallocHandle::is_complete() said true, then a poll gave {polled:?} \
                     and moved the books {before} -> {after}"
                ));
            }
        }
        match then {
            Then::Keep => self.frees.push(handle),
            Then::Drop => drop(handle),
            Then::Await => match self.settle(&mut handle, "a free")? {
                Ok(()) => {}
                Err(e) => self.judge("free", &e, false)?,
            },
        }
        Ok(())
    }

    fn spawn(&mut self, size: usize, stream: usize, other: usize) {
        let res = self.res().clone();
        let gpu = self.gpu.clone();
        let (s, o) = (self.stream(stream), self.stream(other));
        let handle = self.rt.spawn(async move {
            let mut x = res.allocate_buffer::<u8>(size, s, TAG).await?;
            let touch: Vec<MemAccess> = std::iter::once(MemAccess::write(x.block()))
                .filter(|t| t.ptr != 0)
                .collect();
            let g = gpu.clone();
            let ((), done) = res.launch(s).write(&mut x).enqueue(|raw| {
                g.launch_kernel(raw, &touch)
                    .map_err(|e| e.for_request(0, s))
            })?;
            done.await?;
            // The result read on another stream, then the buffer held one
            // more await.
            let touch: Vec<MemAccess> = std::iter::once(MemAccess::read(x.block()))
                .filter(|t| t.ptr != 0)
                .collect();
            let ((), read) = res.launch(o).read(&x).enqueue(|raw| {
                gpu.launch_kernel(raw, &touch)
                    .map_err(|e| e.for_request(0, o))
            })?;
            read.await?;
            tokio::task::yield_now().await;
            drop(x);
            Ok(())
        });
        self.tasks.push(Task { handle });
    }

    fn huge(&mut self, bytes: usize) -> Verdict {
        let before = self.books();
        let s = self.stream(0);
        let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let t = self.res().try_allocate(bytes, s, TAG).map(|_| ());
            let mut fut = self.res().allocate(bytes, s, TAG);
            let a = self.drive(&mut fut, GUARD).map(|r| r.map(|_| ()));
            (t, a)
        }));
        match tried {
            Err(payload) => fail(format!(
                "a request of {bytes} B panicked: {:?}",
                panic_message(&payload)
            )),
            Ok((Ok(()), _)) | Ok((_, Some(Ok(())))) => {
                fail(format!("a request of {bytes} B was served"))
            }
            Ok((_, None)) => fail(format!("hang: a request of {bytes} B waits")),
            // A cache gives its idle blocks back before it gives up, so
            // the books may go down; a refusal takes nothing.
            Ok((Err(_), Some(Err(_)))) if took(&before, &self.books()) => fail(format!(
                "a refused request of {bytes} B took memory: {before:?} -> {:?}",
                self.books()
            )),
            Ok(_) => Ok(()),
        }
    }
}

/// The payload of a panic the harness injects into a user closure.
#[derive(Debug)]
struct InjectedPanic;

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".into())
}

/// Whether the known-open bug class `class` is named in `API_FUZZ_OPEN`
/// (comma-separated): then the harness drives it instead of steering
/// around it, and its cases fail until it is fixed.
#[allow(
    dead_code,
    reason = "no class is open now; the next one found steers with it"
)]
fn open(class: &str) -> bool {
    OPEN.with(|o| o.get() == Some(class))
        || std::env::var("API_FUZZ_OPEN").is_ok_and(|v| v.split(',').any(|c| c.trim() == class))
}

thread_local! {
    /// An open class a written-out case drives on its thread (tests run in
    /// parallel: the environment is shared).
    static OPEN: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// Runs one case: every op, the check after each, the drain.
fn run(stack: &Stack, ops: &[Op]) -> Verdict {
    quiet_injected_panics();
    let mut world = World::new(stack);
    for (step, op) in ops.iter().enumerate() {
        world.log.push(format!("{op:?}"));
        world
            .apply(op, stack.granularity)
            .and_then(|()| world.check())
            .map_err(|e| format!("step {step} ({op:?}): {e}"))?;
    }
    world.drain().map_err(|e| format!("drain: {e}"))
}

/// Keeps the panics the harness injects out of the test's output.
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<InjectedPanic>() {
                default(info);
            }
        }));
    });
}

#[path = "api_model/checks.rs"]
mod checks;
#[path = "api_model/strategies.rs"]
mod strategies;

use checks::took;
use strategies::{cases, op, stack};

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 4096,
        failure_persistence: crate::support::regressions::beside_source(),
        .. ProptestConfig::default()
    })]

    /// Random stacks, random callers: see the module documentation.
    #[test]
    fn the_whole_api_holds_under_random_use(
        stack in stack(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        if let Err(e) = run(&stack, &ops) {
            prop_assert!(false, "{:?}\n{}", stack, e);
        }
    }
}

/// The minimal cases the harness found, written out.
#[path = "api_model/regressions.rs"]
mod regressions;
