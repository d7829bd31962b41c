//! A [`HostPool`] lends a sleep's offloads their pinned host memory
//! ([`OffloadHost`]): a plan that names the pool
//! ([`SleepPlan::offload_to`](crate::SleepPlan::offload_to)) takes a
//! block of the pool per offloaded block at the sleep and gives it back
//! after the wake, so that repeated sleeps and wakes pin nothing new.
//!
//! The pool's rules hold for what it lends: a lent block counts as in use
//! (under the sleeping block's tag, against the cap) until the cache gives
//! it back, which it does only once the host saw every copy of it
//! complete (the wake's fence past the copy back, queried done), so the
//! block goes straight back idle; a checking backend hears of the reuse
//! when the pool hands it out again.

// The trait's implementation is `unsafe` (its contract is argued below).
#![allow(unsafe_code)]

use super::pool::{HostPool, size_class};
use super::uses::HostUses;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{Gpu, HostMemory};
use crate::resource::OffloadHost;
use crate::types::AllocTag;

// SAFETY: (1) `lend` hands out a block of the pool's own backend
// (`host_alloc` of `shared.gpu`), at least `bytes` long (its size class),
// taken out of the idle list or newly pinned, and counted in use: the pool
// gives it to no one else and never unpins it until `take_back` puts it
// back idle; (2) `pins_for` compares with that very backend object.
unsafe impl OffloadHost for HostPool {
    fn lend(&self, bytes: usize, tag: AllocTag) -> ResourceResult<HostMemory> {
        let class = size_class(bytes)
            .filter(|&c| c <= isize::MAX as usize)
            .ok_or(ResourceError::SizeOverflow {
                len: bytes,
                elem_size: 1,
            })?;
        self.allocate_block(class, tag)
    }

    unsafe fn take_back(&self, memory: HostMemory, tag: AllocTag) {
        // No use to watch: the caller saw every copy of it complete.
        self.shared().give_back(memory, HostUses::default(), tag);
    }

    fn pins_for(&self, gpu: &dyn Gpu) -> bool {
        std::ptr::addr_eq(
            std::sync::Arc::as_ptr(&self.shared().gpu),
            gpu as *const dyn Gpu,
        )
    }
}
