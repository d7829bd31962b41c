//! The leases of a cache shard: a slab whose keys say where the lease is.
//!
//! Every allocation adds a lease and every free finds and removes one, so
//! this is the hottest structure of the cache. A hash map costs a hash, a
//! probe and a tag match per lookup; here a key *is* the place: a key is
//! `generation << I | index` ([`INDEX_BITS`] and [`GENERATION_BITS`] by
//! default), and a lookup is one bounds-checked index into a `Vec` and one
//! compare of the generation. Insert and remove are O(1) without hashing:
//! vacant entries form a free list (most recently freed first, so that a
//! loop reuses an entry still in cache).
//!
//! **Stale keys.** An entry counts its generations from 1: each remove
//! moves it to the next, so a key kept after its lease ended names an
//! older generation than the entry's and is never taken for the lease that
//! reuses the index. Since generations only grow, whether a key was ever
//! handed out is known exactly ([`Slab::issued`]): the cache answers
//! `DoubleFree` for those, `UnknownBlock` for the others (key 0 included:
//! generation 0 is never handed out).
//!
//! **Limits.** An index whose last generation ends is retired (left
//! vacant, off the free list), so no key is ever handed out twice. With
//! the default widths (24 + 24 bits) a slab holds 2^24 (16.7 M) leases at
//! once, an index serves 2^24 - 1 leases before it retires (one entry,
//! ~120 B, left unused per 16.7 M allocations at worst), and a slab hands
//! out about 2^48 keys in all. Past these, [`Slab::insert`] refuses, and
//! the cache reports `BlockIdsExhausted`: never a panic, never a reused
//! key.
//!
//! Written here rather than with the `slab` crate: that one forgets what a
//! vacant entry was, so it can neither tell a stale key from an unknown one
//! nor keep an index from being reused past its last generation.

/// Bits of a key (by default) that index the slab.
pub(crate) const INDEX_BITS: u32 = 24;
/// Bits of a key (by default) above the index: the entry's generation.
pub(crate) const GENERATION_BITS: u32 = 24;

/// The end of the free list.
const NONE: u32 = u32::MAX;

/// One place of the slab.
#[derive(Debug)]
struct Entry<T> {
    /// The generation of the value in the entry; of the next one when the
    /// entry is vacant (`1 << G` once retired).
    generation: u32,
    /// The next vacant index (or [`NONE`]); meaningful only when vacant.
    next: u32,
    value: Option<T>,
}

/// Values named by generation-checked keys of `I + G` bits (see the
/// module docs).
#[derive(Debug)]
pub(crate) struct Slab<T, const I: u32 = INDEX_BITS, const G: u32 = GENERATION_BITS> {
    entries: Vec<Entry<T>>,
    /// The first vacant index, or [`NONE`].
    vacant: u32,
    len: usize,
}

impl<T, const I: u32, const G: u32> Default for Slab<T, I, G> {
    fn default() -> Self {
        Slab {
            entries: Vec::new(),
            vacant: NONE,
            len: 0,
        }
    }
}

impl<T, const I: u32, const G: u32> Slab<T, I, G> {
    /// The index and generation a key names.
    #[inline]
    fn split(key: u64) -> (usize, u64) {
        ((key & ((1 << I) - 1)) as usize, key >> I)
    }

