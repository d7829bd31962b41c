//! A cheap hasher for the crate's internal keys (block serials, stream ids).
//!
//! The std hasher (SipHash) resists hash flooding, which costs ~20 ns a
//! lookup on the allocation hot path. The keys hashed here are made by the
//! crate (sequential serials, small stream indices), never by an adversary,
//! so a multiply-fold is enough to spread them over the table.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by crate-made integers.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Multiply-fold hashing (the constant is 2^64 / golden ratio).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // The table takes its bucket from the high bits and its tag from the
        // top seven: fold the low bits up so that both see every input bit.
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(K);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_keys_spread() {
        let mut map: FastMap<u64, u64> = FastMap::default();
        for i in 0..10_000u64 {
            map.insert(i << 20 | 3, i);
        }
        assert!((0..10_000u64).all(|i| map[&(i << 20 | 3)] == i));
    }
}
