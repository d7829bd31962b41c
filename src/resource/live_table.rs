//! [`LiveTable`]: the live records of one shard, keyed by their sequence
//! number, found by indexing rather than hashing on the hot path.
//!
//! Sequence numbers are handed out in order and most blocks live briefly, so
//! the live ones are mostly a window of recent numbers. A ring indexed by
//! `seq % ring.len()` holds that window: an allocate + free pair is one
//! store and one take, with no hash and no probing. A record whose ring slot
//! a newer one wants (a long-lived block, such as model weights) moves to an
//! overflow map and is found there from then on, at the cost of a hash map
//! (what every lookup cost before). The ring doubles while the overflow holds
//! more than a quarter of it and it is smaller than twice the live count, so
//! it stays within a small multiple of the live set.
//!
//! Sequence numbers are never reused (the table does not hand them out; its
//! owner counts them up), so a stale number never finds a newer record: a
//! slot's occupant is checked against the full number.

use crate::util::fast_hash::FastMap;

/// Slots of a ring when it is first used.
const MIN_RING: usize = 16;

/// Records keyed by a sequence number; see the module documentation.
#[derive(Debug)]
pub(crate) struct LiveTable<T> {
    /// `seq % ring.len()` → the record with that `seq`, if it lives here.
    /// Empty until the first insert; afterwards a power of two long.
    ring: Vec<Option<(u64, T)>>,
    /// Records displaced from the ring by a newer one.
    overflow: FastMap<u64, T>,
    len: usize,
}

impl<T> Default for LiveTable<T> {
    fn default() -> Self {
        LiveTable {
            ring: Vec::new(),
            overflow: FastMap::default(),
            len: 0,
        }
    }
}

impl<T> LiveTable<T> {
    /// Number of records.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn slot(&self, seq: u64) -> usize {
        // `ring.len()` is a power of two: the mask is the remainder.
        (seq as usize) & (self.ring.len().wrapping_sub(1))
    }

    /// Adds `value` under `seq`, which must not be in the table.
    pub(crate) fn insert(&mut self, seq: u64, value: T) {
        debug_assert!(self.get(seq).is_none(), "sequence number {seq} reused");
        if self.ring.is_empty() {
            self.ring = (0..MIN_RING).map(|_| None).collect();
        }
        self.place(seq, value);
        self.len += 1;
        if self.overflow.len() * 4 > self.ring.len() && self.ring.len() < 2 * self.len {
            self.grow();
        }
    }

    /// Puts `value` in its ring slot, moving the older of it and the slot's
    /// occupant to the overflow.
    fn place(&mut self, seq: u64, value: T) {
        let i = self.slot(seq);
        match self.ring[i].as_ref().map(|(held, _)| *held) {
            None => self.ring[i] = Some((seq, value)),
            Some(held) if held < seq => {
                if let Some((old_seq, old)) = self.ring[i].replace((seq, value)) {
                    self.overflow.insert(old_seq, old);
                }
            }
            Some(_) => {
                self.overflow.insert(seq, value);
            }
        }
    }

    /// Doubles the ring and places every record again.
    fn grow(&mut self) {
        let len = self.ring.len() * 2;
        let old = std::mem::replace(&mut self.ring, (0..len).map(|_| None).collect());
        let displaced = std::mem::take(&mut self.overflow);
        for (seq, value) in old.into_iter().flatten().chain(displaced) {
            self.place(seq, value);
        }
    }

    fn in_ring(&self, seq: u64) -> bool {
        matches!(self.ring.get(self.slot(seq)), Some(Some((held, _))) if *held == seq)
    }

    /// The record of `seq`.
    pub(crate) fn get(&self, seq: u64) -> Option<&T> {
        if self.in_ring(seq) {
            return self.ring[self.slot(seq)].as_ref().map(|(_, v)| v);
        }
        self.overflow.get(&seq)
    }

    /// The record of `seq`, mutably.
    pub(crate) fn get_mut(&mut self, seq: u64) -> Option<&mut T> {
        if self.in_ring(seq) {
            let i = self.slot(seq);
            return self.ring[i].as_mut().map(|(_, v)| v);
        }
        self.overflow.get_mut(&seq)
    }

    /// Takes the record of `seq` out.
    pub(crate) fn remove(&mut self, seq: u64) -> Option<T> {
        let value = if self.in_ring(seq) {
            let i = self.slot(seq);
            self.ring[i].take().map(|(_, v)| v)
        } else if self.overflow.is_empty() {
            None
        } else {
            self.overflow.remove(&seq)
        };
        self.len -= usize::from(value.is_some());
        value
    }

    /// Every record, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.ring
            .iter()
            .flatten()
            .map(|(_, v)| v)
            .chain(self.overflow.values())
    }

    /// Takes every record out.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.len = 0;
        self.ring
            .iter_mut()
            .filter_map(Option::take)
            .map(|(_, v)| v)
            .chain(self.overflow.drain().map(|(_, v)| v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_stay_in_the_ring() {
        let mut t = LiveTable::default();
        for seq in 1..10_000u64 {
            t.insert(seq, seq * 2);
            assert_eq!(t.remove(seq), Some(seq * 2));
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.ring.len(), MIN_RING);
        assert!(t.overflow.is_empty());
    }

    #[test]
    fn long_lived_records_survive_and_the_ring_stays_small() {
        let mut t = LiveTable::default();
        let kept: Vec<u64> = (1..=100).collect();
        for &seq in &kept {
            t.insert(seq, seq);
        }
        for seq in 103..50_000u64 {
            t.insert(seq, seq);
            if seq % 3 == 0 {
                // a few live a while longer
                assert_eq!(t.remove(seq - 2), Some(seq - 2));
            }
            if seq % 3 != 1 {
                assert_eq!(t.remove(seq), Some(seq), "{seq}");
            }
        }
        assert!(kept.iter().all(|&s| t.get(s) == Some(&s)));
        assert_eq!(t.len(), 100 + usize::from(t.get(49_999).is_some()));
        assert!(t.ring.len() <= 512, "ring of {}", t.ring.len());
        // Stale and unknown numbers find nothing.
        assert_eq!(t.get(150), None);
        assert_eq!(t.remove(150), None);
        assert_eq!(t.get(1 << 40), None);
        let mut all: Vec<u64> = t.drain().collect();
        all.sort_unstable();
        assert_eq!(&all[..100], &kept[..]);
        assert_eq!(t.len(), 0);
        assert_eq!(t.values().count(), 0);
    }

    #[test]
    fn an_older_record_put_back_goes_where_it_is_found() {
        let mut t = LiveTable::default();
        t.insert(1, 'a');
        let a = t.remove(1).unwrap();
        t.insert(1 + MIN_RING as u64, 'b');
        // Restoring an older record next to a newer one in its slot.
        t.insert(1, a);
        assert_eq!(t.get(1), Some(&'a'));
        assert_eq!(t.get(1 + MIN_RING as u64), Some(&'b'));
        assert_eq!(t.len(), 2);
        *t.get_mut(1).unwrap() = 'c';
        assert_eq!(t.remove(1), Some('c'));
        assert_eq!(t.values().copied().collect::<Vec<_>>(), vec!['b']);
    }
}
