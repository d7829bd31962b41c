//! Allocates on one stream, uses the block on two others, frees it, and shows
//! the accounting. Runs on the GPU when one is present, else on the simulated
//! device (which also checks the cross-stream ordering for races).
//!
//! `cargo run --example quickstart`

use std::sync::Arc;

use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceResult, StreamOrderedResource};

fn main() -> ResourceResult<()> {
    // CUDA device 0 when there is one, else the simulated device.
    let device = Device::open(0, 3);
    println!("device: {device}");
    let resource = Arc::new(StreamOrderedResource::new(&device));
    let (copy_in, compute, copy_out) = (device.stream(0)?, device.stream(1)?, device.stream(2)?);
    let n = 8 << 20;
    // Owned buffers: each frees itself, stream-ordered, when dropped.
    let mut input = resource.allocate_buffer::<u8>(n, copy_in, AllocTag("input"))?;
    let mut output = resource.allocate_buffer::<u8>(n, compute, AllocTag("output"))?;

    // Stage 1 writes the input on its stream.
    input.fill_bytes_on(copy_in, 1)?;
    // Stage 2 reads it on another stream: the buffer queues the wait.
    output.copy_from_on(compute, &input)?;
    // Stage 3 reads the output on a third stream into its own buffer.
    let mut result = resource.allocate_buffer::<u8>(n, copy_out, AllocTag("result"))?;
    result.copy_from_on(copy_out, &output)?;

    println!(
        "live {} B; input carries {:?} use events",
        resource.live_bytes(),
        resource.pending_use_event_count(input.block().ptr())
    );
    // Dropping frees on the allocation stream, after the other streams' uses.
    drop((input, output, result));
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
