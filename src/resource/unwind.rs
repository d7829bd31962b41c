//! [`ReturnOnUnwind`]: a block made but not yet handed out goes back if the
//! caller unwinds.
//!
//! Between the inner allocation and the `return` a resource may run code it
//! does not control: a `tracing` subscriber behind an event. If that code
//! panics, the block is live below with no descriptor anyone holds: memory
//! lost for the life of the resource. The guard frees it as the panic
//! unwinds.

use super::DeviceMemoryResource;
use crate::types::DeviceBlock;

/// Holds `block`, allocated from `resource`, until [`hand_out`](Self::hand_out);
/// dropped before that (a panic unwinding), it deallocates the block.
pub(crate) struct ReturnOnUnwind<'a, R: DeviceMemoryResource + ?Sized> {
    resource: &'a R,
    block: DeviceBlock,
    armed: bool,
}

impl<'a, R: DeviceMemoryResource + ?Sized> ReturnOnUnwind<'a, R> {
    /// Guards `block`, just allocated from `resource`.
    pub(crate) fn new(resource: &'a R, block: DeviceBlock) -> Self {
        ReturnOnUnwind {
            resource,
            block,
            armed: true,
        }
    }

    /// The block being guarded.
    pub(crate) fn block(&self) -> &DeviceBlock {
        &self.block
    }

    /// The caller returns the block: the guard lets go of it.
    pub(crate) fn hand_out(mut self) -> DeviceBlock {
        self.armed = false;
        self.block.clone()
    }
}

impl<R: DeviceMemoryResource + ?Sized> Drop for ReturnOnUnwind<'_, R> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Unwinding: a second panic would abort, so the free runs with no
        // subscriber (the one that panicked would be called again).
        let no_events = tracing::subscriber::NoSubscriber::default();
        let freed = tracing::subscriber::with_default(no_events, || {
            self.resource.deallocate(self.block.clone())
        });
        // Nothing to report to: the caller is unwinding. A failed free
        // leaves the block live below, as a failed `deallocate` does.
        let _ = freed;
    }
}
