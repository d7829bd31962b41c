//! Drains made behind the layers above: a count the budgets compare.
//!
//! A budget resource counts what the stack below it holds, and lowers its
//! count (settles) when a call through it sees that stack hold less: a
//! reap passing through it, a free, a release. A synchronous reap made
//! *below* it, inside one of its calls, passes through nothing above the
//! layer that made it: a budget below asking its own holders for idle
//! memory when refused, a retry layer reaping on out-of-memory. The
//! frees drained there leave every budget above counting bytes the device
//! no longer holds until something else settles it (a notification's
//! reap, the next free through it), which on an idle device is never
//! (`tests/model/api_model/regressions.rs`,
//! `a_buffer_of_another_stream_dropped_during_a_capture_under_two_budgets`).
//!
//! So every synchronous reap that drained something moves this count, and
//! a budget whose allocation saw it move settles before returning. Only
//! the cold paths write it (a reap that synchronizes streams); the
//! allocation's path reads it twice, from a cache line nobody else writes
//! in the steady state.

// `std`'s atomic under loom too: a hint that only adds settles (each
// correct on its own), not an order the models need to explore.
use std::sync::atomic::{AtomicU64, Ordering};

static DRAINS: AtomicU64 = AtomicU64::new(0);

/// A synchronous reap drained frees: every budget above may count them
/// still.
pub(crate) fn drained() {
    DRAINS.fetch_add(1, Ordering::Release);
}

/// The count now: compared before and after a call into the stack below.
#[inline]
pub(crate) fn now() -> u64 {
    DRAINS.load(Ordering::Acquire)
}
