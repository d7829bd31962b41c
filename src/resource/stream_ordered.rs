//! `StreamOrderedResource<G>`: stream-ordered bookkeeping, written once for
//! every backend.
//!
//! # State
//!
//! - **Live blocks**, in shards keyed by the block's serial number. Each
//!   record holds the block's address, size, allocation stream and its
//!   [uses](super::block_uses): one read event per stream plus the last
//!   write. Threads working on different blocks rarely share a shard.
//! - **Pending frees** ([`PendingFrees`]): bytes whose free is queued on the
//!   GPU but not known to have run, per stream, with sequence numbers.
//! - Two counters: `live` and the pending total. A block moves from live to
//!   pending when its free is queued, and leaves pending when a reap learns
//!   that its stream passed the free.
//!
//! # Who changes it
//!
//! `allocate` adds a record; the block-use hooks add and re-record events in
//! it (under the shard lock, so that a wait never sees an event being
//! re-recorded for another use); `deallocate` makes the allocation stream
//! wait on every recorded event, queues the free, and moves the bytes;
//! `reap_pending` drains. Locks are never held across a driver call that
//! blocks (only `event_record` and `stream_wait_event`, which just queue, run
//! under a shard lock).
//!
//! # Failure
//!
//! Every method checks its input before it changes anything, and undoes its
//! partial work when a driver call fails, so that a failed call leaves every
//! counter and map as it was.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::DeviceMemoryResource;
use super::block_uses::BlockUses;
use super::event_pool::EventPool;
use super::pending::PendingFrees;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::cuda::CudaGpu;
use crate::gpu::sim::SimGpu;
use crate::gpu::{Gpu, GpuError, RawStream};
use crate::padded::CachePadded;
use crate::sync::{AtomicU64, AtomicUsize, Mutex, MutexGuard};
use crate::types::{
    Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId, StreamId, StreamPool,
};

const SHARDS: usize = 32;

#[derive(Debug)]
struct BlockRecord {
    ptr: u64,
    size: usize,
    stream: StreamId,
    raw_stream: RawStream,
    uses: BlockUses,
}

type Shard = crate::fast_hash::FastMap<u64, BlockRecord>;

/// The stream-ordered resource over a backend `G`.
///
/// # State
///
/// Live blocks in shards keyed by serial number, each with its uses (one
/// read event per stream plus the last write); frees queued but not known
/// to have run, per stream, with sequence numbers; and two counters, live
/// and pending. A block moves from live to pending when its free is queued,
/// and leaves pending when a reap learns its stream passed the free.
/// [`AsyncCudaResource`] and [`SimResource`] are its two instances.
///
/// # Examples
/// ```
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::new();
/// let pool = gpu.stream_pool(1);
/// let resource = SimResource::new(gpu, pool.clone());
/// let stream = pool.id(0).unwrap();
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
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    next_serial: AtomicU64,
    live: AtomicUsize,
    pending: PendingFrees,
    events: EventPool<G>,
}

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

impl AsyncCudaResource {
    /// A resource bound to `device`, resolving streams through `stream_pool`.
    /// `device_ordinal` names the device in errors and logs; streams of the
    /// pool must belong to it.
    ///
    /// If the device's memory pool cannot be set up, the resource is still
    /// built and every allocation reports the driver error.
    pub fn new(
        device: Arc<cudarc::driver::CudaContext>,
        device_ordinal: u32,
        stream_pool: Arc<StreamPool>,
    ) -> Self {
        Self::with_gpu(Arc::new(CudaGpu::new(device)), device_ordinal, stream_pool)
    }

    /// The cudarc context of the device.
    pub fn device(&self) -> &Arc<cudarc::driver::CudaContext> {
        self.gpu.context()
    }
}

impl SimResource {
    /// A resource on the simulated device `gpu`, resolving streams through
    /// `stream_pool`.
    pub fn new(gpu: Arc<SimGpu>, stream_pool: Arc<StreamPool>) -> Self {
        let ordinal = gpu.ordinal();
        Self::with_gpu(gpu, ordinal, stream_pool)
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|p| p.into_inner())
}

