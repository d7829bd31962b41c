//! [`Arena`]: good-fit placement with splitting and coalescing over one
//! range of addresses.
//!
//! # State
//!
//! Every range of the arena, free or handed out, is a node of a slab, linked
//! to its neighbours in address order (so that a freed range merges with
//! free neighbours in constant time). Free nodes are also on one list per
//! size bucket: 16 buckets per doubling of the size (in units of
//! [`UNIT`]), with a bitmap of the non-empty ones, the scheme of TLSF
//! (Masmano et al., 2004). A request looks at a few ranges of its own
//! bucket and takes the smallest that fits, or else at a few of the first
//! non-empty bucket above (where everything fits): close to best fit, in a
//! bounded number of steps.
//!
//! The free ranges of each bucket are also counted by the streams that
//! freed them ([`ByTag`]), so that a search offered only the ranges one
//! stream may use as they are ([`Offered::CleanOr`]) skips the buckets
//! holding none, with the same result as a walk refusing them one by one.
//!
//! # Who changes it
//!
//! The tier's shared state, under its lock: [`Arena::alloc`] splits,
//! [`Arena::free`] merges. No driver call is made here: the arena only
//! places ranges; backing them with memory is the page table's business.
//!
//! # Tags
//!
//! Every range keeps its [`Freed`] tags: per stream that freed (part of)
//! it, the newest such free. Free neighbours always merge, the merged
//! range keeping the tags of both (one per stream: the newer); tags the
//! caller's `done` names are dropped as ranges merge (the arena tier names
//! none: its placements may not depend on when fences complete, see
//! `vmm.rs`). A range freed by one stream
//! (the common case) keeps its one tag in its node; only ranges freed by
//! several hold a list. Where a range may go is the caller's decision
//! (`fit`): the arena only reports each candidate's tags.
//!
//! # Bounded
//!
//! Nodes: at most one per handed-out range plus one per free range between
//! them; a free node's slot is reused by the next split.

use super::by_tag::{BUILD_AFTER, ByTag, CLEAN, Class, Offered, SEVERAL, class_of};
use super::freed::Freed;

/// Sizes are multiples of this, and addresses are aligned to it (as the
/// driver's pool aligns).
pub(crate) const UNIT: u64 = 512;

const NIL: u32 = u32::MAX;
/// Sub-buckets per doubling.
const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
const BUCKETS: usize = 64 * SUBS;
/// Ranges looked at per bucket for a better fit.
const SCAN: usize = 8;

/// Free ranges looked at, at most, for one range to lend another stream
/// (a path that would otherwise map new memory, at ~60 µs a growth).
const LEND_SCAN: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Node {
    off: u64,
    len: u64,
    prev_addr: u32,
    next_addr: u32,
    free: bool,
    /// While free, the class of its tags in the index ([`ByTag`]), as it
    /// was counted there.
    class: Class,
    prev_free: u32,
    next_free: u32,
    /// Who last freed (part of) the range, when one stream did: once a
    /// fence past it completed, the GPU is done with every byte of it.
    /// Kept while the range is handed out, so that undoing a placement
    /// restores it.
    freed: Freed,
    /// When several streams did: their tags, an index into `Arena::sets`
    /// (`NIL`: `freed` says it all).
    set: u32,
}

/// A range handed out by [`Arena::alloc`]; give it back to [`Arena::free`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) node: u32,
    /// Offset from the arena's start.
    pub(crate) off: u64,
    /// Length (a multiple of [`UNIT`]).
    pub(crate) len: u64,
}

/// Placement over `[0, len)` (offsets; the caller adds its base address).
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    nodes: Vec<Node>,
    spare_nodes: Vec<u32>,
    heads: Vec<u32>,
    bitmap: [u64; BUCKETS / 64],
    free_bytes: u64,
    /// The free ranges per bucket and class of tags: which buckets hold
    /// ranges a stream may use as they are ([`Offered::CleanOr`]).
    by_tag: ByTag,
    /// Tag lists of ranges several streams freed (see `Node::set`).
    sets: Vec<Vec<Freed>>,
    spare_sets: Vec<u32>,
    /// Room for the tags of a merge of ranges several streams freed.
    merged: Vec<Freed>,
}

/// `bytes` rounded up to [`UNIT`] (at least one unit), or `None` on
/// overflow.
#[inline]
pub(crate) fn round(bytes: usize) -> Option<u64> {
    (bytes.max(1) as u64).checked_next_multiple_of(UNIT)
}

fn bucket(len: u64) -> usize {
    let n = len / UNIT;
    let fl = 63 - n.leading_zeros();
    if fl < SUB_BITS {
        return n as usize;
    }
    let sl = ((n >> (fl - SUB_BITS)) as usize) & (SUBS - 1);
    ((fl - SUB_BITS + 1) as usize) * SUBS + sl
}

