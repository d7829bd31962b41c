//! The virtual-memory tier of the cache: one reserved address range per
//! stream, placed by an [`Arena`], backed by physical memory mapped where a
//! live block needs it, and given back to the device when idle.
//!
//! # State
//!
//! - Per stream, in its shard ([`StreamArena`]): the reserved range, its
//!   [`Arena`] (which addresses are free), its [`PageTable`] (which pages
//!   are mapped, which mappings are idle) and its [`Fences`] (which frees
//!   the GPU is done with).
//! - Shared ([`VmTier`]): the device, the page size, and three counters:
//!   physical bytes held (what the device gave the cache: what
//!   `bytes_outstanding` and a budget above see), live bytes, and the
//!   high-water mark of live bytes.
//!
//! # Who changes it
//!
//! An allocation on stream `S` places the block in `S`'s arena. Pages it
//! touches that are mapped are used as they are, with no driver call.
//! When some are not, a larger free range of `S`'s arena with memory
//! behind every page serves instead (`S`'s own frees need no fence). Else
//! memory another stream freed is **lent**: a free range of another arena
//! (a `try_lock` only) with memory behind every page serves the block where
//! it is, with no driver call but events: at once when a fence recorded on
//! that stream after the range's last free has completed (queried, never
//! waited for), else behind a wait of `S` on the GPU for that fence; the
//! lease remembers its home arena.
//! Otherwise the pages that are not mapped get new physical memory, one handle per run of
//! pages (so a 40 MiB block costs one `cuMemCreate`, one `cuMemMap` and one
//! `cuMemSetAccess`, not twenty of each). Before creating memory that would
//! take the cache past `slack` over the live high-water mark, idle
//! mappings the GPU is done with (their fence completed, learnt by a
//! query) are unmapped and released, the stream's own first, then other
//! streams' (a `try_lock` only, so two streams doing this cannot
//! deadlock). A free puts the block's range back in the arena and leaves
//! pages no live block touches idle but mapped: the next allocation on
//! that stream that lands there needs no driver call.
//!
//! # Stream ordering
//!
//! - A range freed on `S` is reused at once on `S`: it is in `S`'s arena
//!   only, and stream order puts the new user after the old one.
//! - A range of `S`'s arena is lent to another stream `T` behind a fence
//!   recorded on `S` after the range's last free (every free range keeps
//!   the stamp of its newest free): once the fence has completed (learnt
//!   by a query), `T` uses it at once; before, `T` waits for the fence's
//!   event on the GPU (`cuStreamWaitEvent`: no host wait). Either way no
//!   work queued on `S` before the free can overlap `T`'s. Its free on `T`
//!   records an event there that `S` waits on before the range goes back
//!   to `S`'s arena, so `S` reuses it after `T`'s work, and any fence on
//!   `S` after that covers `T`'s work too. A capturing stream never
//!   borrows (its wait on an outside event would invalidate the capture).
//! - Memory moves to another stream through the device otherwise: a mapping
//!   is unmapped only once a fence recorded on `S` after the last free on
//!   it has completed (queried, never waited for, except as the last
//!   resort before out of memory), so no queued work can touch it, and new
//!   physical memory is mapped where the other stream needs it.
//! - Uses of a block on other streams are recorded with events (the same
//!   per-stream read events and last write as the resource keeps); the
//!   free makes `S` wait for them before the range goes back to the arena.
//!
//! # Failure
//!
//! A failed driver call while backing a block gives the range back to the
//! arena and reports the error; memory mapped for it before the failure
//! stays as idle mappings (given back by the next trim, or when memory is
//! short).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::arena::{Arena, Placed};
use super::fences::Fences;
use super::pages::{Handle, PageTable};
use crate::error::ResourceResult;
use crate::gpu::{Gpu, GpuError, RawStream};
use crate::resource::DeviceAccess;
use crate::types::StreamId;

/// One stream's arena: guarded by its shard's lock.
#[derive(Debug)]
pub(crate) struct StreamArena {
    pub(crate) base: u64,
    len: u64,
    pub(crate) raw: RawStream,
    pub(crate) arena: Arena,
    pub(crate) pages: PageTable,
    pub(crate) fences: Fences,
    /// The block freed last, not yet given back to the arena: an
    /// allocation of the same rounded size right after takes it as it is
    /// (the allocate/free loop costs no placement at all), and any other
    /// call on the arena gives it back first, so it never keeps memory
    /// from an allocation that needs it.
    recent: Option<Placed>,
}

