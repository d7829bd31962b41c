//! The memory history: an opt-in, bounded ring of what the allocator did.
//!
//! # State
//!
//! One recorder per process, as PyTorch's
//! `torch.cuda.memory._record_memory_history(max_entries=N)`: an on/off
//! flag, read with one relaxed load, and behind a lock a ring of the last
//! `capacity` [`MemoryEvent`]s of every device (each event names its
//! device), their sequence counter and whether allocations keep their Rust
//! backtrace.
//!
//! # Who changes it
//!
//! [`record_memory_history`] turns it on with a capacity (emptying the
//! ring), or off with 0; [`clear_memory_history`] empties it. The layers
//! report into it, each what only it sees:
//!
//! | event | reported by | when |
//! | --- | --- | --- |
//! | [`Alloc`](MemoryAction::Alloc), [`FreeRequested`](MemoryAction::FreeRequested) | the futures layer ([`AsyncResource`](crate::AsyncResource)), the stack's top | a block is handed out, handed back (buffers included) |
//! | [`FreeCompleted`](MemoryAction::FreeCompleted) | the futures layer | a notification or reap learns that a stream ran its frees: the bytes drained, in stream order |
//! | [`SegmentMap`](MemoryAction::SegmentMap), [`SegmentUnmap`](MemoryAction::SegmentUnmap) | the caching tier's virtual-memory arena | pages mapped under a block, idle pages given back |
//! | [`WaitBegun`](MemoryAction::WaitBegun), [`WaitServed`](MemoryAction::WaitServed) | the futures layer | an awaited allocation was refused and queued; a queued one was served |
//! | [`Oom`](MemoryAction::Oom) | the futures layer | an allocation failed for memory (device or budget) |
//!
//! # Why one recorder for the process, not a layer
//!
//! The events come from three floors of the stack (the futures layer above
//! every adaptor, the cache's arena in the middle, the reaps that travel up
//! from the stream-ordered resource). A decorator layer sees only the calls
//! that cross it: it could log allocations and frees, not a page mapped
//! below it nor a wait queued above it. A handle threaded into every layer
//! would change the constructor of each and still leave two stacks of one
//! process with two timelines to merge. A single recorder that every layer
//! reports into gives one timeline, ordered by one sequence number, for
//! every device of the process, which is the picture PyTorch's viewer
//! draws; each event carries its device and stream, so a reader filters.
//!
//! # Cost
//!
//! Off (the default): a report is one relaxed load of a flag and a
//! branch, inlined; the event is never built. On: the event is built, the
//! clock read and the ring's lock taken once per event (a service's hot
//! path pays that while someone debugs it, as PyTorch's does); with
//! backtraces, an allocation also captures its stack
//! ([`Backtrace::force_capture`], its symbols resolved only when printed
//! or exported). `BENCHMARKS.md` has the
//! allocation pair with the history off and on.
//!
//! # Bounded
//!
//! The ring holds at most `capacity` events: a new one evicts the oldest.
//! Backtraces are shared (`Arc`), so a snapshot's copy of the ring copies
//! pointers.

use std::backtrace::Backtrace;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::{AllocTag, StreamId};

/// What happened, in PyTorch's trace vocabulary where it has a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MemoryAction {
    /// A block was handed out (`alloc`).
    Alloc,
    /// A block was handed back; its free is queued on its stream
    /// (`free_requested`).
    FreeRequested,
    /// The GPU ran frees of a stream: `size` bytes of the oldest frees
    /// requested on it (`free_completed`; frees of one stream run in the
    /// order they were queued).
    FreeCompleted,
    /// The cache mapped physical pages at `addr` (`segment_map`).
    SegmentMap,
    /// The cache unmapped idle pages at `addr` and gave them back
    /// (`segment_unmap`).
    SegmentUnmap,
    /// An awaited allocation of `size` bytes was refused and queued to wait
    /// for memory.
    WaitBegun,
    /// A queued allocation was served.
    WaitServed,
    /// An allocation of `size` bytes failed for memory, of the device or of
    /// a budget (`oom`).
    Oom,
}

/// One entry of the history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryEvent {
    /// Position in the process's history, counting from 1 since it was last
    /// turned on (gaps show events the ring evicted).
    pub seq: u64,
    /// Microseconds since the Unix epoch (PyTorch's `time_us`).
    pub time_us: u64,
    /// What happened.
    pub action: MemoryAction,
    /// The device ordinal.
    pub device: u32,
    /// The stream's index in its pool, when the event has one.
    pub stream: Option<u32>,
    /// The address (0 where the event has none).
    pub addr: u64,
    /// Bytes.
    pub size: usize,
    /// The allocation's tag (empty where the event has none).
    pub tag: &'static str,
    /// For [`Oom`](MemoryAction::Oom): the bytes the device or budget had
    /// free (PyTorch's `device_free`).
    pub free: usize,
    /// The Rust backtrace of an allocation, when
    /// [`record_memory_history`] was asked for them: captured at the
    /// allocation, its symbols resolved only when it is printed or
    /// exported.
    #[serde(serialize_with = "serialize_backtrace")]
    pub backtrace: Option<Arc<Backtrace>>,
}

