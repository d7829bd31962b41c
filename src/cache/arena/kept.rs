//! Kept blocks: the blocks a stream freed last, held out of the shared
//! arena so that the stream takes them back without the tier's lock.
//!
//! # Why several
//!
//! A model's step allocates and frees the same handful of temporaries
//! again and again, but rarely the size it freed just before: replaying
//! PyTorch's GPT-2 inference trace, the block freed last has the next
//! allocation's (rounded) size 28% of the time, one of the last 8 frees
//! 57% of the time, of the last 16, 89%. Each miss here places in the
//! arena under the tier's lock, and every free that pushes a block out
//! gives it back there; a hit costs a scan of [`KEPT`] lengths and one
//! atomic swap.
//!
//! Why not more: blocks kept are out of the arena, so its free ranges
//! cannot merge with them, and placements drift around them. On the
//! simulated device, 16 kept blocks (of up to 16 MiB) held 1.21× on the
//! eight-stream churn of `measure/tests/trace_unseen.rs` and 1.25× on its
//! long churn of small blocks, against 1.18× and 1.23× with 8 (1.18× and
//! 1.21× keeping one); with 8, the GPT-2 traces hold 1.040× and 1.070×.
//!
//! # Only while sizes repeat
//!
//! Kept blocks pay only when the stream asks again for a size it freed
//! lately; when it does not (an inference service whose requests draw
//! their batch and sequence length, so that nearly every size is new),
//! they are memory its next blocks must be placed around (replaying one
//! client of the service benchmark on the simulated device, 40 requests
//! on one stream, the blocks placed around kept ones left a hole too
//! small for a later large request: 16 MiB held for 10.5 MiB live, where
//! 12 MiB serve when every free goes back to the arena). So a stream keeps
//! blocks only while, of its last [`HISTORY`] allocations, at least
//! [`KEEP_REPEATS`] (nearly half) asked for a size among its last [`KEPT`]
//! frees (kept or not): a loop, or a model's step, starts keeping after a
//! few allocations; requests of drawn sizes, where a size comes back now
//! and then by chance, do not. When it stops, its kept blocks go back to the
//! arena at its next placement, and its frees go straight there.
//!
//! # Only sizes asked for lately
//!
//! Even while a stream keeps, a block is kept only if one of its last
//! [`ASKED`] allocations asked for its length: a temporary freed soon
//! after its size was asked for is likely asked for again, a block whose
//! size nobody asked for lately is not. The old copy of a cache grown by a
//! copy (`torch.cat`: the grown copy allocated, then the old one freed, a
//! token longer each step) is such a block, freed among temporaries whose
//! sizes repeat: kept, up to 8 old copies per stream stood between free
//! ranges of the arena, and the serving shape `kv_serving` of
//! `measure/tests/trace_unseen.rs` held 1.125× (1.106–1.152× on four
//! seeds); with this rule 1.083× (1.083–1.110×), every other shape and
//! model trace of the tests unchanged (`notes/fragmentation-floors.md`).
//! Looking at the last 8 allocations only held 1.098× there, and cost
//! the Llama cut of `trace_models.rs` 1.049× → 1.055× (16: 1.058×); with
//! 32 it holds 1.049×.
//!
//! # Who owns a kept block
//!
//! Two halves: [`KeptBlocks`], the stream's own view (in its shard, under
//! the shard's lock: which ranges, their lengths, their age), and
//! [`KeptNodes`], one atomic entry per kept block naming its arena node
//! (in the tier, shared). Whoever swaps an entry's node out owns the
//! block: the stream taking it back, or a growth of any stream, under the
//! tier's lock, giving it to the arena (a growth must see every idle
//! block, and may not take shard locks: the lock order is a shard's, then
//! the tier's). Only the owning stream writes a node into an entry; a
//! growth only empties entries. So the stream's view may name blocks a
//! growth took (its swap then finds the entry empty), never the reverse.
//!
//! # Bounded
//!
//! At most [`KEPT`] blocks per stream. They are memory no user holds that
//! the arena cannot place elsewhere until given back, so every path that
//! would map new memory, trim, or count idle memory gives them back first.

