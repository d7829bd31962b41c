//! Staging requests through pinned host memory: each request takes a host
//! buffer from a `HostPool`, copies it to the device, works on it there,
//! and copies the result back; every copy is one future. The pool pins a
//! few blocks once and hands them out again as soon as the host saw their
//! copies complete, so the requests after the first pin nothing.
//!
//! ```text
//! cargo run --example staging                         # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example staging  # always simulated
//! ```

use std::sync::Arc;
use std::time::Duration;

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceResult};
use streamalloc::{AsyncResource, Reaper};
use streamalloc::{HostPool, HostPoolConfig};
use tokio::sync::Semaphore;

const REQUESTS: usize = 64;
/// Requests in flight at once: at most 2 MiB pinned each.
const IN_FLIGHT: usize = 16;
const STREAMS: usize = 4;
/// 1 MiB of f32 per request, in and out.
const LEN: usize = 1 << 18;

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ResourceResult<()> {
    let device = Device::open_or_sim(
        0,
        STREAMS,
        SimGpu::builder().op_latency(Duration::from_micros(20)),
    );
    println!("device: {device}");
    let res = AsyncResource::on(&device)?;
    // At most 64 MiB pinned, whatever the load.
    let pool = HostPool::new(&device, HostPoolConfig::new().cap(64 << 20));
    let reaper = Reaper::spawn(&res);

    // The simulated device stores no data; a GPU returns what went in.
    let check = device.simulator().is_none();
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (res, pool, in_flight) = (res.clone(), pool.clone(), in_flight.clone());
            tokio::spawn(async move {
                let _turn = in_flight.acquire_owned().await.expect("open semaphore");
                request(res, pool, i, check).await
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("request task")?;
    }

    let stats = pool.stats();
    println!(
        "{REQUESTS} requests: {} blocks pinned, {} reuses, {} MiB pinned at most",
        stats.pins,
        stats.reuses,
        stats.peak_held_bytes >> 20
    );
    println!("pool trimmed: {} MiB unpinned", pool.trim()? >> 20);
    reaper.shutdown().await?;
    if let Some(sim) = device.simulator() {
        assert!(sim.races().is_empty(), "{:?}", sim.races());
    }
    Ok(())
}

/// One request: input in, a device-side step, result out.
async fn request<R: DeviceMemoryResource + 'static>(
    res: AsyncResource<R>,
    pool: HostPool,
    i: usize,
    check: bool,
) -> ResourceResult<()> {
    let s = res
        .stream_pool()
        .id(i % STREAMS)
        .expect("a stream of the pool");
    let mut input = pool.allocate::<f32>(LEN, AllocTag("input"))?;
    input.as_mut_slice()?.fill(i as f32);

    let mut x = res.allocate_buffer::<f32>(LEN, s, AllocTag("x")).await?;
    res.copy_to_device(&input, &mut x, s)?.await?;
    drop(input); // back to the pool: the host saw its copy complete

    // The "model": here a device-side copy.
    let mut y = res.allocate_buffer::<f32>(LEN, s, AllocTag("y")).await?;
    y.copy_from_on(s, &x)?;

    let mut output = pool.allocate::<f32>(LEN, AllocTag("output"))?;
    res.copy_to_host(&y, &mut output, s)?.await?;
    if check {
        let out = output.as_slice()?;
        assert!(
            out.iter().all(|&v| v == i as f32),
            "request {i} came back wrong"
        );
    }
    Ok(())
}
