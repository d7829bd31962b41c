//! Whether asking the CUDA driver about a stream's capture can answer
//! anything but "not capturing".
//!
//! Every capture-aware layer asks [`Gpu::capture_status`](super::Gpu::capture_status)
//! on its hot paths (a cached allocation, a free, a completion). One
//! `cuStreamGetCaptureInfo` is cheap on one thread, but it takes a lock
//! inside the driver: two of them per cached allocation pair made the pair
//! more than half again as dear on one thread, and cut the cache's pairs
//! per second at 16 threads more than tenfold (BENCHMARKS.md, "Figures the
//! code's comments cite"). So, like PyTorch's
//! `captures_underway`, the CUDA backend counts the captures begun through
//! the crate ([`Gpu::begin_capture`](super::Gpu::begin_capture), which
//! [`GraphCapture`](crate::GraphCapture) and
//! [`AsyncResource::capture_graph`](crate::AsyncResource::capture_graph)
//! use) and asks the driver only while one is underway. While one is, every
//! stream is asked, so a stream that joined the capture (by waiting on one
//! of its events) is seen too.
//!
//! A capture begun behind the crate's back (cudarc's
//! `CudaStream::begin_capture` on a pool stream) is invisible in the
//! default mode: call [`detect_foreign_captures(true)`](detect_foreign_captures)
//! once, and every call asks the driver whatever the count.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Captures begun through the crate and not yet ended, process-wide
/// (several backends may share one CUDA context).
static UNDERWAY: AtomicUsize = AtomicUsize::new(0);

/// Whether every call asks the driver (captures begun outside the crate).
static ALWAYS_ASK: AtomicBool = AtomicBool::new(false);

/// Makes every capture query ask the driver (`true`), for code that
/// captures the crate's streams with cudarc's own `begin_capture`; `false`
/// (the default) asks only while a capture begun through the crate is
/// underway. Process-wide.
pub fn detect_foreign_captures(on: bool) {
    ALWAYS_ASK.store(on, Ordering::Release);
}

/// Whether a capture query must ask the driver.
pub(crate) fn must_ask() -> bool {
    // Acquire pairs with the Release of `begin`: a thread that sees a
    // capture's work queued through the crate after its `begin_capture`
    // returned sees the count too (the same stream handle reaches it through
    // a lock or a channel, which orders at least as strongly).
    UNDERWAY.load(Ordering::Acquire) > 0 || ALWAYS_ASK.load(Ordering::Acquire)
}

/// A capture is about to begin: counted before the driver call, so no
/// query made after the capture began can skip the driver.
pub(crate) fn begin() {
    UNDERWAY.fetch_add(1, Ordering::AcqRel);
}

/// A capture ended (or failed to begin). Saturating: a capture begun
/// outside the crate and ended through it must not wrap the count.
pub(crate) fn end() {
    let _ = UNDERWAY.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test for the process-wide state: tests run in parallel threads.
    #[test]
    fn the_gate_opens_while_a_capture_is_underway_and_never_wraps() {
        let before = UNDERWAY.load(Ordering::Acquire);
        begin();
        assert!(must_ask());
        end();
        assert_eq!(UNDERWAY.load(Ordering::Acquire), before);
        if before == 0 {
            // Nothing underway (no other test of this binary captures on
            // CUDA): an extra end saturates at zero and the gate is shut.
            end();
            assert_eq!(UNDERWAY.load(Ordering::Acquire), 0);
            assert!(!must_ask());
            detect_foreign_captures(true);
            assert!(must_ask());
            detect_foreign_captures(false);
            assert!(!must_ask());
        }
    }
}
