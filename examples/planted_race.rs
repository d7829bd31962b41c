//! A deliberately planted cross-stream bug, to show that the race detectors
//! see our allocations: a block is read on stream B while stream A frees it,
//! with no wait between them.
//!
//! `cargo run --example planted_race -- bug`   (the bug)
//! `cargo run --example planted_race -- fixed` (the same, through the hooks)
//!
//! On the simulated device the race detector reports the bug. On a GPU, run
//! it under `compute-sanitizer --tool memcheck --track-stream-ordered-races all`:
//! the bug is reported, the fixed version is not.

use streamalloc::gpu::Gpu;
use streamalloc::gpu::cuda::CudaGpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, AsyncCudaResource, DeviceMemoryResource, ResourceResult, SimResource,
    StreamOrderedResource, StreamPool,
};

fn plant<G: Gpu>(
    r: &StreamOrderedResource<G>,
    pool: &StreamPool,
    fixed: bool,
) -> ResourceResult<()> {
    let (a, b) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    let (raw_a, raw_b) = (pool.raw(a)?, pool.raw(b)?);
    let gpu = r.gpu();
    let n = 64 << 20;
    let victim = r.allocate(n, a, AllocTag("victim"))?;
    let busy = r.allocate(1 << 30, b, AllocTag("busy"))?;
    let sink = r.allocate(n, b, AllocTag("sink"))?;
    // SAFETY: a stream of this program's pool; blocks it allocated and has not freed (the planted race is on the device: the copy is queued before the free).
    unsafe { gpu.memset_async(victim.ptr(), 1, n, raw_a) }?;
    r.finish_block_use(victim.id(), a, Access::Write)?;
    // Keep stream B busy so that A's free runs before B's read.
    for _ in 0..8 {
        // SAFETY: a stream of this program's pool; blocks it allocated and has not freed (the planted race is on the device: the copy is queued before the free).
        unsafe { gpu.memset_async(busy.ptr(), 2, 1 << 30, raw_b) }?;
    }
    if fixed {
        r.prepare_block_use(victim.id(), b, Access::Read)?;
    }
    // SAFETY: a stream of this program's pool; blocks it allocated and has not freed (the planted race is on the device: the copy is queued before the free).
    unsafe { gpu.copy_async(sink.ptr(), victim.ptr(), n, raw_b) }?;
    if fixed {
        r.finish_block_use(victim.id(), b, Access::Read)?;
    }
    r.deallocate(victim)?;
    r.deallocate(busy)?;
    r.deallocate(sink)?;
    r.reap_pending()?;
    Ok(())
}

fn main() -> ResourceResult<()> {
    let fixed = std::env::args().nth(1).as_deref() == Some("fixed");
    println!(
        "planted_race: {}",
        if fixed {
            "fixed (hooks used)"
        } else {
            "bug (no hooks on stream B)"
        }
    );
    if let Ok(ctx) = CudaGpu::open(0) {
        let pool = StreamPool::cuda(&ctx, 2)?;
        let r = AsyncCudaResource::new(ctx, 0, pool.clone());
        plant(&r, &pool, fixed)?;
        println!("ran on CUDA; run under compute-sanitizer to see the verdict");
        return Ok(());
    }
    let gpu = SimGpu::builder().manual().build();
    let pool = gpu.stream_pool(2);
    let r = SimResource::new(gpu.clone(), pool.clone());
    plant(&r, &pool, fixed)?;
    let races = gpu.races();
    for race in &races {
        println!("sim race detector: {race}");
    }
    println!("sim race detector: {} race(s)", races.len());
    Ok(())
}
