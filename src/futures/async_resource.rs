//! [`AsyncResource`]: the futures face of a [`DeviceMemoryResource`].

#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::alloc_future::{AllocFuture, record_alloc, record_oom};
use super::core::Core;
use super::dealloc::{DeallocHandle, ReapFuture};
use super::done_at::DoneAt;
use super::event_future::EventFuture;
use super::hold_wait::current_owner;
use super::wait_policy::WaitPolicy;
use super::wait_stats::WaitStats;
use crate::adaptors::{
    Budget, BudgetResource, DebugGuardResource, GuardConfig, RetryOnOomResource,
};
use crate::cache::{CacheConfig, CachingResource};
use crate::conf::{AllocConf, CONF_ENV, WaitChoice};
use crate::device::{Device, StreamPool};
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, Gpu};
use crate::observe::history::{self, MemoryAction, MemoryEvent};
use crate::observe::{MemorySnapshot, OomReport, WaitersInfo};
use crate::resource::{DeviceMemoryResource, StreamOrderedResource};
use crate::types::{
    Access, BlockId, BlockState, CompletedUses, DeviceBlock, NeverUsed, StreamId, Tag,
};

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
        deallocate_on(&self.core, block)
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

    /// Before queuing work on `use_stream` that touches `block`: queues the
    /// waits it needs (forwards to the inner resource).
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::prepare_block_use`].
    pub fn prepare_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.core.hook_uses.fetch_add(1, Ordering::SeqCst);
        self.inner.prepare_block_use(block, use_stream, access)
    }

    /// Records a use of `block` on `use_stream` (forwards to the inner
    /// resource).
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::record_block_use`].
    pub fn record_block_use(
        &self,
        block: &DeviceBlock,
        use_stream: StreamId,
    ) -> ResourceResult<()> {
        self.core.hook_uses.fetch_add(1, Ordering::SeqCst);
        self.inner.record_block_use(block, use_stream)
    }

    /// After queuing work on `use_stream` that touches `block`: records the
    /// use in the inner resource and returns a future that completes when
    /// the GPU has executed that work.
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::finish_block_use`]; an unknown stream, and
    /// a stream being captured into a CUDA graph
    /// ([`StreamCapturing`](crate::ResourceError::StreamCapturing)), are
    /// refused before the inner resource is touched. Inside a capture, a
    /// use runs at each replay, not now: the stream-ordered resource
    /// records no event for it ([`record_block_use`](Self::record_block_use)
    /// is accepted and keeps the uses recorded before); await the graph's
    /// launch instead. On any error no use is recorded (the completion
    /// point is made first and let go if the inner resource refuses): the
    /// work queued on `use_stream` is not ordered before the block's free,
    /// so call again, or keep the block until that work is known done.
    ///
    /// # Stream ordering
    /// The future covers everything queued on `use_stream` before the call.
    pub fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<EventFuture> {
        self.core
            .notifier(use_stream)?
            .refuse_capturing(&*self.core.gpu)?;
        // Counted before the use is visible, and kept on failure: a count
        // too high only makes a later drop's free an ordinary one.
        self.core.hook_uses.fetch_add(1, Ordering::SeqCst);
        if !matches!(self.inner.block_state(block), Some(BlockState::Live) | None) {
            // A block known not live is refused below; no point is made
            // for it, so bad input makes no driver call.
            self.inner.finish_block_use(block, use_stream, access)?;
            return EventFuture::point_outside_capture(&self.core, use_stream);
        }
        // The point first: its event, recorded after the work, covers it
        // whichever is recorded first, and a point that cannot be made
        // leaves nothing behind. A refused use drops the point (released).
        let done = EventFuture::point_outside_capture(&self.core, use_stream)?;
        self.inner.finish_block_use(block, use_stream, access)?;
        Ok(done)
    }

    /// A future that completes when the GPU has executed everything queued
    /// on `stream` before the call.
    ///
    /// # Errors
    /// [`UnknownStream`](crate::ResourceError::UnknownStream),
    /// [`WrongDevice`](crate::ResourceError::WrongDevice), a driver error;
    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing) while
    /// `stream` is being captured into a CUDA graph (the point's event
    /// would be part of the graph and could never be awaited without
    /// invalidating the capture): await the graph's launch instead.
    ///
    /// # Captures
    /// Refused at creation rather than completed at a replay: a replay's
    /// completion is a point recorded after the launch, outside the capture
    /// (see [`CapturedGraph::launch`](crate::CapturedGraph::launch)). One `cuStreamGetCaptureInfo` per call tells.
    pub fn completion(&self, stream: StreamId) -> ResourceResult<EventFuture> {
        EventFuture::point(&self.core, stream)
    }

    /// A future that completes when the GPU has executed everything queued
    /// on `stream` before the call, and that records nothing until it is
    /// polled: for a completion awaited right away, as a task that queues
    /// work and awaits it does.
    ///
    /// Making it costs no driver call (but the capture check of
    /// [`completion`](Self::completion)). Its polls ask the stream
    /// (`cuStreamQuery`) where a [`completion`](Self::completion) queries
    /// the event it recorded: on the first poll once, then for
    /// [`WaitPolicy::spin`]. When the stream is idle the future is done
    /// with that one call and no event at all, and every point of the
    /// stream made before the query is settled with it. When the stream is
    /// still busy after the spin, the future records its event then and
    /// waits on it as a [`completion`](Self::completion) does (yielding,
    /// then parking on a notification).
    ///
    /// # Completes later than its point, when others feed the stream
    /// The stream is idle only once everything queued on it has run, and
    /// the event recorded after the spin covers what was queued until
    /// then: work queued on `stream` after the call and before the first
    /// poll's spin ends (by this thread or another) delays it. Made long
    /// before it is polled, in a loop that queues more behind it, it may
    /// complete only when the stream drains: use
    /// [`completion`](Self::completion) there, whose event marks the point
    /// exactly.
    ///
    /// # Errors
    /// As [`completion`](Self::completion) when made; when polled, the
    /// driver's error of the query or of the late record (a device fault).
    ///
    /// # Captures
    /// Refused at creation as [`completion`](Self::completion) is. A stream
    /// that begins a capture before the first poll is never queried (a
    /// query would invalidate the capture): the future then completes
    /// after the capture ends, by a notification.
    pub fn completion_lazy(&self, stream: StreamId) -> ResourceResult<EventFuture> {
        EventFuture::lazy_point(&self.core, stream)
    }

    /// [`completion`](Self::completion) on a stream the caller just found
    /// not capturing.
    pub(crate) fn completion_outside_capture(
        &self,
        stream: StreamId,
    ) -> ResourceResult<EventFuture> {
        EventFuture::point_outside_capture(&self.core, stream)
    }

    /// How completion futures made from now on wait before parking on a
    /// notification (default [`WaitPolicy::DEFAULT`]).
    pub fn set_wait_policy(&self, policy: WaitPolicy) {
        self.core.policy.set(policy);
    }

    /// The current [`WaitPolicy`].
    pub fn wait_policy(&self) -> WaitPolicy {
        self.core.policy.get()
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

    /// Bytes outstanding in the inner resource (live plus pending frees).
    pub fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding()
    }

    /// Allocations (and reservations) waiting for memory now.
    pub fn waiting_allocations(&self) -> usize {
        self.core.allocs.len()
    }

    /// The queue of waiting allocations: its length and oldest wait now,
    /// and how the requests that waited left it (served, failed,
    /// cancelled, with their waits). Takes the queue's lock once.
    pub fn queue_stats(&self) -> super::QueueStats {
        self.core.allocs.stats()
    }

    /// How long the oldest request waiting now has waited (`None` when
    /// none waits).
    pub fn oldest_wait(&self) -> Option<std::time::Duration> {
        self.core.allocs.stats().oldest_wait
    }

    /// Points (futures and awaited frees) waiting for a notification now.
    pub fn parked_points(&self) -> usize {
        self.core.notifiers().iter().map(|n| n.waiter_count()).sum()
    }

    /// Notifications (host functions) queued so far, on all streams. With
    /// coalescing it stays far below the number of awaited points.
    pub fn notifications(&self) -> u64 {
        self.core.notifiers().iter().map(|n| n.launches()).sum()
    }

    /// Where the memory of the stack is, now: every layer's part (see
    /// [`MemorySnapshot`]), the allocations waiting, and this device's
    /// events of the [history](crate::record_memory_history) if it is on.
    ///
    /// It copies under each layer's locks in turn, never across a driver
    /// call that waits, and does not synchronize: it may be called from a
    /// task, while the stack serves others (`BENCHMARKS.md` says what it
    /// costs).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamalloc::ResourceError> {
    /// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::new(), 1);
    /// let res = AsyncResource::on(&device)?;
    /// let block = res.allocate(1 << 20, device.stream(0)?, AllocTag("weights")).await?;
    /// let snapshot = res.snapshot();
    /// assert_eq!(snapshot.bytes_by_tag(), vec![("weights", 1 << 20)]);
    /// # drop(res.deallocate(block)?);
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&self) -> MemorySnapshot {
        let mut snapshot = MemorySnapshot::new(self.inner.device_ordinal());
        snapshot.waiters = Some(WaitersInfo {
            waiting: self.core.allocs.len(),
            parked_points: self.parked_points(),
        });
        self.inner.snapshot_into(&mut snapshot);
        let device = snapshot.device;
        snapshot.history = history::memory_history()
            .into_iter()
            .filter(|e| e.device == device)
            .collect();
        snapshot.date_blocks_from_history();
        snapshot
    }

    /// The long form of an out-of-memory or budget error `error` of this
    /// stack: what was asked and free, what the cache holds idle and its
    /// largest idle range, the frees pending on the GPU, the tags holding
    /// the most (see [`OomReport`]), from a [`snapshot`](Self::snapshot)
    /// taken now: call it right after the error. `None` for other errors.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamalloc::ResourceError> {
    /// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::builder().capacity(1 << 20).build(), 1);
    /// let res = AsyncResource::on(&device)?;
    /// let err = res.allocate(2 << 20, device.stream(0)?, AllocTag("big")).await.unwrap_err();
    /// println!("{err}");                               // one line
    /// println!("{}", res.oom_report(&err).unwrap());   // who holds what
    /// # Ok(()) }
    /// ```
    pub fn oom_report(&self, error: &ResourceError) -> Option<OomReport> {
        OomReport::new(error, &self.snapshot())
    }

    /// How this resource's completion futures waited so far, summed over
    /// its streams (see [`WaitStats`]).
    pub fn wait_stats(&self) -> WaitStats {
        let mut total = WaitStats::default();
        for n in self.core.notifiers() {
            total.add(&n.stats());
        }
        total
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

/// [`AsyncResource::deallocate`] through the core alone (its `inner` is the
/// same resource, erased).
fn deallocate_on(core: &Arc<Core>, block: DeviceBlock) -> ResourceResult<DeallocHandle> {
    let (stream, free_seq, point) = queue_free(core, block)?;
    Ok(DeallocHandle::new(core.clone(), stream, free_seq, point))
}

/// A free nobody awaits (an owned buffer's drop): queued and accounted as
/// [`AsyncResource::deallocate`]'s, with no handle made. When the host
/// saw the block's stream reach point `done_at` (the completion of the
/// buffer's last launch: a notification delivered or an event queried
/// done, never a future dropped), nothing used the buffer since, and no
/// use began through the resource's hooks since either, the GPU is done
/// with the block and the inner resource is told so
/// ([`deallocate_completed`](DeviceMemoryResource::deallocate_completed)).
///
/// # Errors
/// As [`AsyncResource::deallocate`]; nothing changes.
pub(crate) fn deallocate_detached(
    core: &Core,
    block: DeviceBlock,
    done_at: Option<DoneAt>,
) -> ResourceResult<()> {
    free_detached(core, block, Seen::DoneAt(done_at), true)
}

/// The free of a block a reservation's failed try took in the same poll
/// (all or nothing), `hook_uses` the resource's count of hook uses when
/// the try began: as [`deallocate_detached`], but it does not tell the
/// wait queue that memory came back. Only the queue's head tries, and
/// that head is the reservation itself: the memory is what it just could
/// not use, and announcing it would make it try again at once, give back
/// again, and spin (a reservation that waited for memory burnt a worker
/// and churned the cache until others freed). Frees it queues below are
/// announced when they land, as any.
///
/// The block never left the try: no buffer was made of it and nothing
/// was launched on it, so when no use began through the resource's hooks
/// since the try began either (a caller naming its id there), nothing
/// touched it, and the inner resource is told so
/// ([`deallocate_unused`](DeviceMemoryResource::deallocate_unused)): a
/// cache puts the memory back as it was, rather than as a free at the end
/// of the reservation's stream, which the next stream to take it would
/// wait for on the GPU.
pub(crate) fn give_back_failed_try(
    core: &Core,
    block: DeviceBlock,
    hook_uses: u64,
) -> ResourceResult<()> {
    free_detached(core, block, Seen::Untouched { hook_uses }, false)
}

/// The free of a block a [`MemoryReservation`](super::MemoryReservation)
/// still held when it was dropped, `hook_uses` the resource's count of
/// hook uses when the try that took it began: as [`deallocate_detached`]
/// (announced to the wait queue: the memory is back for anyone), and told
/// to the inner resource as unused
/// ([`deallocate_unused`](DeviceMemoryResource::deallocate_unused)) when
/// no use began through the resource's hooks since.
///
/// Nothing touched such a block, as nothing touched a failed try's: a
/// reservation hands out a block only as a buffer, which takes it out
/// (no accessor gives a block, its id or its address), so a block still
/// in it was never a buffer, and the crate queued no work on it; user
/// code could reach it only by building its descriptor from an id or an
/// address learnt elsewhere and naming it to the hooks, which the count
/// sees. (Uses named to the stack's own hooks, past this resource, and a
/// sleep's restore are the cache's to see: it frees a lease it saw used
/// as an ordinary free, whatever the caller says.)
pub(crate) fn give_back_unhanded(
    core: &Core,
    block: DeviceBlock,
    hook_uses: u64,
) -> ResourceResult<()> {
    free_detached(core, block, Seen::Untouched { hook_uses }, true)
}

/// What the host knows of a block's uses at a detached free.
enum Seen {
    /// The completion of its last launch, if it had one and it was made
    /// through the resource.
    DoneAt(Option<DoneAt>),
    /// None was ever queued, if no use began through the hooks since the
    /// resource's count of them was `hook_uses`.
    Untouched { hook_uses: u64 },
}

fn free_detached(
    core: &Core,
    block: DeviceBlock,
    seen: Seen,
    announce: bool,
) -> ResourceResult<()> {
    let stream = block.stream();
    let notifier = core.notifier(stream)?;
    let id = block.id();
    let hooks_now = || core.hook_uses.load(Ordering::SeqCst);
    let freed = FreedBlock::of(&block);
    match seen {
        // Only what the host saw proves the GPU done: a point settled
        // because its future was dropped (a cancelled request) or failed
        // says nothing. Seen reached, and no use began through the hooks
        // since: every use of the block ran.
        Seen::DoneAt(Some(d)) if d.hook_uses == hooks_now() && notifier.seen_reached(d.point) => {
            let completed = CompletedUses::new(block.id());
            core.inner.deallocate_completed(block, completed)?;
        }
        // Never out of the caller's hands, and no use named it to the
        // hooks meanwhile: nothing touched it.
        Seen::Untouched { hook_uses } if hook_uses == hooks_now() => {
            let unused = NeverUsed::new(block.id());
            core.inner.deallocate_unused(block, unused)?;
        }
        _ => core.inner.deallocate(block)?,
    }
    if core.tracks_holdings() {
        core.holdings.freed(id);
    }
    // A free that queued nothing new below (a cache took the block back:
    // its bytes never left it) has nothing for a notification to apply,
    // and nobody awaits it: no point, no notification. (Each one used to
    // keep a host function in flight per stream while a service ran.)
    // Otherwise, as a handle dropped unawaited: the free stays queued in
    // the notifier, and its bytes leave the accounting when it lands.
    let queued_below = notifier.mark_free_if_new(core.inner.pending_free_seq(stream));
    freed.record(queued_below);
    if queued_below {
        notifier.launch(&*core.gpu);
        core.kick.pending();
    }
    core.mark_frees_elsewhere(Some(stream));
    // Memory freed on a stream is reusable on it at once.
    if announce {
        core.allocs.memory_returned();
    }
    Ok(())
}

/// Queues the free and its notification: (stream, free sequence, point).
fn queue_free(core: &Core, block: DeviceBlock) -> ResourceResult<(StreamId, u64, u64)> {
    let stream = block.stream();
    let notifier = core.notifier(stream)?;
    let id = block.id();
    let freed = FreedBlock::of(&block);
    let before = match freed.0 {
        Some(_) => core.inner.pending_free_seq(stream),
        None => 0,
    };
    core.inner.deallocate(block)?;
    if core.tracks_holdings() {
        core.holdings.freed(id);
    }
    let free_seq = core.inner.pending_free_seq(stream);
    freed.record(free_seq != before);
    let point = notifier.mark_free(free_seq);
    notifier.launch(&*core.gpu);
    core.mark_frees_elsewhere(Some(stream));
    core.kick.pending();
    // Memory freed on a stream is reusable on it at once.
    core.allocs.memory_returned();
    Ok((stream, free_seq, point))
}

/// A block being freed, as the history records it (taken only while the
/// history is on: the descriptor moves into the free).
struct FreedBlock(Option<DeviceBlock>);

impl FreedBlock {
    fn of(block: &DeviceBlock) -> Self {
        FreedBlock(history::recording().then(|| block.clone()))
    }

    /// Records the free as requested, and as completed at once when it
    /// queued nothing below (a cache took the block back: its stream may
    /// reuse it now); a free queued below completes when a reap drains it.
    fn record(self, queued_below: bool) {
        let Some(block) = self.0 else { return };
        let event = |action| {
            MemoryEvent::new(action, block.stream().device())
                .on(block.stream())
                .at(block.ptr(), block.size())
                .tagged(block.tag())
        };
        history::record(|| event(MemoryAction::FreeRequested));
        if !queued_below {
            history::record(|| event(MemoryAction::FreeCompleted));
        }
    }
}
