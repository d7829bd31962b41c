//! The resource layer: the [`DeviceMemoryResource`] trait and its
//! stream-ordered implementation, written once over the gpu seam.
//!
//! [`StreamOrderedResource<G>`](StreamOrderedResource) holds the bookkeeping:
//! which blocks are live, which uses each block has on which stream, and which
//! frees are queued but not yet executed. [`AsyncCudaResource`] is its cudarc
//! instance and [`SimResource`] its simulated one.

#![deny(unsafe_code)]

pub(crate) mod block_uses;
mod charge;
pub(crate) mod event_pool;
pub(crate) mod forward;
mod live_table;
mod offload_host;
mod pending;
pub(crate) mod relief;
mod shard;
mod sleep_plan;
mod stream_ordered;
pub(crate) mod unwind;
#[cfg(all(test, loom))]
pub(crate) use stream_ordered::loom_tests::race_two_frees;

pub use charge::MappingCharge;
pub use offload_host::OffloadHost;
pub use relief::BudgetRelief;
pub use sleep_plan::{SleepMode, SleepPlan};
#[cfg(feature = "cuda")]
pub use stream_ordered::AsyncCudaResource;
pub use stream_ordered::{SimResource, StreamOrderedResource};

use std::sync::Arc;

use crate::device::stream_pool::StreamPool;
use crate::error::ResourceResult;
use crate::gpu::{CaptureId, CaptureStatus, Gpu};
use crate::observe::MemorySnapshot;
use crate::types::{
    Access, AllocTag, BlockId, BlockState, CompletedUses, DeviceBlock, NeverUsed, StreamId,
};

/// The device behind a resource: its backend and the streams the resource
/// orders work on. A tier above that manages device memory itself (the
/// cache's virtual-memory arena) gets it from
/// [`DeviceMemoryResource::device_access`].
///
/// A layer that lends the device while it counts what the device holds
/// (a [`BudgetResource`](crate::BudgetResource)) adds its
/// [`MappingCharge`] to `charges`: the tier charges every byte of physical
/// memory before creating it and releases it after giving it back.
#[derive(Clone)]
pub struct DeviceAccess {
    /// The backend.
    pub gpu: Arc<dyn Gpu>,
    /// The streams, resolved as the resource resolves them.
    pub streams: Arc<StreamPool>,
    /// What the layers lending the device charge for the memory a tier
    /// above creates on it, lowest layer first; empty for the
    /// stream-ordered resource itself.
    pub charges: Vec<Arc<dyn MappingCharge>>,
}

impl DeviceAccess {
    /// The same access with `charge` added: a layer lending the device
    /// counts the memory a tier above creates on it.
    pub fn with_charge(mut self, charge: Arc<dyn MappingCharge>) -> Self {
        self.charges.push(charge);
        self
    }

    /// Charges `bytes` to every layer lending the device, in order; when
    /// one refuses, gives them back to those that had accepted and
    /// returns its refusal.
    ///
    /// # Errors
    /// The first refusal (a budget's
    /// [`BudgetExceeded`](crate::ResourceError::BudgetExceeded)); nothing
    /// stays charged then.
    pub fn try_charge(&self, bytes: usize) -> ResourceResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        for (at, charge) in self.charges.iter().enumerate() {
            if let Err(refused) = charge.try_charge(bytes) {
                for accepted in self.charges[..at].iter().rev() {
                    accepted.release(bytes);
                }
                return Err(refused);
            }
        }
        Ok(())
    }

    /// Gives `bytes` charged by [`try_charge`](Self::try_charge) back to
    /// every layer, once the device has the memory back.
    pub fn release_charge(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        for charge in self.charges.iter().rev() {
            charge.release(bytes);
        }
    }
}

impl std::fmt::Debug for DeviceAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAccess")
            .field("device", &self.gpu.ordinal())
            .field("streams", &self.streams.len())
            .field("charges", &self.charges)
            .finish()
    }
}

