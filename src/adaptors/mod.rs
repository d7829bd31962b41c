//! Adaptors: decorators over any [`DeviceMemoryResource`], stacked in the
//! style of tower.
//!
//! Each adaptor is a resource that wraps another one, changes one thing and
//! forwards everything else — the block-use hooks,
//! [`supports_block_use_tracking`](DeviceMemoryResource::supports_block_use_tracking),
//! [`pending_free_seq`](DeviceMemoryResource::pending_free_seq),
//! [`reap_through`](DeviceMemoryResource::reap_through),
//! [`reap_pending`](DeviceMemoryResource::reap_pending),
//! [`block_state`](DeviceMemoryResource::block_state),
//! [`capture_status`](DeviceMemoryResource::capture_status) and
//! [`release_capture`](DeviceMemoryResource::release_capture) included — so
//! that a stack of them behaves as the resource at its bottom, plus each
//! feature (a budget settles after a release; a debug guard does not
//! quarantine a block freed in a capture, which belongs to the graph):
//!
//! | decorator | its layer | changes | folder |
//! | --- | --- | --- | --- |
//! | [`BudgetResource`] | [`BudgetLayer`] | refuses allocations past a shared [`Budget`] | `budget/` |
//! | [`DebugGuardResource`] | [`DebugGuardLayer`] | quarantines freed blocks, catches double free | `debug_guard/` |
//! | [`StatsResource`] | [`StatsLayer`] | counts bytes and blocks per tag | `stats/` |
//! | [`TracingResource`] | [`TracingLayer`] | emits `tracing` events | `trace/` |
//! | [`RetryOnOomResource`] | [`RetryOnOomLayer`] | reaps and retries once when memory is short | `retry/` |
//!
//! One naming scheme: the decorator is `…Resource` (as the cache's
//! [`CachingResource`](crate::CachingResource), built by [`CachingLayer`]),
//! the [`Layer`] that builds it `…Layer`, and a handle shared by several
//! stacks carries the concept's plain name ([`Budget`], [`Stats`]).
//!
//! Every adaptor comes with a [`Layer`] that builds it, so that stacks are
//! types: [`Stack`] nests two layers, [`Identity`] is the empty one, and
//! [`ResourceBuilder`](crate::ResourceBuilder) grows a stack one
//! call at a time.
//!
//! A failed call of any adaptor changes nothing, in the adaptor or below.

// `MemsetPoisonFill` is the one unsafe item (see `debug_guard::poison`).
#![deny(unsafe_code)]

mod budget;
mod caching_layer;
mod debug_guard;
mod layer;
mod retry;
mod stats;
mod trace;

pub use budget::{Budget, BudgetLayer, BudgetReservation, BudgetResource};
pub use caching_layer::CachingLayer;
pub use debug_guard::{
    DebugGuardLayer, DebugGuardResource, GuardConfig, MemsetPoisonFill, PoisonFill,
};
pub use layer::{Identity, Layer, Stack};
pub use retry::{RetryOnOomLayer, RetryOnOomResource};
pub use stats::{QueueOutcome, Stats, StatsCounts, StatsLayer, StatsResource, StatsSnapshot};
pub use trace::{ALLOC_TARGET, TracingLayer, TracingResource};

#[cfg(doc)]
use crate::DeviceMemoryResource;
