//! What the library's benches share: [`Bench`], one backend with the raw
//! seam, the stream-ordered resource and the caching tier on the same
//! device and streams, each doing one allocate + free pair (or one
//! cross-stream sequence) per call; and [`NullGpu`], a backend whose calls
//! do nothing, so that what a resource costs on it is its own bookkeeping.
//!
//! A test-support module of the benches, not a part of the library: the
//! null backend hands every allocation the same address, which is harmless
//! only because nothing ever touches it, and a library `Gpu` would have to
//! keep the trait's contract (live, distinct allocations) for whoever
//! builds a device on it. The measurement crate's GPU harnesses use the
//! same file (`measure/src/support.rs` includes it, adding the CUDA
//! backend and cudarc's pair), so there is one copy.
//!
//! On the simulated device and the null backend only: the rows on a real
//! GPU, and cudarc's own pair beside them, are the measurement crate's
//! (`cargo run --release -p streamalloc-measure --bin bench_table`).

#![allow(dead_code)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use streamalloc::CachingResource;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::gpu::{Gpu, GpuError, GpuResult, HostFn, RawEvent, RawPhysical};
use streamalloc::{
    Access, AllocTag, Device, DeviceMemoryResource, RawStream, StreamId, StreamOrderedResource,
    StreamPool,
};

/// Sizes of the single-thread pairs.
pub const SIZES: [(usize, &str); 3] = [(256, "256 B"), (64 << 10, "64 KiB"), (4 << 20, "4 MiB")];
/// Thread counts of the scaling rows.
pub const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
/// Size of the cross-stream and scaling pairs.
pub const SCALING_SIZE: usize = 64 << 10;

const T: AllocTag = AllocTag("bench");

/// One backend, with the raw seam, the stream-ordered resource and the cache
/// all on the same device, memory pool and streams.
pub struct Bench<G: Gpu> {
    pub name: &'static str,
    pub gpu: Arc<G>,
    pub pool: Arc<StreamPool>,
    pub resource: Arc<StreamOrderedResource<G>>,
    pub cache: Arc<CachingResource<Arc<StreamOrderedResource<G>>>>,
    events: Option<[RawEvent; 2]>,
}

impl<G: Gpu> Bench<G> {
    /// The three peers on `gpu`, over the streams of `pool`.
    pub fn new(name: &'static str, gpu: Arc<G>, pool: Arc<StreamPool>) -> Self {
        let device = Device::new(gpu.clone(), pool.clone()).expect("the pool is the gpu's");
        let resource = Arc::new(StreamOrderedResource::new(&device));
        let cache = Arc::new(CachingResource::new(resource.clone()));
        let events = gpu
            .event_create()
            .and_then(|a| Ok([a, gpu.event_create()?]))
            .ok();
        Bench {
            name,
            gpu,
            pool,
            resource,
            cache,
            events,
        }
    }

    pub fn stream(&self, i: usize) -> StreamId {
        self.pool.id(i).unwrap()
    }

    pub fn raw(&self, i: usize) -> RawStream {
        self.pool.raw(self.stream(i)).unwrap()
    }

    /// `cuMemAllocAsync` + `cuMemFreeAsync` (or the simulated pair).
    #[inline]
    pub fn raw_pair(&self, raw: RawStream, bytes: usize) {
        // SAFETY: `raw` is a stream of `self.pool`, which the bench holds;
        // `ptr` was just returned by `alloc_async` and is freed once.
        unsafe {
            let ptr = std::hint::black_box(self.gpu.alloc_async(bytes, raw).unwrap());
            self.gpu.free_async(ptr, raw).unwrap();
        }
    }

    /// allocate + deallocate on a resource.
    #[inline]
    pub fn pair<R: DeviceMemoryResource>(r: &R, stream: StreamId, bytes: usize) {
        let block = std::hint::black_box(r.allocate(bytes, stream, T).unwrap());
        r.deallocate(block).unwrap();
    }

