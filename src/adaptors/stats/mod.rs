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
//! lock itself, taken once for the allocation and once for the free, and
//! a dozen additions inlined into the decorator: the tag's counts, and of
//! the overall ones only the current counts and their peaks (the overall
//! totals, failures and waits are the sums of the tags', made when a
//! snapshot is read, exact since every call adds to one tag's).
//!
//! The lock is a [`CountLock`](crate::util::count_lock): one atomic
//! read-modify-write to take it and a plain store to release it, where
//! `std`'s mutex makes two (its release must learn whether a thread
//! sleeps on it) and checks for poisoning twice. Nothing is ever done
//! under it but the additions, so a thread that finds it taken yields
//! until it is free instead of sleeping.
//!
//! Counting per tag without the global lock, summed on read, keeps every
//! count exact only with running totals for the peaks: the overall peak of
//! bytes and of blocks needs one shared running count each, a read-modify-
//! write apiece beside the tag's own lock or atomics. That is four atomic
//! read-modify-writes per call where the lock makes one: on the pair's
//! path (one thread, one tag) it would be slower, and the shared running
//! counts contend as the lock does when threads allocate at once. So the
//! lock stays, with nothing but the counting under it.
//!
//! # Counting after the block has moved
//!
//! An allocation is counted from a guard dropped after the inner
//! resource's result has moved to the caller (`CountOnReturn` in
//! `resource.rs`), not between the inner call and the return: there, the
//! counters' stores stood between the inner resource's write of the block
//! (80 bytes with its `Result`) and its move to the caller, and the
//! compiler, unable to tell that they miss the caller's memory, copied the
//! block once more on every allocation, with loads that the processor
//! could not forward from its store buffer. Counted from the guard, the
//! inner resource writes the block where the caller wants it. The counts
//! are the same: the guard runs before `allocate` returns, and counts
//! exactly what the `match` on the result counted.

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
