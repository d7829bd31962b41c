//! The obvious tokio service: each request reserves its memory as one unit
//! (input, activations, output), takes owned buffers from the reservation,
//! queues its work and awaits it. More demand than the budget, so requests
//! wait for memory (first come first served, holding nothing while they
//! wait); one request misses its deadline, one panics, and neither leaks.
//! A graceful shutdown closes the resource and returns the final figures,
//! 0 B outstanding. No semaphore of your own: the reservation is one.
//!
//! ```text
//! cargo run --example service                         # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example service  # always simulated
//! ```

use std::time::Duration;

use streamalloc::{AnyResource, Reaper};
use streamalloc::{
    AsyncResource, Budget, CacheConfig, Device, ResourceBuilder, ResourceError, StreamId, Tag,
    gpu::sim::SimGpu,
};

const REQUESTS: usize = 64;
const STREAMS: usize = 4;
const MIB: usize = 1 << 20;
/// Input, activations, output: 24 MiB a request, a budget of 96 MiB, so
/// four requests run at once and the others wait.
const SIZES: [usize; 3] = [4 * MIB, 16 * MIB, 4 * MIB];

/// One request: its memory as one unit, its work, its completion. Every
/// buffer frees itself on return, on a panic and on a cancel.
async fn handle(res: AnyResource, stream: StreamId, id: usize) -> Result<(), ResourceError> {
    let tag = Tag::for_request("request", format!("req-{id}"));
    let mut memory = res.reserve(&SIZES, stream, tag).await?;
    let mut input = memory.allocate_buffer::<f32>(MIB)?; // never waits, never fails for memory
    let mut activations = memory.allocate_buffer::<u8>(16 * MIB)?;
    let mut output = memory.allocate_buffer::<f32>(MIB)?;
    input.fill_bytes_on(stream, 1)?; // your kernels go here (Buffer::cuda)
    activations.fill_bytes_on(stream, 2)?;
    output.copy_from_on(stream, &input)?;
    if id == 13 {
        panic!("request {id} hit a bug"); // its buffers are freed as it unwinds
    }
    res.completion(stream)?.await?; // the GPU got there; no thread blocked
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<(), ResourceError> {
    // CUDA device 0 when there is one, else a simulated device whose
    // operations take 50 µs.
    let sim = SimGpu::builder().op_latency(Duration::from_micros(50));
    let device = Device::open_or_sim(0, STREAMS, sim);
    println!("device: {device}");
    let layers = ResourceBuilder::new()
        .stats()
        .cache(CacheConfig::default())
        .retry_on_oom()
        .budget(&Budget::new(4 * SIZES.iter().sum::<usize>()));
    let res = AsyncResource::build(&device, &layers)?.into_any();
    let reaper = Reaper::spawn(&res);

    let mut handlers = Vec::new();
    for id in 0..REQUESTS {
        // Request 7's deadline is too short to be served.
        let deadline = Duration::from_millis(if id == 7 { 0 } else { 10_000 });
        let request = handle(res.clone(), device.stream(id % STREAMS)?, id);
        handlers.push(tokio::spawn(tokio::time::timeout(deadline, request)));
    }
    let (mut served, mut late, mut panicked) = (0, 0, 0);
    for h in handlers {
        match h.await {
            Ok(Ok(result)) => result.map(|()| served += 1)?,
            Ok(Err(_elapsed)) => late += 1,
            Err(join) if join.is_panic() => panicked += 1,
            Err(join) => panic!("{join}"),
        }
    }
    println!("{served} served, {late} past their deadline, {panicked} panicked");
    println!("{:?}", res.queue_stats());

    // Graceful shutdown: no new request, every free drained, the cache's
    // idle memory given back, the final figures.
    let report = res.shutdown().await?;
    reaper.shutdown().await?;
    if let Some(stats) = &report.stats {
        print!("{stats}");
    }
    println!("outstanding after shutdown: {} B", report.bytes_outstanding);
    assert_eq!(report.bytes_outstanding, 0);
    if let Some(sim) = device.simulator() {
        assert!(sim.races().is_empty(), "{:?}", sim.races());
    }
    Ok(())
}
