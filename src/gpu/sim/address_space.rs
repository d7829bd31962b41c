//! The simulated address space: reuses freed memory as early as CUDA's
//! stream-ordered pool does, and no earlier.
//!
//! A freed range is *pending* until its free executes. A pending range is
//! handed out again at once to an allocation on the freeing stream (stream
//! order makes that safe), and to an allocation on another stream only once
//! that stream is ordered after the free (it waited on an event recorded after
//! it). Once the free has executed, any stream may take it (the driver's
//! opportunistic reuse). These are the rules seen on an H200 (`docs/DESIGN.md`), so a
//! missing wait that the GPU would expose, the simulator exposes too.

use std::collections::BTreeMap;

use super::clock::{Epoch, VectorClock};

/// Allocation granularity, as the driver's pools align.
pub(crate) const ALIGN: usize = 256;
/// Where device 0's addresses start; device `d` starts `d` TiB above, so
/// addresses of the devices of one simulated host never overlap.
const BASE: u64 = 0x7f00_0000_0000;
const DEVICE_STRIDE: u64 = 1 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingFree {
    free_id: u64,
    at: Epoch,
}

#[derive(Debug, Clone, Copy)]
struct FreeRange {
    len: usize,
    pending: Option<PendingFree>,
}

#[derive(Debug)]
pub(crate) struct AddressSpace {
    capacity: usize,
    allocated: usize,
    /// The most bytes allocated at once since creation or the last
    /// [`reset_high`](Self::reset_high).
    allocated_high: usize,
    free: BTreeMap<u64, FreeRange>,
    /// Bytes in free ranges whose free has not executed.
    pending: usize,
    /// The most bytes ever held at once (allocated or waiting for a free to
    /// execute): what the device gave the process at its peak.
    peak_held: usize,
}

