//! What owned buffers cost, as ratios against their baselines in the same
//! run (issue 14):
//!
//! 1. dropping a `Buffer` vs an explicit `deallocate` of the same block
//!    (the frees alone, allocations outside the timer; then whole pairs);
//! 2. on CUDA, cudarc's `memcpy_htod` + a saxpy launch through
//!    `CudaBuffer`s vs the same on cudarc `CudaSlice`s; on the simulated
//!    device, a launch through buffer guards vs one on bare blocks.
//!
//! Runs on CUDA device 0 when present, on the simulated device otherwise
//! (`--sim` forces it). Each row interleaves baseline and candidate rounds
//! and reports the median of the per-round ratios.
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin buffer_costs [-- --sim]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, StreamOrderedResource};
use streamalloc_measure::support;

const ROUNDS: usize = 21;
const BATCH: usize = 1000;
const BYTES: usize = 4096;
const T: AllocTag = AllocTag("buffer-costs");

/// Median of the per-round ratios candidate / baseline, and the two medians.
fn ratio(
    mut base: impl FnMut() -> Duration,
    mut cand: impl FnMut() -> Duration,
) -> (f64, Duration, Duration) {
    let (mut b, mut c, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Alternate which runs first, so that drift favours neither.
        let (tb, tc) = if round % 2 == 0 {
            let tb = base();
            (tb, cand())
        } else {
            let tc = cand();
            (base(), tc)
        };
        r.push(tc.as_secs_f64() / tb.as_secs_f64());
        b.push(tb);
        c.push(tc);
    }
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    r.sort_by(f64::total_cmp);
    (r[r.len() / 2], med(&mut b), med(&mut c))
}

fn row(name: &str, base: &str, (r, b, c): (f64, Duration, Duration)) {
    let per = |d: Duration| d.as_nanos() as f64 / BATCH as f64;
    println!(
        "{name:<44} {:>9.1} ns  vs {base:<22} {:>9.1} ns   ratio {r:.3}",
        per(c),
        per(b)
    );
}

/// Row 1 on one backend's stream-ordered resource.
fn drop_vs_deallocate<G: Gpu>(bench: &support::Bench<G>) {
    let res: &Arc<StreamOrderedResource<G>> = &bench.resource;
    let s = bench.stream(0);
    let frees_only = ratio(
        || {
            let blocks: Vec<DeviceBlock> = (0..BATCH)
                .map(|_| res.allocate(BYTES, s, T).unwrap())
                .collect();
            let t = Instant::now();
            for b in blocks {
                res.deallocate(b).unwrap();
            }
            let t = t.elapsed();
            bench.sync();
            t
        },
        || {
            let bufs: Vec<_> = (0..BATCH)
                .map(|_| res.allocate_buffer::<u8>(BYTES, s, T).unwrap())
                .collect();
            let t = Instant::now();
            drop(bufs);
            let t = t.elapsed();
            bench.sync();
            t
        },
    );
    row(
        &format!("[{}] drop(Buffer)", bench.name),
        "deallocate(block)",
        frees_only,
    );
    let pairs = ratio(
        || {
            let t = Instant::now();
            for _ in 0..BATCH {
                support::Bench::<G>::pair(&**res, s, BYTES);
            }
            let t = t.elapsed();
            bench.sync();
            t
        },
        || {
            let t = Instant::now();
            for _ in 0..BATCH {
                drop(std::hint::black_box(
                    res.allocate_buffer::<u8>(BYTES, s, T).unwrap(),
                ));
            }
            let t = t.elapsed();
            bench.sync();
            t
        },
    );
    row(
        &format!("[{}] allocate_buffer + drop", bench.name),
        "allocate + deallocate",
        pairs,
    );
}

/// Row 1 through an `AsyncResource`: its `deallocate` (handle dropped) vs
/// dropping a buffer it allocated.
fn drop_vs_deallocate_async<G: Gpu>(bench: &support::Bench<G>) {
    let res = streamalloc::AsyncResource::new(bench.resource.clone()).unwrap();
    let s = bench.stream(0);
    let r = ratio(
        || {
            let blocks: Vec<DeviceBlock> = (0..BATCH)
                .map(|_| res.try_allocate(BYTES, s, T).unwrap())
                .collect();
            let t = Instant::now();
            for b in blocks {
                drop(res.deallocate(b).unwrap());
            }
            let t = t.elapsed();
            bench.sync();
            t
        },
        || {
            let bufs: Vec<_> = (0..BATCH)
                .map(|_| res.try_allocate_buffer::<u8>(BYTES, s, T).unwrap())
                .collect();
            let t = Instant::now();
            drop(bufs);
            let t = t.elapsed();
            bench.sync();
            t
        },
    );
    row(
        &format!("[{}] drop(Buffer), AsyncResource", bench.name),
        "AsyncResource::deallocate",
        r,
    );
}

