//! Counting the driver calls a replay or a benchmark makes: [`CountingGpu`]
//! wraps any backend, and [`CallCounts`] says how many calls of each kind
//! went through, the time spent in them, and what they would cost on the
//! H200. `trace_replay --calls` and `service_bench --diag` read them.
//!
//! Counting costs two `Instant::now()` and two relaxed atomic adds per call
//! (well under 0.1 µs): figures taken through it are for reading the calls,
//! the plain runs for comparing allocators.
//!
//! # Why
//! An allocator's time per operation on a real trace is mostly the driver
//! calls it cannot avoid: a cache hit costs tens of nanoseconds, a growth
//! of the virtual-memory arena (`cuMemCreate` + `cuMemMap` +
//! `cuMemSetAccess`) tens of microseconds. Counting the calls by kind on
//! the simulated device, where the count is deterministic, shows where the
//! time goes before any GPU run; on CUDA, the time measured inside each
//! kind says it again with the real costs.
//!
//! # The H200 model
//! [`h200_cost_us`] holds the per-call figures measured on the H200
//! (`notes/vmm-costs.md` for the virtual-memory calls, `docs/DESIGN.md`
//! "What the hardware costs" for the others). `cuMemSetAccess` and
//! `cuMemUnmap` cost per physical *handle* under the range, not per call
//! nor per byte (24.5 µs a handle in a run against 38.5 µs for one
//! alone), so the wrapper remembers which ranges were mapped with one
//! handle each and counts the handles a call covers.
//!
//! # State
//! Per kind: an atomic count and atomic nanoseconds; the mapped ranges
//! (start → length) behind a mutex, touched only by the virtual-memory
//! calls, never by a cache hit.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use streamalloc::DriverCall;
use streamalloc::RawStream;
use streamalloc::gpu::{Gpu, GpuResult, HeldMemory, HostFn, HostMemory, RawEvent, RawPhysical};

const KINDS: usize = DriverCall::ALL.len();

fn index(call: DriverCall) -> usize {
    DriverCall::ALL
        .iter()
        .position(|&c| c == call)
        .expect("DriverCall::ALL lists every kind")
}

/// What one call of `call` costs on the H200, in microseconds, where it
/// was measured; `None` where it was not (the call is counted, not
/// costed). For `MemSetAccess` and `MemUnmap` see
/// [`CallCounts::modelled_us`]: they are costed per handle.
pub fn h200_cost_us(call: DriverCall) -> Option<f64> {
    Some(match call {
        // notes/vmm-costs.md (2 MiB: 14.1 µs, 32 MiB: 10.5 µs).
        DriverCall::MemCreate => 12.3,
        DriverCall::MemMap => 3.8,
        DriverCall::MemSetAccess => 38.5,
        DriverCall::MemUnmap => 23.8,
        DriverCall::MemRelease => 10.7,
        // docs/DESIGN.md: 0.65–0.88 µs an allocate + free pair.
        DriverCall::AllocAsync | DriverCall::FreeAsync => 0.38,
        DriverCall::EventRecord | DriverCall::EventQuery => 0.25,
        DriverCall::StreamWaitEvent => 0.30,
        DriverCall::LaunchHostFunc => 2.8,
        _ => return None,
    })
}

/// `cuMemSetAccess` per handle after the first in one call, and
/// `cuMemUnmap` likewise (notes/vmm-costs.md, runs of 8 and 32 handles).
const SET_ACCESS_MORE_US: f64 = 24.5;
const UNMAP_MORE_US: f64 = 17.0;

/// How many calls of each kind a backend saw, and the time inside them.
#[derive(Clone, PartialEq, Default)]
pub struct CallCounts {
    calls: [u64; KINDS],
    nanos: [u64; KINDS],
    /// Handles covered by `cuMemSetAccess` and `cuMemUnmap` calls.
    set_access_handles: u64,
    unmap_handles: u64,
}

impl CallCounts {
    /// Calls of kind `call`.
    pub fn count(&self, call: DriverCall) -> u64 {
        self.calls[index(call)]
    }

    /// Nanoseconds spent inside calls of kind `call`.
    pub fn nanos(&self, call: DriverCall) -> u64 {
        self.nanos[index(call)]
    }

    /// Physical handles the `cuMemSetAccess` calls covered.
    pub fn set_access_handles(&self) -> u64 {
        self.set_access_handles
    }