/// `bytes` rounded up to the allocation granularity. Only sizes that were
/// allocated (so that [`checked_round_up`] accepted them) may be passed.
fn round_up(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// `bytes` rounded up to the allocation granularity, or `None` when that
/// does not fit in a `usize` (no device has that much memory anyway).
fn checked_round_up(bytes: usize) -> Option<usize> {
    bytes.div_ceil(ALIGN).checked_mul(ALIGN)
}

impl AddressSpace {
    pub(crate) fn new(ordinal: u32, capacity: usize) -> Self {
        let capacity = (capacity.min(DEVICE_STRIDE as usize)) / ALIGN * ALIGN;
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(
                BASE + u64::from(ordinal) * DEVICE_STRIDE,
                FreeRange {
                    len: capacity,
                    pending: None,
                },
            );
        }
        AddressSpace {
            capacity,
            allocated: 0,
            allocated_high: 0,
            free,
            pending: 0,
            peak_held: 0,
        }
    }

    /// Bytes held now: allocated, or freed but not executed yet.
    pub(crate) fn held_bytes(&self) -> usize {
        self.allocated + self.pending
    }

    /// The high-water mark of [`held_bytes`](Self::held_bytes) since
    /// creation or the last [`reset_peak_held`](Self::reset_peak_held).
    pub(crate) fn peak_held(&self) -> usize {
        self.peak_held
    }

    /// Restarts the high-water mark from what is held now.
    pub(crate) fn reset_peak_held(&mut self) {
        self.peak_held = self.held_bytes();
    }

    fn note_held(&mut self) {
        self.peak_held = self.peak_held.max(self.held_bytes());
    }

    /// Takes `bytes` of memory no free is pending on, at once (physical
    /// memory for a virtual-memory mapping). `Err(available)` when nothing
    /// fits.
    pub(crate) fn take_now(&mut self, bytes: usize) -> Result<u64, usize> {
        self.alloc(bytes, usize::MAX, &VectorClock::default())
    }

    /// Gives back memory [`take_now`](Self::take_now) took, at once.
    pub(crate) fn give_now(&mut self, addr: u64, bytes: usize) {
        let len = round_up(bytes);
        self.allocated -= len;
        self.free.insert(addr, FreeRange { len, pending: None });
        self.coalesce(addr);
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes handed out (in granules) and not freed, now and at most.
    pub(crate) fn held(&self) -> crate::gpu::HeldMemory {
        crate::gpu::HeldMemory {
            current: self.allocated,
            high: self.allocated_high,
        }
    }

    /// Restarts the high-water mark from the bytes allocated now.
    pub(crate) fn reset_high(&mut self) {
        self.allocated_high = self.allocated;
    }

    /// Bytes neither allocated nor waiting for a free to execute.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free
            .values()
            .filter(|r| r.pending.is_none())
            .map(|r| r.len)
            .sum()
    }

    fn usable(range: &FreeRange, stream: usize, clock: &VectorClock) -> bool {
        match range.pending {
            None => true,
            Some(p) => p.at.stream == stream || clock.covers(p.at),
        }
    }

    /// Bytes an allocation on `stream` with `clock` could use.
    pub(crate) fn available_to(&self, stream: usize, clock: &VectorClock) -> usize {
        self.free
            .values()
            .filter(|r| Self::usable(r, stream, clock))
            .map(|r| r.len)
            .sum()
    }

    /// First fit among the ranges `stream` may use. `Err(available)` when
    /// nothing fits.
    pub(crate) fn alloc(
        &mut self,
        bytes: usize,
        stream: usize,
        clock: &VectorClock,
    ) -> Result<u64, usize> {
        let Some(len) = checked_round_up(bytes) else {
            return Err(self.available_to(stream, clock));
        };
        let found = self
            .free
            .iter()
            .find(|(_, r)| r.len >= len && Self::usable(r, stream, clock))
            .map(|(&addr, &r)| (addr, r));
        let Some((addr, range)) = found else {
            return Err(self.available_to(stream, clock));
        };
        self.free.remove(&addr);
        if range.pending.is_some() {
            self.pending -= len;
        }
        if range.len > len {
            self.free.insert(
                addr + len as u64,
                FreeRange {
                    len: range.len - len,
                    pending: range.pending,
                },
            );
        }
        self.allocated += len;
        self.note_held();
        self.allocated_high = self.allocated_high.max(self.allocated);
        Ok(addr)
    }

    /// Queues the free of `[addr, addr + bytes)`; usable per the rules above.
    pub(crate) fn free_queued(&mut self, addr: u64, bytes: usize, free_id: u64, at: Epoch) {
        let len = round_up(bytes);
        self.allocated -= len;
        self.pending += len;
        self.free.insert(
            addr,
            FreeRange {
                len,
                pending: Some(PendingFree { free_id, at }),
            },
        );
    }

    /// The free `free_id` of `[addr, addr + bytes)` executed: its pieces still
    /// free become usable by every stream.
    pub(crate) fn free_executed(&mut self, addr: u64, bytes: usize, free_id: u64) {
        let end = addr + round_up(bytes) as u64;
        let keys: Vec<u64> = self
            .free
            .range(addr..end)
            .filter(|(_, r)| r.pending.map(|p| p.free_id) == Some(free_id))
            .map(|(&a, _)| a)
            .collect();
        for key in keys {
            if let Some(r) = self.free.get_mut(&key) {
                r.pending = None;
                self.pending -= r.len;
            }
            self.coalesce(key);
        }
    }

    fn coalesce(&mut self, addr: u64) {
        let Some(&range) = self.free.get(&addr) else {
            return;
        };
        let (mut start, mut len) = (addr, range.len);
        if let Some((&prev, &p)) = self.free.range(..addr).next_back()
            && p.pending.is_none()
            && prev + p.len as u64 == addr
        {
            self.free.remove(&addr);
            start = prev;
            len += p.len;
        }
        let next = start + len as u64;
        if let Some(&n) = self.free.get(&next)
            && n.pending.is_none()
        {
            self.free.remove(&next);
            len += n.len;
        }
        self.free.insert(start, FreeRange { len, pending: None });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stream_reuses_at_once_other_stream_waits() {
        let mut space = AddressSpace::new(0, 1 << 20);
        let clock0 = VectorClock::default();
        let a = space.alloc(1000, 0, &clock0).unwrap();
        space.free_queued(a, 1000, 1, Epoch { stream: 0, tick: 5 });
        let clock1 = VectorClock::default();
        let b = space.alloc(1000, 1, &clock1).unwrap();
        assert_ne!(a, b, "another stream must not take a pending free");
        let c = space.alloc(1000, 0, &clock0).unwrap();
        assert_eq!(a, c, "the freeing stream reuses at once");
    }

    #[test]
    fn held_counts_granules_and_keeps_the_high_water_mark_until_reset() {
        let mut space = AddressSpace::new(0, 1 << 20);
        let clock = VectorClock::default();
        let a = space.alloc(1000, 0, &clock).unwrap();
        let b = space.alloc(256, 0, &clock).unwrap();
        assert_eq!(space.held().current, 1024 + 256);
        space.free_queued(a, 1000, 1, Epoch { stream: 0, tick: 1 });
        let held = space.held();
        assert_eq!((held.current, held.high), (256, 1280));
        space.reset_high();
        assert_eq!(space.held().high, 256, "the mark restarts from now");
        space.free_queued(b, 256, 2, Epoch { stream: 0, tick: 2 });
        let held = space.held();
        assert_eq!((held.current, held.high), (0, 256));
    }

    #[test]
    fn requests_near_usize_max_fail_without_overflow() {
        let mut space = AddressSpace::new(0, 1 << 20);
        let clock = VectorClock::default();
        for bytes in [usize::MAX, usize::MAX - ALIGN + 2, usize::MAX / 2 + 1] {
            assert_eq!(space.alloc(bytes, 0, &clock), Err(1 << 20), "{bytes}");
        }
        assert_eq!(space.free_bytes(), 1 << 20);
    }

    #[test]
    fn executed_free_is_reused_anywhere_and_coalesces() {
        let mut space = AddressSpace::new(0, 4096);
        let clock = VectorClock::default();
        let a = space.alloc(2048, 0, &clock).unwrap();
        let b = space.alloc(2048, 0, &clock).unwrap();
        assert!(space.alloc(1, 1, &clock).is_err());
        space.free_queued(a, 2048, 1, Epoch { stream: 0, tick: 1 });
        space.free_queued(b, 2048, 2, Epoch { stream: 0, tick: 2 });
        assert_eq!(space.alloc(4096, 1, &clock), Err(0));
        space.free_executed(a, 2048, 1);
        space.free_executed(b, 2048, 2);
        assert_eq!(space.alloc(4096, 1, &clock), Ok(a));
    }
}
