//! [`AsyncResource`]: the futures face of a [`DeviceMemoryResource`].
//!
//! The struct is two `Arc`s: the wrapped stack (`inner`) and the futures
//! layer's [`Core`] (notifiers, wait queue, watchdog), which every future,
//! handle and owned buffer made from it shares. Its methods live by
//! concept, each file an `impl` block over the same type:
//!
//! - here: making one (over a stream-ordered resource, a stack built by
//!   [`build`](AsyncResource::build) or from `STREAMALLOC_CONF`, or any
//!   stack through the `unsafe` [`with_device`](AsyncResource::with_device)),
//!   and the calls that take and give back memory: `allocate`, `reserve`,
//!   `try_allocate`, `deallocate`, `reap_pending`, `release_capture`, the
//!   hold-and-wait verdict;
//! - [`completions`](super::completions): the block-use hooks, the
//!   completion futures of a stream's points, the wait policy;
//! - [`observing`](super::observing): counters, snapshots, out-of-memory
//!   reports, wait statistics;
//! - [`frees`]: the free path below `deallocate`, and the frees nobody
//!   awaits (an owned buffer's drop, a reservation's give back);
//! - [`shutdown`](super::shutdown): the layers' handles by type, `close`,
//!   `shutdown`;
//! - [`sleep`](super::sleep): the stack's cache put to sleep and woken.

#![allow(unsafe_code)]

use std::sync::Arc;

use super::alloc_future::{AllocFuture, record_alloc, record_oom};
use super::core::Core;
use super::dealloc::{DeallocHandle, ReapFuture};
use super::frees;
use super::hold_wait::current_owner;
use super::wait_policy::WaitPolicy;
use crate::adaptors::{
    Budget, BudgetResource, DebugGuardResource, GuardConfig, RetryOnOomResource,
};
use crate::cache::{CacheConfig, CachingResource};
use crate::conf::{AllocConf, CONF_ENV, WaitChoice};
use crate::device::{Device, StreamPool};
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, Gpu};
use crate::observe::history;
use crate::resource::{DeviceMemoryResource, StreamOrderedResource};
use crate::types::{DeviceBlock, StreamId, Tag};

/// A stream-ordered resource that async code can await: allocations wait for
/// memory instead of failing, completion points and frees are futures, and
/// frees reach the accounting as the GPU executes them, without a
/// synchronize.
///
/// It wraps any [`DeviceMemoryResource`] `R` (the stream-ordered resource, or
/// an adaptor stack over one) together with the [`Device`] (backend and
/// streams) the notifications need. Cloning is cheap and shares everything.
///
/// The essay of `src/futures/` says how completions are delivered.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use streamalloc::{AllocTag, AsyncResource, Device};
///
/// let device = Device::open(0, 2); // CUDA device 0, or the simulator
/// let res = AsyncResource::on(&device)?;
/// let s = device.stream(0)?;
///
/// let block = res.allocate(1 << 20, s, AllocTag("activations")).await?;
/// res.completion(s)?.await?;
/// res.deallocate(block)?.await?;
/// assert_eq!(res.bytes_outstanding(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AsyncResource<R: ?Sized> {
    inner: Arc<R>,
    core: Arc<Core>,
}

/// An [`AsyncResource`] over any stack, its type erased: what a struct
/// holds (RMM's `any_resource`). Made by
/// [`AsyncResource::into_any`]; every method of the typed resource is
/// there, and the layers' handles are reached by type
/// ([`AsyncResource::layer`]).
pub type AnyResource = AsyncResource<dyn DeviceMemoryResource>;

impl<R: ?Sized> Clone for AsyncResource<R> {
    fn clone(&self) -> Self {
        AsyncResource {
            inner: self.inner.clone(),
            core: self.core.clone(),
        }
    }
}

