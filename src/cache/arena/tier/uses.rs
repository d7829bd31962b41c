//! The block-use hooks of arena leases: how the uses of a lease on other
//! streams are recorded and waited for, and how a lease a graph's capture
//! handed out follows the graph's replays.
//!
//! A lease of the arena has no inner block, so the tier keeps its uses
//! (`Mapped::uses`): one read event per stream plus the last write, from
//! the tier's event pool. A use on the lease's own stream records no
//! event: it is noted (`home_unrecorded`), and one event on that stream
//! covers the noted uses once a use elsewhere needs to wait. A stream
//! being captured into a graph is refused any wait on an event recorded
//! outside its capture, before anything is queued.

// Unsafe here: event records and waits on raw handles of the `Gpu` seam.
#![allow(unsafe_code)]

use super::ArenaTier;
use crate::cache::shard::{Mapped, Shard};
use crate::error::ResourceResult;
use crate::gpu::{CaptureId, RawStream};
use crate::types::{Access, StreamId};

impl ArenaTier {
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
    ///
    /// # Errors
    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing), changing
    /// nothing, while `home` is being captured: an event recorded there
    /// would be captured, not recorded, and a wait on it would pull the
    /// waiting stream into the capture (which could then not end). A
    /// buffer's free refused so waits on its pool until the capture ends.
    fn flush_home_uses(&self, m: &mut Mapped, home: StreamId) -> ResourceResult<()> {
        let Some(access) = m.home_unrecorded else {
            return Ok(());
        };
        self.refuse_capturing(home, self.vm.access.streams.raw(home)?)?;
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
            self.refuse_capturing(use_stream, raw_use)?;
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
        self.refuse_capturing(use_stream, raw_use)?;
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

    /// Refuses `use_stream` (`raw_use`) while it is capturing: it may not
    /// wait on an event recorded outside its capture (the driver refuses
    /// with STREAM_CAPTURE_ISOLATION and invalidates the user's capture),
    /// so the use is refused first, changing nothing.
    fn refuse_capturing(&self, use_stream: StreamId, raw_use: RawStream) -> ResourceResult<()> {
        // SAFETY: `raw_use` is a stream of the tier's device pool, which
        // the tier holds.
        unsafe { self.vm.access.gpu.capture_status(raw_use) }
            .map_err(|e| Self::driver(e, use_stream))?
            .refuse(use_stream)
    }
}
