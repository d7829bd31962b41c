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
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, Device, DeviceMemoryResource, ResourceResult, StreamOrderedResource,
};

fn plant(device: &Device, fixed: bool) -> ResourceResult<()> {
    let r = StreamOrderedResource::new(device);
    let (a, b) = (device.stream(0)?, device.stream(1)?);
    let (raw_a, raw_b) = (device.raw(a)?, device.raw(b)?);
    let gpu = device.gpu();
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
    // A manual simulated device when there is no GPU: the order in which
    // the streams run is then fixed, and the race shows every time.
    let device = Device::open_or_sim(0, 2, SimGpu::builder().manual());
    println!("device: {device}");
    plant(&device, fixed)?;
    let Some(sim) = device.simulator() else {
        println!("ran on CUDA; run under compute-sanitizer to see the verdict");
        return Ok(());
    };
    let races = sim.races();
    for race in &races {
        println!("sim race detector: {race}");
    }
    println!("sim race detector: {} race(s)", races.len());
    Ok(())
}
