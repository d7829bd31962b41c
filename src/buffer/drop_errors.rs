//! Where the errors of a buffer's `Drop` go.
//!
//! A [`Buffer`](super::Buffer) frees itself when dropped, and `Drop` cannot
//! return an error. A failed free (a faulted device, a resource that shut
//! down) is therefore kept here, process-wide, as cudarc keeps its sticky
//! error on the context: a counter that only grows, and the latest error,
//! which a caller takes. Each one is also logged as a `tracing` error event.
//! Nothing here panics.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ResourceError;
use crate::types::BlockId;

static COUNT: AtomicU64 = AtomicU64::new(0);
// Guarded by its own mutex; only ever held to swap one value.
static LAST: Mutex<Option<ResourceError>> = Mutex::new(None);

/// How many errors buffers met where nothing could return them (their
/// `Drop`, the guard of a cudarc call), since the process started.
pub fn drop_error_count() -> u64 {
    COUNT.load(Ordering::Relaxed)
}

/// The latest such error, clearing it (the count stays).
pub fn take_drop_error() -> Option<ResourceError> {
    LAST.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Keeps `error`, met by `what` on `block` where it could not be returned.
pub(crate) fn report(block: BlockId, what: &'static str, error: ResourceError) {
    tracing::error!(%block, what, %error, "buffer error with no caller to return it to");
    COUNT.fetch_add(1, Ordering::Relaxed);
    *LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
}