impl<G: Gpu> AsyncResource<StreamOrderedResource<G>> {
    /// The stream-ordered resource on `device`, awaitable: the one-line
    /// start.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn on(device: &Device<G>) -> ResourceResult<Self> {
        let conf = AllocConf::from_env()?;
        let res = Self::new(Arc::new(StreamOrderedResource::new(device)))?;
        res.apply_settings(&conf);
        Ok(res)
    }

    /// Wraps a stream-ordered resource, on its own device.
    ///
    /// Creates one notifier stream and one event per pool stream, and the
    /// fallback thread (parked while nothing is pending).
    ///
    /// # Errors
    /// A driver error creating the events; nothing is left behind.
    pub fn new(inner: Arc<StreamOrderedResource<G>>) -> ResourceResult<Self> {
        let device = inner.device();
        // SAFETY: the device is the resource's own: its blocks are
        // allocations of that backend and its streams those of that pool.
        unsafe { Self::from_arc(inner, &device) }
    }
}

impl AsyncResource<Arc<dyn DeviceMemoryResource>> {
    /// A stack built from `STREAMALLOC_CONF` alone (the [grammar](crate::AllocConf::parse)):
    /// configuration without code. From the outside in: a debug guard
    /// (`debug_guard:on`), retry on out-of-memory and a budget
    /// (`budget:BYTES`), the cache (`cache:on`, `cache_max`,
    /// `cache_virtual_memory`), the stream-ordered resource on `device`;
    /// the budget above the cache, as `examples/service.rs` stacks them.
    /// The history and the wait policy as [`build`](Self::build) applies
    /// them. With the variable unset, the plain resource.
    ///
    /// ```
    /// use streamalloc::{AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::new(), 2);
    /// // STREAMALLOC_CONF="cache:on,budget:12GiB,history:10000" in the environment
    /// let res = AsyncResource::configured(&device)?;
    /// # Ok::<(), streamalloc::ResourceError>(())
    /// ```
    ///
    /// # Errors
    /// [`ResourceError::Config`] naming the key of a value it cannot
    /// follow (nothing is built); a driver error creating the futures
    /// layer's events.
    pub fn configured<G: Gpu>(device: &Device<G>) -> ResourceResult<Self> {
        Self::with_conf(device, &AllocConf::from_env()?)
    }

    /// As [`configured`](Self::configured), from `conf` instead of the
    /// environment.
    ///
    /// # Errors
    /// A driver error creating the futures layer's events.
    pub fn with_conf<G: Gpu>(device: &Device<G>, conf: &AllocConf) -> ResourceResult<Self> {
        let mut stack: Arc<dyn DeviceMemoryResource> = Arc::new(StreamOrderedResource::new(device));
        if conf.cache == Some(true) {
            let mut config = CacheConfig::default();
            if let Some(max) = conf.cache_max {
                config = config.max_cached_bytes(max);
            }
            if let Some(on) = conf.cache_virtual_memory {
                config = config.virtual_memory(on);
            }
            stack = Arc::new(CachingResource::with_config(stack, config));
        }
        let budget = conf.budget.map(Budget::new);
        if let Some(budget) = &budget {
            stack = Arc::new(RetryOnOomResource::new(BudgetResource::new(stack, budget)));
        }
        if conf.debug_guard == Some(true) {
            stack = Arc::new(DebugGuardResource::new(stack, GuardConfig::default()));
        }
        // SAFETY: the bottom of the stack was made on `device` just above
        // and resolves its streams through `device`'s pool; every layer
        // over it is one of the crate's own, which allocate and resolve
        // streams only through the layer they wrap (items 1 and 2).
        let res = unsafe { Self::with_device(stack, device) }?;
        res.apply_settings(conf);
        Ok(res)
    }
}

