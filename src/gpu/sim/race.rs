//! The race detector of the simulated device.
//!
//! Every allocation keeps the epoch of its last write and of the last read
//! per stream (the FastTrack representation). An access is checked when it is
//! queued, against the clock of its stream: a previous write that does not
//! happen before it, or for a write any previous read that does not, is a
//! race. The allocation and the free count as writes, so a use on another
//! stream that is not ordered after the allocation, or a free that is not
//! ordered after every use, is a race too; an access ordered after the free is
//! a use after free.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::clock::{Epoch, VectorClock};
use crate::types::Access;

/// What kind of bug a [`RaceReport`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RaceKind {
    /// Two accesses on different streams, at least one a write, with no
    /// event or synchronize ordering them.
    Unordered,
    /// An access queued after the allocation's free, and ordered after it.
    UseAfterFree,
    /// An access to an address that no allocation of this device ever
    /// covered (or that is reserved but not mapped with access).
    InvalidAddress,
    /// Memory unmapped while an operation touching it was queued or running
    /// (not yet seen complete by the host): the device would fault.
    UnmapInUse,
}

/// What touched memory: the operation kind and its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimOp {
    /// The allocation (counts as a write).
    Alloc,
    /// The free (counts as a write).
    Free,
    /// A kernel, memset or copy.
    Kernel(Access),
    /// An unmap of virtual memory, by the host (reported with stream
    /// `usize::MAX`).
    Unmap,
    /// The host reading or writing pinned host memory (a host buffer's
    /// slice), reported with stream `usize::MAX`.
    Host(Access),
}

impl SimOp {
    /// Whether the operation only reads.
    fn reads_only(self) -> bool {
        matches!(
            self,
            SimOp::Kernel(Access::Read) | SimOp::Host(Access::Read)
        )
    }
}

/// One race found by the simulated device's detector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceReport {
    /// What went wrong.
    pub kind: RaceKind,
    /// Start address of the allocation involved.
    pub addr: u64,
    /// The earlier operation and its simulated stream index (absent for an
    /// invalid address).
    pub earlier: Option<(SimOp, usize)>,
    /// The later operation and its simulated stream index.
    pub later: (SimOp, usize),
}

impl fmt::Display for RaceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (op, stream) = self.later;
        match (self.kind, self.earlier) {
            (RaceKind::InvalidAddress, _) | (_, None) => write!(
                f,
                "{op:?} on sim stream {stream} touches {:#x}, which no allocation covers",
                self.addr
            ),
            (RaceKind::UnmapInUse, Some((e, es))) => write!(
                f,
                "unmap of {:#x} while {e:?} on sim stream {es} may still run",
                self.addr
            ),
            (RaceKind::UseAfterFree, Some((e, es))) => write!(
                f,
                "use after free at {:#x}: {op:?} on sim stream {stream} after {e:?} on sim stream {es}",
                self.addr
            ),
            (RaceKind::Unordered, Some((e, es))) => write!(
                f,
                "race at {:#x}: {e:?} on sim stream {es} and {op:?} on sim stream {stream} are not ordered",
                self.addr
            ),
        }
    }
}

#[derive(Debug)]
struct AllocHistory {
    len: usize,
    last_write: (SimOp, Epoch),
    reads: Vec<Epoch>,
    freed: Option<Epoch>,
    /// The histories a caller-managed allocation ended where it was carved
    /// (each clipped to the range it reused, keyed by its new start), kept
    /// until its first access: what an undo of the allocation puts back
    /// ([`RaceDetector::on_suballoc_undone`]). Empty once touched, and in
    /// the histories kept here (one level: an undo restores what the
    /// allocation replaced, not what those replaced).
    replaced: Vec<(u64, AllocHistory)>,
}

impl AllocHistory {
    /// A fresh allocation at `at` that replaced `replaced`.
    fn new(len: usize, at: Epoch, replaced: Vec<(u64, AllocHistory)>) -> Self {
        AllocHistory {
            len,
            last_write: (SimOp::Alloc, at),
            reads: Vec::new(),
            freed: None,
            replaced,
        }
    }

