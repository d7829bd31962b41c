//! [`StreamHandles`]: the backend handles of a [`StreamPool`](super::StreamPool),
//! fixed when the pool is made or joined later by streams created elsewhere.
//!
//! # State
//!
//! A slice of `capacity` slots and a count `len` of the slots in use. Slot
//! `i < len` holds the handle of the pool's stream `i`; slots past `len`
//! hold nothing anyone reads. A pool made from a list (`StreamPool::cuda`,
//! `from_raw`, the simulator's pools) is full from the start: `len ==
//! capacity`, and nothing is ever added.
//!
//! # Who changes it
//!
//! Only [`StreamHandles::join`] (behind `StreamPool::register`, an `unsafe`
//! call whose caller vouches for the handle): under the `joining` lock it
//! writes the next slot, then publishes it by storing `len + 1` with
//! `Release`. A slot is written once and never changed, and `len` only
//! grows, so a reader that loads `len` with `Acquire` and finds index `i`
//! below it reads the handle written before that store. Readers take no
//! lock: resolving a stream on the hot path is two loads.
//!
//! # Failure
//!
//! A full pool refuses a new stream ([`ResourceError::StreamPoolFull`]) and
//! changes nothing; a handle already in the pool gets its old index back,
//! so one stream never has two ids in one pool.
//!
//! # Bounded
//!
//! By `capacity`, fixed when the pool is made: the resources built on a
//! pool size their per-stream state by it once.
//!
//! The atomics are `std`'s, not the loom switch's: a slot is written once
//! before it is published, and the loom models never register a stream, so
//! modelling the loads would only spend their branch budget.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::{ResourceError, ResourceResult};
use crate::types::RawStream;

/// The handles of a pool's streams: `len` published slots out of `capacity`.
pub(crate) struct StreamHandles {
    /// Slot `i < len` is stream `i`'s handle, written once before `len`
    /// passed `i`.
    slots: Box<[AtomicU64]>,
    /// Slots in use; grows only, stored with `Release` after the slot.
    len: AtomicUsize,
    /// Serializes [`join`](Self::join)s (readers never take it).
    joining: Mutex<()>,
}

impl StreamHandles {
    /// A full list: every handle of `raw`, and room for nothing more.
    pub(crate) fn fixed(raw: &[RawStream]) -> Self {
        StreamHandles {
            slots: raw.iter().map(|r| AtomicU64::new(r.0)).collect(),
            len: AtomicUsize::new(raw.len()),
            joining: Mutex::new(()),
        }
    }

    /// Room for `capacity` handles, none in use yet.
    pub(crate) fn open(capacity: usize) -> Self {
        StreamHandles {
            slots: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            len: AtomicUsize::new(0),
            joining: Mutex::new(()),
        }
    }

    /// Handles in use.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Handles the list can ever hold.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The handle at `index`, if it is in use.
    #[inline]
    pub(crate) fn get(&self, index: usize) -> Option<RawStream> {
        (index < self.len()).then(|| RawStream(self.slots[index].load(Ordering::Relaxed)))
    }

    /// The index of `raw`, if it is in use.
    pub(crate) fn position(&self, raw: RawStream) -> Option<usize> {
        (0..self.len()).find(|&i| self.slots[i].load(Ordering::Relaxed) == raw.0)
    }

    /// The index of `raw`: its old one if it is in use, else the next slot.
    ///
    /// # Errors
    /// [`ResourceError::StreamPoolFull`] when `raw` is new and every slot
    /// is in use; nothing changes.
    pub(crate) fn join(&self, raw: RawStream, device: u32) -> ResourceResult<usize> {
        let _joining = self.joining.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(index) = self.position(raw) {
            return Ok(index);
        }
        let index = self.len.load(Ordering::Relaxed);
        let slot = self.slots.get(index).ok_or(ResourceError::StreamPoolFull {
            device,
            capacity: self.capacity(),
        })?;
        slot.store(raw.0, Ordering::Relaxed);
        self.len.store(index + 1, Ordering::Release);
        Ok(index)
    }
}
