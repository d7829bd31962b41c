//! [`Stats`]: the live counters behind a stats layer.

use std::sync::Arc;
use std::time::Duration;

use crate::util::count_lock::{CountGuard, CountLock};

use super::table::Tally;
use super::{QueueOutcome, StatsSnapshot};
use crate::types::AllocTag;

/// The counters of one or more [`StatsResource`](super::StatsResource)s.
///
/// Cloning shares the counters: hand a clone to a
/// [`StatsLayer`](super::StatsLayer) and keep one to read.
///
/// # Examples
/// ```
/// use streamalloc::{Stats, StatsResource};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let s = device.stream(0)?;
/// let stats = Stats::new();
/// let r = StatsResource::new(SimResource::new(&device), &stats);
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
    /// Overall and per-tag counts under one lock: one lock and unlock per
    /// call (one atomic read-modify-write) costs less than the half-dozen
    /// that separate overall counters would, and a snapshot sees both agree.
    inner: Arc<CountLock<Tally>>,
}

impl Stats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts an allocation of `bytes` tagged `tag`.
    // Always: a call costs as much as the counting (a pair through a stats
    // layer over a cache paid 32 instructions of call frames).
    #[inline(always)]
    pub fn record_allocate(&self, bytes: usize, tag: AllocTag) {
        self.lock().allocation(bytes, tag);
    }

    /// Counts the deallocation of a block of `bytes` tagged `tag`.
    #[inline(always)]
    pub fn record_deallocate(&self, bytes: usize, tag: AllocTag) {
        self.lock().deallocation(bytes, tag);
    }

    /// Counts a failed allocation tagged `tag`.
    pub fn record_failure(&self, tag: AllocTag) {
        self.lock().failure(tag);
    }

    /// Counts a try tagged `tag` refused for lack of memory while its
    /// request waits (back-pressure, not a failure).
    pub fn record_refusal(&self, tag: AllocTag) {
        self.lock().refusal(tag);
    }

    /// Counts a request tagged `tag` that left the futures layer's wait
    /// queue after `wait`, served, failed or cancelled.
    pub fn record_wait(&self, tag: AllocTag, wait: Duration, outcome: QueueOutcome) {
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.lock().wait(tag, ns, outcome);
    }

    /// A copy of every counter, all taken at one moment (the overall counts
    /// are the sums of the per-tag ones, peaks aside).
    pub fn snapshot(&self) -> StatsSnapshot {
        let tally = self.lock();
        StatsSnapshot {
            overall: tally.overall(),
            per_tag: tally.per_tag(),
        }
    }

    #[inline]
    fn lock(&self) -> CountGuard<'_, Tally> {
        self.inner.lock()
    }
}