    /// Whether nothing touched the allocation since it was made.
    fn untouched(&self) -> bool {
        self.last_write.0 == SimOp::Alloc && self.reads.is_empty() && self.freed.is_none()
    }
}

/// Access histories of every allocation, keyed by base address (the latest
/// allocation at each base).
#[derive(Debug, Default)]
pub(crate) struct RaceDetector {
    allocs: BTreeMap<u64, AllocHistory>,
    reports: Vec<RaceReport>,
    // Remembered so that reports are not repeated once per op of a loop:
    // (kind, address, later stream, earlier stream). The kind is part of it,
    // so that a use after free is not hidden by an earlier race between the
    // same two streams.
    seen: HashMap<(u8, u64, usize, usize), ()>,
    /// The slot of the host's own accesses (pinned host memory), reported
    /// as stream `usize::MAX`.
    host_stream: Option<usize>,
}

impl RaceDetector {
    pub(crate) fn on_alloc(&mut self, addr: u64, len: usize, at: Epoch) {
        if len == 0 {
            return;
        }
        self.on_reuse(addr, len);
        self.allocs
            .insert(addr, AllocHistory::new(len, at, Vec::new()));
    }

    /// The address space handed `[addr, addr + len)` out again (to an
    /// allocation, or to a graph's capture, whose replays allocate there
    /// later): the histories of older allocations overlapping it are done
    /// with, as the address space ordered their frees before this reuse.
    pub(crate) fn on_reuse(&mut self, addr: u64, len: usize) {
        let stale: Vec<u64> = self
            .allocs
            .range(..addr + len as u64)
            .rev()
            .take_while(|(a, h)| **a + h.len as u64 > addr)
            .map(|(a, _)| *a)
            .collect();
        for a in stale {
            self.allocs.remove(&a);
        }
    }

    /// Names the slot whose epochs are the host's own accesses.
    pub(crate) fn set_host_stream(&mut self, slot: usize) {
        self.host_stream = Some(slot);
    }

    fn report(&mut self, mut report: RaceReport) {
        let host = |stream: &mut usize, slot: Option<usize>| {
            if Some(*stream) == slot {
                *stream = usize::MAX;
            }
        };
        host(&mut report.later.1, self.host_stream);
        if let Some((_, stream)) = &mut report.earlier {
            host(stream, self.host_stream);
        }
        let key = (
            report.kind as u8,
            report.addr,
            report.later.1,
            report.earlier.map_or(usize::MAX, |e| e.1),
        );
        if self.seen.insert(key, ()).is_none() {
            // Kept before it is logged: a subscriber that panics loses
            // nothing.
            self.reports.push(report);
            let report = &self.reports[self.reports.len() - 1];
            tracing::warn!(target: "streamalloc::sim", "{report}");
        }
    }

    /// Reports an access by `op` on stream `stream` to `ptr`, which no
    /// accessible memory covers.
    pub(crate) fn push_invalid(&mut self, ptr: u64, op: SimOp, stream: usize) {
        self.report(RaceReport {
            kind: RaceKind::InvalidAddress,
            addr: ptr,
            earlier: None,
            later: (op, stream),
        });
    }

