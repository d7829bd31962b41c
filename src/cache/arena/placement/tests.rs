//! The placement's unit tests.

use super::super::by_tag::Offered;
use super::*;
use Offered::Any;

// Helpers of the tests, on the arena's private parts.
impl Arena {
    /// An arena as [`new`](Self::new), its index built at the first
    /// search once two streams' ranges are free.
    fn indexed_early(len: u64) -> Self {
        let mut arena = Arena::new(len);
        arena.by_tag = ByTag::new(BUCKETS, 0);
        arena
    }

    /// Builds the index now, if it is not.
    fn build_index(&mut self) {
        if !self.by_tag.built() {
            self.by_tag.build_now();
            self.build_by_tag();
        }
    }

    /// Bytes not handed out.
    fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Checks the index of tags against a walk of every free list: each
    /// bucket's count, and which buckets offer each of `slots` a range.
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
}

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
