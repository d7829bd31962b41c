//! The capture announcements: until PyTorch's capture hooks vouch for
//! them, the driver is asked about captures at every call; then only
//! between a capture's begin and end.
//!
//! A process of its own: the state is process-wide.

use torch_alloc::captures::{CAPTURE_ENV, CaptureMode, driver_asked};
use torch_alloc::*;

#[test]
fn captures_are_asked_about_until_announced_then_only_while_one_is_underway() {
    let mode = CaptureMode::parse(std::env::var(CAPTURE_ENV).ok().as_deref());
    let expect = |announced, underway| mode.asks(announced, underway);
    assert_eq!(driver_asked(), expect(false, 0), "{mode:?}, not announced");
    // SAFETY: no capture is underway, and every capture of this test (none
    // on a device) is announced by the calls below.
    unsafe { streamalloc_torch_announce_captures() };
    assert_eq!(driver_asked(), expect(true, 0), "{mode:?}, announced");
    streamalloc_torch_capture_begin(0);
    assert_eq!(driver_asked(), expect(true, 1), "one underway");
    streamalloc_torch_capture_begin(1);
    streamalloc_torch_capture_end(0);
    assert_eq!(driver_asked(), expect(true, 1), "the other still underway");
    streamalloc_torch_capture_end(1);
    assert_eq!(driver_asked(), expect(true, 0), "both ended");
    // An end with no begin does not wrap the count.
    streamalloc_torch_capture_end(0);
    streamalloc_torch_capture_begin(0);
    assert_eq!(driver_asked(), expect(true, 1), "one underway again");
    streamalloc_torch_capture_end(0);
    assert_eq!(driver_asked(), expect(true, 0));
}
