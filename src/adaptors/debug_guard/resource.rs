//! [`DebugGuard`]: the quarantining decorator.

use crate::resource::forward::forward_to_inner;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use super::GuardConfig;
use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId, StreamId};

#[derive(Debug, Default)]
struct State {
    /// Blocks handed out through the guard and not deallocated: address and
    /// size, to refuse a forged descriptor.
    live: HashMap<BlockId, (u64, usize)>,
    /// Quarantined blocks, oldest first.
    quarantine: VecDeque<DeviceBlock>,
    /// Ids of `quarantine`, for the hooks' look-up.
    held: HashSet<BlockId>,
    held_bytes: usize,
    /// Resources whose blocks came through the guard: an id of one of them
    /// that the guard does not know is unknown, any other is foreign.
    resources: Vec<ResourceId>,
}

/// Quarantines deallocated blocks before the real free. See the
/// [module documentation](super).
///
/// # Examples
/// ```
/// use streamalloc::adaptors::{DebugGuard, GuardConfig};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{AllocTag, BlockState, DeviceMemoryResource, ResourceError, SimResource};
///
/// let gpu = SimGpu::new();
/// let pool = gpu.stream_pool(1);
/// let s = pool.id(0).unwrap();
/// let guard = DebugGuard::new(SimResource::new(gpu, pool.clone()), GuardConfig::new());
///
/// let block = guard.allocate(512, s, AllocTag::UNTAGGED)?;
/// guard.deallocate(block.clone())?;
/// assert_eq!(guard.block_state(block.id()), Some(BlockState::Quarantined));
/// assert!(matches!(guard.deallocate(block.clone()), Err(ResourceError::DoubleFree { .. })));
/// assert_eq!(guard.flush()?, 512);
/// assert_eq!(guard.block_state(block.id()), Some(BlockState::Retired));
/// # Ok::<(), ResourceError>(())
/// ```
///
/// # Stream ordering
/// A quarantined block stays allocated in the inner resource: its memory is
/// not reused until the guard frees it for real, so a late reader reads
/// stale (or poisoned) data instead of another allocation's.
pub struct DebugGuard<R: DeviceMemoryResource> {
    inner: R,
    config: GuardConfig,
    state: Mutex<State>,
}

impl<R: DeviceMemoryResource> fmt::Debug for DebugGuard<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("DebugGuard")
            .field("config", &self.config)
            .field("quarantined", &state.quarantine.len())
            .field("quarantined_bytes", &state.held_bytes)
            .finish()
    }
}

