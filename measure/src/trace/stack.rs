//! The resource stacks a trace can be replayed through, by name, built fresh
//! on CUDA or on the simulated device.
//!
//! Each replay gets a new stack on a new backend (on CUDA a new memory pool
//! and new streams on the device's primary context), so that nothing one
//! stack cached or reserved is seen by the next, as `torch_cpp_replay.py`
//! empties PyTorch's cache and resets its peak between repeats.
//!
//! To add a stack: a variant of [`StackKind`], its name in
//! [`StackKind::ALL`], and its construction in `replay_on`.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use streamalloc::gpu::Gpu;
use streamalloc::gpu::cuda::CudaGpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Budget, BudgetResource, CacheConfig, CachingResource, Device, DeviceMemoryResource,
    StreamOrderedResource, StreamPool,
};

use super::format::Trace;
use super::replay::{Replay, ReplayError, Target, replay};
use crate::calls::{CallCounts, CountingGpu};

/// A resource stack, named as on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackKind {
    /// `resource`: the stream-ordered resource alone, over the driver's pool.
    Resource,
    /// `cache`: [`CachingResource`] over the resource, configured by
    /// [`ReplayConfig::cache`] (by default, the default configuration).
    Cache,
    /// `cache-budget`: the default cache over a [`BudgetResource`] whose
    /// limit is [`ReplayConfig::budget_ratio`] times the trace's peak
    /// requested bytes (the cache must give memory back to stay inside it).
    CacheBudget,
}

impl StackKind {
    /// Every stack, in the order they are listed.
    pub const ALL: [StackKind; 3] = [
        StackKind::Resource,
        StackKind::Cache,
        StackKind::CacheBudget,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StackKind::Resource => "resource",
            StackKind::Cache => "cache",
            StackKind::CacheBudget => "cache-budget",
        }
    }

    /// The stack called `name`, if any.
    pub fn from_name(name: &str) -> Option<StackKind> {
        StackKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for StackKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The device a stack is built on.
#[derive(Debug, Clone)]
pub enum DeviceKind {
    /// A CUDA device (its primary context).
    Cuda(Arc<CudaContext>),
    /// A simulated device of `capacity` bytes in manual progress mode: the
    /// order of everything is fixed, so its held bytes are the same at every
    /// run (what CI asserts).
    Sim {
        /// Simulated device memory.
        capacity: usize,
    },
    /// The null backend ([`NullGpu`](crate::support::NullGpu)): driver
    /// calls that do nothing, so a replay's time is the stack's own
    /// bookkeeping. It holds no memory: its held bytes read 0.
    Null,
}

/// How a stack is replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayConfig {
    /// The `cache-budget` stack's limit, in multiples of the trace's peak
    /// requested bytes.
    pub budget_ratio: f64,
    /// Read the held bytes after every this many operations (for plots).
    pub sample_every: Option<usize>,
    /// The configuration of the cache in the `cache` and `cache-budget`
    /// stacks (default: [`CacheConfig::default`]).
    pub cache: CacheConfig,
    /// Count the driver calls of the replay ([`Replay::calls`]): the
    /// backend is wrapped in a [`CountingGpu`], which times every call it
    /// forwards, so timed figures are taken without.
    pub count_calls: bool,
    /// On the simulated device, run its queued work after every this many
    /// operations (default [`SIM_DRAIN_EVERY`]: 1; `usize::MAX`: only at
    /// the end), to see what depends on when the GPU completes work.
    pub sim_drain_every: usize,
}

impl Default for ReplayConfig {
    /// A budget of 1.10× the peak requested (the cache's target), the
    /// default cache, no samples, no call counts.
    fn default() -> Self {
        ReplayConfig {
            budget_ratio: 1.10,
            sample_every: None,
            cache: CacheConfig::default(),
            count_calls: false,
            sim_drain_every: SIM_DRAIN_EVERY,
        }
    }
}

/// How often the simulated device runs its queued work during a replay:
/// after every operation. A replay launches no kernels, so on a GPU every
/// event it records (the cache's fences) completes within microseconds,
/// before the next few operations; the simulated device runs it before the
/// next one. The cache's placement does not depend on when fences
/// complete (only its waits do), and a growth gives back only memory
/// fenced at the previous growth, so what the replay holds on the
/// simulated device is what it holds on any GPU that completes, between
/// two growths, what was queued before the first (a growth's own driver
/// calls take tens of µs); `trace_replay --sim-drain N` varies it.
pub const SIM_DRAIN_EVERY: usize = 1;

