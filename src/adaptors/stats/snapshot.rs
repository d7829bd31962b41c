//! [`StatsSnapshot`]: a plain copy of the counters, printable as a table.

use std::fmt;

use crate::types::AllocTag;

/// Counts of one tag, or of all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsCounts {
    /// Bytes allocated and not yet deallocated.
    pub current_bytes: usize,
    /// The highest `current_bytes` seen.
    pub peak_bytes: usize,
    /// Bytes of every successful allocation so far.
    pub total_bytes: u64,
    /// Blocks allocated and not yet deallocated.
    pub current_blocks: usize,
    /// The highest `current_blocks` seen.
    pub peak_blocks: usize,
    /// Successful allocations so far.
    pub total_blocks: u64,
    /// Allocations that failed: refused by the stack to a caller that
    /// does not wait, or failed after waiting (a device failure, a closed
    /// resource, a hold-and-wait verdict).
    pub failed_allocations: u64,
    /// Tries refused for lack of memory while their request waits in the
    /// futures layer's queue: back-pressure, not failures (the request is
    /// counted in `waited`, `failed_allocations` or `cancelled_waits` when
    /// it leaves the queue).
    pub refused_tries: u64,
    /// Requests (an allocation, or a reservation of several blocks) served
    /// after waiting in the queue.
    pub waited: u64,
    /// Nanoseconds the requests counted in `waited` spent waiting, in all.
    pub wait_total_ns: u64,
    /// The longest of those waits, in nanoseconds.
    pub wait_max_ns: u64,
    /// Requests dropped while they waited (a deadline, a cancelled task).
    pub cancelled_waits: u64,
}

impl StatsCounts {
    /// The mean wait of the requests served after waiting, in nanoseconds
    /// (0 when none waited).
    pub fn wait_mean_ns(&self) -> u64 {
        self.wait_total_ns.checked_div(self.waited).unwrap_or(0)
    }
}

/// How a request that waited in the futures layer's queue left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueOutcome {
    /// Served.
    Served,
    /// Failed with an error.
    Failed,
    /// Dropped while it waited.
    Cancelled,
}

/// Every counter of a [`Stats`](super::Stats), copied at one moment.
///
/// `Display` prints one row per tag and a total row:
///
/// ```text
/// tag            current B     peak B    total B  cur blk  peak blk  tot blk  failed  waited  wait avg µs  wait max µs  cancelled
/// activations            0         50         50        0         1        1       0       0            0            0          0
/// weights              100        100        100        1         1        1       0       0            0            0          0
/// (all)                100        150        150        1         2        2       0       0            0            0          0
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Counts over every tag.
    pub overall: StatsCounts,
    /// Counts per tag, sorted by tag.
    pub per_tag: Vec<(AllocTag, StatsCounts)>,
}

impl StatsSnapshot {
    /// The counts of `tag`, if any allocation carried it.
    pub fn tag(&self, tag: AllocTag) -> Option<&StatsCounts> {
        self.per_tag.iter().find(|(t, _)| *t == tag).map(|(_, c)| c)
    }
}

fn row(f: &mut fmt::Formatter<'_>, name: &dyn fmt::Display, c: &StatsCounts) -> fmt::Result {
    writeln!(
        f,
        "{:<12} {:>12} {:>10} {:>10} {:>8} {:>9} {:>8} {:>7} {:>7} {:>12} {:>12} {:>10}",
        name.to_string(),
        c.current_bytes,
        c.peak_bytes,
        c.total_bytes,
        c.current_blocks,
        c.peak_blocks,
        c.total_blocks,
        c.failed_allocations,
        c.waited,
        c.wait_mean_ns() / 1000,
        c.wait_max_ns / 1000,
        c.cancelled_waits
    )
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<12} {:>12} {:>10} {:>10} {:>8} {:>9} {:>8} {:>7} {:>7} {:>12} {:>12} {:>10}",
            "tag",
            "current B",
            "peak B",
            "total B",
            "cur blk",
            "peak blk",
            "tot blk",
            "failed",
            "waited",
            "wait avg µs",
            "wait max µs",
            "cancelled"
        )?;
        for (tag, counts) in &self.per_tag {
            row(f, tag, counts)?;
        }
        row(f, &"(all)", &self.overall)
    }
}
