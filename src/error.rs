//! Errors: one `#[non_exhaustive]` enum whose variants carry their context.
//!
//! Every fallible call of the crate returns [`ResourceResult`]. A call that
//! fails leaves every counter, map and budget exactly as it was before the
//! call (the one exception: a reap that fails part-way keeps what it had
//! already drained, since those frees did run); the variants say what was wrong and with which values, so that a
//! log line is enough to understand a failure.

use crate::types::{BlockId, StreamId};

/// The driver calls the crate makes, named so that an error can say which one
/// failed and so that fault injection can target one kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DriverCall {
    /// Loading `libcuda` and creating the context or memory pool.
    Init,
    /// `cuMemAllocFromPoolAsync`.
    AllocAsync,
    /// `cuMemFreeAsync`.
    FreeAsync,
    /// `cuEventCreate`.
    EventCreate,
    /// `cuEventRecord`.
    EventRecord,
    /// `cuEventQuery`.
    EventQuery,
    /// `cuEventSynchronize`.
    EventSynchronize,
    /// `cuEventDestroy`.
    EventDestroy,
    /// `cuStreamWaitEvent`.
    StreamWaitEvent,
    /// `cuStreamSynchronize`.
    StreamSynchronize,
    /// `cuStreamQuery`.
    StreamQuery,
    /// `cuLaunchHostFunc`.
    LaunchHostFunc,
    /// `cuMemsetD8Async`.
    MemsetAsync,
    /// `cuMemcpyDtoDAsync`.
    CopyAsync,
    /// A kernel launch (on the simulated device: [`SimGpu::launch_kernel`](crate::gpu::sim::SimGpu::launch_kernel)).
    Launch,
    /// `cuMemGetInfo`, and the queries of the memory a backend holds
    /// (`cuMemPoolGetAttribute`, `cuMemPoolSetAttribute` on the usage
    /// attributes).
    MemGetInfo,
    /// `cuMemAddressReserve` (and `cuMemGetAllocationGranularity`).
    AddressReserve,
    /// `cuMemAddressFree`.
    AddressFree,
    /// `cuMemCreate`: physical memory for virtual-memory mappings.
    MemCreate,
    /// `cuMemRelease`.
    MemRelease,
    /// `cuMemMap`.
    MemMap,
    /// `cuMemSetAccess`.
    MemSetAccess,
    /// `cuMemUnmap`.
    MemUnmap,
    /// `cuStreamGetCaptureInfo` (and `cuStreamIsCapturing`).
    StreamGetCaptureInfo,
    /// `cuStreamBeginCapture`.
    StreamBeginCapture,
    /// `cuStreamEndCapture`.
    StreamEndCapture,
    /// `cuGraphInstantiate`.
    GraphInstantiate,
    /// `cuGraphLaunch`.
    GraphLaunch,
    /// `cuGraphDestroy` and `cuGraphExecDestroy`.
    GraphDestroy,
    /// `cuMemHostAlloc`: pinning host memory.
    MemHostAlloc,
    /// `cuMemFreeHost`: unpinning and freeing host memory.
    MemFreeHost,
    /// `cuMemcpyHtoDAsync` and `cuMemcpyDtoHAsync`: a copy between pinned
    /// host memory and the device, queued on a stream.
    MemcpyHostAsync,
}

