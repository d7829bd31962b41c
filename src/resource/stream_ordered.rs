//! `StreamOrderedResource<G>`: stream-ordered bookkeeping, written once for
//! every backend.
//!
//! # Where the code is
//!
//! This file holds the type, its construction, its diagnostics, the
//! lookups of a stream's shard and a block's record, and the
//! [`DeviceMemoryResource`] impl with the allocation; the impl's larger
//! parts are `impl StreamOrderedResource` blocks of their own in
//! `stream_ordered/`, each with an essay:
//!
//! - `free.rs`: a block's free and the reaps that drain pending frees.
//! - `uses.rs`: the block-use hooks (waits before a use, events after it,
//!   uses of a block a capture kept).
//! - `graph.rs`: the release of a capture's graph and the frees of the
//!   blocks it adopted.
//! - `loom_tests.rs`: loom models of the bookkeeping (`--cfg loom`).
//!
//! The parts import the type from here; of each other's methods, `free.rs`
//! calls [`follow`](StreamOrderedResource::follow) in `uses.rs`, and the
//! parent calls what its trait methods delegate to.
//!
//! # State
//!
//! Per [shard] (one per stream while the pool has at most 64,
//! else streams share them round-robin), under one lock:
//!
//! - **Live blocks** allocated on the shard's streams, by serial number.
//!   Each record holds the block's address, size, allocation stream and its
//!   [uses](super::block_uses): one read event per stream plus the last
//!   write.
//! - **Pending frees** ([`StreamFrees`](super::pending)) of the shard's
//!   streams: bytes whose free is queued on the GPU but not known to have
//!   run, with per-stream sequence numbers.
//! - **Graph frees**: bytes freed on a stream while it was being captured
//!   into a CUDA graph, per capture. Such a free is a node of the graph,
//!   which runs at every replay, and the graph keeps its memory while it
//!   lives: the bytes stay counted until
//!   [`release_capture`](DeviceMemoryResource::release_capture) moves them
//!   to the pending frees of the stream the replays are ordered on.
//! - **Kept graph allocations**: a record allocated on a capturing stream
//!   notes its capture. Freed in that capture, it is a graph free as above;
//!   freed after it, the pool's ledger
//!   ([`KeptGraphMemory`](crate::device::graph_memory::KeptGraphMemory))
//!   says what the free does: while the graph lives, nothing on the device
//!   (the bytes join the graph's tally, and the graph frees each replay's
//!   instance); once it is gone, an ordinary free of the instance the last
//!   replay left, or none. A block from outside a capture freed on one of
//!   its streams is adopted by the graph instead of freed in it: its bytes
//!   join the graph's tally, and the release frees it once.
//! - The live, pending and graph byte tallies, and their sum,
//!   `outstanding`, readable without the lock.
//!
//! A block moves from live to pending when its free is queued (within its
//! shard, as the free is queued on its allocation stream), and leaves
//! pending when a reap learns that its stream passed the free. A thread that
//! allocates and frees on its own stream touches nothing another stream's
//! thread writes.
//!
//! # Who changes it
//!
//! `allocate` adds a record; the block-use hooks add and re-record events in
//! it (under the shard lock, so that a wait never sees an event being
//! re-recorded for another use); `deallocate` marks the record as being
//! freed, makes the allocation stream wait on every recorded event, queues
//! the free, and moves the bytes; `reap_pending` and `reap_through` drain.
//! Locks are never held across a driver call that blocks (only
//! `event_record` and `stream_wait_event`, which just queue, run under a
//! shard lock).
//!
//! # Failure
//!
//! Every method checks its input before it changes anything, and undoes its
//! partial work when a driver call fails, so that a failed call leaves every
//! counter and map as it was.

// Unsafe here: allocations, frees, event records and waits on raw handles of the `Gpu` seam.
#![allow(unsafe_code)]

use std::sync::Arc;

use super::DeviceMemoryResource;
use super::block_uses::BlockUses;
use super::event_pool::EventPool;
use super::shard::{self, BlockRecord, MAX_SHARDS, Shard, ShardSlot};
use super::unwind::ReturnOnUnwind;
use crate::device::{Device, StreamPool};
use crate::error::{ResourceError, ResourceResult};
#[cfg(feature = "cuda")]
use crate::gpu::cuda::CudaGpu;
use crate::gpu::sim::SimGpu;
use crate::gpu::{CaptureId, CaptureStatus, Gpu, RawStream};
use crate::types::{Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId, StreamId};
use crate::util::padded::CachePadded;

