//! Sleep and wake of the arena tier: the physical memory under the blocks
//! of some tags goes back to the device while their addresses stay
//! reserved, and comes back at the same addresses.
//!
//! # State
//!
//! - **The slumber** (one at a time, in the tier's sleep lock): the
//!   sleeping blocks (slot, address, size, tag, [`SleepMode`], the pinned
//!   host memory an offload copies them into, and where that memory goes
//!   back: the plan's [`OffloadHost`], a host pool, or unpinned when the
//!   sleep pinned it), the handles taken out from
//!   under them and not unmapped yet (with the frees on them the GPU
//!   must be done with), the runs of pages unmapped (to map again at the
//!   wake), and the fences past the work queued before the sleep.
//! - **Draining host memory**: pinned memory whose copies (out at a
//!   sleep, back at a wake) may still run, with the fences past them;
//!   given back to its lender (idle in the pool at once: the host saw
//!   its copies done) or unpinned once the host saw those complete.
//! - On each sleeping lease, `asleep` ([`Mapped`]): its hooks are refused
//!   ([`BlockAsleep`](crate::ResourceError::BlockAsleep)) and its free
//!   gives the range straight to the arena.
//!
//! # Who changes it
//!
//! 1. [`Sleeper::sleep`] finds the blocks (a block of a named tag
//!    outside the arena, or one a captured graph holds: refused, nothing
//!    changed; a lender of another backend: refused), borrows the host
//!    memory of the offloads from the plan's lender, or pins it, with the
//!    shards unlocked (a failure gives it back: nothing changed), then,
//!    with every
//!    shard locked (so no hook, free or allocation of a stream runs
//!    meanwhile), finds the same blocks again (else refused, unpinned),
//!    refuses a capturing stream, and queues on each block's stream the
//!    waits for its uses on other streams and its offload copy, takes out
//!    of the page table the handles no block of another tag touches (their
//!    pages pending: no placement or growth touches them), records a fence
//!    on every stream involved (the blocks' and those that freed memory on
//!    the handles) and marks the blocks asleep. Nothing is unmapped yet.
//! 2. [`Sleeper::settle`] unmaps and releases the handles once a
//!    query shows every fence complete: the fact the unmap rests on (no
//!    queued work touches them: the offload copies and every recorded
//!    use came before the fences). No device-wide sync: only the streams
//!    involved are looked at, and never waited for, except by
//!    [`Sleeper::wait`] (the blocking sleep, outside any poll).
//! 3. [`Sleeper::wake`] maps new memory over the runs unmapped (handles
//!    not unmapped yet are simply put back, with their contents), queues
//!    on each block's stream its restore (the copy back from host, or a
//!    zero fill) and notes it as a use on that stream (so a use elsewhere
//!    waits for it), marks the blocks awake, and hands the host memory to
//!    the draining list behind a fence past the copies.
//!
//! # Pages shared with other tags
//!
//! A handle (one physical allocation, a run of pages) is unmapped only
//! when every live block on it sleeps: a handle a block of another tag
//! touches stays mapped, with the sleeping blocks on it (their contents
//! are kept, and the restore writes them again). So a sleep never refuses
//! for sharing, and what it gives back is what the sleeping tags hold
//! alone; allocating the tags to sleep apart (one after the other, large
//! blocks) gives back all of it.
//!
//! # Failure
//!
//! A driver error while queueing the sleep's work leaves every block
//! awake and usable (the waits queued only order streams further); host
//! memory a queued copy writes is freed once that copy is seen complete.
//! A failed unmap keeps the handle for the next [`settle_sleep`](super::tier::ArenaTier::settle_sleep)
//! (Sleeper::settle); a failed mapping or restore at the wake
//! keeps the rest asleep, for the next [`wake`](Sleeper::wake).

// Unsafe here: the sleep queues copies, fills and waits on raw streams, and pins and unpins host memory.
#![allow(unsafe_code)]

use std::sync::Arc;

use super::freed::Freed;
use super::pages::Handle;
use super::vmm::VirtualArena;
use crate::cache::shard::{Backing, Mapped, SlotGuard};
use crate::cache::shards::Shards;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{Gpu, HostMemory};
use crate::resource::{OffloadHost, SleepMode, SleepPlan};
use crate::types::{Access, AllocTag, StreamId};
use crate::util::sync::{Mutex, MutexGuard};

