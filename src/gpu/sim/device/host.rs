//! Pinned host memory on the simulated device.
//!
//! # State
//!
//! - [`HostMemories`]: every live block of "pinned" host memory: real,
//!   zeroed bytes the host reads and writes (a safe `Vec` of aligned
//!   chunks), known to the rest of the simulator by a *simulated* address in
//!   a range of its own (`HOST_BASE`), which is what the copy calls take.
//!   Copies touch no real memory (device memory stores no data), so a host
//!   block freed while a copy is queued is a reported race, never a wild
//!   write.
//! - The **host stream**: a stream slot no call accepts and nothing runs
//!   on, whose clock component counts the host's own accesses. A host
//!   access ticks it in the host clock, so every operation queued after it
//!   is ordered after it (the host clock joins every enqueue), and it is
//!   checked against the host clock: a copy the host has not seen complete
//!   races with it.
//!
//! # Who changes it
//!
//! `host_alloc` and `host_free` (the pool's pinning and trimming),
//! `note_host_access` (a host buffer's slices), `note_host_reuse` (a pool
//! handing a block out again), and the host copies, which the race
//! detector checks as a kernel reading one side and writing the other.
//!
//! # Bounded
//!
//! [`HOST_CAPACITY`] bytes at once: a larger request fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`, as a real pin of more than the machine holds
//! does.

use std::collections::BTreeMap;
use std::ptr::NonNull;

use super::super::clock::Epoch;
use super::super::race::SimOp;
use super::{SimStream, State};
use crate::error::DriverCall;
use crate::error::driver_code::{INVALID_VALUE, OUT_OF_MEMORY};
use crate::gpu::{GpuError, GpuResult, HostMemory};
use crate::types::Access;

/// Where simulated host addresses start: below every device range
/// (devices at `0x7f00_…`, reservations at `0x2000_…`).
const HOST_BASE: u64 = 0x0100_0000_0000;
/// The most pinned host memory the simulated host holds at once.
pub(crate) const HOST_CAPACITY: usize = 64 << 30;
/// Alignment (and granule) of a block: 256 bytes, as the seam promises.
const CHUNK: usize = 256;

#[derive(Clone, Copy)]
#[repr(C, align(256))]
struct Chunk([u8; CHUNK]);

/// The live host blocks, by simulated address.
#[derive(Default)]
pub(crate) struct HostMemories {
    blocks: BTreeMap<u64, (Vec<Chunk>, usize)>,
    next: u64,
    held: usize,
    /// The host stream's slot, made at the first host memory call.
    slot: Option<usize>,
}

fn invalid(call: DriverCall, why: &str) -> GpuError {
    GpuError::driver(
        call,
        INVALID_VALUE,
        format!("CUDA_ERROR_INVALID_VALUE: {why}"),
    )
}

impl HostMemories {
    /// The block holding `addr..addr + len`, if one does.
    fn holds(&self, addr: u64, len: usize) -> bool {
        self.blocks
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, (_, bytes))| {
                addr.checked_add(len as u64)
                    .is_some_and(|end| end <= base + *bytes as u64)
            })
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> usize {
        self.held
    }
}

impl State {
    /// The host stream's slot (see the module docs), made once.
    fn host_slot(&mut self) -> usize {
        if let Some(s) = self.host_memory.slot {
            return s;
        }
        self.streams.push(SimStream {
            device: u32::MAX,
            destroyed: true,
            ..SimStream::default()
        });
        let s = self.streams.len() - 1;
        self.host_memory.slot = Some(s);
        self.races.set_host_stream(s);
        s
    }

    /// One host operation: ticks the host stream in the host clock.
    fn host_epoch(&mut self) -> Epoch {
        let s = self.host_slot();
        let tick = self.host.tick(s);
        Epoch { stream: s, tick }
    }

    /// Pins `bytes` of zeroed host memory.
    pub(crate) fn host_alloc(&mut self, bytes: usize) -> GpuResult<HostMemory> {
        let call = DriverCall::MemHostAlloc;
        if bytes == 0 {
            return Err(invalid(call, "zero bytes"));
        }
        let available = HOST_CAPACITY - self.host_memory.held;
        let chunks = bytes.div_ceil(CHUNK);
        if bytes > available {
            // As `cuMemHostAlloc` reports it: a driver error of the call.
            return Err(GpuError::driver(
                call,
                OUT_OF_MEMORY,
                format!(
                    "CUDA_ERROR_OUT_OF_MEMORY: {bytes} B asked, {available} B of pinnable host memory left"
                ),
            ));
        }
        let mut memory = vec![Chunk([0; CHUNK]); chunks];
        let ptr = NonNull::new(memory.as_mut_ptr().cast::<u8>()).expect("a Vec is never null");
        let addr = HOST_BASE + self.host_memory.next;
        // Page-aligned simulated addresses, never reused: a stale address
        // names no block.
        self.host_memory.next += (chunks * CHUNK).next_multiple_of(4096) as u64;
        self.host_memory.blocks.insert(addr, (memory, bytes));
        self.host_memory.held += bytes;
        let at = self.host_epoch();
        self.races.on_alloc(addr, bytes, at);
        Ok(HostMemory { ptr, addr, bytes })
    }

    /// Frees host memory: every copy of it must be seen complete by the
    /// host, or the free is reported (the real bytes go at once: no copy
    /// touches them).
    pub(crate) fn host_free(&mut self, memory: HostMemory) -> GpuResult<()> {
        let call = DriverCall::MemFreeHost;
        match self.host_memory.blocks.get(&memory.addr) {
            Some((chunks, bytes))
                if *bytes == memory.bytes
                    && chunks.as_ptr().cast::<u8>() == memory.ptr.as_ptr() => {}
            _ => return Err(invalid(call, "not a live pinned host allocation")),
        }
        self.host_memory.blocks.remove(&memory.addr);
        self.host_memory.held -= memory.bytes;
        self.races.on_host_free(memory.addr, &self.host);
        Ok(())
    }

    /// Queues a copy between host memory at `host` and device memory at
    /// `device` on stream `s`, checked as a kernel that reads one side and
    /// writes the other.
    pub(crate) fn host_copy(
        &mut self,
        s: usize,
        host: u64,
        device: u64,
        len: usize,
        to_device: bool,
    ) -> GpuResult<()> {
        if !self.host_memory.holds(host, len) {
            return Err(invalid(
                DriverCall::MemcpyHostAsync,
                "the host range is not pinned host memory of this device",
            ));
        }
        let accesses = if to_device {
            [(host, Access::Read), (device, Access::Write)]
        } else {
            [(device, Access::Read), (host, Access::Write)]
        };
        self.kernel(s, &accesses)
    }

    /// The host reads or writes the host memory at `addr`: checked against
    /// what the host has seen complete.
    pub(crate) fn host_access(&mut self, addr: u64, access: Access) {
        if !self.host_memory.holds(addr, 0) {
            return;
        }
        let at = self.host_epoch();
        let clock = self.host.clone();
        self.races.on_access(addr, SimOp::Host(access), at, &clock);
    }

    /// The host memory at `addr` changes owner: every copy of it must be
    /// seen complete by the host, and it starts a new history.
    pub(crate) fn host_reuse(&mut self, addr: u64) {
        let Some((_, bytes)) = self.host_memory.blocks.get(&addr) else {
            return;
        };
        let bytes = *bytes;
        self.races.on_host_free(addr, &self.host);
        let at = self.host_epoch();
        self.races.on_alloc(addr, bytes, at);
    }
}