mod free;
mod graph;
mod uses;

/// The stream-ordered resource over a backend `G`.
///
/// # State
///
/// Shards by stream, each holding the live blocks allocated on its streams
/// (with their uses: one read event per stream plus the last write), the
/// frees queued on its streams but not known to have run (with per-stream
/// sequence numbers), and its live and pending tallies. A block moves from
/// live to pending when its free is queued, and leaves pending when a reap
/// learns its stream passed the free. [`AsyncCudaResource`] and
/// [`SimResource`] are its two instances.
///
/// # Examples
/// ```
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{AllocTag, Device, DeviceMemoryResource, SimResource};
///
/// let device = Device::simulated(&SimGpu::new(), 1);
/// let resource = SimResource::new(&device);
/// let stream = device.stream(0)?;
///
/// let block = resource.allocate(1 << 20, stream, AllocTag("weights"))?;
/// assert_eq!(resource.live_bytes(), 1 << 20);
/// resource.deallocate(block)?;
/// assert_eq!(resource.pending_free_bytes(), 1 << 20);
/// resource.reap_pending()?;
/// assert_eq!(resource.bytes_outstanding(), 0);
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
pub struct StreamOrderedResource<G: Gpu> {
    id: ResourceId,
    gpu: Arc<G>,
    device_ordinal: u32,
    stream_pool: Arc<StreamPool>,
    /// A power of two many, at most [`MAX_SHARDS`]; stream `i` is in shard
    /// `i % shards.len()`, at local index `i / shards.len()`.
    shards: Box<[CachePadded<ShardSlot>]>,
    /// `log2(shards.len())`.
    shard_bits: u32,
    events: EventPool<G>,
}

#[cfg(feature = "cuda")]
/// The stream-ordered resource on a CUDA device, through cudarc.
pub type AsyncCudaResource = StreamOrderedResource<CudaGpu>;

/// The stream-ordered resource on the simulated device.
pub type SimResource = StreamOrderedResource<SimGpu>;

impl<G: Gpu> std::fmt::Debug for StreamOrderedResource<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOrderedResource")
            .field("device_ordinal", &self.device_ordinal)
            .field("live_bytes", &self.live_bytes())
            .field("pending_free_bytes", &self.pending_free_bytes())
            .finish()
    }
}

#[cfg(feature = "cuda")]
impl AsyncCudaResource {
    /// The cudarc context of the device.
    pub fn context(&self) -> &Arc<cudarc::driver::CudaContext> {
        self.gpu.context()
    }
}

impl<G: Gpu> StreamOrderedResource<G> {
    /// A resource on `device`, ordering its work on the device's streams.
    ///
    /// On CUDA, if the device's memory pool could not be set up (only a
    /// [`CudaGpu::new`] keeps such an error), every allocation reports the
    /// driver error.
    pub fn new(device: &Device<G>) -> Self {
        let gpu = device.gpu().clone();
        let stream_pool = device.streams().clone();
        let device_ordinal = device.ordinal();
        // By capacity, not length: an open-ended pool's later streams get
        // slots made now.
        let shards = stream_pool
            .capacity()
            .clamp(1, MAX_SHARDS)
            .next_power_of_two();
        let streams_per_shard = stream_pool.capacity().div_ceil(shards);
        StreamOrderedResource {
            id: ResourceId::fresh(),
            events: EventPool::new(gpu.clone()),
            gpu,
            device_ordinal,
            stream_pool,
            shards: (0..shards)
                .map(|_| ShardSlot::new(streams_per_shard))
                .collect(),
            shard_bits: shards.trailing_zeros(),
        }
    }

    /// The device: the backend and the streams.
    pub fn device(&self) -> Device<G> {
        Device::from_parts(self.gpu.clone(), self.stream_pool.clone())
    }

    /// The backend.
    pub fn gpu(&self) -> &Arc<G> {
        &self.gpu
    }

    /// The stream pool streams are resolved in.
    pub fn stream_pool(&self) -> &Arc<StreamPool> {
        &self.stream_pool
    }

