//! The process's thread count, sampled while a level runs: how many threads
//! a way made (the cudarc way's blocking pool grows with its clients).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Samples `Threads:` of `/proc/self/status` every millisecond on its own
/// thread until [`stop`](Self::stop); 0 where that file does not exist.
#[derive(Debug)]
pub struct ThreadSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

/// The process's thread count now, when the system says.
pub fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

impl ThreadSampler {
    /// Starts sampling.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(thread_count().unwrap_or(0)));
        let thread = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(n) = thread_count() {
                        peak.fetch_max(n, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        ThreadSampler {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the most threads seen (the sampler's own included).
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for ThreadSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
