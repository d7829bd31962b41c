//! Stream capture on the simulated device: work queued on a capturing
//! stream is recorded into a graph instead of running; a replay queues the
//! recorded work on the launch stream, where the race detector checks it
//! like any other.
//!
//! What CUDA does, and this model with it:
//!
//! - `begin_capture` makes a stream capturing; a stream that waits on an
//!   event recorded in the capture *joins* it, and must be joined back (the
//!   origin, or another member, waits on an event recorded at its tail)
//!   before `end_capture`, or the end fails with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`;
//! - allocations made in the capture (graph memory nodes) get their address
//!   at capture time, and the graph keeps it until it is destroyed: the
//!   address space never hands it to anyone else meanwhile, and every replay
//!   allocates and frees at the same address; it is never a range whose
//!   free is still queued (CUDA gives graph memory address space of its
//!   own, and the replays may run on any stream);
//! - illegal calls fail and invalidate the capture: a query or synchronize
//!   of an event whose latest record was captured
//!   (`CUDA_ERROR_CAPTURED_EVENT`), a synchronize of a capturing stream, or,
//!   under a global (any thread) or thread-local (the capturing thread)
//!   capture, any synchronize, and a query of a capturing stream
//!   (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); an
//!   invalidated capture records no more work and its end fails with
//!   `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
//!
//! - a range of caller-managed memory handed out in the capture
//!   ([`Gpu::note_suballocation`](crate::gpu::Gpu::note_suballocation), a
//!   cache's arena) and not freed in it is mapped memory of the caller's,
//!   not a graph memory node: it is noted allocated when the capture ends,
//!   whatever becomes of the graph (none, where the capture was
//!   invalidated: the note, no driver call, is kept even then), and the
//!   replays leave it allocated; in an invalidated capture, the free of a
//!   range handed out before it takes effect at once, in the stream's
//!   order before the capture (no replay will ever make it);
//! - the launches of one executable graph run one at a time, in the order
//!   they were queued, whatever their streams: a launch waits for the one
//!   before it (a hidden event of the executable, recorded after each
//!   replay and waited for before the next), so two launches on two streams
//!   never race, while launches of two executables (even of one graph) are
//!   ordered only as their streams are. The graph's memory relies on it, and
//!   the detector checks it: a replay's allocation at the graph's address
//!   must come after the last replay's use and free of it, and the release
//!   of that memory (on the stream of the last launch) after every replay.
//!
//! Where the model simplifies: a replay runs the members' work in the order
//! it was captured, on the launch stream alone (a real graph may run
//! branches in parallel, which can only add races, not remove them); a
//! host function is refused on a capturing stream
//! (the seam's [`HostFn`](crate::gpu::HostFn) runs once, a captured one would
//! run at every replay); a graph cannot be launched on a capturing stream
//! (no child graphs).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::thread::ThreadId;

use super::{OpKind, State};
use crate::error::DriverCall;
use crate::error::driver_code::{INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};
use crate::gpu::capture_code::{
    CAPTURED_EVENT, ILLEGAL_STATE, INVALIDATED, ISOLATION, UNJOINED, UNMATCHED, UNSUPPORTED,
    WRONG_THREAD,
};
use crate::gpu::sim::clock::{Epoch, VectorClock};
use crate::gpu::sim::race::SimOp;
use crate::gpu::{CaptureId, CaptureMode, CaptureStatus, GpuError, GpuResult};
use crate::types::Access;

/// One operation recorded in a graph.
#[derive(Debug, Clone)]
pub(crate) enum GraphOp {
    /// A graph memory node: the address is the graph's; `freed_in_graph`
    /// when the graph frees it too (else the caller frees it after each
    /// replay, before the next).
    Alloc {
        addr: u64,
        len: usize,
        device: u32,
        freed_in_graph: bool,
    },
    /// A free: of the graph's own allocation (`own`), or of memory allocated
    /// outside the graph (freed for good at the first replay).
    Free { addr: u64, own: bool },
    /// A kernel, memset or copy.
    Kernel(Vec<(u64, Access)>),
    /// A range of caller-managed memory (a cache's arena) handed out in the
    /// capture ([`Gpu::note_suballocation`](crate::gpu::Gpu::note_suballocation)):
    /// at each replay, a new allocation there, checked as the note is.
    SubAlloc { addr: u64, len: usize },
    /// Its free ([`Gpu::note_subfree`](crate::gpu::Gpu::note_subfree)).
    SubFree { addr: u64 },
}

