//! Running out of memory on purpose, and reading who holds it.
//!
//! A budget of 64 MiB over a cache: weights, a KV cache and activations
//! fill it, some activations are freed (idle in the cache, or still queued
//! on the GPU), and one more request does not fit. The error prints one
//! line; `oom_report` says what was asked and free, what the cache holds
//! idle and in how large a piece, what the GPU has yet to free, and the
//! tags that hold the most.
//!
//! ```text
//! cargo run --example oom_report                          # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example oom_report   # always simulated
//! ```

use streamalloc::record_memory_history;
use streamalloc::{AllocTag, AsyncResource, Budget, CacheConfig, Device, ResourceBuilder};

const MIB: usize = 1 << 20;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), streamalloc::ResourceError> {
    // Keep the last 1,000 events (the report does not need them; a
    // snapshot exported for PyTorch's viewer shows them as its timeline).
    record_memory_history(1000, false);
    let device = Device::open(0, 2);
    let budget = Budget::new(64 * MIB);
    let layers = ResourceBuilder::new()
        .budget(&budget)
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers)?;
    let (s0, s1) = (device.stream(0)?, device.stream(1)?);

    let weights = res.allocate(24 * MIB, s0, AllocTag("weights")).await?;
    let kv = res.allocate(16 * MIB, s1, AllocTag("kv-cache")).await?;
    let mut activations = Vec::new();
    for _ in 0..6 {
        activations.push(res.allocate(3 * MIB, s0, AllocTag("activations")).await?);
    }
    // Half of the activations go back: the cache keeps them idle.
    for block in activations.drain(..3) {
        drop(res.deallocate(block)?);
    }

    // `try_allocate` fails at once; `allocate(..).await` would wait for
    // memory to come back instead.
    let err = res
        .try_allocate(20 * MIB, s1, AllocTag("batch"))
        .expect_err("64 MiB cannot hold this");
    println!("error: {err}\n");
    if let Some(report) = res.oom_report(&err) {
        println!("{report}");
    }

    for block in activations.into_iter().chain([weights, kv]) {
        drop(res.deallocate(block)?);
    }
    record_memory_history(0, false);
    Ok(())
}