/// Where [`VmTier::alloc`] placed a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// In the stream's own arena.
    Own(Placed),
    /// Lent by the arena of slot `home`, at `ptr`: mapped memory that
    /// stream's last frees left and the GPU is done with. Its free goes
    /// back there behind an event on the borrowing stream that `home_raw`
    /// waits on.
    Lent {
        home: usize,
        home_raw: RawStream,
        placed: Placed,
        ptr: u64,
    },
}

/// What the tier shares between streams.
#[derive(Debug)]
pub(crate) struct VmTier {
    pub(crate) access: DeviceAccess,
    page: u64,
    arena_len: u64,
    max_run_pages: u32,
    slack_percent: usize,
    /// Whether the backend makes events: a lent range goes back to its
    /// home arena behind one, so a backend without them lends nothing.
    lends: bool,
    held: AtomicUsize,
    /// The highest sum of the streams' live bytes seen where memory was
    /// wanted (live bytes are kept per stream, so that the hot path
    /// touches no shared counter; a peak between two such moments was
    /// covered by memory held already).
    live_peak: AtomicUsize,
}

/// Something that can lend the tier another stream's arena for a moment
/// (the cache's shards, through `try_lock`).
pub(crate) trait OtherArenas {
    /// Calls `f` on each other stream's arena that is not locked now, with
    /// the index of its slot, until `f` returns true.
    fn each_other(&self, f: &mut dyn FnMut(usize, &mut StreamArena) -> bool);

    /// Bytes users hold in every stream's arena, this one included.
    fn live_total(&self) -> usize;
}

impl VmTier {
    /// A tier over `access`, or `None` when the device has no virtual memory
    /// management.
    pub(crate) fn new(
        access: DeviceAccess,
        page_multiple: usize,
        max_run_bytes: usize,
        slack_percent: usize,
    ) -> Option<Self> {
        let granularity = access.gpu.vm_granularity().ok()?.max(1);
        let page = (granularity * page_multiple.max(1)) as u64;
        // Capped, so that a backend reporting no limit (a null backend)
        // does not get a page table the size of its claim.
        let total = (access.gpu.mem_info().ok()?.1 as u64).min(256 << 30);
        // Twice the device, so that scattered free ranges never run the
        // arena out of addresses before the device runs out of memory.
        let arena_len = (2 * total.max(page)).next_multiple_of(page);
        let lends = match access.gpu.event_create() {
            // SAFETY: the event was just made on this backend, and nothing
            // else has it.
            Ok(event) => unsafe { access.gpu.event_destroy(event) }.is_ok(),
            Err(_) => false,
        };
        Some(VmTier {
            access,
            page,
            arena_len,
            max_run_pages: (max_run_bytes as u64 / page).clamp(1, u32::MAX as u64) as u32,
            slack_percent,
            lends,
            held: AtomicUsize::new(0),
            live_peak: AtomicUsize::new(0),
        })
    }

    fn gpu(&self) -> &dyn Gpu {
        &*self.access.gpu
    }

    /// Physical bytes the tier holds.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The page size.
    pub(crate) fn page(&self) -> usize {
        self.page as usize
    }

    /// Reserves the arena of `stream`.
    pub(crate) fn open(&self, stream: StreamId) -> ResourceResult<StreamArena> {
        let raw = self.access.streams.raw(stream)?;
        let base = self
            .gpu()
            .address_reserve(self.arena_len as usize)
            .map_err(|e| e.for_request(0, stream))?;
        Ok(StreamArena {
            base,
            len: self.arena_len,
            raw,
            arena: Arena::new(self.arena_len),
            pages: PageTable::new(self.arena_len, self.page),
            fences: Fences::default(),
            recent: None,
        })
    }

