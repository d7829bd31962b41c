//! `StreamOrderedResource<G>`: stream-ordered bookkeeping, written once for
//! every backend.
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
use crate::device::graph_memory::{Adopted, KeptFree};
use crate::device::{Device, StreamPool};
use crate::error::{ResourceError, ResourceResult};
#[cfg(feature = "cuda")]
use crate::gpu::cuda::CudaGpu;
use crate::gpu::sim::SimGpu;
use crate::gpu::{CaptureId, CaptureStatus, Gpu, RawStream};
use crate::types::{Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId, StreamId};
use crate::util::padded::CachePadded;

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

    /// Runs `f` on the live record of `block` under its shard lock.
    ///
    /// A block whose free is in flight on another thread is
    /// [`FreeInFlight`](ResourceError::FreeInFlight): that free may still
    /// fail and leave the block live, so the hook is told neither "live" nor
    /// "freed", and changes nothing.
    fn with_live<T>(
        &self,
        block: BlockId,
        f: impl FnOnce(&mut BlockRecord) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let (slot, seq) = self.locate(block)?;
        let mut guard = slot.lock();
        let shard = &mut *guard;
        match shard.blocks.get_mut(seq) {
            Some(record) if record.freeing => Err(ResourceError::FreeInFlight { block }),
            Some(record) => f(record),
            None => Err(Self::missing(shard, seq, block)),
        }
    }

    /// Stream `(shard, local)` reached `seq`: drains its frees through it;
    /// returns the bytes drained.
    fn drain(&self, shard: usize, local: usize, seq: u64) -> usize {
        let slot = &self.shards[shard];
        let mut guard = slot.lock();
        let drained = guard.drain_through(local, seq);
        slot.sub_outstanding(&guard, drained);
        drop(guard);
        if drained > 0 {
            // The device has these bytes back: an allocation waiting on
            // this device, in any queue of the process, may fit now.
            crate::waiters::memory_returned(crate::waiters::Scope::Device {
                ordinal: self.gpu.ordinal(),
                context: self.gpu.context_id(),
            });
        }
        drained
    }

    /// `StreamCapturing` when `stream` is being captured into a graph (on
    /// CUDA a driver call only while a capture begun through the crate is
    /// underway, `gpu::capture_gate`).
    fn refuse_capturing(&self, stream: StreamId, raw: RawStream) -> ResourceResult<()> {
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        let status = unsafe { self.gpu.capture_status(raw) }?;
        if status.is_capturing() {
            return Err(ResourceError::StreamCapturing {
                stream,
                capture: status.id(),
            });
        }
        Ok(())
    }

    /// Queues the waits `use_stream` needs before `access` to `record`.
    fn queue_waits(
        &self,
        record: &mut BlockRecord,
        use_stream: StreamId,
        raw_use: RawStream,
        access: Access,
    ) -> ResourceResult<()> {
        let first_elsewhere = record.uses.last_write.is_none() && use_stream != record.stream;
        if first_elsewhere || record.uses.waits_for(use_stream, access).next().is_some() {
            // A capturing stream may not wait on an event recorded outside
            // its capture: the driver refuses with STREAM_CAPTURE_ISOLATION
            // and invalidates the user's capture (`tests/cuda/graph.rs`
            // checks that it does).
            self.refuse_capturing(use_stream, raw_use)?;
        }
        let mut allocation_point = None;
        if first_elsewhere {
            // The allocation point is recorded on the block's stream: were
            // that stream capturing, the event would be captured, and a wait
            // on it from `use_stream` would pull `use_stream` into the
            // capture. Refused until the capture ends.
            self.refuse_capturing(record.stream, record.raw_stream)?;
            // First use on another stream: order it after the allocation by
            // recording where the allocation stream is now.
            let event = self.events.take().map_err(ResourceError::from)?;
            // SAFETY: the event comes from this resource's pool, which made it
            // on `self.gpu` and destroys it only when dropped; the stream is
            // the record's, resolved through `self.stream_pool`, which this
            // resource holds and which keeps its streams alive (its
            // constructors' contract).
            if let Err(e) = unsafe { self.gpu.event_record(event, record.raw_stream) } {
                self.events.give([event]);
                return Err(ResourceError::from(e));
            }
            record.uses.last_write = Some((record.stream, event));
            allocation_point = Some(event);
        }
        let failed = record
            .uses
            .waits_for(use_stream, access)
            // SAFETY: `raw_use` was resolved through `self.stream_pool` (kept
            // alive with it); the events are the record's, taken from this
            // resource's pool and live until given back to it.
            .find_map(|event| unsafe { self.gpu.stream_wait_event(raw_use, event) }.err());
        match failed {
            None => Ok(()),
            Some(e) => {
                // A failed call changes nothing: the allocation point goes
                // back to the pool (the waits already queued only order more).
                if let Some(event) = allocation_point {
                    record.uses.last_write = None;
                    self.events.give([event]);
                }
                Err(ResourceError::from(e))
            }
        }
    }

    /// Makes `raw_on` wait for the work queued on `earlier` so far.
    /// Refused (`StreamCapturing`, nothing queued) while `earlier`
    /// captures: the event would be recorded in that capture, and the wait
    /// would join `raw_on` to it.
    fn follow(&self, earlier: StreamId, raw_on: RawStream) -> ResourceResult<()> {
        let raw = self.raw_stream(earlier)?;
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        let status = unsafe { self.gpu.capture_status(raw) }?;
        if status.is_capturing() {
            return Err(ResourceError::StreamCapturing {
                stream: earlier,
                capture: status.id(),
            });
        }
        let event = self.events.take().map_err(ResourceError::from)?;
        // SAFETY: a pooled event of this gpu; `raw` and `raw_on` are streams
        // of this resource's pool (alive). The event goes back to the pool
        // once the wait is queued: a wait keeps the record it saw.
        let ordered = unsafe { self.gpu.event_record(event, raw) }
            .and_then(|()| unsafe { self.gpu.stream_wait_event(raw_on, event) });
        self.events.give([event]);
        ordered.map_err(ResourceError::from)
    }

    /// Queues on `after` (`raw_after`) the free of a block the graph of a
    /// released capture adopted: after the work queued on the block's
    /// stream so far and its recorded uses on other streams.
    fn free_adopted(
        &self,
        a: &Adopted,
        after: StreamId,
        raw_after: RawStream,
    ) -> ResourceResult<()> {
        if a.stream != after {
            let raw = self.raw_stream(a.stream)?;
            let event = self.events.take().map_err(ResourceError::from)?;
            // SAFETY: a pooled event of this gpu; `raw` and `raw_after` are
            // streams of this resource's pool (alive). The event goes back
            // to the pool once the wait is queued: a wait keeps the record
            // it saw.
            let ordered = unsafe { self.gpu.event_record(event, raw) }
                .and_then(|()| unsafe { self.gpu.stream_wait_event(raw_after, event) });
            self.events.give([event]);
            ordered.map_err(ResourceError::from)?;
        }
        for &event in &a.events {
            // SAFETY: the block's use events, from this resource's pool and
            // kept out of it until the free is queued.
            unsafe { self.gpu.stream_wait_event(raw_after, event) }.map_err(ResourceError::from)?;
        }
        // SAFETY: `a.ptr` is a live allocation of this gpu (its record left
        // the live set for the graph's tally, and nothing else frees it),
        // used by nothing after what `raw_after` now waits for and the
        // graph's replays (ordered before `after`, the release's contract).
        unsafe { self.gpu.free_async(a.ptr, raw_after) }.map_err(|e| e.for_request(0, after))
    }

    /// [`with_live`](Self::with_live) for a use on `raw_use`, refused
    /// when the block is one its capture allocated and kept (a graph memory
    /// node) with no replay's instance live, unless the use is itself
    /// captured into that capture: outside its graph's replays there is no
    /// memory at its address then. A block of no capture (the common case)
    /// takes its shard's lock once.
    ///
    /// With `before: Some(use_stream)` (a use about to be queued there), a
    /// use of a kept block outside its capture is first ordered after the
    /// graph's last replay, which wrote the block: `use_stream` waits for
    /// the work queued so far on the stream of that replay (nothing when
    /// it is `use_stream`, whose order does it). The replay records no use
    /// of the block (it is queued by the graph, not through a hook), so
    /// nothing else would order it; refused (`StreamCapturing`, nothing
    /// queued) while either stream captures.
    fn with_backed<T>(
        &self,
        block: BlockId,
        raw_use: RawStream,
        before: Option<StreamId>,
        mut f: impl FnMut(&mut BlockRecord) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let kept = self.with_live(block, |r| match r.capture {
            None => f(r).map(Ok),
            Some(c) => Ok(Err((c, r.ptr))),
        })?;
        let (capture, ptr) = match kept {
            Ok(done) => return Ok(done),
            Err(kept) => kept,
        };
        // SAFETY: `raw_use` was resolved through `self.stream_pool`, which
        // keeps its streams alive.
        let inside = unsafe { self.gpu.capture_status(raw_use) }?.id() == Some(capture);
        if inside {
            return self.with_live(block, f);
        }
        // The ledger's lock is taken before any shard lock, never inside.
        let last_launch = {
            let ledger = self.stream_pool.kept_graph_memory().lock();
            if !ledger.backed(capture, ptr) {
                return Err(ResourceError::GraphMemoryUnbacked { block });
            }
            ledger.last_launch(capture)
        };
        if let Some(use_stream) = before
            && let Some(last) = last_launch.filter(|&l| l != use_stream)
        {
            // A capturing `use_stream` may not wait on an event recorded
            // outside its capture (the driver would invalidate it).
            self.refuse_capturing(use_stream, raw_use)?;
            self.follow(last, raw_use)?;
        }
        // Backed until the user lets the block go (a launch that would free
        // its instance is refused while the user holds it).
        self.with_live(block, f)
    }

    /// Records the end of a use of `access` on `use_stream`.
    fn record_use(
        &self,
        record: &mut BlockRecord,
        use_stream: StreamId,
        raw_use: RawStream,
        access: Access,
    ) -> ResourceResult<()> {
        // A use queued on a capturing stream runs at each replay of the
        // graph, not now, and an event recorded there would be captured: a
        // wait on it after the capture fails (`CUDA_ERROR_CAPTURED_EVENT`),
        // and one from another stream during it joins that stream to the
        // capture. Nothing is recorded, and the uses recorded before stay:
        // ordering later work after the replays is the launch's contract
        // (`CapturedGraph::launch`).
        // SAFETY: `raw_use` was resolved through `self.stream_pool`, which
        // keeps its streams alive.
        if unsafe { self.gpu.capture_status(raw_use) }?.is_capturing() {
            return Ok(());
        }
        let (event, fresh) = match record.uses.slot(use_stream, access) {
            Some(e) => (e, false),
            None => (self.events.take().map_err(ResourceError::from)?, true),
        };
        // SAFETY: as in `queue_waits`: a pooled event, a pool stream.
        if let Err(e) = unsafe { self.gpu.event_record(event, raw_use) } {
            if fresh {
                self.events.give([event]);
            }
            return Err(ResourceError::from(e));
        }
        if let Some(old) = record.uses.store(use_stream, access, event) {
            self.events.give([old]);
        }
        Ok(())
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
        ResourceError::check_device(self.device_ordinal, block.device())?;
        let id = block.id();
        let (slot, seq) = self.locate(id)?;
        // Mark the record as being freed and take its uses (one lock); the
        // waits and the free are queued without the lock. The record stays
        // where it is: on failure the uses go back and the mark comes off,
        // and meanwhile a hook or a second free gets `FreeInFlight`, and
        // neither touches it.
        let (size, stream, raw, uses, kept) = {
            let mut guard = slot.lock();
            let shard = &mut *guard;
            let Some(record) = shard.blocks.get_mut(seq) else {
                return Err(Self::missing(shard, seq, id));
            };
            if record.ptr != block.ptr()
                || record.size != block.size()
                || !record.stream.is(block.stream())
            {
                return Err(ResourceError::UnknownBlock { block: id });
            }
            // That free may still fail and leave the block live: not a
            // double free (yet).
            if record.freeing {
                return Err(ResourceError::FreeInFlight { block: id });
            }
            record.freeing = true;
            let uses = std::mem::take(&mut record.uses);
            let kept = record.capture;
            (record.size, record.stream, record.raw_stream, uses, kept)
        };
        let restore = |uses: BlockUses| {
            if let Some(record) = slot.lock().blocks.get_mut(seq) {
                record.uses = uses;
                record.freeing = false;
            }
        };
        // A free queued on a capturing stream is a node of the capture's
        // graph: it runs at every replay, and the memory stays the graph's
        // until the graph is released.
        // SAFETY: `raw` is the record's pool stream (kept alive by
        // `self.stream_pool`).
        let capture = match unsafe { self.gpu.capture_status(raw) } {
            Ok(status) => status.id(),
            Err(e) => {
                restore(uses);
                return Err(ResourceError::from(e));
            }
        };
        // A block a capture allocated (a graph memory node) and did not free
        // in it: inside another capture its free would be a node of that
        // graph too, of memory the first graph re-allocates at every replay
        // (refused, the block stays live); outside any, the pool's ledger
        // says who frees what the replays made.
        let kept_free = match (kept, capture) {
            (Some(k), Some(c)) if k != c => {
                restore(uses);
                return Err(ResourceError::StreamCapturing {
                    stream,
                    capture: Some(c),
                });
            }
            (Some(k), None) => Some((k, self.stream_pool.kept_graph_memory().lock())),
            _ => None,
        };
        let how = kept_free
            .as_ref()
            .map(|(k, ledger)| ledger.user_free(*k, block.ptr()));
        // A block from outside the capture freed on a capturing stream (by
        // any thread: the capture takes whatever is queued on its stream):
        // a free node of the graph would free it at every replay, the
        // second time someone else's memory. The graph adopts it instead:
        // nothing is queued now, its replays may use it up to this free,
        // and its release frees it once, behind the last replay.
        let adopt = match (kept, capture) {
            (None, Some(c)) => Some(c),
            _ => None,
        };
        let mut others = uses
            .reads
            .iter()
            .chain(&uses.last_write)
            .filter(|(s, _)| *s != stream)
            .map(|&(_, e)| e)
            .peekable();
        if let (Some(c), Some(_), None) = (capture, others.peek(), adopt) {
            // Waiting for the uses on other streams would wait, from the
            // capture, on events recorded outside it: the driver refuses
            // (STREAM_CAPTURE_ISOLATION) and invalidates the capture.
            // Refused instead; the block stays live, to be freed after.
            drop(others);
            restore(uses);
            return Err(ResourceError::StreamCapturing {
                stream,
                capture: Some(c),
            });
        }
        for event in others.filter(|_| adopt.is_none()) {
            // SAFETY: `raw` is the record's pool stream (kept alive by
            // `self.stream_pool`); the event is one of the block's uses, from
            // this resource's pool, live until given back below.
            if let Err(e) = unsafe { self.gpu.stream_wait_event(raw, event) } {
                restore(uses);
                return Err(ResourceError::from(e));
            }
        }
        // A kept block whose graph lives frees nothing on the device (the
        // graph frees each replay's instance, after this stream, which now
        // waits for the block's uses); one whose graph is gone frees the
        // instance a replay left, if any.
        let device_free = adopt.is_none() && matches!(how, None | Some(KeptFree::Ordinary));
        // An ordinary free of a kept block (its graph gone) frees the
        // instance the last replay made, on whatever stream it ran: after
        // that stream's work so far.
        if let (Some((k, ledger)), Some(KeptFree::Ordinary)) = (&kept_free, how)
            && let Some(last) = ledger.last_launch(*k).filter(|&l| l != stream)
            && let Err(e) = self.follow(last, raw)
        {
            restore(uses);
            return Err(e);
        }
        // SAFETY: `raw` is the record's pool stream; `block.ptr()` equals the
        // record's address (checked above), which `alloc_async` of this gpu
        // returned, and is live (not a kept block, or the live instance of
        // one); the record is marked as being freed under its shard lock, so
        // no other call frees it, and it leaves the live set below.
        if device_free && let Err(e) = unsafe { self.gpu.free_async(block.ptr(), raw) } {
            restore(uses);
            return Err(e.for_request(size, stream));
        }
        // Live to pending within the shard, under its lock; `outstanding`
        // does not change, so no reader can miss the block meanwhile.
        let (_, local) = self.place(stream);
        let to_graph = match (how, capture) {
            (Some(KeptFree::ToGraph), _) => kept,
            (_, captured) => captured,
        };
        let retired = match to_graph {
            Some(capture) => slot.lock().retire_to_graph(seq, capture),
            None => slot.lock().retire(seq, local),
        };
        debug_assert!(retired, "a record marked as being freed vanished");
        match (kept_free, how) {
            (Some((k, mut ledger)), Some(how)) => ledger.settle(k, block.ptr(), how, stream),
            _ => {
                if let (Some(k), Some(_)) = (kept, capture) {
                    self.stream_pool
                        .kept_graph_memory()
                        .lock()
                        .freed_in_capture(k, block.ptr());
                }
            }
        }
        let mut uses = uses;
        if let Some(c) = adopt {
            // The uses on other streams are the release's to wait for.
            let (elsewhere, here): (Vec<_>, Vec<_>) =
                uses.take_all().into_iter().partition(|(s, _)| *s != stream);
            self.events.give(here.into_iter().map(|(_, e)| e));
            let adopted = Adopted {
                ptr: block.ptr(),
                stream,
                events: elsewhere.into_iter().map(|(_, e)| e).collect(),
            };
            self.stream_pool
                .kept_graph_memory()
                .lock()
                .adopt(c, adopted);
        }
        if uses.event_count() > 0 {
            self.events
                .give(uses.take_all().into_iter().map(|(_, e)| e));
        }
        tracing::trace!(bytes = size, %stream, ptr = block.ptr(), "deallocate");
        Ok(())
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
        if crate::util::poll_scope::in_poll() {
            return Ok(());
        }
        let mut marks = Vec::new();
        for (index, slot) in self.shards.iter().enumerate() {
            let mut shard = slot.lock();
            for local in 0..shard.streams().len() {
                if let Some(seq) = shard.stream(local).high_water() {
                    marks.push((index, local, seq));
                }
            }
        }
        for (index, local, seq) in marks {
            let stream = self
                .stream_pool
                .id((local << self.shard_bits) | index)
                .ok_or(ResourceError::UnknownStream {
                    stream: StreamId::new(
                        self.device_ordinal,
                        ((local << self.shard_bits) | index) as u32,
                    ),
                    pool_len: self.stream_pool.len(),
                })?;
            let raw = self.raw_stream(stream)?;
            // SAFETY: `raw` was resolved through `self.stream_pool`, which
            // keeps its streams alive.
            if unsafe { self.gpu.capture_status(raw) }
                .map_err(ResourceError::from)?
                .is_capturing()
            {
                continue;
            }
            // SAFETY: as above.
            unsafe { self.gpu.stream_synchronize(raw) }.map_err(ResourceError::from)?;
            self.drain(index, local, seq);
        }
        Ok(())
    }

    fn capture_status(&self, stream: StreamId) -> ResourceResult<CaptureStatus> {
        let raw = self.raw_stream(stream)?;
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        unsafe { self.gpu.capture_status(raw) }.map_err(ResourceError::from)
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

    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        let raw = self.raw_stream(after)?;
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        let status = unsafe { self.gpu.capture_status(raw) }?;
        if status.is_capturing() {
            return Err(ResourceError::StreamCapturing {
                stream: after,
                capture: status.id(),
            });
        }
        // Blocks the graph adopted (freed in the capture, allocated outside
        // it) are freed on `after`, after their own stream's work: refused,
        // changing nothing, while one of those streams captures (an event
        // recorded there would be captured).
        let adopted = self
            .stream_pool
            .kept_graph_memory()
            .lock()
            .take_adopted(capture);
        for a in &adopted {
            let refused = self.raw_stream(a.stream).and_then(|raw| {
                // SAFETY: `raw` was resolved through `self.stream_pool`.
                let status = unsafe { self.gpu.capture_status(raw) }?;
                match status.is_capturing() && a.stream != after {
                    true => Err(ResourceError::StreamCapturing {
                        stream: a.stream,
                        capture: status.id(),
                    }),
                    false => Ok(()),
                }
            });
            if let Err(e) = refused {
                self.stream_pool
                    .kept_graph_memory()
                    .lock()
                    .readopt(capture, adopted);
                return Err(e);
            }
        }
        // The instances the last replay left of blocks users gave to the
        // graph: freed on `after`, behind the last replay, before the bytes
        // move (they are in the graph's tally). Blocks users still hold are
        // theirs to free from now on.
        {
            let ledger = self.stream_pool.kept_graph_memory();
            let mut kept = ledger.lock();
            let frees = kept.release(capture);
            if !frees.ptrs.is_empty() {
                // SAFETY: the pool is this resource's (alive), of `self.gpu`;
                // the addresses are live instances of this gpu's graph
                // allocations which no user holds, and `after` is ordered
                // after the last replay that made them (this fn's contract).
                let (done, queued) = unsafe {
                    crate::device::graph_memory::free_instances(
                        &*self.gpu,
                        |s| self.stream_pool.raw(s),
                        after,
                        &frees,
                    )
                };
                kept.forget(capture, &frees.ptrs[..done]);
                if let Err(e) = queued {
                    kept.readopt(capture, adopted);
                    return Err(e);
                }
            }
        }
        let mut adopted = adopted.into_iter();
        while let Some(a) = adopted.next() {
            if let Err(e) = self.free_adopted(&a, after, raw) {
                let mut rest = vec![a];
                rest.extend(adopted);
                self.stream_pool
                    .kept_graph_memory()
                    .lock()
                    .readopt(capture, rest);
                return Err(e);
            }
            self.events.give(a.events);
        }
        let held: Vec<(usize, usize)> = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let bytes = s.lock().graph_bytes(capture);
                (bytes > 0).then_some((i, bytes))
            })
            .collect();
        let total: usize = held.iter().map(|&(_, b)| b).sum();
        if total == 0 {
            return Ok(());
        }
        // Counted on `after` before they leave the graphs' tallies, so a
        // concurrent reader may count them twice for a moment, never miss
        // them (a budget above releases late, never early).
        let (index, local) = self.place(after);
        {
            let slot = &self.shards[index];
            let mut shard = slot.lock();
            shard.queue_released(local, total);
            slot.add_outstanding(&shard, total);
        }
        for (i, bytes) in held {
            let slot = &self.shards[i];
            let mut shard = slot.lock();
            shard.take_graph(capture, bytes);
            slot.sub_outstanding(&shard, bytes);
        }
        tracing::trace!(bytes = total, %capture, %after, "release_capture");
        Ok(())
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

