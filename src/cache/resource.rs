//! [`CachingResource`]: the stream-ordered cache in front of a resource.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::config::CacheConfig;
use super::shard::{Backing, Lease, SHARD_MASK, Slot, SlotGuard};
use super::size_class::SizeClass;
use super::stats::CacheStats;
use super::vmm::VmTier;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, CaptureStatus};
use crate::resource::DeviceMemoryResource;
use crate::resource::event_pool::EventPool;
use crate::types::{
    Access, AllocTag, BlockId, BlockState, CompletedUses, DeviceBlock, ResourceId, StreamId,
};

/// A stream-ordered cache over any stream-ordered resource `R`.
///
/// Where the inner resource lends its device
/// ([`device_access`](DeviceMemoryResource::device_access)) and the device
/// has virtual memory management (CUDA, [`SimGpu`](crate::gpu::sim::SimGpu)),
/// every stream allocates from one reserved address range, with good
/// fit, splitting and merging, and physical memory is mapped only where a
/// live block needs it: the cache holds little more than what is live.
/// Elsewhere, freed blocks are kept in exact size classes per stream. See
/// the [module documentation](super) for both, and for how blocks move
/// between streams.
///
/// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding) is the
/// physical memory the arena holds plus the inner resource's outstanding
/// bytes: a budget above the cache sees the memory it holds.
/// [`cached_bytes`](Self::cached_bytes) says how much of it is idle, and
/// [`leased_bytes`](Self::leased_bytes) how much users hold.
///
/// # Examples
/// ```
/// use streamalloc::cache::CachingResource;
/// use streamalloc::error::DriverCall;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::builder().manual().build();
/// let device = Device::simulated(&gpu, 1);
/// let cache = CachingResource::new(SimResource::new(&device));
/// let stream = device.stream(0)?;
///
/// let block = cache.allocate(1000, stream, AllocTag::UNTAGGED)?;
/// let ptr = block.ptr();
/// assert_eq!(cache.bytes_outstanding(), 2 << 20); // one 2 MiB page mapped
/// cache.deallocate(block)?;
///
/// let creates = gpu.call_count(DriverCall::MemCreate);
/// let again = cache.allocate(900, stream, AllocTag::UNTAGGED)?;
/// assert_eq!(again.ptr(), ptr); // the same memory, without a driver call
/// assert_eq!(gpu.call_count(DriverCall::MemCreate), creates);
/// cache.deallocate(again)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
///
/// # Stream ordering
/// A block handed out on stream `S` is valid on `S` from the allocation on,
/// as for any resource. Memory freed on `S` is reused on `S` at once
/// (stream order puts the new user's work after the old one's). It reaches
/// another stream only behind an event: a size-class block through an
/// event recorded on `S` that the new stream waits on; an arena range
/// once a fence recorded on `S` after its last free has completed, or
/// before, behind the new stream's wait for that fence on the GPU.
pub struct CachingResource<R: DeviceMemoryResource> {
    pub(super) id: ResourceId,
    pub(super) inner: R,
    pub(super) config: CacheConfig,
    device: u32,
    /// One slot per cached stream, plus a last one holding the leases of
    /// streams past `config.streams` (which are never cached).
    pub(super) slots: Box<[Slot]>,
    /// The virtual-memory tier, when the inner resource lends its device
    /// and the device has virtual memory management.
    pub(super) vm: Option<VmTier>,
    /// Events recording uses of arena blocks on other streams.
    pub(super) events: Option<EventPool<dyn crate::gpu::Gpu>>,
    /// The part of the cap held by shards (each shard holds its part in
    /// `Shard::reserved`; this is their sum).
    reserved_total: AtomicUsize,
    /// How much more of the cap a shard takes than it needs, so that it does
    /// not come back for every block.
    grain: usize,
}

