//! The C functions: PyTorch's hooks and the statistics a script reads.
//!
//! Each function is `extern "C"` with the signature PyTorch's setter (or
//! `ctypes`) expects, and catches every panic: nothing unwinds into C++
//! or Python. A failure returns null (for `alloc`) or nothing, counts in
//! [`streamalloc_torch_failures`], is logged (`tracing`, warn), and its
//! message is kept for [`streamalloc_torch_last_error`] (per thread).
//!
//! `cudaStream_t` is taken as `*mut c_void` (its C type is a pointer to an
//! opaque struct) and `ssize_t` as `isize`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::allocator::{DeviceAllocator, TorchAllocStats};
use crate::device_table::device;

thread_local! {
    /// The message of the calling thread's last failure (PyTorch calls the
    /// allocator on the thread that makes the tensor).
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(call: &str, message: String) {
    tracing::warn!(call, %message, "streamalloc-torch refused a call");
    LAST_ERROR.with(|last| *last.borrow_mut() = format!("{call}: {message}"));
}

/// Runs `f` on device `dev`'s allocator, catching panics; `None` (and the
/// failure kept) when the device cannot be opened, `f` fails, or panics.
fn on_device<T>(
    call: &str,
    dev: c_int,
    f: impl FnOnce(&DeviceAllocator) -> Result<T, String>,
) -> Option<T> {
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let allocator = device(dev)?;
        let _keep = allocator.keep_context();
        f(allocator)
    }));
    match caught {
        Ok(Ok(value)) => Some(value),
        Ok(Err(message)) => {
            fail(call, message);
            None
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(call, format!("panicked: {message}"));
            None
        }
    }
}

/// PyTorch's `alloc_fn`: `size` bytes on device `device` for work on
/// `stream`; null when refused (the reason in
/// [`streamalloc_torch_last_error`]). A size of 0 gets null, as PyTorch's
/// own allocator gives.
///
/// # Stream ordering
/// The block is valid on `stream` at once, and on another stream once that
/// stream is ordered after `stream`'s work queued so far.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    on_device("alloc", device, |d| {
        d.alloc(size, stream as usize).map_err(|e| e.to_string())
    })
    .map_or(std::ptr::null_mut(), |ptr| ptr as *mut c_void)
}

/// PyTorch's `free_fn`: frees the block at `ptr` on the stream it was
/// allocated on (`size` and `stream` are PyTorch's copy of the allocation's;
/// the allocator keeps its own). Null is ignored.
///
/// # Stream ordering
/// The free is queued on the allocating stream, behind its work so far
/// and behind the work queued so far on every stream
/// [`streamalloc_torch_record_stream`] named for the block.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, stream);
    if ptr.is_null() {
        return;
    }
    on_device("free", device, |d| {
        d.free(ptr as u64).map_err(|e| e.to_string())
    });
}

/// PyTorch's `record_stream_fn` (`set_record_stream_fn`, C++ only): the
/// block at `ptr` is used on `stream` too, so its free waits for the work
/// queued on `stream` until then. The device is the current one, as
/// PyTorch calls it: the block's device is found among the opened ones.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    let found = (0..crate::device_table::MAX_DEVICES as c_int).find_map(|dev| {
        crate::device_table::opened(dev)
            .filter(|d| d.owns(ptr as u64))
            .map(|_| dev)
    });
    match found {
        Some(dev) => {
            on_device("record_stream", dev, |d| {
                d.record_stream(ptr as u64, stream as usize)
                    .map_err(|e| e.to_string())
            });
        }
        None => fail(
            "record_stream",
            format!(
                "{:#x} is not a live allocation of this allocator",
                ptr as u64
            ),
        ),
    }
}

/// PyTorch's `begin_allocate_to_pool` hook (`set_begin_allocate_to_pool`,
/// C++ only; `scripts/torch_hooks.py` passes a lambda that drops the pool
/// and the filter): a capture on device `device` is about to begin. Until
/// its [end](streamalloc_torch_capture_end), every allocation and free asks
/// the driver whether its stream is capturing, so that memory a capture
/// takes stays its graph's (see [`captures`](crate::captures)). Any device
/// counts: the question is asked on all.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_capture_begin(device: c_int) {
    let _ = device;
    crate::captures::begin();
}

/// PyTorch's `end_allocate_to_pool` hook (`set_end_allocate_to_pool_fn`):
/// a capture [begun](streamalloc_torch_capture_begin) on `device` ended.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_capture_end(device: c_int) {
    let _ = device;
    crate::captures::end();
}

