//! [`MemorySnapshot`]: where every byte of a stack is, at one moment.
//!
//! # State
//!
//! Plain data, filled by the layers of a stack from the top down through
//! [`DeviceMemoryResource::snapshot_into`](crate::DeviceMemoryResource::snapshot_into),
//! each adding what only it knows:
//!
//! | section | filled by |
//! | --- | --- |
//! | [`blocks`](MemorySnapshot::blocks) | the stream-ordered resource (its live blocks), the caching tier (the blocks it handed out), a debug guard (its quarantine) |
//! | [`segments`](MemorySnapshot::segments) | the caching tier: its reserved ranges with what is mapped and idle in them, or its size-class blocks |
//! | [`pending_frees`](MemorySnapshot::pending_frees) | the stream-ordered resource: frees queued per stream, not yet known to have run |
//! | [`budgets`](MemorySnapshot::budgets) | each budget layer |
//! | [`waiters`](MemorySnapshot::waiters) | the futures layer ([`AsyncResource::snapshot`](crate::AsyncResource::snapshot)) |
//! | [`history`](MemorySnapshot::history) | a copy of the [history](super::history) ring, this device's events |
//!
//! # One instant
//!
//! Each layer copies its part under its own locks, all of them at once
//! where it has several (the stream-ordered resource holds every shard's
//! lock while it copies, so a block never shows both live and pending), and
//! releases them before the next layer reads. Between two layers the stack
//! may move: a block handed out by the cache in between shows in the cache
//! and not in its segment's idle bytes. A snapshot of a quiet stack is
//! exact; under load each section is consistent in itself. Holding every
//! layer's lock across the whole walk would stall every allocation for the
//! length of the copy, which is what a snapshot under load must not do.

use std::time::Duration;

use super::history::MemoryEvent;

/// A block as a layer of the stack sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockInfo {
    /// Which layer reports it (`"resource"`, `"cache"`, `"debug_guard"`).
    pub layer: &'static str,
    /// The device address.
    pub address: u64,
    /// Bytes it takes in the layer (a cache's rounded size).
    pub size: usize,
    /// Bytes the caller asked for.
    pub requested: usize,
    /// The allocation stream's index.
    pub stream: u32,
    /// The allocation's tag.
    pub tag: &'static str,
    /// How long ago it was allocated, where the layer keeps the time.
    pub age: Option<Duration>,
    /// Where it is in its life.
    pub state: BlockInfoState,
    /// Uses recorded on it whose events the free will wait for (one read
    /// per stream, plus the last write).
    pub pending_uses: usize,
}

/// The state of a [`BlockInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BlockInfoState {
    /// Held by a caller.
    Live,
    /// A `deallocate` is queuing its free right now.
    Freeing,
    /// Freed into a debug guard's quarantine.
    Quarantined,
    /// A block a CUDA graph's capture keeps.
    Graph,
}

/// A range of device memory a cache holds, and what of it is idle.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegmentInfo {
    /// The reporting layer.
    pub layer: &'static str,
    /// First address.
    pub address: u64,
    /// Bytes of address space.
    pub reserved: usize,
    /// Bytes of physical memory behind it (the reserved bytes where the
    /// memory is allocated whole).
    pub mapped: usize,
    /// Bytes mapped and held by no caller (the cache could serve them, or
    /// give them back).
    pub idle: usize,
    /// The largest idle run in it, in bytes.
    pub largest_idle: usize,
    /// The stream it belongs to, if only one may use it.
    pub stream: Option<u32>,
    /// Whether its memory is mapped in pages over a reserved range, so
    /// that it grows and shrinks in place (PyTorch's expandable segments).
    pub expandable: bool,
    /// Its free ranges, `(address, bytes, mapped bytes)`, in address order.
    pub free_ranges: Vec<(u64, usize, usize)>,
}

/// Frees queued on one stream and not yet known to have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PendingFrees {
    /// The stream's index.
    pub stream: u32,
    /// Bytes.
    pub bytes: usize,
    /// The frees' count (tallies of frees queued together count once).
    pub frees: usize,
}

