//! [`StatsLayer`]: wraps resources in [`StatsResource`]s sharing counters.

use super::{Stats, StatsResource};
use crate::adaptors::Layer;

/// Wraps every resource it is given in a [`StatsResource`] that counts into
/// the layer's [`Stats`].
#[derive(Debug, Clone, Default)]
pub struct StatsLayer {
    stats: Stats,
}

impl StatsLayer {
    /// A layer with fresh counters; read them through
    /// [`stats`](Self::stats).
    pub fn new() -> Self {
        Self::default()
    }

    /// A layer counting into `stats` (a clone shares the counters).
    pub fn with_stats(stats: &Stats) -> Self {
        StatsLayer {
            stats: stats.clone(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

impl<R> Layer<R> for StatsLayer {
    type Resource = StatsResource<R>;

    fn layer(&self, inner: R) -> StatsResource<R> {
        StatsResource::new(inner, &self.stats)
    }
}
