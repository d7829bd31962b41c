//! The synchronization primitives of the bookkeeping: std's, or loom's when
//! the crate is built with `--cfg loom`, so that the loom models next to the
//! code (`#[cfg(all(test, loom))]`) explore every interleaving of the real
//! implementation. See `scripts/model-check.sh`.
//!
//! Every lock and atomic of the bookkeeping goes through here: the resource
//! layer's state, the debug guard's two locks, the budget's counters, the
//! cache's shards, its arena's shared state and kept-block entries, a
//! captured graph's last launch, a buffer's use ledger, the device
//! registry's map, and the futures layer's state (the notifiers' points
//! and their settled mirror, the wait queue); the statistics' counters
//! through `count_lock`, whose lock is loom's mutex under loom. Three
//! process-wide statics keep std's (`waiters`, `buffer::drop_errors` and
//! the memory history's ring: a loom primitive cannot be made in a
//! `static`), and so do the two backends: the CUDA backend's record of the
//! events it made sits below the bookkeeping, and the simulated device
//! never blocks on a loom object while holding its own lock, so loom's
//! scheduler cannot switch inside its critical sections.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
pub(crate) use std::sync::atomic::Ordering;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