/// Replays `trace` through a fresh `kind` stack on `backend`;
/// `peak_requested` sizes the budget of [`StackKind::CacheBudget`].
///
/// # Errors
/// Setting up the device, pool or streams, or what [`replay`] reports.
pub fn replay_stack(
    kind: StackKind,
    backend: &DeviceKind,
    trace: &Trace,
    peak_requested: usize,
    config: &ReplayConfig,
) -> Result<Replay, ReplayError> {
    let streams = trace.streams.max(1);
    let setup = ReplayError::Setup;
    match backend {
        DeviceKind::Cuda(ctx) => {
            let gpu = Arc::new(CudaGpu::try_new(ctx.clone()).map_err(setup)?);
            let pool = StreamPool::cuda(ctx, streams).map_err(setup)?;
            on_backend(kind, gpu, pool, None, trace, peak_requested, config)
        }
        DeviceKind::Sim { capacity } => {
            let gpu = SimGpu::builder().manual().capacity(*capacity).build();
            let pool = gpu.stream_pool(streams);
            let drain_gpu = gpu.clone();
            let drain = move || drain_gpu.run_until_idle();
            on_backend(kind, gpu, pool, Some(&drain), trace, peak_requested, config)
        }
        DeviceKind::Null => {
            let handles = SimGpu::builder().manual().build();
            let gpu = Arc::new(crate::support::NullGpu::with_events_on(&handles));
            let pool = handles.stream_pool(streams);
            on_backend(kind, gpu, pool, None, trace, peak_requested, config)
        }
    }
}

/// [`replay_on`] `gpu`, or on `gpu` wrapped in a [`CountingGpu`] when the
/// calls are counted.
fn on_backend<G: Gpu>(
    kind: StackKind,
    gpu: Arc<G>,
    pool: Arc<StreamPool>,
    drain: Option<&dyn Fn()>,
    trace: &Trace,
    peak_requested: usize,
    config: &ReplayConfig,
) -> Result<Replay, ReplayError> {
    if !config.count_calls {
        return replay_on(kind, gpu, pool, drain, None, trace, peak_requested, config);
    }
    let counting = Arc::new(CountingGpu::new(gpu));
    let counts = || counting.counts();
    replay_on(
        kind,
        counting.clone(),
        pool,
        drain,
        Some(&counts),
        trace,
        peak_requested,
        config,
    )
}

#[allow(clippy::too_many_arguments)]
fn replay_on<G: Gpu>(
    kind: StackKind,
    gpu: Arc<G>,
    pool: Arc<StreamPool>,
    drain: Option<&dyn Fn()>,
    counts: Option<&dyn Fn() -> CallCounts>,
    trace: &Trace,
    peak_requested: usize,
    config: &ReplayConfig,
) -> Result<Replay, ReplayError> {
    let device = Device::new(gpu, pool).map_err(ReplayError::Setup)?;
    let resource = StreamOrderedResource::new(&device);
    let go = |resource: &dyn DeviceMemoryResource| {
        let target = Target {
            resource,
            device: &device,
            housekeeping: drain.map(|d| (config.sim_drain_every.max(1), d)),
        };
        // The calls of the replay only: not the stack's set-up, nor what
        // dropping it gives back.
        let before = counts.map(|c| c());
        let mut replay = replay(trace, &target, config.sample_every)?;
        if let (Some(counts), Some(before)) = (counts, before) {
            replay.calls = Some(counts().since(&before));
        }
        Ok(replay)
    };
    match kind {
        StackKind::Resource => go(&resource),
        StackKind::Cache => go(&CachingResource::with_config(resource, config.cache)),
        StackKind::CacheBudget => {
            let limit = (peak_requested as f64 * config.budget_ratio).ceil() as usize;
            let budget = Budget::new(limit);
            go(&CachingResource::with_config(
                BudgetResource::new(resource, &budget),
                config.cache,
            ))
        }
    }
}
