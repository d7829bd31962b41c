//! [`CountingGpu`]: a backend that forwards every call to another and counts
//! it, with the time spent inside it, by kind. The service benchmark's
//! `--diag` runs the streamalloc way over it on the H200, so that the calls
//! one request costs (and where their time goes) are read from the same run
//! as the throughput, not guessed from the simulated device.
//!
//! Counting costs two `Instant::now()` and two relaxed atomic adds per call
//! (well under 0.1 µs): the `--diag` rows are for reading the calls, the
//! plain rows for comparing ways.

#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use streamalloc::RawStream;
use streamalloc::error::DriverCall;
use streamalloc::gpu::{Gpu, GpuResult, HeldMemory, HostFn, RawEvent, RawPhysical};

/// Calls and nanoseconds of one kind.
#[derive(Debug, Default)]
struct Tally {
    calls: AtomicU64,
    nanos: AtomicU64,
}

/// What a [`CountingGpu`] saw: per kind of call, how many and how long
/// (summed over every thread).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallCounts {
    /// `(kind, calls, total nanoseconds)`, in [`DriverCall::ALL`] order
    /// (plus `StreamCreate`/`StreamDestroy` folded into `Init`).
    pub by_kind: Vec<(DriverCall, u64, u64)>,
}

impl CallCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        let by_kind = self
            .by_kind
            .iter()
            .map(|&(k, c, n)| {
                let (c0, n0) = earlier
                    .by_kind
                    .iter()
                    .find(|e| e.0 == k)
                    .map_or((0, 0), |e| (e.1, e.2));
                (k, c - c0, n - n0)
            })
            .collect();
        CallCounts { by_kind }
    }

    /// Calls of `kind`.
    pub fn calls(&self, kind: DriverCall) -> u64 {
        self.by_kind.iter().find(|e| e.0 == kind).map_or(0, |e| e.1)
    }

    /// One line: for each kind called, calls and µs per `per` (requests),
    /// then the total µs per request inside the backend.
    pub fn per_request_line(&self, per: usize) -> String {
        let per = per.max(1) as f64;
        let mut line = String::new();
        let mut total = 0.0;
        for &(k, c, n) in &self.by_kind {
            if c == 0 {
                continue;
            }
            let us = n as f64 / 1e3 / per;
            total += us;
            line += &format!(" {k:?} {:.2}× {us:.2}µs;", c as f64 / per);
        }
        format!("{line} total {total:.2} µs/request in the driver")
    }
}

/// A backend forwarding to `G` and counting each call. See the [module
/// documentation](self).
pub struct CountingGpu<G: Gpu> {
    inner: Arc<G>,
    tallies: Vec<Tally>,
}

impl<G: Gpu> std::fmt::Debug for CountingGpu<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingGpu").finish_non_exhaustive()
    }
}