    /// The calls made since `earlier` (a snapshot of the same backend).
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        CallCounts {
            calls: std::array::from_fn(|i| self.calls[i] - earlier.calls[i]),
            nanos: std::array::from_fn(|i| self.nanos[i] - earlier.nanos[i]),
            set_access_handles: self.set_access_handles - earlier.set_access_handles,
            unmap_handles: self.unmap_handles - earlier.unmap_handles,
        }
    }

    /// What the counted calls of `call` would cost on the H200, in
    /// microseconds (`None`: not measured there).
    pub fn modelled_us(&self, call: DriverCall) -> Option<f64> {
        let n = self.count(call) as f64;
        let per = h200_cost_us(call)?;
        Some(match call {
            DriverCall::MemSetAccess => {
                n * per + (self.set_access_handles as f64 - n).max(0.0) * SET_ACCESS_MORE_US
            }
            DriverCall::MemUnmap => {
                n * per + (self.unmap_handles as f64 - n).max(0.0) * UNMAP_MORE_US
            }
            _ => n * per,
        })
    }

    /// The modelled H200 cost of every counted call, in microseconds.
    pub fn modelled_total_us(&self) -> f64 {
        DriverCall::ALL
            .iter()
            .filter_map(|&c| self.modelled_us(c))
            .sum()
    }

    /// One line: for each kind called, calls and µs per `per` (requests),
    /// then the total µs per request inside the backend.
    pub fn per_request_line(&self, per: usize) -> String {
        let per = per.max(1) as f64;
        let mut line = String::new();
        let mut total = 0.0;
        for (i, call) in DriverCall::ALL.iter().enumerate() {
            if self.calls[i] == 0 {
                continue;
            }
            let us = self.nanos[i] as f64 / 1e3 / per;
            total += us;
            line += &format!(" {call:?} {:.2}× {us:.2}µs;", self.calls[i] as f64 / per);
        }
        format!("{line} total {total:.2} µs/request in the driver")
    }

    /// The measured time inside each kind of call, `us_KIND=µs` pairs on
    /// one line (kinds never called are left out).
    pub fn times_line(&self) -> String {
        let mut parts = Vec::new();
        for (i, call) in DriverCall::ALL.iter().enumerate() {
            if self.calls[i] > 0 {
                parts.push(format!("us_{call:?}={:.1}", self.nanos[i] as f64 / 1e3));
            }
        }
        parts.join(" ")
    }

    /// The counts as `key=value` pairs on one line (kinds never called are
    /// left out), then the modelled H200 total.
    pub fn line(&self) -> String {
        let mut out = String::new();
        for (i, call) in DriverCall::ALL.iter().enumerate() {
            if self.calls[i] == 0 {
                continue;
            }
            out.push_str(&format!("{call:?}={} ", self.calls[i]));
        }
        out.push_str(&format!(
            "set_access_handles={} h200_model_us={:.0}",
            self.set_access_handles,
            self.modelled_total_us()
        ));
        out
    }
}

impl fmt::Debug for CallCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

/// A backend that counts and times every call it forwards to `G`.
#[derive(Debug)]
pub struct CountingGpu<G> {
    inner: Arc<G>,
    calls: [AtomicU64; KINDS],
    nanos: [AtomicU64; KINDS],
    set_access_handles: AtomicU64,
    unmap_handles: AtomicU64,
    /// Mapped ranges, start → length: one handle each.
    mapped: Mutex<BTreeMap<u64, usize>>,
}

impl<G: Gpu> CountingGpu<G> {
    /// Wraps `inner`; every count starts at zero.
    pub fn new(inner: Arc<G>) -> Self {
        CountingGpu {
            inner,
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            set_access_handles: AtomicU64::new(0),
            unmap_handles: AtomicU64::new(0),
            mapped: Mutex::new(BTreeMap::new()),
        }
    }

    /// The backend under the counts.
    pub fn inner(&self) -> &Arc<G> {
        &self.inner
    }

    /// The counts so far.
    pub fn counts(&self) -> CallCounts {
        CallCounts {
            calls: std::array::from_fn(|i| self.calls[i].load(Ordering::Relaxed)),
            nanos: std::array::from_fn(|i| self.nanos[i].load(Ordering::Relaxed)),
            set_access_handles: self.set_access_handles.load(Ordering::Relaxed),
            unmap_handles: self.unmap_handles.load(Ordering::Relaxed),
        }
    }

