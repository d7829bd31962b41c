//! An adaptor stack in front of the stream-ordered resource, and a
//! three-stream pipeline written with the launch recorder.
//!
//! Runs on CUDA device 0 when `libcuda` is present, on the simulated device
//! otherwise (then the race detector checks the pipeline):
//!
//! ```text
//! cargo run --example adaptor_stack
//! ```

use std::error::Error;
use std::sync::Arc;

use streamalloc::adaptors::{Budget, GpuPoison, GuardConfig, Stats};
use streamalloc::gpu::Gpu;
use streamalloc::gpu::cuda::{CudaGpu, cuda_present};
use streamalloc::gpu::sim::SimGpu;
use streamalloc::launch::LaunchRecorder;
use streamalloc::{
    AllocTag, AsyncCudaResource, DeviceMemoryResource, ResourceBuilder, SimResource,
    StreamOrderedResource,
};

type BoxError = Box<dyn Error + Send + Sync>;
const MIB: usize = 1 << 20;

fn run<G: Gpu>(resource: Arc<StreamOrderedResource<G>>) -> Result<(), BoxError> {
    let gpu = resource.gpu().clone();
    let pool = resource.stream_pool().clone();
    let (load, compute, store) = (
        pool.id(0).unwrap(),
        pool.id(1).unwrap(),
        pool.id(2).unwrap(),
    );
    let budget = Budget::new(256 * MIB);
    let stats = Stats::new();
    // Outermost first: trace what callers ask, retry budget refusals after
    // a reap, count per tag, and quarantine freed blocks (poisoned) for a
    // while before the real free.
    let r = ResourceBuilder::new()
        .tracing()
        .retry_on_oom()
        .budget(&budget)
        .stats_with(&stats)
        .debug_guard(
            GuardConfig::new()
                .max_blocks(8)
                // SAFETY: the guard is the poison's only user and fills only blocks live in that resource.
                .poison(unsafe { GpuPoison::for_resource(&resource, 0xA5) }),
        )
        .build(resource.clone());

    for _ in 0..16 {
        let input = r.allocate(16 * MIB, load, AllocTag("input"))?;
        let hidden = r.allocate(32 * MIB, compute, AllocTag("activations"))?;
        let output = r.allocate(16 * MIB, store, AllocTag("output"))?;
        LaunchRecorder::new(&r, load).write(&input).launch(
            &pool,
            |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the pool this test holds; blocks live in its resource.
                Ok(unsafe { gpu.memset_async(input.ptr(), 1, input.size(), raw) }?)
            },
        )?;
        LaunchRecorder::new(&r, compute)
            .read(&input)
            .write(&hidden)
            .launch(&pool, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the pool this test holds; blocks live in its resource.
                Ok(unsafe { gpu.copy_async(hidden.ptr(), input.ptr(), input.size(), raw) }?)
            })?;
        LaunchRecorder::new(&r, store)
            .read(&hidden)
            .write(&output)
            .launch(&pool, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the pool this test holds; blocks live in its resource.
                Ok(unsafe { gpu.copy_async(output.ptr(), hidden.ptr(), output.size(), raw) }?)
            })?;
        for block in [input, hidden, output] {
            r.deallocate(block)?;
        }
    }
    println!("{}", stats.snapshot());
    println!(
        "budget: {} B in use (quarantined + queued frees), peak {} B of {} B; {} retries",
        budget.in_use(),
        budget.peak(),
        budget.limit(),
        r.inner().retries()
    );
    r.inner().inner().inner().inner().flush()?;
    r.reap_pending()?;
    println!("after flush and reap: {} B in use", budget.in_use());
    Ok(())
}

fn main() -> Result<(), BoxError> {
    if cuda_present()
        && let Ok(ctx) = CudaGpu::open(0)
    {
        println!("device: CUDA device 0");
        let pool = streamalloc::StreamPool::cuda(&ctx, 3)?;
        return run(Arc::new(AsyncCudaResource::new(ctx, 0, pool)));
    }
    println!("device: simulated");
    let gpu = SimGpu::new();
    let pool = gpu.stream_pool(3);
    run(Arc::new(SimResource::new(gpu.clone(), pool)))?;
    let races = gpu.races();
    println!("race detector: {} race(s)", races.len());
    assert!(races.is_empty(), "{races:?}");
    Ok(())
}
