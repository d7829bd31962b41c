//! [`WaitStats`]: how the completion futures of a resource waited.

use crate::util::sync::{AtomicU64, Ordering};

/// How the completion futures of an [`AsyncResource`](super::AsyncResource)
/// waited, summed over its streams since it was made
/// ([`AsyncResource::wait_stats`](super::AsyncResource::wait_stats)).
///
/// Read it to tune a [`WaitPolicy`](super::WaitPolicy): many `parks` and
/// `notifications` per point mean futures outwait their spin and yield
/// budget (host functions are the costly path); many `queries` per point
/// mean they poll a long time. [`since`](Self::since) gives the counts of
/// one stretch of work.
///
/// A future adds its queries, spins and yields when it is dropped (one
/// shared update per future, not one per poll), so futures still alive are
/// not counted yet.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use streamalloc::AsyncResource;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let res = AsyncResource::on(&device)?;
/// let before = res.wait_stats();
/// res.completion(device.stream(0)?)?.await?;
/// let stats = res.wait_stats().since(&before);
/// assert_eq!(stats.points, 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitStats {
    /// Completion points made (futures and queued frees).
    pub points: u64,
    /// Queries of a future's own event, or of its stream while a lazy
    /// point has none ([`completion_lazy`](super::AsyncResource::completion_lazy)).
    pub queries: u64,
    /// Queries of a stream's newest point made to settle the points before
    /// it at once.
    pub frontier_queries: u64,
    /// First polls that found the work pending and spun.
    pub spins: u64,
    /// Polls that yielded to the executor (waking their own task).
    pub yields: u64,
    /// Times a future parked on a notification.
    pub parks: u64,
    /// Notifications (host functions) queued.
    pub notifications: u64,
}

impl WaitStats {
    /// The counts between `earlier` and `self` (both read from the same
    /// resource).
    pub fn since(&self, earlier: &WaitStats) -> WaitStats {
        WaitStats {
            points: self.points.saturating_sub(earlier.points),
            queries: self.queries.saturating_sub(earlier.queries),
            frontier_queries: self
                .frontier_queries
                .saturating_sub(earlier.frontier_queries),
            spins: self.spins.saturating_sub(earlier.spins),
            yields: self.yields.saturating_sub(earlier.yields),
            parks: self.parks.saturating_sub(earlier.parks),
            notifications: self.notifications.saturating_sub(earlier.notifications),
        }
    }

    pub(crate) fn add(&mut self, other: &WaitStats) {
        self.points += other.points;
        self.queries += other.queries;
        self.frontier_queries += other.frontier_queries;
        self.spins += other.spins;
        self.yields += other.yields;
        self.parks += other.parks;
        self.notifications += other.notifications;
    }
}

/// What one future did, added to its stream's [`Tally`] when it is dropped.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FutureTally {
    pub(crate) queries: u32,
    pub(crate) spins: u32,
    pub(crate) yields: u32,
}

/// The counts futures fold in as they end. Aligned to its own cache lines:
/// futures on several threads add to it, and it must not share a line with
/// the notifier's lock, which the submitting thread takes.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Tally {
    queries: AtomicU64,
    spins: AtomicU64,
    yields: AtomicU64,
}

impl Tally {
    pub(crate) fn fold(&self, t: FutureTally) {
        for (counter, n) in [
            (&self.queries, t.queries),
            (&self.spins, t.spins),
            (&self.yields, t.yields),
        ] {
            if n > 0 {
                counter.fetch_add(u64::from(n), Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn read(&self) -> (u64, u64, u64) {
        (
            self.queries.load(Ordering::Relaxed),
            self.spins.load(Ordering::Relaxed),
            self.yields.load(Ordering::Relaxed),
        )
    }
}
