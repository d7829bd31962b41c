//! [`ArenaTier`]: the cache's arena tier — allocation and free of leases
//! of the [virtual-memory arena](super::vmm), and the block-use hooks for
//! them.
//!
//! A lease of the arena has no inner block, so the cache tracks its uses
//! on other streams itself, the way the stream-ordered resource does: one
//! read event per stream plus the last write, the lease's stream waiting
//! on all of them before the range goes back to its arena. Uses on the
//! lease's own stream record no event (stream order covers them): they are
//! noted, and one event on that stream covers them once a use elsewhere
//! needs to wait (a request served on its buffers' stream records none).
//!
//! Here: the tier, the placement of a lease ([`allocate`](ArenaTier::allocate)
//! and its cost), its sleep, and the tier-wide calls (idle bytes, reclaim,
//! close, ordering a stream after another). The free of a lease is in
//! [`release`] and the block-use hooks in [`uses`].

// Unsafe here: `order_after`'s event record and wait, on raw handles of
// the `Gpu` seam.
#![allow(unsafe_code)]

use super::placement::{Placed, round};
use super::sleep::Sleeper;
use super::vmm::{StreamSlot, Taken, VirtualArena};
use crate::cache::config::CacheConfig;
use crate::cache::shard::{Backing, Lease, Mapped, SlotGuard};
use crate::cache::shards::Shards;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, Gpu, GpuError};
use crate::resource::DeviceAccess;
use crate::resource::SleepPlan;
use crate::resource::event_pool::EventPool;
use crate::types::{AllocTag, BlockId, DeviceBlock, StreamId};

mod release;
mod uses;

/// How a block comes back to the arena tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Return {
    /// A free at the current end of the block's stream.
    Freed,
    /// Every use of it completed, as the host saw
    /// ([`CompletedUses`](crate::CompletedUses)): clean for every stream.
    Completed,
    /// No work ever touched it ([`NeverUsed`](crate::NeverUsed)): where its
    /// placement can be undone ([`VirtualArena::undo`]), the range goes
    /// back as it was before it was placed; else as a free.
    Unused,
}

/// The arena tier of a cache: the [`VirtualArena`] every stream places its
/// blocks in, and the events that record the uses of its leases on other
/// streams. The leases themselves live in the cache's [`Shards`], which
/// each call is given.
pub(crate) struct ArenaTier {
    /// The shared arena: reservation, placement, mappings, fences.
    pub(crate) vm: VirtualArena,
    /// Events recording uses of arena blocks on other streams.
    events: EventPool<dyn Gpu>,
    /// The sleep in effect, if any, and host memory its copies may use
    /// (see [`sleep`](super::sleep)); taken before the shards' locks.
    sleep: Sleeper,
}

impl std::fmt::Debug for ArenaTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaTier")
            .field("vm", &self.vm)
            .finish_non_exhaustive()
    }
}

impl ArenaTier {
    /// The arena tier over `access` for `slots` streams, as `config` sets
    /// it up, or `None` when the device has no virtual memory management.
    pub(crate) fn new(slots: usize, access: DeviceAccess, config: &CacheConfig) -> Option<Self> {
        let vm = VirtualArena::new(slots, access, config)?;
        Some(ArenaTier {
            events: EventPool::new(vm.access.gpu.clone()),
            vm,
            sleep: Sleeper::default(),
        })
    }

    /// Physical bytes the arena holds.
    #[inline]
    pub(crate) fn held(&self) -> usize {
        self.vm.held()
    }

    fn driver(e: GpuError, stream: StreamId) -> ResourceError {
        e.for_request(0, stream)
    }

