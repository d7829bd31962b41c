//! The free of an arena lease: the lease's stream waits for its uses on
//! other streams, the lease ends, and its range goes where `Return` and
//! the lease's state say — the pool of the graph that still uses it, or
//! back to the arena (as a free, as completed, or its placement undone),
//! straight back while asleep — and the arena is held to the cache's cap.
//!
//! The use events of an ended lease go back to the tier's pool here, out
//! of the free's hot path.

// Unsafe here: the free's waits on the use events of a lease, on raw
// handles of the `Gpu` seam.
#![allow(unsafe_code)]

use super::super::vmm::StreamSlot;
#[cfg(doc)]
use super::super::vmm::VirtualArena;
use super::{ArenaTier, Return};
use crate::cache::shard::{Backing, EndedMapped, Slot, SlotGuard};
use crate::cache::shards::Shards;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::CaptureId;
use crate::resource::block_uses::BlockUses;
use crate::types::BlockId;

impl ArenaTier {
    /// Frees the arena lease `serial` of the locked `shard`, used on
    /// other streams: the stream waits for the block's uses there, then the
    /// lease ends ([`Shard::end_arena_lease`]) and its range is
    /// [released](Self::release) to the arena, or to the pool of `owner`,
    /// the capture whose graph still uses it (`now`: the capture the
    /// stream is in). A lease used on its own stream only skips this step:
    /// the caller ends it at once, with no second lookup.
    ///
    /// [`Shard::end_arena_lease`]: crate::cache::shard::Shard::end_arena_lease
    pub(crate) fn free(
        &self,
        shards: &Shards,
        slot: &Slot,
        mut shard: SlotGuard<'_>,
        serial: u64,
        (owner, now): (Option<CaptureId>, Option<CaptureId>),
    ) -> ResourceResult<()> {
        let tier = &self.vm;
        let gpu = &*tier.access.gpu;
        let Some(raw) = shard.arena.as_ref().map(|a| a.raw) else {
            return Err(ResourceError::UnknownBlock {
                block: BlockId::new(shards.id, serial),
            });
        };
        let Some(lease) = shard.lease_mut(serial) else {
            return Err(ResourceError::UnknownBlock {
                block: BlockId::new(shards.id, serial),
            });
        };
        let stream = lease.stream;
        let Backing::Mapped(m) = &lease.backing else {
            unreachable!("ArenaTier::free is called for arena leases only");
        };
        let uses = m.uses.as_deref();
        let elsewhere = uses.is_some_and(|u| {
            u.reads
                .iter()
                .chain(&u.last_write)
                .any(|(s, _)| *s != stream)
        });
        if let (Some(capture), true) = (now, elsewhere) {
            // The free would wait, from inside the capture, on uses recorded
            // outside it: the driver refuses (STREAM_CAPTURE_ISOLATION) and
            // invalidates the capture. Refused; the block stays live, to be
            // freed after the capture.
            return Err(ResourceError::StreamCapturing {
                stream,
                capture: Some(capture),
            });
        }
        if let Some(u) = uses {
            for (s, event) in u.reads.iter().chain(&u.last_write) {
                if *s != stream {
                    // SAFETY: `raw` is a stream of the tier's device pool
                    // (held by the tier); the event is one of the lease's
                    // uses, from the tier's event pool, made on `gpu`.
                    unsafe { gpu.stream_wait_event(raw, *event) }
                        .map_err(|e| Self::driver(e, stream))?;
                }
            }
        }
        let Some(lease) = shard.end_arena_lease(serial) else {
            return Err(ResourceError::UnknownBlock {
                block: BlockId::new(shards.id, serial),
            });
        };
        self.release(shards, slot, shard, lease, (owner, now), Return::Freed)
    }