use crate::util::sync::{AtomicU32, Ordering};

use super::placement::Placed;

/// Blocks kept per stream.
pub(crate) const KEPT: usize = 8;

/// The largest block kept. Larger ones go back to the arena at once, where
/// they merge with their neighbours: a large block kept out of the arena
/// leaves a hole no other size can use, and large allocations are few
/// (their placement is a small part of their cost). Keeping every size
/// held 1.11× on the GPT-2 training trace on the simulated device, 1.07×
/// with this bound.
pub(crate) const KEPT_MAX_LEN: u64 = 16 << 20;

/// Allocations a stream looks back at to decide whether it keeps blocks
/// (the bits of [`KeptBlocks::history`]).
const HISTORY: u32 = u32::BITS;

/// Of the last [`HISTORY`] allocations, how many must have asked for a size
/// freed lately for the stream to keep blocks: 14 of 32. One client of the
/// service benchmark on the simulated device (4,096 requests of drawn
/// sizes, 12 seeds) reached 12 now and then by chance, and held a page
/// more than the floor once its blocks were placed around kept ones (3
/// seeds of 12 with 11, 1 with 12, none with 14); the cut of GPT-2's
/// inference trace of `BENCHMARKS.md` runs as many instructions per
/// operation with 14 as with 8, 9% more with 16 (its repeats drop under
/// half now and then, and it stops keeping).
const KEEP_REPEATS: u32 = HISTORY * 7 / 16;

/// Allocations whose lengths a free looks at to decide whether its block
/// is kept (see "Only sizes asked for lately").
const ASKED: usize = 32;

/// The shared half: per kept block, its arena node plus one (0: none).
/// Alone on its cache lines: each stream's thread swaps its own entries
/// at every allocation and free, and entries of eight streams sharing a
/// line made sixteen threads' loops contend (a fifth of the pairs per
/// second: BENCHMARKS.md, "Figures the code's comments cite").
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct KeptNodes([AtomicU32; KEPT]);

impl Default for KeptNodes {
    fn default() -> Self {
        KeptNodes(std::array::from_fn(|_| AtomicU32::new(0)))
    }
}

impl KeptNodes {
    /// Takes entry `j`'s node out, if one is there.
    #[inline]
    fn take(&self, j: usize) -> Option<u32> {
        let v = self.0[j].swap(0, Ordering::AcqRel);
        v.checked_sub(1)
    }

    /// Puts `node` in entry `j`, returning the node there before, if one
    /// was.
    #[inline]
    fn replace(&self, j: usize, node: u32) -> Option<u32> {
        let v = self.0[j].swap(node + 1, Ordering::AcqRel);
        v.checked_sub(1)
    }

    /// Puts `node` in the empty entry `j` (only the owning stream writes a
    /// node, and others only empty entries). A swap, not a plain store:
    /// the loom model below fails with a store (loom 0.7 lets the owner's
    /// later swap read the entry as empty), and the C++ model's coherence
    /// rules, which forbid that, are not worth a few cycles to argue from.
    #[inline]
    fn put(&self, j: usize, node: u32) {
        let was = self.0[j].swap(node + 1, Ordering::AcqRel);
        debug_assert_eq!(was, 0, "entry {j} was not empty");
    }

    /// Whether entry `j` is empty (a growth took its block).
    fn is_empty(&self, j: usize) -> bool {
        self.0[j].load(Ordering::Acquire) == 0
    }

    /// Takes every node out (a growth, under the tier's lock): the caller
    /// owns the blocks now.
    pub(crate) fn take_all(&self) -> impl Iterator<Item = u32> + '_ {
        (0..KEPT).filter_map(|j| self.take(j))
    }
}