    /// Allocates from `stream`'s arena; `None` when the arena cannot take
    /// the request (no arena for the stream, or no room in it), and the
    /// caller goes to the inner resource. Inside `capture`, a range its
    /// graph freed is taken first, and the block is the graph's.
    pub(crate) fn allocate(
        &self,
        shards: &Shards,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
        index: usize,
        capture: Option<CaptureId>,
    ) -> ResourceResult<Option<DeviceBlock>> {
        let tier = &self.vm;
        // A request larger than an arena can never be placed in one: the
        // inner resource answers it (and the sums below stay in range).
        let Some(len) = round(bytes).filter(|&len| len <= tier.arena_len()) else {
            return Ok(None);
        };
        let slot = &shards.slots[index];
        let mut shard = slot.lock();
        // Checked before a range is taken, under the lock the lease is
        // made under: the lease cannot be refused.
        shard.room()?;
        if shard.arena.is_some() && !shard.serves(stream) {
            // Not the id the arena was opened for (another pool's, or made
            // by hand): the pool judges it before any memory is taken.
            tier.check_stream(stream)?;
        }
        if shard.arena.is_none() && !shard.arena_failed {
            match tier.open(stream, index) {
                Ok(arena) => {
                    // `open` resolved `stream` in the tier's pool.
                    shard.learn(stream);
                    shard.arena = Some(arena);
                }
                Err(e) => {
                    tracing::debug!(error = %e, %stream, "no arena for the stream: size classes");
                    shard.arena_failed = true;
                }
            }
        }
        if shard.arena.is_none() {
            return Ok(None);
        }
        let pooled = capture.and_then(|c| shard.graph_mut(c)?.take_range(len));
        let Some(arena) = shard.arena.as_mut() else {
            unreachable!("checked above");
        };
        // Only a placement made here can be undone (see `VirtualArena::undo`).
        let (placed, ptr, undoable) = if let Some(placed) = pooled {
            // Replays free and allocate in the capture's order: the range
            // is the graph's again, at the same point of every replay.
            tier.note_reuse(arena, placed, bytes);
            slot.add_arena_live(bytes as isize - placed.len as isize);
            shard.stats.hits += 1;
            (placed, tier.ptr(placed), false)
        } else {
            slot.add_arena_live(bytes as isize);
            // Not in a capture: a block the stream kept is one of its own
            // recent frees, which a replay on another stream would race
            // (see `VirtualArena::alloc`).
            let kept = match capture {
                None => tier.take_kept(arena, len, bytes),
                Some(_) => None,
            };
            match kept {
                // A block the stream kept: mapped, its own, no driver call.
                // Given back unused, it is kept again: it was this stream's
                // free, as it is then.
                Some((placed, ptr)) => {
                    shard.stats.hits += 1;
                    (placed, ptr, false)
                }
                None => match self.place(shards, &mut shard, len, bytes, stream, capture) {
                    Ok(Some(taken)) => taken,
                    other => {
                        slot.add_arena_live(-(bytes as isize));
                        return other.map(|_| None);
                    }
                },
            }
        };
        if let Some(c) = capture {
            shard.graph_entry(c).live += 1;
        }
        Ok(Some(self.lease(
            shards,
            &mut shard,
            (placed, ptr, undoable),
            (bytes, stream, tag),
            capture,
        )))
    }

    /// Places `len` bytes (rounded; `bytes` asked for) in the arena for the
    /// locked `shard`, when its stream kept no block of the length, and
    /// counts how: a hit, a miss (memory mapped for it) or a borrow. Returns
    /// the placement, its address and whether it can be undone; `None`
    /// when the arena has no room.
    fn place(
        &self,
        shards: &Shards,
        shard: &mut SlotGuard<'_>,
        len: u64,
        bytes: usize,
        stream: StreamId,
        capture: Option<CaptureId>,
    ) -> ResourceResult<Option<(Placed, u64, bool)>> {
        let tier = &self.vm;
        let Some(arena) = shard.arena.as_mut() else {
            unreachable!("the caller checked");
        };
        let held = tier.held();
        let live_total = || shards.arena_live();
        let Some(taken) = tier.alloc(arena, len, bytes, stream, &live_total, capture.is_some())?
        else {
            return Ok(None);
        };
        let Taken {
            placed,
            ptr,
            borrowed,
            waits,
            undoable,
        } = taken;
        shard.stats.cross_stream_waits += u64::from(waits);
        if borrowed {
            shard.stats.borrows += 1;
        } else if tier.held() > held {
            shard.stats.misses += 1;
        } else {
            shard.stats.hits += 1;
        }
        Ok(Some((placed, ptr, undoable)))
    }

    /// Records the lease of the arena range `placed` at `ptr` and returns
    /// the user's block; the caller checked
    /// [`Shard::room`](crate::cache::shard::Shard::room) under the same lock.
    #[inline]
    fn lease(
        &self,
        shards: &Shards,
        shard: &mut SlotGuard<'_>,
        (placed, ptr, undoable): (Placed, u64, bool),
        request: (usize, StreamId, AllocTag),
        capture: Option<CaptureId>,
    ) -> DeviceBlock {
        let (bytes, stream, tag) = request;
        let Ok(serial) = shard.lease(Lease {
            backing: Backing::Mapped(Mapped {
                placed,
                ptr,
                uses: None,
                home_unrecorded: None,
                asleep: false,
                uses_begun: 0,
                tag,
                undoable,
            }),
            stream,
            size: bytes,
            class: None,
            home_marked: false,
            cross_used: false,
            capture,
        }) else {
            unreachable!("allocate checked for room under this lock");
        };
        DeviceBlock::new(BlockId::new(shards.id, serial), ptr, bytes, stream, tag)
    }

    /// Puts the blocks of the tags `plan` names to sleep (see
    /// [`sleep`](super::sleep)); returns the streams to see complete
    /// before [`settle_sleep`](Self::settle_sleep) gives the memory back.
    pub(crate) fn sleep(&self, shards: &Shards, plan: &SleepPlan) -> ResourceResult<Vec<StreamId>> {
        self.sleep.sleep(&self.vm, shards, plan)
    }