    /// The number of values held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether [`insert`](Self::insert) would take a value.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.vacant != NONE || self.entries.len() < 1 << I
    }

    /// Adds `value`, returning its key, never returned before; `Err`
    /// (with the value) when no index is left.
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> Result<u64, T> {
        // Indices and generations fit in `u32`, with room for [`NONE`] and
        // the retired generation.
        const { assert!(0 < I && I < 32 && 0 < G && G < 32) };
        let mut index = self.vacant as usize;
        // The head of the free list ([`NONE`] is past every index).
        let generation = if let Some(entry) = self.entries.get_mut(index) {
            self.vacant = entry.next;
            entry.value = Some(value);
            entry.generation
        } else if self.entries.len() < 1 << I {
            index = self.entries.len();
            self.entries.push(Entry {
                generation: 1,
                next: NONE,
                value: Some(value),
            });
            1
        } else {
            return Err(value);
        };
        self.len += 1;
        Ok((u64::from(generation) << I) | index as u64)
    }

    /// The value of `key`, if it is still held.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        let (index, generation) = Self::split(key);
        let entry = self.entries.get_mut(index)?;
        if u64::from(entry.generation) == generation {
            entry.value.as_mut()
        } else {
            None
        }
    }

    /// The value of `key`, found once to be read, then removed.
    #[inline]
    pub(crate) fn entry(&mut self, key: u64) -> Option<Occupied<'_, T, G>> {
        let (index, generation) = Self::split(key);
        let entry = self.entries.get_mut(index)?;
        if u64::from(entry.generation) != generation || entry.value.is_none() {
            return None;
        }
        Some(Occupied {
            entry,
            index: index as u32,
            vacant: &mut self.vacant,
            len: &mut self.len,
        })
    }

    /// Removes the value of `key`, if it is still held (the cache goes
    /// through [`entry`](Self::entry), to read the lease first).
    #[cfg(test)]
    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        self.entry(key).map(Occupied::remove)
    }

    /// Whether `key` was ever returned by [`insert`](Self::insert) (held
    /// now or removed since).
    pub(crate) fn issued(&self, key: u64) -> bool {
        let (index, generation) = Self::split(key);
        self.entries.get(index).is_some_and(|entry| {
            let now = u64::from(entry.generation);
            generation >= 1 && (generation < now || (generation == now && entry.value.is_some()))
        })
    }

    /// Every value held, read-only.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|e| e.value.as_ref())
    }

    /// Every value held.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().filter_map(|e| e.value.as_mut())
    }
}

/// A value found by [`Slab::entry`].
pub(crate) struct Occupied<'a, T, const G: u32> {
    /// Holds a value (checked by [`Slab::entry`]).
    entry: &'a mut Entry<T>,
    index: u32,
    vacant: &'a mut u32,
    len: &'a mut usize,
}

