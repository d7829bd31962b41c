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
//! # Built when searches walk others' ranges
//!
//! While the ranges freed into the arena are all one stream's (a program
//! on one stream, or before a second one frees), every range is clean or
//! that stream's: a search would skip nothing for it. Nor does one where
//! a second stream frees now and then (the GPT-2 training trace has 12 of
//! its 18,000 operations on a second stream): there the counts cost each
//! free range a few instructions (2% of the replay's on the null backend)
//! and spare nothing. So nothing is counted at first, and the
//! arena searches as with no index; once two streams' ranges were freed
//! and searches for a stream's own ranges walked [`BUILD_AFTER`] buckets
//! past the first they look at, every free range is counted, once, and
//! from then on each as it comes and goes (a server on several streams
//! gets there early in its run). The index decides nothing, so when it
//! is built changes no placement.
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

/// Buckets searches walk (past the first each looks at) with two streams'
/// ranges free before the index is built.
pub(crate) const BUILD_AFTER: u64 = 4096;

/// A range's class: [`CLEAN`] when no stream freed it, `s + 1` when only
/// the stream of slot `s` did, [`SEVERAL`] when several streams did.
pub(crate) type Class = u16;

/// The class of ranges no stream freed.
pub(crate) const CLEAN: Class = 0;

/// The class of ranges several streams freed: in no index, no stream may
/// use them as they are.
pub(crate) const SEVERAL: Class = Class::MAX;

/// The class a range with tags `tags` is counted in. Slots are below
/// 2^16 - 2 (`CacheConfig::streams`), so `s + 1` stays under [`SEVERAL`].
#[inline]
pub(crate) fn class_of(tags: &[Freed]) -> Class {
    let Some((first, rest)) = tags.split_first() else {
        return CLEAN;
    };
    match first.slot() {
        Some(slot) if rest.iter().all(|f| f.slot() == Some(slot)) => {
            debug_assert!(slot + 1 < SEVERAL as usize, "slot {slot}");
            (slot + 1) as Class
        }
        _ => SEVERAL,
    }
}

/// One class's free ranges per bucket, and which buckets (and words of
/// the bitmap) hold some.
#[derive(Debug, Clone)]
struct Buckets {
    counts: Vec<u32>,
    bitmap: Vec<u64>,
    /// Bit `w`: word `w` of `bitmap` is not zero.
    words: u64,
}

/// The buckets of a class never used: none.
static NONE: Buckets = Buckets {
    counts: Vec::new(),
    bitmap: Vec::new(),
    words: 0,
};

/// Free ranges per bucket, and per bucket and class of tags (see the
/// module's essay).
#[derive(Debug, Clone)]
pub(crate) struct ByTag {
    /// Whether the counts are kept (see "Built when searches walk others'
    /// ranges").
    built: bool,
    /// Until then, the class of the one stream whose ranges were freed
    /// ([`CLEAN`]: none yet).
    sole: Class,
    /// Whether a second stream's ranges were freed too.
    several: bool,
    /// Buckets searches walked since, before the counts are kept; they
    /// are once this passes `build_after`.
    walked: u64,
    build_after: u64,
    /// Per bucket, its free ranges (every class).
    ranges: Box<[u32]>,
    /// Per class, once a range of it was freed.
    classes: Vec<Option<Buckets>>,
}

impl ByTag {
    /// An index of `buckets` buckets (a multiple of 64, at most 4,096),
    /// all empty, to be built once searches walked `build_after` buckets
    /// with two streams' ranges free ([`BUILD_AFTER`] but in tests).
    pub(crate) fn new(buckets: usize, build_after: u64) -> Self {
        debug_assert!(buckets.is_multiple_of(64) && buckets / 64 <= 64);
        ByTag {
            built: false,
            sole: CLEAN,
            several: false,
            walked: 0,
            build_after,
            ranges: vec![0; buckets].into_boxed_slice(),
            classes: Vec::new(),
        }
    }

    /// Whether the counts are kept (else the arena walks as if it had
    /// none: every range is clean or one stream's).
    #[inline]
    pub(crate) fn built(&self) -> bool {
        self.built
    }

    /// Before the counts are kept: a range of class `class` is freed.
    #[inline]
    pub(crate) fn freed(&mut self, class: Class) {
        debug_assert!(!self.built);
        if class == CLEAN || class == self.sole {
            return;
        }
        if self.sole == CLEAN && class != SEVERAL {
            self.sole = class;
            return;
        }
        self.several = true;
    }

    /// Before the counts are kept: a search for a stream's own and clean
    /// ranges walked `buckets` buckets past its first. True when the
    /// arena must count every free range now ([`add`](Self::add) each)
    /// and from then on.
    #[inline]
    pub(crate) fn walked(&mut self, buckets: u64) -> bool {
        debug_assert!(!self.built);
        if !self.several {
            return false;
        }
        self.walked += buckets;
        self.built = self.walked >= self.build_after;
        self.built
    }

    /// Keeps the counts from now on, whatever searches walked (the
    /// caller adds every free range).
    #[cfg(test)]
    pub(crate) fn build_now(&mut self) {
        self.built = true;
    }

    /// The buckets of class `c`, made empty on its first use.
    #[cold]
    fn make(&mut self, c: usize) {
        if self.classes.len() <= c {
            self.classes.resize_with(c + 1, || None);
        }
        let buckets = self.ranges.len();
        self.classes[c] = Some(Buckets {
            counts: vec![0; buckets],
            bitmap: vec![0; buckets / 64],
            words: 0,
        });
    }