/// One stream taking part in a capture.
#[derive(Debug, Default)]
struct Member {
    /// Operations captured on it (a join counts as one).
    recorded: u64,
    /// Operations of it that another member waited on.
    joined: u64,
}

/// A capture in progress.
#[derive(Debug)]
struct SimCapture {
    origin: usize,
    mode: CaptureMode,
    thread: ThreadId,
    invalidated: bool,
    ops: Vec<GraphOp>,
    members: HashMap<usize, Member>,
    /// Allocations of this capture not freed in it: address → op index.
    allocs: HashMap<u64, usize>,
    /// Memory allocated outside the capture that it frees.
    freed_outside: HashSet<u64>,
}

/// The memory of one captured graph, shared by the graph and its
/// executables: given back when the last of them is destroyed.
#[derive(Debug)]
struct GraphMemory {
    allocs: Vec<(u64, usize, u32)>,
    refs: usize,
    /// Where the last replay ran (the origin before any): the memory goes
    /// back in that stream's order, after the replays queued on it.
    last_stream: usize,
}

#[derive(Debug)]
struct SimGraph {
    capture: u64,
    ops: Arc<Vec<GraphOp>>,
    /// An executable's hidden event, recorded after each replay: the next
    /// launch waits for it, as CUDA runs one launch of an executable at a
    /// time. `None` for a graph (not launchable).
    serial: Option<usize>,
}

/// Captures, graphs and executables of the simulated host.
#[derive(Debug, Default)]
pub(crate) struct Captures {
    next_id: u64,
    active: HashMap<u64, SimCapture>,
    graphs: Vec<Option<SimGraph>>,
    execs: Vec<Option<SimGraph>>,
    memory: HashMap<u64, GraphMemory>,
    /// Addresses a graph holds (allocated in its capture): capture id.
    reserved: HashMap<u64, u64>,
}

fn err(call: DriverCall, code: i32, message: &str) -> GpuError {
    GpuError::driver(call, code, message)
}

