//! Writes a memory snapshot with its history in the formats users open:
//! PyTorch's memory-viewer pickle, JSON, and a PNG of the memory each tag
//! held over time. The workload is a few training-like steps through a
//! budget over the cache (weights once, activations per step, a growing
//! KV cache on a second stream), on CUDA device 0 or the simulator.
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin memory_viz -- [OUT_DIR] [--backtraces]
//! python3 measure/scripts/check_memory_viz.py OUT_DIR/snapshot.pickle   # PyTorch's own tools
//! ```

use std::path::PathBuf;

use streamalloc::record_memory_history;
use streamalloc::{AllocTag, AsyncResource, Budget, CacheConfig, Device, ResourceBuilder};
use streamalloc_measure::memory_plot;

const MIB: usize = 1 << 20;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backtraces = args.iter().any(|a| a == "--backtraces");
    let out = PathBuf::from(
        args.iter()
            .find(|a| !a.starts_with("--"))
            .map_or("target/memory-viz", String::as_str),
    );
    std::fs::create_dir_all(&out)?;
    record_memory_history(100_000, backtraces);

    let device = Device::open(0, 2);
    let budget = Budget::new(512 * MIB);
    let layers = ResourceBuilder::new()
        .budget(&budget)
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers)?;
    let (s0, s1) = (device.stream(0)?, device.stream(1)?);

    let weights = res.allocate(96 * MIB, s0, AllocTag("weights")).await?;
    let mut kv = Vec::new();
    for step in 0..12 {
        let mut acts = Vec::new();
        for layer in 0..8 {
            let size = (2 + (layer + step) % 5) * MIB;
            acts.push(res.allocate(size, s0, AllocTag("activations")).await?);
        }
        kv.push(res.allocate(4 * MIB, s1, AllocTag("kv-cache")).await?);
        // Backward: the activations go back, newest first.
        while let Some(block) = acts.pop() {
            res.deallocate(block)?.await?;
        }
    }
    // One request too many: recorded as an out-of-memory event.
    let err = res
        .try_allocate(1024 * MIB, s1, AllocTag("too-big"))
        .expect_err("past the budget");
    if let Some(report) = res.oom_report(&err) {
        println!("{report}\n");
    }

    let snapshot = res.snapshot();
    std::fs::write(out.join("snapshot.pickle"), snapshot.to_torch_pickle())?;
    std::fs::write(out.join("snapshot.json"), snapshot.to_json())?;
    let text = memory_plot::write_png(
        &out.join("memory_by_tag.png"),
        "memory held per tag",
        &snapshot.history,
    )?;
    println!(
        "{} blocks, {} segments, {} events; wrote {}/snapshot.pickle, snapshot.json, memory_by_tag.png{}",
        snapshot.blocks.len(),
        snapshot.segments.len(),
        snapshot.history.len(),
        out.display(),
        if text { "" } else { " (no font: no text)" }
    );

    for block in kv.into_iter().chain([weights]) {
        res.deallocate(block)?.await?;
    }
    record_memory_history(0, false);
    Ok(())
}
