//! Virtual memory management on the simulated device: reserved address
//! ranges, physical handles and the mappings between them.
//!
//! # State
//!
//! - **Reservations**: address ranges handed out by a bump pointer per
//!   device, far above the pool's addresses (never reused, so a stale
//!   address never names new memory by accident).
//! - **Handles**: physical memory taken from the device's
//!   [`AddressSpace`](super::address_space::AddressSpace) at once, so that
//!   the pool and the mappings share one capacity and one high-water mark.
//! - **Mappings**: which part of which handle backs which granule-aligned
//!   range, and whether access was granted. One handle may be mapped at
//!   several ranges (the same memory at two addresses, as `cuMemMap` with
//!   an offset allows): [`VirtualMemory::aliases`] names, for a range, the
//!   other addresses of its memory, and a handle's memory goes back only
//!   once it is released and its last mapping unmapped.
//!
//! # Failure
//!
//! Every call checks what CUDA documents (alignment, a mapping inside a
//! reservation and over nothing mapped, an unmap over whole mappings, a
//! handle of the right size) and fails with `CUDA_ERROR_INVALID_VALUE`,
//! changing nothing. Unmapping memory that queued work still uses is not an
//! error the driver reports (the device faults later): the state machine in
//! [`device`](super::device) reports it as a race instead.

use std::collections::{BTreeMap, HashMap};

use crate::error::DriverCall;
use crate::gpu::{GpuError, GpuResult};

/// `CUDA_ERROR_INVALID_VALUE`.
const INVALID_VALUE: i32 = 1;
/// Where device 0's reservations start; device `d` starts `d` × 4 TiB above.
const VA_BASE: u64 = 0x2000_0000_0000;
const VA_STRIDE: u64 = 1 << 42;

fn invalid(call: DriverCall, why: &str) -> GpuError {
    GpuError::driver(
        call,
        INVALID_VALUE,
        format!("CUDA_ERROR_INVALID_VALUE: {why}"),
    )
}

#[derive(Debug)]
struct Handle {
    device: u32,
    /// Where the memory sits in the device's address space (its identity
    /// for capacity accounting only).
    phys: u64,
    len: usize,
    mappings: usize,
    released: bool,
}

#[derive(Debug)]
struct Mapping {
    len: usize,
    handle: u64,
    /// Where in the handle the mapping starts (bytes).
    offset: usize,
    accessible: bool,
}

/// The virtual memory of every device of one simulated host.
#[derive(Debug)]
pub(crate) struct VirtualMemory {
    /// Mapping granularity; 0 when the simulated device has none.
    pub(crate) granularity: usize,
    next_va: HashMap<u32, u64>,
    reservations: BTreeMap<u64, (usize, u32)>,
    handles: HashMap<u64, Handle>,
    next_handle: u64,
    mappings: BTreeMap<u64, Mapping>,
}

/// What a released handle gives back to its device: `(device, phys, len)`.
pub(crate) type Freed = Option<(u32, u64, usize)>;

impl VirtualMemory {
    pub(crate) fn new(granularity: usize) -> Self {
        VirtualMemory {
            granularity,
            next_va: HashMap::new(),
            reservations: BTreeMap::new(),
            handles: HashMap::new(),
            next_handle: 1,
            mappings: BTreeMap::new(),
        }
    }

    pub(crate) fn supported(&self, call: DriverCall) -> GpuResult<usize> {
        if self.granularity == 0 {
            return Err(GpuError::driver(
                call,
                801,
                "CUDA_ERROR_NOT_SUPPORTED: the simulated device was built without virtual memory",
            ));
        }
        Ok(self.granularity)
    }

    fn aligned(&self, value: u64, call: DriverCall) -> GpuResult<()> {
        if value == 0 || !value.is_multiple_of(self.granularity as u64) {
            return Err(invalid(call, "not a positive multiple of the granularity"));
        }
        Ok(())
    }

