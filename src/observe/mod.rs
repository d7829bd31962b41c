//! Where did my memory go: snapshots, the memory history, out-of-memory
//! reports, and their export to the tools users already have.
//!
//! A GPU service that runs out of memory needs a picture, not a count:
//! which blocks are live and whose (their tags, streams, ages, the uses
//! pending on them), what the cache holds idle and in how many pieces,
//! which frees still wait for the GPU, who is queued for memory, and how
//! the picture came to be. This module holds that picture and its forms:
//!
//! - [`MemorySnapshot`]: every layer's state at one moment, filled by the
//!   stack from the top down
//!   ([`DeviceMemoryResource::snapshot_into`](crate::DeviceMemoryResource::snapshot_into);
//!   [`AsyncResource::snapshot`](crate::AsyncResource::snapshot) adds the
//!   waiters and the history). Its module says which layer fills what, and
//!   how consistent it is under load.
//! - The [`history`]: an opt-in bounded ring of events (allocate,
//!   free, free completed, map, unmap, wait begun and served, out of
//!   memory), off by default at the cost of one relaxed load;
//!   [`record_memory_history`] turns it on.
//! - [`OomReport`]: the long form of an out-of-memory or budget error
//!   ([`AsyncResource::oom_report`](crate::AsyncResource::oom_report)).
//! - Export: [`MemorySnapshot::to_json`] (serde) and
//!   [`MemorySnapshot::to_torch_pickle`], the pickled dict of PyTorch's
//!   `torch.cuda.memory._snapshot()` that its memory viewer opens.
//!
//! # Why serde is always on
//!
//! The person who needs a snapshot is debugging a process that already
//! ran out of memory, often a release build in production: a `serde`
//! feature they would have had to turn on before is one they do not have.
//! PyTorch's `_dump_snapshot` is always there for the same reason. serde,
//! serde_json and serde-pickle are small, pure Rust and build everywhere
//! the crate builds.
//!
//! This module sits just above the core types: every layer reports into
//! it, and it imports none of them.

#![forbid(unsafe_code)]

mod export;
pub(crate) mod history;
mod oom;
mod snapshot;

pub use history::{
    MemoryAction, MemoryEvent, clear_memory_history, memory_history, memory_history_capacity,
    record_memory_history,
};
pub use oom::OomReport;
pub use snapshot::{
    BlockInfo, BlockInfoState, BudgetInfo, MemorySnapshot, PendingFrees, SegmentInfo, WaitersInfo,
};