impl<G: Gpu> StreamOrderedResource<G> {
    /// A resource over any backend.
    pub fn with_gpu(gpu: Arc<G>, device_ordinal: u32, stream_pool: Arc<StreamPool>) -> Self {
        StreamOrderedResource {
            id: ResourceId::fresh(),
            events: EventPool::new(gpu.clone()),
            gpu,
            device_ordinal,
            stream_pool,
            shards: (0..SHARDS)
                .map(|_| CachePadded(Mutex::new(Shard::default())))
                .collect(),
            next_serial: AtomicU64::new(1),
            live: AtomicUsize::new(0),
            pending: PendingFrees::default(),
        }
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

    /// Bytes held by live blocks (not counting pending frees). A diagnostic:
    /// production code should use
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding).
    pub fn live_bytes(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Bytes whose free is queued but not yet known to have executed.
    pub fn pending_free_bytes(&self) -> usize {
        self.pending.total()
    }

    /// Sum of the per-stream pending tallies; equals
    /// [`pending_free_bytes`](Self::pending_free_bytes) whenever no call is in
    /// flight (both change together under one lock).
    pub fn pending_per_stream_total(&self) -> usize {
        self.pending.per_stream_total()
    }

    /// The pending frees, per stream, for layers that drain them from
    /// completion notifications.
    pub fn pending_frees(&self) -> &PendingFrees {
        &self.pending
    }

    /// Outstanding read events plus the last-write event (0 or 1) of the live
    /// block at `ptr`; `None` when no live block starts there.
    pub fn pending_use_event_count(&self, ptr: u64) -> Option<usize> {
        if ptr == 0 {
            return None;
        }
        self.shards.iter().find_map(|shard| {
            lock(shard)
                .values()
                .find(|r| r.ptr == ptr)
                .map(|r| r.uses.event_count())
        })
    }

    /// Number of live blocks.
    pub fn live_blocks(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
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

    fn shard(&self, serial: u64) -> &Mutex<Shard> {
        &self.shards[(serial as usize) % SHARDS]
    }

    /// Why a block id has no usable record.
    fn missing(&self, block: BlockId) -> ResourceError {
        if block.resource() != self.id {
            ResourceError::ForeignBlock { block }
        } else if block.serial() >= 1 && block.serial() < self.next_serial.load(Ordering::Acquire) {
            ResourceError::DoubleFree { block }
        } else {
            ResourceError::UnknownBlock { block }
        }
    }

    /// Runs `f` on the live record of `block` under its shard lock.
    fn with_live<T>(
        &self,
        block: BlockId,
        f: impl FnOnce(&mut BlockRecord) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        if block.resource() != self.id {
            return Err(ResourceError::ForeignBlock { block });
        }
        let mut shard = lock(self.shard(block.serial()));
        match shard.get_mut(&block.serial()) {
            Some(record) => f(record),
            _ => Err(self.missing(block)),
        }
    }

    fn driver(&self, e: GpuError) -> ResourceError {
        e.for_request(0, StreamId::new(self.device_ordinal, 0))
    }

    /// Queues the waits `use_stream` needs before `access` to `record`.
    fn queue_waits(
        &self,
        record: &mut BlockRecord,
        use_stream: StreamId,
        raw_use: RawStream,
        access: Access,
    ) -> ResourceResult<()> {
        let mut allocation_point = None;
        if record.uses.last_write.is_none() && use_stream != record.stream {
            // First use on another stream: order it after the allocation by
            // recording where the allocation stream is now.
            let event = self.events.take().map_err(|e| self.driver(e))?;
            if let Err(e) = self.gpu.event_record(event, record.raw_stream) {
                self.events.give([event]);
                return Err(self.driver(e));
            }
            record.uses.last_write = Some((record.stream, event));
            allocation_point = Some(event);
        }
        let failed = record
            .uses
            .waits_for(use_stream, access)
            .find_map(|event| self.gpu.stream_wait_event(raw_use, event).err());
        match failed {
            None => Ok(()),
            Some(e) => {
                // A failed call changes nothing: the allocation point goes
                // back to the pool (the waits already queued only order more).
                if let Some(event) = allocation_point {
                    record.uses.last_write = None;
                    self.events.give([event]);
                }
                Err(self.driver(e))
            }
        }
    }

    /// Records the end of a use of `access` on `use_stream`.
    fn record_use(
        &self,
        record: &mut BlockRecord,
        use_stream: StreamId,
        raw_use: RawStream,
        access: Access,
    ) -> ResourceResult<()> {
        let (event, fresh) = match record.uses.slot(use_stream, access) {
            Some(e) => (e, false),
            None => (self.events.take().map_err(|e| self.driver(e))?, true),
        };
        if let Err(e) = self.gpu.event_record(event, raw_use) {
            if fresh {
                self.events.give([event]);
            }
            return Err(self.driver(e));
        }
        if let Some(old) = record.uses.store(use_stream, access, event) {
            self.events.give([old]);
        }
        Ok(())
    }
}

impl<G: Gpu> DeviceMemoryResource for StreamOrderedResource<G> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let raw = self.raw_stream(stream)?;
        let ptr = self
            .gpu
            .alloc_async(bytes, raw)
            .map_err(|e| e.for_request(bytes, stream))?;
        let serial = self.next_serial.fetch_add(1, Ordering::AcqRel);
        lock(self.shard(serial)).insert(
            serial,
            BlockRecord {
                ptr,
                size: bytes,
                stream,
                raw_stream: raw,
                uses: BlockUses::default(),
            },
        );
        self.live.fetch_add(bytes, Ordering::AcqRel);
        tracing::trace!(bytes, %stream, ptr, %tag, "allocate");
        Ok(DeviceBlock::new(
            BlockId::new(self.id, serial),
            ptr,
            bytes,
            stream,
            tag,
        ))
    }

    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        ResourceError::check_device(self.device_ordinal, block.device())?;
        let id = block.id();
        let serial = id.serial();
        if id.resource() != self.id {
            return Err(ResourceError::ForeignBlock { block: id });
        }
        // Take the record out (one lock on the hot path); the waits and the
        // free are queued without the lock, and on failure the record goes
        // back as it was. While it is out, hooks and a second free see the
        // block as freed.
        let record = {
            let mut shard = lock(self.shard(serial));
            let Some(record) = shard.remove(&serial) else {
                return Err(self.missing(id));
            };
            if record.ptr != block.ptr() || record.size != block.size() {
                shard.insert(serial, record);
                return Err(ResourceError::UnknownBlock { block: id });
            }
            record
        };
        let (ptr, size, stream, raw) = (record.ptr, record.size, record.stream, record.raw_stream);
        let restore = |record: BlockRecord| {
            lock(self.shard(serial)).insert(serial, record);
        };
        let others = record
            .uses
            .reads
            .iter()
            .chain(&record.uses.last_write)
            .filter(|(s, _)| *s != stream)
            .map(|&(_, e)| e);
        for event in others {
            if let Err(e) = self.gpu.stream_wait_event(raw, event) {
                restore(record);
                return Err(self.driver(e));
            }
        }
        if let Err(e) = self.gpu.free_async(ptr, raw) {
            restore(record);
            return Err(e.for_request(size, stream));
        }
        // Pending first, live second: a concurrent reader of
        // `bytes_outstanding` may over-count for an instant, never under.
        self.pending.push(stream, size);
        self.live.fetch_sub(size, Ordering::AcqRel);
        let mut uses = record.uses;
        if uses.event_count() > 0 {
            self.events
                .give(uses.take_all().into_iter().map(|(_, e)| e));
        }
        tracing::trace!(bytes = size, %stream, ptr, "deallocate");
        Ok(())
    }

    fn device_ordinal(&self) -> u32 {
        self.device_ordinal
    }

    fn bytes_outstanding(&self) -> usize {
        // Live is read first. `deallocate` adds to pending, then subtracts
        // from live (release): a load of live that misses the block (after
        // the subtraction) synchronizes with it, so the load of pending that
        // follows sees the addition. A block moving between the two loads is
        // counted twice rather than not at all. (Reading pending first, as
        // this did before, could miss it in both.)
        let live = self.live.load(Ordering::Acquire);
        live + self.pending.total()
    }

    fn reap_pending(&self) -> ResourceResult<()> {
        for (stream, seq) in self.pending.high_water() {
            let raw = self.raw_stream(stream)?;
            self.gpu
                .stream_synchronize(raw)
                .map_err(|e| self.driver(e))?;
            self.pending.drain_through(stream, seq);
        }
        Ok(())
    }

    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.pending.last_seq(stream)
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.pending.drain_through(stream, seq)
    }

    fn supports_block_use_tracking(&self) -> bool {
        true
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        let raw_use = self.raw_stream(use_stream)?;
        self.with_live(block.id(), |r| {
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
        self.with_live(block, |r| self.queue_waits(r, use_stream, raw_use, access))
    }

    fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let raw_use = self.raw_stream(use_stream)?;
        self.with_live(block, |r| self.record_use(r, use_stream, raw_use, access))
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        if block.resource() != self.id {
            return None;
        }
        let shard = lock(self.shard(block.serial()));
        match shard.get(&block.serial()) {
            Some(_) => Some(BlockState::Live),
            None => matches!(self.missing(block), ResourceError::DoubleFree { .. })
                .then_some(BlockState::Retired),
        }
    }
}

