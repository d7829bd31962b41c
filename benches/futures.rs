//! The futures layer: EventFuture wake latency (p50/p99 printed) and the
//! throughput of 10,000 concurrent futures over 8 streams, on the simulated
//! device (the futures machinery, not a GPU); the bookkeeping of one
//! completion point, on the null backend with events that are always
//! complete; and the allocation wait queue with 10 and with 10,000 waiters
//! (`wait_queue/*`: a poll of a waiter, and a cancel and a new waiter; the
//! two sizes should cost about the same).
//!
//! ```text
//! cargo bench --bench futures
//! ```
//!
//! Wake latency on a GPU is the measurement crate's `gpu_latency`.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

use streamalloc::AsyncResource;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource};
use streamalloc::{Device, StreamOrderedResource};

const STREAMS: usize = 8;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}

/// One tiny op (a 4-byte fill) and a future for its completion, awaited.
async fn tiny_op<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
    block: &DeviceBlock,
    i: usize,
) {
    let s = block.stream();
    let raw = res.stream_pool().raw(s).unwrap();
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    unsafe { res.gpu().memset_async(block.ptr(), i as u8, 4, raw) }.unwrap();
    res.completion(s).unwrap().await.unwrap();
}

fn bench_on<R: DeviceMemoryResource + 'static>(
    c: &mut Criterion,
    device: &str,
    res: AsyncResource<R>,
) {
    let rt = runtime();
    let blocks: Arc<Vec<DeviceBlock>> = Arc::new(
        res.stream_pool()
            .ids()
            .map(|s| res.try_allocate(256, s, AllocTag("bench")).unwrap())
            .collect(),
    );

    // Wake latency percentiles, measured inside a task of the runtime.
    let samples = rt.block_on({
        let (res, blocks) = (res.clone(), blocks.clone());
        async move {
            tokio::spawn(async move {
                let mut v = Vec::with_capacity(5000);
                for i in 0..5000 {
                    let t = Instant::now();
                    tiny_op(&res, &blocks[0], i).await;
                    v.push(t.elapsed());
                }
                v
            })
            .await
            .unwrap()
        }
    });
    let (p50, p99) = percentiles(samples);
    println!("[{device}] EventFuture wake latency, tiny op: p50 {p50:.2} µs, p99 {p99:.2} µs");

    let mut group = c.benchmark_group(format!("futures/{device}"));
    group.bench_function("tiny_op_await", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            rt.block_on(tiny_op(&res, &blocks[0], i))
        })
    });
    group.sample_size(10);
    group.bench_function("10k_futures_8_streams", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut futs = Vec::with_capacity(10_000);
                for i in 0..10_000 {
                    let block = &blocks[i % blocks.len()];
                    let raw = res.stream_pool().raw(block.stream()).unwrap();
                    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                    unsafe { res.gpu().memset_async(block.ptr(), 0, 4, raw) }.unwrap();
                    futs.push(tokio::spawn(res.completion(block.stream()).unwrap()));
                }
                for f in futs {
                    f.await.unwrap().unwrap();
                }
            })
        })
    });
    group.finish();
    for b in Arc::try_unwrap(blocks).unwrap() {
        drop(res.deallocate(b).unwrap());
    }
    rt.block_on(res.reap_pending()).unwrap();
}

/// The bookkeeping of one completion point, on the null backend with
/// events that are always complete.
fn bench_bookkeeping(c: &mut Criterion) {
    let handles = SimGpu::builder().manual().build();
    let pool = handles.stream_pool(STREAMS);
    let gpu = Arc::new(support::NullGpu::with_events_on(&handles));
    let device = Device::new(gpu, pool.clone()).expect("both device 0");
    let inner = Arc::new(StreamOrderedResource::new(&device));
    let res = AsyncResource::new(inner).unwrap();
    let s = pool.id(0).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("futures/null");
    group.bench_function("point_dropped", |b| {
        b.iter(|| drop(res.completion(s).unwrap()))
    });
    group.bench_function("point_awaited", |b| {
        b.iter(|| rt.block_on(res.completion(s).unwrap()).unwrap())
    });
    group.bench_function("100_points_joined", |b| {
        b.iter(|| {
            let points: Vec<_> = (0..100).map(|_| res.completion(s).unwrap()).collect();
            rt.block_on(::futures::future::join_all(points))
        })
    });
    // 10,000 points over the streams, awaited together: by `join_all`
    // (which allocates a task node per future) against one after another
    // (they are all complete, so in order costs nothing extra).
    let streams: Vec<_> = pool.ids().collect();
    let make = || -> Vec<_> {
        (0..10_000)
            .map(|i| res.completion(streams[i % streams.len()]).unwrap())
            .collect()
    };
    group.sample_size(20);
    group.bench_function("10k_points_join_all", |b| {
        b.iter(|| rt.block_on(::futures::future::join_all(make())))
    });
    group.bench_function("10k_points_in_order", |b| {
        b.iter(|| {
            rt.block_on(async {
                for point in make() {
                    point.await.unwrap();
                }
            })
        })
    });
    group.finish();
}

/// A full simulated device with `waiters` allocations queued for memory.
fn queued(
    waiters: usize,
) -> (
    AsyncResource<StreamOrderedResource<SimGpu>>,
    Vec<streamalloc::AllocFuture>,
) {
    const BLOCK: usize = 1 << 20;
    let gpu = SimGpu::builder().manual().capacity(BLOCK).build();
    let device = Device::simulated(&gpu, 1);
    let res = AsyncResource::on(&device).unwrap();
    let s = device.stream(0).unwrap();
    // Held for the whole run: the device stays full.
    let _full = res.try_allocate(BLOCK, s, AllocTag("full")).unwrap();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let futures: Vec<_> = (0..waiters)
        .map(|_| {
            let mut f = res.allocate(BLOCK, s, AllocTag("waiter"));
            assert!(std::pin::Pin::new(&mut f).poll(&mut cx).is_pending());
            f
        })
        .collect();
    assert_eq!(res.waiting_allocations(), waiters);
    (res, futures)
}

/// The wait queue: a poll of the newest waiter, and a cancel (the newest
/// waiter dropped) plus a new waiter, with 10 and with 10,000 queued.
fn bench_wait_queue(c: &mut Criterion) {
    use std::future::Future;
    let mut group = c.benchmark_group("wait_queue");
    for waiters in [10usize, 10_000] {
        let (res, mut futures) = queued(waiters);
        let s = res.stream_pool().id(0).unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        group.bench_function(format!("poll/{waiters}"), |b| {
            let last = futures.last_mut().unwrap();
            b.iter(|| std::pin::Pin::new(&mut *last).poll(&mut cx).is_pending())
        });
        group.bench_function(format!("cancel_and_requeue/{waiters}"), |b| {
            b.iter(|| {
                futures.pop();
                let mut f = res.allocate(1 << 20, s, AllocTag("waiter"));
                let pending = std::pin::Pin::new(&mut f).poll(&mut cx).is_pending();
                futures.push(f);
                pending
            })
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_wait_queue(c);
    bench_bookkeeping(c);
    let device = Device::simulated(&SimGpu::new(), STREAMS);
    bench_on(c, "sim", AsyncResource::on(&device).unwrap());
}

criterion_group!(futures_benches, benches);
criterion_main!(futures_benches);
