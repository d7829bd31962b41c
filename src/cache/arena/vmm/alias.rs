//! Moving memory: where new memory would take the tier past its target
//! by [`ALIAS_MIN_PAGES`] pages or more, the block's pages past it are
//! backed by whole physical handles lying in free ranges no block
//! touches, mapped again where the block lies
//! ([`VirtualArena::alias_unbacked`]); their old addresses leave the
//! arena (dead pages) until every mapping of that memory is idle and
//! given back together (`reclaim.rs`). Called by `alloc.rs` outside a
//! capture, with [`CacheConfig::move_memory`](crate::CacheConfig::move_memory)
//! on; all or nothing, with the tier's lock held across the driver calls
//! (so no give-back takes the memory being mapped again).
//!
//! # Stream ordering
//!
//! A move is a reuse of the range the memory comes from, under the same
//! rule as a placement there: the stream's own frees and clean ranges
//! serve as they are; another stream's once the block's stream is ordered
//! after the free ([`order_after`](VirtualArena::order_after)) before
//! any of it moves. Which holes move depends on the host's calls only;
//! the rest of an end page the block covers in part takes the moved
//! memory's tags ([`tag_end_pages`](VirtualArena::tag_end_pages)).

// Unsafe here: the maps and unmaps of memory moved to a new address.
#![allow(unsafe_code)]

use super::super::freed::Freed;
use super::super::placement::Placed;
use super::place::AsIs;
use super::shared::SharedArena;
use super::{StreamSlot, VirtualArena};
use crate::cache::config::CrossStreamReuse;

/// Pages of new memory past the target a block must need, at least,
/// before it takes memory mapped elsewhere instead (an alias, see
/// [`VirtualArena::alias_unbacked`]): 64 MiB on 2 MiB pages. Holes are
/// where the next blocks of a steady state land as they are (placement
/// prefers memory mapped already); a block that takes them by aliasing
/// makes those blocks grow instead. Measured (`notes/fragmentation-floors.md`):
/// from 8 pages the four-stream Llama trace held 1.14× (1.09× without),
/// from 16 the eight-stream churn of `trace_unseen.rs`'s seed 17 1.205×
/// (1.171×, though seed 14 went 1.168× → 1.149× and a ResNet cut 1.053×
/// → 1.015×); from 32 no trace but the sawtooth moves.
pub(super) const ALIAS_MIN_PAGES: u32 = 32;

/// Pages one part of an alias maps on average, at least: an alias of `n`
/// pages makes at most `n / ALIAS_PART_PAGES` `cuMemMap` calls. Each part
/// costs a map and one more handle in its run's `cuMemSetAccess` (about
/// 4 + 25 µs on the H200, `notes/vmm-costs.md`), where a growth costs
/// about 55 µs whatever its size (and its memory a give-back later): so
/// moving memory costs at most ~2 µs per MiB, and memory in crumbs stays
/// where it is.
const ALIAS_PART_PAGES: u32 = 8;

/// Runs of pages, `(first, count)`, in order.
type Runs = Vec<(u32, u32)>;

/// Splits runs of pages into those before the last `pages` pages and
/// those last pages, each in order.
fn split_last(runs: Runs, pages: u32) -> (Runs, Runs) {
    let (mut front, mut back) = (Vec::new(), Vec::new());
    let mut left = pages;
    for (first, n) in runs.into_iter().rev() {
        let take = n.min(left);
        if take > 0 {
            back.push((first + n - take, take));
        }
        if take < n {
            front.push((first, n - take));
        }
        left -= take;
    }
    front.reverse();
    back.reverse();
    (front, back)
}

/// What [`VirtualArena::alias_unbacked`] did.
#[derive(Debug)]
pub(super) struct Moved {
    /// The runs of pages still without memory (for a growth).
    pub(super) unbacked: Vec<(u32, u32)>,
    /// Whether memory another stream freed was moved.
    pub(super) lent: bool,
    /// Waits on the GPU queued for that memory.
    pub(super) waits: u32,
}

impl Moved {
    /// Nothing moved, no wait queued.
    fn none(unbacked: Vec<(u32, u32)>) -> Self {
        Self {
            unbacked,
            lent: false,
            waits: 0,
        }
    }
}