    /// Runs `f` as a call of kind `call`: counted, and timed.
    fn count<T>(&self, call: DriverCall, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let i = index(call);
        self.nanos[i].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls[i].fetch_add(1, Ordering::Relaxed);
        out
    }

    /// Mapped ranges (one handle each) that `[addr, addr + bytes)` covers.
    fn handles_under(&self, addr: u64, bytes: usize) -> u64 {
        let mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
        let end = addr + bytes as u64;
        mapped
            .range(..end)
            .rev()
            .take_while(|&(&s, &l)| s + l as u64 > addr)
            .count() as u64
    }
}

// SAFETY: every call is `G`'s, counted and timed: `G` keeps the contract.
unsafe impl<G: Gpu> Gpu for CountingGpu<G> {
    fn ordinal(&self) -> u32 {
        self.inner.ordinal()
    }

    fn context_id(&self) -> u64 {
        self.inner.context_id()
    }

    unsafe fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64> {
        // SAFETY: forwarded with the caller's guarantees, to the backend
        // they were made for (this wrapper holds no handle of its own).
        self.count(DriverCall::AllocAsync, || unsafe {
            self.inner.alloc_async(bytes, stream)
        })
    }

    unsafe fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::FreeAsync, || unsafe {
            self.inner.free_async(ptr, stream)
        })
    }

    fn event_create(&self) -> GpuResult<RawEvent> {
        self.count(DriverCall::EventCreate, || self.inner.event_create())
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::EventRecord, || unsafe {
            self.inner.event_record(event, stream)
        })
    }

    unsafe fn event_query(&self, event: RawEvent) -> GpuResult<bool> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::EventQuery, || unsafe {
            self.inner.event_query(event)
        })
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::EventSynchronize, || unsafe {
            self.inner.event_synchronize(event)
        })
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::EventDestroy, || unsafe {
            self.inner.event_destroy(event)
        })
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::StreamWaitEvent, || unsafe {
            self.inner.stream_wait_event(stream, event)
        })
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::StreamSynchronize, || unsafe {
            self.inner.stream_synchronize(stream)
        })
    }

    unsafe fn stream_query(&self, stream: RawStream) -> GpuResult<bool> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::StreamQuery, || unsafe {
            self.inner.stream_query(stream)
        })
    }

    unsafe fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::LaunchHostFunc, || unsafe {
            self.inner.launch_host_fn(stream, f)
        })
    }

    unsafe fn memset_async(
        &self,
        ptr: u64,
        value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::MemsetAsync, || unsafe {
            self.inner.memset_async(ptr, value, len, stream)
        })
    }

    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::CopyAsync, || unsafe {
            self.inner.copy_async(dst, src, len, stream)
        })
    }

    fn mem_info(&self) -> GpuResult<(usize, usize)> {
        self.count(DriverCall::MemGetInfo, || self.inner.mem_info())
    }

    fn host_alloc(&self, bytes: usize, numa_node: Option<u32>) -> GpuResult<HostMemory> {
        self.count(DriverCall::MemHostAlloc, || {
            self.inner.host_alloc(bytes, numa_node)
        })
    }

    unsafe fn host_free(&self, memory: HostMemory) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::MemFreeHost, || unsafe {
            self.inner.host_free(memory)
        })
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::MemcpyHostAsync, || unsafe {
            self.inner.copy_to_device_async(dst, src, len, stream)
        })
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::MemcpyHostAsync, || unsafe {
            self.inner.copy_to_host_async(dst, src, len, stream)
        })
    }

    fn note_host_access(&self, addr: u64, access: streamalloc::Access) {
        self.inner.note_host_access(addr, access);
    }

    fn note_host_reuse(&self, addr: u64) {
        self.inner.note_host_reuse(addr);
    }

    /// Counted as `Init`, as is `destroy_stream`.
    fn create_stream(&self) -> GpuResult<RawStream> {
        self.count(DriverCall::Init, || self.inner.create_stream())
    }

    fn vm_granularity(&self) -> GpuResult<usize> {
        self.inner.vm_granularity()
    }

    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        self.count(DriverCall::AddressReserve, || {
            self.inner.address_reserve(bytes)
        })
    }

    unsafe fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::AddressFree, || unsafe {
            self.inner.address_free(addr, bytes)
        })
    }

    fn mem_create(&self, bytes: usize) -> GpuResult<RawPhysical> {
        self.count(DriverCall::MemCreate, || self.inner.mem_create(bytes))
    }

    unsafe fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::MemRelease, || unsafe {
            self.inner.mem_release(handle)
        })
    }

    unsafe fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        let out = self.count(DriverCall::MemMap, || unsafe {
            self.inner.mem_map(addr, bytes, handle)
        });
        if out.is_ok() {
            let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
            mapped.insert(addr, bytes);
        }
        out
    }

    unsafe fn mem_map_part(
        &self,
        addr: u64,
        bytes: usize,
        handle: RawPhysical,
        offset: usize,
    ) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        let out = self.count(DriverCall::MemMap, || unsafe {
            self.inner.mem_map_part(addr, bytes, handle, offset)
        });
        if out.is_ok() {
            let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
            mapped.insert(addr, bytes);
        }
        out
    }

    unsafe fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let handles = self.handles_under(addr, bytes).max(1);
        self.set_access_handles
            .fetch_add(handles, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::MemSetAccess, || unsafe {
            self.inner.mem_set_access(addr, bytes)
        })
    }

    unsafe fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        let handles = self.handles_under(addr, bytes).max(1);
        self.unmap_handles.fetch_add(handles, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees (as above).
        let out = self.count(DriverCall::MemUnmap, || unsafe {
            self.inner.mem_unmap(addr, bytes)
        });
        if out.is_ok() {
            let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
            let end = addr + bytes as u64;
            let gone: Vec<u64> = mapped.range(addr..end).map(|(&s, _)| s).collect();
            for s in gone {
                mapped.remove(&s);
            }
        }
        out
    }

    fn note_suballocation(&self, addr: u64, bytes: usize, stream: RawStream) {
        self.inner.note_suballocation(addr, bytes, stream);
    }

    fn note_subfree(&self, addr: u64, stream: RawStream) {
        self.inner.note_subfree(addr, stream);
    }

    fn note_subfree_completed(&self, addr: u64, stream: RawStream) {
        self.inner.note_subfree_completed(addr, stream);
    }

    fn note_suballocation_undone(&self, addr: u64, stream: RawStream) {
        self.inner.note_suballocation_undone(addr, stream);
    }

    fn memory_held(&self) -> GpuResult<HeldMemory> {
        self.inner.memory_held()
    }

    fn reset_memory_held_high(&self) -> GpuResult<()> {
        self.inner.reset_memory_held_high()
    }

    unsafe fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        // SAFETY: forwarded with the caller's guarantees (as above).
        self.count(DriverCall::Init, || unsafe {
            self.inner.destroy_stream(stream)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamalloc::gpu::sim::SimGpu;

    #[test]
    fn counts_calls_and_the_handles_a_set_access_covers() {
        let gpu = CountingGpu::new(SimGpu::builder().manual().build());
        let page = gpu.vm_granularity().unwrap();
        let base = gpu.address_reserve(8 * page).unwrap();
        let a = gpu.mem_create(page).unwrap();
        let b = gpu.mem_create(2 * page).unwrap();
        // SAFETY: `base` is a live reservation of 8 pages; the handles are
        // live, of the sizes mapped, over disjoint pages of it.
        unsafe {
            gpu.mem_map(base, page, a).unwrap();
            gpu.mem_map(base + page as u64, 2 * page, b).unwrap();
            gpu.mem_set_access(base, 3 * page).unwrap();
            gpu.mem_unmap(base, 3 * page).unwrap();
            gpu.mem_release(a).unwrap();
            gpu.mem_release(b).unwrap();
            gpu.address_free(base, 8 * page).unwrap();
        }
        let c = gpu.counts();
        assert_eq!(c.count(DriverCall::MemCreate), 2);
        assert_eq!(c.count(DriverCall::MemMap), 2);
        assert_eq!(c.count(DriverCall::MemSetAccess), 1);
        assert_eq!(c.set_access_handles(), 2, "one call over two handles");
        assert_eq!(c.count(DriverCall::MemUnmap), 1);
        let model = 2.0 * 12.3 + 2.0 * 3.8 + (38.5 + 24.5) + (23.8 + 17.0) + 2.0 * 10.7;
        assert!((c.modelled_total_us() - model).abs() < 1e-6, "{c:?}");
        assert!(c.line().contains("MemSetAccess=1 "), "{}", c.line());
    }
}
