//! # streamalloc
//!
//! A stream-ordered GPU memory allocator for async Rust, on cudarc.
//!
//! Memory is allocated and freed *on streams*: a block is usable on its
//! stream from the allocation on, and its memory goes back to the device once
//! the GPU has run past the free, without the host ever synchronizing. Blocks
//! that cross streams are tracked per use, so that a free never races with a
//! reader on another stream.
//!
//! ## Layers
//!
//! ```text
//!  host         HostPool, HostBuffer<T>: pinned host memory for staging copies,
//!               back to the pool once the host saw every copy complete
//!  buffer       Buffer<T>: owned, frees on drop; views, guards; CudaBuffer for cudarc
//!  futures      AsyncResource<R>, EventFuture, AllocFuture, DeallocHandle, Reaper
//!  launch       LaunchRecorder: preflight → prepare → enqueue → finish
//!  adaptors     BudgetResource, DebugGuardResource, StatsResource, TracingResource,
//!               RetryOnOomResource: decorators over any resource, each built by its
//!               ...Layer (BudgetLayer, ...), stacked by ResourceBuilder
//!  cache        CachingResource<R>: per-stream virtual-memory arenas (size classes without VMM)
//!  resource     trait DeviceMemoryResource
//!               StreamOrderedResource<G>: the bookkeeping, written once
//!                 AsyncCudaResource = StreamOrderedResource<CudaGpu>
//!                 SimResource       = StreamOrderedResource<SimGpu>
//!  device       Device<G>: a backend and its StreamPool, held together;
//!                 Device::open(n, streams): CUDA device n, else the simulator
//!  gpu seam     gpu::Gpu: the driver calls the bookkeeping needs
//!                 gpu::cuda::CudaGpu (cudarc, libcuda loaded at run time)
//!                 gpu::sim::SimGpu (simulated)
//!  observe      MemorySnapshot, the memory history, OomReport; JSON and PyTorch's
//!               memory-viewer pickle (every layer reports into it)
//!  core types   StreamId, RawStream, BlockId, DeviceBlock, BlockState,
//!               AllocTag, Access, ResourceError / ResourceResult
//! ```
//!
//! The simulated device, [`SimGpu`](gpu::sim::SimGpu), runs everywhere and
//! carries a race detector: tests and users without a GPU exercise the same
//! bookkeeping that runs on CUDA.
//!
//! ## Paths
//!
//! Every public item has one path. The allocator's items are here, at the
//! root. [`gpu`] is the one namespace: the seam a backend implements (the
//! [`Gpu`](gpu::Gpu) trait, raw handles, the driver's codes), which code
//! that only allocates does not touch, with the two backends in it,
//! [`gpu::sim`] (the simulated device and its test tools) and `gpu::cuda`
//! (feature `cuda`). Each folder of `src/` opens with an essay on its layer
//! (`src/cache/mod.rs`, `src/futures/mod.rs`, ...), which the items' docs
//! refer to.

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_debug_implementations, rust_2018_idioms)]

// One path per public item: the modules are private and their items are
// re-exported here, flat, as tokio and wgpu do. `gpu` stays a namespace:
// it is the seam a backend implements (the `Gpu` trait, the raw handles,
// the driver's codes), which a user of the allocator does not touch, and
// it holds the two backends, `gpu::sim` (the simulated device and its test
// tools) and `gpu::cuda` (cudarc).
mod adaptors;
mod buffer;
mod builder;
mod cache;
mod conf;
mod device;
mod error;
mod faithful;
mod futures;
pub mod gpu;
mod graph;
mod host;
mod launch;
mod observe;
mod registry;
mod resource;
mod types;
mod util;
mod waiters;

pub use adaptors::{
    ALLOC_TARGET, Budget, BudgetLayer, BudgetReservation, BudgetResource, CachingLayer,
    DebugGuardLayer, DebugGuardResource, GuardConfig, Identity, Layer, MemsetPoisonFill,
    PoisonFill, QueueOutcome, RetryOnOomLayer, RetryOnOomResource, Stack, Stats, StatsCounts,
    StatsLayer, StatsResource, StatsSnapshot, TracingLayer, TracingResource,
};
pub use buffer::{
    Buffer, BufferFuture, BufferLaunch, BufferView, BufferViewMut, DeviceElement,
    RefusedConversion, UseGuard, UseGuardMut, drop_error_count, take_drop_error,
};
#[cfg(feature = "cuda")]
pub use buffer::{CudaBuffer, CudaView, CudaViewMut};
pub use builder::ResourceBuilder;
pub use cache::{
    CacheConfig, CacheStats, CachingResource, CrossStreamReuse, MIN_CLASS_SIZE, SizeClass,
};
pub use conf::{AllocConf, CONF_ENV, WaitChoice};
pub use device::{Backend, DEVICE_ENV, Device, StreamPool};
pub use error::{DriverCall, ResourceError, ResourceResult};
pub use faithful::FaithfulLayer;
#[cfg(feature = "tokio")]
pub use futures::Reaper;
pub use futures::{
    AllocFuture, AnyResource, AsyncResource, DeallocHandle, EventFuture, FALLBACK_PERIOD,
    MemoryReservation, QueueStats, ReapFuture, ReserveFuture, ShutdownReport, WAIT_TARGET,
    WaitPolicy, WaitStats, WhenBehind,
};
pub use graph::{CapturedGraph, GraphCapture};
pub use host::{HostBuffer, HostElement, HostPool, HostPoolConfig, HostPoolStats, HostTagStats};
pub use launch::{LaunchBlockUse, LaunchRecorder};
pub use observe::{
    BlockInfo, BlockInfoState, BudgetInfo, MemoryAction, MemoryEvent, MemorySnapshot, OomReport,
    PendingFrees, SegmentInfo, WaitersInfo, clear_memory_history, memory_history,
    memory_history_capacity, record_memory_history,
};
pub use registry::DeviceRegistry;
#[cfg(feature = "cuda")]
pub use resource::AsyncCudaResource;
pub use resource::{
    BudgetRelief, DeviceAccess, DeviceMemoryResource, MappingCharge, OffloadHost, SimResource,
    SleepMode, SleepPlan, StreamOrderedResource,
};
pub use types::{
    Access, AllocTag, BlockId, BlockState, CaptureId, CompletedUses, DeviceBlock, NeverUsed,
    RawStream, ResourceId, StreamId, Tag,
};

/// The README's examples, compiled and run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
