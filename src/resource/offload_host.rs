//! [`OffloadHost`]: where a sleep's offloads get their pinned host memory,
//! and where it goes back once the host saw every copy of it complete.
//!
//! A [`SleepPlan`](super::SleepPlan) that names one
//! ([`offload_to`](super::SleepPlan::offload_to)) borrows each offloaded
//! block's host memory from it at the sleep and gives it back after the
//! wake, so that repeated sleeps and wakes pin nothing new: a
//! [`HostPool`](crate::HostPool) is one, and its cap, statistics per
//! tag and reuse rules apply to the offloads as to its own buffers. A plan
//! that names none pins per block at each sleep (`cuMemHostAlloc`, which
//! takes milliseconds) and unpins after the wake.
//!
//! The cache trusts what it borrows: the device copies into it and out of
//! it by address. So the trait is `unsafe` to implement, with its contract
//! below, and giving memory back is `unsafe` to call: the caller claims
//! every copy of it complete.

// Unsafe here: the trait's contract (its implementations are trusted) and
// the claim its caller makes when giving memory back; no unsafe block.
#![allow(unsafe_code)]

use std::fmt;

use crate::error::ResourceResult;
use crate::gpu::{Gpu, HostMemory};
use crate::types::AllocTag;

/// Pinned host memory lent to a cache's sleep's offloads
/// ([`SleepPlan::offload_to`](super::SleepPlan::offload_to)), taken back
/// once the host saw every copy of it complete: repeated sleeps and wakes
/// pin nothing new. A [`HostPool`](crate::HostPool) is one.
///
/// # Safety
/// An implementation promises that:
/// 1. [`lend`](Self::lend) returns host memory pinned by the backend
///    [`pins_for`](Self::pins_for) names (live, at least `bytes` long,
///    addressable by that backend's copies through its `addr`), which
///    nobody else reads, writes or frees until
///    [`take_back`](Self::take_back) receives it;
/// 2. [`pins_for`](Self::pins_for) is true only for the backend that
///    pinned what it lends.
pub unsafe trait OffloadHost: Send + Sync + fmt::Debug {
    /// Host memory of at least `bytes` for a block of `tag`.
    ///
    /// # Errors
    /// The lender's: a cap passed, pinning failed.
    fn lend(&self, bytes: usize, tag: AllocTag) -> ResourceResult<HostMemory>;

    /// Takes back memory [`lend`](Self::lend) gave for `tag`.
    ///
    /// # Safety
    /// 1. `memory` is exactly what `lend` returned, given back once;
    /// 2. no copy touches it any more: the host saw every copy queued on
    ///    it complete (an event queried done, a notification delivered).
    unsafe fn take_back(&self, memory: HostMemory, tag: AllocTag);

    /// Whether what it lends is pinned by `gpu` (the same backend object),
    /// whose copies may then reach it.
    fn pins_for(&self, gpu: &dyn Gpu) -> bool;
}

// SAFETY: every method is `T`'s, whose contract holds.
unsafe impl<T: OffloadHost + ?Sized> OffloadHost for std::sync::Arc<T> {
    fn lend(&self, bytes: usize, tag: AllocTag) -> ResourceResult<HostMemory> {
        (**self).lend(bytes, tag)
    }

    unsafe fn take_back(&self, memory: HostMemory, tag: AllocTag) {
        // SAFETY: the caller's claim, passed on.
        unsafe { (**self).take_back(memory, tag) }
    }

    fn pins_for(&self, gpu: &dyn Gpu) -> bool {
        (**self).pins_for(gpu)
    }
}