impl Arena {
    /// An arena of `len` bytes (rounded down to [`UNIT`]), all free.
    pub(crate) fn new(len: u64) -> Self {
        let len = len / UNIT * UNIT;
        let mut arena = Arena {
            nodes: Vec::new(),
            spare_nodes: Vec::new(),
            heads: vec![NIL; BUCKETS],
            bitmap: [0; BUCKETS / 64],
            free_bytes: 0,
            by_tag: ByTag::new(BUCKETS, BUILD_AFTER),
            sets: Vec::new(),
            spare_sets: Vec::new(),
            merged: Vec::new(),
        };
        if len > 0 {
            let n = arena.node(Node {
                off: 0,
                len,
                prev_addr: NIL,
                next_addr: NIL,
                free: false,
                class: SEVERAL,
                prev_free: NIL,
                next_free: NIL,
                freed: Freed::CLEAN,
                set: NIL,
            });
            arena.push_free(n);
        }
        arena
    }

    /// An arena as [`new`](Self::new), its index built at the first
    /// search once two streams' ranges are free.
    #[cfg(test)]
    fn indexed_early(len: u64) -> Self {
        let mut arena = Arena::new(len);
        arena.by_tag = ByTag::new(BUCKETS, 0);
        arena
    }

    /// Builds the index now, if it is not.
    #[cfg(test)]
    fn build_index(&mut self) {
        if !self.by_tag.built() {
            self.by_tag.build_now();
            self.build_by_tag();
        }
    }

    /// Bytes not handed out.
    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Checks the index of tags against a walk of every free list: each
    /// bucket's count, and which buckets offer each of `slots` a range.
    #[cfg(test)]
    fn check_by_tag(&self, slots: usize) {
        if !self.by_tag.built() {
            // Nothing counted yet: searches walk every bucket.
            return;
        }
        // Per slot, the first bucket at or above the one looked at that
        // offers it a range (walking down).
        let mut next: Vec<Option<usize>> = vec![None; slots];
        for b in (0..BUCKETS).rev() {
            let mut ranges = 0;
            let mut at = self.heads[b];
            while at != NIL {
                ranges += 1;
                for (s, n) in next.iter_mut().enumerate() {
                    if Offered::CleanOr(s).admits(self.tags(at)) {
                        *n = Some(b);
                    }
                }
                at = self.nodes[at as usize].next_free;
            }
            assert_eq!(self.by_tag.ranges_in(b), ranges, "bucket {b}");
            // The next bucket asked from every bucket holding ranges, the
            // one after it, and the ends of the bitmap's words.
            let asked =
                ranges > 0 || (b > 0 && self.heads[b - 1] != NIL) || matches!(b % 64, 0 | 63);
            for (s, &n) in next.iter().enumerate() {
                assert_eq!(
                    self.by_tag.offers(b, s),
                    n == Some(b),
                    "bucket {b}, slot {s}"
                );
                if asked {
                    assert_eq!(self.by_tag.next_offering(b, s), n, "from {b}, slot {s}");
                }
            }
        }
    }

