//! Plumbing: crate-internal helpers that are not a concept of the allocator.
//!
//! - [`sync`]: the loom switch, the one place the bookkeeping's locks and
//!   atomics come from (`std` normally, loom's models under `--cfg loom`);
//! - [`count_lock`]: the lock of counters that every call moves (the
//!   statistics'), one atomic read-modify-write a call where `std`'s
//!   mutex takes two;
//! - [`fast_hash`]: the hasher of the maps keyed by crate-made integers;
//! - [`growth_gate`]: the gate a budget above a cache puts in front of
//!   the growths of the cache's arena (admitted before memory is created);
//! - [`padded`]: a value alone on its cache line, for per-shard counters;
//! - [`poll_scope`]: marks the host thread as inside a future's `poll`, so
//!   that a layer below can tell it must not block there;
//! - [`sync_drains`]: a count of the synchronous reaps that drained frees,
//!   which a budget compares around its calls into the stack below.
//!
//! This folder is the floor of the crate: it imports nothing of the crate
//! above it, and everything may import it.

pub(crate) mod count_lock;
pub(crate) mod fast_hash;
pub(crate) mod growth_gate;
pub(crate) mod padded;
pub(crate) mod poll_scope;
pub(crate) mod sync;
pub(crate) mod sync_drains;
