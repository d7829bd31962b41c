//! What an [`AsyncResource`] can tell about itself, now: bytes
//! outstanding, the queue of waiting allocations, parked points and
//! notifications, a [`MemorySnapshot`] of the whole stack, the long form
//! of an out-of-memory error ([`OomReport`]) and how completion futures
//! waited ([`WaitStats`]).
//!
//! Each reads counters or copies under a lock in turn; none makes a
//! driver call that waits or synchronizes a stream, so a task may call
//! them while the stack serves others. Nothing here changes the stack.

#![forbid(unsafe_code)]

use super::async_resource::AsyncResource;
use super::queue_stats::QueueStats;
use super::wait_stats::WaitStats;
use crate::error::ResourceError;
use crate::observe::history;
use crate::observe::{MemorySnapshot, OomReport, WaitersInfo};
use crate::resource::DeviceMemoryResource;

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Bytes outstanding in the inner resource (live plus pending frees).
    pub fn bytes_outstanding(&self) -> usize {
        self.inner().bytes_outstanding()
    }

    /// Allocations (and reservations) waiting for memory now.
    pub fn waiting_allocations(&self) -> usize {
        self.core().allocs.len()
    }

    /// The queue of waiting allocations: its length and oldest wait now,
    /// and how the requests that waited left it (served, failed,
    /// cancelled, with their waits). Takes the queue's lock once.
    pub fn queue_stats(&self) -> QueueStats {
        self.core().allocs.stats()
    }

    /// How long the oldest request waiting now has waited (`None` when
    /// none waits).
    pub fn oldest_wait(&self) -> Option<std::time::Duration> {
        self.core().allocs.stats().oldest_wait
    }

    /// Points (futures and awaited frees) waiting for a notification now.
    pub fn parked_points(&self) -> usize {
        self.core()
            .notifiers()
            .iter()
            .map(|n| n.waiter_count())
            .sum()
    }

    /// Notifications (host functions) queued so far, on all streams. With
    /// coalescing it stays far below the number of awaited points.
    pub fn notifications(&self) -> u64 {
        self.core().notifiers().iter().map(|n| n.launches()).sum()
    }

    /// Where the memory of the stack is, now: every layer's part (see
    /// [`MemorySnapshot`]), the allocations waiting, and this device's
    /// events of the [history](crate::record_memory_history) if it is on.
    ///
    /// It copies under each layer's locks in turn, never across a driver
    /// call that waits, and does not synchronize: it may be called from a
    /// task, while the stack serves others (`BENCHMARKS.md` says what it
    /// costs).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamalloc::ResourceError> {
    /// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::new(), 1);
    /// let res = AsyncResource::on(&device)?;
    /// let block = res.allocate(1 << 20, device.stream(0)?, AllocTag("weights")).await?;
    /// let snapshot = res.snapshot();
    /// assert_eq!(snapshot.bytes_by_tag(), vec![("weights", 1 << 20)]);
    /// # drop(res.deallocate(block)?);
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&self) -> MemorySnapshot {
        let mut snapshot = MemorySnapshot::new(self.inner().device_ordinal());
        snapshot.waiters = Some(WaitersInfo {
            waiting: self.core().allocs.len(),
            parked_points: self.parked_points(),
        });
        self.inner().snapshot_into(&mut snapshot);
        let device = snapshot.device;
        snapshot.history = history::memory_history()
            .into_iter()
            .filter(|e| e.device == device)
            .collect();
        snapshot.date_blocks_from_history();
        snapshot
    }

    /// The long form of an out-of-memory or budget error `error` of this
    /// stack: what was asked and free, what the cache holds idle and its
    /// largest idle range, the frees pending on the GPU, the tags holding
    /// the most (see [`OomReport`]), from a [`snapshot`](Self::snapshot)
    /// taken now: call it right after the error. `None` for other errors.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamalloc::ResourceError> {
    /// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::builder().capacity(1 << 20).build(), 1);
    /// let res = AsyncResource::on(&device)?;
    /// let err = res.allocate(2 << 20, device.stream(0)?, AllocTag("big")).await.unwrap_err();
    /// println!("{err}");                               // one line
    /// println!("{}", res.oom_report(&err).unwrap());   // who holds what
    /// # Ok(()) }
    /// ```
    pub fn oom_report(&self, error: &ResourceError) -> Option<OomReport> {
        OomReport::new(error, &self.snapshot())
    }

    /// How this resource's completion futures waited so far, summed over
    /// its streams (see [`WaitStats`]).
    pub fn wait_stats(&self) -> WaitStats {
        let mut total = WaitStats::default();
        for n in self.core().notifiers() {
            total.add(&n.stats());
        }
        total
    }
}
