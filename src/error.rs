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
    /// `cuLaunchHostFunc`.
    LaunchHostFunc,
    /// `cuMemsetD8Async`.
    MemsetAsync,
    /// `cuMemcpyDtoDAsync`.
    CopyAsync,
    /// A kernel launch (on the simulated device: [`SimGpu::launch_kernel`](crate::gpu::sim::SimGpu::launch_kernel)).
    Launch,
    /// `cuMemGetInfo`.
    MemGetInfo,
}

impl DriverCall {
    /// Every call kind, in declaration order (used by fault-injection sweeps).
    pub const ALL: [DriverCall; 15] = [
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
        DriverCall::LaunchHostFunc,
        DriverCall::MemsetAsync,
        DriverCall::CopyAsync,
        DriverCall::Launch,
        DriverCall::MemGetInfo,
    ];
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
    /// A [`try_allocate`](crate::futures::AsyncResource::try_allocate) found
    /// allocations waiting for memory: memory that comes back is theirs
    /// first (first come first served), so it does not try.
    #[error("{waiting} allocations are waiting for memory first")]
    AllocationsWaiting {
        /// Allocations in the queue at the call.
        waiting: usize,
    },
    /// A byte budget shared by several resources would be exceeded.
    #[error("budget exceeded: requested {requested} B, limit {limit} B, {in_use} B in use")]
    BudgetExceeded {
        /// Bytes asked for.
        requested: usize,
        /// The budget's limit.
        limit: usize,
        /// Bytes counted against the budget when the request was refused.
        in_use: usize,
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
    /// of the same device: it names a stream this resource does not order
    /// on.
    #[error("{stream} belongs to another stream pool")]
    ForeignStream {
        /// The stream that was passed.
        stream: StreamId,
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
        /// The driver's numeric error code (`CUresult`), or a simulated one.
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
}

impl ResourceError {
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
