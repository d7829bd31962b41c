//! One shard of the stream-ordered resource: the live blocks allocated on
//! its streams, the frees queued on those streams, and their tallies, all
//! under one lock.
//!
//! Streams, not blocks, pick the shard (`stream.index() % shards`): a thread
//! that allocates and frees on its own stream touches only its own shard's
//! lock and counters, so threads on different streams share no cache line.
//! A block's pending free lands on its allocation stream, so in the shard
//! that already holds its record, and one lock covers a whole free.
//!
//! A block's serial carries its shard in the low [`SHARD_BITS`] bits and the
//! shard's own sequence number above them: serials are unique without a
//! shared counter, the shard of any id is known without a lookup, and "this
//! shard handed out that number once" still tells a stale id from a forged
//! one.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::block_uses::BlockUses;
use super::live_table::LiveTable;
use super::pending::StreamFrees;
use crate::gpu::{CaptureId, RawStream};
use crate::types::{AllocTag, StreamId};
use crate::util::padded::CachePadded;
use crate::util::sync::{AtomicUsize, Mutex, MutexGuard};

/// Low bits of a serial that name its shard.
pub(crate) const SHARD_BITS: u32 = 6;
/// The most shards a resource has (streams beyond share them).
pub(crate) const MAX_SHARDS: usize = 1 << SHARD_BITS;

/// The serial of the `seq`-th block of shard `shard`.
pub(crate) fn serial(shard: usize, seq: u64) -> u64 {
    (seq << SHARD_BITS) | shard as u64
}

/// The shard and sequence number a serial names.
pub(crate) fn split(serial: u64) -> (usize, u64) {
    (
        (serial & (MAX_SHARDS as u64 - 1)) as usize,
        serial >> SHARD_BITS,
    )
}

/// A live block.
#[derive(Debug)]
pub(crate) struct BlockRecord {
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    pub(crate) stream: StreamId,
    pub(crate) raw_stream: RawStream,
    pub(crate) uses: BlockUses,
    /// A `deallocate` took the uses out and is queuing the free without the
    /// lock: the block is neither usable nor freeable until it puts them
    /// back (the free failed) or removes the record (it was queued).
    pub(crate) freeing: bool,
    /// The capture it was allocated in (a graph memory node, which every
    /// replay allocates again): its free is settled with the pool's
    /// [`KeptGraphMemory`](crate::device::graph_memory::KeptGraphMemory)
    /// unless that capture frees it.
    pub(crate) capture: Option<CaptureId>,
    /// The tag it was allocated with, and when: for snapshots (a clock
    /// read beside a driver call that costs fifty times more).
    pub(crate) tag: AllocTag,
    pub(crate) born: Instant,
}

/// A shard's state; see the module documentation.
#[derive(Debug)]
pub(crate) struct Shard {
    /// The sequence number of the next block (numbers start at 1).
    next_seq: u64,
    /// Live blocks by sequence number.
    pub(crate) blocks: LiveTable<BlockRecord>,
    /// Queued frees of the shard's streams, by `stream.index() / shards`.
    streams: Box<[StreamFrees]>,
    /// Bytes of the live blocks (their frees are not queued yet).
    pub(crate) live: usize,
    /// Bytes of the queued frees, all streams of the shard together.
    pub(crate) pending: usize,
    /// Bytes freed on the shard's streams while they were being captured,
    /// per capture: frees that run at each replay of the capture's graph,
    /// counted until the graph is released (then they join the pending
    /// frees of the stream the release is ordered on).
    pub(crate) graphs: Vec<(CaptureId, usize)>,
}

