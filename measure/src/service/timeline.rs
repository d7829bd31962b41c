//! [`Timeline`]: when the GPU worked on requests, from timing events
//! recorded before each request's first copy and after its last, on its
//! stream (`--diag` of the service benchmark, the same for every way, since
//! [`CudaModel`](super::cuda_model::CudaModel) records them).
//!
//! After a level, with every stream synchronized, the intervals give:
//! - the **busy fraction**: the time at least one request was in progress
//!   on the GPU over the span from the first start to the last end. Below
//!   1 the GPU sat idle while clients waited: the host side (submission,
//!   completion, allocation) is what limits the way;
//! - the mean **time in progress** of one request on the GPU (from its
//!   stream reaching its first copy to its last copy done): longer than
//!   another way's at the same load means the GPU ran its work slower
//!   (less concurrency between streams, work added on the streams).

#![allow(unsafe_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::result::event;
use cudarc::driver::sys::{CUevent, CUevent_flags, CUstream};

/// The events of the requests of one level. See the [module
/// documentation](self).
#[derive(Debug, Default)]
pub struct Timeline {
    /// `None` while no level is being recorded.
    pairs: Mutex<Option<Vec<(usize, usize)>>>,
    /// A copy of `pairs.is_some()`, so that a request pays one load when
    /// nothing is recorded.
    on: AtomicBool,
}

/// What a level's events say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    /// Requests with both events.
    pub requests: usize,
    /// Time with at least one request in progress over the span.
    pub fraction: f64,
    /// From the first start to the last end, ms.
    pub span_ms: f64,
    /// Mean time in progress of one request, µs.
    pub mean_request_us: f64,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU busy {:.1} % of {:.1} ms; a request in progress {:.1} µs on average ({} requests)",
            self.fraction * 100.0,
            self.span_ms,
            self.mean_request_us,
            self.requests
        )
    }
}

impl Timeline {
    /// Starts recording (drops what a previous level left).
    pub fn begin(&self) {
        let old = self
            .pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(Vec::new());
        self.on.store(true, Ordering::Release);
        destroy(old.unwrap_or_default());
    }

    /// Whether a level is being recorded.
    pub fn recording(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Records a start event on `stream` now; the returned handle goes to
    /// [`end`](Self::end) after the request's work. `None` when not
    /// recording or when an event cannot be made.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context.
    pub unsafe fn start(&self, stream: CUstream) -> Option<usize> {
        if !self.recording() {
            return None;
        }
        let e = event::create(CUevent_flags::CU_EVENT_DEFAULT).ok()?;
        // SAFETY: `e` was just made; `stream` is live (the caller's).
        if unsafe { event::record(e, stream) }.is_err() {
            // SAFETY: made above, recorded nowhere.
            let _ = unsafe { event::destroy(e) };
            return None;
        }
        Some(e as usize)
    }

    /// Records the end event of the request started as `start`.
    ///
    /// # Safety
    /// `stream` is the live stream `start` was recorded on.
    pub unsafe fn end(&self, start: Option<usize>, stream: CUstream) {
        let Some(s) = start else { return };
        let Ok(e) = event::create(CUevent_flags::CU_EVENT_DEFAULT) else {
            // SAFETY: the start event, ours, recorded; destroying a recorded
            // event is allowed (its record still completes).
            let _ = unsafe { event::destroy(s as CUevent) };
            return;
        };
        // SAFETY: `e` was just made; `stream` is live.
        let _ = unsafe { event::record(e, stream) };
        let mut pairs = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        match pairs.as_mut() {
            Some(v) => v.push((s, e as usize)),
            None => destroy(vec![(s, e as usize)]),
        }
    }

    /// Stops recording and reads the intervals. Call once every stream
    /// that ran the level's requests is synchronized.
    pub fn finish(&self) -> Option<Busy> {
        self.on.store(false, Ordering::Release);
        let pairs = self
            .pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        let base = pairs.first()?.0 as CUevent;
        let mut spans: Vec<(f64, f64)> = pairs
            .iter()
            .filter_map(|&(s, e)| {
                // SAFETY: our events, recorded, and complete (the caller
                // synchronized their streams).
                let a = unsafe { event::elapsed(base, s as CUevent) }.ok()?;
                // SAFETY: as above.
                let b = unsafe { event::elapsed(base, e as CUevent) }.ok()?;
                Some((f64::from(a), f64::from(b)))
            })
            .collect();
        destroy(pairs);
        if spans.is_empty() {
            return None;
        }
        let requests = spans.len();
        let mean = spans.iter().map(|(a, b)| b - a).sum::<f64>() / requests as f64;
        spans.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (first, last) = (
            spans[0].0,
            spans.iter().map(|s| s.1).fold(f64::MIN, f64::max),
        );
        let mut busy = 0.0;
        let (mut lo, mut hi) = spans[0];
        for &(a, b) in &spans[1..] {
            if a > hi {
                busy += hi - lo;
                (lo, hi) = (a, b);
            } else {
                hi = hi.max(b);
            }
        }
        busy += hi - lo;
        let span = (last - first).max(1e-9);
        Some(Busy {
            requests,
            fraction: busy / span,
            span_ms: span,
            mean_request_us: mean * 1e3,
        })
    }
}

fn destroy(pairs: Vec<(usize, usize)>) {
    for (s, e) in pairs {
        // SAFETY: our events, each destroyed once (taken out of the list).
        unsafe {
            let _ = event::destroy(s as CUevent);
            let _ = event::destroy(e as CUevent);
        }
    }
}
