//! An adaptor stack in front of the stream-ordered resource, and a
//! three-stream pipeline through owned buffers allocated from it.
//!
//! Runs on CUDA device 0 when `libcuda` is present, on the simulated device
//! otherwise (then the race detector checks the pipeline):
//!
//! ```text
//! cargo run --example adaptor_stack
//! ```

use std::error::Error;
use std::sync::Arc;

use streamalloc::{
    AllocTag, Buffer, Device, DeviceMemoryResource, ResourceBuilder, StreamOrderedResource,
};
use streamalloc::{Budget, GuardConfig, MemsetPoisonFill, Stats};

type BoxError = Box<dyn Error + Send + Sync>;
const MIB: usize = 1 << 20;

fn main() -> Result<(), BoxError> {
    // CUDA device 0 when there is one, else the simulated device.
    let device = Device::open(0, 3);
    println!("device: {device}");
    let resource = Arc::new(StreamOrderedResource::new(&device));
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
                .poison(unsafe { MemsetPoisonFill::new(&device, 0xA5) }),
        )
        .build(resource.clone());

    let r = Arc::new(r);
    for _ in 0..16 {
        // Owned buffers over the stack: each orders its uses on other
        // streams, and frees itself through the stack when dropped.
        let alloc = |bytes, stream, tag| {
            Buffer::<u8>::allocate_in(r.clone(), &device, bytes, stream, AllocTag(tag))
        };
        let mut input = alloc(16 * MIB, load, "input")?;
        let mut hidden = alloc(32 * MIB, compute, "activations")?;
        let mut output = alloc(16 * MIB, store, "output")?;
        input.fill_bytes_on(load, 1)?;
        hidden
            .slice_mut(..16 * MIB)?
            .copy_from_on(compute, &input.slice(..)?)?;
        output
            .slice_mut(..)?
            .copy_from_on(store, &hidden.slice(..16 * MIB)?)?;
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