    /// This resource's identity (blocks carry it).
    pub fn resource_id(&self) -> ResourceId {
        self.id
    }

    /// Bytes held by live blocks (not counting pending frees). A diagnostic
    /// (it locks every shard): production code should use
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding).
    pub fn live_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().live).sum()
    }

    /// Bytes whose free is queued but not yet known to have executed (locks
    /// every shard).
    pub fn pending_free_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().pending).sum()
    }

    /// Sum of the per-stream pending tallies; equals
    /// [`pending_free_bytes`](Self::pending_free_bytes) whenever no call is in
    /// flight (both change together under one shard lock).
    pub fn pending_per_stream_total(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().streams().iter().map(|f| f.bytes()).sum::<usize>())
            .sum()
    }

    /// Bytes whose free is queued on `stream` but not yet known to have
    /// executed (0 for a stream not in the pool).
    pub fn pending_stream_bytes(&self, stream: StreamId) -> usize {
        self.in_pool(stream).map_or(0, |(shard, local)| {
            self.shards[shard].lock().stream(local).bytes()
        })
    }

    /// Outstanding read events plus the last-write event (0 or 1) of the live
    /// block at `ptr`; `None` when no live block starts there (or its free
    /// is in flight).
    pub fn pending_use_event_count(&self, ptr: u64) -> Option<usize> {
        if ptr == 0 {
            return None;
        }
        self.shards.iter().find_map(|shard| {
            shard
                .lock()
                .blocks
                .values()
                .find(|r| r.ptr == ptr && !r.freeing)
                .map(|r| r.uses.event_count())
        })
    }

    /// Bytes freed on capturing streams whose graphs are not released yet
    /// (locks every shard). They count in
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding): see
    /// [`release_capture`](DeviceMemoryResource::release_capture).
    pub fn graph_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().all_graph_bytes()).sum()
    }

    /// Number of live blocks (a block whose free is in flight counts until
    /// the free is queued, as its bytes do).
    pub fn live_blocks(&self) -> usize {
        self.shards.iter().map(|s| s.lock().blocks.len()).sum()
    }

    /// Events pooled for reuse.
    pub fn pooled_events(&self) -> usize {
        self.events.len()
    }

    /// Resolves a stream of this resource's device.
    fn raw_stream(&self, stream: StreamId) -> ResourceResult<RawStream> {
        ResourceError::check_device(self.device_ordinal, stream.device())?;
        self.stream_pool.raw(stream)
    }

    /// The shard and local index of a stream of the pool (validated
    /// before).
    fn place(&self, stream: StreamId) -> (usize, usize) {
        let i = stream.index() as usize;
        (i & ((1 << self.shard_bits) - 1), i >> self.shard_bits)
    }

    /// The shard and local index of `stream`, if it is in the pool.
    fn in_pool(&self, stream: StreamId) -> Option<(usize, usize)> {
        let known = stream.device() == self.device_ordinal && self.stream_pool.contains(stream);
        known.then(|| self.place(stream))
    }

    /// The shard and sequence number of one of this resource's blocks.
    fn locate(&self, block: BlockId) -> ResourceResult<(&ShardSlot, u64)> {
        if block.resource() != self.id {
            return Err(ResourceError::ForeignBlock { block });
        }
        let (shard, seq) = shard::split(block.serial());
        match self.shards.get(shard) {
            Some(slot) => Ok((slot, seq)),
            None => Err(ResourceError::UnknownBlock { block }),
        }
    }

    /// Why `block` (of `shard`, number `seq`) has no record: freed already,
    /// or never handed out.
    fn missing(shard: &Shard, seq: u64, block: BlockId) -> ResourceError {
        if shard.handed_out(seq) {
            ResourceError::DoubleFree { block }
        } else {
            ResourceError::UnknownBlock { block }
        }
    }
}

