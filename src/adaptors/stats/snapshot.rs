//! [`StatsSnapshot`]: a plain copy of the counters, printable as a table.

use std::fmt;

use crate::types::AllocTag;

/// Counts of one tag, or of all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
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
    /// Allocations that failed.
    pub failed_allocations: u64,
}

/// Every counter of a [`Stats`](super::Stats), copied at one moment.
///
/// `Display` prints one row per tag and a total row:
///
/// ```text
/// tag            current B     peak B    total B  cur blk  peak blk  tot blk  failed
/// activations            0         50         50        0         1        1       0
/// weights              100        100        100        1         1        1       0
/// (all)                100        150        150        1         2        2       0
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Counts over every tag.
    pub overall: Counts,
    /// Counts per tag, sorted by tag.
    pub per_tag: Vec<(AllocTag, Counts)>,
}

impl StatsSnapshot {
    /// The counts of `tag`, if any allocation carried it.
    pub fn tag(&self, tag: AllocTag) -> Option<&Counts> {
        self.per_tag.iter().find(|(t, _)| *t == tag).map(|(_, c)| c)
    }
}

fn row(f: &mut fmt::Formatter<'_>, name: &dyn fmt::Display, c: &Counts) -> fmt::Result {
    writeln!(
        f,
        "{:<12} {:>12} {:>10} {:>10} {:>8} {:>9} {:>8} {:>7}",
        name.to_string(),
        c.current_bytes,
        c.peak_bytes,
        c.total_bytes,
        c.current_blocks,
        c.peak_blocks,
        c.total_blocks,
        c.failed_allocations
    )
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<12} {:>12} {:>10} {:>10} {:>8} {:>9} {:>8} {:>7}",
            "tag", "current B", "peak B", "total B", "cur blk", "peak blk", "tot blk", "failed"
        )?;
        for (tag, counts) in &self.per_tag {
            row(f, tag, counts)?;
        }
        row(f, &"(all)", &self.overall)
    }
}