/// One sleeping block.
#[derive(Debug)]
struct SleptBlock {
    slot: usize,
    ptr: u64,
    size: usize,
    tag: AllocTag,
    mode: SleepMode,
    /// Where an offload copies the block.
    host: Option<Offloaded>,
}

/// The pinned host memory of one offload, and where it goes back: to the
/// plan's lender, or unpinned when the sleep pinned it.
#[derive(Debug)]
struct Offloaded {
    mem: HostMemory,
    lender: Option<Arc<dyn OffloadHost>>,
    tag: AllocTag,
}

impl Offloaded {
    /// Borrows from `lender`, or pins, `bytes` of host memory for a block
    /// of `tag`.
    fn take(
        gpu: &dyn Gpu,
        lender: Option<&Arc<dyn OffloadHost>>,
        bytes: usize,
        tag: AllocTag,
    ) -> ResourceResult<Self> {
        let mem = match lender {
            Some(l) => l.lend(bytes, tag)?,
            None => gpu.host_alloc(bytes, None)?,
        };
        Ok(Offloaded {
            mem,
            lender: lender.cloned(),
            tag,
        })
    }

    /// Gives the memory up: back to its lender, or unpinned.
    ///
    /// # Safety
    /// 1. No copy touches it any more: the host saw each one queued on it
    ///    complete, or none was queued.
    unsafe fn give_up(self, gpu: &dyn Gpu) {
        match self.lender {
            // SAFETY: (1) lent for this block, given back once (consumed);
            // (2) the caller's claim.
            Some(l) => unsafe { l.take_back(self.mem, self.tag) },
            None => {
                // SAFETY: (1) pinned by the sleep, freed once (consumed);
                // (2) the caller's claim.
                let _ = unsafe { gpu.host_free(self.mem) };
            }
        }
    }
}

/// One sleep, from [`Sleeper::sleep`] to [`Sleeper::wake`].
#[derive(Debug, Default)]
struct Slumber {
    blocks: Vec<SleptBlock>,
    /// Handles taken out from under the blocks, not unmapped yet.
    taken: Vec<(Handle, Vec<Freed>)>,
    /// Runs of pages (first, count) unmapped, mapped again at the wake.
    released: Vec<(u32, u32)>,
    /// Fences past the work queued before the sleep on every stream
    /// involved.
    fences: Vec<Freed>,
}

/// The state of the tier's sleep.
#[derive(Debug, Default)]
struct SleepState {
    slumber: Option<Slumber>,
    /// Host memory copies may still read or write, with the fences past
    /// them.
    draining: Vec<(Vec<Freed>, Offloaded)>,
}

/// A refusal of the sleep, changing nothing.
fn refused(reason: &'static str) -> ResourceError {
    ResourceError::SleepRefused { reason }
}

/// The arena lease of `guard` at `ptr`, if one is there.
fn mapped_at<'g>(guard: &'g mut SlotGuard<'_>, ptr: u64) -> Option<&'g mut Mapped> {
    guard.leases_mut().find_map(|l| match &mut l.backing {
        Backing::Mapped(m) if m.ptr == ptr => Some(m),
        _ => None,
    })
}

/// The sleep of an arena tier, behind its own lock (taken before the
/// shards' locks, which are taken before the arena's).
#[derive(Debug, Default)]
pub(crate) struct Sleeper {
    state: Mutex<SleepState>,
}

impl Sleeper {
    fn sleep_lock(&self) -> MutexGuard<'_, SleepState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a sleep is in effect (until [`wake`](Self::wake)).
    pub(crate) fn is_asleep(&self) -> bool {
        self.sleep_lock().slumber.is_some()
    }