    /// The driver sequence the brief names: alloc on A, record on A, B waits,
    /// free on A. (It leaves the free unordered with work on B.)
    #[inline]
    pub fn cross_raw_minimal(&self, a: RawStream, b: RawStream, bytes: usize) {
        let (g, e) = (&self.gpu, self.events.unwrap());
        // SAFETY: `a` and `b` are streams of `self.pool` (held by the bench);
        // the events are the bench's, made on `self.gpu` and destroyed only
        // in `Drop`; `ptr` was just allocated and is freed once.
        unsafe {
            let ptr = g.alloc_async(bytes, a).unwrap();
            g.event_record(e[0], a).unwrap();
            g.stream_wait_event(b, e[0]).unwrap();
            g.free_async(ptr, a).unwrap();
        }
    }

    /// The full driver sequence of a correct cross-stream use: alloc on A,
    /// B waits for A, (work on B), A waits for B, free on A.
    #[inline]
    pub fn cross_raw(&self, a: RawStream, b: RawStream, bytes: usize) {
        let (g, e) = (&self.gpu, self.events.unwrap());
        // SAFETY: as in `cross_raw_minimal`.
        unsafe {
            let ptr = g.alloc_async(bytes, a).unwrap();
            g.event_record(e[0], a).unwrap();
            g.stream_wait_event(b, e[0]).unwrap();
            g.event_record(e[1], b).unwrap();
            g.stream_wait_event(a, e[1]).unwrap();
            g.free_async(ptr, a).unwrap();
        }
    }

    /// The same through a resource's hooks: allocate on A, prepare and
    /// finish a use on B, deallocate.
    #[inline]
    pub fn cross<R: DeviceMemoryResource>(r: &R, a: StreamId, b: StreamId, bytes: usize) {
        let block = r.allocate(bytes, a, T).unwrap();
        r.prepare_block_use(block.id(), b, Access::Write).unwrap();
        r.finish_block_use(block.id(), b, Access::Write).unwrap();
        r.deallocate(block).unwrap();
    }

    /// Waits for every stream and reaps the resource's pending frees (as a
    /// reaper would), so that nothing piles up between measurements.
    pub fn sync(&self) {
        for i in 0..self.pool.len() {
            // SAFETY: a stream of `self.pool`, which the bench holds.
            unsafe { self.gpu.stream_synchronize(self.raw(i)) }.unwrap();
        }
        self.resource.reap_pending().unwrap();
    }
}

impl<G: Gpu> Drop for Bench<G> {
    fn drop(&mut self) {
        self.sync();
        for e in self.events.into_iter().flatten() {
            // SAFETY: the bench's own events, destroyed once, here.
            let _ = unsafe { self.gpu.event_destroy(e) };
        }
    }
}

/// A backend whose calls do nothing (every allocation gets the same
/// address): what a resource costs on top of it is the resource's own
/// bookkeeping. By default it has no events, so it only runs the pair rows;
/// [`NullGpu::with_events_on`] gives it events that are always complete (their
/// handles come from a never-run simulated device), for the bookkeeping of
/// completion points.
///
/// It has virtual memory management that does nothing (reservations are
/// addresses from a counter, physical handles are all the same number), so
/// that the cache's arena is measured as it runs on CUDA.
#[derive(Debug, Default)]
pub struct NullGpu {
    events: Option<Arc<SimGpu>>,
    next_reservation: std::sync::atomic::AtomicU64,
    /// The context of the simulated device whose stream handles it runs
    /// on, so that `Device::new` takes its pool.
    context: u64,
}

impl NullGpu {
    /// A null backend on the stream handles of `handles`, a simulated
    /// device that never runs: [`Device::new`] takes the pools of `handles`
    /// with it (same context). No events: only the pair rows run on it.
    pub fn on_handles_of(handles: &Arc<SimGpu>) -> Self {
        NullGpu {
            context: handles.context_id(),
            ..NullGpu::default()
        }
    }

    /// The same, with events that exist and are always complete (made on
    /// `handles`, which never runs them), for the bookkeeping of
    /// completion points.
    pub fn with_events_on(handles: &Arc<SimGpu>) -> Self {
        NullGpu {
            events: Some(handles.clone()),
            ..NullGpu::on_handles_of(handles)
        }
    }
}