    /// Checks and records one access by `op` on stream `at.stream`, whose
    /// clock (after ticking) is `clock`.
    pub(crate) fn on_access(&mut self, ptr: u64, op: SimOp, at: Epoch, clock: &VectorClock) {
        let found = self
            .allocs
            .range(..=ptr)
            .next_back()
            .filter(|(a, h)| ptr < **a + h.len.max(1) as u64)
            .map(|(a, _)| *a);
        let Some(addr) = found else {
            self.report(RaceReport {
                kind: RaceKind::InvalidAddress,
                addr: ptr,
                earlier: None,
                later: (op, at.stream),
            });
            return;
        };
        let mut reports = Vec::new();
        let history = self.allocs.get_mut(&addr).expect("found above");
        // Touched: no undo may claim it unused any more.
        history.replaced = Vec::new();
        if let Some(freed) = history.freed {
            let kind = if clock.covers(freed) {
                RaceKind::UseAfterFree
            } else {
                RaceKind::Unordered
            };
            reports.push(RaceReport {
                kind,
                addr,
                earlier: Some((SimOp::Free, freed.stream)),
                later: (op, at.stream),
            });
        } else {
            let (wop, wat) = history.last_write;
            if !clock.covers(wat) {
                reports.push(RaceReport {
                    kind: RaceKind::Unordered,
                    addr,
                    earlier: Some((wop, wat.stream)),
                    later: (op, at.stream),
                });
            }
            let writes = !op.reads_only();
            if writes {
                for read in history.reads.iter().filter(|r| !clock.covers(**r)) {
                    reports.push(RaceReport {
                        kind: RaceKind::Unordered,
                        addr,
                        earlier: Some((SimOp::Kernel(Access::Read), read.stream)),
                        later: (op, at.stream),
                    });
                }
                history.reads.clear();
                history.last_write = (op, at);
                if op == SimOp::Free {
                    history.freed = Some(at);
                }
            } else {
                history.reads.retain(|r| r.stream != at.stream);
                history.reads.push(at);
            }
        }
        for r in reports {
            self.report(r);
        }
    }

    /// Histories overlapping `[addr, addr + len)`, lowest first.
    fn overlapping(&self, addr: u64, len: usize) -> Vec<u64> {
        let mut found: Vec<u64> = self
            .allocs
            .range(..addr + len as u64)
            .rev()
            .take_while(|(a, h)| **a + h.len as u64 > addr)
            .map(|(a, _)| *a)
            .collect();
        found.reverse();
        found
    }

    /// Whether a live (not freed) allocation of `len` bytes starts at
    /// `addr`.
    pub(crate) fn live_at(&self, addr: u64, len: usize) -> bool {
        self.allocs
            .get(&addr)
            .is_some_and(|h| h.freed.is_none() && h.len == len.max(1))
    }

    /// A new allocation carved by the caller out of memory it manages (an
    /// arena) at `at`: every earlier allocation overlapping it, or one of
    /// `aliases` (the other addresses of its memory, each with its length),
    /// must be freed, and its free ordered before `clock`, or the reuse
    /// races. Their histories end here, kept aside until the allocation is
    /// first touched, for an undo.
    pub(crate) fn on_suballoc(
        &mut self,
        addr: u64,
        len: usize,
        aliases: &[(u64, usize)],
        at: Epoch,
        clock: &VectorClock,
    ) {
        let len = len.max(1);
        let mut replaced = Vec::new();
        for &(alias, alias_len) in aliases {
            replaced.extend(self.on_alias_reuse(alias, alias_len, addr, at, clock));
        }
        replaced.extend(self.on_alias_reuse(addr, len, addr, at, clock));
        self.allocs
            .insert(addr, AllocHistory::new(len, at, replaced));
    }

    /// The caller-managed allocation at `addr` is undone: its maker claims
    /// no operation ever touched it (the crate's
    /// [`NeverUsed`](crate::NeverUsed)). Checked (an access or a free of it
    /// is reported, as a race between that operation and the undo on
    /// `stream`), then the histories it replaced come back, so that the
    /// next allocation there is checked against the uses before it, as if
    /// it had never been made.
    pub(crate) fn on_suballoc_undone(&mut self, addr: u64, stream: usize) {
        let Some(h) = self.allocs.remove(&addr) else {
            return;
        };
        if !h.untouched() {
            let earlier = h
                .freed
                .map(|f| (SimOp::Free, f))
                .or((h.last_write.0 != SimOp::Alloc).then_some(h.last_write))
                .or(h.reads.first().map(|r| (SimOp::Kernel(Access::Read), *r)));
            self.report(RaceReport {
                kind: RaceKind::Unordered,
                addr,
                earlier: earlier.map(|(op, at)| (op, at.stream)),
                later: (SimOp::Free, stream),
            });
            return;
        }
        for (old, history) in h.replaced {
            self.allocs.entry(old).or_insert(history);
        }
    }