impl<G: Gpu> CountingGpu<G> {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<G>) -> Self {
        CountingGpu {
            inner,
            tallies: DriverCall::ALL.iter().map(|_| Tally::default()).collect(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> CallCounts {
        CallCounts {
            by_kind: DriverCall::ALL
                .iter()
                .zip(&self.tallies)
                .map(|(&k, t)| {
                    (
                        k,
                        t.calls.load(Ordering::Relaxed),
                        t.nanos.load(Ordering::Relaxed),
                    )
                })
                .collect(),
        }
    }

    fn timed<T>(&self, kind: DriverCall, f: impl FnOnce(&G) -> T) -> T {
        let t = Instant::now();
        let out = f(&self.inner);
        let nanos = t.elapsed().as_nanos() as u64;
        let i = DriverCall::ALL.iter().position(|&k| k == kind).unwrap_or(0);
        self.tallies[i].calls.fetch_add(1, Ordering::Relaxed);
        self.tallies[i].nanos.fetch_add(nanos, Ordering::Relaxed);
        out
    }
}

// SAFETY (every `unsafe` block below): each method forwards to the same
// method of the wrapped backend with the caller's arguments unchanged, so
// the caller's proof of that method's Safety list is the proof needed.
impl<G: Gpu> Gpu for CountingGpu<G> {
    fn ordinal(&self) -> u32 {
        self.inner.ordinal()
    }
    unsafe fn alloc_async(&self, bytes: usize, stream: RawStream) -> GpuResult<u64> {
        self.timed(DriverCall::AllocAsync, |g| unsafe {
            g.alloc_async(bytes, stream)
        })
    }
    unsafe fn free_async(&self, ptr: u64, stream: RawStream) -> GpuResult<()> {
        self.timed(DriverCall::FreeAsync, |g| unsafe {
            g.free_async(ptr, stream)
        })
    }
    fn event_create(&self) -> GpuResult<RawEvent> {
        self.timed(DriverCall::EventCreate, |g| g.event_create())
    }
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> GpuResult<()> {
        self.timed(DriverCall::EventRecord, |g| unsafe {
            g.event_record(event, stream)
        })
    }
    unsafe fn event_query(&self, event: RawEvent) -> GpuResult<bool> {
        self.timed(DriverCall::EventQuery, |g| unsafe { g.event_query(event) })
    }
    unsafe fn event_synchronize(&self, event: RawEvent) -> GpuResult<()> {
        self.timed(DriverCall::EventSynchronize, |g| unsafe {
            g.event_synchronize(event)
        })
    }
    unsafe fn event_destroy(&self, event: RawEvent) -> GpuResult<()> {
        self.timed(DriverCall::EventDestroy, |g| unsafe {
            g.event_destroy(event)
        })
    }
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> GpuResult<()> {
        self.timed(DriverCall::StreamWaitEvent, |g| unsafe {
            g.stream_wait_event(stream, event)
        })
    }
    unsafe fn stream_synchronize(&self, stream: RawStream) -> GpuResult<()> {
        self.timed(DriverCall::StreamSynchronize, |g| unsafe {
            g.stream_synchronize(stream)
        })
    }
    unsafe fn launch_host_fn(&self, stream: RawStream, f: HostFn) -> GpuResult<()> {
        self.timed(DriverCall::LaunchHostFunc, |g| unsafe {
            g.launch_host_fn(stream, f)
        })
    }
    unsafe fn memset_async(
        &self,
        ptr: u64,
        value: u8,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        self.timed(DriverCall::MemsetAsync, |g| unsafe {
            g.memset_async(ptr, value, len, stream)
        })
    }
    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> GpuResult<()> {
        self.timed(DriverCall::CopyAsync, |g| unsafe {
            g.copy_async(dst, src, len, stream)
        })
    }
    fn mem_info(&self) -> GpuResult<(usize, usize)> {
        self.timed(DriverCall::MemGetInfo, |g| g.mem_info())
    }
    fn create_stream(&self) -> GpuResult<RawStream> {
        self.timed(DriverCall::Init, |g| g.create_stream())
    }
    fn vm_granularity(&self) -> GpuResult<usize> {
        self.inner.vm_granularity()
    }
    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        self.timed(DriverCall::AddressReserve, |g| g.address_reserve(bytes))
    }
    unsafe fn address_free(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        self.timed(DriverCall::AddressFree, |g| unsafe {
            g.address_free(addr, bytes)
        })
    }
    fn mem_create(&self, bytes: usize) -> GpuResult<RawPhysical> {
        self.timed(DriverCall::MemCreate, |g| g.mem_create(bytes))
    }
    unsafe fn mem_release(&self, handle: RawPhysical) -> GpuResult<()> {
        self.timed(DriverCall::MemRelease, |g| unsafe { g.mem_release(handle) })
    }
    unsafe fn mem_map(&self, addr: u64, bytes: usize, handle: RawPhysical) -> GpuResult<()> {
        self.timed(DriverCall::MemMap, |g| unsafe {
            g.mem_map(addr, bytes, handle)
        })
    }
    unsafe fn mem_set_access(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        self.timed(DriverCall::MemSetAccess, |g| unsafe {
            g.mem_set_access(addr, bytes)
        })
    }
    unsafe fn mem_unmap(&self, addr: u64, bytes: usize) -> GpuResult<()> {
        self.timed(DriverCall::MemUnmap, |g| unsafe {
            g.mem_unmap(addr, bytes)
        })
    }
    fn note_suballocation(&self, addr: u64, bytes: usize, stream: RawStream) {
        self.inner.note_suballocation(addr, bytes, stream)
    }
    fn note_subfree(&self, addr: u64, stream: RawStream) {
        self.inner.note_subfree(addr, stream)
    }
    fn memory_held(&self) -> GpuResult<HeldMemory> {
        self.inner.memory_held()
    }
    fn reset_memory_held_high(&self) -> GpuResult<()> {
        self.inner.reset_memory_held_high()
    }
    unsafe fn destroy_stream(&self, stream: RawStream) -> GpuResult<()> {
        self.timed(DriverCall::Init, |g| unsafe { g.destroy_stream(stream) })
    }
}
