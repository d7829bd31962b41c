//! [`DebugGuardResource`]: the quarantining decorator.

use crate::forward_to_inner;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;

use super::GuardConfig;
use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId, StreamId};
use crate::util::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    /// Blocks handed out through the guard and not deallocated: address,
    /// size and stream, to refuse a forged descriptor. A block being freed stays here
    /// until its free has succeeded.
    live: HashMap<BlockId, (u64, usize, StreamId)>,
    /// Blocks whose `deallocate` is in flight, with the state they will be
    /// in if it succeeds ([`Quarantined`](BlockState::Quarantined), or
    /// [`Retired`](BlockState::Retired) for one that goes straight through).
    freeing: HashMap<BlockId, BlockState>,
    /// Quarantined blocks, oldest first. An eviction frees the oldest in
    /// the inner resource first and removes it only once that succeeded.
    quarantine: VecDeque<DeviceBlock>,
    /// Ids of `quarantine`, for the hooks' look-up.
    held: HashSet<BlockId>,
    held_bytes: usize,
    /// Resources whose blocks came through the guard: an id of one of them
    /// that the guard does not know is unknown, any other is foreign.
    resources: Vec<ResourceId>,
}

/// What the guard's state says of a block passed to `deallocate` that it
/// does not refuse outright.
enum Known {
    /// Live through the guard, and the descriptor matches.
    Live,
    /// Neither live, freeing nor quarantined: an id of a resource whose
    /// blocks came through the guard (`ours`), or of another one.
    Absent { ours: bool },
}

impl State {
    /// Checks a `deallocate` of `block` against the bookkeeping alone.
    fn check(&self, block: &DeviceBlock) -> ResourceResult<Known> {
        let id = block.id();
        if self.held.contains(&id) {
            return Err(ResourceError::DoubleFree { block: id });
        }
        if self.freeing.contains_key(&id) {
            return Err(ResourceError::FreeInFlight { block: id });
        }
        match self.live.get(&id) {
            // Every field, the stream's pool included: the poison fill and
            // the quarantine's free are queued on the descriptor's stream.
            Some(&(ptr, size, stream))
                if ptr == block.ptr() && size == block.size() && stream.is(block.stream()) =>
            {
                Ok(Known::Live)
            }
            Some(_) => Err(ResourceError::UnknownBlock { block: id }),
            None => Ok(Known::Absent {
                ours: self.resources.contains(&id.resource()),
            }),
        }
    }
}

/// A block marked as being freed (in [`State::freeing`]): a racing
/// `deallocate` of it hears [`FreeInFlight`](ResourceError::FreeInFlight),
/// and so does a hook. Dropping the mark takes it off again, so every early
/// return leaves the block live and unchanged; [`complete`](Self::complete)
/// takes it off in the same state section that records the free.
struct FreeMark<'a, R: DeviceMemoryResource> {
    guard: &'a DebugGuardResource<R>,
    id: BlockId,
    armed: bool,
}

impl<R: DeviceMemoryResource> FreeMark<'_, R> {
    /// The free succeeded: unmarks the block under `state`, which the caller
    /// updates in the same section.
    fn complete(mut self, state: &mut State) {
        state.freeing.remove(&self.id);
        self.armed = false;
    }
}

impl<R: DeviceMemoryResource> Drop for FreeMark<'_, R> {
    fn drop(&mut self) {
        if self.armed {
            self.guard.lock().freeing.remove(&self.id);
        }
    }
}

/// Proof that the caller holds the order lock.
type Order<'a> = MutexGuard<'a, ()>;

/// Quarantines deallocated blocks before the real free. The essay of
/// `src/adaptors/debug_guard/` says how.
///
/// # Examples
/// ```
/// use streamalloc::{DebugGuardResource, GuardConfig};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, BlockState, DeviceMemoryResource, ResourceError, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let s = device.stream(0)?;
/// let guard = DebugGuardResource::new(SimResource::new(&device), GuardConfig::new());
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
pub struct DebugGuardResource<R: DeviceMemoryResource> {
    inner: R,
    config: GuardConfig,
    /// Serialises `deallocate` and `flush` (quarantine order, caps); held
    /// across their inner calls and the poison fill. Taken before `state`,
    /// never while holding it.
    order: Mutex<()>,
    /// The bookkeeping; held only for short sections, never across a call
    /// into the inner resource or the poison.
    state: Mutex<State>,
}

