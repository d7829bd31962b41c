//! [`ByTag`]: which size buckets of the [`Arena`](super::placement::Arena)
//! hold free ranges a given stream may use as they are, so that a search
//! for one skips the buckets that hold none.
//!
//! # Why
//!
//! The arena's first look for a block is for a range the stream may use
//! as it is: one nobody freed, or only the stream itself (stream order
//! puts its next work after its own frees; see `vmm.rs`). With several
//! streams, most free ranges are other streams' frees. A search that finds
//! none walked every non-empty bucket above the request's, a few ranges
//! each, only to refuse them by their tags: replaying GPT-2 medium served
//! on eight streams with no driver cost, that walk was a third of the
//! cache's time. The index answers "does bucket `b` hold a range stream
//! `s` may use as it is" from a bitmap, and "which is the next such
//! bucket" from a few words of them.
//!
//! # State
//!
//! Free ranges are counted per bucket, and per bucket and *class* of
//! their tags: clean (no tag), or freed by one stream only (one class per
//! stream slot, made the first time a range of that slot is freed). A
//! range freed by several streams is in no class: no stream may use it as
//! it is. Each class keeps a bitmap of its non-empty buckets, as the arena
//! keeps one of all of them.
//!
//! # Who changes it
//!
//! The arena, as a range goes on a bucket's free list ([`ByTag::add`]) and
//! comes off it ([`ByTag::remove`]). A free range's tags never change
//! while it is on a list (the arena takes it off to merge or split it), so
//! the class a range was counted in is the one it is taken out of.
//!
//! # What it changes
//!
//! Nothing the arena decides: a search that asks for
//! [`Offered::CleanOr`] skips only buckets with no such range, and passes
//! over the others' ranges without asking the caller about them, as the
//! caller would have refused them. The unit tests check both against a
//! walk of every range, after random sequences of placements and frees.
//!
//! # Bounded
//!
//! Per bucket one count; per class that was ever used, one count per
//! bucket and its bitmap (about 4 KiB per stream slot).

use super::freed::Freed;

/// Which free ranges a search is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    /// Every free range, whatever its tags (the caller judges them).
    Any,
    /// Only ranges the stream of this slot may use as they are: clean, or
    /// freed by that stream only.
    CleanOr(usize),
}

impl Offered {
    /// Whether a range with tags `tags` is offered.
    #[inline]
    pub(crate) fn admits(self, tags: &[Freed]) -> bool {
        match self {
            Offered::Any => true,
            Offered::CleanOr(slot) => tags.iter().all(|f| f.slot() == Some(slot)),
        }
    }
}

/// The class a range with tags `tags` is counted in: 0 when clean, `s +
/// 1` when freed by slot `s` only, `None` when freed by several streams.
#[inline]
pub(crate) fn class_of(tags: &[Freed]) -> Option<usize> {
    let Some((first, rest)) = tags.split_first() else {
        return Some(0);
    };
    let slot = first.slot()?;
    rest.iter()
        .all(|f| f.slot() == Some(slot))
        .then_some(slot + 1)
}

/// One class's free ranges per bucket.
#[derive(Debug, Clone)]
struct Class {
    counts: Box<[u32]>,
    bitmap: Box<[u64]>,
}

/// Free ranges per bucket, and per bucket and class of tags (see the
/// module's essay).
#[derive(Debug, Clone)]
pub(crate) struct ByTag {
    /// Per bucket, its free ranges (every class).
    ranges: Box<[u32]>,
    /// Per class, once a range of it was freed.
    classes: Vec<Option<Class>>,
}

impl ByTag {
    /// An index of `buckets` buckets (a multiple of 64), all empty.
    pub(crate) fn new(buckets: usize) -> Self {
        debug_assert!(buckets.is_multiple_of(64));
        ByTag {
            ranges: vec![0; buckets].into_boxed_slice(),
            classes: Vec::new(),
        }
    }