/// A source of device memory ordered on streams.
///
/// Every method is callable from any thread. Implementations are the
/// stream-ordered resource and the decorators that wrap one.
///
/// The trait is `unsafe` to implement because the crate takes a resource at
/// its word: the blocks it hands out become [`Buffer`](crate::Buffer)s whose
/// safe methods (fills, copies, cudarc's `memcpy_htod` into a
/// `CudaBuffer`, kernels given their address) make the
/// driver write there, and its streams order that work. The crate cannot
/// check that an address is memory the resource owns; whoever writes
/// `unsafe impl` vouches for it, once, for every safe call after.
///
/// Every method that moves bytes or tracks uses is required, with no
/// default: a layer that left one out would lose frees or uses silently. A
/// decorator writes what it changes and forwards the rest with
/// [`forward_to_inner!`](crate::forward_to_inner):
///
/// ```
/// use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, ResourceResult, StreamId};
///
/// /// Counts allocations, changes nothing else.
/// struct Counting<R> {
///     inner: R,
///     allocations: std::sync::atomic::AtomicU64,
/// }
///
/// // SAFETY: every block and stream comes from `inner` unchanged, and
/// // every other call is `inner`'s own.
/// unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for Counting<R> {
///     fn allocate(&self, bytes: usize, stream: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
///         let block = self.inner.allocate(bytes, stream, tag)?;
///         self.allocations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         Ok(block)
///     }
///     streamalloc::forward_to_inner!(inner; all_but_allocate);
/// }
/// ```
///
/// # Methods, by group
///
/// Each group is also a name [`forward_to_inner!`](crate::forward_to_inner)
/// takes, so a decorator forwards a whole group it does not change in one
/// word (`forward_to_inner!(inner; frees, use_tracking)`).
///
/// ## Allocating
/// [`allocate`](Self::allocate), [`deallocate`](Self::deallocate),
/// [`device_ordinal`](Self::device_ordinal),
/// [`bytes_outstanding`](Self::bytes_outstanding): required, the core of
/// the contract. [`device_access`](Self::device_access) (provided, `None`)
/// lets a tier above map memory itself.
///
/// ## Frees
/// [`deallocate_completed`](Self::deallocate_completed) and
/// [`deallocate_unused`](Self::deallocate_unused) (provided: a plain
/// `deallocate`), [`reap_pending`](Self::reap_pending),
/// [`pending_free_seq`](Self::pending_free_seq),
/// [`reap_through`](Self::reap_through), [`release_idle`](Self::release_idle),
/// [`frees_across_streams`](Self::frees_across_streams): when a queued free
/// has run and its bytes are back, and memory held back given up. Required:
/// a layer that dropped one would lose frees. And
/// [`frees_only_queue`](Self::frees_only_queue) (provided, `false`): whether
/// a free can lower the count at once. Macro group `frees`.
///
/// ## Use tracking
/// [`supports_block_use_tracking`](Self::supports_block_use_tracking),
/// [`record_block_use`](Self::record_block_use),
/// [`prepare_block_use`](Self::prepare_block_use),
/// [`finish_block_use`](Self::finish_block_use), and
/// [`block_state`](Self::block_state) (provided, `None`): uses of a block on
/// streams other than its own. Required but `block_state`: a layer that
/// dropped one would lose a use and let a free race it. Macro group
/// `use_tracking`.
///
/// ## Capture
/// [`capture_status`](Self::capture_status),
/// [`release_capture`](Self::release_capture): memory that belongs to a CUDA
/// graph's capture. Required. Macro group `capture`.
///
/// ## Costs
/// [`allocation_cost`](Self::allocation_cost),
/// [`allocation_cost_is_exact`](Self::allocation_cost_is_exact),
/// [`allocation_limit`](Self::allocation_limit),
/// [`budget_reliefs`](Self::budget_reliefs): what a budget above counts and
/// whom it asks for memory. Required. Macro group `costs`.
///
/// ## Sleep
/// [`begin_sleep`](Self::begin_sleep), [`settle_sleep`](Self::settle_sleep),
/// [`wake`](Self::wake): giving physical memory back while keeping
/// addresses. Provided (nothing sleeps). Macro group `sleep`.
///
/// ## Observing
/// [`snapshot_into`](Self::snapshot_into),
/// [`visit_layers`](Self::visit_layers): what the stack shows of itself.
/// Provided (a layer that leaves them out hides itself and nothing else).
/// Macro group `observing`.
///
/// A resource written without `unsafe` does not compile, so safe code cannot
/// hand out another resource's live block or an address it made up:
///
/// ```compile_fail,E0200
/// use streamalloc::{AllocTag, BlockId, DeviceBlock, DeviceMemoryResource, ResourceId};
/// use streamalloc::{ResourceResult, StreamId};
///
/// struct Forger<R>(R);
///
/// impl<R: DeviceMemoryResource> DeviceMemoryResource for Forger<R> {
///     fn allocate(&self, bytes: usize, stream: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
///         // Some address the resource does not own.
///         Ok(DeviceBlock::new(BlockId::new(ResourceId::fresh(), 1), 0x7f00_0000_0000, bytes, stream, tag))
///     }
///     streamalloc::forward_to_inner!(0; all_but_allocate);
/// }
/// ```
///
/// # Safety
/// The crate hands the addresses and streams of a resource to the driver
/// without further checks, so an implementation promises:
/// 1. every block [`allocate`](Self::allocate) returns names `size` bytes
///    of device memory from `ptr` (none, at address 0, for zero bytes) on
///    the device of the stream pool that resolves `stream`, valid on
///    `stream` (the block's [`stream`](DeviceBlock::stream) is the id it was
///    given) from the allocation on, and handed to that caller alone until
///    it comes back through [`deallocate`](Self::deallocate),
///    [`deallocate_completed`](Self::deallocate_completed) or
///    [`deallocate_unused`](Self::deallocate_unused);
/// 2. streams are resolved only through that one pool (an id of another
///    pool is refused): the backend of the device whose memory it hands
///    out is the one that runs the work the crate orders on them;
/// 3. `deallocate` and the hooks refuse, changing nothing, a block this
///    resource did not hand out or that was already returned: they judge a
///    [`DeviceBlock`] by their own books (id, address, size and stream),
///    never by the descriptor's word, since safe code can build one; after
///    a block is accepted its memory goes to no one else before the work
///    ordered before the free, and the uses recorded, have run;
/// 4. [`deallocate_completed`](Self::deallocate_completed) skips ordering
///    only on the [`CompletedUses`] proof it was given, and
///    [`deallocate_unused`](Self::deallocate_unused) only on the
///    [`NeverUsed`] one;
/// 5. the hooks ([`prepare_block_use`](Self::prepare_block_use),
///    [`finish_block_use`](Self::finish_block_use),
///    [`record_block_use`](Self::record_block_use)) and the capture calls
///    do what they document, forwarded to whatever really owns the memory,
///    and [`supports_block_use_tracking`](Self::supports_block_use_tracking)
///    answers `true` only when they do;
/// 6. [`device_access`](Self::device_access) gives only the backend and pool
///    of the memory's own device.
///
/// A decorator that only passes blocks and calls to the resource it wraps,
/// or hands out parts of its blocks, keeps all of this by construction; its
/// SAFETY comment says which.
///
/// # Stream ordering
/// A block is valid on its allocation stream from the allocation on. Work on
/// another stream must be ordered after the allocation and before the free:
/// [`prepare_block_use`](Self::prepare_block_use) before queuing the work and
/// [`finish_block_use`](Self::finish_block_use) after it do both, on resources
/// that [`support`](Self::supports_block_use_tracking) it.
#[allow(unsafe_code)] // the resource contract the crate trusts.
pub unsafe trait DeviceMemoryResource: Send + Sync {
    // ---- Allocating ----

