//! Stats: current, peak and total bytes and block counts, overall and per
//! [`AllocTag`](crate::AllocTag).
//!
//! # State
//!
//! A [`Stats`] handle (cloneable, an `Arc` inside) holds the counters,
//! overall and per tag, behind one mutex that each call holds for a few
//! additions. A tag is found by the address of its string (the last one
//! used first), so a call hashes no string (see `table.rs`).
//!
//! # Who adds, who drains
//!
//! [`StatsResource`] counts a block when the inner allocation succeeds and
//! stops counting it when the inner deallocation succeeds: "current" is what
//! the user holds through this layer. Where the bytes go afterwards (a
//! quarantine, a pending free) is the business of the layers below; place
//! the stats layer below a debug guard to count quarantined blocks as held
//! (see the [builder's `# Order`](crate::ResourceBuilder#order)).
//! Failed calls count nothing but a failure, except a refusal for lack of
//! memory of a request that then *waits* in the futures layer's queue:
//! that is back-pressure, counted as a refused try, and the futures layer
//! counts the request once more when it leaves the queue (waited, with its
//! wait time; failed; or cancelled) through [`Stats::record_wait`]. So
//! `failed_allocations` counts only requests that failed.
//!
//! [`Stats::snapshot`] copies every counter into a plain
//! [`StatsSnapshot`], which prints as a table.

// The one `unsafe` is the resource's `unsafe impl DeviceMemoryResource`,
// which vouches for blocks and streams that are the inner resource's.
#![deny(unsafe_code)]

mod counters;
mod layer;
mod resource;
mod snapshot;
mod table;

pub use counters::Stats;
pub use layer::StatsLayer;
pub use resource::StatsResource;
pub use snapshot::{Counts, StatsSnapshot, WaitOutcome};