impl<G: Gpu> Drop for StreamOrderedResource<G> {
    fn drop(&mut self) {
        let mut leaked = 0usize;
        for shard in self.shards.iter_mut() {
            let shard = shard.get_mut().unwrap_or_else(|p| p.into_inner());
            for (_, mut record) in shard.drain() {
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
/// against concurrent hooks and reaps, and the counters a concurrent reader
/// sees (`--cfg loom`, see `scripts/model-check.sh`).
#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc;

    use loom::thread;

    use super::*;
    use crate::error::DriverCall;

    const SIZE: usize = 4096;

    fn fixture() -> (Arc<SimGpu>, Arc<SimResource>, DeviceBlock) {
        let gpu = SimGpu::builder().manual().build();
        let pool = gpu.stream_pool(2);
        let r = Arc::new(SimResource::new(gpu.clone(), pool.clone()));
        let block = r
            .allocate(SIZE, pool.id(0).unwrap(), AllocTag::UNTAGGED)
            .unwrap();
        (gpu, r, block)
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
                    let out = r.finish_block_use(id, b, Access::Read);
                    assert!(
                        matches!(out, Ok(()) | Err(ResourceError::DoubleFree { .. })),
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
    /// other is a `DoubleFree`, and the bytes are pending once.
    #[test]
    fn racing_double_free_frees_once() {
        loom::model(|| {
            let (gpu, r, block) = fixture();
            let other = {
                let (r, block) = (r.clone(), block.clone());
                thread::spawn(move || r.deallocate(block))
            };
            let mine = r.deallocate(block.clone());
            let theirs = other.join().unwrap();
            let double = ResourceError::DoubleFree { block: block.id() };
            assert!(
                matches!((&mine, &theirs), (Ok(()), Err(e)) | (Err(e), Ok(())) if *e == double),
                "{mine:?} / {theirs:?}"
            );
            assert_eq!(r.pending_free_bytes(), SIZE);
            assert_eq!(r.pending_per_stream_total(), SIZE);
            assert_eq!(r.live_bytes(), 0);
            assert_eq!(gpu.call_count(DriverCall::FreeAsync), 1);
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
                        matches!(out, Ok(()) | Err(ResourceError::DoubleFree { .. })),
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
}
