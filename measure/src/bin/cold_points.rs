//! Completion points made with cold caches, for a cache simulator: what one
//! `completion()` and one await of a settled point miss when something
//! between two points (on a GPU, the driver call that queued the work)
//! evicts the crate's state from the caches.
//!
//! Runs on the null backend (driver calls that do nothing, events always
//! complete): 400 points on one stream per round, a 4 MiB buffer touched
//! before each point, then the points awaited in order. Under cachegrind
//! with a last-level cache smaller than the buffer, the per-function miss
//! counts divided by the points made (400 × rounds) are the misses per
//! point:
//!
//! ```text
//! cargo build --release -p streamalloc-measure --bin cold_points
//! valgrind --tool=cachegrind --cache-sim=yes --LL=2097152,16,64 \
//!     target/release/cold_points 5
//! cg_annotate --show=Ir,DLmr,DLmw --sort=DLmr --threshold=0 cachegrind.out.*
//! ```
//! A second argument (any) leaves the buffer alone: the same run warm.

use streamalloc_measure::support;

use std::sync::Arc;

use streamalloc::AsyncResource;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{Device, StreamOrderedResource};

/// Points per round, as the 8 MiB rows of `gpu_latency` make.
const POINTS: usize = 400;

fn main() {
    let handles = SimGpu::builder().manual().build();
    let pool = handles.stream_pool(8);
    let gpu = Arc::new(support::NullGpu::with_events_on(&handles));
    let device = Device::new(gpu, pool.clone()).expect("both device 0");
    let inner = Arc::new(StreamOrderedResource::new(&device));
    let res = AsyncResource::new(inner).expect("resource");
    let s = pool.id(0).expect("stream");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let cold = std::env::args().nth(2).is_none();
    // Larger than the simulated last-level cache: touching it evicts.
    let mut buf = vec![0u8; 4 << 20];
    for round in 0..rounds {
        let mut points = Vec::with_capacity(POINTS);
        for i in 0..POINTS {
            if cold {
                for j in (0..buf.len()).step_by(64) {
                    buf[j] = buf[j].wrapping_add((i + round) as u8);
                }
            }
            points.push(res.completion(s).expect("point"));
        }
        rt.block_on(async {
            for point in points {
                point.await.expect("settled");
            }
        });
    }
    std::hint::black_box(&buf);
    println!(
        "{} points in {rounds} rounds ({})",
        rounds * POINTS,
        if cold { "cold" } else { "warm" }
    );
}