impl<R: DeviceMemoryResource> std::fmt::Debug for CachingResource<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingResource")
            .field("device", &self.device)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<R: DeviceMemoryResource> CachingResource<R> {
    /// A cache with the [default configuration](CacheConfig::default) over
    /// `inner`.
    pub fn new(inner: R) -> Self {
        Self::with_config(inner, CacheConfig::default())
    }

    /// A cache over `inner` configured by `config`. At most 2^16 - 1 stream
    /// slots are made; streams past them bypass the cache.
    pub fn with_config(inner: R, mut config: CacheConfig) -> Self {
        config.streams = config.streams.min(SHARD_MASK as usize - 1);
        let device = inner.device_ordinal();
        let classes = SizeClass::count_up_to(config.max_block_size);
        let slots = (0..=config.streams)
            .map(|i| Slot::new(StreamId::new(device, i as u32), i, classes))
            .collect();
        let vm = config
            .virtual_memory
            .then(|| inner.device_access())
            .flatten()
            .and_then(|access| {
                VmTier::new(
                    config.streams + 1,
                    access,
                    config.page_multiple,
                    config.max_mapping_bytes,
                    config.slack_percent,
                )
            });
        CachingResource {
            events: vm.as_ref().map(|v| EventPool::new(v.access.gpu.clone())),
            vm,
            id: ResourceId::fresh(),
            grain: (config.max_cached_bytes / 256).min(1 << 20),
            inner,
            config,
            device,
            slots,
            reserved_total: AtomicUsize::new(0),
        }
    }

    /// The resource the cache allocates from.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// This cache's identity (the blocks it hands out carry it).
    pub fn resource_id(&self) -> ResourceId {
        self.id
    }

    /// Bytes idle in the free lists (at class sizes). They are still
    /// allocated from the inner resource and counted in
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding).
    pub fn cached_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.lock().cached).sum::<usize>() + self.idle_mapped_bytes()
    }

    /// Number of blocks idle in the free lists.
    pub fn cached_blocks(&self) -> usize {
        self.slots.iter().map(|s| s.lock().cached_blocks()).sum()
    }

    /// Bytes held by users (requested sizes).
    pub fn leased_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.lock().leased).sum()
    }

    /// Number of blocks held by users.
    pub fn leased_blocks(&self) -> usize {
        self.slots.iter().map(|s| s.lock().lease_count()).sum()
    }

    /// What the cache did so far, summed over its shards.
    pub fn stats(&self) -> CacheStats {
        let mut total = CacheStats::default();
        for slot in self.slots.iter() {
            total.add(&slot.lock().stats);
        }
        total
    }

    /// The inner resource's block behind `block`, while it is leased.
    pub fn inner_block_id(&self, block: BlockId) -> Option<BlockId> {
        let (slot, serial) = self.locate(block).ok()?;
        match &slot.lock().lease_mut(serial)?.backing {
            Backing::Inner(inner) => Some(inner.id()),
            Backing::Mapped(_) => None,
        }
    }

    /// Gives every cached block back to the inner resource and returns the
    /// bytes given back.
    ///
    /// # Errors
    /// The first error of the inner resource; the blocks it refused stay
    /// cached, the others are given back.
    ///
    /// # Stream ordering
    /// A block cached on a stream other than the one the inner resource
    /// allocated it on is freed behind an event recorded on the cached
    /// stream, so the free waits for the block's last user.
    pub fn trim(&self) -> ResourceResult<usize> {
        let mut released = 0;
        let mut first_err = None;
        for (index, slot) in self.slots.iter().enumerate() {
            let (stream, blocks) = {
                let mut shard = slot.lock();
                if shard.cached == 0 && !slot.deferred.load(Ordering::Relaxed) {
                    continue;
                }
                // A free queued on a capturing stream would be captured (and
                // run at every replay): its blocks stay until it is done.
                let capturing = match self.inner.capture_status(shard.stream) {
                    Ok(status) => status.is_capturing(),
                    Err(e) => {
                        first_err.get_or_insert(e);
                        continue;
                    }
                };
                if capturing {
                    continue;
                }
                if let Err(e) = self.finish_deferred(index, &mut shard) {
                    first_err.get_or_insert(e);
                }
                let blocks = shard.take_all();
                self.reserved_total
                    .fetch_sub(shard.reserved, Ordering::AcqRel);
                shard.reserved = 0;
                shard.stats.trimmed += blocks.len() as u64;
                (shard.stream, blocks)
            };
            for (class, block) in blocks {
                let size = block.size();
                // A block moved here from another stream is freed on that
                // one: not while it is capturing either.
                let home_capturing = block.stream() != stream
                    && !matches!(
                        self.inner.capture_status(block.stream()),
                        Ok(CaptureStatus::None)
                    );
                let freed = match home_capturing {
                    true => Err(None),
                    false => self.release_to_inner(&block, stream).map_err(Some),
                };
                match freed {
                    Ok(()) => released += size,
                    Err(e) => {
                        // Keep it: the cap may be exceeded until the next
                        // trim, but no memory is lost.
                        let mut shard = slot.lock();
                        shard.stats.trimmed -= 1;
                        shard.push(class, block);
                        shard.reserved += size;
                        self.reserved_total.fetch_add(size, Ordering::AcqRel);
                        if let Some(e) = e {
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        released += self.reclaim_mapped(false);
        match first_err {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    /// The slot of a cached stream, or the overflow slot.
    fn slot_index(&self, stream: StreamId) -> usize {
        (stream.index() as usize).min(self.config.streams)
    }

    /// The slot and serial of one of this cache's blocks.
    pub(super) fn locate(&self, block: BlockId) -> ResourceResult<(&Slot, u64)> {
        if block.resource() != self.id {
            return Err(ResourceError::ForeignBlock { block });
        }
        let serial = block.serial();
        match self.slots.get((serial & SHARD_MASK) as usize) {
            Some(slot) => Ok((slot, serial)),
            None => Err(ResourceError::UnknownBlock { block }),
        }
    }

    /// Runs `f` on the lease of `block` under its shard lock (held across
    /// the inner hooks `f` calls, so that a concurrent free cannot hand the
    /// block to someone else in between).
    pub(super) fn with_lease<T>(
        &self,
        block: BlockId,
        f: impl FnOnce(&mut Lease) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let (slot, serial) = self.locate(block)?;
        let mut shard = slot.lock();
        if let Some(lease) = shard.lease_mut(serial) {
            return f(lease);
        }
        Err(shard.missing(block))
    }

    /// Frees a block cached on `cached_on` to the inner resource. The inner
    /// resource frees it on its own allocation stream, which must first wait
    /// for the block's last use on `cached_on`.
    pub(super) fn release_to_inner(
        &self,
        block: &DeviceBlock,
        cached_on: StreamId,
    ) -> ResourceResult<()> {
        if cached_on != block.stream() {
            self.inner
                .finish_block_use(block.id(), cached_on, Access::Write)?;
        }
        self.inner.deallocate(block.clone())
    }

    /// Makes sure the shard holds enough of the cap to cache `bytes` more.
    pub(super) fn reserve(&self, shard: &mut SlotGuard<'_>, bytes: usize) -> bool {
        let Some(need) = shard.cached.checked_add(bytes) else {
            return false;
        };
        if need <= shard.reserved {
            return true;
        }
        let want = need - shard.reserved;
        if let Some(taken) = self.take_cap(want) {
            shard.reserved += taken;
            return true;
        }
        // Under pressure: take back what other shards hold but do not use,
        // then try once more. try_lock only, so two shards doing this at
        // once cannot deadlock (and our own shard is locked already).
        for slot in self.slots.iter() {
            if let Some(mut other) = slot.try_lock() {
                let slack = other.reserved - other.cached.min(other.reserved);
                other.reserved -= slack;
                self.reserved_total.fetch_sub(slack, Ordering::AcqRel);
            }
        }
        match self.take_cap(want) {
            Some(taken) => {
                shard.reserved += taken;
                true
            }
            None => false,
        }
    }

    /// Takes `want` bytes of the cap, plus the grain when it fits (so that
    /// a shard does not come back for every block); returns what it took.
    fn take_cap(&self, want: usize) -> Option<usize> {
        let cap = self.config.max_cached_bytes;
        let with_grain = |cur: usize| {
            cur.checked_add(want)
                .and_then(|n| n.checked_add(self.grain))
                .filter(|&n| n <= cap)
        };
        let prev = self
            .reserved_total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                with_grain(cur).or_else(|| cur.checked_add(want).filter(|&n| n <= cap))
            })
            .ok()?;
        Some(if with_grain(prev).is_some() {
            want + self.grain
        } else {
            want
        })
    }

    /// Takes a block of `class` cached on another stream and orders `stream`
    /// after its last use there.
    fn steal(&self, class: SizeClass, own: usize, stream: StreamId) -> Option<DeviceBlock> {
        let n = self.config.streams;
        for offset in 1..n {
            let slot = &self.slots[(own + offset) % n];
            if slot.looks_empty() {
                continue;
            }
            let Some(mut other) = slot.try_lock() else {
                continue;
            };
            if !other.holds(class) {
                continue;
            }
            // An event recorded on a capturing stream is captured, and a
            // wait on it would pull this stream into the capture.
            if !matches!(
                self.inner.capture_status(other.stream),
                Ok(CaptureStatus::None)
            ) {
                continue;
            }
            let Some(block) = other.pop(class) else {
                continue;
            };
            let from = other.stream;
            drop(other);
            // Record where `from` is now, and make `stream` wait for it.
            let moved = self
                .inner
                .finish_block_use(block.id(), from, Access::Write)
                .and_then(|()| {
                    self.inner
                        .prepare_block_use(block.id(), stream, Access::Write)
                });
            match moved {
                Ok(()) => return Some(block),
                Err(e) => {
                    // Back on its list before the log line (a subscriber
                    // may panic).
                    slot.lock().push(class, block);
                    tracing::debug!(error = %e, %from, %stream, "moving a cached block failed");
                    return None;
                }
            }
        }
        None
    }

    /// Allocates from the inner resource; when memory is full (the device's
    /// out-of-memory, or a budget's refusal below the cache: the idle cached
    /// bytes count against both), gives the cached blocks back and tries
    /// again: once at once (the driver reuses memory
    /// freed on the same stream immediately), and once more after letting
    /// the inner resource reap its queued frees (which synchronizes the
    /// streams they were queued on, as PyTorch's allocator does before it
    /// gives up).
    pub(super) fn inner_allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let first = self.inner.allocate(bytes, stream, tag);
        if !first.as_ref().is_err_and(memory_full) || self.cached_bytes() == 0 {
            return first;
        }
        if self.vm.is_some() {
            let waits: &[bool] = if crate::poll_scope::in_poll() {
                &[false]
            } else {
                &[false, true]
            };
            for &wait in waits {
                if self.reclaim_mapped(wait) > 0 {
                    let again = self.inner.allocate(bytes, stream, tag);
                    if !matches!(again, Err(ResourceError::OutOfMemory { .. })) {
                        return again;
                    }
                }
            }
        }
        let released = self.trim();
        tracing::debug!(?released, bytes, %stream, "memory full: trimmed the cache");
        let second = self.inner.allocate(bytes, stream, tag);
        if !second.as_ref().is_err_and(memory_full) {
            return second;
        }
        match self.inner.reap_pending() {
            Ok(()) => self.inner.allocate(bytes, stream, tag),
            Err(_) => second,
        }
    }

    /// Hands `inner` to the user as a block of this cache on `stream`; when
    /// the shard has no serial left, `inner` goes back to the inner
    /// resource and the error is the shard's.
    pub(super) fn lease(
        &self,
        index: usize,
        inner: DeviceBlock,
        request: (usize, StreamId, AllocTag),
        class: Option<SizeClass>,
        count: impl FnOnce(&mut CacheStats),
    ) -> ResourceResult<DeviceBlock> {
        let (bytes, stream, tag) = request;
        let ptr = inner.ptr();
        let mut shard = self.slots[index].lock();
        let leased = shard.lease(Lease {
            backing: Backing::Inner(inner),
            stream,
            size: bytes,
            class,
            home_marked: false,
            cross_used: false,
            capture: None,
        });
        let serial = match leased {
            Ok(serial) => serial,
            Err(refused) => {
                // No serial left: the block, got before this lock was
                // taken, goes back, and the caller learns why (not how the
                // give-back went).
                let full = shard.full();
                drop(shard);
                if let Backing::Inner(inner) = &refused.backing
                    && let Err(e) = self.release_to_inner(inner, stream)
                {
                    tracing::warn!(error = %e, %stream, "giving back a block no serial was left for failed; leaked");
                }
                return Err(full);
            }
        };
        shard.seen |= class.is_some();
        if index < self.config.streams {
            // The inner resource just accepted `stream`: the shard's own.
            shard.learn(stream);
        }
        count(&mut shard.stats);
        Ok(DeviceBlock::new(
            BlockId::new(self.id, serial),
            ptr,
            bytes,
            stream,
            tag,
        ))
    }
}

/// Whether `e` says memory is full: the device's out-of-memory, or a
/// budget's refusal. Idle cached blocks count against both.
fn memory_full(e: &ResourceError) -> bool {
    matches!(
        e,
        ResourceError::OutOfMemory { .. } | ResourceError::BudgetExceeded { .. }
    )
}

impl<R: DeviceMemoryResource> CachingResource<R> {
    /// A free (see [`deallocate`](DeviceMemoryResource::deallocate));
    /// `completed`: the GPU is done with every use of the block
    /// ([`deallocate_completed`](DeviceMemoryResource::deallocate_completed)).
    fn free(&self, block: DeviceBlock, completed: bool) -> ResourceResult<()> {
        ResourceError::check_device(self.device, block.device())?;
        let id = block.id();
        let (slot, serial) = self.locate(id)?;
        let mut shard = slot.lock();
        let Some(found) = shard.lease_entry(serial) else {
            return Err(shard.missing(id));
        };
        let lease = found.get();
        if lease.backing.ptr() != block.ptr()
            || lease.size != block.size()
            || !lease.stream.is(block.stream())
        {
            return Err(ResourceError::UnknownBlock { block: id });
        }
        let (stream, class, leased_in) = (lease.stream, lease.class, lease.capture);
        // An arena lease used on its own stream only: its free
        // makes no driver call before the lease ends.
        let mapped = match &lease.backing {
            Backing::Mapped(m) => Some(m.event_count() == 0),
            Backing::Inner(_) => None,
        };
        if let (None, Backing::Inner(inner)) = (class, &lease.backing) {
            // Allocated from the inner resource on this very stream: it
            // waits for the recorded uses itself (and keeps a block freed in
            // a capture for the graph).
            self.inner.deallocate(inner.clone())?;
            found.end();
            return Ok(());
        }
        // The graph that owns the memory: the one of the capture that
        // handed it out while it lives, else the one capturing the stream
        // now (the replays use the block up to this free).
        let now = match self.config.capture_aware {
            true => self.inner.capture_status(stream)?.id(),
            false => None,
        };
        let owner = leased_in.filter(|&c| found.has_graph(c)).or(now);
        if mapped == Some(true) {
            // Nothing to wait for: the lease ends here, found once.
            let lease = found.end_mapped();
            return self.end_mapped(slot, shard, lease, (owner, now), completed);
        }
        if let Some(plain) = mapped {
            return self.free_mapped(slot, shard, serial, (owner, now), plain);
        }
        let Some(lease) = shard.lease_mut(serial) else {
            unreachable!("the lease was found above");
        };
        let Backing::Inner(inner) = &lease.backing else {
            unreachable!("an arena lease returned above");
        };
        let inner = inner.clone();
        let Some(class) = class else {
            unreachable!("a size-class lease");
        };
        if lease.cross_used {
            // The next user of the block on this stream (or the inner free)
            // must come after every use recorded on other streams: queue
            // those waits now.
            self.inner
                .prepare_block_use(inner.id(), stream, Access::Write)?;
        }
        if let Some(c) = owner {
            let pool = shard.graph_entry(c);
            pool.put_block(class, inner);
            if leased_in == Some(c) {
                pool.live -= 1;
            }
            shard.end_lease(serial);
            return Ok(());
        }
        if self.reserve(&mut shard, inner.size()) {
            shard.push(class, inner);
        } else {
            self.release_to_inner(&inner, stream)?;
            shard.stats.evictions += 1;
        }
        shard.end_lease(serial);
        Ok(())
    }
}

// SAFETY: the cache hands out its inner resource's blocks, or parts of
// them, or memory it maps itself through the inner resource's
// `device_access` (the backend and pool of that memory's device); a part is
// given to one caller at a time, judged on free by the cache's own records,
// and reused only behind the fences and waits its essay lists; streams
// resolve through the inner resource.
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for CachingResource<R> {
    /// The inner resource's: a block the cache hands out was (or will be)
    /// allocated from below, within whatever limit is there.
    fn allocation_limit(&self) -> Option<usize> {
        self.inner.allocation_limit()
    }
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        ResourceError::check_device(self.device, stream.device())?;
        let index = self.slot_index(stream);
        let served = bytes > 0 && index < self.config.streams;
        // Memory handed out on a capturing stream is the capture's graph's.
        let capture = match served {
            true => self.capture_on(stream, index)?,
            false => None,
        };
        let mapped = self.vm.is_some() && served;
        if mapped && let Some(block) = self.allocate_mapped(bytes, stream, tag, index, capture)? {
            return Ok(block);
        }
        let class = SizeClass::of(bytes)
            .filter(|_| !mapped && bytes != 0 && bytes <= self.config.max_block_size)
            .filter(|_| index != self.config.streams);
        let Some(class) = class else {
            let inner = self.inner_allocate(bytes, stream, tag)?;
            return self.lease(index, inner, (bytes, stream, tag), None, |s| {
                s.bypasses += 1
            });
        };
        let seen = {
            let mut shard = self.slots[index].lock();
            // Checked before a block is taken, under the lock the lease is
            // made under: a hit cannot be refused.
            shard.room()?;
            // A capture takes no cached block: its replays may run on any
            // stream, where nothing orders them after the work this stream
            // queued on the block before (stream order covers only a reuse
            // on this stream), and a block used on another stream would
            // need a wait that joins that stream's work to the capture,
            // which the driver refuses. Its miss below is a graph
            // allocation of the inner resource, which no queued work
            // touches.
            let hit = match (capture, shard.serves(stream)) {
                (None, true) => shard.pop(class),
                // An id the inner resource has not accepted for this shard
                // takes nothing here: below, it is refused or learnt.
                _ => None,
            };
            if let Some(inner) = hit {
                // Stream order alone makes this safe: every use of the block
                // on this stream was queued before, and uses on other streams
                // were waited for when it was cached.
                shard.stats.hits += 1;
                let ptr = inner.ptr();
                let Ok(serial) = shard.lease(Lease {
                    backing: Backing::Inner(inner),
                    stream,
                    size: bytes,
                    class: Some(class),
                    home_marked: false,
                    cross_used: false,
                    capture: None,
                }) else {
                    unreachable!("room checked under this lock");
                };
                return Ok(DeviceBlock::new(
                    BlockId::new(self.id, serial),
                    ptr,
                    bytes,
                    stream,
                    tag,
                ));
            }
            shard.seen
        };
        if capture.is_some() {
            // A miss inside a capture: the inner resource's block is a graph
            // allocation of its own (CUDA's graph memory node), freed in the
            // graph or after it by the inner resource, never cached here.
            let inner = self.inner_allocate(bytes, stream, tag)?;
            return self.lease(index, inner, (bytes, stream, tag), None, |s| s.misses += 1);
        }
        if seen && let Some(inner) = self.steal(class, index, stream) {
            return self.lease(index, inner, (bytes, stream, tag), Some(class), |s| {
                s.steals += 1
            });
        }
        let inner = self.inner_allocate(class.size(), stream, tag)?;
        self.lease(index, inner, (bytes, stream, tag), Some(class), |s| {
            s.misses += 1
        })
    }

    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.free(block, false)
    }

    /// As [`deallocate`](Self::deallocate); an arena block used on its own
    /// stream only goes back to the arena clean: any stream may take it at
    /// once, with no fence and no wait.
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        if completed.block() != block.id() {
            return Err(ResourceError::UnknownBlock { block: block.id() });
        }
        self.free(block, true)
    }

    fn device_ordinal(&self) -> u32 {
        self.device
    }

    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding() + self.vm.as_ref().map_or(0, VmTier::held)
    }

    fn reap_pending(&self) -> ResourceResult<()> {
        self.inner.reap_pending()
    }

    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.inner.pending_free_seq(stream)
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.inner.reap_through(stream, seq)
    }

    fn supports_block_use_tracking(&self) -> bool {
        self.inner.supports_block_use_tracking()
    }

    /// Nothing when a block of the request's class is cached on `stream`
    /// (or on another stream it may take one from); otherwise what the inner
    /// resource takes for the class size (or for `bytes`, for a request that
    /// bypasses the cache).
    fn allocation_cost(&self, bytes: usize, stream: StreamId) -> usize {
        let index = self.slot_index(stream);
        if let Some(tier) = &self.vm
            && stream.device() == self.device
            && bytes > 0
            && index < self.config.streams
        {
            return match self.mapped_cost(tier, bytes, index) {
                Some(cost) => cost,
                // What the arena cannot hold goes to the inner resource.
                None => self.inner.allocation_cost(bytes, stream),
            };
        }
        let class = SizeClass::of(bytes)
            .filter(|_| bytes != 0 && bytes <= self.config.max_block_size)
            .filter(|_| stream.device() == self.device && index != self.config.streams);
        let Some(class) = class else {
            return self.inner.allocation_cost(bytes, stream);
        };
        let seen = {
            let shard = self.slots[index].lock();
            if shard.holds(class) {
                return 0;
            }
            shard.seen
        };
        let n = self.config.streams;
        let elsewhere = seen
            && (1..n).any(|offset| {
                let slot = &self.slots[(index + offset) % n];
                !slot.looks_empty() && slot.try_lock().is_some_and(|s| s.holds(class))
            });
        if elsewhere {
            0
        } else {
            self.inner.allocation_cost(class.size(), stream)
        }
    }

    fn capture_status(&self, stream: StreamId) -> ResourceResult<CaptureStatus> {
        self.inner.capture_status(stream)
    }

    /// Returns the memory `capture`'s graph held in the cache: each stream
    /// that holds some first waits for `after` (its current end), then the
    /// memory is reused on it as freed there, and elsewhere behind a fence
    /// recorded after that point, as any free. A stream capturing at the
    /// call gets its share back at the first call that finds it not
    /// capturing. Then the inner resource is told.
    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        self.release_capture_pools(capture, after)
    }

    /// Shows its [`CacheStats`] as of now, then the layers below.
    fn visit_layers(&self, visit: &mut dyn FnMut(&dyn std::any::Any)) {
        visit(&self.stats());
        self.inner.visit_layers(visit)
    }

    /// `false`: the cost is estimated before the block is placed (see the
    /// trait method).
    fn allocation_cost_is_exact(&self) -> bool {
        false
    }

    /// Trims the cache (its idle blocks), gives the arena's idle mappings
    /// back, then passes the call on.
    ///
    /// A mapping is physical memory, given back at once rather than queued
    /// on a stream, so only once the GPU is done with its pages: outside a
    /// poll of the crate's futures this waits for the arena's fences (as
    /// the out-of-memory path does), so that a
    /// [`BudgetResource`](crate::adaptors::BudgetResource) dropped above the
    /// cache gets every idle byte back; inside one it gives back what the
    /// GPU has already finished with.
    fn release_idle(&self) -> ResourceResult<usize> {
        let trimmed = self.trim()?;
        let unmapped = self.reclaim_mapped(!crate::poll_scope::in_poll());
        Ok(trimmed + unmapped + self.inner.release_idle()?)
    }

    /// `true`: a block cached on one stream is given back to the inner
    /// resource on the stream it was allocated on.
    fn frees_across_streams(&self) -> bool {
        true
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.with_lease(block.id(), |lease| {
            if lease.backing.ptr() != block.ptr() || lease.size != block.size() {
                return Err(ResourceError::UnknownBlock { block: block.id() });
            }
            let home = lease.stream;
            let inner = match &mut lease.backing {
                Backing::Inner(inner) => inner,
                Backing::Mapped(m) => {
                    return self.record_mapped_use(m, home, use_stream, Access::Read);
                }
            };
            self.inner.record_block_use(inner, use_stream)?;
            lease.cross_used |= use_stream != lease.stream;
            Ok(())
        })
    }

    fn prepare_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.with_lease(block, |lease| {
            let inner = match &mut lease.backing {
                Backing::Inner(inner) => inner.id(),
                Backing::Mapped(m) => {
                    return self.prepare_mapped_use(m, lease.stream, use_stream, access);
                }
            };
            if use_stream != lease.stream || lease.cross_used {
                // Ordering after uses on other streams would make a
                // capturing stream wait on events recorded outside its
                // capture, which the driver refuses and which invalidates
                // the capture: refused first, changing nothing.
                let status = self.inner.capture_status(use_stream)?;
                if status.is_capturing() {
                    return Err(ResourceError::StreamCapturing {
                        stream: use_stream,
                        capture: status.id(),
                    });
                }
            }
            if use_stream != lease.stream && !lease.home_marked {
                // The inner block may carry records of earlier leases (or of
                // another stream it was cached on): point its last write at
                // this lease's stream, now, so the wait below covers the
                // work queued there so far. Uses on other streams already
                // recorded in this lease are folded in first, so that
                // replacing the last write loses none of them.
                if lease.cross_used {
                    self.inner
                        .prepare_block_use(inner, lease.stream, Access::Write)?;
                }
                self.inner
                    .finish_block_use(inner, lease.stream, Access::Write)?;
                self.inner.prepare_block_use(inner, use_stream, access)?;
                lease.home_marked = true;
                return Ok(());
            }
            self.inner.prepare_block_use(inner, use_stream, access)
        })
    }

    fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.with_lease(block, |lease| {
            let home = lease.stream;
            let inner = match &mut lease.backing {
                Backing::Inner(inner) => inner.id(),
                Backing::Mapped(m) => return self.record_mapped_use(m, home, use_stream, access),
            };
            self.inner.finish_block_use(inner, use_stream, access)?;
            lease.cross_used |= use_stream != lease.stream;
            Ok(())
        })
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        let (slot, serial) = self.locate(block).ok()?;
        let mut shard = slot.lock();
        if shard.lease_mut(serial).is_some() {
            return Some(BlockState::Live);
        }
        matches!(shard.missing(block), ResourceError::DoubleFree { .. })
            .then_some(BlockState::Retired)
    }
}

impl<R: DeviceMemoryResource> Drop for CachingResource<R> {
    fn drop(&mut self) {
        // Cached blocks go back to the inner resource; leased ones cannot
        // (their users still hold them) and stay allocated there.
        if let Err(e) = self.trim() {
            tracing::warn!(error = %e, "dropping the cache: some cached blocks could not be freed");
        }
        self.close_mapped();
        let leased = self.leased_bytes();
        if leased > 0 {
            tracing::warn!(
                bytes = leased,
                "cache dropped with leased blocks; they stay allocated"
            );
        }
    }
}
