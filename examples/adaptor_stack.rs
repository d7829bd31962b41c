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
use streamalloc::launch::LaunchRecorder;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceBuilder, StreamOrderedResource};

type BoxError = Box<dyn Error + Send + Sync>;
const MIB: usize = 1 << 20;

fn main() -> Result<(), BoxError> {
    // CUDA device 0 when there is one, else the simulated device.
    let device = Device::open(0, 3);
    println!("device: {device}");
    let resource = Arc::new(StreamOrderedResource::new(&device));
    let gpu = device.gpu();
    let (load, compute, store) = (device.stream(0)?, device.stream(1)?, device.stream(2)?);
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
                // SAFETY: the guard is the poison's only user and fills only blocks live in a resource of this device.
                .poison(unsafe { GpuPoison::new(&device, 0xA5) }),
        )
        .build(resource.clone());

    for _ in 0..16 {
        let input = r.allocate(16 * MIB, load, AllocTag("input"))?;
        let hidden = r.allocate(32 * MIB, compute, AllocTag("activations"))?;
        let output = r.allocate(16 * MIB, store, AllocTag("output"))?;
        LaunchRecorder::new(&r, load).write(&input).launch(
            &device,
            |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the device's pool; the block is live (freed later).
                Ok(unsafe { gpu.memset_async(input.ptr(), 1, input.size(), raw) }?)
            },
        )?;
        LaunchRecorder::new(&r, compute)
            .read(&input)
            .write(&hidden)
            .launch(&device, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the device's pool; both blocks are live (freed later).
                Ok(unsafe { gpu.copy_async(hidden.ptr(), input.ptr(), input.size(), raw) }?)
            })?;
        LaunchRecorder::new(&r, store)
            .read(&hidden)
            .write(&output)
            .launch(&device, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the device's pool; both blocks are live (freed later).
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
    if let Some(sim) = device.simulator() {
        let races = sim.races();
        println!("race detector: {} race(s)", races.len());
        assert!(races.is_empty(), "{races:?}");
    }
    Ok(())
}
