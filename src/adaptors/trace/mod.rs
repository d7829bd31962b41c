//! Tracing: [`tracing`] events for every allocation, free and block use,
//! spans around reaps.
//!
//! # What is emitted
//!
//! Events have the target [`ALLOC_TARGET`] (`streamalloc::alloc`):
//!
//! | call | level | fields |
//! | --- | --- | --- |
//! | `allocate` | DEBUG | `device`, `stream`, `bytes`, `tag`, `address`, `block`, `elapsed_ns` |
//! | `deallocate` | DEBUG | `device`, `stream`, `bytes`, `tag`, `address`, `block`, `elapsed_ns` |
//! | `prepare_block_use` / `finish_block_use` / `record_block_use` | TRACE | `device`, `stream` (of the use), `block`, `access`, `elapsed_ns` |
//! | `reap_through` | DEBUG | `device`, `stream`, `seq`, `bytes` (drained), `elapsed_ns` |
//! | any failure | WARN | the call's fields and `error` |
//! | `allocate` refused for lack of memory while its request waits | DEBUG | the call's fields and `refusal` |
//!
//! A request that waits is not failing: the futures layer gives it a span
//! (target [`WAIT_TARGET`](crate::WAIT_TARGET)) with its queue
//! position and wait time, and the refusals of its tries are DEBUG events
//! inside that span, not warnings.
//!
//! [`reap_pending`](crate::DeviceMemoryResource::reap_pending) runs in an
//! INFO span `reap_pending` and ends with an event carrying the bytes
//! drained and the time taken.
//!
//! # Cost
//!
//! Without any subscriber that wants warnings (tracing's global maximum
//! level is below WARN: no subscriber, or one turned off), an allocation
//! or a free is handed to the inner resource untouched, after one load and
//! a compare of that level: no copy of the block, no look at the result.
//! With a subscriber that wants warnings but not the DEBUG events, the hot
//! path adds one `tracing::enabled!` check (a cached callsite interest, a
//! load and a branch) per call and a look at the result, and takes no
//! timestamp.
//!
//! So a program that has no `tracing` subscriber and relies on `tracing`'s
//! `log` feature to hand events to the `log` crate gets no events from
//! this layer (it never did for allocations and frees, whose events were
//! asked for with `enabled!`; now not for failures either): `log` does not
//! raise `tracing`'s maximum level. Install a subscriber to see them.

// The one `unsafe` is the resource's `unsafe impl DeviceMemoryResource`,
// which vouches for blocks and streams that are the inner resource's.
#![deny(unsafe_code)]

mod layer;
mod resource;

pub use layer::TracingLayer;
pub use resource::{ALLOC_TARGET, TracingResource};