impl DriverCall {
    /// Every call kind, in declaration order (used by fault-injection sweeps).
    pub const ALL: [DriverCall; 32] = [
        DriverCall::Init,
        DriverCall::AllocAsync,
        DriverCall::FreeAsync,
        DriverCall::EventCreate,
        DriverCall::EventRecord,
        DriverCall::EventQuery,
        DriverCall::EventSynchronize,
        DriverCall::EventDestroy,
        DriverCall::StreamWaitEvent,
        DriverCall::StreamSynchronize,
        DriverCall::StreamQuery,
        DriverCall::LaunchHostFunc,
        DriverCall::MemsetAsync,
        DriverCall::CopyAsync,
        DriverCall::Launch,
        DriverCall::MemGetInfo,
        DriverCall::AddressReserve,
        DriverCall::AddressFree,
        DriverCall::MemCreate,
        DriverCall::MemRelease,
        DriverCall::MemMap,
        DriverCall::MemSetAccess,
        DriverCall::MemUnmap,
        DriverCall::StreamGetCaptureInfo,
        DriverCall::StreamBeginCapture,
        DriverCall::StreamEndCapture,
        DriverCall::GraphInstantiate,
        DriverCall::GraphLaunch,
        DriverCall::GraphDestroy,
        DriverCall::MemHostAlloc,
        DriverCall::MemFreeHost,
        DriverCall::MemcpyHostAsync,
    ];
}