impl VirtualArena {
    /// Backs the last pages of a block's runs with no memory (`runs`,
    /// pending: the block's), those new memory would take the tier past
    /// its target (counting `live`), by memory mapped elsewhere that no
    /// block uses, mapped again here; returns the runs, or the parts of
    /// them, still without memory (for a growth: up to the target, and
    /// what could not be moved).
    ///
    /// Memory held at the target while memory no block touches would
    /// cover the block is memory in the wrong places, not too little:
    /// moving it keeps the tier at its target where a growth would pass
    /// it. Up to the target a growth serves: a workload still growing
    /// needs the memory anyway, and its holes are where its next blocks
    /// land as they are (on a ResNet training cut, moving the whole block
    /// of 16 pages or more whenever new memory would pass the target held
    /// 1.070× where growing held 1.053×; `notes/fragmentation-floors.md`).
    ///
    /// The memory is whole physical handles, each mapped once and lying
    /// whole in a free range (so no live or kept block touches it; the
    /// driver maps a handle only from offset 0), in free ranges the stream
    /// may use as they are: its own frees (stream order puts the block's
    /// work after every use before them) and clean ranges (no queued work
    /// touches them), and under [`CrossStreamReuse::Done`] another
    /// stream's frees a fence seen complete covers (the host saw the GPU
    /// done with them), as that mode's placement uses them; the longest
    /// handle that fits what is left of a run first, and every page past
    /// the target covered or nothing moved (a block part moved and part
    /// grown pays for both). Then other streams' frees (by default, not
    /// under `Done`), the block's stream ordered after each first by
    /// [`order_after`](Self::order_after) (no wait where the host saw the
    /// work before the free done, else a wait on the GPU for a fence right
    /// after the free). The memory is the same, only its address changes,
    /// so this is the same ordering as any reuse of those ranges; which
    /// pieces move depends on the host's calls only, never on whether a
    /// fence has completed. (With parts of handles, which the driver
    /// refuses, taking other streams' holes whole blocks at a time held
    /// 1.26× on the eight-stream churn, and every page past the target
    /// 1.07×: `notes/fragmentation-floors.md`.) Nothing is done when
    /// fewer than [`ALIAS_MIN_PAGES`] pages are past the target, or the
    /// memory would come in parts of fewer than [`ALIAS_PART_PAGES`] pages
    /// on average.
    ///
    /// The old pages go dead
    /// ([`PageTable::kill`](super::super::pages::PageTable::kill)): their
    /// range leaves the arena (held as a placement) and their mapping
    /// stays until all of its handle's mappings are idle and given back
    /// together (`cuMemUnmap` cannot unmap part of a mapping, and the driver
    /// releases memory only once its last mapping is unmapped). Held
    /// memory does not change: the handle counts once.
    ///
    /// Costs one `cuMemMap` a part and one `cuMemSetAccess` a run, made
    /// with the tier's lock held (as reclaim does): they replace a growth
    /// (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), or a give-back and a
    /// growth where a growth behind had idle memory to give.
    pub(super) fn alias_unbacked(
        &self,
        st: &mut SharedArena,
        ss: &StreamSlot,
        placed: Placed,
        runs: Vec<(u32, u32)>,
        live: usize,
    ) -> Moved {
        let page = self.page as usize;
        let wanted: usize = runs.iter().map(|r| r.1 as usize).sum();
        // New memory serves up to the target; only the pages past it are
        // moved memory (the block's last ones): below the target memory is
        // short in sum (a workload still growing), and the holes are where
        // its next blocks land as they are.
        let over = (self.held() + st.growing + wanted * page)
            .saturating_sub(self.target(live))
            .div_ceil(page)
            .min(wanted) as u32;
        if over < ALIAS_MIN_PAGES || st.pages.free_mapped_pages() < over as usize {
            return Moved::none(runs);
        }
        self.move_memory(st, ss, placed, runs, over)
    }