/// Row 2 on the simulated device: a launch reading one buffer and writing
/// another, through guards vs on bare blocks.
fn sim_launch_rows(bench: &support::Bench<streamalloc::gpu::sim::SimGpu>) {
    let (res, gpu) = (&bench.resource, &bench.gpu);
    let (s, raw) = (bench.stream(0), bench.raw(0));
    let x = res.allocate_buffer::<f32>(256, s, T).unwrap();
    let mut y = res.allocate_buffer::<f32>(256, s, T).unwrap();
    let (xb, yb) = (x.block().clone(), y.block().clone());
    let r = ratio(
        || {
            let t = Instant::now();
            for _ in 0..BATCH {
                gpu.launch_kernel(raw, &[MemAccess::read(&xb), MemAccess::write(&yb)])
                    .unwrap();
            }
            let t = t.elapsed();
            bench.sync();
            t
        },
        || {
            let t = Instant::now();
            for _ in 0..BATCH {
                let r = x.read_on(s).unwrap();
                let w = y.write_on(s).unwrap();
                gpu.launch_kernel(raw, &[r.sim_access(), w.sim_access()])
                    .unwrap();
            }
            let t = t.elapsed();
            bench.sync();
            t
        },
    );
    row(
        "[sim] launch through buffer guards",
        "launch on bare blocks",
        r,
    );
}

mod cuda_rows {
    //! Row 2 on CUDA: cudarc's copy + launch, `CudaBuffer` vs `CudaSlice`.

    use super::*;
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    use cudarc::nvrtc::Ptx;
    use streamalloc::CudaBuffer;
    use streamalloc::gpu::cuda::CudaGpu;

    const PTX: &str = include_str!("../../../examples/kernels/saxpy.ptx");
    const N: usize = 256;

    pub fn run(bench: &support::Bench<CudaGpu>) {
        let s = bench.stream(0);
        let stream = bench.pool.cuda_stream(s).unwrap().clone();
        let saxpy = stream
            .context()
            .load_module(Ptx::from_src(PTX))
            .unwrap()
            .load_function("saxpy")
            .unwrap();
        let host = vec![1.0f32; N];
        let (a, n, cfg) = (1.0f32, N as u32, LaunchConfig::for_num_elems(N as u32));
        let mut xs = stream.clone_htod(&host).unwrap();
        let mut ys = stream.clone_htod(&host).unwrap();
        let mut xb =
            CudaBuffer::new(bench.resource.allocate_buffer::<f32>(N, s, T).unwrap()).unwrap();
        let mut yb =
            CudaBuffer::new(bench.resource.allocate_buffer::<f32>(N, s, T).unwrap()).unwrap();
        stream.memcpy_htod(&host, &mut yb).unwrap();
        stream.synchronize().unwrap();
        let r = ratio(
            || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    stream.memcpy_htod(&host, &mut xs).unwrap();
                    let mut l = stream.launch_builder(&saxpy);
                    l.arg(&a).arg(&xs).arg(&mut ys).arg(&n);
                    // SAFETY: saxpy's four arguments, N threads over N elements.
                    unsafe { l.launch(cfg) }.unwrap();
                }
                stream.synchronize().unwrap();
                t.elapsed()
            },
            || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    stream.memcpy_htod(&host, &mut xb).unwrap();
                    let mut l = stream.launch_builder(&saxpy);
                    l.arg(&a).arg(&xb).arg(&mut yb).arg(&n);
                    // SAFETY: as above.
                    unsafe { l.launch(cfg) }.unwrap();
                }
                stream.synchronize().unwrap();
                t.elapsed()
            },
        );
        row(
            "[cuda] memcpy_htod + launch, CudaBuffer",
            "the same on CudaSlice",
            r,
        );
        drop((xb, yb));
        bench.sync();
    }
}

fn main() {
    let force_sim = std::env::args().any(|a| a == "--sim");
    println!(
        "batches of {BATCH}, {ROUNDS} rounds; median of per-round ratios (candidate / baseline)"
    );
    match (!force_sim).then(support::cuda).flatten() {
        Some(cuda) => {
            println!("device: CUDA device 0");
            drop_vs_deallocate(&cuda);
            drop_vs_deallocate_async(&cuda);
            cuda_rows::run(&cuda);
        }
        None => println!("device: simulated (no CUDA, or --sim)"),
    }
    let null = support::null();
    drop_vs_deallocate(&null);
    let sim = support::sim();
    drop_vs_deallocate(&sim);
    drop_vs_deallocate_async(&sim);
    sim_launch_rows(&sim);
}
