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
//! [`Offered::CleanOr`]: super::by_tag::Offered::CleanOr
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
//! # Where the code is
//!
//! This file holds the nodes, the free lists and their index, and a
//! range's split, carve and merge ([`Arena::free`]); in `placement/`, each
//! with an essay of its own: `search.rs` (the good-fit search:
//! [`Arena::alloc`], [`Arena::lend`]), `tags.rs` (the tags of each range)
//! and the unit tests (`tests.rs`).
//!
//! # Bounded
//!
//! Nodes: at most one per handed-out range plus one per free range between
//! them; a free node's slot is reused by the next split.

use super::by_tag::{BUILD_AFTER, ByTag, CLEAN, Class, SEVERAL, class_of};
use super::freed::Freed;

// The arena's other parts, each a child module (they work on its private
// parts): see "Where the code is".
mod search;
mod tags;

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
    ///
    /// [`Offered::CleanOr`]: super::by_tag::Offered::CleanOr
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
mod tests;
