//! The uses of one block: at most one read event per stream, plus the last
//! write.
//!
//! cudarc keeps a single read event per buffer, so two readers on two streams
//! lose one of them; here each reading stream keeps its own, and a writer
//! waits for all of them.

use crate::gpu::RawEvent;
use crate::types::{Access, StreamId};

#[derive(Debug, Default)]
pub(crate) struct BlockUses {
    /// The stream and event of the last write (or of the allocation, once
    /// the block was first used on another stream).
    pub(crate) last_write: Option<(StreamId, RawEvent)>,
    /// The latest read per stream.
    pub(crate) reads: Vec<(StreamId, RawEvent)>,
}

impl BlockUses {
    /// Events `stream` must wait on before an `access`.
    pub(crate) fn waits_for(
        &self,
        stream: StreamId,
        access: Access,
    ) -> impl Iterator<Item = RawEvent> + '_ {
        let write = self
            .last_write
            .filter(|(s, _)| *s != stream)
            .map(|(_, e)| e);
        let reads = self
            .reads
            .iter()
            .filter(move |(s, _)| access == Access::Write && *s != stream)
            .map(|(_, e)| *e);
        write.into_iter().chain(reads)
    }

    /// The event to record for a use of `access` on `stream`: the one already
    /// in that slot (re-recorded), or `None` when a fresh one is needed.
    pub(crate) fn slot(&self, stream: StreamId, access: Access) -> Option<RawEvent> {
        match access {
            Access::Write => self
                .last_write
                .filter(|(s, _)| *s == stream)
                .map(|(_, e)| e),
            Access::Read => self
                .reads
                .iter()
                .find(|(s, _)| *s == stream)
                .map(|(_, e)| *e),
        }
    }

    /// Stores `event` as the record of a use; returns an event the slot held
    /// before, which the caller gives back to the pool.
    pub(crate) fn store(
        &mut self,
        stream: StreamId,
        access: Access,
        event: RawEvent,
    ) -> Option<RawEvent> {
        match access {
            Access::Write => self
                .last_write
                .replace((stream, event))
                .map(|(_, e)| e)
                .filter(|e| *e != event),
            Access::Read => match self.reads.iter_mut().find(|(s, _)| *s == stream) {
                Some(slot) => Some(std::mem::replace(&mut slot.1, event)).filter(|e| *e != event),
                None => {
                    self.reads.push((stream, event));
                    None
                }
            },
        }
    }

    /// Recorded events: the reads plus the last write (0 or 1).
    pub(crate) fn event_count(&self) -> usize {
        self.reads.len() + usize::from(self.last_write.is_some())
    }

    /// Every event, leaving the uses empty.
    pub(crate) fn take_all(&mut self) -> Vec<(StreamId, RawEvent)> {
        let mut all: Vec<_> = std::mem::take(&mut self.reads);
        all.extend(self.last_write.take());
        all
    }
}
