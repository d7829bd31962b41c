//! [`HostUses`]: the copies a host buffer took part in, by stream, and the
//! one proof that they are over.
//!
//! # State
//!
//! Per stream: the completion point of the latest copy queued there (its
//! futures core and sequence number) and whether any copy there since the
//! host last saw the stream wrote the block. A later copy on the same
//! stream covers the earlier ones (stream order), so one entry per stream
//! is enough.
//!
//! # Who changes it
//!
//! The copies add ([`note`](HostUses::note)); the host's checks drop the
//! entries seen complete ([`prune`](HostUses::prune)).

use std::sync::Arc;

use crate::futures::Core;
use crate::types::StreamId;
use crate::util::sync::{Mutex, MutexGuard};

#[derive(Debug)]
struct Use {
    core: Arc<Core>,
    stream: StreamId,
    seq: u64,
    /// A copy since the entry was made writes the host block.
    writes: bool,
}

impl Use {
    /// The host saw the stream reach the point: every copy of this entry
    /// completed.
    fn seen(&self) -> bool {
        self.core
            .checked_notifier(self.stream)
            .is_some_and(|n| n.seen_reached(self.seq))
    }
}

/// The copies of one host block not yet seen complete. A lock of its own:
/// a copy to the device takes its host buffer shared (the host may read
/// it meanwhile), and still notes its use.
#[derive(Debug, Default)]
pub(crate) struct HostUses {
    uses: Mutex<Vec<Use>>,
}

impl HostUses {
    fn lock(&self) -> MutexGuard<'_, Vec<Use>> {
        self.uses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy on `stream`, whose completion point on `core` is `seq`, that
    /// writes the block when `writes`.
    pub(crate) fn note(&self, core: &Arc<Core>, stream: StreamId, seq: u64, writes: bool) {
        let mut uses = self.lock();
        if let Some(u) = uses
            .iter_mut()
            .find(|u| u.stream == stream && Arc::ptr_eq(&u.core, core))
        {
            u.seq = u.seq.max(seq);
            u.writes |= writes;
            return;
        }
        uses.push(Use {
            core: core.clone(),
            stream,
            seq,
            writes,
        });
    }

    /// Forgets the entries the host saw complete; whether none is left.
    pub(crate) fn prune(&self) -> bool {
        let mut uses = self.lock();
        uses.retain(|u| !u.seen());
        uses.is_empty()
    }

    /// Entries not seen complete that conflict with an access of the host
    /// (or of a copy on `on`, whose stream order covers its own entries):
    /// any of them for a write, the writing ones for a read.
    pub(crate) fn conflicts(&self, write: bool, on: Option<StreamId>) -> usize {
        self.lock()
            .iter()
            .filter(|u| Some(u.stream) != on && (write || u.writes) && !u.seen())
            .count()
    }

    /// Entries not seen complete.
    pub(crate) fn unseen(&self) -> usize {
        self.lock().iter().filter(|u| !u.seen()).count()
    }

    /// Asks each stream with an entry not seen complete for completion
    /// notifications until one covers the entry's point, so that the host
    /// sees it without anyone waiting.
    pub(crate) fn request_notifications(&self) {
        // Copied out: the requests make driver calls, never under a lock
        // of the bookkeeping.
        for (core, stream, seq) in self.pending_points() {
            if let Some(n) = core.checked_notifier(stream) {
                n.watch(&*core.gpu, seq);
            }
        }
    }

    /// The `(core, stream, point)` of each entry not seen complete.
    fn pending_points(&self) -> Vec<(Arc<Core>, StreamId, u64)> {
        self.lock()
            .iter()
            .filter(|u| !u.seen())
            .map(|u| (u.core.clone(), u.stream, u.seq))
            .collect()
    }

    /// The `(core, stream)` of each entry not seen complete.
    pub(crate) fn pending_streams(&self) -> Vec<(Arc<Core>, StreamId)> {
        self.lock()
            .iter()
            .filter(|u| !u.seen())
            .map(|u| (u.core.clone(), u.stream))
            .collect()
    }
}