    pub(crate) fn reserve(&mut self, device: u32, bytes: usize) -> GpuResult<u64> {
        let call = DriverCall::AddressReserve;
        self.supported(call)?;
        self.aligned(bytes as u64, call)?;
        let next = self
            .next_va
            .entry(device)
            .or_insert(VA_BASE + u64::from(device) * VA_STRIDE);
        let base = *next;
        let end = base
            .checked_add(bytes as u64)
            .filter(|&e| e <= VA_BASE + (u64::from(device) + 1) * VA_STRIDE)
            .ok_or(GpuError::OutOfMemory { available: 0 })?;
        *next = end;
        self.reservations.insert(base, (bytes, device));
        Ok(base)
    }

    pub(crate) fn free_reservation(&mut self, addr: u64, bytes: usize) -> GpuResult<()> {
        let call = DriverCall::AddressFree;
        self.supported(call)?;
        match self.reservations.get(&addr) {
            Some(&(len, _)) if len == bytes => {}
            _ => return Err(invalid(call, "not a reservation")),
        }
        if self
            .mappings
            .range(addr..addr + bytes as u64)
            .next()
            .is_some()
        {
            return Err(invalid(call, "memory is still mapped in the range"));
        }
        self.reservations.remove(&addr);
        Ok(())
    }

    /// Registers a handle for `len` bytes already taken at `phys`.
    pub(crate) fn create(&mut self, device: u32, phys: u64, len: usize) -> u64 {
        let id = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(
            id,
            Handle {
                device,
                phys,
                len,
                mappings: 0,
                released: false,
            },
        );
        id
    }

    /// Releases a handle; returns its memory when nothing maps it any more.
    pub(crate) fn release(&mut self, handle: u64) -> GpuResult<Freed> {
        let call = DriverCall::MemRelease;
        match self.handles.get_mut(&handle) {
            Some(h) if !h.released => h.released = true,
            _ => return Err(invalid(call, "not a live handle")),
        }
        Ok(self.reclaim(handle))
    }

    fn reclaim(&mut self, handle: u64) -> Freed {
        let h = self.handles.get(&handle)?;
        if !h.released || h.mappings > 0 {
            return None;
        }
        let h = self.handles.remove(&handle)?;
        Some((h.device, h.phys, h.len))
    }