impl<R: DeviceMemoryResource> fmt::Debug for DebugGuardResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("DebugGuardResource")
            .field("config", &self.config)
            .field("quarantined", &state.quarantine.len())
            .field("quarantined_bytes", &state.held_bytes)
            .finish()
    }
}

impl<R: DeviceMemoryResource> DebugGuardResource<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, config: GuardConfig) -> Self {
        DebugGuardResource {
            inner,
            config,
            order: Mutex::new(()),
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
        let order = self.order();
        let mut freed = 0;
        while let Some(size) = self.evict_oldest(&order)? {
            freed += size;
        }
        Ok(freed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The order lock; the caller must not hold the state lock.
    fn order(&self) -> Order<'_> {
        self.order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Frees the oldest quarantined block in the inner resource, then (only
    /// once that succeeded) takes it out of the quarantine; returns its size,
    /// or `None` if the quarantine is empty. On failure nothing changes.
    ///
    /// Under the order lock nothing else adds to or drains the quarantine, so
    /// the block peeked at is still the oldest when it is removed; meanwhile
    /// it stays quarantined for the hooks and a second free.
    fn evict_oldest(&self, _order: &Order<'_>) -> ResourceResult<Option<usize>> {
        let Some(victim) = self.lock().quarantine.front().cloned() else {
            return Ok(None);
        };
        let (id, size) = (victim.id(), victim.size());
        self.inner.deallocate(victim)?;
        let mut state = self.lock();
        let evicted = state.quarantine.pop_front();
        debug_assert_eq!(evicted.map(|b| b.id()), Some(id), "quarantine reordered");
        state.held.remove(&id);
        state.held_bytes -= size;
        Ok(Some(size))
    }

    /// Evicts until a block of `size` fits under both caps (which it can:
    /// `size` is at most the byte cap and the block cap is not zero).
    fn make_room(&self, size: usize, order: &Order<'_>) -> ResourceResult<()> {
        let full = || {
            let state = self.lock();
            state.quarantine.len() >= self.config.max_blocks
                || state.held_bytes + size > self.config.max_bytes
        };
        while full() {
            if self.evict_oldest(order)?.is_none() {
                break;
            }
        }
        Ok(())
    }

    /// Why a block the guard does not know (`ours`: of a resource whose
    /// blocks came through it) cannot be deallocated. Asks the inner
    /// resource, so the caller must not hold the state lock.
    fn refuse_absent(&self, block: BlockId, ours: bool) -> ResourceError {
        if self.inner.block_state(block) == Some(BlockState::Retired) {
            ResourceError::DoubleFree { block }
        } else if ours {
            ResourceError::UnknownBlock { block }
        } else {
            ResourceError::ForeignBlock { block }
        }
    }

    /// Refuses a block-use hook on a quarantined block (a use after free)
    /// or on one whose `deallocate` is in flight.
    fn check_hook(&self, block: BlockId) -> ResourceResult<()> {
        let state = self.lock();
        if state.held.contains(&block) {
            return Err(ResourceError::DoubleFree { block });
        }
        if state.freeing.contains_key(&block) {
            return Err(ResourceError::FreeInFlight { block });
        }
        Ok(())
    }

    /// Queues the poison fill, ordered after every recorded use. Runs under
    /// the order lock only: the fill is user code, and may call the guard's
    /// hooks or [`block_state`](DeviceMemoryResource::block_state).
    fn poison(&self, block: &DeviceBlock, _order: &Order<'_>) -> ResourceResult<()> {
        let Some(poison) = &self.config.poison else {
            return Ok(());
        };
        let (id, stream) = (block.id(), block.stream());
        self.inner.prepare_block_use(id, stream, Access::Write)?;
        poison.fill(block)?;
        self.inner.finish_block_use(id, stream, Access::Write)
    }
}

// SAFETY: blocks and streams are the inner resource's; a freed block is
// held in quarantine (given to no one) and then freed through the inner
// resource; the guard judges a returned block by its own records and
// touches memory only through the inner resource's device.
#[allow(unsafe_code)]
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for DebugGuardResource<R> {
    // `bytes_outstanding` is the inner resource's count, which includes
    // quarantined blocks: they are still on the device.
    forward_to_inner!(inner; device_ordinal, bytes_outstanding, reap_pending, pending_free_seq, reap_through, supports_block_use_tracking, allocation_cost, allocation_cost_is_exact, frees_only_queue, allocation_limit, budget_reliefs, capture_status, release_capture, visit_layers, begin_sleep, settle_sleep, wake);

    /// The layers below first; then the blocks they hold that sit in the
    /// quarantine (freed by the caller, not yet below) are marked so.
    fn snapshot_into(&self, snapshot: &mut crate::observe::MemorySnapshot) {
        let first = snapshot.blocks.len();
        self.inner.snapshot_into(snapshot);
        let held: Vec<(u64, crate::StreamId)> = self
            .lock()
            .quarantine
            .iter()
            .map(|b| (b.ptr(), b.stream()))
            .collect();
        for b in &mut snapshot.blocks[first..] {
            if held
                .iter()
                .any(|&(ptr, s)| ptr == b.address && s.index() == b.stream)
            {
                b.state = crate::observe::BlockInfoState::Quarantined;
            }
        }
    }

    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let block = self.inner.allocate(bytes, stream, tag)?;
        let mut state = self.lock();
        state
            .live
            .insert(block.id(), (block.ptr(), block.size(), block.stream()));
        if !state.resources.contains(&block.id().resource()) {
            state.resources.push(block.id().resource());
        }
        Ok(block)
    }

    /// Quarantines `block`, first freeing the oldest quarantined blocks
    /// until it fits under both caps. A block larger than the byte cap is
    /// freed at once, and so is a block freed on a stream being captured
    /// into a graph (the layer below keeps it for the graph; see
    /// [`release_capture`](DeviceMemoryResource::release_capture)).
    ///
    /// The block is marked as being freed first (a short section under the
    /// state lock); then, under the order lock, come the evictions, the
    /// poison fill and the append, none of them under the state lock.
    ///
    /// # Errors
    /// [`DoubleFree`](ResourceError::DoubleFree) for a quarantined or freed
    /// block, [`FreeInFlight`](ResourceError::FreeInFlight) for one that
    /// another thread is deallocating right now,
    /// [`UnknownBlock`](ResourceError::UnknownBlock) for a forged
    /// descriptor, [`ForeignBlock`](ResourceError::ForeignBlock),
    /// [`WrongDevice`](ResourceError::WrongDevice): nothing changes. The
    /// inner resource's error from an eviction or the poison fill, or the
    /// fill's own: `block` stays live and unchanged (blocks already evicted
    /// stay freed).
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        ResourceError::check_device(self.inner.device_ordinal(), block.device())?;
        let (id, size) = (block.id(), block.size());
        let mut straight = self.config.max_blocks == 0 || size > self.config.max_bytes;
        let known = {
            let mut state = self.lock();
            let known = state.check(&block)?;
            if let Known::Live = known {
                let to = if straight {
                    BlockState::Retired
                } else {
                    BlockState::Quarantined
                };
                state.freeing.insert(id, to);
            }
            known
        };
        if let Known::Absent { ours } = known {
            return Err(self.refuse_absent(id, ours));
        }
        let mark = FreeMark {
            guard: self,
            id,
            armed: true,
        };
        // A free on a capturing stream is a node of the capture's graph: the
        // block goes straight to the layer below, which keeps it for the
        // graph (a quarantine would give it back later, outside the capture,
        // while replays still use it; and its poison fill would be captured).
        if !straight && self.inner.capture_status(block.stream())?.is_capturing() {
            straight = true;
            self.lock().freeing.insert(id, BlockState::Retired);
        }

        let order = self.order();
        if straight {
            self.inner.deallocate(block)?;
            let mut state = self.lock();
            state.live.remove(&id);
            mark.complete(&mut state);
            return Ok(());
        }
        self.make_room(size, &order)?;
        self.poison(&block, &order)?;
        let mut state = self.lock();
        state.live.remove(&id);
        state.held.insert(id);
        state.held_bytes += size;
        state.quarantine.push_back(block);
        mark.complete(&mut state);
        Ok(())
    }

    /// Flushes the quarantine (no caller holds those blocks), then passes
    /// the call on.
    fn release_idle(&self) -> ResourceResult<usize> {
        let flushed = self.flush()?;
        Ok(flushed + self.inner.release_idle()?)
    }

    /// `true`: freeing one block may evict an older one, whose free is
    /// queued on that block's own stream.
    fn frees_across_streams(&self) -> bool {
        true
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

    /// [`Quarantined`](BlockState::Quarantined) for a quarantined block; for
    /// one whose `deallocate` is in flight, the state it will be in if that
    /// succeeds (as the stream-ordered resource reports a free in flight);
    /// otherwise the inner resource's answer.
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        {
            let state = self.lock();
            if state.held.contains(&block) {
                return Some(BlockState::Quarantined);
            }
            if let Some(&to) = state.freeing.get(&block) {
                return Some(to);
            }
        }
        self.inner.block_state(block)
    }
}

impl<R: DeviceMemoryResource> Drop for DebugGuardResource<R> {
    fn drop(&mut self) {
        // Quarantined blocks are live in the inner resource: free them, or
        // they would leak with the guard.
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "debug guard dropped; quarantined blocks not freed");
        }
    }
}