/// The stream's half: which block each entry of its [`KeptNodes`] holds.
/// An entry with length 0 is empty.
#[derive(Debug, Clone)]
pub(crate) struct KeptBlocks {
    lens: [u64; KEPT],
    placed: [Placed; KEPT],
    /// When each entry was filled, to push out the oldest.
    ages: [u32; KEPT],
    clock: u32,
    /// The entry filled last: the newest, while its length is not 0. A
    /// loop that frees a block and asks for its size again finds it here
    /// without comparing every entry's age.
    newest: usize,
    /// The lengths of the stream's last [`KEPT`] frees, kept or not (a
    /// ring, `recent_at` the next to overwrite).
    recent: [u64; KEPT],
    recent_at: usize,
    /// The lengths the stream's last [`ASKED`] allocations asked for (a
    /// ring, `asked_at` the next to overwrite): a block is kept only if
    /// its length is among them (see [`keep`](Self::keep)).
    asked: [u64; ASKED],
    asked_at: usize,
    /// Per allocation of the last [`HISTORY`], newest in bit 0: whether it
    /// asked for a size in `recent`.
    history: u32,
    /// The bits set in `history`, counted as it shifts (x86-64's baseline
    /// has no population count instruction: counting the word at every
    /// free took a dozen instructions).
    repeats: u32,
}

impl Default for KeptBlocks {
    fn default() -> Self {
        KeptBlocks {
            lens: [0; KEPT],
            placed: [Placed {
                node: 0,
                off: 0,
                len: 0,
            }; KEPT],
            ages: [0; KEPT],
            clock: 0,
            newest: 0,
            recent: [0; KEPT],
            recent_at: 0,
            asked: [0; ASKED],
            asked_at: 0,
            history: 0,
            repeats: 0,
        }
    }
}

impl KeptBlocks {
    /// A stream whose last allocations all repeated sizes: it keeps.
    #[cfg(all(test, loom))]
    fn repeating() -> Self {
        KeptBlocks {
            history: u32::MAX,
            repeats: HISTORY,
            // The loom model's blocks are of 512 bytes.
            asked: [512; ASKED],
            ..KeptBlocks::default()
        }
    }