fn invalid_handle(call: DriverCall) -> GpuError {
    err(call, INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE")
}

fn invalidated(call: DriverCall) -> GpuError {
    err(
        call,
        INVALIDATED,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: the capture was invalidated by an earlier illegal call",
    )
}

impl State {
    /// The capture stream `s` takes part in.
    pub(super) fn capturing(&self, s: usize) -> Option<u64> {
        self.streams.get(s).and_then(|st| st.capture)
    }

    /// Marks capture `id` invalidated (if it is still in progress).
    fn invalidate(&mut self, id: u64) {
        if let Some(c) = self.captures.active.get_mut(&id) {
            if !c.invalidated {
                tracing::warn!(target: "streamalloc::sim", capture = id, "capture invalidated");
            }
            c.invalidated = true;
        }
    }

    /// Whether stream `s` is capturing, and into which capture.
    pub(crate) fn capture_status(&self, s: usize) -> GpuResult<CaptureStatus> {
        self.stream(s, DriverCall::StreamGetCaptureInfo)?;
        Ok(match self.capturing(s) {
            None => CaptureStatus::None,
            Some(id) => match self.captures.active.get(&id) {
                Some(c) if !c.invalidated => CaptureStatus::Active(CaptureId::new(id)),
                _ => CaptureStatus::Invalidated,
            },
        })
    }

    pub(crate) fn begin_capture(&mut self, s: usize, mode: CaptureMode) -> GpuResult<()> {
        let call = DriverCall::StreamBeginCapture;
        self.stream(s, call)?;
        if self.capturing(s).is_some() {
            return Err(err(
                call,
                ILLEGAL_STATE,
                "CUDA_ERROR_ILLEGAL_STATE: the stream is already capturing",
            ));
        }
        self.captures.next_id += 1;
        let id = self.captures.next_id;
        let mut members = HashMap::new();
        members.insert(s, Member::default());
        self.captures.active.insert(
            id,
            SimCapture {
                origin: s,
                mode,
                thread: std::thread::current().id(),
                invalidated: false,
                ops: Vec::new(),
                members,
                allocs: HashMap::new(),
                freed_outside: HashSet::new(),
            },
        );
        self.streams[s].capture = Some(id);
        Ok(())
    }

    /// Ends the capture begun on `s`; the index of its graph.
    pub(crate) fn end_capture(&mut self, s: usize) -> GpuResult<usize> {
        let call = DriverCall::StreamEndCapture;
        self.stream(s, call)?;
        let Some(id) = self.capturing(s) else {
            return Err(err(
                call,
                ILLEGAL_STATE,
                "CUDA_ERROR_ILLEGAL_STATE: the stream is not capturing",
            ));
        };
        let c = &self.captures.active[&id];
        if c.origin != s {
            return Err(err(
                call,
                UNMATCHED,
                "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: the capture was not begun on this stream",
            ));
        }
        if c.mode != CaptureMode::Relaxed && c.thread != std::thread::current().id() {
            return Err(err(
                call,
                WRONG_THREAD,
                "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: ended from another thread",
            ));
        }
        let c = self.captures.active.remove(&id).expect("looked up above");
        for &m in c.members.keys() {
            if let Some(st) = self.streams.get_mut(m) {
                st.capture = None;
            }
        }
        // A range of caller-managed memory handed out in the capture and not
        // freed in it is the caller's from now on (its memory is the
        // caller's, mapped already, not a graph memory node): noted
        // allocated whatever becomes of the graph, where the capture left
        // the origin's order (captured work does not advance it: the latest
        // operation queued on the origin before the capture), so that what
        // was ordered after that point (a replay's stream) is after the
        // note too. The replays find it allocated and leave it so.
        let mut kept_ranges: Vec<(u64, usize)> = Vec::new();
        for op in &c.ops {
            match *op {
                GraphOp::SubAlloc { addr, len } => kept_ranges.push((addr, len)),
                GraphOp::SubFree { addr } => kept_ranges.retain(|&(a, _)| a != addr),
                _ => {}
            }
        }
        if !kept_ranges.is_empty() {
            let mut clock = self.streams[s].clock.clone();
            clock.join(&self.host);
            let at = Epoch {
                stream: s,
                tick: clock.get(s),
            };
            for (addr, len) in kept_ranges {
                self.suballoc_checked(addr, len, at, &clock);
            }
        }
        let allocs: Vec<(u64, usize, u32)> = c
            .ops
            .iter()
            .filter_map(|op| match *op {
                GraphOp::Alloc {
                    addr, len, device, ..
                } => Some((addr, len, device)),
                _ => None,
            })
            .collect();
        let mut unjoined: Vec<usize> = c
            .members
            .iter()
            .filter(|&(&m, member)| m != c.origin && member.recorded > member.joined)
            .map(|(&m, _)| m)
            .collect();
        unjoined.sort_unstable();
        let failure = if c.invalidated {
            Some(invalidated(call))
        } else if !unjoined.is_empty() {
            // The simulated streams named, for whoever debugs the capture.
            Some(err(
                call,
                UNJOINED,
                &format!(
                    "CUDA_ERROR_STREAM_CAPTURE_UNJOINED: a stream that joined the capture was not \
                     joined back (simulated streams {unjoined:?}, the capture's origin {})",
                    c.origin
                ),
            ))
        } else {
            None
        };
        self.captures.memory.insert(
            id,
            GraphMemory {
                allocs,
                refs: 1,
                last_stream: s,
            },
        );
        if let Some(e) = failure {
            self.graph_memory_unref(id);
            return Err(e);
        }
        self.captures.graphs.push(Some(SimGraph {
            capture: id,
            ops: Arc::new(c.ops),
            serial: None,
        }));
        Ok(self.captures.graphs.len() - 1)
    }

    pub(crate) fn graph_instantiate(&mut self, g: usize) -> GpuResult<usize> {
        let call = DriverCall::GraphInstantiate;
        let graph = self
            .captures
            .graphs
            .get(g)
            .and_then(Option::as_ref)
            .ok_or_else(|| invalid_handle(call))?;
        let (capture, ops) = (graph.capture, graph.ops.clone());
        let exec = SimGraph {
            capture,
            ops,
            serial: Some(self.event_create()),
        };
        if let Some(m) = self.captures.memory.get_mut(&exec.capture) {
            m.refs += 1;
        }
        self.captures.execs.push(Some(exec));
        Ok(self.captures.execs.len() - 1)
    }

    pub(crate) fn graph_destroy(&mut self, g: usize) -> GpuResult<()> {
        let graph = self
            .captures
            .graphs
            .get_mut(g)
            .and_then(Option::take)
            .ok_or_else(|| invalid_handle(DriverCall::GraphDestroy))?;
        self.graph_memory_unref(graph.capture);
        Ok(())
    }

    pub(crate) fn graph_exec_destroy(&mut self, x: usize) -> GpuResult<()> {
        let exec = self
            .captures
            .execs
            .get_mut(x)
            .and_then(Option::take)
            .ok_or_else(|| invalid_handle(DriverCall::GraphDestroy))?;
        if let Some(e) = exec.serial {
            // Its slot serves a new event only once the records queued by
            // the replays ran (as for any event destroyed with work queued).
            // The executable's own event, alive until here: cannot fail, and
            // the memory below is unreferenced whatever happens.
            let _ = self.event_destroy(e);
        }
        self.graph_memory_unref(exec.capture);
        Ok(())
    }

    /// Drops one reference to capture `id`'s memory; the last gives the
    /// addresses back, in the order of the stream of the last replay.
    fn graph_memory_unref(&mut self, id: u64) {
        let Some(m) = self.captures.memory.get_mut(&id) else {
            return;
        };
        m.refs -= 1;
        if m.refs > 0 {
            return;
        }
        let m = self.captures.memory.remove(&id).expect("looked up above");
        for (addr, len, device) in m.allocs {
            self.captures.reserved.remove(&addr);
            if self.live.contains_key(&addr) {
                // Allocated by a replay and not freed yet: the caller's now,
                // and its free gives the address back as any other.
                continue;
            }
            let free_id = self.next_free_id;
            self.next_free_id += 1;
            let at = self.enqueue(m.last_stream, |_| OpKind::Free {
                device,
                addr,
                len,
                free_id,
            });
            // Behind the last launch, so behind every replay (CUDA runs the
            // launches of an executable in order): checked.
            let clock = self.streams[m.last_stream].clock.clone();
            self.races.on_final_free(addr, &clock, m.last_stream);
            if let Some(space) = self.spaces.get_mut(&device) {
                space.free_queued(addr, len, free_id, at);
            }
        }
    }

    /// Queues one replay of executable `x` on stream `s`.
    pub(crate) fn graph_launch(&mut self, x: usize, s: usize) -> GpuResult<()> {
        let call = DriverCall::GraphLaunch;
        self.stream(s, call)?;
        if self.capturing(s).is_some() {
            return Err(err(
                call,
                NOT_SUPPORTED,
                "CUDA_ERROR_NOT_SUPPORTED: the simulated device does not capture graph launches",
            ));
        }
        let exec = self
            .captures
            .execs
            .get(x)
            .and_then(Option::as_ref)
            .ok_or_else(|| invalid_handle(call))?;
        let (id, ops, serial) = (exec.capture, exec.ops.clone(), exec.serial);
        let still_live = ops.iter().any(|op| {
            matches!(op, GraphOp::Alloc { addr, freed_in_graph: false, .. }
                if self.live.contains_key(addr))
        });
        if still_live {
            return Err(err(
                call,
                INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE: an allocation of the graph's last launch is not freed",
            ));
        }
        if let Some(e) = serial {
            // After the launch before (a no-op before the first): CUDA runs
            // one launch of an executable at a time.
            self.wait(s, e)?;
        }
        for op in ops.iter() {
            self.replay(op, s);
        }
        if let Some(e) = serial {
            // Cannot fail: the stream was checked above and the event is the
            // executable's, alive until it is destroyed.
            self.record(e, s)?;
        }
        if let Some(m) = self.captures.memory.get_mut(&id) {
            m.last_stream = s;
        }
        Ok(())
    }

    /// Queues one recorded operation on stream `s`, checked for races.
    fn replay(&mut self, op: &GraphOp, s: usize) {
        match *op {
            GraphOp::Alloc {
                addr,
                len,
                device,
                freed_in_graph,
            } => {
                let at = self.enqueue(s, |_| OpKind::Alloc);
                // The graph's own address, reused by every replay without
                // the address space: the last replay's use of it (and the
                // free of its instance) must be ordered before, as CUDA
                // orders the launches of an executable. Checked.
                let clock = self.streams[s].clock.clone();
                self.suballoc_checked(addr, len, at, &clock);
                if !freed_in_graph {
                    self.live.insert(addr, (len, device));
                }
            }
            GraphOp::Free { addr, own: true } => self.free_unchecked(addr, s),
            GraphOp::Free { addr, own: false } => {
                if self.free(addr, s).is_err() {
                    // Freed already (a second replay of a graph that frees
                    // memory it did not allocate): the race detector says so.
                    self.free_unchecked(addr, s);
                }
            }
            // A range the graph keeps across replays (handed out in the
            // capture and not freed in it: the graph's output) was noted
            // allocated when the capture ended, and stays so.
            GraphOp::SubAlloc { addr, len } if self.races.live_at(addr, len) => {}
            GraphOp::SubAlloc { addr, len } => self.note_suballoc(addr, len, s),
            GraphOp::SubFree { addr } => self.note_subfree(addr, s),
            GraphOp::Kernel(ref accesses) => {
                let _ = self.kernel(s, accesses);
            }
        }
    }

    /// A free whose memory stays where it is (a graph's own address): only
    /// the race detector sees it.
    pub(super) fn free_unchecked(&mut self, addr: u64, s: usize) {
        let at = self.enqueue(s, |_| OpKind::Alloc);
        let clock = self.streams[s].clock.clone();
        self.races.on_access(addr, SimOp::Free, at, &clock);
    }

    /// Whether `addr` is held by a graph (its free must not give it back).
    pub(super) fn graph_reserved(&self, addr: u64) -> bool {
        self.captures.reserved.contains_key(&addr)
    }

    fn active(&mut self, id: u64, call: DriverCall) -> GpuResult<&mut SimCapture> {
        match self.captures.active.get_mut(&id) {
            Some(c) if !c.invalidated => Ok(c),
            _ => Err(invalidated(call)),
        }
    }

    /// An allocation on stream `s`, capturing into `id`.
    pub(super) fn captured_alloc(&mut self, id: u64, s: usize, bytes: usize) -> GpuResult<u64> {
        let call = DriverCall::AllocAsync;
        self.active(id, call)?;
        let device = self.streams[s].device;
        // Only a range whose free has run: the replays may run on any
        // stream, ordered after none of the work before a free still
        // queued (CUDA gives graph memory address space of its own). As a
        // stream no stream is, with a clock that covers nothing.
        let addr = self
            .spaces
            .get_mut(&device)
            .ok_or_else(|| invalid_handle(call))?
            .alloc(bytes, usize::MAX, &VectorClock::default())
            .map_err(|available| GpuError::OutOfMemory { available })?;
        // The range is the graph's from now on: what ran there before
        // finished (its free ran), and a replay's allocation is checked
        // only against the replays before.
        self.races.on_reuse(addr, bytes);
        self.captures.reserved.insert(addr, id);
        let c = self.active(id, call)?;
        c.allocs.insert(addr, c.ops.len());
        c.ops.push(GraphOp::Alloc {
            addr,
            len: bytes,
            device,
            freed_in_graph: false,
        });
        c.members.entry(s).or_default().recorded += 1;
        Ok(addr)
    }

    /// A free on stream `s`, capturing into `id`.
    pub(super) fn captured_free(&mut self, id: u64, s: usize, addr: u64) -> GpuResult<()> {
        let call = DriverCall::FreeAsync;
        let outside = self.live.contains_key(&addr);
        let c = self.active(id, call)?;
        let own = if let Some(i) = c.allocs.remove(&addr) {
            if let GraphOp::Alloc { freed_in_graph, .. } = &mut c.ops[i] {
                *freed_in_graph = true;
            }
            true
        } else if outside && c.freed_outside.insert(addr) {
            false
        } else {
            return Err(err(
                call,
                INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE: not a live allocation",
            ));
        };
        c.ops.push(GraphOp::Free { addr, own });
        c.members.entry(s).or_default().recorded += 1;
        Ok(())
    }

    /// A kernel (memset, copy) on stream `s`, capturing into `id`.
    pub(super) fn captured_kernel(
        &mut self,
        id: u64,
        s: usize,
        accesses: &[(u64, Access)],
    ) -> GpuResult<()> {
        let c = self.active(id, DriverCall::Launch)?;
        c.ops.push(GraphOp::Kernel(accesses.to_vec()));
        c.members.entry(s).or_default().recorded += 1;
        Ok(())
    }

    /// A note of caller-managed memory (`SubAlloc`, `SubFree`) on stream
    /// `s`, capturing into `id`: recorded, replayed with the graph. An
    /// invalidated capture records it too, for its end alone (no graph
    /// comes of it): a note is no driver call, and the memory it speaks of
    /// was mapped by calls that take no stream (`cuMemMap`), which the
    /// capture's fate leaves as they are: `cuStreamEndCapture` of an
    /// invalidated capture only returns no graph. Dropping the note lost a
    /// range handed out after the invalidation (a cache blind to captures
    /// whose wait the driver refused, `tests/cache/cross_stream.rs`): its
    /// uses and free after the capture were reported at an invalid address.
    pub(super) fn captured_note(&mut self, id: u64, s: usize, op: GraphOp) {
        if let Some(c) = self.captures.active.get_mut(&id) {
            c.ops.push(op);
            c.members.entry(s).or_default().recorded += 1;
        }
    }

    /// Whether the free of caller-managed memory at `addr`, noted on a
    /// stream capturing into `id`, takes effect at once, in the stream's
    /// order before the capture: where the capture was invalidated (no
    /// graph comes of it, so no replay would ever make the free) and the
    /// range was not handed out in it (that one only cancels its note).
    /// The work captured before the invalidation never runs either: the
    /// range's last users are those queued before the capture.
    pub(super) fn frees_now_in_spoilt_capture(&self, id: u64, addr: u64) -> bool {
        let Some(c) = self.captures.active.get(&id).filter(|c| c.invalidated) else {
            return false;
        };
        let last_note = c.ops.iter().rev().find_map(|op| match *op {
            GraphOp::SubAlloc { addr: a, .. } if a == addr => Some(true),
            GraphOp::SubFree { addr: a } if a == addr => Some(false),
            _ => None,
        });
        last_note != Some(true)
    }

    /// A record of event `e` on stream `s`, capturing into `id`: the event
    /// now marks a point of the graph, which only members may wait on.
    pub(super) fn captured_record(&mut self, id: u64, s: usize, e: usize) -> GpuResult<()> {
        let call = DriverCall::EventRecord;
        self.event(e, call)?;
        let c = self.active(id, call)?;
        let at = c.members.entry(s).or_default().recorded;
        let ev = &mut self.events[e];
        ev.captured = Some(Captured {
            capture: id,
            stream: s,
            at,
        });
        Ok(())
    }

    /// A wait of stream `s` on event `e` whose latest record was captured.
    /// `Ok(true)` when handled here (a join, or a dependency inside the
    /// capture); `Ok(false)` when the wait is an ordinary one.
    pub(super) fn captured_wait(&mut self, s: usize, e: usize) -> GpuResult<bool> {
        let call = DriverCall::StreamWaitEvent;
        let Some(rec) = self.events.get(e).and_then(|ev| ev.captured) else {
            // An event recorded outside any capture: an ordinary wait on a
            // stream that is not capturing. On a capturing one the driver
            // answers CUDA_ERROR_STREAM_CAPTURE_ISOLATION and invalidates
            // the capture (`tests/cuda/graph.rs` checks that it does).
            return match self.capturing(s) {
                None => Ok(false),
                Some(id) => {
                    self.invalidate(id);
                    Err(err(
                        call,
                        ISOLATION,
                        "CUDA_ERROR_STREAM_CAPTURE_ISOLATION: a capturing stream waited on an event recorded outside the capture",
                    ))
                }
            };
        };
        match self.capturing(s) {
            Some(id) if id == rec.capture => {
                let c = self.active(id, call)?;
                let member = c.members.entry(rec.stream).or_default();
                member.joined = member.joined.max(rec.at);
                c.members.entry(s).or_default();
                Ok(true)
            }
            Some(id) => {
                self.invalidate(id);
                Err(err(
                    call,
                    ISOLATION,
                    "CUDA_ERROR_STREAM_CAPTURE_ISOLATION: the event was recorded in another capture",
                ))
            }
            None if self.captures.active.contains_key(&rec.capture) => {
                // A fork: the stream joins the capture.
                let c = self
                    .captures
                    .active
                    .get_mut(&rec.capture)
                    .expect("checked above");
                c.members.entry(s).or_default().recorded += 1;
                self.streams[s].capture = Some(rec.capture);
                Ok(true)
            }
            None => Err(err(
                call,
                CAPTURED_EVENT,
                "CUDA_ERROR_CAPTURED_EVENT: the event's latest record was captured",
            )),
        }
    }

    /// Refuses a query or synchronize of event `e` whose latest record was
    /// captured, invalidating the capture if it is still in progress.
    pub(super) fn check_event_not_captured(&mut self, e: usize, call: DriverCall) -> GpuResult<()> {
        let Some(rec) = self.events.get(e).and_then(|ev| ev.captured) else {
            return Ok(());
        };
        self.invalidate(rec.capture);
        Err(err(
            call,
            CAPTURED_EVENT,
            "CUDA_ERROR_CAPTURED_EVENT: the event's latest record was captured",
        ))
    }

    /// Refuses a synchronize that a capture forbids: of a capturing stream
    /// `s`, or any synchronize while a global capture (or a thread-local one
    /// of this thread) is in progress. The capture is invalidated.
    pub(super) fn check_synchronize_allowed(
        &mut self,
        s: Option<usize>,
        call: DriverCall,
    ) -> GpuResult<()> {
        let here = std::thread::current().id();
        let forbidding = s.and_then(|s| self.capturing(s)).or_else(|| {
            self.captures
                .active
                .iter()
                .find(|(_, c)| {
                    c.mode == CaptureMode::Global
                        || (c.mode == CaptureMode::ThreadLocal && c.thread == here)
                })
                .map(|(&id, _)| id)
        });
        let Some(id) = forbidding else {
            return Ok(());
        };
        self.invalidate(id);
        Err(err(
            call,
            UNSUPPORTED,
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: not allowed during a stream capture",
        ))
    }

    /// Refuses a query of capturing stream `s`, invalidating the capture
    /// (`cuStreamQuery` is not allowed on a capturing stream).
    pub(super) fn check_query_allowed(&mut self, s: usize) -> GpuResult<()> {
        let Some(id) = self.capturing(s) else {
            return Ok(());
        };
        self.invalidate(id);
        Err(err(
            DriverCall::StreamQuery,
            UNSUPPORTED,
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: a capturing stream cannot be queried",
        ))
    }

    /// Refuses a host function on capturing stream `s` (not invalidating:
    /// the call never reaches the capture).
    pub(super) fn check_host_fn_allowed(&self, s: usize) -> GpuResult<()> {
        if self.capturing(s).is_some() {
            return Err(err(
                DriverCall::LaunchHostFunc,
                UNSUPPORTED,
                "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: a host function runs once, a captured one at every replay",
            ));
        }
        Ok(())
    }
}

/// Where an event's latest record was captured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Captured {
    capture: u64,
    stream: usize,
    /// The recording member's captured operations at the record.
    at: u64,
}
