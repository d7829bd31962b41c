//! Hold-and-wait: memory held by tasks that are themselves waiting for
//! more, which nothing will ever give back.
//!
//! A service that awaits a request's buffers one by one (input, then
//! activations, then output) under a budget deadlocks under load: every
//! handler holds its input and waits for activations. The cure is to ask
//! for a request's memory as one unit ([`AsyncResource::reserve`]); this
//! module makes the crate *say so* instead of waiting forever when the
//! cure was not taken.
//!
//! # State
//!
//! [`Holdings`]: every block the futures layer served (an awaited or a
//! tried allocation, a reservation's blocks), keyed by its id, with its
//! owner: the tokio task that was running when it was served
//! ([`current_owner`]), or none outside a tokio task. The
//! [wait queue](super::wait_queue) keeps the owner of each waiting ticket
//! the same way.
//!
//! # Who changes it
//!
//! The futures that serve blocks add them; every free through the layer
//! (a [`DeallocHandle`](super::DeallocHandle)'s, an owned buffer's drop, a
//! reservation's drop) removes them. A block freed around the layer (on
//! [`AsyncResource::inner`]) stays until the next check finds the inner
//! resource calls it no longer live.
//!
//! # The verdict, and the facts it rests on
//!
//! When the head of the queue has just been refused, the core declares
//! hold-and-wait only if every one of these holds, each a fact the host saw
//! (never a timeout):
//!
//! 1. the refusal was a budget's, and the budget counts no byte beyond
//!    what this stack holds (`in_use ≤ bytes_outstanding`: no other
//!    resource under the budget could give any back); or the device's, and
//!    the device has nothing in use beyond what this stack holds;
//! 2. every block the layer served and that is still held has an owner,
//!    and every owner has an allocation in the queue (it cannot free
//!    before that allocation is served);
//! 3. the stack holds no idle memory it could give back
//!    ([`release_idle`](crate::DeviceMemoryResource::release_idle) gave
//!    nothing);
//! 4. no stream has anything pending: no free the GPU has not executed,
//!    no parked completion point (a task awaiting the GPU may free after).
//!
//! Then the **newest waiter that holds memory** fails with
//! [`HoldAndWait`](crate::ResourceError::HoldAndWait): its task can give
//! its memory back (dropping its buffers), which serves the older ones.
//! Its error names the bytes held and the tasks waiting.
//!
//! # What it cannot see
//!
//! Ownership is the serving task's. A buffer *moved* to another task (a
//! pipeline stage handing input to the next one over a channel) still
//! counts as its allocating task's: while the allocating task waits and
//! the receiver has not run, the state looks exactly like hold-and-wait.
//! Such programs turn the check off
//! ([`AsyncResource::set_hold_and_wait_check`]). Memory allocated on the
//! inner resource around the futures layer is not seen at all.
//!
//! [`AsyncResource::reserve`]: super::AsyncResource::reserve
//! [`AsyncResource::inner`]: super::AsyncResource::inner
//! [`AsyncResource::set_hold_and_wait_check`]: super::AsyncResource::set_hold_and_wait_check

use crate::types::BlockId;
use crate::util::fast_hash::FastMap;
use crate::util::sync::{Mutex, MutexGuard};

/// The task a block or a waiting allocation belongs to.
#[cfg(feature = "tokio")]
pub(crate) type Owner = tokio::task::Id;

/// The task a block or a waiting allocation belongs to (none without
/// tokio: nothing is ever presumed stuck).
#[cfg(not(feature = "tokio"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {}

/// The tokio task running now, if any.
pub(crate) fn current_owner() -> Option<Owner> {
    #[cfg(feature = "tokio")]
    {
        tokio::task::try_id()
    }
    #[cfg(not(feature = "tokio"))]
    {
        None
    }
}

/// A block the layer served and that is held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) owner: Option<Owner>,
    pub(crate) bytes: usize,
}

/// Blocks served by the futures layer and not freed through it. See the
/// [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Holdings {
    blocks: Mutex<FastMap<BlockId, Held>>,
}

impl Holdings {
    pub(crate) fn lock(&self) -> MutexGuard<'_, FastMap<BlockId, Held>> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `block` was served to `owner`.
    pub(crate) fn served(&self, block: BlockId, bytes: usize, owner: Option<Owner>) {
        self.lock().insert(block, Held { owner, bytes });
    }

    /// `block` was freed through the layer.
    pub(crate) fn freed(&self, block: BlockId) {
        self.lock().remove(&block);
    }
}
