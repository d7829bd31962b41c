//! A tokio service with back-pressure: many concurrent requests each
//! allocate device memory, launch work, await its completion and free —
//! with more demand than memory, so requests wait for memory instead of
//! failing. The resource is the full stack under the async layer: a
//! per-stream cache over `RetryOnOom` over a budget of half the device, so
//! requests wait for the budget, the device and the cache's blocks alike,
//! and no executor thread ever blocks on a synchronize.
//!
//! ```text
//! cargo run --example service                         # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example service  # always simulated
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use streamalloc::futures::{AsyncResource, Reaper};
use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, Budget, CacheConfig, Device, DeviceMemoryResource, ResourceBuilder,
    ResourceResult,
};

const REQUESTS: usize = 64;
const STREAMS: usize = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ResourceResult<()> {
    // CUDA device 0 when there is one, else a simulated device of
    // 64 MiB whose kernels take 50 µs.
    let device = Device::open_or_sim(
        0,
        STREAMS,
        SimGpu::builder()
            .capacity(64 << 20)
            .op_latency(Duration::from_micros(50)),
    );
    println!("device: {device}");
    let (_free, total) = device.gpu().mem_info()?;
    let budget = Budget::new(total / 2);
    let layers = ResourceBuilder::new()
        .cache(CacheConfig::default())
        .retry_on_oom()
        .budget(&budget);
    let res = AsyncResource::build(&device, &layers)?;
    serve(res.clone()).await?;
    // The cache keeps freed blocks for reuse: give them back, and the
    // device and the budget hold nothing.
    res.inner().trim()?;
    res.reap_pending().await?;
    println!(
        "after trimming the cache: {} B outstanding, {} B of the budget in use",
        res.bytes_outstanding(),
        budget.in_use()
    );
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(budget.in_use(), 0);
    if let Some(sim) = device.simulator() {
        let races = sim.races();
        println!("race detector: {} race(s)", races.len());
        assert!(races.is_empty(), "{races:?}");
    }
    Ok(())
}

async fn serve<R: DeviceMemoryResource + 'static>(res: AsyncResource<R>) -> ResourceResult<()> {
    let (_free, total) = res.gpu().mem_info()?;
    // Each request wants 1/16 of the device and 64 run at once: four times
    // more demand than the device, eight times more than the budget.
    let size = (total / 16) & !0xFFFF;
    println!(
        "{REQUESTS} concurrent requests of {} MiB each on a {} MiB device ({}x oversubscribed)",
        size >> 20,
        total >> 20,
        REQUESTS * size / total
    );
    let reaper = Reaper::spawn(&res);
    let waited = Arc::new(AtomicUsize::new(0));
    let max_queue = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let res = res.clone();
        let (waited, max_queue) = (waited.clone(), max_queue.clone());
        tasks.push(tokio::spawn(async move {
            let stream = res.stream_pool().id(i % STREAMS).expect("stream");
            let raw = res.stream_pool().raw(stream)?;
            let asked = Instant::now();
            let mut alloc = res.allocate(size, stream, AllocTag("request"));
            // Poll once by hand to see whether the request had to queue.
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::pin::Pin::new(&mut alloc).poll(cx))
            })
            .await;
            let block = match first {
                std::task::Poll::Ready(b) => b?,
                std::task::Poll::Pending => {
                    waited.fetch_add(1, Ordering::Relaxed);
                    max_queue.fetch_max(res.waiting_allocations(), Ordering::Relaxed);
                    alloc.await?
                }
            };
            let wait = asked.elapsed();
            // The "kernel": fill the block on its stream.
            // SAFETY: a stream of the resource's pool; the block is live (freed below).
            unsafe {
                res.gpu()
                    .memset_async(block.ptr(), i as u8, block.size(), raw)
            }?;
            res.finish_block_use(block.id(), stream, Access::Write)?
                .await?;
            // Free without waiting: the reaper returns the memory.
            drop(res.deallocate(block)?);
            Ok::<Duration, streamalloc::ResourceError>(wait)
        }));
    }
    let mut waits = Vec::new();
    for t in tasks {
        waits.push(t.await.expect("request task")?);
    }
    let elapsed = start.elapsed();
    reaper.shutdown().await?;
    waits.sort();
    println!(
        "served {} requests in {:.1} ms; {} waited for memory (queue up to {}), \
         wait p50 {:.2} ms / max {:.2} ms",
        waits.len(),
        elapsed.as_secs_f64() * 1e3,
        waited.load(Ordering::Relaxed),
        max_queue.load(Ordering::Relaxed),
        waits[waits.len() / 2].as_secs_f64() * 1e3,
        waits[waits.len() - 1].as_secs_f64() * 1e3,
    );
    println!(
        "{} host-function notifications for {} awaited points and frees; outstanding after shutdown: {} B",
        res.notifications(),
        2 * REQUESTS,
        res.bytes_outstanding()
    );
    Ok(())
}
