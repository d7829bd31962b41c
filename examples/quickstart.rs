//! Allocates on one stream, uses the block on two others, frees it, and shows
//! the accounting. Runs on the GPU when one is present, else on the simulated
//! device (which also checks the cross-stream ordering for races).
//!
//! `cargo run --example quickstart`

use streamalloc::gpu::Gpu;
use streamalloc::gpu::cuda::CudaGpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, AsyncCudaResource, DeviceMemoryResource, ResourceResult, SimResource,
    StreamOrderedResource, StreamPool,
};

fn run<G: Gpu>(resource: &StreamOrderedResource<G>, pool: &StreamPool) -> ResourceResult<()> {
    let (copy_in, compute, copy_out) = (
        pool.id(0).unwrap(),
        pool.id(1).unwrap(),
        pool.id(2).unwrap(),
    );
    let gpu = resource.gpu();
    let n = 8 << 20;
    let input = resource.allocate(n, copy_in, AllocTag("input"))?;
    let output = resource.allocate(n, compute, AllocTag("output"))?;

    // Stage 1 writes the input on its stream.
    resource.prepare_block_use(input.id(), copy_in, Access::Write)?;
    // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
    unsafe { gpu.memset_async(input.ptr(), 1, n, pool.raw(copy_in)?) }?;
    resource.finish_block_use(input.id(), copy_in, Access::Write)?;

    // Stage 2 reads it on another stream: prepare queues the wait.
    resource.prepare_block_use(input.id(), compute, Access::Read)?;
    resource.prepare_block_use(output.id(), compute, Access::Write)?;
    // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
    unsafe { gpu.copy_async(output.ptr(), input.ptr(), n, pool.raw(compute)?) }?;
    resource.finish_block_use(input.id(), compute, Access::Read)?;
    resource.finish_block_use(output.id(), compute, Access::Write)?;

    // Stage 3 reads the output on a third stream into its own block.
    let result = resource.allocate(n, copy_out, AllocTag("result"))?;
    resource.prepare_block_use(output.id(), copy_out, Access::Read)?;
    // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
    unsafe { gpu.copy_async(result.ptr(), output.ptr(), n, pool.raw(copy_out)?) }?;
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
    Ok(())
}

fn main() -> ResourceResult<()> {
    // `open` checks that libcuda loads before touching cudarc.
    if let Ok(ctx) = CudaGpu::open(0) {
        println!("device: CUDA {}", ctx.name().unwrap_or_default());
        let pool = StreamPool::cuda(&ctx, 3)?;
        let resource = AsyncCudaResource::new(ctx, 0, pool.clone());
        return run(&resource, &pool);
    }
    println!("device: simulated (no CUDA GPU found)");
    let gpu = SimGpu::new();
    let pool = gpu.stream_pool(3);
    let resource = SimResource::new(gpu.clone(), pool.clone());
    run(&resource, &pool)?;
    gpu.run_until_idle();
    println!("race detector: {} races", gpu.races().len());
    Ok(())
}
