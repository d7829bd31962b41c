//! [`OomReport`]: who holds the memory an allocation did not get.
//!
//! An out-of-memory or budget error keeps its one-line `Display` (a log
//! line, a `?` chain). The report is the long form, made from the error and
//! a [`MemorySnapshot`] of the stack taken right after it
//! ([`AsyncResource::oom_report`](crate::AsyncResource::oom_report)): what
//! was asked, what the device or budget had, how much of what the stack
//! holds sits idle in a cache (it could be given back), whether the free
//! memory is in pieces too small (the largest idle range), how much waits
//! for the GPU to run its frees, and the tags that hold the most.

use std::fmt;

use super::snapshot::MemorySnapshot;
use crate::error::ResourceError;

/// How many tags a report names.
const TOP_TAGS: usize = 5;

/// The long form of an out-of-memory or budget error: what was asked,
/// what the device or budget had, how much the stack's cache holds idle
/// and the largest idle range (fragmentation), the frees pending on the
/// GPU, and the tags that hold the most. Its `Display` is several lines;
/// the error's own stays one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OomReport {
    /// The error's own line.
    pub error: String,
    /// Bytes asked for (device bytes, for a budget).
    pub requested: usize,
    /// Bytes the device reported free (out of memory), or the budget had
    /// left under its limit.
    pub free: usize,
    /// The budget's limit, for a budget error.
    pub limit: Option<usize>,
    /// Bytes the device had in all, when known.
    pub device_total: Option<usize>,
    /// Bytes held mapped and idle by the stack's cache.
    pub idle_in_cache: usize,
    /// The largest idle range of the cache: a request larger than it needs
    /// new memory even when `idle_in_cache` is larger (fragmentation).
    pub largest_idle_range: usize,
    /// Bytes freed and queued on the GPU, not yet known to have run.
    pub pending_frees: usize,
    /// Bytes held by callers.
    pub held_by_callers: usize,
    /// The tags holding the most, with their bytes, the largest first.
    pub top_tags: Vec<(&'static str, usize)>,
    /// Allocations waiting for memory, when the snapshot came through the
    /// futures layer.
    pub waiting: Option<usize>,
}

impl OomReport {
    /// The report on `error` from `snapshot`; `None` when the error is not
    /// one of memory ([`OutOfMemory`](ResourceError::OutOfMemory),
    /// [`BudgetExceeded`](ResourceError::BudgetExceeded)).
    pub fn new(error: &ResourceError, snapshot: &MemorySnapshot) -> Option<Self> {
        let (requested, free, limit) = match *error {
            ResourceError::OutOfMemory {
                requested,
                available,
                ..
            } => (requested, available, None),
            ResourceError::BudgetExceeded {
                requested,
                limit,
                in_use,
            } => (requested, limit.saturating_sub(in_use), Some(limit)),
            _ => return None,
        };
        let by_tag = snapshot.bytes_by_tag();
        Some(OomReport {
            error: error.to_string(),
            requested,
            free,
            limit,
            device_total: snapshot.device_memory.map(|(_, total)| total),
            idle_in_cache: snapshot.idle_bytes(),
            largest_idle_range: snapshot.largest_idle_range(),
            pending_frees: snapshot.pending_free_bytes(),
            held_by_callers: by_tag.iter().map(|(_, b)| b).sum(),
            top_tags: by_tag.into_iter().take(TOP_TAGS).collect(),
            waiting: snapshot.waiters.map(|w| w.waiting),
        })
    }
}

/// Bytes as a person reads them.
pub(crate) fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

impl fmt::Display for OomReport {
    /// Several lines: the error, then one fact a line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.error)?;
        writeln!(f, "  requested:             {}", human(self.requested))?;
        match (self.limit, self.device_total) {
            (Some(limit), _) => writeln!(
                f,
                "  free under the budget: {} of {}",
                human(self.free),
                human(limit)
            )?,
            (None, Some(total)) => writeln!(
                f,
                "  free on the device:    {} of {}",
                human(self.free),
                human(total)
            )?,
            (None, None) => writeln!(f, "  free on the device:    {}", human(self.free))?,
        }
        writeln!(
            f,
            "  held by callers:       {}",
            human(self.held_by_callers)
        )?;
        writeln!(
            f,
            "  idle in the cache:     {} (largest idle range {})",
            human(self.idle_in_cache),
            human(self.largest_idle_range)
        )?;
        if self.idle_in_cache >= self.requested && self.largest_idle_range < self.requested {
            writeln!(
                f,
                "    fragmented: enough idle memory, no range of it large enough"
            )?;
        }
        writeln!(f, "  frees pending on GPU:  {}", human(self.pending_frees))?;
        if let Some(waiting) = self.waiting {
            writeln!(f, "  allocations waiting:   {waiting}")?;
        }
        write!(f, "  top tags:")?;
        if self.top_tags.is_empty() {
            write!(f, " (none)")?;
        }
        for (tag, bytes) in &self.top_tags {
            write!(f, "\n    {tag:<20} {}", human(*bytes))?;
        }
        Ok(())
    }
}