    /// Places and backs `bytes` (already rounded) on `sa`'s stream. `None`
    /// when the arena has no room (the caller falls back).
    ///
    /// When the block would need new memory and `may_borrow` (not in a
    /// capture), mapped memory idle in another stream's arena is lent
    /// first ([`borrow`](Self::borrow)): no driver call but event queries.
    pub(crate) fn alloc(
        &self,
        sa: &mut StreamArena,
        len: u64,
        requested: usize,
        stream: StreamId,
        others: &dyn OtherArenas,
        may_borrow: bool,
    ) -> ResourceResult<Option<Taken>> {
        if let Some(recent) = sa.recent {
            if recent.len == len {
                sa.recent = None;
                self.gpu()
                    .note_suballocation(sa.base + recent.off, requested.max(1), sa.raw);
                return Ok(Some(Taken::Own(recent)));
            }
            self.flush_recent(sa);
        }
        let pages = &sa.pages;
        let Some(mut placed) = sa.arena.alloc(len, |off| pages.backed(off)) else {
            return Ok(None);
        };
        if !sa.pages.all_backed(placed.off, placed.len) {
            // The good fit needs new memory: a larger free range of this
            // arena that has memory behind it serves first (the stream's own
            // frees need no fence).
            let pages = &sa.pages;
            let window = |start, end, len| pages.backed_window(start, end, len);
            if let Some(backed) = sa.arena.lend(len, window) {
                sa.arena.free(placed, 0);
                placed = backed;
            }
        }
        if may_borrow && self.lends && !sa.pages.all_backed(placed.off, placed.len) {
            // The block would grow the arena: memory another stream left
            // idle serves it as it is, if some is (the placement is undone
            // untouched, as if never made).
            if let Some(lent) = self.borrow(len, requested, sa.raw, others) {
                sa.arena.free(placed, 0);
                return Ok(Some(lent));
            }
        }
        let unbacked = sa.pages.touch(placed.off, placed.len);
        let live = (!unbacked.is_empty()).then(|| others.live_total());
        for &(first, count) in &unbacked {
            let mut at = first;
            while at < first + count {
                let n = (first + count - at).min(self.max_run_pages);
                if let Err(e) = self.back(sa, at, n, live.unwrap_or(0), stream, others) {
                    let stamp = sa.fences.next_stamp();
                    sa.pages.untouch_failed(placed.off, placed.len, stamp);
                    sa.arena.free(placed, stamp);
                    return Err(e);
                }
                at += n;
            }
        }
        if let Some(live) = live {
            self.live_peak.fetch_max(live, Ordering::AcqRel);
        }
        self.gpu()
            .note_suballocation(sa.base + placed.off, requested.max(1), sa.raw);
        Ok(Some(Taken::Own(placed)))
    }

    /// Lends `len` bytes of another stream's arena to the stream `raw`: a
    /// free range there with memory behind every page it covers (pages
    /// live blocks share included). When the GPU may still use it on the
    /// home stream (no completed fence past its last free, learnt by a
    /// query after recording one if needed), `raw` waits on the GPU for
    /// that fence, so the borrower's work starts after every use queued
    /// before the free, and no host thread waits. Arenas that are locked
    /// now are skipped.
    fn borrow(
        &self,
        len: u64,
        requested: usize,
        raw: RawStream,
        others: &dyn OtherArenas,
    ) -> Option<Taken> {
        let gpu = self.gpu();
        let mut lent = None;
        others.each_other(&mut |home, h| {
            if h.pages.mapped_bytes() < len as usize {
                return false;
            }
            let StreamArena {
                arena,
                pages,
                fences,
                ..
            } = h;
            let usable = |start, end, len| pages.backed_window(start, end, len);
            let Some(placed) = arena.lend(len, usable) else {
                return false;
            };
            let freed = arena.freed(placed);
            let mut done = fences.poll(gpu).unwrap_or(fences.done());
            if freed > done {
                // A fence over the free, queried at once: a stream with
                // nothing queued has run past it already.
                let _ = fences.cover(gpu, h.raw, freed);
                done = fences.poll(gpu).unwrap_or(done);
            }
            if freed > done {
                // The GPU may still use the range on the home stream: the
                // borrower waits, on the GPU, for the fence.
                // SAFETY: `raw` is a stream of the tier's device pool (the
                // borrowing arena's), the event a live fence of the tier's
                // backend (destroyed only with its arena).
                let waited = fences
                    .covering(freed)
                    .is_some_and(|e| unsafe { gpu.stream_wait_event(raw, e) }.is_ok());
                if !waited {
                    arena.free(placed, 0);
                    return false;
                }
            }
            let unbacked = h.pages.touch(placed.off, placed.len);
            debug_assert!(unbacked.is_empty(), "a lent range is mapped");
            let ptr = h.base + placed.off;
            gpu.note_suballocation(ptr, requested.max(1), raw);
            lent = Some(Taken::Lent {
                home,
                home_raw: h.raw,
                placed,
                ptr,
            });
            true
        });
        lent
    }

