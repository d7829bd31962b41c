//! [`KeepCurrentContext`]: the calling thread's CUDA context, put back
//! after a call.
//!
//! The backend makes its device's context current before each driver call
//! (cudarc's `bind_to_thread`). PyTorch frees a tensor of device 1 while
//! device 0 may be current on the thread, and its later runtime calls on
//! that thread assume the device it set: each C function of the library
//! therefore leaves the thread's current context as it found it, as
//! PyTorch's own allocator does with its device guard; and so does the
//! opening of a device, which makes the device's primary context current
//! (a `set_memory_fraction` for device 1 may be its first call, made while
//! device 0 is current).

use cudarc::driver::result::ctx;
use cudarc::driver::sys::CUcontext;

/// The context current when the guard was made, restored on drop if a call
/// changed it (nothing is restored for a thread that had none).
pub(crate) struct KeepCurrentContext(Option<CUcontext>);

impl KeepCurrentContext {
    /// For a call on the device whose context is `own`: remembers the
    /// calling thread's current context, unless it is `own` already. Then
    /// nothing can change it: the device's backend makes `own` current
    /// before each driver call only where another context is (cudarc's
    /// `bind_to_thread` sets it only when it differs), and a call on one
    /// device makes no driver call for another. That is PyTorch's `alloc`,
    /// made with its device current: one driver call (`cuCtxGetCurrent`)
    /// where the guard would take two. Call only when `libcuda` is loaded
    /// (a CUDA device was opened): cudarc panics otherwise.
    pub(crate) fn new(own: CUcontext) -> Self {
        let before = ctx::get_current().ok().flatten();
        KeepCurrentContext(before.filter(|&current| current != own))
    }

    /// Remembers the calling thread's current context, whatever it is: for
    /// opening a device, which makes its primary context current. Call
    /// only when `libcuda` is loaded (`cuda_present`).
    pub(crate) fn any() -> Self {
        KeepCurrentContext(ctx::get_current().ok().flatten())
    }
}

impl Drop for KeepCurrentContext {
    fn drop(&mut self) {
        let Some(before) = self.0 else { return };
        if ctx::get_current().ok().flatten() != Some(before) {
            // SAFETY: `before` was this thread's current context when the
            // call began, so its owner keeps it alive for the call: PyTorch
            // retains the primary contexts it makes current for the
            // process, and a context destroyed while current on a thread
            // would have broken that thread's own calls first.
            let _ = unsafe { ctx::set_current(before) };
        }
    }
}