    fn inside_reservation(&self, addr: u64, bytes: usize) -> bool {
        self.reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &(len, _))| {
                // Checked: a hostile caller may pass a range past `u64::MAX`.
                addr.checked_add(bytes as u64)
                    .is_some_and(|end| end <= base + len as u64)
            })
    }

    pub(crate) fn map(&mut self, addr: u64, bytes: usize, handle: u64) -> GpuResult<()> {
        match self.handles.get(&handle) {
            Some(h) if !h.released && h.len != bytes => Err(invalid(
                DriverCall::MemMap,
                "size differs from the handle's",
            )),
            _ => self.map_part(addr, bytes, handle, 0),
        }
    }

    /// Maps `bytes` of `handle` from `offset` on at `addr`.
    pub(crate) fn map_part(
        &mut self,
        addr: u64,
        bytes: usize,
        handle: u64,
        offset: usize,
    ) -> GpuResult<()> {
        let call = DriverCall::MemMap;
        self.supported(call)?;
        self.aligned(addr, call)?;
        self.aligned(bytes as u64, call)?;
        if !offset.is_multiple_of(self.granularity) {
            return Err(invalid(call, "offset not a multiple of the granularity"));
        }
        // As the driver: CUDA 13.0's (580.159, an H100) refused every
        // `cuMemMap` at a non-zero offset (the replays of 2026-12-06,
        // `notes/gpu-runs.md`), as its older documentation says ("currently
        // must be zero"). A simulator that mapped them predicted memory the
        // device never gave back.
        if offset != 0 {
            return Err(invalid(call, "offset into the handle not zero"));
        }
        match self.handles.get(&handle) {
            Some(h) if !h.released && offset.checked_add(bytes).is_some_and(|e| e <= h.len) => {}
            Some(h) if !h.released => return Err(invalid(call, "part past the handle's end")),
            _ => return Err(invalid(call, "not a live handle")),
        }
        if !self.inside_reservation(addr, bytes) {
            return Err(invalid(call, "range not inside one reservation"));
        }
        // Inside a reservation, so it does not overflow.
        let end = addr + bytes as u64;
        let before = self.mappings.range(..addr).next_back();
        let overlaps_before = before.is_some_and(|(&a, m)| a + m.len as u64 > addr);
        if overlaps_before || self.mappings.range(addr..end).next().is_some() {
            return Err(invalid(call, "range already mapped"));
        }
        self.mappings.insert(
            addr,
            Mapping {
                len: bytes,
                handle,
                offset,
                accessible: false,
            },
        );
        if let Some(h) = self.handles.get_mut(&handle) {
            h.mappings += 1;
        }
        Ok(())
    }

    /// The mappings that exactly tile `[addr, addr + bytes)`, or `None`.
    fn tiling(&self, addr: u64, bytes: usize) -> Option<Vec<u64>> {
        let end = addr.checked_add(bytes as u64)?;
        let mut at = addr;
        let mut keys = Vec::new();
        for (&a, m) in self.mappings.range(addr..end) {
            if a != at {
                return None;
            }
            at = a + m.len as u64;
            keys.push(a);
        }
        (at == end && bytes > 0).then_some(keys)
    }

    pub(crate) fn set_access(&mut self, addr: u64, bytes: usize) -> GpuResult<()> {
        let call = DriverCall::MemSetAccess;
        self.supported(call)?;
        let keys = self
            .tiling(addr, bytes)
            .ok_or_else(|| invalid(call, "range not entirely mapped"))?;
        for k in keys {
            if let Some(m) = self.mappings.get_mut(&k) {
                m.accessible = true;
            }
        }
        Ok(())
    }

    /// Unmaps whole mappings; returns the memory of released handles that
    /// nothing maps any more.
    pub(crate) fn unmap(&mut self, addr: u64, bytes: usize) -> GpuResult<Vec<(u32, u64, usize)>> {
        let call = DriverCall::MemUnmap;
        self.supported(call)?;
        let keys = self
            .tiling(addr, bytes)
            .ok_or_else(|| invalid(call, "range does not cover whole mappings"))?;
        let mut freed = Vec::new();
        for k in keys {
            let Some(m) = self.mappings.remove(&k) else {
                continue;
            };
            if let Some(h) = self.handles.get_mut(&m.handle) {
                h.mappings -= 1;
            }
            freed.extend(self.reclaim(m.handle));
        }
        Ok(freed)
    }

    /// The other addresses of the memory mapped over `[addr, addr + len)`:
    /// for each part of it, every other mapping of the same bytes of the
    /// same handle, as `(address, length)` ranges.
    pub(crate) fn aliases(&self, addr: u64, len: usize) -> Vec<(u64, usize)> {
        let end = addr.saturating_add(len as u64);
        let first = self
            .mappings
            .range(..=addr)
            .next_back()
            .map_or(addr, |(&a, _)| a);
        let mut out = Vec::new();
        for (&a, m) in self.mappings.range(first..end) {
            let (lo, hi) = (a.max(addr), (a + m.len as u64).min(end));
            if lo >= hi || self.handles.get(&m.handle).is_none_or(|h| h.mappings <= 1) {
                continue;
            }
            // The part's bytes in the handle.
            let (plo, phi) = (m.offset as u64 + (lo - a), m.offset as u64 + (hi - a));
            for (&b, o) in &self.mappings {
                if b == a || o.handle != m.handle {
                    continue;
                }
                let (olo, ohi) = (o.offset as u64, (o.offset + o.len) as u64);
                let (slo, shi) = (plo.max(olo), phi.min(ohi));
                if slo < shi {
                    out.push((b + (slo - olo), (shi - slo) as usize));
                }
            }
        }
        out
    }

    /// Whether `addr` lies in a mapping this device may access.
    pub(crate) fn accessible(&self, addr: u64) -> bool {
        self.mappings
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, m)| m.accessible && addr < a + m.len as u64)
    }

    /// Whether `addr` lies in a reservation (an arena address).
    pub(crate) fn reserved(&self, addr: u64) -> bool {
        self.inside_reservation(addr, 1)
    }

    /// Live handles (created and not yet given back).
    pub(crate) fn handle_count(&self) -> usize {
        self.handles.len()
    }

    /// Bytes held by the live handles of `device`.
    pub(crate) fn handle_bytes(&self, device: u32) -> usize {
        self.handles
            .values()
            .filter(|h| h.device == device)
            .map(|h| h.len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = 2 << 20;

    #[test]
    fn map_checks_what_cuda_checks_and_release_waits_for_unmap() {
        let mut vm = VirtualMemory::new(G);
        let va = vm.reserve(0, 4 * G).unwrap();
        let h = vm.create(0, 0x1000, G);
        assert!(vm.map(va + 1, G, h).is_err(), "unaligned");
        assert!(vm.map(va, 2 * G, h).is_err(), "wrong size");
        assert!(vm.map(va + 4 * G as u64, G, h).is_err(), "outside");
        vm.map(va, G, h).unwrap();
        assert!(vm.map(va, G, h).is_err(), "mapped twice at one place");
        assert!(!vm.accessible(va));
        vm.set_access(va, G).unwrap();
        assert!(vm.accessible(va + 5));
        assert!(vm.set_access(va, 2 * G).is_err(), "not all mapped");
        assert_eq!(vm.release(h).unwrap(), None, "still mapped");
        assert!(vm.release(h).is_err(), "released twice");
        assert!(vm.free_reservation(va, 4 * G).is_err(), "still mapped");
        assert!(vm.unmap(va, G / 2).is_err(), "part of a mapping");
        assert_eq!(vm.unmap(va, G).unwrap(), vec![(0, 0x1000, G)]);
        assert_eq!(vm.handle_count(), 0);
        vm.free_reservation(va, 4 * G).unwrap();
    }

    #[test]
    fn a_handle_mapped_twice_goes_back_after_its_last_unmap() {
        let mut vm = VirtualMemory::new(G);
        let va = vm.reserve(0, 8 * G).unwrap();
        let h = vm.create(0, 0x1000, 3 * G);
        vm.map(va, 3 * G, h).unwrap();
        assert!(
            vm.map_part(va + 4 * G as u64, 4 * G, h, 0).is_err(),
            "past the end"
        );
        assert!(
            vm.map_part(va + 4 * G as u64, G, h, G / 2).is_err(),
            "unaligned"
        );
        assert!(
            vm.map_part(va + 4 * G as u64, 2 * G, h, G).is_err(),
            "not from the handle's start (the driver refuses it)"
        );
        vm.map_part(va + 4 * G as u64, 2 * G, h, 0).unwrap();
        // Pages 0..2 of the handle are at both addresses.
        assert_eq!(vm.aliases(va + 4 * G as u64, 2 * G), vec![(va, 2 * G)]);
        assert_eq!(
            vm.aliases(va + 2 * G as u64, G),
            vec![],
            "page 2 is mapped once"
        );
        assert_eq!(vm.aliases(va + G as u64, G), vec![(va + 5 * G as u64, G)]);
        assert_eq!(vm.release(h).unwrap(), None);
        assert_eq!(
            vm.unmap(va, 3 * G).unwrap(),
            vec![],
            "mapped at the second address"
        );
        assert_eq!(vm.handle_count(), 1);
        assert_eq!(
            vm.unmap(va + 4 * G as u64, 2 * G).unwrap(),
            vec![(0, 0x1000, 3 * G)]
        );
        assert_eq!(vm.handle_count(), 0);
    }

    #[test]
    fn without_granularity_nothing_is_supported() {
        let mut vm = VirtualMemory::new(0);
        assert!(vm.reserve(0, G).is_err());
        assert!(vm.supported(DriverCall::MemCreate).is_err());
    }
}