// SAFETY: the null backend's addresses are never touched: its memory calls
// do nothing, and its pools hold no cudarc streams (a `CudaBuffer`
// refuses them); its queries answer "done" because nothing is ever queued.
unsafe impl Gpu for NullGpu {
    fn ordinal(&self) -> u32 {
        0
    }
    fn context_id(&self) -> u64 {
        self.context
    }
    unsafe fn alloc_async(&self, bytes: usize, _: RawStream) -> GpuResult<u64> {
        Ok(if bytes == 0 { 0 } else { 1 << 40 })
    }
    unsafe fn free_async(&self, _: u64, _: RawStream) -> GpuResult<()> {
        Ok(())
    }
    fn event_create(&self) -> GpuResult<RawEvent> {
        match &self.events {
            Some(handles) => handles.event_create(),
            None => Err(GpuError::driver(
                DriverCall::EventCreate,
                streamalloc::gpu::driver_code::NOT_SUPPORTED,
                "the null backend has no events",
            )),
        }
    }
    unsafe fn event_record(&self, _: RawEvent, _: RawStream) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn event_query(&self, _: RawEvent) -> GpuResult<bool> {
        Ok(true)
    }
    unsafe fn event_synchronize(&self, _: RawEvent) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn event_destroy(&self, _: RawEvent) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn stream_wait_event(&self, _: RawStream, _: RawEvent) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn stream_synchronize(&self, _: RawStream) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn stream_query(&self, _: RawStream) -> GpuResult<bool> {
        Ok(true)
    }
    unsafe fn launch_host_fn(&self, _: RawStream, f: HostFn) -> GpuResult<()> {
        f();
        Ok(())
    }
    unsafe fn memset_async(&self, _: u64, _: u8, _: usize, _: RawStream) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn copy_async(&self, _: u64, _: u64, _: usize, _: RawStream) -> GpuResult<()> {
        Ok(())
    }
    fn mem_info(&self) -> GpuResult<(usize, usize)> {
        Ok((usize::MAX, usize::MAX))
    }
    fn vm_granularity(&self) -> GpuResult<usize> {
        Ok(2 << 20)
    }
    fn address_reserve(&self, bytes: usize) -> GpuResult<u64> {
        let stride = (bytes as u64).next_multiple_of(1 << 40);
        let n = self
            .next_reservation
            .fetch_add(stride, std::sync::atomic::Ordering::Relaxed);
        Ok((1 << 44) + n)
    }
    unsafe fn address_free(&self, _: u64, _: usize) -> GpuResult<()> {
        Ok(())
    }
    fn mem_create(&self, _: usize) -> GpuResult<RawPhysical> {
        Ok(RawPhysical::new(1))
    }
    unsafe fn mem_release(&self, _: RawPhysical) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn mem_map(&self, _: u64, _: usize, _: RawPhysical) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn mem_set_access(&self, _: u64, _: usize) -> GpuResult<()> {
        Ok(())
    }
    unsafe fn mem_unmap(&self, _: u64, _: usize) -> GpuResult<()> {
        Ok(())
    }
    /// Nothing is held: the null backend's memory is not real.
    fn memory_held(&self) -> GpuResult<streamalloc::gpu::HeldMemory> {
        Ok(streamalloc::gpu::HeldMemory::default())
    }
    fn reset_memory_held_high(&self) -> GpuResult<()> {
        Ok(())
    }
}

/// The null backend, on the stream handles of a (never used) simulated
/// device.
pub fn null() -> Bench<NullGpu> {
    let handles = SimGpu::builder().manual().build();
    let pool = handles.stream_pool(THREADS[THREADS.len() - 1]);
    Bench::new("null", Arc::new(NullGpu::on_handles_of(&handles)), pool)
}

/// The simulated device (threaded progress, as a GPU would run).
pub fn sim() -> Bench<SimGpu> {
    let gpu = SimGpu::builder().capacity(64 << 30).build();
    let pool = gpu.stream_pool(THREADS[THREADS.len() - 1]);
    Bench::new("sim", gpu, pool)
}

/// Runs `per_thread(thread)` on `threads` threads at once, each `iters`
/// times, and returns the wall time from the first thread's start to the
/// last thread's end (measured by the workers, so that a main thread
/// scheduled late on a busy machine does not shorten it).
pub fn run_threads(
    threads: usize,
    iters: u64,
    per_thread: impl Fn(usize) + Send + Sync,
) -> Duration {
    let start = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (start, f) = (&start, &per_thread);
                scope.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        f(t);
                    }
                    (t0, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = spans.iter().map(|s| s.0).min().unwrap();
    let last = spans.iter().map(|s| s.1).max().unwrap();
    last - first
}