/// From this call on, the driver is asked whether a stream is capturing
/// only while an announced capture is underway (between
/// [`streamalloc_torch_capture_begin`] and
/// [`streamalloc_torch_capture_end`]), as PyTorch's own allocator asks only
/// while `beginAllocateToPool` says one is; before it, at every allocation
/// and free. `STREAMALLOC_TORCH_CAPTURE=always` keeps asking at every call.
///
/// # Safety
/// The caller vouches that:
/// 1. every CUDA graph capture of a stream this allocator serves, on any
///    device, begins after a call of [`streamalloc_torch_capture_begin`]
///    has returned and ends before its matching
///    [`streamalloc_torch_capture_end`] is made (PyTorch 2.11's
///    `torch.cuda.graph` does, once the hooks are set: `beginAllocateToPool`
///    comes before `cudaStreamBeginCapture`, `endAllocateToPool` after
///    `cudaStreamEndCapture`); a capture begun otherwise (a raw
///    `cudaStreamBeginCapture` on PyTorch's stream) would go unseen, and
///    memory freed in it could be handed out while its graph's replays
///    still use it;
/// 2. no capture of such a stream is underway at this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn streamalloc_torch_announce_captures() {
    crate::captures::announce();
}

/// PyTorch's `init_fn` (`set_init_fn`): nothing to do, devices open at
/// their first allocation.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_init(device_count: c_int) {
    let _ = device_count;
}

/// PyTorch's `reset_fn` (`set_reset_fn`, what `torch.cuda.empty_cache()`
/// calls): gives every opened device's idle memory back.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_empty_cache() {
    for dev in 0..crate::device_table::MAX_DEVICES as c_int {
        if crate::device_table::opened(dev).is_some() {
            on_device("empty_cache", dev, |d| {
                d.empty_cache().map_err(|e| e.to_string())
            });
        }
    }
}

/// PyTorch's `memory_fraction_fn` (`set_memory_fraction_fn`): device
/// `device` holds at most `fraction` of its memory (1.0: no limit). An
/// allocation that would pass it gives idle memory back first, then gets
/// null. The arena maps whole pages, so it may pass the limit by a page.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_set_memory_fraction(fraction: f64, device: c_int) {
    on_device("set_memory_fraction", device, |d| {
        d.set_memory_fraction(fraction);
        Ok(())
    });
}

/// Device `device`'s counters into `*out`; 0 on success, -1 when the device
/// cannot be opened or `out` is null.
///
/// # Safety
/// `out` is null or points to a writable [`TorchAllocStats`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn streamalloc_torch_stats(
    device: c_int,
    out: *mut TorchAllocStats,
) -> c_int {
    if out.is_null() {
        return -1;
    }
    match on_device("stats", device, |d| Ok(d.stats())) {
        Some(stats) => {
            // SAFETY: `out` is non-null and writable (the caller's contract).
            unsafe { out.write(stats) };
            0
        }
        None => -1,
    }
}

/// Bytes device `device` holds from the device now (0 if it cannot be
/// opened).
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_reserved_bytes(device: c_int) -> u64 {
    on_device("reserved_bytes", device, |d| Ok(d.stats().reserved_bytes)).unwrap_or(0)
}

/// The most bytes device `device` held from the device since the last
/// [`streamalloc_torch_reset_peaks`]: `torch.cuda.max_memory_reserved`'s
/// counterpart.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_max_reserved_bytes(device: c_int) -> u64 {
    on_device("max_reserved_bytes", device, |d| {
        Ok(d.stats().peak_reserved_bytes)
    })
    .unwrap_or(0)
}

/// The most bytes PyTorch held on device `device` since the last reset:
/// `torch.cuda.max_memory_allocated`'s counterpart (requested sizes).
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_max_allocated_bytes(device: c_int) -> u64 {
    on_device("max_allocated_bytes", device, |d| {
        Ok(d.stats().peak_allocated_bytes)
    })
    .unwrap_or(0)
}

/// Starts device `device`'s peaks again from what it holds now, and zeroes
/// its allocator times.
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_reset_peaks(device: c_int) {
    on_device("reset_peaks", device, |d| {
        d.reset_peaks();
        Ok(())
    });
}

/// Calls refused so far on device `device` (null allocations, refused
/// frees).
#[unsafe(no_mangle)]
pub extern "C" fn streamalloc_torch_failures(device: c_int) -> u64 {
    on_device("failures", device, |d| Ok(d.stats().failures)).unwrap_or(0)
}

/// Copies the message of the calling thread's last failure (NUL-terminated,
/// cut to fit)
/// into `buf`; returns its full length in bytes (0: no failure yet).
///
/// # Safety
/// `buf` is null (`len` is then ignored) or points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn streamalloc_torch_last_error(buf: *mut c_char, len: usize) -> usize {
    let message = LAST_ERROR.with(|last| last.borrow().clone());
    if !buf.is_null() && len > 0 {
        let n = message.len().min(len - 1);
        // SAFETY: `buf` has `len` writable bytes (the caller's contract), and
        // `n + 1 <= len`; the source is a live String of at least `n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    message.len()
}