    /// Gives back the block at `placed`, freed at the current end of the
    /// stream (after the waits for its uses elsewhere were queued).
    pub(crate) fn free(&self, sa: &mut StreamArena, placed: Placed) {
        self.gpu().note_subfree(sa.base + placed.off, sa.raw);
        if let Some(previous) = sa.recent.replace(placed) {
            Self::give_to_arena(sa, previous);
        }
    }

    /// Tells a checking backend that the range at `placed`, taken out of a
    /// graph's pool, holds a new allocation of `requested` bytes on the
    /// arena's stream (as [`alloc`](Self::alloc) does for a placement).
    pub(crate) fn note_reuse(&self, sa: &StreamArena, placed: Placed, requested: usize) {
        self.gpu()
            .note_suballocation(sa.base + placed.off, requested.max(1), sa.raw);
    }

    /// Tells a checking backend that the block at `placed` is freed at the
    /// current end of the arena's stream, without giving the range back (a
    /// graph's pool keeps it).
    pub(crate) fn note_free(&self, sa: &StreamArena, placed: Placed) {
        self.gpu().note_subfree(sa.base + placed.off, sa.raw);
    }

    /// Gives back to the arena a range a graph's pool kept (its free was
    /// noted already), as freed at the current end of the stream.
    pub(crate) fn return_range(&self, sa: &mut StreamArena, placed: Placed) {
        Self::give_to_arena(sa, placed);
    }

    /// Gives the block kept as `recent` back to the arena.
    pub(crate) fn flush_recent(&self, sa: &mut StreamArena) {
        if let Some(recent) = sa.recent.take() {
            Self::give_to_arena(sa, recent);
        }
    }

    /// The range goes back to the arena; pages it leaves untouched go idle,
    /// stamped with this free (queued after the block's last use, so a
    /// fence after the stamp covers it).
    fn give_to_arena(sa: &mut StreamArena, placed: Placed) {
        let stamp = sa.fences.next_stamp();
        sa.pages.untouch(placed.off, placed.len, stamp);
        sa.arena.free(placed, stamp);
    }

    /// The most the tier means to hold: `slack` over the live high-water
    /// mark (counting `live`, the live bytes with the block being backed),
    /// and never less than one page.
    fn target(&self, live: usize) -> usize {
        let peak = self.live_peak.load(Ordering::Acquire).max(live);
        (peak + peak / 100 * self.slack_percent).max(self.page as usize)
    }

