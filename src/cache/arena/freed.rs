//! [`Freed`]: which stream last freed a range of the shared arena, and at
//! which of its frees.
//!
//! All streams place their blocks in one address range, so a free range
//! may hold what any of them freed. What another stream may do with it
//! depends on who freed it: the freeing stream reuses it at once (stream
//! order), any other stream only behind a fence recorded on the freeing
//! stream past that free (see [`Fences`](super::fences::Fences)). A tag is
//! the stream's slot and the stamp of the free, packed in one word, so
//! that the arena's nodes stay small and `Copy`.
//!
//! [`CLEAN`](Freed::CLEAN) marks a range no stream's queued work can touch:
//! never used, or freed by a stream whose fence past the free completed.

/// Bits of the stamp; the slot (plus one) sits above them.
const STAMP_BITS: u32 = 44;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;

/// Who last freed a range: a stream's slot and the stamp of its free, or
/// nobody whose work could still touch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Freed(u64);

impl Freed {
    /// No queued work can touch the range.
    pub(crate) const CLEAN: Freed = Freed(0);

    /// Freed by the stream of slot `slot` at its free `stamp` (from 1).
    pub(crate) fn by(slot: usize, stamp: u64) -> Self {
        debug_assert!(stamp > 0 && stamp <= STAMP_MASK, "stamp {stamp}");
        debug_assert!((slot as u64) < (1 << (64 - STAMP_BITS)) - 1);
        Freed(((slot as u64 + 1) << STAMP_BITS) | (stamp & STAMP_MASK))
    }

    /// The slot of the stream that freed it, `None` when clean.
    pub(crate) fn slot(self) -> Option<usize> {
        (self.0 != 0).then(|| (self.0 >> STAMP_BITS) as usize - 1)
    }

    /// The stamp of the free (0 when clean).
    pub(crate) fn stamp(self) -> u64 {
        self.0 & STAMP_MASK
    }

    /// Whether no queued work can touch the range.
    pub(crate) fn is_clean(self) -> bool {
        self.0 == 0
    }

    /// The tag of two ranges taken as one, where one tag can say it: the
    /// newer free of one stream, or the one tag when the other is clean.
    /// `None` for frees of two streams, which stay two ranges.
    pub(crate) fn join(self, other: Freed) -> Option<Freed> {
        if self.is_clean() {
            return Some(other);
        }
        if other.is_clean() {
            return Some(self);
        }
        (self.slot() == other.slot()).then(|| Freed(self.0.max(other.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_keeps_its_slot_and_stamp() {
        let f = Freed::by(63, 1234);
        assert_eq!((f.slot(), f.stamp()), (Some(63), 1234));
        assert_eq!((Freed::CLEAN.slot(), Freed::CLEAN.stamp()), (None, 0));
        assert!(Freed::CLEAN.is_clean() && !f.is_clean());
    }

    #[test]
    fn tags_of_one_stream_join_into_the_newer_and_of_two_do_not() {
        let (a, b) = (Freed::by(2, 5), Freed::by(2, 9));
        assert_eq!(a.join(b), Some(b));
        assert_eq!(b.join(a), Some(b));
        assert_eq!(a.join(Freed::CLEAN), Some(a));
        assert_eq!(Freed::CLEAN.join(a), Some(a));
        assert_eq!(a.join(Freed::by(3, 1)), None);
    }
}
