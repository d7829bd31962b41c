//! Shared set-up for the integration tests: one test body, every backend.

#![allow(dead_code)]

pub mod arena;
pub mod bounded;

use std::sync::Arc;

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{Device, SimResource, StreamId, StreamOrderedResource, StreamPool};

/// A device, a resource on it, its pool's stream ids, and (on the simulated
/// device) the simulator, so that tests can read races.
pub struct Fixture<G: Gpu> {
    pub resource: Arc<StreamOrderedResource<G>>,
    pub device: Device<G>,
    pub pool: Arc<StreamPool>,
    pub streams: Vec<StreamId>,
    pub sim: Option<Arc<SimGpu>>,
}

impl<G: Gpu> Fixture<G> {
    pub fn stream(&self, i: usize) -> StreamId {
        self.streams[i]
    }
}

/// `n` in an ordinary run, `under_miri` under Miri, which interprets the
/// test a hundred times or more slower: loops that only repeat work are cut
/// there (Miri looks for undefined behaviour, not for coverage;
/// `scripts/miri.sh` lists what runs).
pub const fn scaled(n: usize, under_miri: usize) -> usize {
    if cfg!(miri) { under_miri } else { n }
}

/// A hang guard of `secs` seconds (never a timing assertion), thirty times
/// longer under Miri.
pub const fn guard(secs: u64) -> std::time::Duration {
    std::time::Duration::from_secs(if cfg!(miri) { 30 * secs } else { secs })
}

/// A manual (deterministic) simulated device with `streams` streams.
pub fn sim(streams: usize) -> Fixture<SimGpu> {
    sim_with(
        SimGpu::builder().manual().capacity(64 << 30).build(),
        streams,
    )
}

pub fn sim_with(gpu: Arc<SimGpu>, streams: usize) -> Fixture<SimGpu> {
    let device = Device::simulated(&gpu, streams);
    fixture(device, Some(gpu))
}

fn fixture<G: Gpu>(device: Device<G>, sim: Option<Arc<SimGpu>>) -> Fixture<G> {
    let pool = device.streams().clone();
    Fixture {
        streams: pool.ids().collect(),
        resource: Arc::new(StreamOrderedResource::new(&device)),
        device,
        pool,
        sim,
    }
}

/// Device 0 through cudarc, with `streams` new streams.
#[cfg(feature = "cuda")]
pub fn cuda(streams: usize) -> Fixture<streamalloc::gpu::cuda::CudaGpu> {
    fixture(Device::open_cuda(0, streams).expect("a CUDA device"), None)
}

/// A waker that counts its wake-ups, for polling futures by hand.
#[derive(Default)]
pub struct CountingWaker(pub std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl CountingWaker {
    pub fn new() -> (Arc<CountingWaker>, std::task::Waker) {
        let c = Arc::new(CountingWaker::default());
        (c.clone(), std::task::Waker::from(c))
    }

    pub fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Polls `f` once with `waker`.
pub fn poll_once<F: std::future::Future + Unpin>(
    f: &mut F,
    waker: &std::task::Waker,
) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(waker);
    std::pin::Pin::new(f).poll(&mut cx)
}

/// Polls `f` until it is ready, running a manual `SimGpu` one operation
/// between polls; returns the output and the operations run. Panics if
/// the device runs dry while `f` is pending, or after 100 operations.
pub fn step_until_ready<F: std::future::Future + Unpin>(
    gpu: &SimGpu,
    f: &mut F,
    waker: &std::task::Waker,
) -> (F::Output, usize) {
    let mut steps = 0;
    loop {
        if let std::task::Poll::Ready(out) = poll_once(f, waker) {
            return (out, steps);
        }
        assert!(gpu.step(), "nothing left to run but the future is pending");
        steps += 1;
        assert!(steps < 100);
    }
}

/// An async resource over a fixture's resource.
pub fn async_resource(f: &Fixture<SimGpu>) -> streamalloc::AsyncResource<SimResource> {
    streamalloc::AsyncResource::new(f.resource.clone()).expect("async resource")
}

/// Polls `f` to completion on this thread, running the simulated device
/// between polls (the device-thread-free way to drive a manual `SimGpu`).
/// Panics after a generous bound: a hang guard, not a timing assertion.
pub fn drive<F: std::future::Future + Unpin>(gpu: &SimGpu, f: &mut F) -> F::Output {
    let (_c, waker) = CountingWaker::new();
    let guard = std::time::Instant::now();
    loop {
        if let std::task::Poll::Ready(out) = poll_once(f, &waker) {
            return out;
        }
        gpu.run_until_idle();
        std::thread::yield_now();
        assert!(guard.elapsed() < self::guard(20), "hang");
    }
}