    /// Allocates `bytes` bytes on the resource's device, ordered on `stream`.
    /// The returned block is in [`BlockState::Live`].
    ///
    /// Zero bytes is accepted (as `cuMemAllocAsync` does): the block has
    /// address 0, counts no bytes, and is deallocated like any other.
    ///
    /// # Errors
    /// [`OutOfMemory`](crate::ResourceError::OutOfMemory),
    /// [`UnknownStream`](crate::ResourceError::UnknownStream),
    /// [`WrongDevice`](crate::ResourceError::WrongDevice), or a driver error;
    /// nothing changes.
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock>;

    /// Returns `block` to the resource. Afterwards the block is
    /// [`BlockState::Retired`] (or [`BlockState::Quarantined`] for debug
    /// guards). Reuse of the memory respects the stream-ordered contract.
    ///
    /// # Errors
    /// [`DoubleFree`](crate::ResourceError::DoubleFree),
    /// [`FreeInFlight`](crate::ResourceError::FreeInFlight) (another thread
    /// is freeing the same block right now),
    /// [`ForeignBlock`](crate::ResourceError::ForeignBlock),
    /// [`UnknownBlock`](crate::ResourceError::UnknownBlock),
    /// [`WrongDevice`](crate::ResourceError::WrongDevice), or a driver error;
    /// nothing changes.
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()>;

    /// CUDA device ordinal this resource serves; a resource is pinned to one
    /// device.
    fn device_ordinal(&self) -> u32;