    /// The blocks kept now (for snapshots; a growth may take one back at
    /// any time, through the shared entries).
    pub(crate) fn kept(&self) -> impl Iterator<Item = Placed> + '_ {
        self.lens
            .iter()
            .zip(&self.placed)
            .filter(|(len, _)| **len != 0)
            .map(|(_, placed)| *placed)
    }

    /// Whether the stream keeps the blocks it frees (its sizes repeat).
    #[inline]
    pub(crate) fn keeps(&self) -> bool {
        self.repeats >= KEEP_REPEATS
    }

    /// Whether one of the stream's last [`ASKED`] allocations asked for
    /// `len` bytes: a block freed soon after its size was asked for (a
    /// temporary of a step that repeats) is likely asked for again; one
    /// whose size nobody asked for lately (the old copy of a cache grown
    /// by a copy, freed a step after it was made) is not, and kept it
    /// would only stand between free ranges of the arena.
    #[inline]
    fn asked_lately(&self, len: u64) -> bool {
        self.asked.iter().fold(false, |any, &a| any | (a == len))
    }

    /// Counts an allocation in the history: `repeat`, whether it asked for
    /// a size among the last frees.
    #[inline]
    fn note(&mut self, repeat: bool) {
        let dropped = self.history >> (HISTORY - 1);
        self.history = self.history << 1 | u32::from(repeat);
        self.repeats = self.repeats + u32::from(repeat) - dropped;
        debug_assert_eq!(self.repeats, self.history.count_ones());
    }

    /// Whether a kept block of exactly `len` bytes is there: a look that
    /// takes nothing and leaves the history alone (a budget above asks what
    /// an allocation will cost before making it). A growth may take the
    /// block before the allocation does: the allocation then costs pages,
    /// which the budget charges when it sees them.
    #[inline]
    pub(crate) fn holds(&self, len: u64) -> bool {
        self.lens.contains(&len)
    }

    /// The newest kept block of exactly `len` bytes that the stream still
    /// owns, taken out. Counts the allocation in the history (see the
    /// module's docs).
    // Always: the allocation's hot path (the scan is out of line).
    #[inline(always)]
    pub(crate) fn take(&mut self, len: u64, nodes: &KeptNodes) -> Option<Placed> {
        debug_assert!(len > 0);
        // The last free first: a loop asks for the size it freed last.
        let last = self.recent[(self.recent_at + KEPT - 1) % KEPT];
        let repeat = last == len || self.recent.iter().fold(false, |any, &r| any | (r == len));
        self.note(repeat);
        self.asked[self.asked_at] = len;
        self.asked_at = (self.asked_at + 1) % ASKED;
        // The entry filled last is the newest of all: when it has the
        // length, it is the one the scan below would choose.
        let j = self.newest;
        if self.lens[j] == len {
            self.lens[j] = 0;
            if let Some(node) = nodes.take(j) {
                debug_assert_eq!(node, self.placed[j].node);
                return Some(self.placed[j]);
            }
            self.forget_taken(nodes);
        }
        self.take_any(len, nodes)
    }

    /// The part of [`take`](Self::take) past the newest entry: the newest
    /// of the entries of length `len`, taken out.
    fn take_any(&mut self, len: u64, nodes: &KeptNodes) -> Option<Placed> {
        loop {
            // The entries of length `len`, as a bit mask (one compare per
            // entry, no branch): most allocations find none or one.
            let mut matching = 0u32;
            for (j, &l) in self.lens.iter().enumerate() {
                matching |= u32::from(l == len) << j;
            }
            if matching == 0 {
                return None;
            }
            // The newest: the least time since it was kept (the first such).
            let mut j = matching.trailing_zeros() as usize;
            let mut rest = matching & (matching - 1);
            if rest != 0 {
                let mut since = self.clock.wrapping_sub(self.ages[j]);
                while rest != 0 {
                    let k = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    let s = self.clock.wrapping_sub(self.ages[k]);
                    if s < since {
                        (j, since) = (k, s);
                    }
                }
            }
            self.lens[j] = 0;
            if let Some(node) = nodes.take(j) {
                debug_assert_eq!(node, self.placed[j].node);
                return Some(self.placed[j]);
            }
            // A growth took it, and likely the others: forget those.
            self.forget_taken(nodes);
        }
    }

    /// Keeps `placed`; returns the block it pushes out (the oldest, when
    /// every entry is full), or `placed` itself when larger than
    /// [`KEPT_MAX_LEN`], of a length none of the last allocations asked
    /// for, or when the stream keeps nothing, which the caller gives to
    /// the arena.
    // Always: the free's hot path (the push-out is out of line).
    #[inline(always)]
    pub(crate) fn keep(&mut self, placed: Placed, nodes: &KeptNodes) -> Option<Placed> {
        debug_assert!(placed.len > 0);
        self.recent[self.recent_at] = placed.len;
        self.recent_at = (self.recent_at + 1) % KEPT;
        if placed.len > KEPT_MAX_LEN || !self.keeps() || !self.asked_lately(placed.len) {
            return Some(placed);
        }
        self.clock = self.clock.wrapping_add(1);
        let (j, pushed) = match self.lens.iter().position(|&l| l == 0) {
            Some(j) => {
                nodes.put(j, placed.node);
                (j, None)
            }
            None => self.push_out(placed, nodes),
        };
        self.lens[j] = placed.len;
        self.placed[j] = placed;
        self.ages[j] = self.clock;
        self.newest = j;
        pushed
    }

    /// Puts `placed` in the place of the oldest entry (every entry is
    /// full); returns the entry and the block pushed out, if the stream
    /// still owned it.
    fn push_out(&mut self, placed: Placed, nodes: &KeptNodes) -> (usize, Option<Placed>) {
        // The oldest: the most time since it was kept (the last such, as
        // `max_by_key` chose).
        let mut j = 0;
        let mut oldest = self.clock.wrapping_sub(self.ages[0]);
        for (k, &age) in self.ages.iter().enumerate().skip(1) {
            let since = self.clock.wrapping_sub(age);
            if since >= oldest {
                (j, oldest) = (k, since);
            }
        }
        let old = nodes.replace(j, placed.node).map(|node| {
            debug_assert_eq!(node, self.placed[j].node);
            self.placed[j]
        });
        (j, old)
    }

    /// Every kept block the stream still owns, taken out.
    pub(crate) fn drain<'a>(
        &'a mut self,
        nodes: &'a KeptNodes,
    ) -> impl Iterator<Item = Placed> + 'a {
        (0..KEPT).filter_map(move |j| {
            if self.lens[j] == 0 {
                return None;
            }
            self.lens[j] = 0;
            nodes.take(j).map(|_| self.placed[j])
        })
    }

    /// Empties the entries whose block a growth took.
    fn forget_taken(&mut self, nodes: &KeptNodes) {
        for j in 0..KEPT {
            if self.lens[j] != 0 && nodes.is_empty(j) {
                self.lens[j] = 0;
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc;

    use crate::cache::arena::kept::{KeptBlocks, KeptNodes};
    use crate::cache::arena::placement::Placed;

    fn block(node: u32) -> Placed {
        Placed {
            node,
            off: u64::from(node) << 20,
            len: 512,
        }
    }

    /// A stream keeps two blocks and takes them back while a growth takes
    /// every kept block: each block ends up with exactly one owner.
    #[test]
    fn a_kept_block_has_one_owner() {
        loom::model(|| {
            let nodes = Arc::new(KeptNodes::default());
            let mut kept = KeptBlocks::repeating();
            assert!(kept.keep(block(1), &nodes).is_none());
            let growth = {
                let nodes = nodes.clone();
                loom::thread::spawn(move || nodes.take_all().collect::<Vec<u32>>())
            };
            assert!(kept.keep(block(2), &nodes).is_none());
            let mut owned: Vec<u32> = std::iter::from_fn(|| kept.take(512, &nodes))
                .map(|p| p.node)
                .collect();
            owned.extend(growth.join().unwrap());
            owned.extend(kept.drain(&nodes).map(|p| p.node));
            owned.sort();
            assert_eq!(owned, [1, 2]);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(node: u32, len: u64) -> Placed {
        Placed {
            node,
            off: u64::from(node) << 20,
            len,
        }
    }

    #[test]
    fn the_newest_block_of_the_length_comes_back() {
        let (nodes, mut kept) = keeping();
        ask(&mut kept, &nodes, 1024);
        assert_eq!(kept.keep(block(1, 512), &nodes), None);
        assert_eq!(kept.keep(block(2, 1024), &nodes), None);
        assert_eq!(kept.keep(block(3, 512), &nodes), None);
        assert_eq!(kept.take(512, &nodes), Some(block(3, 512)));
        assert_eq!(kept.take(512, &nodes), Some(block(1, 512)));
        assert_eq!(kept.take(512, &nodes), None);
        assert_eq!(kept.take(2048, &nodes), None);
        assert_eq!(kept.take(1024, &nodes), Some(block(2, 1024)));
    }

    #[test]
    fn a_full_set_pushes_out_its_oldest() {
        let (nodes, mut kept) = keeping();
        for n in 0..KEPT as u64 {
            ask(&mut kept, &nodes, 512 * (n + 1));
        }
        for n in 0..KEPT as u32 {
            assert_eq!(kept.keep(block(n, 512 * u64::from(n + 1)), &nodes), None);
        }
        // Taking one back leaves room: no push.
        assert_eq!(kept.take(512 * 3, &nodes), Some(block(2, 512 * 3)));
        assert_eq!(kept.keep(block(100, 512 * 3), &nodes), None);
        // Full again: the oldest (node 0) goes, then node 1.
        assert_eq!(kept.keep(block(101, 512 * 3), &nodes), Some(block(0, 512)));
        assert_eq!(kept.keep(block(102, 512 * 3), &nodes), Some(block(1, 1024)));
        assert_eq!(kept.drain(&nodes).count(), KEPT);
        assert_eq!(nodes.take_all().count(), 0, "drained means emptied");
    }

    /// An allocation of `len` bytes that finds no kept block.
    fn ask(kept: &mut KeptBlocks, nodes: &KeptNodes, len: u64) {
        assert_eq!(kept.take(len, nodes), None);
    }

    /// A block whose size none of the stream's last allocations asked for
    /// goes back to the arena, even while the stream keeps: the old copy
    /// of a cache grown by a copy (`torch.cat`), which nobody asks for
    /// again, among temporaries whose sizes repeat (the shape
    /// `kv_serving` of `measure/tests/trace_unseen.rs`).
    #[test]
    fn a_block_of_a_size_not_asked_for_lately_is_not_kept() {
        let (nodes, mut kept) = keeping();
        // The grown copies: a new size each, the old copy freed after.
        for n in 0..KEPT as u64 {
            ask(&mut kept, &nodes, 4096 * (n + 2));
        }
        assert!(kept.keeps(), "the temporaries' sizes still repeat");
        let old = block(1, 4096);
        assert_eq!(kept.keep(old, &nodes), Some(old), "to the arena");
        // A size asked for lately is kept, as before.
        assert_eq!(kept.keep(block(2, 4096 * 3), &nodes), None);
        assert_eq!(kept.take(4096 * 3, &nodes), Some(block(2, 4096 * 3)));
    }

    /// A stream keeping: its last allocations all asked for sizes it had
    /// freed just before.
    fn keeping() -> (KeptNodes, KeptBlocks) {
        let nodes = KeptNodes::default();
        let mut kept = KeptBlocks::default();
        assert!(!kept.keeps(), "nothing kept before sizes repeat");
        for n in 0..KEEP_REPEATS {
            assert_eq!(
                kept.keep(block(1000 + n, 512), &nodes),
                Some(block(1000 + n, 512))
            );
            assert_eq!(kept.take(512, &nodes), None);
        }
        assert!(kept.keeps());
        (nodes, kept)
    }

    #[test]
    fn a_stream_keeps_only_while_its_sizes_repeat() {
        let (nodes, mut kept) = keeping();
        assert_eq!(kept.keep(block(1, 512), &nodes), None, "kept");
        // Allocations of new sizes push the repeats out of the history.
        for n in 0..HISTORY - KEEP_REPEATS + 1 {
            assert!(kept.keeps(), "still keeping after {n} new sizes");
            assert_eq!(kept.take(1024 * (u64::from(n) + 2), &nodes), None);
        }
        assert!(!kept.keeps());
        assert_eq!(
            kept.keep(block(2, 4096), &nodes),
            Some(block(2, 4096)),
            "a free goes straight to the arena"
        );
        assert_eq!(kept.drain(&nodes).count(), 1, "the block kept before");
        // A size asked again now and then does not start keeping.
        for _ in 0..HISTORY {
            assert_eq!(kept.take(4096, &nodes), None);
            assert_eq!(kept.take(8192, &nodes), None);
            assert_eq!(kept.take(8192 + 512, &nodes), None);
            assert_eq!(kept.take(8192 + 1024, &nodes), None);
            assert_eq!(kept.take(8192 + 1536, &nodes), None);
        }
        assert!(!kept.keeps(), "one repeat in five");
    }

    #[test]
    fn blocks_a_growth_took_are_never_handed_out_or_pushed_out() {
        let (nodes, mut kept) = keeping();
        for n in 0..KEPT as u32 {
            kept.keep(block(n, 512), &nodes);
        }
        let mut taken: Vec<u32> = nodes.take_all().collect();
        taken.sort();
        assert_eq!(taken, (0..KEPT as u32).collect::<Vec<_>>());
        assert_eq!(kept.take(512, &nodes), None, "the growth owns them");
        // Its view is full of stale entries: a keep replaces one, pushing
        // out nothing it no longer owns.
        assert_eq!(kept.keep(block(50, 512), &nodes), None);
        assert_eq!(kept.take(512, &nodes), Some(block(50, 512)));
        assert_eq!(kept.drain(&nodes).count(), 0);
    }
}
