//! [`CachingResource`]: the stream-ordered cache in front of a resource.
//!
//! The cache owns its [`Shards`] (identity, configuration, one slot per
//! stream), the inner resource and its two tiers, and dispatches each call:
//! to the [`ArenaTier`] when it has one and the stream has a slot, else to
//! the [`SizeClassTier`]; requests neither tier holds go to the inner
//! resource. What spans both tiers is here too: the release of idle
//! memory (trim, and before out of memory) and the graph pools'
//! [`Graphs`] duties, over both.

use super::arena::tier::{ArenaTier, Return};
use super::config::CacheConfig;
use super::graph::release::Graphs;
use super::shard::{Backing, SHARD_MASK, Slot};
use super::shards::Shards;
use super::size_class::SizeClass;
use super::size_class::tier::{Part, SizeClassTier};
use super::stats::CacheStats;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, CaptureStatus};
use crate::resource::DeviceMemoryResource;
use crate::resource::SleepPlan;
use crate::types::{
    Access, AllocTag, BlockId, BlockState, CompletedUses, DeviceBlock, NeverUsed, ResourceId,
    StreamId,
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
/// use streamalloc::CachingResource;
/// use streamalloc::DriverCall;
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
    /// Identity, configuration and the per-stream slots both tiers keep
    /// their leases in.
    shards: Shards,
    inner: R,
    /// The arena tier, when the inner resource lends its device and the
    /// device has virtual memory management.
    arena: Option<ArenaTier>,
    /// The size-class tier (the cap's accounting; its free lists are in
    /// the shards).
    classes: SizeClassTier,
}

