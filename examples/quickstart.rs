//! Allocates on one stream, uses the block on two others, frees it, and shows
//! the accounting. Runs on the GPU when one is present, else on the simulated
//! device (which also checks the cross-stream ordering for races).
//!
//! `cargo run --example quickstart`

use streamalloc::StreamOrderedResource;
use streamalloc::gpu::Gpu;
use streamalloc::{Access, AllocTag, Device, DeviceMemoryResource, ResourceResult};

fn main() -> ResourceResult<()> {
    // CUDA device 0 when there is one, else the simulated device.
    let device = Device::open(0, 3);
    println!("device: {device}");
    let resource = StreamOrderedResource::new(&device);
    let (copy_in, compute, copy_out) = (device.stream(0)?, device.stream(1)?, device.stream(2)?);
    let gpu = device.gpu();
    let n = 8 << 20;
    let input = resource.allocate(n, copy_in, AllocTag("input"))?;
    let output = resource.allocate(n, compute, AllocTag("output"))?;

    // Stage 1 writes the input on its stream.
    resource.prepare_block_use(input.id(), copy_in, Access::Write)?;
    // SAFETY: a stream of the device's pool; the block is live (freed later).
    unsafe { gpu.memset_async(input.ptr(), 1, n, device.raw(copy_in)?) }?;
    resource.finish_block_use(input.id(), copy_in, Access::Write)?;

    // Stage 2 reads it on another stream: prepare queues the wait.
    resource.prepare_block_use(input.id(), compute, Access::Read)?;
    resource.prepare_block_use(output.id(), compute, Access::Write)?;
    // SAFETY: a stream of the device's pool; both blocks are live (freed later).
    unsafe { gpu.copy_async(output.ptr(), input.ptr(), n, device.raw(compute)?) }?;
    resource.finish_block_use(input.id(), compute, Access::Read)?;
    resource.finish_block_use(output.id(), compute, Access::Write)?;

    // Stage 3 reads the output on a third stream into its own block.
    let result = resource.allocate(n, copy_out, AllocTag("result"))?;
    resource.prepare_block_use(output.id(), copy_out, Access::Read)?;
    // SAFETY: a stream of the device's pool; both blocks are live (freed later).
    unsafe { gpu.copy_async(result.ptr(), output.ptr(), n, device.raw(copy_out)?) }?;
    resource.finish_block_use(output.id(), copy_out, Access::Read)?;

    println!(
        "live {} B; input carries {:?} use events",
        resource.live_bytes(),
        resource.pending_use_event_count(input.ptr())
    );
    // Freeing on the allocation stream waits for the other streams' uses.
    resource.deallocate(input)?;
    resource.deallocate(output)?;
    resource.deallocate(result)?;
    println!(
        "after free: live {} B, pending {} B",
        resource.live_bytes(),
        resource.pending_free_bytes()
    );
    resource.reap_pending()?;
    println!("after reap: outstanding {} B", resource.bytes_outstanding());
    if let Some(sim) = device.simulator() {
        sim.run_until_idle();
        println!("race detector: {} races", sim.races().len());
    }
    Ok(())
}