/// The driver's numeric codes (`CUresult`) that the crate reports or
/// recognises, named in one place.
///
/// The simulated device reports the code CUDA would report for the same
/// failure, so a test that checks a code holds on both backends. The values
/// are CUDA's (checked against cudarc's `CUresult` in the CUDA backend's
/// tests), and hold without the CUDA backend compiled in.
pub mod driver_code {
    /// `CUDA_ERROR_INVALID_VALUE`: an argument the driver refuses (on the
    /// simulated device: freeing an address that is not a live allocation).
    pub const INVALID_VALUE: i32 = 1;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// `CUDA_ERROR_INVALID_HANDLE`: a stream or event of another backend, or
    /// one already destroyed.
    pub const INVALID_HANDLE: i32 = 400;
    /// `CUDA_ERROR_NOT_READY`: the work is not done yet (not a failure).
    pub const NOT_READY: i32 = 600;
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`: what a faulted context reports to every
    /// later call.
    pub const ILLEGAL_ADDRESS: i32 = 700;
    /// `CUDA_ERROR_NOT_SUPPORTED`: the device or backend lacks the feature
    /// (stream-ordered memory pools, creating streams).
    pub const NOT_SUPPORTED: i32 = 801;
    /// `CUDA_ERROR_UNKNOWN`: what injected faults of the simulated device
    /// report.
    pub const UNKNOWN: i32 = 999;
}

/// What went wrong in a call of the crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// The device could not provide `requested` bytes on `stream`.
    #[error("out of device memory: requested {requested} B on {stream}, {available} B available")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// Bytes the device reported free when the request failed.
        available: usize,
        /// Stream the allocation was ordered on.
        stream: StreamId,
    },
    /// A [`try_allocate`](crate::AsyncResource::try_allocate) found
    /// allocations waiting for memory: memory that comes back is theirs
    /// first (first come first served), so it does not try.
    #[error("{waiting} allocations are waiting for memory first")]
    AllocationsWaiting {
        /// Allocations in the queue at the call.
        waiting: usize,
    },
    /// A byte budget shared by several resources would be exceeded:
    /// `in_use + requested` passes `limit` (or overflows), the very numbers
    /// the budget compared.
    ///
    /// A budget counts device bytes (see
    /// [`Budget`](crate::Budget)): `requested` is what the
    /// allocation would take from the device, which a cache below the budget
    /// rounds up (a size class, a 2 MiB page of its arena), so it may be more
    /// than the caller asked for.
    #[error(
        "budget exceeded: the allocation needs {requested} B of device memory, limit {limit} B, {in_use} B in use"
    )]
    BudgetExceeded {
        /// Device bytes the allocation would have counted against the
        /// budget.
        requested: usize,
        /// The budget's limit.
        limit: usize,
        /// Bytes counted against the budget when the request was refused.
        in_use: usize,
    },
    /// A [`CachingResource`](crate::CachingResource) has no block id left
    /// for another block on `stream`: 2^24 of its blocks are live there at
    /// once, or (after some 2^48 allocations on it) its ids are spent. Ids
    /// are never reused, so that a stale one is never taken for a live
    /// block. Nothing was allocated; frees on the stream make room unless
    /// the ids are spent.
    #[error("no block id left for another block on {stream} ({live} of its blocks live)")]
    BlockIdsExhausted {
        /// The stream of the request.
        stream: StreamId,
        /// The blocks live on the stream.
        live: usize,
    },
    /// Hold-and-wait: every byte the refused allocations wait for is held
    /// by tasks that are themselves waiting for more memory, and nothing
    /// pending on the GPU would free any, so no waiter could ever be
    /// served. The newest waiter that holds memory fails with this error,
    /// so that its task gives its memory back (dropping its buffers) and
    /// the older ones are served. Ask for a request's memory as one unit
    /// instead ([`AsyncResource::reserve`](crate::AsyncResource::reserve)).
    /// [`set_hold_and_wait_check`](crate::AsyncResource::set_hold_and_wait_check)
    /// says
    /// for the facts the verdict rests on.
    #[error(
        "hold-and-wait: {held} B are held by {tasks} tasks that all wait for more memory ({waiting} allocations waiting) and nothing pending on the GPU would free any; reserve each request's memory as one unit (AsyncResource::reserve)"
    )]
    HoldAndWait {
        /// Bytes served through the futures layer and held by the waiting
        /// tasks (as asked for, before any rounding below).
        held: usize,
        /// Tasks holding them, every one waiting.
        tasks: usize,
        /// Allocations waiting when the verdict was given.
        waiting: usize,
    },
    /// A reservation was asked for nothing: an empty list of sizes, or a
    /// size of zero bytes at `index`. Nothing was reserved.
    #[error("{}", match index {
        Some(i) => format!("size {i} of the reservation is zero bytes"),
        None => "a reservation of no sizes".to_string(),
    })]
    EmptyReservation {
        /// The zero size's position in the list; `None` for an empty list.
        index: Option<usize>,
    },
    /// The sizes of a reservation add up to more than `usize` bytes.
    /// Nothing was reserved.
    #[error("the {sizes} sizes of the reservation overflow the address space")]
    ReservationOverflow {
        /// How many sizes were asked for.
        sizes: usize,
    },
    /// No block left in a
    /// [`MemoryReservation`](crate::MemoryReservation) holds
    /// `requested` bytes. The reservation is as it was.
    #[error(
        "no block left in the reservation holds {requested} B (the largest left holds {largest} B, {left} blocks left)"
    )]
    NotReserved {
        /// Bytes asked of the reservation.
        requested: usize,
        /// The largest block left (0 when none is).
        largest: usize,
        /// Blocks left.
        left: usize,
    },
    /// The stream is not in this resource's stream pool.
    #[error("unknown stream {stream} (the pool has {pool_len} streams)")]
    UnknownStream {
        /// The stream that was passed.
        stream: StreamId,
        /// How many streams the pool holds.
        pool_len: usize,
    },
    /// The stream id was handed out by another [`StreamPool`](crate::StreamPool)
    /// of the same device (another [`Device`](crate::Device) of the same
    /// ordinal included), or by none ([`StreamId::new`]): it names a stream
    /// this resource or device does not order on.
    #[error("{stream} belongs to another stream pool")]
    ForeignStream {
        /// The stream that was passed.
        stream: StreamId,
    },
    /// An [open-ended](crate::StreamPool::open_ended) stream pool has no
    /// room for another stream (a fixed pool never has).
    #[error("the stream pool of device {device} is full ({capacity} streams)")]
    StreamPoolFull {
        /// The pool's device.
        device: u32,
        /// How many streams it holds.
        capacity: usize,
    },
    /// A stream or block of another device was passed to a resource pinned
    /// to `expected`.
    #[error("wrong device: this resource serves device {expected}, got one of device {found}")]
    WrongDevice {
        /// The device the resource serves.
        expected: u32,
        /// The device of the stream or block that was passed.
        found: u32,
    },
    /// A stream pool of another context of the same device was paired with
    /// a backend ([`Device::new`](crate::Device::new)): its streams would
    /// order nothing the backend does.
    #[error("the stream pool belongs to another context of device {device} than the backend")]
    WrongContext {
        /// The device both name.
        device: u32,
    },
    /// The block was allocated by another resource.
    #[error("{block} belongs to another resource")]
    ForeignBlock {
        /// The block that was passed.
        block: BlockId,
    },
    /// The block id was never handed out by this resource.
    #[error("unknown block {block}")]
    UnknownBlock {
        /// The block that was passed.
        block: BlockId,
    },
    /// The block was already deallocated (a second free, or a stale id used
    /// after the free).
    #[error("{block} was already deallocated")]
    DoubleFree {
        /// The block that was passed.
        block: BlockId,
    },
    /// A block-use hook or a second `deallocate` raced a `deallocate` of the
    /// same block on another thread: the free is being queued and may still
    /// fail. If it succeeds the block is retired; if it fails the block is
    /// live again, exactly as it was. The racing call changed nothing either
    /// way.
    #[error("{block} is being deallocated by a concurrent call")]
    FreeInFlight {
        /// The block that was passed.
        block: BlockId,
    },
    /// The resource stack does not track cross-stream block use, so a launch
    /// that needs it was refused before any work was queued.
    #[error("{block} is used on {stream} but the resource stack does not track block use")]
    TrackingUnsupported {
        /// The block that needed tracking.
        block: BlockId,
        /// The stream of the use.
        stream: StreamId,
    },
    /// A driver call failed.
    #[error("driver call {call:?} failed: {message} (code {code})")]
    Driver {
        /// Which call failed.
        call: DriverCall,
        /// The driver's numeric error code (`CUresult`; see [`driver_code`]).
        code: i32,
        /// The driver's name for the error.
        message: String,
    },
    /// The device is unusable (libcuda missing, or a fault poisoned the
    /// context); no further work can complete on it.
    #[error("device {device} unavailable: {reason}")]
    DeviceUnavailable {
        /// Device ordinal.
        device: u32,
        /// Why.
        reason: String,
    },
    /// The resource (or its background task) has shut down.
    #[error("the resource has shut down")]
    Shutdown,
    /// The resource is closed
    /// ([`AsyncResource::close`](crate::AsyncResource::close),
    /// or its `shutdown`): it serves no new allocation or reservation,
    /// and the ones that were waiting fail with this. Frees, completions
    /// and buffers already held work as before.
    #[error("the resource is closed: it takes no new allocations")]
    Closed,
    /// A range of elements lies outside a buffer (or is reversed).
    #[error("range {start}..{end} is outside a buffer of {len} elements")]
    OutOfBounds {
        /// First element asked for.
        start: usize,
        /// One past the last element asked for.
        end: usize,
        /// The buffer's length, in elements.
        len: usize,
    },
    /// A buffer of `len` elements of `elem_size` bytes does not fit in
    /// `usize` bytes.
    #[error("{len} elements of {elem_size} B overflow the address space")]
    SizeOverflow {
        /// Elements asked for.
        len: usize,
        /// Bytes per element.
        elem_size: usize,
    },
    /// The stream is being captured into a CUDA graph, and the call needs a
    /// point on it that runs: a completion future (its event could never be
    /// queried, nor a host function wait on it, without invalidating the
    /// capture; await the graph's launch instead, see
    /// [`CapturedGraph::launch`](crate::CapturedGraph::launch)),
    /// or the stream a graph's memory is released after
    /// ([`release_capture`](crate::DeviceMemoryResource::release_capture)).
    /// Nothing was queued and nothing changed.
    #[error(
        "{stream} is capturing a CUDA graph ({}): no point on it can be waited for until the capture ends (a completion future: await the graph's launch instead)",
        capture.map_or_else(|| "invalidated".to_string(), |c| c.to_string())
    )]
    StreamCapturing {
        /// The capturing stream.
        stream: StreamId,
        /// Its capture, or `None` when the capture is already invalidated.
        capture: Option<crate::types::CaptureId>,
    },
    /// A block a CUDA graph's capture allocated and did not free (a graph
    /// memory node) was used outside that capture while no replay's
    /// instance of it is live: before the graph's first launch, or after
    /// the instance a replay left was freed. There is no memory behind its
    /// address then. Nothing was queued and nothing changed.
    #[error(
        "{block} was allocated by a graph capture and no replay of the graph has made its memory (launch the graph first)"
    )]
    GraphMemoryUnbacked {
        /// The block.
        block: BlockId,
    },
    /// A host buffer of zero elements was asked of a
    /// [`HostPool`](crate::HostPool): pinned memory has no empty
    /// block to give. Nothing was allocated.
    #[error("a host buffer of zero elements was asked for")]
    EmptyHostBuffer,
    /// A [`HostPool`](crate::HostPool) would pass its cap: `held`
    /// bytes of pinned memory (in use, idle or waiting for copies) and
    /// `requested` more would exceed `cap`, after the pool gave its idle
    /// blocks back. Nothing was allocated.
    #[error("host pool full: {requested} B more on {held} B held would pass the cap of {cap} B")]
    HostPoolFull {
        /// Bytes the request takes (its size class).
        requested: usize,
        /// The pool's cap.
        cap: usize,
        /// Pinned bytes the pool held when it refused.
        held: usize,
    },
    /// A host buffer was touched on the host while a copy the host has not
    /// seen complete may still read it (for a write) or write it: `pending`
    /// copies are not known done. Await their futures, or
    /// [`HostBuffer::ready`](crate::HostBuffer::ready).
    #[error("the host buffer is in use by {pending} copies not known complete")]
    HostBufferBusy {
        /// Streams whose copies are not known complete.
        pending: usize,
    },
    /// A host buffer of a pool on another backend than the resource that
    /// would copy it: that backend's copy calls cannot vouch for its
    /// memory. Nothing was queued.
    #[error("the host buffer belongs to a pool of another backend than the copy's resource")]
    ForeignHostBuffer,
    /// A block of a tag the cache put to sleep
    /// ([`CachingResource::sleep`](crate::CachingResource::sleep))
    /// was used before [`wake`](crate::CachingResource::wake): its
    /// memory may have no physical pages behind it. Nothing was queued.
    #[error("block {block} is asleep: wake the cache before using it")]
    BlockAsleep {
        /// The block.
        block: BlockId,
    },
    /// A sleep or wake the cache cannot make, for `reason`; nothing
    /// changed.
    #[error("sleep refused: {reason}")]
    SleepRefused {
        /// Why.
        reason: &'static str,
    },
    /// A configuration (`STREAMALLOC_CONF`, see [`crate::AllocConf`]) the crate
    /// cannot follow: an unknown key, a key given twice, a value it cannot
    /// read, or a key whose prerequisite is missing. Nothing was built.
    #[error("STREAMALLOC_CONF: `{key}:{value}`: {reason}")]
    Config {
        /// The key.
        key: String,
        /// Its value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A CUDA stream that no stream pool of this device registers was used
    /// with a buffer, so its uses could not be ordered.
    #[error("a stream of device {device} that its stream pool does not register")]
    UnregisteredStream {
        /// The device of the buffer.
        device: u32,
    },
}

impl ResourceError {
    /// Whether the error is a refusal for lack of memory (the device's or
    /// a budget's): what a request may wait out.
    pub fn is_lack_of_memory(&self) -> bool {
        matches!(
            self,
            ResourceError::OutOfMemory { .. } | ResourceError::BudgetExceeded { .. }
        )
    }

    /// `Ok` when `found` is the device `expected`, else
    /// [`ResourceError::WrongDevice`]: the one check every layer makes before
    /// touching a stream or block of a device.
    pub fn check_device(expected: u32, found: u32) -> ResourceResult<()> {
        if expected == found {
            Ok(())
        } else {
            Err(ResourceError::WrongDevice { expected, found })
        }
    }
}

/// The crate's result type.
pub type ResourceResult<T> = Result<T, ResourceError>;