/// Loom models of the guard's two locks: a free racing a second free of the
/// same block, and readers racing a failing eviction (`--cfg loom`, see
/// `scripts/model-check.sh`).
#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc;

    use loom::thread;

    use super::*;
    use crate::device::Device;
    use crate::error::DriverCall;
    use crate::gpu::sim::SimGpu;
    use crate::resource::SimResource;
    use crate::resource::race_two_frees;

    type Guard = DebugGuardResource<Arc<SimResource>>;

    fn fixture(config: GuardConfig) -> (Arc<SimGpu>, Arc<SimResource>, Arc<Guard>, StreamId) {
        let gpu = SimGpu::builder().manual().build();
        let device = Device::simulated(&gpu, 2);
        let r = Arc::new(SimResource::new(&device));
        let g = Arc::new(DebugGuardResource::new(r.clone(), config));
        (gpu, r, g, device.stream(0).unwrap())
    }

    /// Two threads free clones of one block through the guard: exactly one
    /// quarantines it, the other hears `FreeInFlight` or `DoubleFree`, and
    /// the quarantine holds it once.
    #[test]
    fn racing_frees_through_the_guard_quarantine_once() {
        loom::model(|| {
            let (_gpu, r, g, s) = fixture(GuardConfig::new());
            let block = g.allocate(64, s, AllocTag::UNTAGGED).unwrap();
            race_two_frees(&g, &block);
            assert_eq!(g.quarantined(), vec![block.clone()]);
            assert_eq!(g.quarantined_bytes(), 64);
            assert_eq!(r.live_bytes(), 64);
        });
    }

    /// A failing eviction raced by readers: the victim reads as quarantined
    /// throughout, the bytes never drop, a hook on the block being freed is
    /// refused as `FreeInFlight` or passes, and afterwards nothing changed.
    #[test]
    fn readers_never_see_a_failing_eviction() {
        loom::model(|| {
            let (gpu, r, g, s) = fixture(GuardConfig::new().max_blocks(1));
            let old = g.allocate(64, s, AllocTag::UNTAGGED).unwrap();
            let new = g.allocate(32, s, AllocTag::UNTAGGED).unwrap();
            g.deallocate(old.clone()).unwrap();
            gpu.fail_nth(DriverCall::FreeAsync, 1);
            let freer = {
                let (g, new) = (g.clone(), new.clone());
                thread::spawn(move || g.deallocate(new))
            };
            assert_eq!(g.block_state(old.id()), Some(BlockState::Quarantined));
            assert_eq!(g.quarantined_bytes(), 64);
            let hook = g.finish_block_use(new.id(), s, Access::Read);
            assert!(
                matches!(hook, Ok(()) | Err(ResourceError::FreeInFlight { .. })),
                "{hook:?}"
            );
            let freed = freer.join().unwrap();
            assert!(
                matches!(freed, Err(ResourceError::Driver { .. })),
                "{freed:?}"
            );
            assert_eq!(g.quarantined(), vec![old.clone()]);
            assert_eq!(g.quarantined_bytes(), 64);
            assert_eq!(g.block_state(new.id()), Some(BlockState::Live));
            assert_eq!(r.live_bytes(), 96);
            g.deallocate(new.clone()).unwrap();
            assert_eq!(g.quarantined(), vec![new]);
            assert_eq!(g.block_state(old.id()), Some(BlockState::Retired));
        });
    }
}