    /// The part of [`alias_unbacked`](Self::alias_unbacked) that moves
    /// memory: backs the last `need` pages of `runs` with whole handles of
    /// free ranges, mapped again here, or none of them; returns the runs,
    /// or the parts of them, still without memory.
    fn move_memory(
        &self,
        st: &mut SharedArena,
        ss: &StreamSlot,
        placed: Placed,
        runs: Vec<(u32, u32)>,
        need: u32,
    ) -> Moved {
        let page = self.page as usize;
        let whole = runs.clone();
        let (mut grown, runs) = split_last(runs, need);
        // The ranges this stream's placement may use as they are: its own
        // frees and clean ones; under `CrossStreamReuse::Done`, frees the
        // host saw the GPU done with too.
        let as_is = AsIs {
            own: Some(ss.slot),
            done: self.cross_stream == CrossStreamReuse::Done,
        };
        // Other streams' frees serve too, ordered after the free (see
        // below), where the backend makes events to wait on and waits are
        // allowed (not under `CrossStreamReuse::Done`, which never waits).
        let lend = self.lends && self.cross_stream == CrossStreamReuse::Wait;
        // Pieces of memory to move: (node, first page, pages, whether
        // another stream freed it), those usable as they are first, then
        // the longest first.
        let mut pieces: Vec<(u32, u32, u32, bool)> = Vec::new();
        {
            let SharedArena {
                arena,
                pages,
                streams,
                ..
            } = &*st;
            for (node, off, len) in arena.free_nodes_of_at_least(self.page, pages.extent()) {
                let lent = !Self::usable_now(streams, as_is, arena.free_tags(node));
                if !lent || lend {
                    pieces.extend(
                        pages
                            .alias_runs(off, off + len)
                            .into_iter()
                            .map(|(first, count)| (node, first, count, lent)),
                    );
                }
            }
        }
        pieces.sort_unstable_by_key(|&(_, first, count, lent)| {
            (lent, std::cmp::Reverse(count), first)
        });
        let max_parts = (need / ALIAS_PART_PAGES) as usize;
        // The plan: per run, its parts (at, piece, first source page,
        // pages), each a whole piece (a handle maps only whole), the
        // longest that fits what is left of the run first. All or
        // nothing: a block part moved and part grown pays for both, maps
        // and a growth.
        let mut plan: Vec<(u32, usize, u32, u32)> = Vec::new();
        let mut used = vec![false; pieces.len()];
        for &(first, n) in &runs {
            let mut at = first;
            let end = first + n;
            while at < end {
                let fit = (plan.len() < max_parts)
                    .then(|| (0..pieces.len()).find(|&k| !used[k] && pieces[k].2 <= end - at))
                    .flatten();
                let Some(k) = fit else {
                    return Moved::none(whole);
                };
                used[k] = true;
                plan.push((at, k, pieces[k].1, pieces[k].2));
                at += pieces[k].2;
            }
        }
        // Another stream's holes: the block's stream is ordered after
        // their frees before any of it moves, as a placement on them would
        // be (`order_after`: at once where the host saw the work before
        // the free done, else behind a wait on the GPU for a fence past
        // it). Which holes move does not depend on that, only how.
        let mut lent_nodes: Vec<u32> = plan
            .iter()
            .filter(|p| pieces[p.1].3)
            .map(|p| pieces[p.1].0)
            .collect();
        lent_nodes.sort_unstable();
        lent_nodes.dedup();
        let mut waits = 0;
        for &node in &lent_nodes {
            let SharedArena { arena, streams, .. } = &mut *st;
            match self.order_after(streams, ss, arena.free_tags(node)) {
                Some(w) => waits += w,
                // No fence to order after (an event that could not be
                // recorded): the block grows instead; the waits queued
                // stay (they only order the stream further).
                None => {
                    return Moved {
                        unbacked: whole,
                        lent: false,
                        waits,
                    };
                }
            }
        }
        // The old addresses leave the arena, from the highest down so that
        // each free range's node keeps naming the part before.
        let mut order: Vec<usize> = (0..plan.len()).collect();
        order.sort_unstable_by_key(|&i| std::cmp::Reverse(plan[i].2));
        let mut sources = vec![None; plan.len()];
        // The frees the moved memory's old uses end with (the newest of
        // each stream), for the free parts of the block's end pages.
        let mut moved_tags: Vec<Freed> = Vec::new();
        for i in order {
            let (_, p, src, take) = plan[i];
            let node = pieces[p].0;
            for &t in st.arena.free_tags(node) {
                match moved_tags.iter_mut().find(|u| u.slot() == t.slot()) {
                    Some(u) => *u = u.join(t).unwrap_or(t),
                    None => moved_tags.push(t),
                }
            }
            let taken = st.arena.take(
                node,
                u64::from(src) * self.page,
                u64::from(take) * self.page,
            );
            sources[i] = Some(st.pages.kill(src, take, taken.node));
        }
        let gpu = self.gpu();
        let mut left = Vec::new();
        let mut next = 0;
        for &(first, n) in &runs {
            let parts: Vec<usize> = (next..plan.len())
                .take_while(|&i| plan[i].0 < first + n)
                .collect();
            next += parts.len();
            let mut mapped = 0;
            for &i in &parts {
                let (at, _, _, take) = plan[i];
                let source = sources[i].expect("killed above");
                // SAFETY: (1) pages `at..at + take` lie in the live
                // reservation (the arena is inside it), aligned to the
                // granularity (a page is a multiple of it), and so is the
                // offset; (2) they are pending, this block's: nothing is
                // mapped there (pages with memory are never pending); (3)
                // the handle is live (the page table holds it: its memory
                // is given back only once every mapping is idle, and the
                // source pages are mapped) and the part lies inside it
                // (pages of one mapping of it); (4) the block's stream is
                // ordered after every free on the source pages (its own or
                // clean, or `order_after` above), and the source addresses
                // left the arena (dead), so no block uses them again.
                let ok = unsafe {
                    gpu.mem_map_part(
                        st.base + u64::from(at) * self.page,
                        take as usize * page,
                        source.raw,
                        source.offset as usize * page,
                    )
                }
                .is_ok();
                if !ok {
                    break;
                }
                mapped += 1;
            }
            let addr = st.base + u64::from(first) * self.page;
            let span: u32 = parts[..mapped].iter().map(|&i| plan[i].3).sum();
            // SAFETY: (1) the parts mapped just above tile pages
            // `first..first + span` of the live reservation.
            let access =
                mapped > 0 && unsafe { gpu.mem_set_access(addr, span as usize * page) }.is_ok();
            for (k, &i) in parts.iter().enumerate() {
                let (at, _, src, take) = plan[i];
                let source = sources[i].expect("killed above");
                if access && k < mapped {
                    st.pages.alias(at, take, source);
                    self.tag_end_pages(st, placed, at, take, &moved_tags);
                    continue;
                }
                if k < mapped {
                    // SAFETY: (1) exactly the mapping made above, in the
                    // live reservation; (2) idle: its pages are pending, no
                    // block was handed out over them; (3) nothing records
                    // it.
                    let _ = unsafe {
                        gpu.mem_unmap(st.base + u64::from(at) * self.page, take as usize * page)
                    };
                }
                let node = st.pages.revive(source, src);
                let placed = st.arena.placed(node);
                // Back with the tags it had: nothing used it meanwhile.
                st.arena.free(placed, None, |_| false);
                left.push((at, take));
            }
        }
        grown.extend(left);
        Moved {
            unbacked: grown,
            lent: !lent_nodes.is_empty(),
            waits,
        }
    }

    /// Where moved memory lands on pages `at..at + take` and the block
    /// `placed` covers only part of its first or last page, the rest of
    /// that page is free, at the block's side: that free range gets the
    /// tags of the moved memory's frees (`tags`), so that a block placed
    /// there later is ordered after its old uses as the block was (else a
    /// range clean or freed by another stream at the new address would
    /// hand it out with no ordering: the simulated device reported such
    /// races on eight streams). The whole range gets them, a little more
    /// ordering than the page needs.
    fn tag_end_pages(
        &self,
        st: &mut SharedArena,
        placed: Placed,
        at: u32,
        take: u32,
        tags: &[Freed],
    ) {
        let (start, end) = (u64::from(at) * self.page, u64::from(at + take) * self.page);
        let head = start < placed.off;
        let tail = end > placed.off + placed.len;
        for (partial, after) in [(head, false), (tail, true)] {
            if !partial {
                continue;
            }
            match st.arena.free_neighbour(placed, after) {
                Some(node) => st.arena.add_tags(node, tags),
                // Nothing else lies on a page with no memory behind it
                // but free space and the block.
                None => debug_assert!(false, "the rest of an end page is not free"),
            }
        }
    }
}