    /// Bytes outstanding: live plus retired but not yet freed.
    ///
    /// # Consistency under concurrency
    /// Exact at any quiescent moment. While other threads allocate and reap,
    /// the stream-ordered resource sums per-shard counts read one after the
    /// other: each is exact when read, and a block is never missed while it
    /// moves from live to pending (that move stays within its shard), nor an
    /// allocation that returned before the call. But the total may combine
    /// reads from different moments: bytes reaped in one shard after it was
    /// read and allocated in another before it was read are counted twice,
    /// so a monitor can read more than was ever outstanding at one instant
    /// (never less than what was outstanding throughout the call). A
    /// [`Budget`](crate::Budget) built on it only releases late, never
    /// early; read [`Budget::in_use`](crate::Budget::in_use) for one
    /// consistent total across resources.
    fn bytes_outstanding(&self) -> usize;

    /// The backend and streams behind this resource, for a tier above it
    /// that manages device memory itself (the cache's virtual-memory arena
    /// maps physical memory with it instead of allocating through this
    /// resource).
    ///
    /// The default is `None`, and decorators keep it unless they can see
    /// what they must of a tier that maps memory itself: a debug guard, a
    /// statistics layer or a tracing layer counts blocks (their frees,
    /// their uses, their tags), which a mapped tier's blocks never pass
    /// through, so a tier above them allocates through them. A
    /// [`BudgetResource`](crate::BudgetResource) lends: it counts device
    /// bytes, not blocks, and returns its inner resource's access with a
    /// [`MappingCharge`] added ([`DeviceAccess::charges`]), which the tier
    /// asks before creating physical memory and gives the bytes back to
    /// after releasing it. So the budget stays exact: it counts every byte
    /// the device holds for the layers above it, blocks below it and
    /// mappings beside it, from before the memory exists to after it is
    /// gone. A [`RetryOnOomResource`](crate::RetryOnOomResource) lends
    /// its inner resource's access unchanged: it counts nothing, and the
    /// tier's growth makes its own retry (idle mappings given back first).
    fn device_access(&self) -> Option<DeviceAccess> {
        None
    }

    // ---- Frees ----