// SAFETY: every block is a fresh `alloc_async` of `self.gpu` on a stream of
// `self.stream_pool` (a `Device`'s parts, which agree), kept in the live
// table until its one free; frees and hooks judge a block by that table,
// and the free is queued behind the waits on every recorded use.
unsafe impl<G: Gpu> DeviceMemoryResource for StreamOrderedResource<G> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let raw = self.raw_stream(stream)?;
        // An allocation on a capturing stream is a node of the capture's
        // graph: every replay makes it again, and the pool's ledger settles
        // who frees those (`device::graph_memory`). Asked first, so that a
        // failure changes nothing (on CUDA, a driver call only while a
        // capture begun through the crate is underway).
        // SAFETY: `raw` was resolved through `self.stream_pool`, which this
        // resource holds and which keeps its streams alive.
        let capture = unsafe { self.gpu.capture_status(raw) }
            .map_err(ResourceError::from)?
            .id();
        // SAFETY: as above.
        let ptr = unsafe { self.gpu.alloc_async(bytes, raw) }
            .map_err(|e| e.for_request(bytes, stream))?;
        let capture = capture.filter(|_| ptr != 0);
        if let Some(c) = capture {
            self.stream_pool
                .kept_graph_memory()
                .lock()
                .allocated(c, ptr);
        }
        let (index, _) = self.place(stream);
        let slot = &self.shards[index];
        let seq = {
            let mut shard = slot.lock();
            let seq = shard.add(BlockRecord {
                ptr,
                size: bytes,
                stream,
                raw_stream: raw,
                uses: BlockUses::default(),
                freeing: false,
                capture,
                tag,
                born: std::time::Instant::now(),
            });
            slot.add_outstanding(&shard, bytes);
            seq
        };
        let block = DeviceBlock::new(
            BlockId::new(self.id, shard::serial(index, seq)),
            ptr,
            bytes,
            stream,
            tag,
        );
        // A subscriber that panics must not leave the block live with no
        // descriptor: the guard frees it as the panic unwinds.
        let guard = ReturnOnUnwind::new(self, block);
        tracing::trace!(bytes, %stream, ptr, %tag, "allocate");
        Ok(guard.hand_out())
    }

    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.free_block(block)
    }

    fn device_ordinal(&self) -> u32 {
        self.device_ordinal
    }

    fn bytes_outstanding(&self) -> usize {
        // One load per shard. A block moving from live to pending never
        // changes its shard's count, so it is never missed; an allocation
        // raises its shard's count (release) before it returns, so a reader
        // that learnt of it (as the budget adaptor does through its own
        // counter) sees it.
        self.shards.iter().map(|s| s.outstanding()).sum()
    }

    /// Synchronizes each stream with queued frees, then drains them.
    ///
    /// A stream being captured into a CUDA graph is skipped (synchronizing
    /// it would invalidate the user's capture): its frees belong to the
    /// graph and stay pending until a reap after the capture. One
    /// `capture_status` call per stream with frees pending.
    ///
    /// Inside a poll of the crate's futures (see `AsyncResource`), where
    /// nothing may block, it synchronizes nothing and drains nothing: the
    /// completion notifications apply those frees as the GPU runs them, and
    /// a waiting allocation is woken then. So a decorator that reaps on its
    /// out-of-memory path (`RetryOnOomResource`, the cache) never parks the
    /// executor thread.
    fn reap_pending(&self) -> ResourceResult<()> {
        self.reap_streams()
    }

    fn capture_status(&self, stream: StreamId) -> ResourceResult<CaptureStatus> {
        let raw = self.raw_stream(stream)?;
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        unsafe { self.gpu.capture_status(raw) }.map_err(ResourceError::from)
    }

    /// Its live blocks and each stream's queued frees, copied with every
    /// shard locked at once (in shard order, as nothing else takes two):
    /// a block in the middle of its free shows once, live or pending. The
    /// device's free and total memory, asked of the backend after the
    /// locks are released.
    fn snapshot_into(&self, snapshot: &mut crate::observe::MemorySnapshot) {
        use crate::observe::{BlockInfo, BlockInfoState, PendingFrees};
        let now = std::time::Instant::now();
        let shards: Vec<_> = self.shards.iter().map(|slot| slot.lock()).collect();
        let n = shards.len();
        for (index, shard) in shards.iter().enumerate() {
            snapshot
                .blocks
                .extend(shard.blocks.values().map(|r| BlockInfo {
                    layer: "resource",
                    address: r.ptr,
                    size: r.size,
                    requested: r.size,
                    stream: r.stream.index(),
                    tag: r.tag.0,
                    age: Some(now.saturating_duration_since(r.born)),
                    state: if r.freeing {
                        BlockInfoState::Freeing
                    } else if r.capture.is_some() {
                        BlockInfoState::Graph
                    } else {
                        BlockInfoState::Live
                    },
                    pending_uses: r.uses.event_count(),
                }));
            for (local, frees) in shard.streams().iter().enumerate() {
                if frees.bytes() > 0 {
                    snapshot.pending_frees.push(PendingFrees {
                        stream: (local * n + index) as u32,
                        bytes: frees.bytes(),
                        frees: frees.entries(),
                    });
                }
            }
        }
        drop(shards);
        snapshot.pending_frees.sort_by_key(|p| p.stream);
        if snapshot.device_memory.is_none() {
            snapshot.device_memory = self.gpu.mem_info().ok();
        }
    }

    /// A block allocated on a capturing stream is a graph allocation (CUDA's
    /// graph memory node): the resource counts it from the allocation, as
    /// any block. A free queued on a capturing stream is a node of that
    /// graph, which runs at every replay, and CUDA keeps the graph's memory
    /// reserved for it while it lives: so the resource counts the bytes
    /// (in [`graph_bytes`](StreamOrderedResource::graph_bytes)) until this
    /// call, which moves them to the pending frees of `after`. They leave
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding) when a
    /// reap learns that `after` passed this point, that is after the last
    /// replay.
    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        self.release_graph(capture, after)
    }

    fn device_access(&self) -> Option<super::DeviceAccess> {
        Some(super::DeviceAccess {
            gpu: self.gpu.clone(),
            streams: self.stream_pool.clone(),
            charges: Vec::new(),
        })
    }

    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.in_pool(stream).map_or(0, |(shard, local)| {
            self.shards[shard].lock().stream(local).observe()
        })
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.in_pool(stream)
            .map_or(0, |(shard, local)| self.drain(shard, local, seq))
    }

    fn supports_block_use_tracking(&self) -> bool {
        true
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        let raw_use = self.raw_stream(use_stream)?;
        self.with_backed(block.id(), raw_use, None, |r| {
            self.record_use(r, use_stream, raw_use, Access::Read)
        })
    }

    fn prepare_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let raw_use = self.raw_stream(use_stream)?;
        self.with_backed(block, raw_use, Some(use_stream), |r| {
            self.queue_waits(r, use_stream, raw_use, access)
        })
    }

    fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let raw_use = self.raw_stream(use_stream)?;
        self.with_backed(block, raw_use, None, |r| {
            self.record_use(r, use_stream, raw_use, access)
        })
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        let (slot, seq) = self.locate(block).ok()?;
        let shard = slot.lock();
        match shard.blocks.get(seq) {
            Some(record) if !record.freeing => Some(BlockState::Live),
            // Its free is in flight: retired unless that free fails.
            Some(_) => Some(BlockState::Retired),
            None => shard.handed_out(seq).then_some(BlockState::Retired),
        }
    }

    // Every request is one `alloc_async` of exactly its size.
    fn allocation_cost(&self, bytes: usize, _: StreamId) -> usize {
        bytes
    }

    fn allocation_cost_is_exact(&self) -> bool {
        true
    }

    // Nothing is held back: a free is queued at once.
    fn release_idle(&self) -> ResourceResult<usize> {
        Ok(0)
    }

    // A block's free is queued on its own stream only.
    fn frees_across_streams(&self) -> bool {
        false
    }

    /// `true`: a free moves its block from live to pending within its
    /// shard's count; only a reap takes the bytes out.
    fn frees_only_queue(&self) -> bool {
        true
    }

    fn allocation_limit(&self) -> Option<usize> {
        None
    }

    /// Charges no budget.
    fn budget_reliefs(&self, _: &mut Vec<super::BudgetRelief>) {}
}

impl<G: Gpu> Drop for StreamOrderedResource<G> {
    fn drop(&mut self) {
        let mut leaked = 0usize;
        for slot in self.shards.iter_mut() {
            for mut record in slot.get_mut().blocks.drain() {
                leaked += record.size;
                self.events
                    .give(record.uses.take_all().into_iter().map(|(_, e)| e));
            }
        }
        if leaked > 0 {
            tracing::warn!(
                bytes = leaked,
                device = self.device_ordinal,
                "resource dropped with live blocks; their memory is not freed"
            );
        }
    }
}

#[cfg(all(test, loom))]
pub(crate) mod loom_tests;