    /// Maps new memory over pages `first..first + n` of `sa`.
    fn back(
        &self,
        sa: &mut StreamArena,
        first: u32,
        n: u32,
        live: usize,
        stream: StreamId,
        others: &dyn OtherArenas,
    ) -> ResourceResult<()> {
        let need = n as usize * self.page as usize;
        if self.held() + need > self.target(live) {
            self.reclaim(sa, others, |tier| tier.held() + need <= tier.target(live));
        }
        // Map ahead, up to the target: the free pages right after the block,
        // where the next block placed at the end of the arena lands. A
        // growth costs about 60 µs on the H200 whatever its size
        // (`notes/vmm-costs.md`), so a workload that keeps growing grows in
        // geometric steps of up to `slack` of what is live: about
        // ln(peak / start) / ln(1 + slack) growths in all, instead of one
        // per block. The target bounds what this adds to the peak held:
        // `slack` over the live high-water mark, which the memory held at
        // any time already may reach.
        let room = self.target(live).saturating_sub(self.held() + need) / self.page as usize;
        let ahead_max =
            (room.min(u32::MAX as usize) as u32).min(self.max_run_pages.saturating_sub(n));
        let ahead = sa.pages.free_unbacked_from(first + n, ahead_max);
        let (handle, n) = match self
            .gpu()
            .mem_create(need + ahead as usize * self.page as usize)
        {
            Ok(h) => (h, n + ahead),
            // Short of memory: what the block needs, nothing ahead.
            Err(GpuError::OutOfMemory { .. }) => match self.gpu().mem_create(need) {
                Ok(h) => (h, n),
                Err(GpuError::OutOfMemory { .. }) => {
                    (self.create_when_short(sa, need, stream, others)?, n)
                }
                Err(e) => return Err(e.for_request(need, stream)),
            },
            Err(e) => return Err(e.for_request(need, stream)),
        };
        let bytes = n as usize * self.page as usize;
        let addr = sa.base + u64::from(first) * self.page;
        // SAFETY: (1) `sa.base..sa.base + sa.len` is a live reservation: `open`
        // got it from `address_reserve` of this tier's backend and only
        // `close`, when the cache is dropped, frees it; pages are
        // granularity-sized (`page` is a multiple of `vm_granularity`) and
        // `first + n` stays inside the arena's page table, so the range is
        // aligned and inside it. (2) pages `first..first + n` are a run that
        // `touch` found with no handle, extended by `free_unbacked_from`
        // only over pages with none, and the table's handles are exactly
        // the live mappings (`map` records each, `take_idle` drops one
        // before it is unmapped). (3) `handle` was created just above, with
        // the `n` pages chosen beside it, so of exactly `bytes`, and not
        // released.
        let mapped = unsafe { self.gpu().mem_map(addr, bytes, handle) }.and_then(|()| {
            // SAFETY: (1) the range lies in `sa`'s live reservation (as
            // above) and is exactly the mapping just made.
            let access = unsafe { self.gpu().mem_set_access(addr, bytes) };
            if access.is_err() {
                // SAFETY: (1) exactly the mapping just made, in the live
                // reservation; (2) idle: no block was handed out over it,
                // so no work was queued on it; (3) nothing records it.
                let _ = unsafe { self.gpu().mem_unmap(addr, bytes) };
            }
            access
        });
        if let Err(e) = mapped {
            // SAFETY: (1) `handle` was created above and not released;
            // (2) it is dropped here, never mapped again (the page table
            // never saw it).
            let _ = unsafe { self.gpu().mem_release(handle) };
            return Err(e.for_request(bytes, stream));
        }
        sa.pages.map(first, n, handle);
        self.held.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }

    /// `mem_create` failed for lack of memory: gives back every idle
    /// mapping the GPU is done with, then (the last resort, and never
    /// inside a poll) waits for the fences in flight and gives back the
    /// rest, retrying after each.
    fn create_when_short(
        &self,
        sa: &mut StreamArena,
        bytes: usize,
        stream: StreamId,
        others: &dyn OtherArenas,
    ) -> ResourceResult<crate::gpu::RawPhysical> {
        let gpu = self.gpu();
        let mut last = GpuError::OutOfMemory { available: 0 };
        // Waiting parks the thread: never inside a poll of the crate's
        // futures (their allocation waits are woken by frees instead).
        let waits: &[bool] = if crate::poll_scope::in_poll() {
            &[false]
        } else {
            &[false, true]
        };
        for &wait in waits {
            let released = self.reclaim_all(sa, others, wait);
            tracing::debug!(
                released,
                bytes,
                wait,
                "out of memory: gave idle mappings back"
            );
            match gpu.mem_create(bytes) {
                Ok(h) => return Ok(h),
                Err(e @ GpuError::OutOfMemory { .. }) => last = e,
                Err(e) => return Err(e.for_request(bytes, stream)),
            }
        }
        Err(last.for_request(bytes, stream))
    }

    /// Gives back idle mappings of `sa`, then of other streams, that the
    /// GPU is done with, until `enough` holds. Fences are recorded where
    /// idle mappings are not covered yet, so that a later call finds them.
    fn reclaim(
        &self,
        sa: &mut StreamArena,
        others: &dyn OtherArenas,
        enough: impl Fn(&Self) -> bool,
    ) {
        if self.reclaim_from(sa, &enough) {
            return;
        }
        others.each_other(&mut |_, other| self.reclaim_from(other, &enough));
    }