impl<T, const G: u32> Occupied<'_, T, G> {
    /// The value.
    #[inline]
    pub(crate) fn get(&self) -> &T {
        match &self.entry.value {
            Some(value) => value,
            None => unreachable!("Slab::entry finds held values only"),
        }
    }

    /// The value, to change.
    #[inline]
    pub(crate) fn get_mut(&mut self) -> &mut T {
        match &mut self.entry.value {
            Some(value) => value,
            None => unreachable!("Slab::entry finds held values only"),
        }
    }

    /// Removes the value; its key is stale from now on.
    #[inline]
    pub(crate) fn remove(self) -> T {
        let Some(value) = self.entry.value.take() else {
            unreachable!("Slab::entry finds held values only");
        };
        self.vacate();
        value
    }

    /// Removes the value and drops it where it is (what the caller needs
    /// of it was read through [`get`](Self::get)): no copy of it leaves
    /// the slab. Its key is stale from now on.
    #[inline(always)]
    pub(crate) fn discard(self) {
        self.entry.value = None;
        self.vacate();
    }

    /// The entry's bookkeeping once its value is gone.
    #[inline(always)]
    fn vacate(self) {
        *self.len -= 1;
        self.entry.generation += 1;
        // An index whose generations are all spent retires: reusing it
        // would hand out a key that was handed out before.
        if self.entry.generation < 1 << G {
            self.entry.next = *self.vacant;
            *self.vacant = self.index;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A slab of 4 indices and generations 1 to 3, to reach the limits.
    type Tiny = Slab<u32, 2, 2>;

    #[test]
    fn a_reused_index_gets_a_new_key() {
        let mut s = Slab::<u32>::default();
        let a = s.insert(1).unwrap();
        assert_eq!(s.remove(a), Some(1));
        let b = s.insert(2).unwrap();
        assert_ne!(a, b);
        assert_eq!(a & ((1 << INDEX_BITS) - 1), b & ((1 << INDEX_BITS) - 1));
        assert_eq!(s.get_mut(b), Some(&mut 2));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_stale_key_finds_nothing_but_was_issued() {
        let mut s = Slab::<u32>::default();
        let a = s.insert(1).unwrap();
        s.remove(a);
        let b = s.insert(2).unwrap();
        assert_eq!(s.get_mut(a), None);
        assert!(s.entry(a).is_none());
        assert_eq!(s.remove(a), None, "the new value stays");
        assert_eq!(s.get_mut(b), Some(&mut 2));
        assert!(s.issued(a) && s.issued(b));
    }

    #[test]
    fn a_discarded_value_leaves_its_key_stale() {
        let mut s = Slab::<Box<u32>>::default();
        let a = s.insert(Box::new(1)).unwrap();
        let found = s.entry(a).unwrap();
        assert_eq!(**found.get(), 1);
        found.discard();
        assert_eq!((s.len(), s.get_mut(a)), (0, None));
        assert!(s.issued(a));
        let b = s.insert(Box::new(2)).unwrap();
        assert_ne!(a, b, "the index is reused at the next generation");
    }

    #[test]
    fn an_unknown_key_was_never_issued() {
        let mut s = Slab::<u32>::default();
        let a = s.insert(1).unwrap();
        let next_generation = a + (1 << INDEX_BITS);
        for key in [0, 1, next_generation, u64::MAX, a & ((1 << INDEX_BITS) - 1)] {
            assert!(!s.issued(key), "{key:#x}");
            assert_eq!(s.get_mut(key), None);
        }
        s.remove(a);
        assert!(!s.issued(next_generation), "not handed out yet");
    }

    #[test]
    fn an_index_retires_after_its_last_generation() {
        let mut s = Tiny::default();
        let mut seen = Vec::new();
        // Index 0 serves generations 1 to 3, then retires: the next value
        // goes to index 1.
        for v in 0..4 {
            let key = s.insert(v).unwrap();
            assert!(!seen.contains(&key));
            seen.push(key);
            s.remove(key);
        }
        assert_eq!(seen.iter().map(|k| k & 3).collect::<Vec<_>>(), [0, 0, 0, 1]);
        assert!(seen.iter().all(|&k| s.issued(k)));
    }

    #[test]
    fn a_full_slab_refuses() {
        let mut s = Tiny::default();
        let keys: Vec<u64> = (0..4).map(|v| s.insert(v).unwrap()).collect();
        assert!(!s.has_room());
        assert_eq!(s.insert(9), Err(9));
        s.remove(keys[2]);
        assert!(s.has_room());
        assert!(s.insert(9).is_ok());
        // Every key spent: 4 indices x 3 generations, then nothing.
        let mut s = Tiny::default();
        let mut handed = 0;
        while let Ok(key) = s.insert(0) {
            handed += 1;
            s.remove(key);
        }
        assert_eq!(handed, 12);
        assert!(!s.has_room());
        assert_eq!(s.len(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32),
        /// Removes the `n`-th key handed out so far (live or not).
        Remove(usize),
        /// Looks a key up, handed out or not.
        Probe(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u32>().prop_map(Op::Insert),
            any::<usize>().prop_map(Op::Remove),
            any::<u8>().prop_map(Op::Probe),
        ]
    }

    proptest! {
        /// Random inserts and removes (stale keys included) against a map:
        /// keys never repeat, a live key finds its value, a removed one
        /// finds nothing and reads as issued, a key never handed out does
        /// not, and an insert is refused exactly when no index is left.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(op(), 0..200)) {
            let mut slab = Tiny::default();
            let mut model = HashMap::new();
            let mut handed = Vec::new();
            for op in ops {
                let had_room = slab.has_room();
                match op {
                    Op::Insert(v) => match slab.insert(v) {
                        Ok(key) => {
                            prop_assert!(had_room);
                            prop_assert!(!handed.contains(&key));
                            handed.push(key);
                            model.insert(key, v);
                        }
                        Err(back) => prop_assert!(!had_room && back == v),
                    },
                    Op::Remove(n) if !handed.is_empty() => {
                        let key = handed[n % handed.len()];
                        prop_assert_eq!(slab.remove(key), model.remove(&key));
                    }
                    Op::Remove(_) => {}
                    Op::Probe(key) => {
                        let key = u64::from(key);
                        prop_assert_eq!(slab.issued(key), handed.contains(&key));
                        prop_assert_eq!(slab.get_mut(key).copied(), model.get(&key).copied());
                    }
                }
                prop_assert_eq!(slab.len(), model.len());
                // Room: an index never used, or one vacant with a
                // generation left (3 per index here).
                let room = (0..4).any(|i| {
                    let used = handed.iter().filter(|&&k| k & 3 == i).count();
                    used < 3 && !model.keys().any(|k| k & 3 == i)
                });
                prop_assert_eq!(slab.has_room(), room);
                for &key in &handed {
                    prop_assert_eq!(slab.get_mut(key).copied(), model.get(&key).copied());
                    prop_assert!(slab.issued(key));
                }
                let mut values: Vec<u32> = slab.values_mut().map(|v| *v).collect();
                let mut expected: Vec<u32> = model.values().copied().collect();
                values.sort_unstable();
                expected.sort_unstable();
                prop_assert_eq!(values, expected);
            }
        }
    }
}
