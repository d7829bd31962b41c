//! Sleep and wake: a service idle between bursts gives the GPU memory of
//! its model back without rebuilding anything. The weights are offloaded
//! to the host pool's pinned memory and restored, the KV cache is dropped; every
//! address stays the same, so the buffers (and anything that captured
//! their pointers) are used again as they are after the wake.
//!
//! ```text
//! cargo run --example sleep                         # real GPU if present, else simulated
//! STREAMALLOC_DEVICE=sim cargo run --example sleep  # always simulated
//! ```

use streamalloc::AsyncResource;
use streamalloc::{AllocTag, Device, ResourceBuilder, ResourceError, ResourceResult};
use streamalloc::{CacheConfig, SleepMode, SleepPlan};
use streamalloc::{HostPool, HostPoolConfig};

const WEIGHTS: AllocTag = AllocTag("weights");
const KV: AllocTag = AllocTag("kv");
/// 64 MiB of f32 per weights block, four of them; 128 MiB of KV cache.
const LEN: usize = 16 << 20;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ResourceResult<()> {
    let device = Device::open(0, 1);
    println!("device: {device}");
    let res = AsyncResource::build(
        &device,
        &ResourceBuilder::new().cache(CacheConfig::default()),
    )?;
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0)?;

    // Load the "model": weights copied in from the host, a KV cache.
    let mut host = pool.allocate::<f32>(LEN, WEIGHTS)?;
    let mut weights = Vec::new();
    for layer in 0..4 {
        host.as_mut_slice()?.fill(layer as f32 + 0.5);
        let mut w = res.allocate_buffer::<f32>(LEN, s, WEIGHTS).await?;
        res.copy_to_device(&host, &mut w, s)?.await?;
        weights.push(w);
    }
    let kv = res.allocate_buffer::<f32>(2 * LEN, s, KV).await?;
    let mib = |b: usize| b >> 20;
    println!("awake:  {} MiB mapped", mib(res.inner().physical_bytes()));

    // Idle: the weights go to the pool's pinned memory (the next sleep
    // reuses it, pinning nothing), the KV cache is dropped.
    let plan = SleepPlan::new()
        .tag(WEIGHTS, SleepMode::Offload)
        .tag(KV, SleepMode::Discard)
        .offload_to(pool.clone());
    res.sleep(&plan).await?;
    println!("asleep: {} MiB mapped", mib(res.inner().physical_bytes()));
    // A sleeping buffer is refused, never a fault.
    let refused = res.copy_to_host(&weights[0], &mut host, s);
    assert!(matches!(refused, Err(ResourceError::BlockAsleep { .. })));

    // The next burst: same addresses, the weights as they were.
    res.wake().await?;
    println!("woken:  {} MiB mapped", mib(res.inner().physical_bytes()));
    res.copy_to_host(&weights[3], &mut host, s)?.await?;
    // The simulated device stores no data; a GPU returns what went in.
    if device.simulator().is_none() {
        assert!(
            host.as_slice()?.iter().all(|&x| x == 3.5),
            "weights restored"
        );
        println!("weights restored bit for bit");
    }
    drop((weights, kv));
    Ok(())
}