impl Shard {
    /// Adds a live record; returns its sequence number.
    pub(crate) fn add(&mut self, record: BlockRecord) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.live += record.size;
        self.blocks.insert(seq, record);
        seq
    }

    /// Whether this shard handed out `seq` (so an id with it that finds no
    /// record is stale, not forged).
    pub(crate) fn handed_out(&self, seq: u64) -> bool {
        (1..self.next_seq).contains(&seq)
    }

    /// Moves the block `seq`, whose free was queued on its stream (local
    /// index `local`), from live to pending; returns whether it was there.
    pub(crate) fn retire(&mut self, seq: u64, local: usize) -> bool {
        // The caller took the uses out: dropping the record frees nothing,
        // and not handing it back saves moving it.
        let Some(size) = self.blocks.remove(seq).map(|r| r.size) else {
            return false;
        };
        self.live -= size;
        self.pending += size;
        self.streams[local].push(size);
        true
    }

    /// Moves the block `seq`, whose free was captured into `capture`'s
    /// graph, from live to that graph's tally; returns whether it was
    /// there.
    pub(crate) fn retire_to_graph(&mut self, seq: u64, capture: CaptureId) -> bool {
        let Some(size) = self.blocks.remove(seq).map(|r| r.size) else {
            return false;
        };
        self.live -= size;
        match self.graphs.iter_mut().find(|(c, _)| *c == capture) {
            Some((_, bytes)) => *bytes += size,
            None => self.graphs.push((capture, size)),
        }
        true
    }

    /// Bytes freed in `capture`'s graph on the shard's streams.
    pub(crate) fn graph_bytes(&self, capture: CaptureId) -> usize {
        self.graphs
            .iter()
            .find(|(c, _)| *c == capture)
            .map_or(0, |&(_, b)| b)
    }

    /// Bytes freed in every capture's graph on the shard's streams.
    pub(crate) fn all_graph_bytes(&self) -> usize {
        self.graphs.iter().map(|&(_, b)| b).sum()
    }

    /// Stops counting `bytes` of `capture`'s graph (they were moved to a
    /// stream's pending frees).
    pub(crate) fn take_graph(&mut self, capture: CaptureId, bytes: usize) {
        if let Some(i) = self.graphs.iter().position(|(c, _)| *c == capture) {
            self.graphs[i].1 -= bytes;
            if self.graphs[i].1 == 0 {
                self.graphs.swap_remove(i);
            }
        }
    }

    /// Counts `bytes` freed by a released graph as queued on the stream of
    /// local index `local` (they drain when it passes this point).
    pub(crate) fn queue_released(&mut self, local: usize, bytes: usize) {
        self.streams[local].push(bytes);
        self.pending += bytes;
    }

    /// The queued frees of the stream of local index `local`.
    pub(crate) fn stream(&mut self, local: usize) -> &mut StreamFrees {
        &mut self.streams[local]
    }

    /// The queued frees of every stream, by local index.
    pub(crate) fn streams(&self) -> &[StreamFrees] {
        &self.streams
    }

    /// The stream of local index `local` reached `seq`: drains its frees
    /// through it; returns the bytes drained.
    pub(crate) fn drain_through(&mut self, local: usize, seq: u64) -> usize {
        let drained = self.streams[local].drain_through(seq);
        self.pending -= drained;
        drained
    }
}

/// A shard's lock and its outstanding bytes, alone on their cache lines.
#[derive(Debug)]
pub(crate) struct ShardSlot {
    state: Mutex<Shard>,
    /// `live + pending` of the shard, readable without the lock. Written
    /// only under the lock (so a load and a store, not a read-modify-write),
    /// and untouched when a block moves from live to pending: a reader can
    /// never miss a block in the middle of its free.
    outstanding: AtomicUsize,
}

/// A locked shard.
pub(crate) type ShardGuard<'a> = MutexGuard<'a, Shard>;

impl ShardSlot {
    /// An empty shard serving `streams` streams.
    pub(crate) fn new(streams: usize) -> CachePadded<Self> {
        CachePadded(ShardSlot {
            state: Mutex::new(Shard {
                next_seq: 1,
                blocks: LiveTable::default(),
                streams: (0..streams).map(|_| StreamFrees::default()).collect(),
                live: 0,
                pending: 0,
                graphs: Vec::new(),
            }),
            outstanding: AtomicUsize::new(0),
        })
    }

    /// The shard, locked (a poisoned lock is used as it is, as everywhere in
    /// the crate).
    pub(crate) fn lock(&self) -> ShardGuard<'_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shard, for the owner's `Drop`.
    pub(crate) fn get_mut(&mut self) -> &mut Shard {
        self.state.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes outstanding in the shard (one load). Inlined: the resource's
    /// `bytes_outstanding` sums every shard, and a budget above it asks on
    /// each deallocate, so a call per shard would cost more than the loads.
    #[inline]
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Adds `bytes` to the outstanding count; `_held` proves the lock is
    /// held, so no other writer races the load and the store.
    pub(crate) fn add_outstanding(&self, _held: &ShardGuard<'_>, bytes: usize) {
        let now = self.outstanding.load(Ordering::Relaxed);
        self.outstanding.store(now + bytes, Ordering::Release);
    }

    /// Subtracts `bytes` from the outstanding count, as
    /// [`add_outstanding`](Self::add_outstanding).
    pub(crate) fn sub_outstanding(&self, _held: &ShardGuard<'_>, bytes: usize) {
        let now = self.outstanding.load(Ordering::Relaxed);
        self.outstanding.store(now - bytes, Ordering::Release);
    }
}
