//! The books of a [`HostPool`](super::HostPool): its blocks and tallies,
//! shared by the pool's handles and its buffers.
//!
//! # State (under one lock)
//!
//! `idle`: blocks ready to hand out, by size class; `pending`: blocks of
//! dropped buffers with copies not yet seen complete, each with its
//! [`HostUses`]; the byte tallies (`held = in_use + idle + pending`, every
//! block counted by its size class) and the statistics per tag.
//!
//! # Who changes it
//!
//! The pool hands blocks out and counts pins (`super::pool`); a
//! [`HostBuffer`](super::HostBuffer)'s drop gives its block back, idle or
//! pending ([`Shared::give_back`]); [`Shared::collect`] moves pending blocks
//! seen complete to idle; [`Shared::unpin`] frees blocks already out of
//! every list (driver calls, made without the lock).
//!
//! # Failure
//!
//! A failed unpin keeps the block out of the pool, counted as leaked (it
//! can no longer be trusted to be freed once).

// One call that unpins, argued where it is made.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::config::HostPoolConfig;
use super::stats::HostTagStats;
use super::uses::HostUses;
use crate::gpu::{Gpu, HostMemory};
use crate::types::AllocTag;
use crate::util::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) idle: BTreeMap<usize, Vec<HostMemory>>,
    pub(super) pending: Vec<(HostMemory, HostUses)>,
    pub(super) held: usize,
    pub(super) peak_held: usize,
    pub(super) in_use: usize,
    pub(super) idle_bytes: usize,
    pub(super) pending_bytes: usize,
    pub(super) leaked: usize,
    pub(super) pins: u64,
    pub(super) unpins: u64,
    pub(super) reuses: u64,
    pub(super) tags: HashMap<AllocTag, HostTagStats>,
}

impl State {
    pub(super) fn hand_out(&mut self, class: usize, tag: AllocTag) {
        self.in_use += class;
        let t = self.tags.entry(tag).or_default();
        t.current_bytes += class;
        t.peak_bytes = t.peak_bytes.max(t.current_bytes);
        t.allocations += 1;
    }

    pub(super) fn take_idle(&mut self, class: usize) -> Option<HostMemory> {
        let list = self.idle.get_mut(&class)?;
        let block = list.pop()?;
        if list.is_empty() {
            self.idle.remove(&class);
        }
        self.idle_bytes -= class;
        Some(block)
    }

    pub(super) fn put_idle(&mut self, block: HostMemory) {
        self.idle_bytes += block.bytes;
        self.idle.entry(block.bytes).or_default().push(block);
    }

    /// Takes every idle block out of the pool (their bytes stay held until
    /// [`Shared::unpin`] frees them).
    pub(super) fn drain_idle(&mut self) -> Vec<HostMemory> {
        self.idle_bytes = 0;
        std::mem::take(&mut self.idle)
            .into_values()
            .flatten()
            .collect()
    }
}

/// What the pool's handles and its buffers share.
pub(super) struct Shared {
    pub(super) gpu: Arc<dyn Gpu>,
    pub(super) config: HostPoolConfig,
    pub(super) state: Mutex<State>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPool")
            .field("device", &self.gpu.ordinal())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the pending blocks whose copies the host saw complete to idle.
    pub(super) fn collect(&self) {
        let mut st = self.lock();
        let mut i = 0;
        while i < st.pending.len() {
            if st.pending[i].1.prune() {
                let (block, _) = st.pending.swap_remove(i);
                st.pending_bytes -= block.bytes;
                st.put_idle(block);
            } else {
                i += 1;
            }
        }
    }

    /// Unpins blocks already out of the pool's lists; returns the bytes
    /// given back.
    pub(super) fn unpin(&self, blocks: Vec<HostMemory>) -> usize {
        let mut freed = 0;
        for block in blocks {
            // SAFETY: the block was pinned by `host_alloc` of this very
            // backend (`self.gpu`, the only one the pool calls), is taken
            // out of every list (so it is freed once and never handed out
            // again), and was idle: it reached the idle list only when its
            // buffer's copies had all been seen complete by the host.
            let r = unsafe { self.gpu.host_free(block) };
            let mut st = self.lock();
            st.held -= block.bytes;
            match r {
                Ok(()) => {
                    st.unpins += 1;
                    freed += block.bytes;
                }
                Err(e) => {
                    st.leaked += block.bytes;
                    tracing::error!(error = %e, bytes = block.bytes, "unpinning a host block failed (leaked)");
                }
            }
        }
        freed
    }

    /// A buffer's block comes back: idle when every copy was seen
    /// complete, else pending (and each copy's point watched).
    pub(super) fn give_back(&self, block: HostMemory, uses: HostUses, tag: AllocTag) {
        let done = uses.prune();
        if !done {
            uses.request_notifications();
        }
        let mut st = self.lock();
        st.in_use -= block.bytes;
        if let Some(t) = st.tags.get_mut(&tag) {
            t.current_bytes -= block.bytes;
        }
        if done {
            st.put_idle(block);
        } else {
            st.pending_bytes += block.bytes;
            st.pending.push((block, uses));
        }
    }

    /// A buffer's block that must never be handed out or freed again (a
    /// copy may touch it that no use records).
    pub(super) fn leak(&self, block: HostMemory, tag: AllocTag) {
        let mut st = self.lock();
        st.in_use -= block.bytes;
        st.held -= block.bytes;
        st.leaked += block.bytes;
        if let Some(t) = st.tags.get_mut(&tag) {
            t.current_bytes -= block.bytes;
        }
    }

    /// Whether `gpu` is this pool's backend (the same `Arc`).
    pub(super) fn same_backend(&self, gpu: &Arc<dyn Gpu>) -> bool {
        std::ptr::eq(
            Arc::as_ptr(&self.gpu).cast::<()>(),
            Arc::as_ptr(gpu).cast::<()>(),
        )
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle and the last buffer are gone: unpin what is idle
        // and what pending blocks the host saw complete; the rest (copies
        // never seen complete, a faulted device) stays pinned rather than
        // freed under a copy.
        self.collect();
        let (idle, left) = {
            let mut st = self.lock();
            (st.drain_idle(), st.pending.len())
        };
        self.unpin(idle);
        if left > 0 {
            tracing::warn!(
                blocks = left,
                "host pool dropped with copies not seen complete: their blocks stay pinned"
            );
        }
    }
}
