//! [`ResourceBuilder`]: stacks adaptors around a resource, as tower's
//! `ServiceBuilder` stacks middleware.

#![forbid(unsafe_code)]

use crate::adaptors::{
    Budget, BudgetLayer, DebugGuardLayer, GuardConfig, Identity, Layer, RetryOnOomLayer, Stack,
    Stats, StatsLayer, TracingLayer,
};

/// Builds a stack of adaptors, outermost first.
///
/// Each call adds one layer *inside* the ones added before: the first layer
/// added is the one callers meet first, the last one sits right on the
/// resource given to [`build`](Self::build). The result is a plain nested
/// type (`A<B<C<R>>>`), with no boxing and no dynamic dispatch.
///
/// # Examples
/// ```
/// use streamalloc::Budget;
/// use streamalloc::ResourceBuilder;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let budget = Budget::new(1 << 30);
/// let resource = ResourceBuilder::new()
///     .tracing()
///     .retry_on_oom()
///     .budget(&budget)
///     .stats()
///     .build(SimResource::new(&device));
///
/// let block = resource.allocate(4096, device.stream(0)?, AllocTag("io"))?;
/// assert_eq!(budget.in_use(), 4096);
/// resource.deallocate(block)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
///
/// # Order
///
/// The order of the calls is the order in which each allocation passes
/// through the layers, and it changes what the stack does. Two opposite
/// orders of the same two layers:
///
/// ```text
/// ResourceBuilder::new().retry_on_oom().budget(&b)   RetryOnOomResource<BudgetResource<R>>
///     A budget refusal reaches RetryOnOomResource, which reaps *through* the budget:
///     frees that have executed give their bytes back, and the retry can
///     succeed. Memory queued for freeing turns into back-pressure, not errors.
///
/// ResourceBuilder::new().budget(&b).retry_on_oom()   BudgetResource<RetryOnOomResource<R>>
///     The budget refuses before RetryOnOomResource is reached: a budget refusal is
///     final until someone reaps. RetryOnOomResource only helps with device
///     out-of-memory.
/// ```
///
/// The same holds for counting around a quarantine:
///
/// ```text
/// .stats().debug_guard(cfg)   Stats outside: a quarantined block counts as
///                             freed (what the user holds).
/// .debug_guard(cfg).stats()   Stats inside: it counts until the guard
///                             really frees it (what the device holds).
/// ```
///
/// Put [`tracing`](Self::tracing) outermost to log what callers asked for
/// and innermost to log what reached the device.
///
/// # Every order is sound
///
/// The builder refuses no order because every order works: whatever
/// sequence of layers it is given (any order, any layer more than once),
/// each budget in the stack counts exactly what the device holds below it
/// after every call (live, cached, quarantined and not-yet-reaped bytes,
/// and the pages a cache's arena maps), a refused allocation takes
/// nothing, and after the last free and the stack's drop nothing is left
/// charged, allocated or mapped. `tests/adaptors/stack_orders.rs` checks this
/// against the simulated device for all 1,631 orders of distinct layers
/// that hold a budget (with either cache tier) and for random sequences
/// with repeats, under random allocations, frees, cross-stream uses,
/// reaps, notifications and [`release_idle`](crate::DeviceMemoryResource::release_idle).
///
/// One difference between orders remains: a budget above the
/// [`cache`](Self::cache) admits each page the cache's virtual-memory
/// arena creates before it is created (a gate the budget enters around
/// its allocation: the pages the cost guessed, one more where the block
/// lands across a boundary or the free range it counted went to another
/// thread, the pages mapped ahead), but a cache without the arena (size
/// classes) allocates a class block below without asking, so a race for
/// a cached block can take the budget past its limit by a block until
/// that block is freed. Put the budget below the cache
/// (`.cache(c).budget(&b)`) for a hard limit in every case: the budget
/// lends the cache its device, and the arena asks it before mapping any
/// page (a refused page fails the allocation), so the budget admits
/// every byte first there too (see
/// [`device_access`](crate::DeviceMemoryResource::device_access)).
#[derive(Debug, Clone)]
pub struct ResourceBuilder<L> {
    layer: L,
}

impl Default for ResourceBuilder<Identity> {
    fn default() -> Self {
        Self::new()
    }
}

impl ResourceBuilder<Identity> {
    /// A builder with no layer.
    pub fn new() -> Self {
        ResourceBuilder { layer: Identity }
    }
}

impl<L> ResourceBuilder<L> {
    /// Adds `layer` inside the layers added so far.
    pub fn layer<T>(self, layer: T) -> ResourceBuilder<Stack<T, L>> {
        ResourceBuilder {
            layer: Stack::new(layer, self.layer),
        }
    }

    /// Adds a [`BudgetResource`](crate::BudgetResource) charging
    /// `budget`.
    pub fn budget(self, budget: &Budget) -> ResourceBuilder<Stack<BudgetLayer, L>> {
        self.layer(BudgetLayer::new(budget))
    }

    /// Adds a [`StatsResource`](crate::StatsResource) with fresh
    /// counters (reach them through the built resource's `stats()`), or use
    /// [`stats_with`](Self::stats_with) to keep a handle.
    pub fn stats(self) -> ResourceBuilder<Stack<StatsLayer, L>> {
        self.layer(StatsLayer::new())
    }

    /// Adds a [`StatsResource`](crate::StatsResource) counting into
    /// `stats`.
    pub fn stats_with(self, stats: &Stats) -> ResourceBuilder<Stack<StatsLayer, L>> {
        self.layer(StatsLayer::with_stats(stats))
    }

    /// Adds a [`TracingResource`](crate::TracingResource).
    pub fn tracing(self) -> ResourceBuilder<Stack<TracingLayer, L>> {
        self.layer(TracingLayer::new())
    }

    /// Adds a [`RetryOnOomResource`](crate::RetryOnOomResource).
    pub fn retry_on_oom(self) -> ResourceBuilder<Stack<RetryOnOomLayer, L>> {
        self.layer(RetryOnOomLayer::new())
    }

    /// Adds a [`DebugGuardResource`](crate::DebugGuardResource) configured by
    /// `config`.
    pub fn debug_guard(self, config: GuardConfig) -> ResourceBuilder<Stack<DebugGuardLayer, L>> {
        self.layer(DebugGuardLayer::new(config))
    }

    /// Adds the caching tier ([`CachingResource`](crate::CachingResource))
    /// with `config`, inside the layers added so far (they sit above the
    /// cache; the ones added after it sit below).
    pub fn cache(
        self,
        config: crate::cache::CacheConfig,
    ) -> ResourceBuilder<Stack<crate::adaptors::CachingLayer, L>> {
        self.layer(crate::adaptors::CachingLayer::new(config))
    }

    /// The stacked layer, to wrap several resources (for instance one per
    /// device) or to nest in another builder.
    pub fn into_layer(self) -> L {
        self.layer
    }

    /// Wraps `resource` in every layer.
    pub fn build<R>(&self, resource: R) -> L::Resource
    where
        L: Layer<R>,
    {
        self.layer.layer(resource)
    }
}

impl<R, L: Layer<R>> Layer<R> for ResourceBuilder<L> {
    type Resource = L::Resource;

    fn layer(&self, inner: R) -> Self::Resource {
        self.layer.layer(inner)
    }
}