    /// From one arena; true once `enough` holds.
    fn reclaim_from(&self, sa: &mut StreamArena, enough: &dyn Fn(&Self) -> bool) -> bool {
        self.flush_recent(sa);
        if sa.pages.idle_bytes() == 0 {
            return enough(self);
        }
        let gpu = self.gpu();
        let done = sa.fences.poll(gpu).unwrap_or(sa.fences.done());
        while !enough(self) {
            let Some(h) = sa.pages.take_idle(done) else {
                break;
            };
            self.give_back(sa, h);
        }
        if !enough(self) {
            // Ask for a fence over what stays idle, for the next time.
            let _ = sa.fences.cover(gpu, sa.raw, sa.pages.newest_idle_stamp());
        }
        enough(self)
    }

    /// Unmaps and releases one idle handle the GPU is done with.
    fn give_back(&self, sa: &mut StreamArena, h: Handle) {
        let gpu = self.gpu();
        let addr = sa.base + u64::from(h.first) * self.page;
        let bytes = h.pages as usize * self.page as usize;
        // SAFETY: (1) the page table's handle `h` is the one mapping of
        // pages `h.first..h.first + h.pages` of `sa`'s reservation, which is
        // live until `close`; (2) idle: `take_idle` returned it only because
        // no live block touches its pages and its idle stamp is covered by a
        // fence on this arena's stream that has completed (every free on
        // the pages was queued on that stream before the fence); (3)
        // `take_idle` took it out of the table, so no block is placed on
        // these pages until they are mapped again.
        if let Err(e) = unsafe { gpu.mem_unmap(addr, bytes) } {
            tracing::warn!(error = %e, "unmapping an idle mapping failed; kept");
            sa.pages.restore(h);
            return;
        }
        // SAFETY: (1) `h.raw` came from `mem_create` and the page table held
        // it until `take_idle` gave it up here, so it is live and released
        // exactly once; (2) it is not restored (only a failed unmap
        // restores), so it is never mapped again.
        if let Err(e) = unsafe { gpu.mem_release(h.raw) } {
            tracing::warn!(error = %e, "releasing physical memory failed; leaked");
        }
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Gives back every idle mapping the GPU is done with, in every arena
    /// (waiting for the fences in flight first when `wait`); returns the
    /// bytes given back.
    pub(crate) fn reclaim_all(
        &self,
        sa: &mut StreamArena,
        others: &dyn OtherArenas,
        wait: bool,
    ) -> usize {
        let before = self.held();
        let mut one = |_, a: &mut StreamArena| {
            self.flush_recent(a);
            if a.pages.idle_bytes() > 0 {
                let gpu = self.gpu();
                let _ = a.fences.cover(gpu, a.raw, a.pages.newest_idle_stamp());
                if wait {
                    let _ = a.fences.wait_all(gpu);
                }
                self.reclaim_from(a, &|_| false);
            }
            false
        };
        one(usize::MAX, sa);
        others.each_other(&mut one);
        before.saturating_sub(self.held())
    }

    /// Gives back the idle mappings of `sa` the GPU is done with, and
    /// records a fence over the others (the cache's cap was passed).
    pub(crate) fn trim_arena(&self, sa: &mut StreamArena) {
        self.reclaim_from(sa, &|_| false);
    }

    /// Gives back everything of an arena no block uses any more, waiting
    /// for the GPU first, and the reservation too when nothing is live in
    /// it; returns whether the reservation went.
    pub(crate) fn close(&self, sa: &mut StreamArena) -> bool {
        self.flush_recent(sa);
        let gpu = self.gpu();
        let _ = sa.fences.cover(gpu, sa.raw, sa.pages.newest_idle_stamp());
        let _ = sa.fences.wait_all(gpu);
        self.reclaim_from(sa, &|_| false);
        sa.fences.destroy(gpu);
        if sa.pages.mapped_bytes() > 0 {
            return false;
        }
        // SAFETY: (1) `sa.base`, `sa.len` are exactly what `open` asked of
        // `address_reserve` and got; `close` runs once, from the cache's
        // drop (`close_mapped`), so the reservation is live and never used
        // after; (2) the page table has no mapped page left, and its handles
        // are exactly the mappings made in the arena.
        unsafe { gpu.address_free(sa.base, sa.len as usize) }.is_ok()
    }
}