    /// Releases the range of the arena lease `lease`, ended (taken out of
    /// the locked `shard`): its use events go back to the pool
    /// ([`return_events`](Self::return_events)), then the range goes to
    /// the pool of `owner` ([`keep_for_graph`](Self::keep_for_graph)), or
    /// back to the arena as `how` says ([`VirtualArena::free`],
    /// [`VirtualArena::free_completed`], or [`VirtualArena::undo`] for a
    /// placement that can be undone), within the cap
    /// ([`hold_to_cap`](Self::hold_to_cap)).
    // Always: the free's hot path, a few instructions once the rare
    // parts are out of line; a call would pass the ended lease in memory.
    #[inline(always)]
    pub(crate) fn release(
        &self,
        shards: &Shards,
        slot: &Slot,
        mut shard: SlotGuard<'_>,
        mut lease: EndedMapped,
        (owner, now): (Option<CaptureId>, Option<CaptureId>),
        how: Return,
    ) -> ResourceResult<()> {
        if let Some(uses) = lease.uses.take() {
            self.return_events(uses);
        }
        if lease.asleep {
            return self.release_asleep(slot, &mut shard, lease);
        }
        if let Some(c) = owner {
            self.keep_for_graph(slot, &mut shard, lease, c, now);
            return Ok(());
        }
        let tier = &self.vm;
        let Some(arena) = shard.arena.as_mut() else {
            unreachable!("an arena lease's arena lives as long as the cache");
        };
        match how {
            Return::Freed => tier.free(arena, lease.placed),
            Return::Completed => tier.free_completed(arena, lease.placed),
            Return::Unused if lease.undoable => tier.undo(arena, lease.placed),
            Return::Unused => tier.free(arena, lease.placed),
        }
        slot.add_arena_live(-(lease.size as isize));
        let cap = shards.config.max_cached_bytes;
        if cap != usize::MAX {
            self.hold_to_cap(arena, cap);
        }
        Ok(())
    }

    /// The part of [`release`](Self::release) for a block freed while
    /// asleep: its range goes straight back to the arena (its pages have
    /// no memory until the wake, so the stream may not keep it).
    #[cold]
    fn release_asleep(
        &self,
        slot: &Slot,
        shard: &mut SlotGuard<'_>,
        lease: EndedMapped,
    ) -> ResourceResult<()> {
        let Some(arena) = shard.arena.as_ref() else {
            unreachable!("an arena lease's arena lives as long as the cache");
        };
        self.vm.free_asleep(arena, lease.placed);
        slot.add_arena_live(-(lease.size as isize));
        Ok(())
    }

    /// The events of an ended lease's uses go back to the pool, and the
    /// uses are dropped (here: out of the free's hot path).
    #[allow(clippy::boxed_local, reason = "dropped here, out of line")]
    fn return_events(&self, mut uses: Box<BlockUses>) {
        if uses.event_count() > 0 {
            self.events
                .give(uses.take_all().into_iter().map(|(_, e)| e));
        }
    }

    /// The part of [`release`](Self::release) for a range the graph of
    /// `owner` still uses: it goes to the graph's pool.
    fn keep_for_graph(
        &self,
        slot: &Slot,
        shard: &mut SlotGuard<'_>,
        lease: EndedMapped,
        owner: CaptureId,
        now: Option<CaptureId>,
    ) {
        let tier = &self.vm;
        let Some(arena) = shard.arena.as_ref() else {
            unreachable!("an arena lease's arena lives as long as the cache");
        };
        // A temporary of the graph (handed out and freed in its
        // capture): the free is the graph's, made at every replay.
        let noted = lease.capture == Some(owner) && now == Some(owner);
        if noted {
            tier.note_free(arena, lease.placed);
        }
        // Held for the graph: counted as live for the slack target, as
        // it cannot be given back.
        slot.add_arena_live(lease.placed.len as isize - lease.size as isize);
        let pool = shard.graph_entry(owner);
        pool.put_range(lease.placed, noted);
        if lease.capture == Some(owner) {
            pool.live -= 1;
        }
    }

    /// Under a cap, a freed block counts as idle at once: the stream's
    /// kept blocks go back to the arena, and idle mappings past the cap
    /// are given back.
    fn hold_to_cap(&self, arena: &mut StreamSlot, cap: usize) {
        let tier = &self.vm;
        tier.release_kept(arena);
        if tier.idle_bytes() > cap {
            tier.trim_idle();
        }
    }
}