impl<R: DeviceMemoryResource + 'static> AsyncResource<R> {
    /// The same resource with its type erased, for a struct field or a
    /// collection of stacks of different types: cloneable, every method
    /// and layer handle still there.
    pub fn into_any(self) -> AnyResource {
        AsyncResource {
            inner: self.inner,
            core: self.core,
        }
    }

    /// Makes a stream-ordered resource on `device`, stacks `layers` over
    /// it and wraps the stack: the safe way to put the futures layer over
    /// a stack (see [`with_device`](Self::with_device) for one you built).
    ///
    /// ```
    /// use streamalloc::Budget;
    /// use streamalloc::ResourceBuilder;
    /// use streamalloc::CacheConfig;
    /// use streamalloc::{AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::new(), 2);
    /// let budget = Budget::new(1 << 30);
    /// let layers = ResourceBuilder::new()
    ///     .retry_on_oom()
    ///     .budget(&budget)
    ///     .cache(CacheConfig::default());
    /// let res = AsyncResource::build(&device, &layers)?;
    /// # Ok::<(), streamalloc::ResourceError>(())
    /// ```
    ///
    /// # Errors
    /// A driver error creating the futures layer's events.
    pub fn build<G: Gpu, L>(device: &Device<G>, layers: &L) -> ResourceResult<Self>
    where
        L: crate::faithful::FaithfulLayer<StreamOrderedResource<G>, Resource = R>,
    {
        let conf = AllocConf::from_env()?;
        let stack = layers.layer(StreamOrderedResource::new(device));
        // SAFETY: the bottom of the stack was made on `device` just above,
        // and resolves its streams through `device`'s pool; `L` is a
        // `FaithfulLayer`, so the stack allocates and resolves streams only
        // through that bottom (items 1 and 2 of `with_device`).
        let res = unsafe { Self::with_device(stack, device) }?;
        res.apply_settings(&conf);
        Ok(res)
    }

    /// Applies what `conf` says that does not change the stack: the
    /// history and the wait policy. The layers are the code's.
    fn apply_settings(&self, conf: &AllocConf) {
        if conf.shapes_the_stack() {
            tracing::info!(
                "{CONF_ENV} names layers; this stack's layers were chosen in code and are kept (AsyncResource::configured builds the stack from {CONF_ENV})"
            );
        }
        // The code's own `record_memory_history` wins: only a history
        // still off is turned on.
        if let Some(n) = conf.history
            && history::memory_history_capacity() == 0
        {
            history::record_memory_history(n, conf.history_backtraces == Some(true));
        }
        match conf.wait {
            Some(WaitChoice::Default) => self.set_wait_policy(WaitPolicy::DEFAULT),
            Some(WaitChoice::Park) => self.set_wait_policy(WaitPolicy::PARK_AT_ONCE),
            None => {}
        }
    }

    /// Wraps any resource `inner` (for instance an adaptor stack) that
    /// allocates on `device`.
    ///
    /// # Errors
    /// [`WrongDevice`](crate::ResourceError::WrongDevice) when `device` and
    /// `inner` disagree on the device; a driver error creating events.
    ///
    /// # Safety
    /// The futures layer and the buffers made from it queue work on
    /// `device`'s backend with `inner`'s blocks and streams, which no backend
    /// can check (the device ordinal is checked, the backend is not), so:
    /// 1. every block `inner` hands out is an allocation of `device`'s
    ///    backend (for a stack: the resource at its bottom was made on
    ///    `device`);
    /// 2. `inner` resolves its streams through `device`'s pool.
    pub unsafe fn with_device<G: Gpu>(inner: R, device: &Device<G>) -> ResourceResult<Self> {
        // SAFETY: this fn's own contract.
        unsafe { Self::from_arc(Arc::new(inner), device) }
    }

    /// As [`with_device`](Self::with_device), for a resource already shared.
    ///
    /// # Errors
    /// As [`with_device`](Self::with_device).
    ///
    /// # Safety
    /// As [`with_device`](Self::with_device).
    pub unsafe fn from_arc<G: Gpu>(inner: Arc<R>, device: &Device<G>) -> ResourceResult<Self> {
        let erased: Arc<dyn DeviceMemoryResource> = inner.clone();
        let gpu: Arc<dyn Gpu> = device.gpu().clone();
        let core = Core::new(erased, gpu, device.streams().clone())?;
        // A request refused under one of the stack's budgets on another
        // stack asks this one for its idle memory, whatever the order of
        // its layers (a cache above the budget resource included).
        let mut budgets = Vec::new();
        inner.budget_reliefs(&mut budgets);
        core.hold_budget_relief(&budgets);
        Ok(AsyncResource { inner, core })
    }
}

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// The wrapped resource.
    pub fn inner(&self) -> &Arc<R> {
        &self.inner
    }

    /// The backend.
    pub fn gpu(&self) -> &Arc<dyn Gpu> {
        &self.core.gpu
    }

    /// The stream pool.
    pub fn stream_pool(&self) -> &Arc<StreamPool> {
        &self.core.pool
    }

    /// Allocates `bytes` on `stream`, waiting while the device or budget is
    /// full, first come first served.
    ///
    /// # Errors
    /// See [`AllocFuture`]; an unknown stream is reported when polled.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait loses its place, holds nothing, and
    /// passes a wake-up it received on to the next waiter.
    ///
    /// # Stream ordering
    /// The block is usable on `stream` from this point of its order.
    pub fn allocate(&self, bytes: usize, stream: StreamId, tag: impl Into<Tag>) -> AllocFuture {
        AllocFuture::new(self.core.clone(), bytes, stream, tag.into())
    }

    /// Reserves a request's memory as one unit: one block of each of
    /// `sizes` (bytes) on `stream`, waiting while they do not all fit,
    /// first come first served with the other waiting allocations, as
    /// tokio's `Semaphore::acquire_many_owned`. Buffers are then taken from
    /// the [`MemoryReservation`](super::MemoryReservation) without waiting
    /// and without failing for lack of memory; dropping it gives back what
    /// was not taken, unused (the next stream to take that memory does not
    /// wait for this one's work). For `n` bytes in one buffer, pass `&[n]`.
    ///
    /// The blocks are allocated up front through the whole stack (see
    /// [`MemoryReservation`](super::MemoryReservation) for budgets and
    /// caches). A reservation that waits holds nothing, so requests that
    /// reserve never hold part of their memory while waiting for the rest.
    ///
    /// # Errors
    /// See [`ReserveFuture`](super::ReserveFuture).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while waiting it holds nothing and passes a
    /// wake-up it received on to the next waiter.
    ///
    /// # Stream ordering
    /// The blocks, and the buffers taken from them, are usable on `stream`
    /// from this point of its order.
    pub fn reserve(
        &self,
        sizes: &[usize],
        stream: StreamId,
        tag: impl Into<Tag>,
    ) -> super::ReserveFuture {
        super::ReserveFuture::new(self.core.clone(), sizes, stream, tag.into())
    }

    /// Allocates at once, failing when the device or budget is full. It
    /// takes no place in the queue of waiting allocations, and never
    /// overtakes it: while allocations wait, it fails without trying.
    ///
    /// # Errors
    /// A stream of another pool ([`ForeignStream`](crate::ResourceError::ForeignStream))
    /// or device, before anything else;
    /// [`Closed`](crate::ResourceError::Closed) once the resource is
    /// closed;
    /// [`AllocationsWaiting`](crate::ResourceError::AllocationsWaiting)
    /// while the queue is not empty; otherwise as
    /// [`DeviceMemoryResource::allocate`]. Nothing changes.
    pub fn try_allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: impl Into<Tag>,
    ) -> ResourceResult<DeviceBlock> {
        let tag = tag.into().kind();
        // The stream first: a layer below that refuses for another reason
        // (a full budget) may act on the refusal (ask for idle memory).
        self.core.notifier(stream)?;
        self.core.check_open()?;
        match self.core.allocs.len() {
            0 => {
                let block = self.inner.allocate(bytes, stream, tag).inspect_err(|e| {
                    if history::recording() {
                        record_oom(e, stream, tag);
                    }
                })?;
                record_alloc(&block, bytes);
                if self.core.tracks_holdings() {
                    self.core
                        .holdings
                        .served(block.id(), bytes, current_owner());
                }
                Ok(block)
            }
            waiting => Err(ResourceError::AllocationsWaiting { waiting }),
        }
    }

    /// Queues the free of `block` on its stream and returns a handle that
    /// resolves once the bytes are back in the accounting. Dropping the
    /// handle is fine: the free still happens and is still accounted.
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::deallocate`] (double free, foreign block,
    /// unknown stream…); nothing changes.
    ///
    /// # Stream ordering
    /// The memory may serve a new allocation on the same stream at once, and
    /// on another stream once the free has executed.
    ///
    /// # Captures
    /// A free queued on a stream being captured into a CUDA graph is part
    /// of the graph (it runs at every replay): no notification is queued
    /// into the capture, and the handle resolves once the stream's work
    /// after the capture is reached (awaiting it inside the capture waits
    /// for the capture's end).
    pub fn deallocate(&self, block: DeviceBlock) -> ResourceResult<DeallocHandle> {
        frees::deallocate_on(&self.core, block)
    }

    /// A future resolving when every free pending now has executed and left
    /// the accounting — without synchronizing a stream or parking a thread.
    ///
    /// # Errors
    /// The driver's error when a stream's device faulted.
    ///
    /// # Cancel safety
    /// Cancel safe: the frees are applied whether or not it is awaited.
    pub fn reap_pending(&self) -> ReapFuture {
        ReapFuture::new(self.core.clone())
    }

    /// Turns the hold-and-wait verdict on or off (off by default).
    ///
    /// While it is on, an allocation that waits for memory every byte of
    /// which is held by tasks that are themselves waiting for more, with
    /// nothing pending on the GPU that would free any, does not wait
    /// forever: the newest waiter whose task holds memory fails with
    /// [`HoldAndWait`](ResourceError::HoldAndWait), so that its task gives
    /// its memory back. The verdict rests on what the host saw: the budget
    /// (or device) holds nothing beyond this stack, every block the futures
    /// layer served and that is held belongs to a tokio task with an
    /// allocation in the queue, the stack has no idle memory to give back,
    /// and no stream has a free or a completion pending. It is given when
    /// the head of the queue is refused, so also after a task that holds
    /// memory queues, and after the watchdog's periodic retry.
    ///
    /// It is off by default because it judges ownership by task: a buffer
    /// counts as its allocating task's, so where tasks hand their buffers
    /// to other tasks that free them (a pipeline over channels), a producer
    /// waiting while its buffers sit in a channel looks like hold-and-wait
    /// and would fail a request that would have been served. Turn it on
    /// where each task frees what it allocates. While it is off, serving
    /// and freeing record nothing for it. Memory allocated outside a tokio task is
    /// never presumed stuck. The cure for a real hold-and-wait is to ask
    /// for a request's memory as one unit ([`reserve`](Self::reserve)).
    pub fn set_hold_and_wait_check(&self, on: bool) {
        self.core.set_hold_wait_check(on);
    }

    /// The graph of `capture` is gone: returns the memory the stack gave it
    /// ([`DeviceMemoryResource::release_capture`]), and queues a
    /// notification on `after` so that the graph's frees reach the
    /// accounting once the stream passes its last replay, with no
    /// synchronize.
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::release_capture`].
    pub fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        let notifier = self.core.notifier(after)?;
        let released = self.inner.release_capture(capture, after);
        // What was released stays released even when the call failed part
        // way: its frees are queued on `after` like any.
        if notifier.mark_free_if_new(self.core.inner.pending_free_seq(after)) {
            notifier.launch(&*self.core.gpu);
            self.core.kick.pending();
        }
        self.core.mark_frees_elsewhere(Some(after));
        self.core.allocs.memory_returned();
        released
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }
}
