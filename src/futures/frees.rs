//! The free path under [`AsyncResource`](super::AsyncResource): a block's
//! free queued below and made known to its stream's notifier, awaited or
//! not.
//!
//! # Two kinds of free
//!
//! - **Awaited**: [`AsyncResource::deallocate`](super::AsyncResource::deallocate)
//!   queues the free below, marks it on the stream's notifier (a point
//!   paired with the inner resource's free sequence number) and hands back
//!   a [`DeallocHandle`] that resolves when a notification covers the
//!   point.
//! - **Detached**: nobody awaits, and no handle is made. An owned buffer's
//!   drop ([`deallocate_detached`]), a reservation's failed try giving back
//!   what it took in the same poll ([`give_back_failed_try`]) and a
//!   reservation dropped with blocks it never handed out
//!   ([`give_back_unhanded`]). They share one body (`free_detached`).
//!
//! # What the host saw decides the free
//!
//! A detached free tells the inner resource what the host knows of the
//! block's uses (`Seen`), and only a fact the host saw counts:
//!
//! - the block's stream **seen reaching** the completion of its last
//!   launch (a notification delivered or an event queried done), with no
//!   use begun through the resource's hooks since:
//!   [`deallocate_completed`](DeviceMemoryResource::deallocate_completed);
//! - the block **never out of the caller's hands** (a reservation's), with
//!   no use named to the hooks meanwhile:
//!   [`deallocate_unused`](DeviceMemoryResource::deallocate_unused);
//! - anything else, a future dropped or failed included: an ordinary
//!   [`deallocate`](DeviceMemoryResource::deallocate), ordered on the
//!   block's stream.
//!
//! # Who is told
//!
//! The bytes leave the accounting when the free lands: a free that queued
//! something below launches its stream's notification and kicks the
//! dispatcher; one that queued nothing (a cache took the block back) needs
//! neither. The wait queue hears that memory came back (memory freed on a
//! stream is reusable on it at once), except from a failed try, whose
//! memory is what the queue's head just could not use. The history records
//! the free as requested, and as completed at once when nothing was queued
//! below.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::core::Core;
use super::dealloc::DeallocHandle;
use super::done_at::DoneAt;
use crate::error::ResourceResult;
use crate::observe::history::{self, MemoryAction, MemoryEvent};
use crate::resource::DeviceMemoryResource;
use crate::types::{CompletedUses, DeviceBlock, NeverUsed, StreamId};

/// [`AsyncResource::deallocate`](super::AsyncResource::deallocate) through
/// the core alone (its `inner` is the same resource, erased).
pub(super) fn deallocate_on(core: &Arc<Core>, block: DeviceBlock) -> ResourceResult<DeallocHandle> {
    let (stream, free_seq, point) = queue_free(core, block)?;
    Ok(DeallocHandle::new(core.clone(), stream, free_seq, point))
}

/// A free nobody awaits (an owned buffer's drop): queued and accounted as
/// [`AsyncResource::deallocate`](super::AsyncResource::deallocate)'s, with
/// no handle made. When the host saw the block's stream reach point
/// `done_at` (the completion of the buffer's last launch: a notification
/// delivered or an event queried done, never a future dropped), nothing
/// used the buffer since, and no use began through the resource's hooks
/// since either, the GPU is done with the block and the inner resource is
/// told so
/// ([`deallocate_completed`](DeviceMemoryResource::deallocate_completed)).
///
/// # Errors
/// As [`AsyncResource::deallocate`](super::AsyncResource::deallocate);
/// nothing changes.
pub(crate) fn deallocate_detached(
    core: &Core,
    block: DeviceBlock,
    done_at: Option<DoneAt>,
) -> ResourceResult<()> {
    free_detached(core, block, Seen::DoneAt(done_at), true)
}

/// The free of a block a reservation's failed try took in the same poll
/// (all or nothing), `hook_uses` the resource's count of hook uses when
/// the try began: as [`deallocate_detached`], but it does not tell the
/// wait queue that memory came back. Only the queue's head tries, and
/// that head is the reservation itself: the memory is what it just could
/// not use, and announcing it would make it try again at once, give back
/// again, and spin (a reservation that waited for memory burnt a worker
/// and churned the cache until others freed). Frees it queues below are
/// announced when they land, as any.
///
/// The block never left the try: no buffer was made of it and nothing
/// was launched on it, so when no use began through the resource's hooks
/// since the try began either (a caller naming its id there), nothing
/// touched it, and the inner resource is told so
/// ([`deallocate_unused`](DeviceMemoryResource::deallocate_unused)): a
/// cache puts the memory back as it was, rather than as a free at the end
/// of the reservation's stream, which the next stream to take it would
/// wait for on the GPU.
pub(super) fn give_back_failed_try(
    core: &Core,
    block: DeviceBlock,
    hook_uses: u64,
) -> ResourceResult<()> {
    free_detached(core, block, Seen::Untouched { hook_uses }, false)
}

