//! A background reaper: frees are queued and forgotten; the reaper returns
//! their memory to the accounting as the GPU executes them — driven by
//! completion notifications, without synchronizing a stream — and wakes an
//! allocation waiting for that memory.
//!
//! ```text
//! cargo run --example reaper                         # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example reaper  # always simulated
//! ```

use std::time::{Duration, Instant};

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceResult};
use streamalloc::{AsyncResource, Reaper};

const FREES: usize = 1000;
const STREAMS: usize = 4;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ResourceResult<()> {
    // CUDA device 0 when there is one, else a simulated device of
    // 256 MiB whose kernels take 50 µs.
    let device = Device::open_or_sim(
        0,
        STREAMS,
        SimGpu::builder()
            .capacity(256 << 20)
            .op_latency(Duration::from_micros(50)),
    );
    println!("device: {device}");
    run(AsyncResource::on(&device)?).await?;
    if let Some(sim) = device.simulator() {
        let races = sim.races();
        println!("race detector: {} race(s)", races.len());
        assert!(races.is_empty(), "{races:?}");
    }
    Ok(())
}

async fn run<R: DeviceMemoryResource + 'static>(res: AsyncResource<R>) -> ResourceResult<()> {
    let pool = res.stream_pool().clone();
    let reaper = Reaper::spawn(&res);
    let size = 64 << 10;

    // 1. Fire-and-forget frees behind real work.
    let start = Instant::now();
    for i in 0..FREES {
        let s = pool.id(i % STREAMS).expect("stream");
        let block = res.try_allocate(size, s, AllocTag("scratch"))?;
        // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
        unsafe { res.gpu().memset_async(block.ptr(), 0, size, pool.raw(s)?) }?;
        drop(res.deallocate(block)?); // nobody awaits it
    }
    println!(
        "queued {FREES} frees of {} KiB in {:.2} ms; outstanding right after: {} KiB",
        size >> 10,
        start.elapsed().as_secs_f64() * 1e3,
        res.bytes_outstanding() >> 10
    );
    // Watch the reaper drain them (printing only; shutdown below waits).
    for _ in 0..50 {
        if res.bytes_outstanding() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!(
        "after up to 50 ms: {} KiB outstanding, {} notifications so far",
        res.bytes_outstanding() >> 10,
        res.notifications()
    );

    // 2. An allocation waiting for memory that a free on another stream
    //    returns: the reaper applies the free and wakes it.
    let total = res.gpu().mem_info()?.1;
    let (s0, s1) = (pool.id(0).expect("s0"), pool.id(1).expect("s1"));
    let big = (total / 2) & !0xFFFF;
    let first = res.try_allocate(big, s0, AllocTag("big"))?;
    let waiter = tokio::spawn({
        let res = res.clone();
        async move { res.allocate(big, s1, AllocTag("big")).await }
    });
    while res.waiting_allocations() == 0 && !waiter.is_finished() {
        tokio::task::yield_now().await;
    }
    println!(
        "an allocation of {} MiB on stream 2 waits: {} waiting",
        big >> 20,
        res.waiting_allocations()
    );
    let freed = Instant::now();
    drop(res.deallocate(first)?);
    let second = waiter.await.expect("waiter task")?;
    println!(
        "served {:.2} ms after the free on stream 1 was queued",
        freed.elapsed().as_secs_f64() * 1e3
    );
    drop(res.deallocate(second)?);

    // 3. Shutdown drains whatever is still pending.
    reaper.shutdown().await?;
    println!(
        "reaper shut down; outstanding: {} B, {} notifications in all",
        res.bytes_outstanding(),
        res.notifications()
    );
    assert_eq!(res.bytes_outstanding(), 0);
    Ok(())
}