    /// Puts the blocks of the tags `plan` names to sleep (see the module
    /// documentation, step 1); returns the streams whose completion, once
    /// seen, lets [`settle`](Self::settle) give the memory
    /// back.
    pub(crate) fn sleep(
        &self,
        vm: &VirtualArena,
        shards: &Shards,
        plan: &SleepPlan,
    ) -> ResourceResult<Vec<StreamId>> {
        let gpu = &*vm.access.gpu;
        if plan.is_empty() {
            return Err(refused("the plan names no tag"));
        }
        let lender = plan.offload_host();
        if lender.is_some_and(|l| !l.pins_for(gpu)) {
            return Err(ResourceError::ForeignHostBuffer);
        }
        let mut state = self.sleep_lock();
        if state.slumber.is_some() {
            return Err(refused("already asleep: wake first"));
        }
        self.drain(vm, &mut state);
        // Checked first: nothing changes on a refusal. The host memory is
        // pinned with the shards unlocked (`cuMemHostAlloc` takes
        // milliseconds; allocations of every stream go on meanwhile), and
        // the blocks looked up again under the locks.
        let guards: Vec<SlotGuard<'_>> = shards.slots.iter().map(|s| s.lock()).collect();
        let mut blocks = Self::sleeping(guards, plan)?;
        for i in 0..blocks.len() {
            if blocks[i].mode != SleepMode::Offload {
                continue;
            }
            match Offloaded::take(gpu, lender, blocks[i].size.max(1), blocks[i].tag) {
                Ok(h) => blocks[i].host = Some(h),
                Err(e) => {
                    Self::unpin(gpu, &mut blocks);
                    return Err(e);
                }
            }
        }
        let mut guards: Vec<SlotGuard<'_>> = shards.slots.iter().map(|s| s.lock()).collect();
        let again = Self::sleeping_in(&mut guards, plan);
        let same = again.as_ref().is_ok_and(|again| {
            again.len() == blocks.len()
                && again.iter().zip(&blocks).all(|(a, b)| {
                    (a.slot, a.ptr, a.size, a.mode) == (b.slot, b.ptr, b.size, b.mode)
                })
        });
        if !same {
            drop(guards);
            Self::unpin(gpu, &mut blocks);
            again?;
            return Err(refused(
                "the sleeping tags' blocks changed while the sleep pinned host memory: try again",
            ));
        }
        let mut slots: Vec<usize> = blocks.iter().map(|b| b.slot).collect();
        slots.sort_unstable();
        slots.dedup();
        for &slot in &slots {
            let g = &guards[slot];
            let Some(arena) = g.arena.as_ref() else {
                unreachable!("a shard with arena leases opened the arena");
            };
            // SAFETY: the arena's stream is a stream of the tier's pool.
            let status = match unsafe { gpu.capture_status(arena.raw) } {
                Ok(status) => status,
                Err(e) => {
                    drop(guards);
                    Self::unpin(gpu, &mut blocks);
                    return Err(e.into());
                }
            };
            if status.is_capturing() {
                let stream = g.stream;
                drop(guards);
                Self::unpin(gpu, &mut blocks);
                return Err(ResourceError::StreamCapturing {
                    stream,
                    capture: status.id(),
                });
            }
        }
        // The streams' kept blocks go back, so that the page counts name
        // live blocks only.
        for g in guards.iter_mut() {
            if let Some(arena) = g.arena.as_mut() {
                vm.release_kept(arena);
            }
        }
        let mut queued = 0;
        let mut failed = None;
        for b in &blocks {
            match self.queue_offload(vm, &mut guards, b) {
                Ok(()) => queued += 1,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let spans: Vec<(u64, u64)> = match failed {
            None => blocks
                .iter_mut()
                .map(|b| {
                    let Some(m) = mapped_at(&mut guards[b.slot], b.ptr) else {
                        unreachable!("found above under the same locks");
                    };
                    (m.placed.off, m.placed.len)
                })
                .collect(),
            Some(_) => Vec::new(),
        };
        let taken = vm.take_for_sleep(&spans);
        // Fences on the blocks' streams and on those that freed memory on
        // the handles taken: a new fence covers every older free.
        for (_, tags) in &taken {
            slots.extend(tags.iter().filter_map(|t| t.slot()));
        }
        slots.sort_unstable();
        slots.dedup();
        let fenced: ResourceResult<Vec<Freed>> = slots.iter().map(|&slot| vm.fence(slot)).collect();
        let streams = slots.iter().map(|&s| guards[s].stream).collect();
        let (fences, failed) = match (fenced, failed) {
            (Ok(f), None) => (f, None),
            (Ok(f), Some(e)) => (f, Some(e)),
            (Err(e), _) => (Vec::new(), Some(e)),
        };
        if let Some(e) = failed {
            vm.put_back(&taken);
            for (i, b) in blocks.iter_mut().enumerate() {
                let Some(h) = b.host.take() else { continue };
                if i < queued {
                    if fences.is_empty() {
                        tracing::warn!(
                            "a sleep failed with offload copies unfenced; their host memory is leaked"
                        );
                    } else {
                        state.draining.push((fences.clone(), h));
                    }
                } else {
                    // SAFETY: (1) its copy was never queued.
                    unsafe { h.give_up(gpu) };
                }
            }
            return Err(e);
        }
        for b in &blocks {
            if let Some(m) = mapped_at(&mut guards[b.slot], b.ptr) {
                m.asleep = true;
            }
        }
        state.slumber = Some(Slumber {
            blocks,
            taken,
            released: Vec::new(),
            fences,
        });
        Ok(streams)
    }

    /// The live blocks of the tags `plan` names, in the shards `guards`
    /// locked (unlocked on return); refused, nothing changed, when one is
    /// not in the arena or belongs to a captured graph.
    fn sleeping(
        mut guards: Vec<SlotGuard<'_>>,
        plan: &SleepPlan,
    ) -> ResourceResult<Vec<SleptBlock>> {
        Self::sleeping_in(&mut guards, plan)
    }

    /// As [`sleeping`](Self::sleeping), under locks the caller keeps.
    fn sleeping_in(
        guards: &mut [SlotGuard<'_>],
        plan: &SleepPlan,
    ) -> ResourceResult<Vec<SleptBlock>> {
        let mut blocks = Vec::new();
        for (slot, guard) in guards.iter_mut().enumerate() {
            for lease in guard.leases_mut() {
                let tag = match &lease.backing {
                    Backing::Mapped(m) => m.tag,
                    Backing::Inner(block) => block.tag(),
                };
                let Some(mode) = plan.mode_of(tag) else {
                    continue;
                };
                let Backing::Mapped(m) = &lease.backing else {
                    return Err(refused(
                        "a block of a sleeping tag is not in the arena (size classes, or too large)",
                    ));
                };
                if lease.capture.is_some() {
                    return Err(refused(
                        "a block of a sleeping tag belongs to a captured graph",
                    ));
                }
                if m.uses_begun > 0 {
                    return Err(refused(
                        "a block of a sleeping tag has a use begun and not finished (a launch in progress)",
                    ));
                }
                blocks.push(SleptBlock {
                    slot,
                    ptr: m.ptr,
                    size: lease.size,
                    tag: m.tag,
                    mode,
                    host: None,
                });
            }
        }
        Ok(blocks)
    }

    /// Gives up the host memory taken for `blocks`, none of it copied to.
    fn unpin(gpu: &dyn Gpu, blocks: &mut [SleptBlock]) {
        for h in blocks.iter_mut().filter_map(|b| b.host.take()) {
            // SAFETY: (1) no copy was queued on it.
            unsafe { h.give_up(gpu) };
        }
    }

    /// Queues on `b`'s stream the waits for its uses on other streams and,
    /// for an offload, its copy to host.
    fn queue_offload(
        &self,
        vm: &VirtualArena,
        guards: &mut [SlotGuard<'_>],
        b: &SleptBlock,
    ) -> ResourceResult<()> {
        let gpu = &*vm.access.gpu;
        let guard = &mut guards[b.slot];
        let Some(raw) = guard.arena.as_ref().map(|a| a.raw) else {
            unreachable!("checked by the caller");
        };
        let home = guard.stream;
        let Some(m) = mapped_at(guard, b.ptr) else {
            unreachable!("found by the caller under the same locks");
        };
        if let Some(u) = m.uses.as_deref() {
            for (s, event) in u.reads.iter().chain(&u.last_write) {
                if !s.is(home) {
                    // SAFETY: `raw` is a stream of the tier's pool; the
                    // event is one of the lease's uses, from the tier's
                    // event pool.
                    unsafe { gpu.stream_wait_event(raw, *event) }?;
                }
            }
        }
        if let Some(h) = b.host.as_ref().map(|o| o.mem) {
            // SAFETY: (1) `raw` is a live stream of the tier's pool; (2)
            // `b.ptr..+size` is the live lease's range (mapped: it is not
            // asleep yet) and `h` was pinned for it with that size; (3)
            // nobody reads `h` until the copy is seen complete (the sleep
            // owns it until the wake's restore, queued after it on the
            // same stream, or its drain behind the fences).
            unsafe { gpu.copy_to_host_async(h.addr, b.ptr, b.size, raw) }?;
        }
        Ok(())
    }

    /// Gives up the draining host memory whose copies the host saw
    /// complete (back to its lender, or unpinned).
    fn drain(&self, vm: &VirtualArena, state: &mut SleepState) {
        let gpu = &*vm.access.gpu;
        let (done, draining): (Vec<_>, Vec<_>) = std::mem::take(&mut state.draining)
            .into_iter()
            .partition(|(fences, _)| vm.done_with(fences));
        state.draining = draining;
        for (_, h) in done {
            // SAFETY: (1) every copy of it was queued before these fences,
            // which the host saw complete.
            unsafe { h.give_up(gpu) };
        }
    }

    /// Gives the sleeping blocks' memory back to the device once the host
    /// saw the sleep's fences complete (step 2); true when nothing is left
    /// to give back (or no sleep is in effect).
    pub(crate) fn settle(&self, vm: &VirtualArena) -> ResourceResult<bool> {
        let mut state = self.sleep_lock();
        self.drain(vm, &mut state);
        let Some(s) = state.slumber.as_mut() else {
            return Ok(true);
        };
        if s.taken.is_empty() {
            return Ok(true);
        }
        if !vm.done_with(&s.fences) {
            return Ok(false);
        }
        while let Some((h, tags)) = s.taken.pop() {
            if let Err(e) = vm.release_asleep(h) {
                s.taken.push((h, tags));
                return Err(e);
            }
            s.released.push((h.first, h.pages));
        }
        Ok(true)
    }

    /// Waits, parking the thread, for the fences of the sleep in effect
    /// (the blocking [`CachingResource::sleep`](crate::CachingResource::sleep)).
    pub(crate) fn wait(&self, vm: &VirtualArena) -> ResourceResult<()> {
        let fences = match &self.sleep_lock().slumber {
            Some(s) => s.fences.clone(),
            None => return Ok(()),
        };
        vm.wait_for(&fences)
    }

    /// Wakes the sleep in effect (step 3); returns the streams the
    /// restores were queued on.
    pub(crate) fn wake(&self, vm: &VirtualArena, shards: &Shards) -> ResourceResult<Vec<StreamId>> {
        let gpu = &*vm.access.gpu;
        let mut state = self.sleep_lock();
        let Some(mut s) = state.slumber.take() else {
            return Err(refused("not asleep"));
        };
        // Where memory was unmapped: a checking backend forgot the blocks
        // there, and hears of them again at their restore.
        let page = vm.page() as u64;
        let unmapped: Vec<(u64, u64)> = s
            .released
            .iter()
            .map(|&(first, pages)| (u64::from(first) * page, u64::from(pages) * page))
            .collect();
        // Not unmapped yet: mapped again as they are.
        vm.put_back(&s.taken);
        s.taken.clear();
        while let Some(&(first, pages)) = s.released.last() {
            if let Err(e) = vm.wake_run(first, pages) {
                state.slumber = Some(s);
                return Err(e);
            }
            s.released.pop();
        }
        let mut guards: Vec<SlotGuard<'_>> = shards.slots.iter().map(|s| s.lock()).collect();
        let mut slots = Vec::new();
        let mut hosts = Vec::new();
        let mut result = Ok(());
        while let Some(b) = s.blocks.pop() {
            match self.restore(gpu, &mut guards[b.slot], &b, &unmapped) {
                Ok(queued) => {
                    if queued {
                        slots.push(b.slot);
                    }
                    if let Some(h) = b.host {
                        hosts.push((b.slot, h, queued));
                    }
                }
                Err(e) => {
                    s.blocks.push(b);
                    result = Err(e);
                    break;
                }
            }
        }
        slots.sort_unstable();
        slots.dedup();
        let mut fences = Vec::new();
        for &slot in &slots {
            match vm.fence(slot) {
                Ok(f) => fences.push(f),
                Err(e) => tracing::warn!(error = %e, "a wake could not fence its restores"),
            }
        }
        // Each host block waits for the sleep's fences (its offload copy)
        // and, when a copy back was queued, for its stream's new fence.
        for (slot, h, queued) in hosts {
            let mut tags = s.fences.clone();
            if queued {
                match fences.iter().find(|f| f.slot() == Some(slot)) {
                    Some(&f) => tags.push(f),
                    None => {
                        tracing::warn!(
                            "a restore copy could not be fenced; its host memory is leaked"
                        );
                        continue;
                    }
                }
            }
            state.draining.push((tags, h));
        }
        let streams = slots.iter().map(|&i| guards[i].stream).collect();
        drop(guards);
        if result.is_err() {
            s.released.clear();
            state.slumber = Some(s);
        }
        result.map(|()| streams)
    }

    /// Queues the restore of one sleeping block and wakes it; true when a
    /// copy or fill was queued. A block freed while asleep is skipped.
    fn restore(
        &self,
        gpu: &dyn Gpu,
        guard: &mut SlotGuard<'_>,
        b: &SleptBlock,
        unmapped: &[(u64, u64)],
    ) -> ResourceResult<bool> {
        let Some(raw) = guard.arena.as_ref().map(|a| a.raw) else {
            return Ok(false);
        };
        let Some(m) = mapped_at(guard, b.ptr).filter(|m| m.asleep) else {
            return Ok(false);
        };
        let (off, len) = (m.placed.off, m.placed.len);
        if unmapped
            .iter()
            .any(|&(at, n)| off < at + n && at < off + len)
        {
            gpu.note_suballocation(b.ptr, b.size.max(1), raw);
        }
        let queued = match (b.mode, b.host.as_ref().map(|o| o.mem)) {
            (SleepMode::Offload, Some(h)) => {
                // SAFETY: (1) `raw` is a live stream of the tier's pool;
                // (2) the lease's range, mapped again by this wake, and `h`
                // pinned for it with its size; (3) nobody writes `h`: the
                // sleep owns it until this copy is seen complete.
                unsafe { gpu.copy_to_device_async(b.ptr, h.addr, b.size, raw) }?;
                true
            }
            (SleepMode::Zero, _) => {
                // SAFETY: (1) as above; (2) the lease's range, mapped.
                unsafe { gpu.memset_async(b.ptr, 0, b.size, raw) }?;
                true
            }
            _ => false,
        };
        m.asleep = false;
        if queued {
            // The restore is a write on the block's stream: a use elsewhere
            // waits for it as for any use there.
            m.home_unrecorded = Some(Access::Write);
        }
        Ok(queued)
    }

    /// At the cache's drop: waits for the sleep's work, and gives up what
    /// it holds (pages unmapped stay without memory; host memory is freed).
    pub(crate) fn close(&self, vm: &VirtualArena) {
        let gpu = &*vm.access.gpu;
        let mut state = self.sleep_lock();
        let mut wait: Vec<Freed> = state.draining.iter().flat_map(|(f, _)| f.clone()).collect();
        if let Some(s) = &state.slumber {
            wait.extend(s.fences.iter().copied());
        }
        if let Err(e) = vm.wait_for(&wait) {
            tracing::warn!(error = %e, "waiting for a sleep's copies failed; host memory leaked");
            return;
        }
        if let Some(s) = state.slumber.take() {
            vm.put_back(&s.taken);
            for (first, pages) in s.released {
                vm.forget_run(first, pages);
            }
            for h in s.blocks.into_iter().filter_map(|b| b.host) {
                // SAFETY: (1) its copy completed: the fences were waited
                // for above.
                unsafe { h.give_up(gpu) };
            }
        }
        for (_, h) in state.draining.drain(..) {
            // SAFETY: as above.
            unsafe { h.give_up(gpu) };
        }
    }
}