    /// A new allocation at `new` uses the memory `[addr, addr + len)`
    /// names (the same memory at another address, or its own range): every
    /// earlier allocation there must be freed, and its free ordered before
    /// `clock`, or the reuse races (reported at `new`). Their histories end
    /// here; returned, each clipped to `[addr, addr + len)` and keyed by its
    /// start there (what an undo of the new allocation puts back).
    fn on_alias_reuse(
        &mut self,
        addr: u64,
        len: usize,
        new: u64,
        at: Epoch,
        clock: &VectorClock,
    ) -> Vec<(u64, AllocHistory)> {
        let mut reports = Vec::new();
        let mut ended = Vec::new();
        for old in self.overlapping(addr, len) {
            let Some(mut h) = self.allocs.remove(&old) else {
                continue;
            };
            let (earlier, at_old) = match h.freed {
                Some(f) => (SimOp::Free, f),
                None => h.last_write,
            };
            if h.freed.is_none() || !clock.covers(at_old) {
                reports.push(RaceReport {
                    kind: RaceKind::Unordered,
                    addr: new,
                    earlier: Some((earlier, at_old.stream)),
                    later: (SimOp::Alloc, at.stream),
                });
            }
            let start = old.max(addr);
            let end = (old + h.len as u64).min(addr + len as u64);
            h.len = (end - start) as usize;
            h.replaced = Vec::new();
            ended.push((start, h));
        }
        for r in reports {
            self.report(r);
        }
        ended
    }

    /// The host unmaps `[addr, addr + len)`: every operation on memory in
    /// it must be complete as far as the host knows (`host` covers it).
    /// The histories of the range end here (a later access is to an
    /// invalid address).
    pub(crate) fn on_unmap(&mut self, addr: u64, len: usize, host: &VectorClock) {
        for old in self.overlapping(addr, len) {
            if let Some(h) = self.allocs.remove(&old)
                && let Some((op, stream)) = Self::unseen(&h, host)
            {
                self.report(RaceReport {
                    kind: RaceKind::UnmapInUse,
                    addr: old,
                    earlier: Some((op, stream)),
                    later: (SimOp::Unmap, usize::MAX),
                });
            }
        }
    }

    /// An operation of `h` the host has not seen complete (`host` does not
    /// cover it), if there is one: the op and its stream.
    fn unseen(h: &AllocHistory, host: &VectorClock) -> Option<(SimOp, usize)> {
        h.freed
            .map(|f| (SimOp::Free, f))
            .into_iter()
            .chain([h.last_write])
            .chain(h.reads.iter().map(|r| (SimOp::Kernel(Access::Read), *r)))
            .find(|(_, e)| !host.covers(*e))
            .map(|(op, e)| (op, e.stream))
    }

    /// The host frees the allocation at `addr`, claiming the GPU is done
    /// with it: every operation on it must be complete as far as the host
    /// knows (`host` covers it), or the claim is false and reported (an
    /// unordered free, on stream `usize::MAX`). Its history ends here: a
    /// later access is to an invalid address, a later allocation there
    /// needs no ordering.
    pub(crate) fn on_host_free(&mut self, addr: u64, host: &VectorClock) {
        self.on_final_free(addr, host, usize::MAX);
    }

    /// The allocation at `addr` is given back for good by a free queued on
    /// `stream` whose clock is `clock` (a graph's memory, released after
    /// its last launch): every operation on it must be ordered before, or
    /// the release is reported. Its history ends here, as in
    /// [`on_host_free`](Self::on_host_free).
    pub(crate) fn on_final_free(&mut self, addr: u64, clock: &VectorClock, stream: usize) {
        if let Some(h) = self.allocs.remove(&addr)
            && let Some((op, earlier)) = Self::unseen(&h, clock)
        {
            self.report(RaceReport {
                kind: RaceKind::Unordered,
                addr,
                earlier: Some((op, earlier)),
                later: (SimOp::Free, stream),
            });
        }
    }

    pub(crate) fn reports(&self) -> &[RaceReport] {
        &self.reports
    }

    pub(crate) fn take_reports(&mut self) -> Vec<RaceReport> {
        self.seen.clear();
        std::mem::take(&mut self.reports)
    }
}
