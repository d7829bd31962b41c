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

// Unsafe here: the uses of arena leases are event records and waits on raw handles of the `Gpu` seam.
#![allow(unsafe_code)]

use super::placement::{Placed, round};
use super::sleep::Sleeper;
use super::vmm::{StreamSlot, Taken, VirtualArena};
use crate::cache::config::CacheConfig;
use crate::cache::shard::{Backing, EndedMapped, Lease, Mapped, Shard, Slot, SlotGuard};
use crate::cache::shards::Shards;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, Gpu, GpuError};
use crate::resource::DeviceAccess;
use crate::resource::SleepPlan;
use crate::resource::block_uses::BlockUses;
use crate::resource::event_pool::EventPool;
use crate::types::{Access, AllocTag, BlockId, DeviceBlock, StreamId};

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
    /// [`Shard::room`](crate::shard::Shard::room) under the same lock.
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

    /// Frees the arena lease `serial` of the locked `shard`, used on
    /// other streams: the stream waits for the block's uses there, then the
    /// lease ends ([`Shard::end_arena_lease`]) and its range is
    /// [released](Self::release) to the arena, or to the pool of `owner`,
    /// the capture whose graph still uses it (`now`: the capture the
    /// stream is in). A lease used on its own stream only skips this step:
    /// the caller ends it at once, with no second lookup.
    ///
    /// [`Shard::end_arena_lease`]: crate::shard::Shard::end_arena_lease
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

    /// Records a use of an arena block leased on `home` on `use_stream`:
    /// on another stream, an event there, stored as its read or its last
    /// write; on `home` itself, only a note (no driver call): stream order
    /// puts it before the free and every later use on `home`, and the first
    /// use on another stream records one event on `home` that covers it
    /// ([`flush_home_uses`](Self::flush_home_uses)).
    pub(crate) fn record_use(
        &self,
        m: &mut Mapped,
        home: StreamId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        if use_stream.is(home) {
            m.home_unrecorded = Some(match (m.home_unrecorded, access) {
                (Some(Access::Write), _) | (_, Access::Write) => Access::Write,
                _ => Access::Read,
            });
            return Ok(());
        }
        self.record_event_use(m, use_stream, access)
    }

    /// The uses on the lease's stream noted by
    /// [`record_use`](Self::record_use) get their event on
    /// `home` now (recorded at the stream's current end, it covers them),
    /// so that a use on another stream can wait on it. Nothing when none is
    /// noted.
    fn flush_home_uses(&self, m: &mut Mapped, home: StreamId) -> ResourceResult<()> {
        let Some(access) = m.home_unrecorded else {
            return Ok(());
        };
        self.record_event_use(m, home, access)?;
        m.home_unrecorded = None;
        Ok(())
    }

    /// Records an event of a use on `use_stream`, stored as its read or its
    /// last write.
    fn record_event_use(
        &self,
        m: &mut Mapped,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let tier = &self.vm;
        let gpu = &*tier.access.gpu;
        let raw_use = tier.access.streams.raw(use_stream)?;
        let events = &self.events;
        let uses = m.uses_mut();
        let (event, fresh) = match uses.slot(use_stream, access) {
            Some(e) => (e, false),
            None => (
                events.take().map_err(|e| Self::driver(e, use_stream))?,
                true,
            ),
        };
        // SAFETY: a pooled event of the tier, made on `gpu`; `raw_use` is a
        // stream of the tier's device pool.
        if let Err(e) = unsafe { gpu.event_record(event, raw_use) } {
            if fresh {
                events.give([event]);
            }
            return Err(Self::driver(e, use_stream));
        }
        if let Some(old) = uses.store(use_stream, access, event) {
            events.give([old]);
        }
        Ok(())
    }

    /// The stream of the last replay of `capture`'s graph, which writes
    /// the ranges the capture handed out (see [`prepare_use`](Self::prepare_use)):
    /// where the graph's release waits in `shard` for the stream to leave a
    /// capture, the stream it is ordered after; else, while the graph
    /// lives, the stream of its last launch, from the ledger of the
    /// device's pool (`None` before the first).
    pub(crate) fn last_replay(&self, shard: &Shard, capture: CaptureId) -> Option<StreamId> {
        let released = shard
            .graphs
            .iter()
            .find(|g| g.capture == capture)
            .and_then(|g| g.released);
        released.or_else(|| {
            self.vm
                .access
                .streams
                .kept_graph_memory()
                .lock()
                .last_launch(capture)
        })
    }

    /// Queues the waits `use_stream` needs before `access` to an arena
    /// block leased on `home`: after the last replay of the graph whose
    /// capture handed it out (`replay`, while the graph holds it), on the
    /// allocation (recorded on `home` at the first use elsewhere), on the
    /// last write, and for a write on the reads of other streams.
    ///
    /// A replay writes the range without the hooks (the graph queues the
    /// write), so its stream is followed at every use elsewhere, as the
    /// stream-ordered resource does for the graph memory it keeps; once
    /// the graph is released, the lease's last write covers the replays
    /// ([`settle_replays`](Self::settle_replays)).
    pub(crate) fn prepare_use(
        &self,
        m: &mut Mapped,
        home: StreamId,
        (use_stream, access): (StreamId, Access),
        replay: Option<StreamId>,
    ) -> ResourceResult<()> {
        if let Some(last) = replay.filter(|&l| l != use_stream) {
            self.follow(last, use_stream)?;
        }
        let tier = &self.vm;
        let gpu = &*tier.access.gpu;
        let raw_use = tier.access.streams.raw(use_stream)?;
        let events = &self.events;
        let waits = |m: &Mapped| {
            m.uses
                .as_ref()
                .is_some_and(|u| u.waits_for(use_stream, access).next().is_some())
        };
        if use_stream != home || waits(m) {
            // A capturing stream may not wait on an event recorded outside
            // its capture: the driver refuses (STREAM_CAPTURE_ISOLATION) and
            // invalidates the user's capture. Refused first, changing
            // nothing.
            // SAFETY: `raw_use` is a stream of the tier's device pool, which
            // the tier holds.
            let status =
                unsafe { gpu.capture_status(raw_use) }.map_err(|e| Self::driver(e, use_stream))?;
            if status.is_capturing() {
                return Err(ResourceError::StreamCapturing {
                    stream: use_stream,
                    capture: status.id(),
                });
            }
        }
        if use_stream != home {
            self.flush_home_uses(m, home)?;
        }
        let mut allocation_point = None;
        if use_stream.is(home) && !waits(m) {
            return Ok(());
        }
        let uses = m.uses_mut();
        if uses.last_write.is_none() && use_stream != home {
            let raw_home = tier.access.streams.raw(home)?;
            let event = events.take().map_err(|e| Self::driver(e, home))?;
            // SAFETY: as above, on the lease's home stream.
            if let Err(e) = unsafe { gpu.event_record(event, raw_home) } {
                events.give([event]);
                return Err(Self::driver(e, home));
            }
            uses.last_write = Some((home, event));
            allocation_point = Some(event);
        }
        let failed = uses
            .waits_for(use_stream, access)
            // SAFETY: the lease's use events, pooled and made on `gpu`;
            // `raw_use` a stream of the tier's device pool.
            .find_map(|event| unsafe { gpu.stream_wait_event(raw_use, event) }.err());
        match failed {
            None => Ok(()),
            Some(e) => {
                if let Some(event) = allocation_point {
                    uses.last_write = None;
                    events.give([event]);
                }
                Err(Self::driver(e, use_stream))
            }
        }
    }

    /// At the release of the graph whose capture handed out the arena lease
    /// `m` (leased on `home`, which the release has ordered after the last
    /// replay): `home` waits for the uses recorded on other streams, and
    /// its current end becomes the lease's last write, so that a later use
    /// on any stream follows the replays and every use before them (the
    /// lease stops asking where the graph's replays ran).
    pub(crate) fn settle_replays(&self, m: &mut Mapped, home: StreamId) -> ResourceResult<()> {
        let tier = &self.vm;
        let gpu = &*tier.access.gpu;
        let raw_home = tier.access.streams.raw(home)?;
        if let Some(uses) = &m.uses {
            let failed = uses
                .waits_for(home, Access::Write)
                // SAFETY: the lease's use events, pooled and made on `gpu`;
                // `raw_home` a stream of the tier's device pool.
                .find_map(|event| unsafe { gpu.stream_wait_event(raw_home, event) }.err());
            if let Some(e) = failed {
                return Err(Self::driver(e, home));
            }
        }
        self.record_event_use(m, home, Access::Write)?;
        m.home_unrecorded = None;
        Ok(())
    }

    /// Makes `use_stream` wait for the work queued so far on `last` (one
    /// event, recorded there and given back once the wait is queued);
    /// refused, nothing queued, while `use_stream` captures (a wait on an
    /// event recorded outside its capture would invalidate it).
    fn follow(&self, last: StreamId, use_stream: StreamId) -> ResourceResult<()> {
        let tier = &self.vm;
        let gpu = &*tier.access.gpu;
        let raw_use = tier.access.streams.raw(use_stream)?;
        let raw_last = tier.access.streams.raw(last)?;
        // SAFETY: `raw_use` is a stream of the tier's device pool, which
        // the tier holds.
        let status =
            unsafe { gpu.capture_status(raw_use) }.map_err(|e| Self::driver(e, use_stream))?;
        if status.is_capturing() {
            return Err(ResourceError::StreamCapturing {
                stream: use_stream,
                capture: status.id(),
            });
        }
        let event = self.events.take().map_err(|e| Self::driver(e, last))?;
        // SAFETY: a pooled event of the tier, made on `gpu`; `raw_last` and
        // `raw_use` are streams of the tier's device pool, which the tier
        // holds. Giving the event back after the wait is queued is fine: a
        // wait keeps the record it saw.
        let ordered = unsafe { gpu.event_record(event, raw_last) }
            .and_then(|()| unsafe { gpu.stream_wait_event(raw_use, event) });
        self.events.give([event]);
        ordered.map_err(|e| Self::driver(e, use_stream))
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
