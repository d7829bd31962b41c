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
//! # Who changes it
//!
//! The owning stream's shard, under its lock: [`Arena::alloc`] splits,
//! [`Arena::free`] merges. No driver call is made here: the arena only
//! places ranges; backing them with memory is the page table's business.
//!
//! # Bounded
//!
//! Nodes: at most one per handed-out range plus one per free range between
//! them; a free node's slot is reused by the next split.

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
    prev_free: u32,
    next_free: u32,
    /// The stamp of the newest free merged into the range (0: never
    /// freed): once a fence past it completed, the GPU is done with every
    /// byte of it. Kept while the range is handed out, so that undoing a
    /// placement restores it.
    freed: u64,
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
#[derive(Debug)]
pub(crate) struct Arena {
    nodes: Vec<Node>,
    spare_nodes: Vec<u32>,
    heads: Vec<u32>,
    bitmap: [u64; BUCKETS / 64],
    free_bytes: u64,
}

/// `bytes` rounded up to [`UNIT`] (at least one unit), or `None` on
/// overflow.
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
        };
        if len > 0 {
            let n = arena.node(Node {
                off: 0,
                len,
                prev_addr: NIL,
                next_addr: NIL,
                free: false,
                prev_free: NIL,
                next_free: NIL,
                freed: 0,
            });
            arena.push_free(n);
        }
        arena
    }

    /// Bytes not handed out.
    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Splits `node` after its first `keep` bytes (`0 < keep < len`): the
    /// rest becomes a new node right after it in address order, in no free
    /// list; returns it. The caller decides which part is free.
    fn split(&mut self, node: u32, keep: u64) -> u32 {
        let n = self.nodes[node as usize];
        debug_assert!(keep > 0 && keep < n.len);
        let rest = self.node(Node {
            off: n.off + keep,
            len: n.len - keep,
            prev_addr: node,
            next_addr: n.next_addr,
            free: false,
            prev_free: NIL,
            next_free: NIL,
            freed: n.freed,
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

    fn push_free(&mut self, i: u32) {
        let b = bucket(self.nodes[i as usize].len);
        let head = self.heads[b];
        {
            let n = &mut self.nodes[i as usize];
            n.free = true;
            n.prev_free = NIL;
            n.next_free = head;
        }
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        self.heads[b] = i;
        self.bitmap[b / 64] |= 1 << (b % 64);
        self.free_bytes += self.nodes[i as usize].len;
    }

    fn unlink_free(&mut self, i: u32) {
        let Node {
            len,
            prev_free,
            next_free,
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

    /// The smallest of the first [`SCAN`] ranges of bucket `b` that fits
    /// `len`.
    fn best_in(&self, b: usize, len: u64) -> Option<u32> {
        let mut at = self.heads[b];
        let mut best: Option<(u64, u32)> = None;
        for _ in 0..SCAN {
            if at == NIL {
                break;
            }
            let n = &self.nodes[at as usize];
            if n.len >= len && best.is_none_or(|(l, _)| n.len < l) {
                best = Some((n.len, at));
                if n.len == len {
                    break;
                }
            }
            at = n.next_free;
        }
        best.map(|(_, i)| i)
    }

    /// Places `len` bytes (a multiple of [`UNIT`]). When the free range
    /// found is larger, the block goes to the end of it that `backed` says
    /// has memory behind it (the start when neither or both do), so that
    /// an allocation lands on memory already mapped where it can.
    pub(crate) fn alloc(&mut self, len: u64, backed: impl Fn(u64) -> bool) -> Option<Placed> {
        debug_assert!(len > 0 && len.is_multiple_of(UNIT));
        let b = bucket(len);
        let found = self.best_in(b, len).or_else(|| {
            let above = self.next_bucket(b + 1)?;
            self.best_in(above, len)
        })?;
        self.unlink_free(found);
        let f = self.nodes[found as usize];
        if f.len == len {
            return Some(Placed {
                node: found,
                off: f.off,
                len,
            });
        }
        let at_end = !backed(f.off) && backed(f.off + f.len - 1);
        if at_end {
            // The block is a new node after `found`, which stays free.
            let block = self.split(found, f.len - len);
            self.push_free(found);
            let off = self.nodes[block as usize].off;
            return Some(Placed {
                node: block,
                off,
                len,
            });
        }
        // The block keeps `found`; the rest is a new free node after it.
        let rest = self.split(found, len);
        self.push_free(rest);
        Some(Placed {
            node: found,
            off: f.off,
            len,
        })
    }

    /// A range to use as it is: `len` bytes of a free range, at the offset
    /// `usable(start, end, len)` finds inside the free range `[start, end)`
    /// (where memory is behind every page). Looks at up to [`LEND_SCAN`]
    /// free ranges large enough, smallest buckets first; `None` when none
    /// serves, and nothing changes. The range keeps the stamp of its newest
    /// free ([`freed`](Self::freed)), for a borrower on another stream to
    /// order itself after.
    pub(crate) fn lend(
        &mut self,
        len: u64,
        usable: impl Fn(u64, u64, u64) -> Option<u64>,
    ) -> Option<Placed> {
        debug_assert!(len > 0 && len.is_multiple_of(UNIT));
        let mut looked = 0;
        let mut b = self.next_bucket(bucket(len))?;
        loop {
            let mut at = self.heads[b];
            while at != NIL {
                let n = self.nodes[at as usize];
                if n.len >= len {
                    if let Some(off) = usable(n.off, n.off + n.len, len) {
                        debug_assert!(off >= n.off && off + len <= n.off + n.len);
                        debug_assert!(off.is_multiple_of(UNIT));
                        return Some(self.carve(at, off, len));
                    }
                    looked += 1;
                    if looked == LEND_SCAN {
                        return None;
                    }
                }
                at = n.next_free;
            }
            b = self.next_bucket(b + 1)?;
        }
    }

    /// The stamp of the newest free of the range `placed` lies in (as it was
    /// when handed out).
    pub(crate) fn freed(&self, placed: Placed) -> u64 {
        self.nodes[placed.node as usize].freed
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
        self.spare_nodes.push(i);
    }

    /// Gives back a range [`alloc`](Self::alloc) handed out, freed at
    /// `stamp` (0 to undo a placement: the range keeps the stamp it had),
    /// merging it with free neighbours; the merged range's stamp is the
    /// newest of theirs.
    pub(crate) fn free(&mut self, placed: Placed, stamp: u64) {
        let mut i = placed.node;
        debug_assert!(!self.nodes[i as usize].free);
        let node = &mut self.nodes[i as usize];
        node.freed = node.freed.max(stamp);
        let prev = self.nodes[i as usize].prev_addr;
        if prev != NIL && self.nodes[prev as usize].free {
            self.unlink_free(prev);
            let Node { len, freed, .. } = self.nodes[i as usize];
            let p = &mut self.nodes[prev as usize];
            p.len += len;
            p.freed = p.freed.max(freed);
            self.drop_node(i);
            i = prev;
        }
        let next = self.nodes[i as usize].next_addr;
        if next != NIL && self.nodes[next as usize].free {
            self.unlink_free(next);
            let Node { len, freed, .. } = self.nodes[next as usize];
            let n = &mut self.nodes[i as usize];
            n.len += len;
            n.freed = n.freed.max(freed);
            self.drop_node(next);
        }
        self.push_free(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let none = |_| false;
        let x = a.alloc(4096, none).unwrap();
        let y = a.alloc(8192, none).unwrap();
        let z = a.alloc(4096, none).unwrap();
        assert_eq!((x.off, y.off, z.off), (0, 4096, 12288));
        a.free(y, 1);
        // Best fit takes the hole, not the tail.
        let w = a.alloc(8192, none).unwrap();
        assert_eq!(w.off, 4096);
        a.free(w, 2);
        a.free(x, 3);
        a.free(z, 4);
        assert_eq!(a.free_bytes(), 1 << 20);
        let all = a.alloc(1 << 20, none).unwrap();
        assert_eq!(all.off, 0, "everything merged back into one range");
        assert!(a.alloc(UNIT, none).is_none());
    }

    #[test]
    fn lend_carves_the_window_it_is_given_and_merges_back() {
        let mut a = Arena::new(1 << 20);
        let none = |_| false;
        let x = a.alloc(4096, none).unwrap();
        let at = |off: u64| move |s: u64, e: u64, l: u64| (s <= off && off + l <= e).then_some(off);
        let y = a.lend(8192, at(65536)).unwrap();
        assert_eq!((y.off, y.len), (65536, 8192));
        assert!(a.lend(4096, at(65536 + 4096)).is_none(), "handed out");
        assert!(a.lend(512, at(0)).is_none(), "x is there");
        assert_eq!(a.free_bytes(), (1 << 20) - 4096 - 8192);
        // The hole before y is still placeable.
        let z = a.alloc(65536 - 4096, none).unwrap();
        assert_eq!(z.off, 4096);
        for p in [x, y, z] {
            a.free(p, 1);
        }
        assert_eq!(a.alloc(1 << 20, none).unwrap().off, 0, "merged back");
    }

    #[test]
    fn a_free_range_keeps_the_stamp_of_its_newest_free() {
        let mut a = Arena::new(1 << 20);
        let none = |_| false;
        let all = |start, _, _| Some(start);
        let x = a.alloc(8192, none).unwrap();
        let y = a.alloc(8192, none).unwrap();
        let z = a.alloc(8192, none).unwrap();
        let tail = a.alloc((1 << 20) - 3 * 8192, none).unwrap();
        a.free(x, 5);
        a.free(z, 7);
        // Each range lent keeps the stamp of the free that left it free.
        let first = a.lend(8192, all).unwrap();
        let second = a.lend(8192, all).unwrap();
        let mut stamps = [(first.off, a.freed(first)), (second.off, a.freed(second))];
        stamps.sort();
        assert_eq!(stamps, [(0, 5), (16384, 7)]);
        let (x, z) = if first.off == 0 {
            (first, second)
        } else {
            (second, first)
        };
        // Undoing a placement (stamp 0) keeps the stamp the range had.
        a.free(x, 0);
        let x = a.lend(8192, all).unwrap();
        assert_eq!((x.off, a.freed(x)), (0, 5));
        a.free(x, 0);
        // Merging keeps the newest stamp: y freed at 9 joins x's range
        // (freed at 5) into one range freed at 9.
        a.free(y, 9);
        let both = a.lend(16384, all).unwrap();
        assert_eq!((both.off, a.freed(both)), (0, 9));
        for (p, stamp) in [(both, 10), (z, 10), (tail, 11)] {
            a.free(p, stamp);
        }
        assert_eq!(a.free_bytes(), 1 << 20);
    }

    #[test]
    fn lend_serves_the_usable_window_of_a_range() {
        let mut a = Arena::new(1 << 20);
        let none = |_| false;
        let x = a.alloc(65536, none).unwrap();
        let _rest = a.alloc((1 << 20) - 65536, none).unwrap();
        a.free(x, 1);
        // Only the upper half of x's range has memory behind it.
        let upper = |start: u64, end: u64, len: u64| {
            let at = start.max(32768);
            (at + len <= end.min(65536)).then_some(at)
        };
        let p = a.lend(8192, upper).unwrap();
        assert_eq!(p.off, 32768, "the window the closure found");
        assert!(a.lend(32768, upper).is_none(), "no window that large left");
        assert_eq!(a.free_bytes(), 65536 - 8192);
    }

    #[test]
    fn placement_prefers_the_backed_end() {
        let mut a = Arena::new(1 << 20);
        let p = a.alloc(4096, |off| off >= (1 << 20) - 8192).unwrap();
        assert_eq!(p.off, (1 << 20) - 4096);
    }
}
