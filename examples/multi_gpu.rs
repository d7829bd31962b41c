//! Spreads requests over every GPU in the host: one resource per device in a
//! `DeviceRegistry`, requests round-robin over the devices' streams. Runs on
//! every CUDA device present, or on a simulated host of two devices.
//!
//! `cargo run --example multi_gpu`

use std::sync::Arc;
use std::time::Instant;

use streamalloc::gpu::cuda::CudaGpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::registry::DeviceRegistry;
use streamalloc::{
    AllocTag, AsyncCudaResource, DeviceMemoryResource, ResourceResult, SimResource, StreamId,
    StreamPool,
};

const REQUESTS: usize = 4000;
const WORKERS: usize = 8;

fn serve<R: DeviceMemoryResource + 'static>(
    registry: Arc<DeviceRegistry<R>>,
    streams: Vec<StreamId>,
) -> ResourceResult<()> {
    let start = Instant::now();
    let served: Vec<_> = (0..WORKERS)
        .map(|w| {
            let registry = registry.clone();
            let streams = streams.clone();
            std::thread::spawn(move || -> ResourceResult<Vec<usize>> {
                let mut per_device = vec![0usize; 64];
                for r in (w..REQUESTS).step_by(WORKERS) {
                    let stream = streams[r % streams.len()];
                    let block = registry.allocate(64 << 10, stream, AllocTag("request"))?;
                    per_device[block.device() as usize] += 1;
                    registry.deallocate(block)?;
                }
                Ok(per_device)
            })
        })
        .collect();
    let mut totals = vec![0usize; 64];
    for handle in served {
        for (d, n) in handle
            .join()
            .expect("worker")
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            totals[d] += n;
        }
    }
    for d in registry.devices() {
        let resource = registry.get(d)?;
        resource.reap_pending()?;
        println!(
            "device {d}: {} requests, {} B outstanding after reap",
            totals[d as usize],
            resource.bytes_outstanding()
        );
    }
    println!(
        "{REQUESTS} requests on {WORKERS} workers in {:?}",
        start.elapsed()
    );
    Ok(())
}

fn main() -> ResourceResult<()> {
    let cuda_devices = CudaGpu::open(0)
        .ok()
        .and_then(|_| cudarc::driver::CudaContext::device_count().ok())
        .unwrap_or(0);
    if cuda_devices > 0 {
        println!("host: {cuda_devices} CUDA device(s)");
        let registry = Arc::new(DeviceRegistry::<AsyncCudaResource>::new());
        let mut streams = Vec::new();
        for d in 0..cuda_devices as u32 {
            let ctx = CudaGpu::open(d)?;
            let pool = StreamPool::cuda(&ctx, 2)?;
            streams.extend(pool.ids());
            registry.set(d, Arc::new(AsyncCudaResource::new(ctx, d, pool)))?;
        }
        return serve(registry, streams);
    }
    println!("host: 2 simulated devices (no CUDA GPU found)");
    let registry = Arc::new(DeviceRegistry::<SimResource>::new());
    let mut streams = Vec::new();
    for gpu in SimGpu::builder().build_host(2) {
        let pool = gpu.stream_pool(2);
        streams.extend(pool.ids());
        let resource = SimResource::new(gpu, pool);
        registry.set(resource.device_ordinal(), Arc::new(resource))?;
    }
    serve(registry, streams)
}
