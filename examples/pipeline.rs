//! A three-stage async inference pipeline: copy in on stream 1, compute on
//! stream 2, copy out on stream 3. Owned buffers cross streams; they insert
//! the waits and free themselves, so no free ever races with a later reader. On
//! the simulated device the race detector checks it.
//!
//! ```text
//! cargo run --example pipeline                         # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example pipeline  # always simulated
//! ```

use std::time::{Duration, Instant};

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Buffer, Device, DeviceMemoryResource, ResourceResult};
use streamalloc::{AsyncResource, Reaper};
use tokio::sync::mpsc;

const ITEMS: usize = 256;
const SIZE: usize = 1 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 3)]
async fn main() -> ResourceResult<()> {
    // CUDA device 0 when there is one, else a simulated device of
    // 64 MiB whose kernels take 50 µs.
    let device = Device::open_or_sim(
        0,
        3,
        SimGpu::builder()
            .capacity(64 << 20)
            .op_latency(Duration::from_micros(50)),
    );
    println!("device: {device}");
    // The async layer right on the device: the point here is buffers
    // crossing streams (examples/service.rs puts a cache, `RetryOnOomResource` and
    // a budget under it).
    let res = AsyncResource::on(&device)?;
    run(res.clone()).await?;
    // Every buffer freed itself, and no free raced a later reader.
    assert_eq!(res.bytes_outstanding(), 0);
    if let Some(sim) = device.simulator() {
        assert!(sim.races().is_empty(), "{:?}", sim.races());
    }
    Ok(())
}

async fn run<R: DeviceMemoryResource + 'static>(res: AsyncResource<R>) -> ResourceResult<()> {
    let pool = res.stream_pool().clone();
    let (copy_in, compute, copy_out) = (
        pool.id(0).expect("stream 1"),
        pool.id(1).expect("stream 2"),
        pool.id(2).expect("stream 3"),
    );
    let reaper = Reaper::spawn(&res);
    let (to_compute, mut compute_rx) = mpsc::channel::<Buffer<u8>>(8);
    let (to_out, mut out_rx) = mpsc::channel::<Buffer<u8>>(8);
    let start = Instant::now();

    // Stage A, stream 1: allocate an input and "copy it in" (a fill).
    let a = tokio::spawn({
        let res = res.clone();
        async move {
            for i in 0..ITEMS {
                let mut input = res
                    .allocate_buffer(SIZE, copy_in, AllocTag("input"))
                    .await?;
                // Not awaited: stage B orders itself after it on the GPU.
                input.fill_bytes_on(copy_in, i as u8)?;
                if to_compute.send(input).await.is_err() {
                    break;
                }
            }
            ResourceResult::Ok(())
        }
    });

    // Stage B, stream 2: read the input, write an output, free the input.
    let b = tokio::spawn({
        let res = res.clone();
        async move {
            while let Some(input) = compute_rx.recv().await {
                let mut output = res
                    .allocate_buffer(SIZE, compute, AllocTag("output"))
                    .await?;
                output.copy_from_on(compute, &input)?;
                // Freed on stream 1, after stream 2's read: the buffer orders it.
                drop(input);
                if to_out.send(output).await.is_err() {
                    break;
                }
            }
            ResourceResult::Ok(())
        }
    });

    // Stage C, stream 3: copy the output out to a staging buffer, await it.
    let c = tokio::spawn({
        let res = res.clone();
        async move {
            let mut done = 0;
            while let Some(output) = out_rx.recv().await {
                let mut staging = res
                    .allocate_buffer(SIZE, copy_out, AllocTag("staging"))
                    .await?;
                staging.copy_from_on(copy_out, &output)?;
                // The result is on the "host" once this resolves.
                res.completion(copy_out)?.await?;
                drop((output, staging));
                done += 1;
            }
            ResourceResult::Ok(done)
        }
    });

    a.await.expect("stage A")?;
    b.await.expect("stage B")?;
    let done = c.await.expect("stage C")?;
    let elapsed = start.elapsed();
    reaper.shutdown().await?;
    println!(
        "{done} items of {} KiB through 3 stages on 3 streams in {:.1} ms ({:.1} µs/item)",
        SIZE >> 10,
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e6 / done as f64
    );
    println!(
        "{} notifications; outstanding after shutdown: {} B",
        res.notifications(),
        res.bytes_outstanding()
    );
    assert_eq!(done, ITEMS);
    Ok(())
}
