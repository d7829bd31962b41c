//! [`QueueStats`]: what the queue of waiting allocations looks like now,
//! and how the requests that waited in it left.
//!
//! The [wait queue](super::wait_queue) keeps these figures under its own
//! lock, updated when a request queues and when it leaves; nothing on the
//! path of an allocation served at once touches them (no clock is read
//! unless a request queues).

#![forbid(unsafe_code)]

use std::time::Duration;

/// The wait queue of an [`AsyncResource`](super::AsyncResource): its
/// length and oldest wait now, and how the requests that waited left it
/// (read by [`AsyncResource::queue_stats`](super::AsyncResource::queue_stats)).
///
/// A request is an allocation or a whole reservation. Requests served at
/// once, without queueing, are not counted here (a
/// [`Stats`](crate::Stats) layer counts every allocation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests waiting now.
    pub waiting: usize,
    /// How long the oldest request waiting now has waited.
    pub oldest_wait: Option<Duration>,
    /// Requests served after waiting.
    pub served: u64,
    /// Requests that failed after waiting (a device failure, a closed
    /// resource, a hold-and-wait verdict).
    pub failed: u64,
    /// Requests dropped while waiting (a deadline, a cancelled task).
    pub cancelled: u64,
    /// Time the served requests waited, in all.
    pub wait_total: Duration,
    /// The longest wait of a served request.
    pub wait_max: Duration,
}

impl QueueStats {
    /// The mean wait of the requests served after waiting (zero when none
    /// waited).
    pub fn wait_mean(&self) -> Duration {
        match u32::try_from(self.served) {
            Ok(0) => Duration::ZERO,
            Ok(n) => self.wait_total / n,
            Err(_) => {
                Duration::from_nanos((self.wait_total.as_nanos() / u128::from(self.served)) as u64)
            }
        }
    }
}
