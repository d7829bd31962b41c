//! [`DeferredFrees`]: the frees of dropped buffers that a capture refused,
//! applied once it ends.
//!
//! A buffer dropped while a stream its free needs is being captured into a
//! CUDA graph cannot always free now: its free would be a node of that
//! graph (a block another capture kept, whose memory that graph makes
//! again at every replay), or would wait from the capture on an event
//! recorded outside it (a use on another stream, under a cache), or would
//! record an event on a capturing stream (the stream of a gone graph's last
//! replay). The resource stack refuses such a free with
//! [`StreamCapturing`](crate::ResourceError::StreamCapturing), changing
//! nothing: the block stays live. `Drop` cannot return that error and must
//! not leak the block, so the free is kept here, on the pool of the
//! buffer's streams, and tried again
//!
//! - when a capture begun through the crate on the pool ends
//!   ([`GraphCapture::end`](crate::GraphCapture::end), or its drop),
//! - at the next drop of a buffer on the pool, and at the next launch of a
//!   [`CapturedGraph`](crate::CapturedGraph),
//!
//! until it is no longer refused for a capture. It is then an ordinary
//! stream-ordered free (the completion a buffer may have seen before its
//! drop is not used: only a free made at once may count on it).
//!
//! # Exactly once
//! A retry takes the frees out of the list under its lock and puts back,
//! under it again, those refused again: two threads retrying at once never
//! free one block twice. A free that fails for another reason is reported
//! as a buffer's drop error ([`drop_error_count`](crate::drop_error_count))
//! and the block is leaked, as a drop's failed free is.
//!
//! # Bounded
//! One entry per buffer dropped during a capture, until that capture ends.
//! An entry holds its buffer's home (the resource), so a capture that never
//! ends (begun through the raw backend seam and left) keeps the resource
//! alive with it.

use std::sync::Arc;

use crate::error::{ResourceError, ResourceResult};
use crate::types::DeviceBlock;
use crate::util::sync::{AtomicUsize, Mutex, Ordering};

/// Where a refused free goes when it is tried again: a buffer's home (the
/// buffer layer implements it, so that the pool names nothing above it).
pub(crate) trait FreeLater: Send + Sync {
    /// Frees `block`; [`StreamCapturing`](ResourceError::StreamCapturing)
    /// keeps it deferred.
    ///
    /// # Errors
    /// The free's error; nothing changes.
    fn free_later(&self, block: DeviceBlock) -> ResourceResult<()>;

    /// Reports a retried free that failed for another reason.
    fn report(&self, block: &DeviceBlock, error: ResourceError);
}

/// A refused free: the block and where to free it.
struct Deferred {
    home: Arc<dyn FreeLater>,
    block: DeviceBlock,
}

/// The frees of one pool's buffers that a capture refused; see the module
/// docs.
#[derive(Default)]
pub(crate) struct DeferredFrees {
    frees: Mutex<Vec<Deferred>>,
    /// `frees.len()`, read without the lock: a drop with nothing deferred
    /// takes no lock.
    count: AtomicUsize,
}

impl std::fmt::Debug for DeferredFrees {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredFrees")
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

impl DeferredFrees {
    /// Keeps the free of `block` into `home`, which a capture refused
    /// ([`StreamCapturing`](ResourceError::StreamCapturing): the block is
    /// still live), for a [`retry`](Self::retry).
    pub(crate) fn defer(&self, home: Arc<dyn FreeLater>, block: DeviceBlock) {
        tracing::debug!(block = %block.id(), "free deferred until the capture ends");
        let mut frees = self.frees.lock().unwrap_or_else(|p| p.into_inner());
        frees.push(Deferred { home, block });
        self.count.store(frees.len(), Ordering::Release);
    }

    /// Frees deferred so far and not applied yet.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Tries every deferred free again (see the module docs): those a
    /// capture still refuses stay.
    pub(crate) fn retry(&self) {
        if self.len() == 0 {
            return;
        }
        let taken = {
            let mut frees = self.frees.lock().unwrap_or_else(|p| p.into_inner());
            self.count.store(0, Ordering::Release);
            std::mem::take(&mut *frees)
        };
        for Deferred { home, block } in taken {
            match home.free_later(block.clone()) {
                Ok(()) => {}
                Err(ResourceError::StreamCapturing { .. }) => self.defer(home, block),
                Err(e) => home.report(&block, e),
            }
        }
    }
}