fn serialize_backtrace<S: serde::Serializer>(
    bt: &Option<Arc<Backtrace>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match bt {
        Some(bt) => s.serialize_some(&bt.to_string()),
        None => s.serialize_none(),
    }
}

impl MemoryEvent {
    /// An event of `action` on `device`, with no stream, address, size or
    /// tag yet.
    pub(crate) fn new(action: MemoryAction, device: u32) -> Self {
        MemoryEvent {
            seq: 0,
            time_us: 0,
            action,
            device,
            stream: None,
            addr: 0,
            size: 0,
            tag: "",
            free: 0,
            backtrace: None,
        }
    }

    /// The same event on `stream`.
    pub(crate) fn on(mut self, stream: StreamId) -> Self {
        self.stream = Some(stream.index());
        self
    }

    /// The same event at `addr`, of `size` bytes.
    pub(crate) fn at(mut self, addr: u64, size: usize) -> Self {
        self.addr = addr;
        self.size = size;
        self
    }

    /// The same event tagged `tag`.
    pub(crate) fn tagged(mut self, tag: AllocTag) -> Self {
        self.tag = if tag.0.is_empty() {
            AllocTag::UNTAGGED.0
        } else {
            tag.0
        };
        self
    }

    /// The same event with `free` bytes left.
    pub(crate) fn with_free(mut self, free: usize) -> Self {
        self.free = free;
        self
    }
}

/// Whether the history records; read on every hot path, so alone on its
/// line of memory in effect (nothing else here is written while it is
/// off).
static ON: AtomicBool = AtomicBool::new(false);

/// The ring and its settings. A process-wide `std` lock, outside the loom
/// switch of `crate::util::sync`: no bookkeeping decision reads it, it only
/// receives copies.
static RING: Mutex<Ring> = Mutex::new(Ring {
    events: VecDeque::new(),
    capacity: 0,
    next_seq: 1,
    backtraces: false,
});

struct Ring {
    events: VecDeque<MemoryEvent>,
    capacity: usize,
    next_seq: u64,
    backtraces: bool,
}

fn ring() -> std::sync::MutexGuard<'static, Ring> {
    // A panic while the lock was held left a ring of whole events: the
    // history stays readable.
    RING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts recording the last `capacity` events of every device in this
/// process, each allocation with its Rust backtrace when `backtraces`;
/// 0 stops. Either way the ring starts empty.
///
/// # Examples
/// ```
/// use streamalloc::{memory_history, record_memory_history};
///
/// record_memory_history(10_000, false);
/// // ... run the program ...
/// let events = memory_history();
/// record_memory_history(0, false);
/// # let _ = events;
/// ```
pub fn record_memory_history(capacity: usize, backtraces: bool) {
    let mut ring = ring();
    ring.events = VecDeque::with_capacity(capacity.min(1 << 16));
    ring.capacity = capacity;
    ring.next_seq = 1;
    ring.backtraces = backtraces && capacity > 0;
    ON.store(capacity > 0, Ordering::Relaxed);
}

/// The capacity the history records with (0: off).
pub fn memory_history_capacity() -> usize {
    ring().capacity
}

/// A copy of the events recorded, oldest first.
pub fn memory_history() -> Vec<MemoryEvent> {
    ring().events.iter().cloned().collect()
}

/// Empties the ring (recording goes on if it was on).
pub fn clear_memory_history() {
    ring().events.clear();
}

/// Whether the history records.
#[inline]
pub(crate) fn recording() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Records the event `make` builds, if the history is on: one relaxed load
/// when it is off.
#[inline]
pub(crate) fn record(make: impl FnOnce() -> MemoryEvent) {
    if recording() {
        push(make());
    }
}

#[cold]
fn push(mut event: MemoryEvent) {
    event.time_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let want_backtrace = event.action == MemoryAction::Alloc && ring().backtraces;
    if want_backtrace {
        // Captured without the lock; its symbols are resolved only when
        // it is printed (resolving them here took 160 µs an allocation).
        event.backtrace = Some(Arc::new(Backtrace::force_capture()));
    }
    let mut ring = ring();
    if ring.capacity == 0 {
        return; // turned off between the flag and the lock
    }
    event.seq = ring.next_seq;
    ring.next_seq += 1;
    if ring.events.len() == ring.capacity {
        ring.events.pop_front();
    }
    ring.events.push_back(event);
}