    /// A free range of class `class` went on bucket `b`'s list.
    #[inline]
    pub(crate) fn add(&mut self, b: usize, class: Option<usize>) {
        self.ranges[b] += 1;
        let Some(c) = class else { return };
        if self.classes.len() <= c {
            self.classes.resize_with(c + 1, || None);
        }
        let buckets = self.ranges.len();
        let class = self.classes[c].get_or_insert_with(|| Class {
            counts: vec![0; buckets].into_boxed_slice(),
            bitmap: vec![0; buckets / 64].into_boxed_slice(),
        });
        class.counts[b] += 1;
        class.bitmap[b / 64] |= 1 << (b % 64);
    }

    /// A free range of class `class` came off bucket `b`'s list.
    #[inline]
    pub(crate) fn remove(&mut self, b: usize, class: Option<usize>) {
        self.ranges[b] -= 1;
        let Some(c) = class else { return };
        let Some(Some(class)) = self.classes.get_mut(c) else {
            unreachable!("class {c} was never added");
        };
        class.counts[b] -= 1;
        if class.counts[b] == 0 {
            class.bitmap[b / 64] &= !(1 << (b % 64));
        }
    }

    /// Free ranges on bucket `b`'s list.
    #[inline]
    pub(crate) fn ranges_in(&self, b: usize) -> u32 {
        self.ranges[b]
    }

    /// Word `w` of class `c`'s bitmap (0 for a class never used).
    #[inline]
    fn word(&self, c: usize, w: usize) -> u64 {
        match self.classes.get(c) {
            Some(Some(class)) => class.bitmap[w],
            _ => 0,
        }
    }

    /// Whether bucket `b` holds a range `slot`'s stream may use as it is.
    #[inline]
    pub(crate) fn offers(&self, b: usize, slot: usize) -> bool {
        let bit = 1 << (b % 64);
        (self.word(0, b / 64) | self.word(slot + 1, b / 64)) & bit != 0
    }

    /// The first bucket at or above `from` holding a range `slot`'s stream
    /// may use as it is.
    pub(crate) fn next_offering(&self, from: usize, slot: usize) -> Option<usize> {
        let words = self.ranges.len() / 64;
        let mut w = from / 64;
        if w >= words {
            return None;
        }
        let mut bits = (self.word(0, w) | self.word(slot + 1, w)) & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            if w == words {
                return None;
            }
            bits = self.word(0, w) | self.word(slot + 1, w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_tags() {
        let (a, b) = (Freed::by(2, 5), Freed::by(3, 1));
        assert_eq!(class_of(&[]), Some(0));
        assert_eq!(class_of(&[a]), Some(3));
        assert_eq!(class_of(&[a, Freed::by(2, 9)]), Some(3));
        assert_eq!(class_of(&[a, b]), None);
        assert!(Offered::CleanOr(2).admits(&[]));
        assert!(Offered::CleanOr(2).admits(&[a]));
        assert!(!Offered::CleanOr(2).admits(&[b]));
        assert!(!Offered::CleanOr(2).admits(&[a, b]));
        assert!(Offered::Any.admits(&[a, b]));
    }

    #[test]
    fn a_bucket_offers_a_stream_its_own_and_clean_ranges_only() {
        let mut ix = ByTag::new(256);
        ix.add(70, Some(3)); // freed by slot 2
        ix.add(130, Some(0)); // clean
        ix.add(200, None); // several streams
        assert!(ix.offers(70, 2) && !ix.offers(70, 1));
        assert!(ix.offers(130, 1) && ix.offers(130, 2));
        assert!(!ix.offers(200, 2));
        assert_eq!(ix.next_offering(0, 2), Some(70));
        assert_eq!(ix.next_offering(0, 1), Some(130));
        assert_eq!(ix.next_offering(131, 2), None);
        assert_eq!(ix.next_offering(256, 2), None);
        assert_eq!(ix.next_offering(0, 40), Some(130), "a slot never seen");
        ix.add(70, Some(3));
        ix.remove(70, Some(3));
        assert!(ix.offers(70, 2), "one left");
        ix.remove(70, Some(3));
        assert!(!ix.offers(70, 2));
        assert_eq!(ix.next_offering(0, 2), Some(130));
        assert_eq!((ix.ranges_in(70), ix.ranges_in(200)), (0, 1));
    }
}