    /// The free ranges, `(offset, length)`, in address order (for
    /// snapshots: a walk of every node).
    pub(crate) fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.free_nodes(u64::MAX)
            .into_iter()
            .map(|(_, off, len)| (off, len))
            .collect()
    }

    /// The free ranges that start below `below`, as (node, offset,
    /// length), in address order (a walk of every node: for the rare
    /// decisions that look at all free memory, an alias).
    pub(crate) fn free_nodes(&self, below: u64) -> Vec<(u32, u64, u64)> {
        let mut spare = vec![false; self.nodes.len()];
        for &n in &self.spare_nodes {
            spare[n as usize] = true;
        }
        let first = (0..self.nodes.len()).find(|&i| !spare[i] && self.nodes[i].prev_addr == NIL);
        let mut out = Vec::new();
        let mut at = first.map_or(NIL, |i| i as u32);
        while at != NIL {
            let n = &self.nodes[at as usize];
            if n.off >= below {
                break;
            }
            if n.free {
                out.push((at, n.off, n.len));
            }
            at = n.next_addr;
        }
        out
    }

    /// The free ranges of at least `min` bytes that start below `below`,
    /// as (node, offset, length), in no set order: a walk of the free
    /// lists of `min`'s size class and above, not of every node (an alias
    /// looks for whole pages, on every growth past the target).
    pub(crate) fn free_nodes_of_at_least(&self, min: u64, below: u64) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        for &head in &self.heads[bucket(min.max(UNIT))..] {
            let mut at = head;
            while at != NIL {
                let n = &self.nodes[at as usize];
                if n.len >= min && n.off < below {
                    out.push((at, n.off, n.len));
                }
                at = n.next_free;
            }
        }
        out
    }

    /// The tags of the free range `node` (see [`free_nodes`](Self::free_nodes)).
    pub(crate) fn free_tags(&self, node: u32) -> &[Freed] {
        debug_assert!(self.nodes[node as usize].free, "node {node} is handed out");
        self.tags(node)
    }

    /// Hands out `[off, off + len)` of the free range `node` (from
    /// [`free_nodes`](Self::free_nodes); taking from one range at
    /// decreasing offsets keeps `node` naming the part before). The range
    /// keeps the free range's tags.
    pub(crate) fn take(&mut self, node: u32, off: u64, len: u64) -> Placed {
        debug_assert!(self.nodes[node as usize].free, "node {node} is handed out");
        self.carve(node, off, len)
    }

    /// Splits `node` after its first `keep` bytes (`0 < keep < len`): the
    /// rest becomes a new node right after it in address order, in no free
    /// list; returns it. The caller decides which part is free.
    fn split(&mut self, node: u32, keep: u64) -> u32 {
        let n = self.nodes[node as usize];
        debug_assert!(keep > 0 && keep < n.len);
        let set = match n.set {
            NIL => NIL,
            s => {
                let tags = std::mem::take(&mut self.sets[s as usize]);
                let copy = self.new_set(&tags);
                self.sets[s as usize] = tags;
                copy
            }
        };
        let rest = self.node(Node {
            off: n.off + keep,
            len: n.len - keep,
            prev_addr: node,
            next_addr: n.next_addr,
            free: false,
            class: SEVERAL,
            prev_free: NIL,
            next_free: NIL,
            freed: n.freed,
            set,
        });
        if n.next_addr != NIL {
            self.nodes[n.next_addr as usize].prev_addr = rest;
        }
        let n = &mut self.nodes[node as usize];
        n.len = keep;
        n.next_addr = rest;
        rest
    }

    fn node(&mut self, node: Node) -> u32 {
        match self.spare_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// The class of node `i`'s tags (as [`class_of`] says).
    #[inline]
    fn class(&self, i: u32) -> Class {
        let n = &self.nodes[i as usize];
        match (n.set, n.freed.slot()) {
            (NIL, None) => CLEAN,
            (NIL, Some(slot)) => (slot + 1) as Class,
            (s, _) => class_of(&self.sets[s as usize]),
        }
    }

    fn push_free(&mut self, i: u32) {
        let b = bucket(self.nodes[i as usize].len);
        let head = self.heads[b];
        let class = self.class(i);
        debug_assert_eq!(class, class_of(self.tags(i)));
        {
            let n = &mut self.nodes[i as usize];
            n.free = true;
            n.class = class;
            n.prev_free = NIL;
            n.next_free = head;
        }
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        self.heads[b] = i;
        self.bitmap[b / 64] |= 1 << (b % 64);
        self.free_bytes += self.nodes[i as usize].len;
        if self.by_tag.built() {
            self.by_tag.add(b, class);
        } else {
            self.by_tag.freed(class);
        }
    }

    /// Counts every free range in the index (searches walked enough with
    /// two streams' ranges free).
    #[cold]
    fn build_by_tag(&mut self) {
        for b in 0..BUCKETS {
            let mut at = self.heads[b];
            while at != NIL {
                let n = &self.nodes[at as usize];
                self.by_tag.add(b, n.class);
                at = n.next_free;
            }
        }
    }

    fn unlink_free(&mut self, i: u32) {
        let Node {
            len,
            prev_free,
            next_free,
            class,
            ..
        } = self.nodes[i as usize];
        let b = bucket(len);
        if prev_free != NIL {
            self.nodes[prev_free as usize].next_free = next_free;
        } else {
            self.heads[b] = next_free;
            if next_free == NIL {
                self.bitmap[b / 64] &= !(1 << (b % 64));
            }
        }
        if next_free != NIL {
            self.nodes[next_free as usize].prev_free = prev_free;
        }
        // The tags are those the range was added with: they change only
        // off the lists.
        debug_assert_eq!(class, class_of(self.tags(i)));
        if self.by_tag.built() {
            self.by_tag.remove(b, class);
        }
        let n = &mut self.nodes[i as usize];
        n.free = false;
        self.free_bytes -= len;
    }

    /// The first non-empty bucket at or above `from`.
    fn next_bucket(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.bitmap.get(word)? & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.bitmap.get(word)?;
        }
    }

    /// The first bucket at or above `from` holding a range `offered`
    /// admits (for [`Offered::Any`], any non-empty bucket).
    #[inline]
    fn next_offering(&self, from: usize, offered: Offered) -> Option<usize> {
        match offered {
            Offered::CleanOr(slot) if self.by_tag.built() => self.by_tag.next_offering(from, slot),
            // Without counts, every non-empty bucket may offer one.
            _ => self.next_bucket(from),
        }
    }

    /// Whether bucket `b` holds a free range `offered` admits.
    #[inline]
    fn offers(&self, b: usize, offered: Offered) -> bool {
        match offered {
            Offered::CleanOr(slot) if self.by_tag.built() => self.by_tag.offers(b, slot),
            _ => self.heads[b] != NIL,
        }
    }

    /// The smallest of the first [`SCAN`] ranges of bucket `b` where `fit`
    /// places `len` bytes, with the offset it chose; ranges `offered` does
    /// not admit are passed over (as if `fit` refused them).
    fn best_in(
        &self,
        b: usize,
        len: u64,
        offered: Offered,
        fit: &impl Fn(u64, u64, &[Freed]) -> Option<u64>,
    ) -> Option<(u32, u64)> {
        let mut at = self.heads[b];
        let mut best: Option<(u64, u32, u64)> = None;
        for _ in 0..SCAN {
            if at == NIL {
                break;
            }
            let n = &self.nodes[at as usize];
            if n.len >= len
                && best.is_none_or(|(l, _, _)| n.len < l)
                && offered.admits(self.tags(at))
                && let Some(off) = fit(n.off, n.off + n.len, self.tags(at))
            {
                debug_assert!(off >= n.off && off + len <= n.off + n.len);
                debug_assert!(off.is_multiple_of(UNIT));
                best = Some((n.len, at, off));
                if n.len == len {
                    break;
                }
            }
            at = n.next_free;
        }
        best.map(|(_, i, off)| (i, off))
    }

    /// Places `len` bytes (a multiple of [`UNIT`]): a good fit among the
    /// free ranges `offered` admits where `fit(start, end, freed)` finds
    /// room, at the offset it returns (inside `[start, end)`, a multiple of
    /// [`UNIT`]). Looks at the request's own bucket, then at the buckets
    /// above, a few ranges each. The same placement as with
    /// [`Offered::Any`] and a `fit` refusing what `offered` does not admit,
    /// without walking the buckets that hold none it admits.
    pub(crate) fn alloc(
        &mut self,
        len: u64,
        offered: Offered,
        fit: impl Fn(u64, u64, &[Freed]) -> Option<u64>,
    ) -> Option<Placed> {
        debug_assert!(len > 0 && len.is_multiple_of(UNIT));
        let b = bucket(len);
        let mut found = match self.offers(b, offered) {
            true => self.best_in(b, len, offered, &fit),
            false => None,
        };
        let mut above = b + 1;
        let mut walked = 0;
        while found.is_none() {
            let Some(next) = self.next_offering(above, offered) else {
                break;
            };
            found = self.best_in(next, len, offered, &fit);
            above = next + 1;
            walked += 1;
        }
        if matches!(offered, Offered::CleanOr(_))
            && !self.by_tag.built()
            && self.by_tag.walked(walked)
        {
            self.build_by_tag();
        }
        let (node, off) = found?;
        Some(self.carve(node, off, len))
    }

    /// A range to use as it is: `len` bytes of a free range `offered`
    /// admits, at the offset `usable(start, end, freed)` finds inside the
    /// free range `[start, end)` (where memory is behind every page, say).
    /// Looks at up to [`LEND_SCAN`] free ranges large enough, smallest
    /// buckets first, counting those `offered` does not admit; `None` when
    /// none serves, and nothing changes. The range keeps its tag
    /// ([`freed`](Self::freed)), for a user on another stream to order
    /// itself after.
    pub(crate) fn lend(
        &mut self,
        len: u64,
        offered: Offered,
        usable: impl Fn(u64, u64, &[Freed]) -> Option<u64>,
    ) -> Option<Placed> {
        let (node, off) = self.lendable(len, offered, usable)?;
        Some(self.carve(node, off, len))
    }

    /// Whether [`lend`](Self::lend) would find a range for `len` bytes
    /// where `usable` says, looking at the same ranges in the same order;
    /// nothing is taken. For an estimate of what an allocation maps.
    pub(crate) fn could_lend(
        &self,
        len: u64,
        offered: Offered,
        usable: impl Fn(u64, u64, &[Freed]) -> Option<u64>,
    ) -> bool {
        self.lendable(len, offered, usable).is_some()
    }

    /// The free range [`lend`](Self::lend) takes `len` bytes of, and the
    /// offset there.
    fn lendable(
        &self,
        len: u64,
        offered: Offered,
        usable: impl Fn(u64, u64, &[Freed]) -> Option<u64>,
    ) -> Option<(u32, u64)> {
        debug_assert!(len > 0 && len.is_multiple_of(UNIT));
        let mut looked = 0;
        let first = bucket(len);
        let mut b = self.next_bucket(first)?;
        loop {
            if b != first && !self.offers(b, offered) {
                // Every range above the request's bucket is large enough:
                // each counts as looked at, none serves.
                looked += self.by_tag.ranges_in(b) as usize;
                if looked >= LEND_SCAN {
                    return None;
                }
                b = self.next_bucket(b + 1)?;
                continue;
            }
            let mut at = self.heads[b];
            while at != NIL {
                let n = self.nodes[at as usize];
                if n.len >= len {
                    if offered.admits(self.tags(at))
                        && let Some(off) = usable(n.off, n.off + n.len, self.tags(at))
                    {
                        debug_assert!(off >= n.off && off + len <= n.off + n.len);
                        debug_assert!(off.is_multiple_of(UNIT));
                        return Some((at, off));
                    }
                    looked += 1;
                    if looked >= LEND_SCAN {
                        return None;
                    }
                }
                at = n.next_free;
            }
            b = self.next_bucket(b + 1)?;
        }
    }

    /// The placement of `node`, a range handed out and not freed since.
    pub(crate) fn placed(&self, node: u32) -> Placed {
        let n = &self.nodes[node as usize];
        debug_assert!(!n.free, "node {node} is free");
        Placed {
            node,
            off: n.off,
            len: n.len,
        }
    }

    /// The free range right before (`after` false) or after the range
    /// `placed`, if the neighbour there is free.
    pub(crate) fn free_neighbour(&self, placed: Placed, after: bool) -> Option<u32> {
        let n = &self.nodes[placed.node as usize];
        let i = if after { n.next_addr } else { n.prev_addr };
        (i != NIL && self.nodes[i as usize].free).then_some(i)
    }

    /// Adds `extra` to the tags of the free range `node` (the newest free
    /// of each stream kept): what a reuse of any of it must now be
    /// ordered after too. Memory moved under part of it (an alias)
    /// brings the frees its old uses end with.
    pub(crate) fn add_tags(&mut self, node: u32, extra: &[Freed]) {
        debug_assert!(self.nodes[node as usize].free, "node {node} is handed out");
        let mut all = self.tags(node).to_vec();
        for &t in extra.iter().filter(|t| !t.is_clean()) {
            match all.iter_mut().find(|u| u.slot() == t.slot()) {
                Some(u) => *u = u.join(t).unwrap_or(t),
                None => all.push(t),
            }
        }
        self.unlink_free(node);
        self.set_tags(node, &all);
        self.push_free(node);
    }

    /// The tags of the range `placed` lies in (as they were when handed
    /// out): none when clean.
    pub(crate) fn freed(&self, placed: Placed) -> &[Freed] {
        self.tags(placed.node)
    }

    fn tags(&self, i: u32) -> &[Freed] {
        let n = &self.nodes[i as usize];
        match n.set {
            NIL if n.freed.is_clean() => &[],
            NIL => std::slice::from_ref(&n.freed),
            s => &self.sets[s as usize],
        }
    }

    /// A tag list holding `tags`: a spare one (emptied, its room kept)
    /// when there is one.
    fn new_set(&mut self, tags: &[Freed]) -> u32 {
        match self.spare_sets.pop() {
            Some(s) => {
                self.sets[s as usize].extend_from_slice(tags);
                s
            }
            None => {
                self.sets.push(tags.to_vec());
                (self.sets.len() - 1) as u32
            }
        }
    }

    /// Sets node `i`'s tag to the one `freed` (clean: none).
    fn set_one(&mut self, i: u32, freed: Freed) {
        let old = std::mem::replace(&mut self.nodes[i as usize].set, NIL);
        if old != NIL {
            self.sets[old as usize].clear();
            self.spare_sets.push(old);
        }
        self.nodes[i as usize].freed = freed;
    }

    /// Sets node `i`'s tags to `tags` (done ones already dropped).
    fn set_tags(&mut self, i: u32, tags: &[Freed]) {
        let old = self.nodes[i as usize].set;
        let [first, _, ..] = *tags else {
            self.set_one(i, tags.first().copied().unwrap_or(Freed::CLEAN));
            return;
        };
        self.nodes[i as usize].freed = first;
        if old != NIL {
            let set = &mut self.sets[old as usize];
            set.clear();
            set.extend_from_slice(tags);
        } else {
            let s = self.new_set(tags);
            self.nodes[i as usize].set = s;
        }
    }

    /// Hands out `[off, off + len)` of the free range `found`, splitting
    /// off what is left before and after it.
    fn carve(&mut self, found: u32, off: u64, len: u64) -> Placed {
        self.unlink_free(found);
        let f = self.nodes[found as usize];
        debug_assert!(f.off <= off && off + len <= f.off + f.len);
        let block = if f.off < off {
            // `found` keeps the part before, free; the block follows it.
            let block = self.split(found, off - f.off);
            self.push_free(found);
            block
        } else {
            found
        };
        if self.nodes[block as usize].len > len {
            let rest = self.split(block, len);
            self.push_free(rest);
        }
        Placed {
            node: block,
            off,
            len,
        }
    }

    /// Takes `node` out of the address list and recycles it.
    fn drop_node(&mut self, i: u32) {
        let Node {
            prev_addr,
            next_addr,
            ..
        } = self.nodes[i as usize];
        if prev_addr != NIL {
            self.nodes[prev_addr as usize].next_addr = next_addr;
        }
        if next_addr != NIL {
            self.nodes[next_addr as usize].prev_addr = prev_addr;
        }
        let set = std::mem::replace(&mut self.nodes[i as usize].set, NIL);
        if set != NIL {
            self.sets[set as usize].clear();
            self.spare_sets.push(set);
        }
        self.spare_nodes.push(i);
    }

    /// Gives back a range [`alloc`](Self::alloc) handed out, freed as
    /// `freed` says (`None` to undo a placement: the range keeps the tags
    /// it had), merging it with its free neighbours. Tags `done` says the
    /// GPU finished are dropped.
    pub(crate) fn free(
        &mut self,
        placed: Placed,
        freed: Option<Freed>,
        done: impl Fn(Freed) -> bool,
    ) {
        let i = placed.node;
        debug_assert!(!self.nodes[i as usize].free);
        if let Some(f) = freed {
            // The user of the range was ordered after every free in its
            // tags (it waited for them, or they were its stream's own), so
            // the new free covers them all.
            self.set_one(i, if done(f) { Freed::CLEAN } else { f });
        }
        // Merged off the lists, then listed once: what listing `i` and
        // merging each free neighbour into it in turn leaves, in fewer
        // steps.
        let prev = self.nodes[i as usize].prev_addr;
        let i = if prev != NIL && self.nodes[prev as usize].free {
            self.unlink_free(prev);
            self.merge_next(prev, &done);
            prev
        } else {
            i
        };
        let next = self.nodes[i as usize].next_addr;
        if next != NIL && self.nodes[next as usize].free {
            self.unlink_free(next);
            self.merge_next(i, &done);
        }
        self.push_free(i);
    }

    /// Merges node `i` with the next one, both on no free list: the merged
    /// range keeps both's tags, one per stream, the ones `done` says
    /// finished dropped.
    fn merge_next(&mut self, i: u32, done: &impl Fn(Freed) -> bool) {
        let next = self.nodes[i as usize].next_addr;
        // The list the newest tag of each of several streams is gathered
        // in (kept between merges, for its room).
        let mut all = std::mem::take(&mut self.merged);
        let a = self.tags(i);
        let b = self.tags(next);
        let simple = match (a, b) {
            ([], []) => Some(Freed::CLEAN),
            ([x], []) | ([], [x]) => Some(*x),
            ([x], [y]) => x.join(*y),
            _ => None,
        };
        // `Some`: one stream's tag (or none), no list to build; `None`:
        // the newest tag of each of several streams, in `all`.
        if simple.is_none() {
            all.clear();
            for &t in a.iter().chain(b) {
                if done(t) {
                    continue;
                }
                match all.iter_mut().find(|u| u.slot() == t.slot()) {
                    Some(u) => *u = u.join(t).unwrap_or(t),
                    None => all.push(t),
                }
            }
        }
        let len = self.nodes[next as usize].len;
        self.nodes[i as usize].len += len;
        self.drop_node(next);
        match simple {
            Some(f) => self.set_one(i, if done(f) { Freed::CLEAN } else { f }),
            None => self.set_tags(i, &all),
        }
        self.merged = all;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Offered::Any;

    /// At the start of the first range that fits.
    fn first(start: u64, _: u64, _: &[Freed]) -> Option<u64> {
        Some(start)
    }

    fn never(_: Freed) -> bool {
        false
    }

    fn by(slot: usize, stamp: u64) -> Option<Freed> {
        Some(Freed::by(slot, stamp))
    }

    /// At `off`, where a free range holds 8 KiB from there.
    fn at(off: u64) -> impl Fn(u64, u64, &[Freed]) -> Option<u64> {
        move |s, e, _| (s <= off && off + 8192 <= e).then_some(off)
    }

    #[test]
    fn buckets_grow_with_the_size() {
        let mut last = 0;
        for units in 1..5000u64 {
            let b = bucket(units * UNIT);
            assert!(b >= last, "{units}");
            last = b;
        }
        assert!(bucket(1 << 40) < BUCKETS);
    }

    #[test]
    fn split_merge_and_reuse() {
        let mut a = Arena::new(1 << 20);
        let x = a.alloc(4096, Any, first).unwrap();
        let y = a.alloc(8192, Any, first).unwrap();
        let z = a.alloc(4096, Any, first).unwrap();
        assert_eq!((x.off, y.off, z.off), (0, 4096, 12288));
        a.free(y, by(0, 1), never);
        // Best fit takes the hole, not the tail.
        let w = a.alloc(8192, Any, first).unwrap();
        assert_eq!(w.off, 4096);
        a.free(w, by(0, 2), never);
        a.free(x, by(0, 3), never);
        a.free(z, by(0, 4), never);
        assert_eq!(a.free_bytes(), 1 << 20);
        let all = a.alloc(1 << 20, Any, first).unwrap();
        assert_eq!(all.off, 0, "everything merged back into one range");
        assert_eq!(a.freed(all), [Freed::by(0, 4)], "the newest free");
        assert!(a.alloc(UNIT, Any, first).is_none());
    }

    #[test]
    fn lend_carves_the_window_it_is_given_and_merges_back() {
        let mut a = Arena::new(1 << 20);
        let x = a.alloc(4096, Any, first).unwrap();
        let y = a.lend(8192, Any, at(65536)).unwrap();
        assert_eq!((y.off, y.len), (65536, 8192));
        assert!(a.lend(4096, Any, at(65536 + 4096)).is_none(), "handed out");
        assert!(a.lend(512, Any, at(0)).is_none(), "x is there");
        assert_eq!(a.free_bytes(), (1 << 20) - 4096 - 8192);
        // The hole before y is still placeable.
        let z = a.alloc(65536 - 4096, Any, first).unwrap();
        assert_eq!(z.off, 4096);
        for p in [x, y, z] {
            a.free(p, by(0, 1), never);
        }
        assert_eq!(a.alloc(1 << 20, Any, first).unwrap().off, 0, "merged back");
    }

    #[test]
    fn could_lend_answers_as_lend_and_takes_nothing() {
        let mut a = Arena::new(1 << 20);
        let x = a.alloc(4096, Any, first).unwrap();
        assert!(a.could_lend(8192, Any, at(65536)));
        assert!(!a.could_lend(8192, Any, at(0)), "x is there");
        assert_eq!(a.free_bytes(), (1 << 20) - 4096, "took nothing");
        let y = a.lend(8192, Any, at(65536)).unwrap();
        assert!(!a.could_lend(8192, Any, at(65536)), "handed out");
        for p in [x, y] {
            a.free(p, by(0, 1), never);
        }
        assert!(a.could_lend(8192, Any, at(0)), "freed");
    }

    #[test]
    fn frees_of_two_streams_merge_keeping_both_tags() {
        let mut a = Arena::new(1 << 20);
        let x = a.alloc(8192, Any, first).unwrap();
        let y = a.alloc(8192, Any, first).unwrap();
        let z = a.alloc(8192, Any, first).unwrap();
        let rest = a.alloc((1 << 20) - 3 * 8192, Any, first).unwrap();
        a.free(x, by(0, 5), never);
        a.free(y, by(1, 7), never);
        a.free(z, by(0, 6), never);
        let all = a.alloc(3 * 8192, Any, first).unwrap();
        assert_eq!(all.off, 0, "one range");
        let mut tags = a.freed(all).to_vec();
        tags.sort_by_key(|f| f.slot());
        assert_eq!(
            tags,
            [Freed::by(0, 6), Freed::by(1, 7)],
            "the newest of each"
        );
        // Undoing a placement keeps the tags; a part split off keeps them.
        a.free(all, None, never);
        let part = a.alloc(8192, Any, first).unwrap();
        assert_eq!(a.freed(part).len(), 2);
        a.free(part, None, never);
        // A free ordered after both (its user waited) leaves one tag.
        let all = a.alloc(3 * 8192, Any, first).unwrap();
        a.free(all, by(2, 1), never);
        let again = a.alloc(8192, Any, first).unwrap();
        assert_eq!(a.freed(again), [Freed::by(2, 1)]);
        a.free(again, None, never);
        a.free(rest, by(0, 9), |f| f.slot() == Some(2));
        let whole = a.alloc(1 << 20, Any, first).unwrap();
        assert_eq!(a.freed(whole), [Freed::by(0, 9)], "done tags dropped");
    }

    #[test]
    fn a_free_beside_a_done_range_drops_its_tag() {
        let mut a = Arena::new(1 << 20);
        let x = a.alloc(8192, Any, first).unwrap();
        let y = a.alloc(8192, Any, first).unwrap();
        let _rest = a.alloc((1 << 20) - 16384, Any, first).unwrap();
        a.free(x, by(0, 5), never);
        a.free(y, by(1, 7), |f| f.slot() == Some(0));
        let both = a.alloc(16384, Any, first).unwrap();
        assert_eq!(a.freed(both), [Freed::by(1, 7)]);
    }

    /// One step of [`an_offered_search_places_as_a_fit_that_refuses`].
    #[derive(Debug, Clone)]
    enum Step {
        /// Places `units` for `slot`'s stream (`own`: offered only the
        /// ranges it may use as they are), at the start or the end of the
        /// range.
        Alloc {
            units: u64,
            slot: usize,
            own: bool,
            at_end: bool,
        },
        /// Lends `units` to `slot`'s stream.
        Lend { units: u64, slot: usize, own: bool },
        /// Frees the `i`th live range (modulo), freed by `slot` (`None`:
        /// the placement undone).
        Free { i: usize, slot: Option<usize> },
    }

    const SLOTS: usize = 4;

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        // Mostly small blocks, now and then a large one: many buckets.
        let units = prop_oneof![4 => 1u64..64, 1 => 64u64..2048];
        prop_oneof![
            3 => (units.clone(), 0..SLOTS, any::<bool>(), any::<bool>()).prop_map(
                |(units, slot, own, at_end)| Step::Alloc { units, slot, own, at_end }
            ),
            1 => (units, 0..SLOTS, any::<bool>())
                .prop_map(|(units, slot, own)| Step::Lend { units, slot, own }),
            3 => (any::<usize>(), proptest::option::weighted(0.9, 0..SLOTS))
                .prop_map(|(i, slot)| Step::Free { i, slot }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Random placements, lends and frees by four streams: a search
        /// offered only a stream's own and clean ranges places exactly as a
        /// search over every range whose `fit` refuses the others (the
        /// walk before the index), and the index agrees with a walk of
        /// the free lists after every step.
        #[test]
        fn an_offered_search_places_as_a_fit_that_refuses(
            steps in proptest::collection::vec(step(), 1..300)
        ) {
            let mut indexed = Arena::indexed_early(8 << 20);
            let mut walked = indexed.clone();
            let mut live: Vec<Placed> = Vec::new();
            let mut stamp = 0;
            // Some frees are seen done, so merges drop tags.
            let done = |f: Freed| f.stamp().is_multiple_of(7);
            for step in steps {
                match step {
                    Step::Alloc { units, slot, own, at_end } => {
                        let len = units * UNIT;
                        let fit = move |s: u64, e: u64, _: &[Freed]| {
                            Some(if at_end { e - len } else { s })
                        };
                        let offered = if own { Offered::CleanOr(slot) } else { Any };
                        let got = indexed.alloc(len, offered, fit);
                        let want = walked.alloc(len, Any, |s, e, tags| {
                            offered.admits(tags).then(|| fit(s, e, tags)).flatten()
                        });
                        proptest::prop_assert_eq!(got, want);
                        live.extend(got);
                    }
                    Step::Lend { units, slot, own } => {
                        let len = units * UNIT;
                        // Only ranges starting on an even unit serve.
                        let usable = |s: u64, _: u64, _: &[Freed]| (s / UNIT).is_multiple_of(2).then_some(s);
                        let offered = if own { Offered::CleanOr(slot) } else { Any };
                        let could = indexed.could_lend(len, offered, usable);
                        let got = indexed.lend(len, offered, usable);
                        let want = walked.lend(len, Any, |s, e, tags| {
                            offered.admits(tags).then(|| usable(s, e, tags)).flatten()
                        });
                        proptest::prop_assert_eq!(got, want);
                        proptest::prop_assert_eq!(could, got.is_some());
                        live.extend(got);
                    }
                    Step::Free { i, slot } => {
                        if live.is_empty() {
                            continue;
                        }
                        let placed = live.swap_remove(i % live.len());
                        stamp += 1;
                        let freed = slot.map(|s| Freed::by(s, stamp));
                        indexed.free(placed, freed, done);
                        walked.free(placed, freed, done);
                    }
                }
                indexed.check_by_tag(SLOTS);
            }
        }
    }

    /// The index is built once two streams' ranges are free and a search
    /// walked; before, a search offered one stream's ranges walks them
    /// all, and finds what it would with the index.
    #[test]
    fn the_index_is_built_once_a_second_stream_frees() {
        let mut a = Arena::indexed_early(1 << 20);
        let x = a.alloc(8192, Any, first).unwrap();
        let _apart = a.alloc(8192, Any, first).unwrap();
        let y = a.alloc(8192, Any, first).unwrap();
        let _rest = a.alloc((1 << 20) - 3 * 8192, Any, first).unwrap();
        a.free(x, by(0, 1), never);
        assert!(!a.by_tag.built(), "one stream's frees");
        a.check_by_tag(2);
        assert_eq!(a.clone().alloc(4096, Offered::CleanOr(1), first), None);
        let x = a.alloc(4096, Offered::CleanOr(0), first).unwrap();
        assert_eq!(x.off, 0, "its own");
        a.free(x, by(0, 2), never);
        a.free(y, by(1, 1), never);
        assert!(!a.by_tag.built(), "no search since");
        a.check_by_tag(2);
        let z = a.alloc(4096, Offered::CleanOr(1), first).unwrap();
        assert!(a.by_tag.built(), "a search with two streams' ranges free");
        assert_eq!(z.off, 16384, "stream 1's own");
        a.check_by_tag(2);
    }

    /// A lend offered only a stream's own and clean ranges still counts
    /// the others' it passes over, and gives up after [`LEND_SCAN`] as a
    /// walk of them all does.
    #[test]
    fn a_lend_counts_the_ranges_it_passes_over() {
        for others in [LEND_SCAN - 1, LEND_SCAN] {
            let mut a = Arena::new(1 << 20);
            // `others` ranges of 2 units freed by stream 1, kept apart by
            // live blocks; the clean rest of the arena after them.
            let pairs: Vec<_> = (0..others)
                .map(|_| (a.alloc(2 * UNIT, Any, first), a.alloc(UNIT, Any, first)))
                .collect();
            for (i, (x, _)) in pairs.iter().enumerate() {
                a.free(x.unwrap(), by(1, i as u64 + 1), never);
            }
            a.build_index();
            a.check_by_tag(2);
            let walked = a.clone().lend(UNIT, Any, |s, _, tags| {
                Offered::CleanOr(0).admits(tags).then_some(s)
            });
            let indexed = a.lend(UNIT, Offered::CleanOr(0), first);
            assert_eq!(indexed, walked, "{others} ranges of stream 1");
            assert_eq!(indexed.is_some(), others < LEND_SCAN, "{others}");
        }
    }

    #[test]
    fn fit_sees_each_ranges_tag_and_chooses_the_offset() {
        let mut a = Arena::new(1 << 20);
        let x = a.alloc(65536, Any, first).unwrap();
        let _rest = a.alloc((1 << 20) - 65536, Any, first).unwrap();
        a.free(x, by(3, 1), never);
        // Only the upper half of x's range may be used.
        let upper = |start: u64, end: u64, f: &[Freed]| {
            assert_eq!(f, [Freed::by(3, 1)]);
            let at = start.max(32768);
            (at + 8192 <= end).then_some(at)
        };
        let p = a.alloc(8192, Any, upper).unwrap();
        assert_eq!(p.off, 32768, "the offset fit chose");
        assert_eq!(a.free_bytes(), 65536 - 8192);
        assert!(a.alloc(8192, Any, |_, _, _| None).is_none(), "nowhere fits");
    }
}