impl<R: DeviceMemoryResource> std::fmt::Debug for CachingResource<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingResource")
            .field("device", &self.shards.device)
            .field("config", &self.shards.config)
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
        let arena = config
            .virtual_memory
            .then(|| inner.device_access())
            .flatten()
            .and_then(|access| ArenaTier::new(config.streams + 1, access, &config));
        CachingResource {
            arena,
            classes: SizeClassTier::new(config.max_cached_bytes),
            inner,
            shards: Shards {
                id: ResourceId::fresh(),
                config,
                device,
                slots,
            },
        }
    }

    /// The graph-memory duties, over the cache's parts.
    fn graphs(&self) -> Graphs<'_, R> {
        Graphs {
            shards: &self.shards,
            inner: &self.inner,
            arena: self.arena.as_ref(),
            classes: &self.classes,
        }
    }

    /// The resource the cache allocates from.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.shards.config
    }

    /// This cache's identity (the blocks it hands out carry it).
    pub fn resource_id(&self) -> ResourceId {
        self.shards.id
    }

    /// Bytes idle in the free lists (at class sizes). They are still
    /// allocated from the inner resource and counted in
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding).
    pub fn cached_bytes(&self) -> usize {
        let idle_mapped = self
            .arena
            .as_ref()
            .map_or(0, |a| a.idle_bytes(&self.shards));
        self.slots().map(|s| s.lock().cached).sum::<usize>() + idle_mapped
    }

    /// Number of blocks idle in the free lists.
    pub fn cached_blocks(&self) -> usize {
        self.slots().map(|s| s.lock().cached_blocks()).sum()
    }

    /// Bytes held by users (requested sizes).
    pub fn leased_bytes(&self) -> usize {
        self.slots().map(|s| s.lock().leased).sum()
    }

    /// Number of blocks held by users.
    pub fn leased_blocks(&self) -> usize {
        self.slots().map(|s| s.lock().lease_count()).sum()
    }

    /// What the cache did so far, summed over its shards.
    pub fn stats(&self) -> CacheStats {
        let mut total = CacheStats::default();
        for slot in self.slots() {
            total.add(&slot.lock().stats);
        }
        total
    }

    /// Whether `block` is memory of the virtual-memory arena (its address
    /// lies in the arena's reservation), not a block of the inner
    /// resource. Takes no lock: for a hot path that must tell, after an
    /// allocation, whether the inner resource's held bytes may have grown
    /// ([`inner_block_id`](Self::inner_block_id) says which block, under
    /// the shard's lock).
    pub fn in_arena(&self, block: &DeviceBlock) -> bool {
        self.arena
            .as_ref()
            .is_some_and(|a| a.vm.contains(block.ptr()))
    }

    /// The inner resource's block behind `block`, while it is leased.
    pub fn inner_block_id(&self, block: BlockId) -> Option<BlockId> {
        let (slot, serial) = self.shards.locate(block).ok()?;
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
        let classes = self.trim_classes(None);
        let mapped = self.reclaim_mapped(false);
        classes.map(|released| released + mapped)
    }

    /// Gives the size classes' cached blocks back to the inner resource:
    /// all of them, or with `part` about as many bytes as it asks.
    fn trim_classes(&self, part: Option<Part>) -> ResourceResult<usize> {
        let graphs = self.graphs();
        let (released, first_err) =
            self.classes
                .trim(&self.shards, &self.inner, part, |index, shard| {
                    graphs.finish_deferred(index, shard)
                });
        match first_err {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    /// Bytes the graphs of live captures hold in the cache: ranges and
    /// blocks freed in (or after) their capture, kept for their replays.
    /// They count in
    /// [`bytes_outstanding`](DeviceMemoryResource::bytes_outstanding) and
    /// in neither [`cached_bytes`](Self::cached_bytes) nor
    /// [`leased_bytes`](Self::leased_bytes); blocks a capture handed out
    /// that users still hold are leased.
    pub fn graph_bytes(&self) -> usize {
        self.slots()
            .map(|s| s.lock().graphs.iter().map(|g| g.bytes).sum::<usize>())
            .sum()
    }

    /// Puts the blocks of the tags `plan` names to sleep and gives their
    /// physical memory back to the device, keeping their addresses: each
    /// block's stream first waits for its uses on other streams, then an
    /// [`Offload`](crate::SleepMode::Offload) block is copied to pinned host
    /// memory; once the host saw that work complete, the mappings under
    /// the blocks are unmapped and released, and idle cached mappings the
    /// GPU is done with go too. [`wake`](Self::wake) maps memory at the
    /// same addresses and restores the contents. Blocks of other tags, and
    /// new allocations of any tag, stay usable meanwhile.
    ///
    /// This call waits for that work, parking the thread (never call it
    /// from inside a poll); async code awaits
    /// [`AsyncResource::sleep`](crate::AsyncResource::sleep)
    /// instead, which waits for the same fact without blocking.
    ///
    /// # Errors
    /// [`SleepRefused`](ResourceError::SleepRefused), nothing changed: the
    /// plan names no tag; a sleep is in effect already; the cache has no
    /// virtual-memory arena; a block of a named tag is not in the arena
    /// (size classes, or larger than the arena) or belongs to a captured
    /// graph. [`StreamCapturing`](ResourceError::StreamCapturing) while a
    /// block's stream is being captured. A driver error (pinning host
    /// memory, queueing a wait or copy): every block stays awake.
    ///
    /// # Stream ordering
    /// A use of a sleeping block is refused
    /// ([`BlockAsleep`](ResourceError::BlockAsleep)) by the block-use
    /// hooks until the wake: finish every launch that uses one (its
    /// [`finish_block_use`](DeviceMemoryResource::finish_block_use))
    /// before the sleep, since a use the hooks never saw is not waited
    /// for. Pages a live block of another tag shares stay mapped, with
    /// their contents (see `cache/arena/sleep.rs`).
    pub fn sleep(&self, plan: &SleepPlan) -> ResourceResult<()> {
        let arena = self.sleep_arena()?;
        arena.sleep(&self.shards, plan)?;
        arena.wait_sleep()?;
        self.settle_sleep().map(drop)
    }

    /// The first half of [`sleep`](Self::sleep), which waits for nothing:
    /// queues the sleep's work and returns the streams on which it was
    /// queued; once the host saw each of them reach its current end,
    /// [`settle_sleep`](Self::settle_sleep) gives the memory back.
    ///
    /// # Errors
    /// As [`sleep`](Self::sleep).
    pub fn begin_sleep(&self, plan: &SleepPlan) -> ResourceResult<Vec<StreamId>> {
        self.sleep_arena()?.sleep(&self.shards, plan)
    }

    /// Gives back the memory of the sleep in effect once a query shows the
    /// GPU done with the work [`begin_sleep`](Self::begin_sleep) queued
    /// (never waiting), and, while asleep, the idle cached mappings the
    /// GPU is done with; also frees the pinned host memory of the last
    /// wake whose copies the host saw complete. True when nothing of the
    /// sleep is left to give back (or none is in effect), false while
    /// that work may still run.
    ///
    /// # Errors
    /// A driver error of an unmap (the mapping is kept for the next call).
    pub fn settle_sleep(&self) -> ResourceResult<bool> {
        let Some(arena) = &self.arena else {
            return Ok(true);
        };
        let asleep = arena.is_asleep();
        let settled = arena.settle_sleep()?;
        if settled && asleep {
            self.reclaim_mapped(false);
        }
        Ok(settled)
    }

    /// Wakes the sleep in effect: maps new physical memory at the sleeping
    /// blocks' addresses and queues, on each block's stream, its restore
    /// (the copy back from host of an [`Offload`](crate::SleepMode::Offload)
    /// block, the fill of a [`Zero`](crate::SleepMode::Zero) one); the blocks are
    /// usable at once (a use on the block's stream follows the restore in
    /// stream order, a use elsewhere waits for it). Returns the streams
    /// the restores were queued on. Blocks freed while asleep are not
    /// restored. The pinned host memory is freed once a query shows the
    /// copies back complete, at the next
    /// [`settle_sleep`](Self::settle_sleep) or sleep after that (or when
    /// the cache goes); [`AsyncResource::wake`](crate::AsyncResource::wake)
    /// awaits the restores and frees it.
    ///
    /// # Errors
    /// [`SleepRefused`](ResourceError::SleepRefused) when no sleep is in
    /// effect; out of memory or another driver error while mapping or
    /// queueing a restore: what was woken stays awake, the rest stays
    /// asleep for the next call.
    pub fn wake(&self) -> ResourceResult<Vec<StreamId>> {
        self.sleep_arena()?.wake(&self.shards)
    }

    /// Whether a sleep is in effect (from [`sleep`](Self::sleep) or
    /// [`begin_sleep`](Self::begin_sleep) to [`wake`](Self::wake)).
    pub fn is_asleep(&self) -> bool {
        self.arena.as_ref().is_some_and(ArenaTier::is_asleep)
    }

    /// Physical bytes the virtual-memory arena holds mapped now (the
    /// inner resource's are apart): what a sleep gives back and a wake
    /// takes again.
    pub fn physical_bytes(&self) -> usize {
        self.arena.as_ref().map_or(0, ArenaTier::held)
    }

    fn sleep_arena(&self) -> ResourceResult<&ArenaTier> {
        self.arena.as_ref().ok_or(ResourceError::SleepRefused {
            reason: "the cache has no virtual-memory arena",
        })
    }

    fn slots(&self) -> std::slice::Iter<'_, Slot> {
        self.shards.slots.iter()
    }

    /// Gives back the arena's idle mappings the GPU is done with (waiting
    /// for it first when `wait`); nothing without an arena.
    fn reclaim_mapped(&self, wait: bool) -> usize {
        self.arena
            .as_ref()
            .map_or(0, |a| a.reclaim(&self.shards, wait))
    }

    /// Allocates from the inner resource; when memory is full (the device's
    /// out-of-memory, or a budget's refusal below the cache: the idle cached
    /// bytes count against both), gives cached blocks back and tries
    /// again. A budget says how much it lacks: the largest cached blocks
    /// that cover that go back, the refused stream's own last, and the
    /// rest stay cached (a budget that stays full, as under a service's
    /// reservations, would otherwise empty every stream's free lists at
    /// each refusal, and each stream's next requests would miss and be
    /// refused in turn). The device's out-of-memory gives every cached
    /// block back. It tries once at once (the driver reuses memory
    /// freed on the same stream immediately), and once more after letting
    /// the inner resource reap its queued frees (which synchronizes the
    /// streams they were queued on, as PyTorch's allocator does before it
    /// gives up).
    fn inner_allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        match self.inner.allocate(bytes, stream, tag) {
            Err(e) if memory_full(&e) => self.relieved_allocate(bytes, stream, tag, e),
            first => first,
        }
    }

    /// [`inner_allocate`](Self::inner_allocate) after the inner resource
    /// refused the first try with `first`, memory full.
    fn relieved_allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
        first: ResourceError,
    ) -> ResourceResult<DeviceBlock> {
        if self.cached_bytes() == 0 {
            return Err(first);
        }
        if self.arena.is_some() {
            let waits: &[bool] = if crate::util::poll_scope::in_poll() {
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
        let released = match first {
            ResourceError::BudgetExceeded {
                requested,
                limit,
                in_use,
            } => self.trim_classes(Some(Part {
                bytes: in_use
                    .saturating_add(requested)
                    .saturating_sub(limit)
                    .max(1),
                first: self.shards.slot_index(stream.index()) + 1,
            })),
            _ => self.trim(),
        };
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
    /// `how`: [`Return::Completed`], the GPU is done with every use of the
    /// block ([`deallocate_completed`](DeviceMemoryResource::deallocate_completed)),
    /// [`Return::Unused`], no work ever touched it
    /// ([`deallocate_unused`](DeviceMemoryResource::deallocate_unused)).
    /// Finds the lease and checks the block against it, then hands the
    /// free to the lease's tier (see "Life of a free" in the
    /// [module documentation](super)). Only an arena lease with no use
    /// recorded makes use of `how`; other frees are ordinary ones.
    fn free(&self, block: DeviceBlock, how: Return) -> ResourceResult<()> {
        ResourceError::check_device(self.shards.device, block.device())?;
        let id = block.id();
        let (slot, serial) = self.shards.locate(id)?;
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
        // A lease the hooks saw a use of was used, whatever the caller
        // says: its free is an ordinary one.
        let how = match &lease.backing {
            Backing::Mapped(m)
                if how == Return::Unused && (m.home_unrecorded.is_some() || m.uses_begun > 0) =>
            {
                Return::Freed
            }
            _ => how,
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
        let now = match self.shards.config.capture_aware {
            true => self.inner.capture_status(stream)?.id(),
            false => None,
        };
        let owner = leased_in.filter(|&c| found.has_graph(c)).or(now);
        if let Some(plain) = mapped {
            let Some(arena) = &self.arena else {
                unreachable!("an arena lease is made only by the arena tier");
            };
            if plain {
                // Nothing to wait for: the lease ends here, found once.
                let lease = found.end_arena_lease();
                return arena.release(&self.shards, slot, shard, lease, (owner, now), how);
            }
            return arena.free(&self.shards, slot, shard, serial, (owner, now));
        }
        let Some(class) = class else {
            unreachable!("a size-class lease");
        };
        self.classes.free(
            &self.shards,
            &self.inner,
            shard,
            serial,
            class,
            (owner, leased_in),
        )
    }
}

#[allow(unsafe_code)] // the resource contract, argued below
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

    fn budget_reliefs(&self, out: &mut Vec<crate::resource::BudgetRelief>) {
        self.inner.budget_reliefs(out)
    }
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        ResourceError::check_device(self.shards.device, stream.device())?;
        let index = self.shards.slot_index(stream.index());
        let served = bytes > 0 && index < self.shards.config.streams;
        // Memory handed out on a capturing stream is the capture's graph's.
        let capture = match served {
            true => self.graphs().capture_on(stream, index)?,
            false => None,
        };
        let request = (bytes, stream, tag);
        let class = match &self.arena {
            Some(arena) if served => {
                if let Some(block) =
                    arena.allocate(&self.shards, bytes, stream, tag, index, capture)?
                {
                    return Ok(block);
                }
                // What the arena cannot hold goes to the inner resource.
                None
            }
            _ => SizeClassTier::class_of(&self.shards, bytes, index),
        };
        let Some(class) = class else {
            let block = self.inner_allocate(bytes, stream, tag)?;
            return self.classes.lease(
                &self.shards,
                &self.inner,
                index,
                block,
                request,
                None,
                |s| s.bypasses += 1,
            );
        };
        self.classes.allocate(
            &self.shards,
            &self.inner,
            request,
            index,
            class,
            capture,
            |size| self.inner.allocate(size, stream, tag),
            |size, refused| self.relieved_allocate(size, stream, tag, refused),
        )
    }

    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.free(block, Return::Freed)
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
        self.free(block, Return::Completed)
    }

    /// As [`deallocate`](Self::deallocate); an arena block placed for this
    /// allocation (not a block its stream kept, nor a graph's, and with no
    /// memory moved for it) goes back to the arena as it was before it was
    /// placed: with the tags it had, not as a free of its stream.
    fn deallocate_unused(&self, block: DeviceBlock, unused: NeverUsed) -> ResourceResult<()> {
        if unused.block() != block.id() {
            return Err(ResourceError::UnknownBlock { block: block.id() });
        }
        self.free(block, Return::Unused)
    }

    fn device_ordinal(&self) -> u32 {
        self.shards.device
    }

    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding() + self.arena.as_ref().map_or(0, ArenaTier::held)
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
        let index = self.shards.slot_index(stream.index());
        let ours = stream.device() == self.shards.device;
        if let Some(arena) = &self.arena
            && ours
            && bytes > 0
            && index < self.shards.config.streams
        {
            return match arena.cost(&self.shards, bytes, index) {
                Some(cost) => cost,
                // What the arena cannot hold goes to the inner resource.
                None => self.inner.allocation_cost(bytes, stream),
            };
        }
        match SizeClassTier::class_of(&self.shards, bytes, index).filter(|_| ours) {
            Some(class) => SizeClassTier::cost(&self.shards, &self.inner, class, index, stream),
            None => self.inner.allocation_cost(bytes, stream),
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
        self.graphs().release_capture_pools(capture, after)
    }

    /// The cache's own sleep ([`CachingResource::begin_sleep`]); the layers
    /// below are not asked.
    fn begin_sleep(&self, plan: &SleepPlan) -> ResourceResult<Vec<StreamId>> {
        CachingResource::begin_sleep(self, plan)
    }

    fn settle_sleep(&self) -> ResourceResult<bool> {
        CachingResource::settle_sleep(self)
    }

    fn wake(&self) -> ResourceResult<Vec<StreamId>> {
        CachingResource::wake(self)
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
    /// [`BudgetResource`](crate::BudgetResource) dropped above the
    /// cache gets every idle byte back; inside one it gives back what the
    /// GPU has already finished with.
    fn release_idle(&self) -> ResourceResult<usize> {
        let trimmed = self.trim()?;
        let unmapped = self.reclaim_mapped(!crate::util::poll_scope::in_poll());
        Ok(trimmed + unmapped + self.inner.release_idle()?)
    }

    /// `true`: a block cached on one stream is given back to the inner
    /// resource on the stream it was allocated on.
    fn frees_across_streams(&self) -> bool {
        true
    }

    /// `true` when uncapped over an inner resource whose frees only queue:
    /// a free keeps its block (in a size class, a kept arena block, the
    /// arena's free ranges: the pages stay mapped and counted) or frees it
    /// through the inner resource. With a cap
    /// ([`max_cached_bytes`](crate::CacheConfig::max_cached_bytes)) a free
    /// may unmap idle pages at once, and the answer is `false`.
    fn frees_only_queue(&self) -> bool {
        self.shards.config.max_cached_bytes == usize::MAX && self.inner.frees_only_queue()
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.shards.with_lease(block.id(), |lease| {
            if lease.backing.ptr() != block.ptr() || lease.size != block.size() {
                return Err(ResourceError::UnknownBlock { block: block.id() });
            }
            match (&mut lease.backing, &self.arena) {
                (Backing::Mapped(m), _) if m.asleep => {
                    Err(ResourceError::BlockAsleep { block: block.id() })
                }
                (Backing::Mapped(m), Some(arena)) => {
                    arena.record_use(m, lease.stream, use_stream, Access::Read)
                }
                _ => SizeClassTier::record_use(&self.inner, lease, use_stream),
            }
        })
    }

    fn prepare_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let (slot, serial) = self.shards.locate(block)?;
        let mut shard = slot.lock();
        let Some(mut lease) = shard.lease_mut(serial) else {
            return Err(shard.missing(block));
        };
        // A range handed out in a capture is written by every replay of its
        // graph, which the hooks do not see: its use follows the last one.
        let mut replay = None;
        if let (Some(capture), Some(arena)) = (lease.capture, &self.arena) {
            replay = arena.last_replay(&shard, capture);
            let Some(again) = shard.lease_mut(serial) else {
                unreachable!("found above under this lock");
            };
            lease = again;
        }
        match (&mut lease.backing, &self.arena) {
            (Backing::Mapped(m), _) if m.asleep => Err(ResourceError::BlockAsleep { block }),
            (Backing::Mapped(m), Some(arena)) => {
                arena.prepare_use(m, lease.stream, (use_stream, access), replay)?;
                // Until its finish, a sleep of this block is refused.
                m.uses_begun = m.uses_begun.saturating_add(1);
                Ok(())
            }
            _ => SizeClassTier::prepare_use(&self.inner, lease, use_stream, access),
        }
    }

    fn finish_block_use(
        &self,
        block: BlockId,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.shards
            .with_lease(block, |lease| match (&mut lease.backing, &self.arena) {
                (Backing::Mapped(m), _) if m.asleep => Err(ResourceError::BlockAsleep { block }),
                (Backing::Mapped(m), Some(arena)) => {
                    arena.record_use(m, lease.stream, use_stream, access)?;
                    // Counted down only when the finish recorded the use
                    // (a failed one is finished again, by the buffer's
                    // deferred use); never below zero.
                    m.uses_begun = m.uses_begun.saturating_sub(1);
                    Ok(())
                }
                _ => SizeClassTier::finish_use(&self.inner, lease, use_stream, access),
            })
    }

    /// Its blocks (every lease, with the size asked and the size it takes
    /// here) and its idle memory (the arena's range with what is mapped
    /// and free in it, or each cached size-class block), then the layers
    /// below.
    fn snapshot_into(&self, snapshot: &mut crate::observe::MemorySnapshot) {
        super::snapshot::snapshot_into(&self.shards, self.arena.as_ref(), snapshot);
        self.inner.snapshot_into(snapshot);
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        let (slot, serial) = self.shards.locate(block).ok()?;
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
        if let Some(arena) = &self.arena {
            arena.close(&self.shards);
        }
        let leased = self.leased_bytes();
        if leased > 0 {
            tracing::warn!(
                bytes = leased,
                "cache dropped with leased blocks; they stay allocated"
            );
        }
    }
}
