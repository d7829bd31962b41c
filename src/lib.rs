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
//!  adaptors     Budget, DebugGuard, Stats, Tracing, RetryOnOom (decorators over any
//!               resource), stacked by builder::ResourceBuilder
//!  cache        CachingResource<R>: per-stream virtual-memory arenas (size classes without VMM)
//!  resource     trait DeviceMemoryResource
//!               StreamOrderedResource<G>: the bookkeeping, written once
//!                 AsyncCudaResource = StreamOrderedResource<CudaGpu>
//!                 SimResource       = StreamOrderedResource<SimGpu>
//!  device       Device<G>: a backend and its StreamPool, held together;
//!                 Device::open(n, streams): CUDA device n, else the simulator
//!  gpu seam     trait Gpu: the driver calls the bookkeeping needs
//!                 CudaGpu (cudarc, libcuda loaded at run time)   SimGpu (simulated)
//!  observe      MemorySnapshot, the memory history, OomReport; JSON and PyTorch's
//!               memory-viewer pickle (every layer reports into it)
//!  core types   StreamId, RawStream, BlockId, DeviceBlock, BlockState,
//!               AllocTag, Access, ResourceError / ResourceResult
//! ```
//!
//! The simulated device, [`SimGpu`], runs everywhere and
//! carries a race detector: tests and users without a GPU exercise the same
//! bookkeeping that runs on CUDA.

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_debug_implementations, rust_2018_idioms)]

pub mod adaptors;
pub mod buffer;
pub mod builder;
pub mod cache;
pub mod conf;
pub mod device;
pub mod error;
mod faithful;
mod fast_hash;
pub mod futures;
pub mod gpu;
pub mod graph;
pub mod host;
pub mod launch;
pub mod observe;
mod padded;
mod poll_scope;
pub mod registry;
pub mod resource;
mod sync;
pub mod types;
mod waiters;

pub use adaptors::{
    Budget, BudgetResource, DebugGuard, GuardConfig, Identity, Layer, RetryOnOom, Stack, Stats,
    StatsResource, StatsSnapshot, TracingResource,
};
pub use buffer::Buffer;
#[cfg(feature = "cuda")]
pub use buffer::CudaBuffer;
pub use builder::ResourceBuilder;
pub use cache::{CacheConfig, CachingResource};
pub use device::{Backend, Device, StreamPool};
pub use error::{DriverCall, ResourceError, ResourceResult};
pub use faithful::FaithfulLayer;
pub use futures::AsyncResource;
#[cfg(feature = "tokio")]
pub use futures::Reaper;
pub use gpu::sim::SimGpu;
pub use host::{HostBuffer, HostPool, HostPoolConfig};
pub use launch::LaunchRecorder;
#[cfg(feature = "cuda")]
pub use resource::AsyncCudaResource;
pub use resource::{
    DeviceAccess, DeviceMemoryResource, OffloadHost, SimResource, SleepMode, SleepPlan,
    StreamOrderedResource,
};
pub use types::{
    Access, AllocTag, BlockId, BlockState, CompletedUses, DeviceBlock, RawStream, ResourceId,
    StreamId, Tag,
};

/// The README's examples, compiled and run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