/// A budget of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BudgetInfo {
    /// Its limit, in bytes.
    pub limit: usize,
    /// Bytes counted against it (every resource sharing it).
    pub in_use: usize,
}

/// The allocations waiting for memory in the futures layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WaitersInfo {
    /// Allocations queued.
    pub waiting: usize,
    /// Completion points parked on a notification.
    pub parked_points: usize,
}

/// Where the memory of a stack is, filled by its layers from the top
/// down ([`DeviceMemoryResource::snapshot_into`](crate::DeviceMemoryResource::snapshot_into)):
/// the blocks of every layer, a cache's ranges with what is idle in them,
/// the frees queued per stream, the budgets, the waiters and the history.
///
/// Each layer copies its part under its own locks (the stream-ordered
/// resource under all its shards' at once) and releases them before the
/// next reads: a snapshot of a quiet stack is exact, and under load each
/// section is consistent in itself, while the stack may move between two
/// layers' sections (a block handed out by a cache in between).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MemorySnapshot {
    /// The device ordinal.
    pub device: u32,
    /// Microseconds since the Unix epoch when the snapshot began.
    pub time_us: u64,
    /// Bytes the device had free and in all, when the layer at the bottom
    /// could ask.
    pub device_memory: Option<(usize, usize)>,
    /// Blocks, every layer's.
    pub blocks: Vec<BlockInfo>,
    /// Ranges held by a cache.
    pub segments: Vec<SegmentInfo>,
    /// Queued frees per stream.
    pub pending_frees: Vec<PendingFrees>,
    /// Budgets of the stack.
    pub budgets: Vec<BudgetInfo>,
    /// The futures layer's waiters, when the snapshot came through it.
    pub waiters: Option<WaitersInfo>,
    /// The history's events of this device (empty while it is off).
    pub history: Vec<MemoryEvent>,
}

impl MemorySnapshot {
    /// An empty snapshot of `device`, stamped now.
    pub fn new(device: u32) -> Self {
        MemorySnapshot {
            device,
            time_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            ..Default::default()
        }
    }

    /// The blocks of the topmost layer that hands blocks to callers: the
    /// cache's where there is one (the resource's blocks are then the
    /// cache's own memory), else the resource's. Quarantined blocks are
    /// included.
    pub fn caller_blocks(&self) -> impl Iterator<Item = &BlockInfo> {
        let top = if self.blocks.iter().any(|b| b.layer == "cache") {
            "cache"
        } else {
            "resource"
        };
        self.blocks
            .iter()
            .filter(move |b| b.layer == top || b.state == BlockInfoState::Quarantined)
    }

    /// Bytes held by callers, per tag, the largest first.
    pub fn bytes_by_tag(&self) -> Vec<(&'static str, usize)> {
        let mut tags: Vec<(&'static str, usize)> = Vec::new();
        for b in self.caller_blocks() {
            match tags.iter_mut().find(|(t, _)| *t == b.tag) {
                Some((_, bytes)) => *bytes += b.size,
                None => tags.push((b.tag, b.size)),
            }
        }
        tags.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        tags
    }

    /// Gives each block a layer could not date (the cache keeps no clock
    /// on its hot path) the age of the newest allocation the history
    /// recorded at its address, if any.
    pub(crate) fn date_blocks_from_history(&mut self) {
        let mut born = std::collections::HashMap::new();
        for e in &self.history {
            if e.action == super::history::MemoryAction::Alloc {
                born.insert(e.addr, e.time_us);
            }
        }
        for b in self.blocks.iter_mut().filter(|b| b.age.is_none()) {
            if let Some(&t) = born.get(&b.address) {
                b.age = Some(Duration::from_micros(self.time_us.saturating_sub(t)));
            }
        }
    }

    /// Bytes a cache holds mapped and idle.
    pub fn idle_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.idle).sum()
    }

    /// The largest idle run of any segment.
    pub fn largest_idle_range(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.largest_idle)
            .max()
            .unwrap_or(0)
    }

    /// Bytes whose free is queued and not yet known to have run.
    pub fn pending_free_bytes(&self) -> usize {
        self.pending_frees.iter().map(|p| p.bytes).sum()
    }
}
