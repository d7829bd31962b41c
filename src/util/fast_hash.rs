//! The map for the crate's internal keys (block serials, stream ids).
//!
//! The std hasher (SipHash) resists hash flooding, which costs ~20 ns a
//! lookup on the allocation hot path. The keys hashed here are made by the
//! crate (sequential serials, small stream indices), never by an adversary,
//! so rustc's Fx hash (a multiply per word) is enough to spread them over
//! the table.

/// A map keyed by crate-made integers.
pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;