impl<R: DeviceMemoryResource> DebugGuard<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, config: GuardConfig) -> Self {
        DebugGuard {
            inner,
            config,
            state: Mutex::new(State::default()),
        }
    }

    /// The inner resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The configuration.
    pub fn config(&self) -> &GuardConfig {
        &self.config
    }

    /// The quarantined blocks, oldest first.
    pub fn quarantined(&self) -> Vec<DeviceBlock> {
        self.lock().quarantine.iter().cloned().collect()
    }

    /// Bytes held in quarantine.
    pub fn quarantined_bytes(&self) -> usize {
        self.lock().held_bytes
    }

    /// Really frees every quarantined block, oldest first; returns the bytes
    /// freed.
    ///
    /// # Errors
    /// The inner resource's error; the block that failed and every younger
    /// one stay quarantined.
    pub fn flush(&self) -> ResourceResult<usize> {
        let mut state = self.lock();
        let mut freed = 0;
        while !state.quarantine.is_empty() {
            freed += self.evict_oldest(&mut state)?;
        }
        Ok(freed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Frees the oldest quarantined block in the inner resource.
    fn evict_oldest(&self, state: &mut State) -> ResourceResult<usize> {
        let Some(victim) = state.quarantine.pop_front() else {
            return Ok(0);
        };
        let (id, size) = (victim.id(), victim.size());
        if let Err(e) = self.inner.deallocate(victim.clone()) {
            state.quarantine.push_front(victim);
            return Err(e);
        }
        state.held.remove(&id);
        state.held_bytes -= size;
        Ok(size)
    }

    /// Why `block` cannot be deallocated, if it cannot.
    fn check(&self, state: &State, block: &DeviceBlock) -> ResourceResult<()> {
        let id = block.id();
        ResourceError::check_device(self.inner.device_ordinal(), block.device())?;
        if state.held.contains(&id) {
            return Err(ResourceError::DoubleFree { block: id });
        }
        match state.live.get(&id) {
            Some(&(ptr, size)) if ptr == block.ptr() && size == block.size() => Ok(()),
            Some(_) => Err(ResourceError::UnknownBlock { block: id }),
            None if self.inner.block_state(id) == Some(BlockState::Retired) => {
                Err(ResourceError::DoubleFree { block: id })
            }
            None if state.resources.contains(&id.resource()) => {
                Err(ResourceError::UnknownBlock { block: id })
            }
            None => Err(ResourceError::ForeignBlock { block: id }),
        }
    }

    /// Refuses a block-use hook on a quarantined block: that is a use after
    /// free.
    fn check_hook(&self, block: BlockId) -> ResourceResult<()> {
        if self.lock().held.contains(&block) {
            return Err(ResourceError::DoubleFree { block });
        }
        Ok(())
    }

    /// Queues the poison fill, ordered after every recorded use.
    fn poison(&self, block: &DeviceBlock) -> ResourceResult<()> {
        let Some(poison) = &self.config.poison else {
            return Ok(());
        };
        let (id, stream) = (block.id(), block.stream());
        self.inner.prepare_block_use(id, stream, Access::Write)?;
        poison.fill(block)?;
        self.inner.finish_block_use(id, stream, Access::Write)
    }
}

impl<R: DeviceMemoryResource> DeviceMemoryResource for DebugGuard<R> {
    // `bytes_outstanding` is the inner resource's count, which includes
    // quarantined blocks: they are still on the device.
    forward_to_inner!(inner; device_ordinal, bytes_outstanding, reap_pending, pending_free_seq, reap_through, supports_block_use_tracking);

    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let block = self.inner.allocate(bytes, stream, tag)?;
        let mut state = self.lock();
        state.live.insert(block.id(), (block.ptr(), block.size()));
        if !state.resources.contains(&block.id().resource()) {
            state.resources.push(block.id().resource());
        }
        Ok(block)
    }

    /// Quarantines `block`, first freeing the oldest quarantined blocks
    /// until it fits under both caps. A block larger than the byte cap is
    /// freed at once.
    ///
    /// # Errors
    /// [`DoubleFree`](ResourceError::DoubleFree) for a quarantined or freed
    /// block, [`UnknownBlock`](ResourceError::UnknownBlock) for a forged
    /// descriptor, [`ForeignBlock`](ResourceError::ForeignBlock),
    /// [`WrongDevice`](ResourceError::WrongDevice): nothing changes. The
    /// inner resource's error from an eviction or the poison fill: `block`
    /// stays live (blocks already evicted stay freed).
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        let mut state = self.lock();
        self.check(&state, &block)?;
        let (id, size) = (block.id(), block.size());
        if self.config.max_blocks == 0 || size > self.config.max_bytes {
            self.inner.deallocate(block)?;
            state.live.remove(&id);
            return Ok(());
        }
        while state.quarantine.len() >= self.config.max_blocks
            || state.held_bytes + size > self.config.max_bytes
        {
            self.evict_oldest(&mut state)?;
        }
        self.poison(&block)?;
        state.live.remove(&id);
        state.held.insert(id);
        state.held_bytes += size;
        state.quarantine.push_back(block);
        Ok(())
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.check_hook(block.id())?;
        self.inner.record_block_use(block, use_stream)
    }

    fn prepare_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.check_hook(b)?;
        self.inner.prepare_block_use(b, s, a)
    }

    fn finish_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.check_hook(b)?;
        self.inner.finish_block_use(b, s, a)
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        if self.lock().held.contains(&block) {
            return Some(BlockState::Quarantined);
        }
        self.inner.block_state(block)
    }
}

impl<R: DeviceMemoryResource> Drop for DebugGuard<R> {
    fn drop(&mut self) {
        // Quarantined blocks are live in the inner resource: free them, or
        // they would leak with the guard.
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "debug guard dropped; quarantined blocks not freed");
        }
    }
}