/// The free of a block a [`MemoryReservation`](super::MemoryReservation)
/// still held when it was dropped, `hook_uses` the resource's count of
/// hook uses when the try that took it began: as [`deallocate_detached`]
/// (announced to the wait queue: the memory is back for anyone), and told
/// to the inner resource as unused
/// ([`deallocate_unused`](DeviceMemoryResource::deallocate_unused)) when
/// no use began through the resource's hooks since.
///
/// Nothing touched such a block, as nothing touched a failed try's: a
/// reservation hands out a block only as a buffer, which takes it out
/// (no accessor gives a block, its id or its address), so a block still
/// in it was never a buffer, and the crate queued no work on it; user
/// code could reach it only by building its descriptor from an id or an
/// address learnt elsewhere and naming it to the hooks, which the count
/// sees. (Uses named to the stack's own hooks, past this resource, and a
/// sleep's restore are the cache's to see: it frees a lease it saw used
/// as an ordinary free, whatever the caller says.)
pub(super) fn give_back_unhanded(
    core: &Core,
    block: DeviceBlock,
    hook_uses: u64,
) -> ResourceResult<()> {
    free_detached(core, block, Seen::Untouched { hook_uses }, true)
}

/// What the host knows of a block's uses at a detached free.
enum Seen {
    /// The completion of its last launch, if it had one and it was made
    /// through the resource.
    DoneAt(Option<DoneAt>),
    /// None was ever queued, if no use began through the hooks since the
    /// resource's count of them was `hook_uses`.
    Untouched { hook_uses: u64 },
}

fn free_detached(
    core: &Core,
    block: DeviceBlock,
    seen: Seen,
    announce: bool,
) -> ResourceResult<()> {
    let stream = block.stream();
    let notifier = core.notifier(stream)?;
    let id = block.id();
    let hooks_now = || core.hook_uses.load(Ordering::SeqCst);
    let freed = FreedBlock::of(&block);
    match seen {
        // Only what the host saw proves the GPU done: a point settled
        // because its future was dropped (a cancelled request) or failed
        // says nothing. Seen reached, and no use began through the hooks
        // since: every use of the block ran.
        Seen::DoneAt(Some(d)) if d.hook_uses == hooks_now() && notifier.seen_reached(d.point) => {
            let completed = CompletedUses::new(block.id());
            core.inner.deallocate_completed(block, completed)?;
        }
        // Never out of the caller's hands, and no use named it to the
        // hooks meanwhile: nothing touched it.
        Seen::Untouched { hook_uses } if hook_uses == hooks_now() => {
            let unused = NeverUsed::new(block.id());
            core.inner.deallocate_unused(block, unused)?;
        }
        _ => core.inner.deallocate(block)?,
    }
    if core.tracks_holdings() {
        core.holdings.freed(id);
    }
    // A free that queued nothing new below (a cache took the block back:
    // its bytes never left it) has nothing for a notification to apply,
    // and nobody awaits it: no point, no notification. (Each one used to
    // keep a host function in flight per stream while a service ran.)
    // Otherwise, as a handle dropped unawaited: the free stays queued in
    // the notifier, and its bytes leave the accounting when it lands.
    let queued_below = notifier.mark_free_if_new(core.inner.pending_free_seq(stream));
    freed.record(queued_below);
    if queued_below {
        notifier.launch(&*core.gpu);
        core.kick.pending();
    }
    core.mark_frees_elsewhere(Some(stream));
    // Memory freed on a stream is reusable on it at once.
    if announce {
        core.allocs.memory_returned();
    }
    Ok(())
}

/// Queues the free and its notification: (stream, free sequence, point).
fn queue_free(core: &Core, block: DeviceBlock) -> ResourceResult<(StreamId, u64, u64)> {
    let stream = block.stream();
    let notifier = core.notifier(stream)?;
    let id = block.id();
    let freed = FreedBlock::of(&block);
    let before = match freed.0 {
        Some(_) => core.inner.pending_free_seq(stream),
        None => 0,
    };
    core.inner.deallocate(block)?;
    if core.tracks_holdings() {
        core.holdings.freed(id);
    }
    let free_seq = core.inner.pending_free_seq(stream);
    freed.record(free_seq != before);
    let point = notifier.mark_free(free_seq);
    notifier.launch(&*core.gpu);
    core.mark_frees_elsewhere(Some(stream));
    core.kick.pending();
    // Memory freed on a stream is reusable on it at once.
    core.allocs.memory_returned();
    Ok((stream, free_seq, point))
}

/// A block being freed, as the history records it (taken only while the
/// history is on: the descriptor moves into the free).
struct FreedBlock(Option<DeviceBlock>);

impl FreedBlock {
    fn of(block: &DeviceBlock) -> Self {
        FreedBlock(history::recording().then(|| block.clone()))
    }

    /// Records the free as requested, and as completed at once when it
    /// queued nothing below (a cache took the block back: its stream may
    /// reuse it now); a free queued below completes when a reap drains it.
    fn record(self, queued_below: bool) {
        let Some(block) = self.0 else { return };
        let event = |action| {
            MemoryEvent::new(action, block.stream().device())
                .on(block.stream())
                .at(block.ptr(), block.size())
                .tagged(block.tag())
        };
        history::record(|| event(MemoryAction::FreeRequested));
        if !queued_below {
            history::record(|| event(MemoryAction::FreeCompleted));
        }
    }
}
