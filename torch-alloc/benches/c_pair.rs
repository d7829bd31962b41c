//! What one `alloc` + `free` pair costs through the C functions PyTorch
//! calls, on the simulated device: the driver calls per pair by kind (the
//! simulator counts them), and the host time per pair (indicative only:
//! the simulator's own calls are in it).
//!
//! ```text
//! cargo bench -p torch-alloc --bench c_pair -- [PAIRS]
//! ```
//!
//! The pairs run in [`burst`], which is never inlined, so that callgrind
//! counts their instructions alone:
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*c_pair*burst*' \
//!     target/release/deps/c_pair-HASH 20000
//! ```
//!
//! (the instructions it reports, divided by the pairs, are one pair's).
//! The pattern is a decoder's on four streams, the common case of a
//! serving step: a burst of pairs of one size on one stream (each
//! allocates and frees there), then the next stream's burst of the next
//! size (sizes cycling through a step's),
//! with 64 blocks live meanwhile (so the address table and the arena are
//! not empty); between rounds the simulated GPU runs what was queued, as
//! a GPU that keeps up would.

use std::ffi::c_void;
use std::hint::black_box;
use std::time::Instant;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use torch_alloc::{simulate, streamalloc_torch_alloc, streamalloc_torch_free};

const KIB: isize = 1 << 10;
const MIB: isize = 1 << 20;

/// The sizes a burst cycles through: activations and workspaces of a step.
const SIZES: [isize; 8] = [
    512,
    8 * KIB,
    64 * KIB,
    256 * KIB,
    MIB,
    3 * MIB,
    8 * MIB,
    12 * MIB,
];

/// Pairs per burst on one stream.
const BURST: usize = 32;

/// Every kind the simulator counts.
const CALLS: [DriverCall; 29] = [
    DriverCall::AllocAsync,
    DriverCall::FreeAsync,
    DriverCall::EventCreate,
    DriverCall::EventRecord,
    DriverCall::EventQuery,
    DriverCall::EventSynchronize,
    DriverCall::EventDestroy,
    DriverCall::StreamWaitEvent,
    DriverCall::StreamSynchronize,
    DriverCall::StreamQuery,
    DriverCall::LaunchHostFunc,
    DriverCall::MemsetAsync,
    DriverCall::CopyAsync,
    DriverCall::Launch,
    DriverCall::MemGetInfo,
    DriverCall::AddressReserve,
    DriverCall::AddressFree,
    DriverCall::MemCreate,
    DriverCall::MemRelease,
    DriverCall::MemMap,
    DriverCall::MemSetAccess,
    DriverCall::MemUnmap,
    DriverCall::StreamGetCaptureInfo,
    DriverCall::StreamBeginCapture,
    DriverCall::StreamEndCapture,
    DriverCall::GraphInstantiate,
    DriverCall::GraphLaunch,
    DriverCall::GraphDestroy,
    DriverCall::MemHostAlloc,
];

/// [`BURST`] pairs of `size` bytes on `stream`.
#[inline(never)]
fn burst(stream: *mut c_void, size: isize) {
    for _ in 0..BURST {
        let ptr = streamalloc_torch_alloc(black_box(size), 0, stream);
        assert!(!ptr.is_null(), "alloc refused");
        streamalloc_torch_free(black_box(ptr), size, 0, stream);
    }
}

/// About `count` pairs: rounds of a burst per stream, the simulated GPU
/// run to idle after each round. Returns the pairs made.
fn pairs(sim: &SimGpu, streams: &[*mut c_void], count: usize) -> usize {
    let rounds = count.div_ceil(BURST * streams.len());
    for round in 0..rounds {
        for (i, &stream) in streams.iter().enumerate() {
            burst(stream, SIZES[(round * streams.len() + i) % SIZES.len()]);
        }
        sim.run_until_idle();
    }
    rounds * BURST * streams.len()
}

fn counts(sim: &SimGpu) -> Vec<u64> {
    CALLS.iter().map(|&c| sim.call_count(c)).collect()
}

fn main() {
    let count: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map_or(100_000, |a| a.parse().expect("PAIRS: a number"));
    let sim = SimGpu::builder().capacity(8 << 30).manual().build();
    simulate(vec![sim.clone()]).expect("the first call of the process");
    let pool = sim.stream_pool(4);
    let streams: Vec<*mut c_void> = pool
        .ids()
        .map(|id| pool.raw(id).expect("a stream of the pool").get() as usize as *mut c_void)
        .collect();

    // Live blocks, then a warm-up that maps what the pairs need.
    let live: Vec<_> = (0..64)
        .map(|n| {
            let size = SIZES[n % SIZES.len()];
            let ptr = streamalloc_torch_alloc(size, 0, streams[n % streams.len()]);
            assert!(!ptr.is_null(), "alloc refused");
            (ptr, size, streams[n % streams.len()])
        })
        .collect();
    pairs(&sim, &streams, 1_000);

    let before = counts(&sim);
    let started = Instant::now();
    let count = pairs(&sim, &streams, count);
    let elapsed = started.elapsed();
    let after = counts(&sim);

    println!(
        "pairs={count} ns_per_pair={:.1} (simulator included)",
        elapsed.as_nanos() as f64 / count as f64
    );
    let mut any = false;
    for ((call, b), a) in CALLS.iter().zip(&before).zip(&after) {
        if a > b {
            any = true;
            println!(
                "driver_calls_per_pair {call:?}={:.3}",
                (a - b) as f64 / count as f64
            );
        }
    }
    if !any {
        println!("driver_calls_per_pair none");
    }
    for (ptr, size, stream) in live {
        streamalloc_torch_free(ptr, size, 0, stream);
    }
}