    /// Gives the sleep's memory back once the host saw its work complete;
    /// true when nothing is left to give back.
    pub(crate) fn settle_sleep(&self) -> ResourceResult<bool> {
        self.sleep.settle(&self.vm)
    }

    /// Waits, parking the thread, for the work of the sleep in effect.
    pub(crate) fn wait_sleep(&self) -> ResourceResult<()> {
        self.sleep.wait(&self.vm)
    }

    /// Wakes the sleep in effect; returns the streams of the restores.
    pub(crate) fn wake(&self, shards: &Shards) -> ResourceResult<Vec<StreamId>> {
        self.sleep.wake(&self.vm, shards)
    }

    /// Whether a sleep is in effect.
    pub(crate) fn is_asleep(&self) -> bool {
        self.sleep.is_asleep()
    }

    /// An estimate of the new memory an arena allocation of `bytes` on slot
    /// `index` maps: nothing when memory mapped already could hold it (idle
    /// mappings, or free pages mapped with a live block, as ahead of one),
    /// else the pages it spans. `None` for a size no arena range can hold (its
    /// rounding overflows): [`allocate`](Self::allocate) passes such a
    /// request to the inner resource, whose cost it is.
    pub(crate) fn cost(&self, shards: &Shards, bytes: usize, index: usize) -> Option<usize> {
        let tier = &self.vm;
        // Checked: near `usize::MAX` the page rounding wraps (to a cost of
        // 0 in release, which a budget above would have admitted).
        let len = round(bytes)?;
        let mut shard = shards.slots[index].lock();
        if let Some(arena) = shard.arena.as_mut() {
            // The allocation takes the block of its length the stream kept,
            // mapped already: nothing new. Looked at, not taken, so the
            // allocation that follows keeps its fast path (giving the kept
            // blocks back here made a budget above the cache cost 4.6x the
            // cache's pair).
            if tier.keeps_len(arena, len) {
                return Some(0);
            }
            tier.release_kept(arena);
        }
        drop(shard);
        // Past the kept blocks only: the page size is not a constant, and
        // the rounding's division cost a kept block's hit more than the
        // look did.
        let pages = bytes.checked_next_multiple_of(tier.page())?;
        Some(if tier.maps_nothing_for(len, pages) {
            0
        } else {
            pages
        })
    }

    /// Releases each stream's kept blocks to the arena; returns the leases
    /// users hold.
    fn release_all_kept(&self, shards: &Shards) -> usize {
        let mut leased = 0;
        for slot in shards.slots.iter() {
            let mut shard = slot.lock();
            leased += shard.lease_count();
            if let Some(arena) = shard.arena.as_mut() {
                self.vm.release_kept(arena);
            }
        }
        leased
    }

    /// Bytes of idle mappings in the arena.
    pub(crate) fn idle_bytes(&self, shards: &Shards) -> usize {
        self.release_all_kept(shards);
        self.vm.idle_bytes()
    }

    /// Closes the arena (waiting for the GPU): what no lease holds goes
    /// back to the device.
    pub(crate) fn close(&self, shards: &Shards) {
        self.sleep.close(&self.vm);
        let leased = self.release_all_kept(shards);
        if !self.vm.close() && leased == 0 {
            tracing::warn!("the arena could not be given back");
        }
    }

    /// Gives back every idle mapping the GPU is done with, waiting for the
    /// GPU first when `wait` (fences are recorded for the others, so that a
    /// later call finds them done); returns the bytes given back. For a
    /// trim, and when the inner resource is out of memory.
    pub(crate) fn reclaim(&self, shards: &Shards, wait: bool) -> usize {
        self.release_all_kept(shards);
        self.vm.reclaim_all(wait)
    }

    /// Makes the stream of `arena` wait for `after`'s current end (one
    /// event, recorded on `after`): a range is reused only in that
    /// stream's order, or elsewhere behind a fence on it, so this orders
    /// every later reuse of what the stream frees now after `after`'s
    /// work.
    pub(crate) fn order_after(
        &self,
        arena: &StreamSlot,
        stream: StreamId,
        after: StreamId,
    ) -> ResourceResult<()> {
        let gpu = &*self.vm.access.gpu;
        let raw_after = self.vm.access.streams.raw(after)?;
        let event = self.events.take().map_err(|e| e.for_request(0, after))?;
        // SAFETY: a pooled event of the tier, made on `gpu`; `raw_after`
        // and the arena's stream are streams of the tier's device pool,
        // which the tier holds. Giving the event back after the wait is
        // queued is fine: a wait keeps the record it saw.
        let ordered = unsafe { gpu.event_record(event, raw_after) }
            .and_then(|()| unsafe { gpu.stream_wait_event(arena.raw, event) });
        self.events.give([event]);
        ordered.map_err(|e| e.for_request(0, stream))
    }
}
