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
//!
//! # Why one lock, and why the counts are exact
//!
//! Every count moves under the one lock, so a snapshot sees the overall
//! counts and the per-tag ones at one moment, and each peak is the highest
//! value its current count took in the order the lock gave the calls: no
//! allocation's rise can be missed by its peak. The pair's cost is the
//! lock itself, taken once for the allocation and once for the free (two
//! atomic read-modify-writes each: the lock's compare-and-swap and the
//! unlock's swap), and a dozen additions inlined into the decorator: the
//! tag's counts, and of the overall ones only the current counts and
//! their peaks (the overall totals, failures and waits are the sums of
//! the tags', made when a snapshot is read, exact since every call adds to
//! one tag's).
//!
//! Counting per tag without the global lock, summed on read, keeps every
//! count exact only with running totals for the peaks: the overall peak of
//! bytes and of blocks needs one shared running count each, a read-modify-
//! write apiece beside the tag's own lock or atomics. That is four atomic
//! read-modify-writes per call where the global lock makes two (in a
//! tight loop on the build machine an uncontended one costs about 5 ns, a
//! lock taken and released about 11 ns): on the pair's path (one thread,
//! one tag) it would be slower, and the shared running counts contend as
//! the lock does when threads allocate at once. So the lock stays, with
//! nothing but the counting under it.

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
pub use snapshot::{QueueOutcome, StatsCounts, StatsSnapshot};
