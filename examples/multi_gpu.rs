//! Spreads requests over every GPU in the host: one resource per device in a
//! `DeviceRegistry`, requests round-robin over the devices' streams. Runs on
//! every CUDA device present, or on a simulated host of two devices.
//!
//! `cargo run --example multi_gpu`

use std::sync::Arc;
use std::time::Instant;

use streamalloc::DeviceRegistry;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    AllocTag, Device, DeviceMemoryResource, ResourceResult, StreamId, StreamOrderedResource,
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
    // Every CUDA device of the host, or a simulated host of two devices.
    let count = Device::cuda_count();
    let devices: Vec<Device> = if count > 0 {
        (0..count)
            .map(|d| Device::cuda(d, 2))
            .collect::<ResourceResult<_>>()?
    } else {
        let host = SimGpu::builder().build_host(2);
        host.iter().map(|gpu| Device::sim(gpu, 2)).collect()
    };
    let registry = Arc::new(DeviceRegistry::new());
    let mut streams = Vec::new();
    for device in &devices {
        println!("device: {device}");
        streams.extend(device.streams().ids());
        registry.set(
            device.ordinal(),
            Arc::new(StreamOrderedResource::new(device)),
        )?;
    }
    serve(registry, streams)
}