    /// A free range of class `class` went on bucket `b`'s list (once the
    /// counts are kept).
    #[inline]
    pub(crate) fn add(&mut self, b: usize, class: Class) {
        debug_assert!(self.built);
        self.ranges[b] += 1;
        if class == SEVERAL {
            return;
        }
        let c = class as usize;
        if !matches!(self.classes.get(c), Some(Some(_))) {
            self.make(c);
        }
        let Some(Some(class)) = self.classes.get_mut(c) else {
            unreachable!("made above");
        };
        class.counts[b] += 1;
        class.bitmap[b / 64] |= 1 << (b % 64);
        class.words |= 1 << (b / 64);
    }

    /// A free range of class `class` came off bucket `b`'s list (once the
    /// counts are kept).
    #[inline]
    pub(crate) fn remove(&mut self, b: usize, class: Class) {
        debug_assert!(self.built);
        self.ranges[b] -= 1;
        if class == SEVERAL {
            return;
        }
        let Some(Some(class)) = self.classes.get_mut(class as usize) else {
            unreachable!("class {class} was never added");
        };
        class.counts[b] -= 1;
        if class.counts[b] == 0 {
            let w = &mut class.bitmap[b / 64];
            *w &= !(1 << (b % 64));
            if *w == 0 {
                class.words &= !(1 << (b / 64));
            }
        }
    }

    /// Free ranges on bucket `b`'s list.
    #[inline]
    pub(crate) fn ranges_in(&self, b: usize) -> u32 {
        self.ranges[b]
    }

    /// The buckets of class `c` (none for a class never used).
    #[inline]
    fn class(&self, c: usize) -> &Buckets {
        match self.classes.get(c) {
            Some(Some(class)) => class,
            _ => &NONE,
        }
    }

    /// Word `w` of the bitmap of the buckets holding ranges `slot`'s
    /// stream may use as they are: clean ones, or its own.
    #[inline]
    fn offering(clean: &Buckets, own: &Buckets, w: usize) -> u64 {
        clean.bitmap.get(w).copied().unwrap_or(0) | own.bitmap.get(w).copied().unwrap_or(0)
    }

    /// Whether bucket `b` holds a range `slot`'s stream may use as it is.
    #[inline]
    pub(crate) fn offers(&self, b: usize, slot: usize) -> bool {
        let (clean, own) = (self.class(CLEAN as usize), self.class(slot + 1));
        Self::offering(clean, own, b / 64) & (1 << (b % 64)) != 0
    }

    /// The first bucket at or above `from` holding a range `slot`'s stream
    /// may use as it is.
    #[inline]
    pub(crate) fn next_offering(&self, from: usize, slot: usize) -> Option<usize> {
        let (clean, own) = (self.class(CLEAN as usize), self.class(slot + 1));
        let w = from / 64;
        let bits = Self::offering(clean, own, w) & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        // The next word holding any: from the words' summary.
        let above = (clean.words | own.words)
            .checked_shr(w as u32 + 1)
            .unwrap_or(0);
        if above == 0 {
            return None;
        }
        let w = w + 1 + above.trailing_zeros() as usize;
        let bits = Self::offering(clean, own, w);
        debug_assert_ne!(bits, 0, "word {w} is summarised as holding ranges");
        Some(w * 64 + bits.trailing_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_tags() {
        let (a, b) = (Freed::by(2, 5), Freed::by(3, 1));
        assert_eq!(class_of(&[]), CLEAN);
        assert_eq!(class_of(&[a]), 3);
        assert_eq!(class_of(&[a, Freed::by(2, 9)]), 3);
        assert_eq!(class_of(&[a, b]), SEVERAL);
        assert!(Offered::CleanOr(2).admits(&[]));
        assert!(Offered::CleanOr(2).admits(&[a]));
        assert!(!Offered::CleanOr(2).admits(&[b]));
        assert!(!Offered::CleanOr(2).admits(&[a, b]));
        assert!(Offered::Any.admits(&[a, b]));
    }

    #[test]
    fn a_bucket_offers_a_stream_its_own_and_clean_ranges_only() {
        let mut ix = ByTag::new(256, 10);
        ix.freed(CLEAN);
        ix.freed(3); // the first stream's
        assert!(!ix.walked(20), "one stream's ranges");
        ix.freed(2); // a second stream's
        assert!(!ix.walked(9));
        assert!(ix.walked(1), "10 buckets walked");
        assert!(ix.built());
        ix.add(70, 3); // freed by slot 2
        ix.add(130, CLEAN);
        ix.add(200, SEVERAL);
        assert!(ix.offers(70, 2) && !ix.offers(70, 1));
        assert!(ix.offers(130, 1) && ix.offers(130, 2));
        assert!(!ix.offers(200, 2));
        assert_eq!(ix.next_offering(0, 2), Some(70));
        assert_eq!(ix.next_offering(0, 1), Some(130));
        assert_eq!(ix.next_offering(131, 2), None);
        assert_eq!(ix.next_offering(256, 2), None);
        assert_eq!(ix.next_offering(0, 40), Some(130), "a slot never seen");
        ix.add(70, 3);
        ix.remove(70, 3);
        assert!(ix.offers(70, 2), "one left");
        ix.remove(70, 3);
        assert!(!ix.offers(70, 2));
        assert_eq!(ix.next_offering(0, 2), Some(130));
        assert_eq!((ix.ranges_in(70), ix.ranges_in(200)), (0, 1));
    }
}
