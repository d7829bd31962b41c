//! [`Stats`]: the live counters behind a stats layer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{Counts, StatsSnapshot};
use crate::types::AllocTag;

#[derive(Debug, Default)]
struct Atomics {
    current_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
    total_bytes: AtomicU64,
    current_blocks: AtomicUsize,
    peak_blocks: AtomicUsize,
    total_blocks: AtomicU64,
    failed_allocations: AtomicU64,
}

impl Atomics {
    fn snapshot(&self) -> Counts {
        Counts {
            current_bytes: self.current_bytes.load(Ordering::Acquire),
            peak_bytes: self.peak_bytes.load(Ordering::Acquire),
            total_bytes: self.total_bytes.load(Ordering::Acquire),
            current_blocks: self.current_blocks.load(Ordering::Acquire),
            peak_blocks: self.peak_blocks.load(Ordering::Acquire),
            total_blocks: self.total_blocks.load(Ordering::Acquire),
            failed_allocations: self.failed_allocations.load(Ordering::Acquire),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    overall: Atomics,
    /// Per-tag counts; the lock is held only for a handful of additions.
    per_tag: Mutex<HashMap<AllocTag, Counts>>,
}

/// The counters of one or more [`StatsResource`](super::StatsResource)s.
///
/// Cloning shares the counters: hand a clone to a
/// [`StatsLayer`](super::StatsLayer) and keep one to read.
///
/// # Examples
/// ```
/// use streamalloc::adaptors::{Stats, StatsResource};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::new();
/// let pool = gpu.stream_pool(1);
/// let s = pool.id(0).unwrap();
/// let stats = Stats::new();
/// let r = StatsResource::new(SimResource::new(gpu, pool.clone()), &stats);
///
/// let a = r.allocate(100, s, AllocTag("weights"))?;
/// let b = r.allocate(50, s, AllocTag("activations"))?;
/// r.deallocate(b)?;
/// let snap = stats.snapshot();
/// assert_eq!(snap.overall.current_bytes, 100);
/// assert_eq!(snap.overall.peak_bytes, 150);
/// assert_eq!(snap.tag(AllocTag("activations")).unwrap().total_bytes, 50);
/// println!("{snap}");
/// # r.deallocate(a)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Stats {
    inner: Arc<Inner>,
}

impl Stats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts an allocation of `bytes` tagged `tag`.
    pub fn record_allocate(&self, bytes: usize, tag: AllocTag) {
        let o = &self.inner.overall;
        let now = o.current_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        o.peak_bytes.fetch_max(now, Ordering::AcqRel);
        o.total_bytes.fetch_add(bytes as u64, Ordering::AcqRel);
        let blocks = o.current_blocks.fetch_add(1, Ordering::AcqRel) + 1;
        o.peak_blocks.fetch_max(blocks, Ordering::AcqRel);
        o.total_blocks.fetch_add(1, Ordering::AcqRel);
        let mut map = self.lock();
        let t = map.entry(tag).or_default();
        t.current_bytes += bytes;
        t.peak_bytes = t.peak_bytes.max(t.current_bytes);
        t.total_bytes += bytes as u64;
        t.current_blocks += 1;
        t.peak_blocks = t.peak_blocks.max(t.current_blocks);
        t.total_blocks += 1;
    }

    /// Counts the deallocation of a block of `bytes` tagged `tag`.
    pub fn record_deallocate(&self, bytes: usize, tag: AllocTag) {
        let o = &self.inner.overall;
        // Saturating: a block allocated before this layer wrapped the
        // resource must not wrap the counters around.
        let _ = o
            .current_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(bytes))
            });
        let _ = o
            .current_blocks
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(1))
            });
        let mut map = self.lock();
        let t = map.entry(tag).or_default();
        t.current_bytes = t.current_bytes.saturating_sub(bytes);
        t.current_blocks = t.current_blocks.saturating_sub(1);
    }

    /// Counts a failed allocation tagged `tag`.
    pub fn record_failure(&self, tag: AllocTag) {
        self.inner
            .overall
            .failed_allocations
            .fetch_add(1, Ordering::AcqRel);
        self.lock().entry(tag).or_default().failed_allocations += 1;
    }

    /// A copy of every counter. The overall counts and the per-tag table are
    /// read one after the other, so under concurrent traffic they may differ
    /// by the calls in flight.
    pub fn snapshot(&self) -> StatsSnapshot {
        let overall = self.inner.overall.snapshot();
        let mut per_tag: Vec<(AllocTag, Counts)> =
            self.lock().iter().map(|(t, c)| (*t, *c)).collect();
        per_tag.sort_by_key(|a| a.0);
        StatsSnapshot { overall, per_tag }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AllocTag, Counts>> {
        self.inner.per_tag.lock().unwrap_or_else(|p| p.into_inner())
    }
}
