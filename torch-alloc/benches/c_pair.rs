//! What one `alloc` + `free` pair costs through the C functions PyTorch
//! calls: on the simulated device, the driver calls per pair by kind (the
//! simulator counts them) and the host time per pair (indicative only: the
//! simulator's own calls are in it); on CUDA (`--cuda`, device 0, four
//! streams made with cudarc on its primary context, as PyTorch's are), the
//! time per pair with the real driver calls.
//!
//! ```text
//! cargo bench -p torch-alloc --bench c_pair -- [PAIRS] [--cuda] [--announce]
//! ```
//!
//! `--announce` makes the call `torch_hooks.py` makes
//! (`streamalloc_torch_announce_captures`): capture queries then reach the
//! driver only while an announced capture is underway; without it, at
//! every allocation and free. On CUDA the two runs, one after the other on
//! the same machine, give what the queries cost.
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
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream};

use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use torch_alloc::{
    simulate, streamalloc_torch_alloc, streamalloc_torch_failures, streamalloc_torch_free,
};

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

/// [`BURST`] pairs of `size` bytes on `stream`.
#[inline(never)]
fn burst(stream: *mut c_void, size: isize) {
    for _ in 0..BURST {
        let ptr = streamalloc_torch_alloc(black_box(size), 0, stream);
        assert!(!ptr.is_null(), "alloc refused");
        streamalloc_torch_free(black_box(ptr), size, 0, stream);
    }
}

/// Where the pairs run.
enum Target {
    Sim(Arc<SimGpu>),
    Cuda {
        ctx: Arc<CudaContext>,
        /// Kept alive for the process, as PyTorch keeps its own.
        _streams: Vec<Arc<CudaStream>>,
    },
}

impl Target {
    /// Runs what was queued, as a GPU that keeps up would have.
    fn settle(&self) {
        match self {
            Target::Sim(sim) => sim.run_until_idle(),
            Target::Cuda { ctx, .. } => ctx.synchronize().expect("cuCtxSynchronize"),
        }
    }
}

/// About `count` pairs: rounds of a burst per stream, the GPU settled
/// after each round. Returns the pairs made.
fn pairs(target: &Target, streams: &[*mut c_void], count: usize) -> usize {
    let rounds = count.div_ceil(BURST * streams.len());
    for round in 0..rounds {
        for (i, &stream) in streams.iter().enumerate() {
            burst(stream, SIZES[(round * streams.len() + i) % SIZES.len()]);
        }
        target.settle();
    }
    rounds * BURST * streams.len()
}

/// The simulator's driver calls so far, by kind (none counted on CUDA).
fn counts(target: &Target) -> Vec<u64> {
    match target {
        Target::Sim(sim) => DriverCall::ALL.iter().map(|&c| sim.call_count(c)).collect(),
        Target::Cuda { .. } => Vec::new(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count: usize = args
        .iter()
        .find(|a| !a.starts_with('-'))
        .map_or(100_000, |a| a.parse().expect("PAIRS: a number"));
    let cuda = args.iter().any(|a| a == "--cuda");
    let announce = args.iter().any(|a| a == "--announce");
    if announce {
        // SAFETY: this program begins no capture.
        unsafe { torch_alloc::streamalloc_torch_announce_captures() };
    }
    if cuda && !streamalloc::gpu::cuda::cuda_present() {
        eprintln!("--cuda: libcuda cannot be loaded on this machine");
        std::process::exit(2);
    }
    let (target, streams): (Target, Vec<*mut c_void>) = if cuda {
        let ctx = CudaContext::new(0).expect("CUDA device 0");
        let made: Vec<_> = (0..4)
            .map(|_| ctx.new_stream().expect("cuStreamCreate"))
            .collect();
        let handles = made.iter().map(|s| s.cu_stream() as *mut c_void).collect();
        (
            Target::Cuda {
                ctx,
                _streams: made,
            },
            handles,
        )
    } else {
        let sim = SimGpu::builder().capacity(8 << 30).manual().build();
        simulate(vec![sim.clone()]).expect("the first call of the process");
        let pool = sim.stream_pool(4);
        let handles = pool
            .ids()
            .map(|id| pool.raw(id).expect("a stream of the pool").get() as usize as *mut c_void)
            .collect();
        (Target::Sim(sim), handles)
    };

    // Live blocks, then a warm-up that maps what the pairs need.
    let live: Vec<_> = (0..64)
        .map(|n| {
            let size = SIZES[n % SIZES.len()];
            let ptr = streamalloc_torch_alloc(size, 0, streams[n % streams.len()]);
            assert!(!ptr.is_null(), "alloc refused");
            (ptr, size, streams[n % streams.len()])
        })
        .collect();
    pairs(&target, &streams, 1_000);

    let before = counts(&target);
    let started = Instant::now();
    let count = pairs(&target, &streams, count);
    let elapsed = started.elapsed();
    let after = counts(&target);

    println!(
        "backend={} announced={announce} pairs={count} ns_per_pair={:.1}{}",
        if cuda { "cuda" } else { "sim" },
        elapsed.as_nanos() as f64 / count as f64,
        if cuda { "" } else { " (simulator included)" },
    );
    if streamalloc_torch_failures(0) > 0 {
        eprintln!("{} calls refused", streamalloc_torch_failures(0));
        std::process::exit(1);
    }
    if cuda {
        return;
    }
    let mut any = false;
    for ((call, b), a) in DriverCall::ALL.iter().zip(&before).zip(&after) {
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
