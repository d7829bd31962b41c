//! The good-fit search of the [`Arena`]: [`alloc`](Arena::alloc) looks
//! at a few ranges of the request's own bucket and takes the smallest
//! where the caller's `fit` finds room, else at a few of each bucket above
//! (where everything fits), skipping with the index of tags
//! ([`ByTag`](super::super::by_tag::ByTag)) the buckets that hold no
//! range the request is offered; [`lend`](Arena::lend) (and
//! [`could_lend`](Arena::could_lend), which takes nothing) looks at a
//! bounded number of ranges large enough for one the caller may use as it
//! is. Called by the arena tier's placement (`vmm/place.rs`), under the
//! tier's lock.
//!
//! # Stream ordering
//!
//! None decided here: the search reports each candidate's tags and the
//! caller's `fit` says where, if anywhere, a block may go; a range handed
//! out keeps its tags ([`freed`](Arena::freed)) for the caller to order
//! its stream after.

#![forbid(unsafe_code)]

use super::super::by_tag::Offered;
use super::super::freed::Freed;
use super::{Arena, LEND_SCAN, NIL, Placed, SCAN, UNIT, bucket};

impl Arena {
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
}
