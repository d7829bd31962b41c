//! Whether the driver is asked about CUDA graph captures at every call, or
//! only while PyTorch says one is underway.
//!
//! # Why
//!
//! PyTorch captures its own streams, so the library cannot count the
//! captures as it counts its own (`streamalloc::gpu::capture_gate`):
//! unless told otherwise, every allocation and free asks the driver
//! whether its stream is capturing (`cuStreamGetCaptureInfo`, which takes
//! a lock inside the driver, and a `cuCtxGetCurrent` before it): two of
//! each per pair, about as much as the rest of a cached pair.
//!
//! PyTorch's own allocator does not ask either: `torch.cuda.graph` (and
//! `torch.compile`'s CUDA graphs) announce each capture to the current
//! allocator, `beginAllocateToPool` before `cudaStreamBeginCapture` and
//! `endAllocateToPool` after `cudaStreamEndCapture` (PyTorch 2.11's
//! `CUDAGraph::capture_begin` and `capture_end`), and the allocator asks
//! the driver only while one is underway. A pluggable allocator hears of
//! them through `set_begin_allocate_to_pool` and
//! `set_end_allocate_to_pool_fn`, C++ setters that `scripts/torch_hooks.py`
//! calls with [`streamalloc_torch_capture_begin`] and
//! [`streamalloc_torch_capture_end`]; it then vouches for the announcements
//! with [`streamalloc_torch_announce_captures`], and from then on the
//! driver is asked only between a begin and its end.
//!
//! # State
//!
//! Process-wide, under one lock: whether captures are announced, and how
//! many announced captures are underway. After each change the library's
//! gate ([`detect_foreign_captures`]) is set from them and from
//! `STREAMALLOC_TORCH_CAPTURE`: unset, the driver is asked at every call
//! until captures are announced, then while one is underway; `always`,
//! at every call whatever is announced; `off`, never (for a program that
//! never captures).
//!
//! # Who changes it
//!
//! The C functions of this module, from the threads PyTorch calls them
//! on; the opening of a CUDA device applies the state once more.
//!
//! [`streamalloc_torch_capture_begin`]: crate::streamalloc_torch_capture_begin
//! [`streamalloc_torch_capture_end`]: crate::streamalloc_torch_capture_end
//! [`streamalloc_torch_announce_captures`]: crate::streamalloc_torch_announce_captures
//! [`detect_foreign_captures`]: streamalloc::gpu::detect_foreign_captures

use std::sync::{Mutex, MutexGuard, OnceLock};

/// The environment variable that overrides the announcements.
pub const CAPTURE_ENV: &str = "STREAMALLOC_TORCH_CAPTURE";

/// What `STREAMALLOC_TORCH_CAPTURE` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unset (or any other value): at every call until captures are
    /// announced, then while an announced capture is underway.
    Announced,
    /// `always`: at every call.
    Always,
    /// `off`: never.
    Off,
}

impl CaptureMode {
    /// The mode a value of `STREAMALLOC_TORCH_CAPTURE` names.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("always") => CaptureMode::Always,
            Some("off") => CaptureMode::Off,
            _ => CaptureMode::Announced,
        }
    }

    /// Whether every capture query must reach the driver, with captures
    /// `announced` or not and `underway` announced captures underway.
    pub fn asks(self, announced: bool, underway: usize) -> bool {
        match self {
            CaptureMode::Always => true,
            CaptureMode::Off => false,
            CaptureMode::Announced => !announced || underway > 0,
        }
    }
}

/// What PyTorch told the allocator about its captures.
#[derive(Debug)]
struct Announcements {
    /// Whether every capture is announced (the hooks are installed).
    announced: bool,
    /// Announced captures begun and not yet ended.
    underway: usize,
}

static STATE: Mutex<Announcements> = Mutex::new(Announcements {
    announced: false,
    underway: 0,
});

fn mode() -> CaptureMode {
    static MODE: OnceLock<CaptureMode> = OnceLock::new();
    *MODE.get_or_init(|| CaptureMode::parse(std::env::var(CAPTURE_ENV).ok().as_deref()))
}

fn state() -> MutexGuard<'static, Announcements> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sets the library's gate from `state`, under its lock (so that two
/// threads' changes land in their order).
fn set_gate(state: &Announcements) {
    let ask = mode().asks(state.announced, state.underway);
    streamalloc::gpu::detect_foreign_captures(ask);
}

/// Sets the library's gate from the state now.
pub(crate) fn apply() {
    set_gate(&state());
}

/// Whether capture queries reach the driver now (on CUDA; the simulated
/// device answers every query itself).
pub fn driver_asked() -> bool {
    let state = state();
    mode().asks(state.announced, state.underway)
}

/// From now on, captures are announced: asked only while one is underway.
pub(crate) fn announce() {
    let mut state = state();
    state.announced = true;
    set_gate(&state);
}

/// An announced capture is about to begin.
pub(crate) fn begin() {
    let mut state = state();
    state.underway += 1;
    set_gate(&state);
}

/// An announced capture ended. Saturating: an end with no begin (hooks
/// installed during a capture) must not wrap the count.
pub(crate) fn end() {
    let mut state = state();
    state.underway = state.underway.saturating_sub(1);
    set_gate(&state);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_asks_until_captures_are_announced_then_only_during_one() {
        let mode = CaptureMode::parse(None);
        assert_eq!(mode, CaptureMode::Announced);
        assert!(mode.asks(false, 0), "not announced: every call");
        assert!(!mode.asks(true, 0), "announced, none underway");
        assert!(mode.asks(true, 2), "announced, two underway");
        assert!(CaptureMode::parse(Some("always")).asks(true, 0));
        assert!(!CaptureMode::parse(Some("off")).asks(false, 1));
        assert_eq!(CaptureMode::parse(Some("on")), CaptureMode::Announced);
    }
}