    /// Returns `block`, whose every use the GPU has completed, to the
    /// resource: as [`deallocate`](Self::deallocate), and a layer that
    /// hands memory between streams (the cache's arena) may then give it
    /// to any stream at once, with no fence and no stream waiting on the
    /// freeing stream's queued work. `completed` is the crate's proof of
    /// it (see [`CompletedUses`]). The provided method drops the proof and
    /// calls `deallocate`: an ordinary stream-ordered free, always correct,
    /// only slower to reuse.
    ///
    /// [`AsyncResource`](crate::AsyncResource) calls it when an
    /// owned buffer is dropped after the completion of its last launch
    /// settled: a request that awaited its work before letting its buffers
    /// go frees memory every stream may use as it is.
    ///
    /// # Errors
    /// As [`deallocate`](Self::deallocate);
    /// [`UnknownBlock`](crate::ResourceError::UnknownBlock) when
    /// `completed` names another block. Nothing changes.
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        let _ = completed;
        self.deallocate(block)
    }

    /// Returns `block`, on which no work was ever queued, to the resource:
    /// as [`deallocate`](Self::deallocate), and a layer that placed it
    /// in memory other streams used before (the cache's arena) may undo
    /// the placement, putting the memory back as it was before the block
    /// was handed out (ordered after the frees it was ordered after then),
    /// rather than as a free at the current end of the block's stream.
    /// `unused` is the crate's proof of it (see [`NeverUsed`]). The
    /// provided method drops the proof and calls `deallocate`: an
    /// ordinary stream-ordered free, always correct.
    ///
    /// [`AsyncResource::reserve`](crate::AsyncResource::reserve) calls it
    /// for the blocks a try took before one of its sizes was refused, and
    /// a dropped [`MemoryReservation`](crate::MemoryReservation) for the
    /// blocks it never handed out: an ordinary free would order the next
    /// stream to take that memory after all the work queued on the
    /// reservation's stream, none of which touched it.
    ///
    /// # Errors
    /// As [`deallocate`](Self::deallocate);
    /// [`UnknownBlock`](crate::ResourceError::UnknownBlock) when `unused`
    /// names another block. Nothing changes.
    ///
    /// # Stream ordering
    /// The memory is ordered for its next user as it was before this
    /// block's allocation: what the allocation's stream was made to wait
    /// for stays queued there (a wait on the GPU cannot be taken back), and
    /// the memory keeps every tag no fence was seen past.
    fn deallocate_unused(&self, block: DeviceBlock, unused: NeverUsed) -> ResourceResult<()> {
        let _ = unused;
        self.deallocate(block)
    }

    /// Drains retired bytes whose free has completed: stream-ordered
    /// resources synchronize the streams with queued frees and re-count
    /// [`bytes_outstanding`](Self::bytes_outstanding); a decorator forwards
    /// to the resource it wraps (after releasing what it holds back, if it
    /// must); a resource that frees at once answers `Ok(())`.
    ///
    /// Required, like every method that moves bytes or tracks uses: a layer
    /// that left it out would answer `Ok` while the frees below it stay
    /// pending for good. Forward what a decorator does not change with
    /// [`forward_to_inner!`](crate::forward_to_inner).
    ///
    /// Called inside a poll of the crate's futures (an allocation awaited
    /// through [`AsyncResource`](crate::AsyncResource) reaches a
    /// decorator that reaps on its out-of-memory path), the stream-ordered
    /// resource does not synchronize: it returns at once, and the
    /// completion notifications apply the frees as they execute. A
    /// decorator's own override must not block either there.
    ///
    /// # Errors
    /// A driver error from the synchronize; what was drained stays drained.
    fn reap_pending(&self) -> ResourceResult<()>;

    /// The sequence number of the latest free queued on `stream` (0 if none,
    /// or for resources that do not queue frees). A completion point recorded
    /// on `stream` after a call of this method covers every free up to it.
    fn pending_free_seq(&self, stream: StreamId) -> u64;

    /// Tells the resource that `stream` has executed every free up to
    /// sequence number `seq` (learnt from a completion notification, without
    /// synchronizing): drains them from the pending tallies and returns the
    /// bytes drained. Decorators forward to the inner resource; a resource
    /// that queues no frees drains nothing (0).
    ///
    /// `seq` is meant to be a number [`pending_free_seq`](Self::pending_free_seq)
    /// returned: the stream-ordered resource tallies the frees queued between
    /// two such reads together, so a cut at a number it never returned may
    /// leave some frees below it pending (it never drains one above it).
    fn reap_through(&self, stream: StreamId, seq: u64) -> usize;

    /// Gives memory that no caller holds back to the layer below: a cache
    /// frees its idle blocks, a debug guard its quarantine. Returns the bytes
    /// given back (their frees may still be queued: reap to see them leave
    /// [`bytes_outstanding`](Self::bytes_outstanding)). Decorators pass the
    /// call on; a resource that holds nothing back answers `Ok(0)`.
    ///
    /// # Errors
    /// The first error of a free; what was given back before stays given
    /// back.
    fn release_idle(&self) -> ResourceResult<usize>;

    /// Whether a call of this resource (or one below it) may queue a free
    /// on a stream other than the one of the block it was given: a debug
    /// guard's eviction, a cache giving back a block cached on another
    /// stream. The futures layer then looks at every stream's
    /// [`pending_free_seq`](Self::pending_free_seq) after a free, so that
    /// those frees are reaped by notifications too. Decorators answer for
    /// themselves or their inner resource.
    fn frees_across_streams(&self) -> bool;

    /// Whether a free through this resource only queues: a successful
    /// [`deallocate`](Self::deallocate) or
    /// [`deallocate_completed`](Self::deallocate_completed) never lowers
    /// [`bytes_outstanding`](Self::bytes_outstanding) by itself (its bytes
    /// leave the count only when a reap drains them, or when
    /// [`release_idle`](Self::release_idle) gives idle memory back).
    ///
    /// The stream-ordered resource answers `true`: a free moves its block
    /// from live to pending, within the count. A cache answers `true` when
    /// nothing its frees do leaves the device at once (no cap makes them
    /// unmap) and its inner resource answers `true`; a decorator answers
    /// for itself and its inner resource. A
    /// [`BudgetResource`](crate::BudgetResource) above a resource that
    /// answers `true` reads nothing after a free (the pair's hot path);
    /// otherwise it reads what the resource holds after each free and
    /// releases what left.
    ///
    /// Provided, `false`, which is always correct: the budget then reads
    /// after every free. A layer that answers `true` and frees at once
    /// keeps those bytes counted against a budget above it until the next
    /// reap, release or refused reservation through the budget settles
    /// them (late, never early). Macro group `frees`.
    fn frees_only_queue(&self) -> bool {
        false
    }

    // ---- Use tracking ----

    /// Whether this resource, and every resource it wraps, tracks
    /// cross-stream uses. Decorators forward to the inner resource; a
    /// resource that does not track them answers `false`, and buffers then
    /// refuse uses on other streams.
    fn supports_block_use_tracking(&self) -> bool;

    /// Records that work touching `block` has been (or is being) queued on
    /// `use_stream`; on deallocate, the allocation stream waits for it.
    ///
    /// Decorators forward it. A resource that does not track uses says so
    /// in [`supports_block_use_tracking`](Self::supports_block_use_tracking)
    /// (callers ask it first, and buffers refuse cross-stream uses there)
    /// and has nothing to record here: `Ok(())`.
    ///
    /// # Errors
    /// As [`prepare_block_use`](Self::prepare_block_use).
    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()>;

    /// Before queuing work on `use_stream` that touches `block` with
    /// `access`: queues the waits that work needs (on the last write from
    /// another stream; for a write, also on other streams' reads).
    ///
    /// # Errors
    /// [`UnknownBlock`](crate::ResourceError::UnknownBlock),
    /// [`DoubleFree`](crate::ResourceError::DoubleFree) (a retired block),
    /// [`FreeInFlight`](crate::ResourceError::FreeInFlight) (a `deallocate`
    /// of the block is running on another thread), an unknown stream, a
    /// driver error; nothing changes.
    fn prepare_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()>;

    /// After queuing work on `use_stream` that touches `block`: records an
    /// event capturing that work and updates the block's dependencies.
    ///
    /// # Errors
    /// As [`prepare_block_use`](Self::prepare_block_use).
    fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()>;

    /// The current state of `block`, when this resource knows it.
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        let _ = block;
        None
    }

    // ---- Capture ----

    /// Whether `stream` is being captured into a CUDA graph, and by which
    /// capture, as the backend at the bottom of the stack reports it
    /// ([`Gpu::capture_status`]). Decorators forward to the inner resource;
    /// the stream-ordered resource asks the driver.
    ///
    /// A layer that hands memory out or takes it back asks this before it
    /// decides where the memory goes: memory handed out or freed on a
    /// capturing stream belongs to that capture's graph (see
    /// [`release_capture`](Self::release_capture)).
    ///
    /// # Errors
    /// [`UnknownStream`](crate::ResourceError::UnknownStream),
    /// [`WrongDevice`](crate::ResourceError::WrongDevice), or a driver error.
    fn capture_status(&self, stream: StreamId) -> ResourceResult<CaptureStatus>;

    /// The graph recorded by `capture` is gone (destroyed, or the capture
    /// failed and made none): the memory the stack gave to it may serve
    /// others once its last replay has run.
    ///
    /// Memory handed out on a stream while it was capturing, and memory
    /// freed on a capturing stream, belongs to the capture's graph: every
    /// replay of the graph touches it at the addresses the capture saw, so
    /// no layer gives it to anyone else until this call. Within the graph it
    /// is reused: a later allocation of the same capture on the same stream
    /// may get a range freed earlier in the capture, and replays, which run
    /// the same addresses in the same order, need nothing more.
    ///
    /// `after` is a stream whose current end is ordered after every replay
    /// of the graph: CUDA runs the launches of one executable graph one
    /// after the other, so the stream of its last launch; for a graph never
    /// launched, or a capture that made no graph, the stream the capture
    /// was begun on. The memory returns to general use behind that point,
    /// through events (never a synchronize): the caching tier makes the
    /// memory's streams wait for `after`; the stream-ordered resource counts
    /// the frees the graph made as queued on `after`, reaped as any free is.
    /// Blocks the graph allocated that a user still holds stay live, and
    /// their later free is ordered after the replays too.
    ///
    /// Call it once per capture, after the capture ended, with no launch of
    /// its graph queued afterwards. Decorators forward it (a budget then
    /// settles what the layers below gave back).
    ///
    /// # Errors
    /// [`WrongDevice`](crate::ResourceError::WrongDevice),
    /// [`UnknownStream`](crate::ResourceError::UnknownStream) for `after`,
    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing) when
    /// `after` is capturing (no point on it can be waited for yet): nothing
    /// changes. A driver error part way: what was returned stays returned,
    /// the rest stays with the graph, and a later call returns it.
    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()>;

    // ---- Costs ----

    /// How much [`bytes_outstanding`](Self::bytes_outstanding) would grow if
    /// `bytes` were allocated on `stream` now: the new memory the allocation
    /// takes from the device.
    ///
    /// `bytes` for a resource that allocates every request as asked; a cache
    /// answers 0 when memory it holds already serves the request (a cached
    /// block, or free pages its arena has mapped), and the rounded size
    /// when it does not. A
    /// [`BudgetResource`](crate::BudgetResource) reserves this much,
    /// so that it counts what the layers below really take. Decorators
    /// forward to the inner resource. Between threads it is an estimate: the
    /// budget settles the difference after the allocation.
    fn allocation_cost(&self, bytes: usize, stream: StreamId) -> usize;

    /// Whether [`allocation_cost`](Self::allocation_cost) is exactly what an
    /// allocation made right after takes from the device (on one thread).
    ///
    /// `true` for a resource that allocates every request as asked. A cache answers `false`: its cost is a guess made before it
    /// places the block (the virtual-memory arena may need one page more
    /// than the estimate when the block straddles a page, or new pages
    /// where its idle ones are scattered), so a
    /// [`BudgetResource`](crate::BudgetResource) above it counts
    /// what the inner resource holds after every allocation instead of
    /// trusting the estimate. Decorators forward to the inner resource.
    fn allocation_cost_is_exact(&self) -> bool;

    /// The most bytes one allocation through this stack could ever take, if
    /// a layer limits it (a [`Budget`](crate::Budget)'s limit),
    /// else `None`. A request past it can never be served, so the futures
    /// layer refuses it at once instead of queueing it behind other waiters.
    /// Decorators answer for themselves or their inner resource.
    fn allocation_limit(&self) -> Option<usize>;

    /// Adds to `out` the relief list of each budget this resource or one
    /// below it charges (a [`Budget`](crate::Budget) shared with
    /// other stacks). The futures layer registers the whole stack with
    /// each ([`AsyncResource::from_arc`](crate::AsyncResource::from_arc)),
    /// so that a request refused under that budget on another stack asks
    /// this one for its idle memory, whatever the order of its layers (a
    /// cache above the budget included). Decorators add their inner
    /// resource's; a budget resource adds its budget's too; a resource at
    /// the bottom adds nothing.
    fn budget_reliefs(&self, out: &mut Vec<BudgetRelief>);

    // ---- Sleep ----

    /// Queues the sleep of the blocks of the tags `plan` names (see
    /// [`CachingResource::sleep`](crate::CachingResource::sleep)) in
    /// the outermost layer that can put memory to sleep, and returns the
    /// streams whose completion, once the host saw it, lets
    /// [`settle_sleep`](Self::settle_sleep) give the memory back.
    /// [`AsyncResource::sleep`](crate::AsyncResource::sleep) is the
    /// way to call it.
    ///
    /// Provided, as a refusal
    /// ([`SleepRefused`](crate::ResourceError::SleepRefused)): only a cache
    /// with a virtual-memory arena sleeps. Decorators forward it
    /// ([`forward_to_inner!`](crate::forward_to_inner), in
    /// `all_but_allocate`).
    ///
    /// # Errors
    /// As [`CachingResource::sleep`](crate::CachingResource::sleep).
    fn begin_sleep(&self, plan: &SleepPlan) -> ResourceResult<Vec<StreamId>> {
        let _ = plan;
        Err(crate::ResourceError::SleepRefused {
            reason: "no layer of the stack can sleep (a cache with a virtual-memory arena can)",
        })
    }

    /// Gives back the memory of the sleep in effect once the host saw its
    /// work complete (never waiting); true when nothing is left to give
    /// back. Provided: `Ok(true)`, nothing sleeps. Decorators forward it.
    ///
    /// # Errors
    /// A driver error of an unmap (kept for the next call).
    fn settle_sleep(&self) -> ResourceResult<bool> {
        Ok(true)
    }

    /// Wakes the sleep in effect (see
    /// [`CachingResource::wake`](crate::CachingResource::wake)) and
    /// returns the streams its restores were queued on. Provided, as a
    /// refusal. Decorators forward it.
    ///
    /// # Errors
    /// As [`CachingResource::wake`](crate::CachingResource::wake).
    fn wake(&self) -> ResourceResult<Vec<StreamId>> {
        Err(crate::ResourceError::SleepRefused {
            reason: "no layer of the stack can sleep (a cache with a virtual-memory arena can)",
        })
    }

    // ---- Observing ----

    /// Adds what this layer holds to `snapshot` (its blocks, ranges, queued
    /// frees, budget: see [`MemorySnapshot`]), then asks the layer it
    /// wraps. Each layer copies its part under its own locks and releases
    /// them before the next reads.
    ///
    /// Provided, as nothing: a snapshot moves no bytes, so a layer that
    /// leaves it out hides itself and what lies below it from the picture
    /// and breaks nothing else. Decorators forward it (with
    /// [`forward_to_inner!`](crate::forward_to_inner), in
    /// `all_but_allocate`) after adding their own part.
    fn snapshot_into(&self, snapshot: &mut MemorySnapshot) {
        let _ = snapshot;
    }

    /// Shows `visit` the handle of each layer of the stack that has one,
    /// outermost first: a statistics layer its
    /// [`Stats`](crate::Stats), a budget its
    /// [`Budget`](crate::Budget), a cache its
    /// [`CacheStats`](crate::CacheStats) as of now. This is how a
    /// built stack's layers are reached by type
    /// ([`AsyncResource::layer`](crate::AsyncResource::layer))
    /// rather than by counting `inner()`.
    ///
    /// A decorator shows its own handle, if any, then forwards
    /// (`forward_to_inner!` does, in `all_but_allocate`); a decorator that
    /// does not forward hides the layers below it from the look-up, and
    /// nothing else. The bottom resource has none (the default).
    fn visit_layers(&self, visit: &mut dyn FnMut(&dyn std::any::Any)) {
        let _ = visit;
    }
}

