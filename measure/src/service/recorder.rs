//! What one level of one way measured: latencies, live requested bytes,
//! threads blocked in a wait, and the table row they make.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Counters shared by the clients of one level of one way.
#[derive(Debug, Default)]
pub struct Recorder {
    latencies: Mutex<Vec<Duration>>,
    live: AtomicUsize,
    peak_live: AtomicUsize,
    blocked: AtomicUsize,
    peak_blocked: AtomicUsize,
}

impl Recorder {
    /// A request asked for `bytes`: they are live until [`released`](Self::released).
    pub fn requested(&self, bytes: usize) {
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_live.fetch_max(now, Ordering::Relaxed);
    }

    /// A request let `bytes` go (its work had completed).
    pub fn released(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// A request was answered after `latency`.
    pub fn answered(&self, latency: Duration) {
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(latency);
    }

    /// Runs `wait` (a blocking wait on a thread of the runtime's blocking
    /// pool), counted as one thread blocked while it runs.
    pub fn blocked_in<T>(&self, wait: impl FnOnce() -> T) -> T {
        let now = self.blocked.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_blocked.fetch_max(now, Ordering::Relaxed);
        let out = wait();
        self.blocked.fetch_sub(1, Ordering::Relaxed);
        out
    }

    /// Requests answered so far.
    pub fn answered_count(&self) -> usize {
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Bytes requested and not yet let go.
    pub fn live_bytes(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The row of this level: `elapsed` is the whole level's time, `held`
    /// the peak its backend held, `threads` the peak thread count of the
    /// process while it ran.
    pub fn finish(
        &self,
        way: &str,
        clients: usize,
        elapsed: Duration,
        held: usize,
        threads: usize,
    ) -> LevelResult {
        let mut lat = self
            .latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        lat.sort();
        let pick = |q: f64| {
            if lat.is_empty() {
                Duration::ZERO
            } else {
                lat[((lat.len() - 1) as f64 * q).round() as usize]
            }
        };
        LevelResult {
            way: way.to_string(),
            clients,
            requests: lat.len(),
            elapsed,
            p50: pick(0.50),
            p99: pick(0.99),
            peak_held: held,
            peak_requested: self.peak_live.load(Ordering::Relaxed),
            peak_blocked: self.peak_blocked.load(Ordering::Relaxed),
            peak_threads: threads,
        }
    }
}

/// One row of the table: one way at one number of clients.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelResult {
    /// `streamalloc`, `cudarc` or `cuda-async`.
    pub way: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Requests answered.
    pub requests: usize,
    /// Time from the first request to the last answer.
    pub elapsed: Duration,
    /// Median latency of a request (memory, copies, model, completion).
    pub p50: Duration,
    /// 99th-percentile latency.
    pub p99: Duration,
    /// The most device memory the way's backend held (its pool's reserved
    /// high-water mark), bytes.
    pub peak_held: usize,
    /// The most bytes requests had asked for and not let go, bytes.
    pub peak_requested: usize,
    /// The most threads blocked in a wait at once (the cudarc way's
    /// `spawn_blocking` synchronizes; the others block none).
    pub peak_blocked: usize,
    /// The most threads the process had while the level ran.
    pub peak_threads: usize,
}

impl LevelResult {
    /// Requests answered per second.
    pub fn requests_per_s(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Peak held over peak live requested.
    pub fn held_ratio(&self) -> f64 {
        self.peak_held as f64 / self.peak_requested.max(1) as f64
    }

    /// The CSV row (see [`csv_header`]).
    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{:.6},{:.1},{:.1},{:.1},{},{},{:.3},{},{}",
            self.way,
            self.clients,
            self.requests,
            self.elapsed.as_secs_f64(),
            self.requests_per_s(),
            self.p50.as_secs_f64() * 1e6,
            self.p99.as_secs_f64() * 1e6,
            self.peak_held,
            self.peak_requested,
            self.held_ratio(),
            self.peak_blocked,
            self.peak_threads
        )
    }

    /// The Markdown row.
    pub fn markdown_row(&self) -> String {
        const MIB: f64 = (1u64 << 20) as f64;
        format!(
            "| {} | {} | {} | {:.0} | {:.0} µs | {:.0} µs | {:.0} MiB | {:.0} MiB | {:.2}× | {} | {} |",
            self.way,
            self.clients,
            self.requests,
            self.requests_per_s(),
            self.p50.as_secs_f64() * 1e6,
            self.p99.as_secs_f64() * 1e6,
            self.peak_held as f64 / MIB,
            self.peak_requested as f64 / MIB,
            self.held_ratio(),
            self.peak_blocked,
            self.peak_threads
        )
    }
}

/// The CSV header of [`LevelResult::csv_row`].
pub fn csv_header() -> &'static str {
    "way,clients,requests,elapsed_s,requests_per_s,p50_us,p99_us,peak_held_bytes,peak_requested_bytes,held_over_requested,peak_blocked_threads,peak_process_threads"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_peaks_and_row() {
        let r = Recorder::default();
        for us in 1..=100u64 {
            r.answered(Duration::from_micros(us));
        }
        r.requested(100);
        r.requested(50);
        r.released(100);
        r.requested(20);
        assert_eq!(r.live_bytes(), 70);
        r.blocked_in(|| r.blocked_in(|| ()));
        let row = r.finish("w", 4, Duration::from_secs(2), 300, 9);
        assert_eq!(row.requests, 100);
        assert_eq!(row.p50, Duration::from_micros(51));
        assert_eq!(row.p99, Duration::from_micros(99));
        assert_eq!(row.peak_requested, 150);
        assert_eq!(row.peak_blocked, 2);
        assert_eq!(row.requests_per_s(), 50.0);
        assert_eq!(row.held_ratio(), 2.0);
        assert_eq!(
            row.csv_row().split(',').count(),
            csv_header().split(',').count()
        );
    }
}