/// Loom models of the bookkeeping core: the deallocate retiring/restore path
/// against concurrent hooks and reaps, the counters a concurrent reader
/// sees, and the pending tallies under concurrent frees and a notified reap
/// (`--cfg loom`, see `scripts/model-check.sh`).
#[cfg(all(test, loom))]
pub(crate) mod loom_tests {
    use std::sync::Arc;

    use loom::thread;

    use super::*;
    use crate::error::DriverCall;

    const SIZE: usize = 4096;

    fn fixture() -> (Arc<SimGpu>, Arc<SimResource>, DeviceBlock) {
        let gpu = SimGpu::builder().manual().build();
        let device = Device::simulated(&gpu, 2);
        let r = Arc::new(SimResource::new(&device));
        let block = r
            .allocate(SIZE, device.stream(0).unwrap(), AllocTag::UNTAGGED)
            .unwrap();
        (gpu, r, block)
    }

    /// Frees `block` through `r` from this thread and another at once:
    /// exactly one free wins, and the loser sees the winner's free either in
    /// flight (`FreeInFlight`) or done (`DoubleFree`).
    pub(crate) fn race_two_frees<R: DeviceMemoryResource + 'static>(
        r: &Arc<R>,
        block: &DeviceBlock,
    ) {
        let other = {
            let (r, block) = (r.clone(), block.clone());
            thread::spawn(move || r.deallocate(block))
        };
        let mine = r.deallocate(block.clone());
        let theirs = other.join().unwrap();
        let lost = |e: &ResourceError| {
            *e == ResourceError::DoubleFree { block: block.id() }
                || *e == ResourceError::FreeInFlight { block: block.id() }
        };
        assert!(
            matches!((&mine, &theirs), (Ok(()), Err(e)) | (Err(e), Ok(())) if lost(e)),
            "{mine:?} / {theirs:?}"
        );
    }

    /// Events created = events pooled + events attached to live blocks.
    fn no_event_lost(gpu: &SimGpu, r: &SimResource, live: &[&DeviceBlock]) {
        let attached: usize = live
            .iter()
            .map(|b| r.pending_use_event_count(b.ptr()).unwrap())
            .sum();
        assert_eq!(
            gpu.call_count(DriverCall::EventCreate) as usize,
            r.pooled_events() + attached
        );
    }

    /// A reader of `bytes_outstanding` while a block moves from live to
    /// pending must count it (a budget built on it must not over-admit).
    #[test]
    fn bytes_outstanding_never_undercounts_a_free() {
        loom::model(|| {
            let (_gpu, r, block) = fixture();
            let freer = {
                let r = r.clone();
                thread::spawn(move || r.deallocate(block).unwrap())
            };
            let seen = r.bytes_outstanding();
            assert!(seen >= SIZE, "a concurrent reader saw {seen} B outstanding");
            freer.join().unwrap();
            assert_eq!(r.bytes_outstanding(), SIZE);
        });
    }

    /// A free that fails while a hook runs on the same block: the block is
    /// live again with every event the hook attached, and no event is lost.
    #[test]
    fn failed_free_restores_the_uses_a_concurrent_hook_attached() {
        loom::model(|| {
            let (gpu, r, block) = fixture();
            let b = r.stream_pool().id(1).unwrap();
            gpu.fail_nth(DriverCall::FreeAsync, 1);
            let hook = {
                let (r, id) = (r.clone(), block.id());
                thread::spawn(move || {
                    // The free fails, so the block is never retired: a hook
                    // that raced it hears `FreeInFlight`, never `DoubleFree`.
                    let out = r.finish_block_use(id, b, Access::Read);
                    assert!(
                        matches!(out, Ok(()) | Err(ResourceError::FreeInFlight { .. })),
                        "{out:?}"
                    );
                    out.is_ok()
                })
            };
            let freed = r.deallocate(block.clone());
            assert!(matches!(freed, Err(ResourceError::Driver { .. })));
            let hooked = hook.join().unwrap();
            assert_eq!(r.block_state(block.id()), Some(BlockState::Live));
            assert_eq!(
                r.pending_use_event_count(block.ptr()),
                Some(usize::from(hooked))
            );
            assert_eq!(r.live_bytes(), SIZE);
            assert_eq!(r.pending_free_bytes(), 0);
            no_event_lost(&gpu, &r, &[&block]);
            r.deallocate(block).unwrap();
            no_event_lost(&gpu, &r, &[]);
        });
    }

    /// Two threads free clones of one block: exactly one free wins, the
    /// other is a `DoubleFree` or `FreeInFlight`, and the bytes are pending
    /// once.
    #[test]
    fn racing_double_free_frees_once() {
        loom::model(|| {
            let (gpu, r, block) = fixture();
            race_two_frees(&r, &block);
            assert_eq!(r.pending_free_bytes(), SIZE);
            assert_eq!(r.pending_per_stream_total(), SIZE);
            assert_eq!(r.live_bytes(), 0);
            assert_eq!(gpu.call_count(DriverCall::FreeAsync), 1);
        });
    }

    /// A second free racing a free that fails: never told `DoubleFree`
    /// while the block ends up live (its handle would be lost).
    #[test]
    fn a_free_racing_a_failing_free_is_not_a_double_free() {
        loom::model(|| {
            let (gpu, r, block) = fixture();
            gpu.fail_nth(DriverCall::FreeAsync, 1);
            let other = {
                let (r, block) = (r.clone(), block.clone());
                thread::spawn(move || r.deallocate(block))
            };
            let mine = r.deallocate(block.clone());
            let theirs = other.join().unwrap();
            let live = r.block_state(block.id()) == Some(BlockState::Live);
            for out in [&mine, &theirs] {
                assert!(
                    !(live && matches!(out, Err(ResourceError::DoubleFree { .. }))),
                    "{mine:?} / {theirs:?}, block live"
                );
            }
        });
    }

    /// A successful free racing a cross-stream use (prepare + finish) and a
    /// reap: the counters agree at the end, and nothing is lost.
    #[test]
    fn free_races_hooks_and_reap() {
        loom::model(|| {
            let (gpu, r, block) = fixture();
            let b = r.stream_pool().id(1).unwrap();
            let hook = {
                let (r, id) = (r.clone(), block.id());
                thread::spawn(move || {
                    let out = r
                        .prepare_block_use(id, b, Access::Write)
                        .and_then(|()| r.finish_block_use(id, b, Access::Write));
                    assert!(
                        matches!(
                            out,
                            Ok(())
                                | Err(ResourceError::DoubleFree { .. })
                                | Err(ResourceError::FreeInFlight { .. })
                        ),
                        "{out:?}"
                    );
                })
            };
            let freer = {
                let r = r.clone();
                thread::spawn(move || r.deallocate(block).unwrap())
            };
            r.reap_pending().unwrap();
            hook.join().unwrap();
            freer.join().unwrap();
            assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
            assert_eq!(
                r.bytes_outstanding(),
                r.live_bytes() + r.pending_free_bytes()
            );
            assert_eq!(r.live_blocks(), 0);
            r.reap_pending().unwrap();
            assert_eq!(r.bytes_outstanding(), 0);
            no_event_lost(&gpu, &r, &[]);
        });
    }

    /// Frees on two streams racing a notification-style reap of one (read
    /// `pending_free_seq`, then `reap_through` it): the shard tallies and the
    /// per-stream tallies agree at the end, the reap drains exactly the
    /// frees at or below its cut, and `bytes_outstanding` matches.
    #[test]
    fn frees_and_a_notified_reap_keep_the_tallies_together() {
        loom::model(|| {
            let gpu = SimGpu::builder().manual().build();
            let r = Arc::new(SimResource::new(&Device::simulated(&gpu, 2)));
            let (a, b) = (
                r.stream_pool().id(0).unwrap(),
                r.stream_pool().id(1).unwrap(),
            );
            let x = r.allocate(10, a, AllocTag::UNTAGGED).unwrap();
            let y = r.allocate(20, b, AllocTag::UNTAGGED).unwrap();
            let z = r.allocate(5, a, AllocTag::UNTAGGED).unwrap();
            let freer = {
                let r = r.clone();
                thread::spawn(move || {
                    r.deallocate(x).unwrap();
                    r.deallocate(y).unwrap();
                })
            };
            let reaper = {
                let r = r.clone();
                thread::spawn(move || {
                    let seq = r.pending_free_seq(a);
                    (seq, r.reap_through(a, seq))
                })
            };
            r.deallocate(z).unwrap();
            freer.join().unwrap();
            let (seq, drained) = reaper.join().unwrap();
            assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
            assert_eq!(r.pending_free_bytes() + drained, 35);
            assert_eq!(r.bytes_outstanding(), 35 - drained);
            assert_eq!(r.live_bytes(), 0);
            assert!(seq <= 2);
            assert!(matches!(drained, 0 | 5 | 10 | 15), "drained {drained}");
            assert_eq!(drained == 0, seq == 0);
            assert_eq!(r.pending_stream_bytes(b), 20);
        });
    }
}