#[allow(unsafe_code)] // forwarded through an `Arc`.
// SAFETY: every method is the same method of the resource the `Arc` holds,
// which keeps the contract itself.
unsafe impl<R: DeviceMemoryResource + ?Sized> DeviceMemoryResource for std::sync::Arc<R> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        (**self).allocate(bytes, stream, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        (**self).deallocate(block)
    }
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        (**self).deallocate_completed(block, completed)
    }
    fn deallocate_unused(&self, block: DeviceBlock, unused: NeverUsed) -> ResourceResult<()> {
        (**self).deallocate_unused(block, unused)
    }
    fn device_ordinal(&self) -> u32 {
        (**self).device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        (**self).bytes_outstanding()
    }
    fn reap_pending(&self) -> ResourceResult<()> {
        (**self).reap_pending()
    }
    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        (**self).pending_free_seq(stream)
    }
    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        (**self).reap_through(stream, seq)
    }
    fn supports_block_use_tracking(&self) -> bool {
        (**self).supports_block_use_tracking()
    }
    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        (**self).record_block_use(block, use_stream)
    }
    fn prepare_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        (**self).prepare_block_use(b, s, a)
    }
    fn finish_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        (**self).finish_block_use(b, s, a)
    }
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        (**self).block_state(block)
    }
    fn device_access(&self) -> Option<DeviceAccess> {
        (**self).device_access()
    }

    fn allocation_cost(&self, bytes: usize, stream: StreamId) -> usize {
        (**self).allocation_cost(bytes, stream)
    }
    fn allocation_cost_is_exact(&self) -> bool {
        (**self).allocation_cost_is_exact()
    }
    fn frees_across_streams(&self) -> bool {
        (**self).frees_across_streams()
    }
    fn frees_only_queue(&self) -> bool {
        (**self).frees_only_queue()
    }
    fn release_idle(&self) -> ResourceResult<usize> {
        (**self).release_idle()
    }
    fn allocation_limit(&self) -> Option<usize> {
        (**self).allocation_limit()
    }
    fn budget_reliefs(&self, out: &mut Vec<BudgetRelief>) {
        (**self).budget_reliefs(out)
    }
    fn capture_status(&self, stream: StreamId) -> ResourceResult<CaptureStatus> {
        (**self).capture_status(stream)
    }
    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        (**self).release_capture(capture, after)
    }
    fn snapshot_into(&self, snapshot: &mut MemorySnapshot) {
        (**self).snapshot_into(snapshot)
    }
    fn visit_layers(&self, visit: &mut dyn FnMut(&dyn std::any::Any)) {
        (**self).visit_layers(visit)
    }
    fn begin_sleep(&self, plan: &SleepPlan) -> ResourceResult<Vec<StreamId>> {
        (**self).begin_sleep(plan)
    }
    fn settle_sleep(&self) -> ResourceResult<bool> {
        (**self).settle_sleep()
    }
    fn wake(&self) -> ResourceResult<Vec<StreamId>> {
        (**self).wake()
    }
}
