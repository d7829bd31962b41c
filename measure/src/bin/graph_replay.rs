//! What a replayed CUDA graph costs through streamalloc, as a ratio against
//! the same graph built with cudarc's own allocation, in one process
//! (issue 19; target ≤ 1.05×).
//!
//! The step, captured once each way: two temporaries allocated inside the
//! capture (graph memory nodes), a fill, a saxpy, a copy, a second saxpy
//! into a persistent buffer, the two frees.
//!
//! - baseline: cudarc, `CudaStream::begin_capture`, `CudaStream::alloc`
//!   (`cuMemAllocAsync`, the device's default pool) and `CudaSlice` drops,
//!   `CudaGraph::launch`;
//! - candidate: streamalloc, `AsyncResource::capture_graph`,
//!   `try_allocate`/`deallocate` (`cuMemAllocFromPoolAsync` on the crate's
//!   pool), `CapturedGraph::launch`.
//!
//! Rows (each the median of 21 interleaved rounds' ratios):
//!
//! 1. `launch`: a batch of replays queued back to back, one synchronize at
//!    the end; the candidate's launch also makes its completion future
//!    (dropped unawaited), the baseline's does not;
//! 2. `awaited`: every replay awaited (candidate: its `EventFuture` on a
//!    tokio runtime; baseline: `CudaStream::synchronize`).
//!
//! Needs CUDA device 0; exits with an error without one (no silent skip).
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin graph_replay
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use streamalloc::AsyncResource;
use streamalloc::CapturedGraph;
use streamalloc::gpu::CaptureMode;
use streamalloc::gpu::cuda::CudaGpu;
use streamalloc::{AllocTag, AsyncCudaResource, Device, ResourceError, StreamId};

const PTX: &str = include_str!("../../../examples/kernels/saxpy.ptx");
const ROUNDS: usize = 21;
/// Replays per round.
const BATCH: usize = 200;
/// Elements of each buffer (f32): a small step, where launch and allocation
/// costs are not hidden behind the kernels.
const N: usize = 1 << 14;
const A: f32 = 0.5;
const T: AllocTag = AllocTag("graph-replay");

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

fn row(name: &str, (r, b, c): (f64, Duration, Duration)) {
    let per = |d: Duration| d.as_secs_f64() * 1e6 / BATCH as f64;
    println!(
        "{name:<10} streamalloc {:>8.2} µs/replay   cudarc {:>8.2} µs/replay   ratio {r:.3}",
        per(c),
        per(b)
    );
}

fn saxpy(stream: &Arc<CudaStream>, f: &CudaFunction, x: u64, y: u64) {
    let n = N as u32;
    let mut l = stream.launch_builder(f);
    l.arg(&A).arg(&x).arg(&y).arg(&n);
    // SAFETY: saxpy(float, const float*, float*, unsigned) takes these four
    // arguments; x and y are live device buffers of N floats.
    unsafe { l.launch(LaunchConfig::for_num_elems(n)) }.expect("saxpy launch");
}

/// The step through cudarc's own allocation, captured on `stream`.
fn cudarc_graph(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> CudaGraph {
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    {
        // SAFETY: written (memset) before anything reads them.
        let mut t1 = unsafe { stream.alloc::<f32>(N) }.unwrap();
        let mut t2 = unsafe { stream.alloc::<f32>(N) }.unwrap();
        stream.memset_zeros(&mut t1).unwrap();
        let (xp, _g) = x.device_ptr(stream);
        let (t1p, _g1) = t1.device_ptr_mut(stream);
        saxpy(stream, f, xp, t1p);
        drop(_g1);
        stream.memcpy_dtod(&t1, &mut t2).unwrap();
        let (t2p, _g2) = t2.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        saxpy(stream, f, t2p, yp);
    } // t1, t2 freed inside the capture
    stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph")
}

/// The same step through streamalloc, captured on `s`.
fn streamalloc_graph(
    res: &AsyncResource<AsyncCudaResource>,
    stream: &Arc<CudaStream>,
    s: StreamId,
    f: &CudaFunction,
    x: u64,
    y: u64,
) -> CapturedGraph<AsyncCudaResource> {
    let ((), graph) = res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let raw = capture.raw_stream();
            let t1 = res.try_allocate(N * 4, s, T)?;
            let t2 = res.try_allocate(N * 4, s, T)?;
            // SAFETY: a stream of the resource's pool; t1 and t2 were
            // allocated in this capture and are freed after these calls.
            unsafe { res.gpu().memset_async(t1.ptr(), 0, N * 4, raw) }?;
            saxpy(stream, f, x, t1.ptr());
            // SAFETY: as above.
            unsafe { res.gpu().copy_async(t2.ptr(), t1.ptr(), N * 4, raw) }?;
            saxpy(stream, f, t2.ptr(), y);
            drop(res.deallocate(t1)?);
            drop(res.deallocate(t2)?);
            Ok::<_, ResourceError>(())
        })
        .expect("the capture stays valid");
    graph
}

fn main() {
    if !streamalloc::gpu::cuda::cuda_present() {
        eprintln!("graph_replay needs a CUDA GPU (libcuda not found)");
        std::process::exit(2);
    }
    let device: Device<CudaGpu> = Device::open_cuda(0, 1).expect("CUDA device 0");
    let res = AsyncResource::on(&device).expect("async resource");
    let s = device.stream(0).unwrap();
    let ours = device.streams().cuda_stream(s).unwrap().clone();
    let ctx = ours.context().clone();
    // cudarc's per-slice events would be recorded into its capture: off, as
    // cudarc's own graph tests do.
    // SAFETY: only cudarc's slices below rely on the tracking, and each is
    // used on its one stream.
    unsafe { ctx.disable_event_tracking() };
    let theirs = ctx.new_stream().unwrap();
    let f = ctx
        .load_module(Ptx::from_src(PTX))
        .unwrap()
        .load_function("saxpy")
        .unwrap();

    // Persistent inputs and outputs, allocated before the captures.
    let x_c = theirs.alloc_zeros::<f32>(N).unwrap();
    let mut y_c = theirs.alloc_zeros::<f32>(N).unwrap();
    let x_s = res.try_allocate(N * 4, s, T).unwrap();
    let y_s = res.try_allocate(N * 4, s, T).unwrap();
    // SAFETY: a stream of the pool, blocks just allocated on it.
    unsafe {
        res.gpu()
            .memset_async(x_s.ptr(), 0, N * 4, device.raw(s).unwrap())
            .unwrap();
        res.gpu()
            .memset_async(y_s.ptr(), 0, N * 4, device.raw(s).unwrap())
            .unwrap();
    }
    let base = cudarc_graph(&theirs, &f, &x_c, &mut y_c);
    let cand = streamalloc_graph(&res, &ours, s, &f, x_s.ptr(), y_s.ptr());
    // Warm both (first launches upload the graphs and map their memory).
    for _ in 0..10 {
        base.launch().unwrap();
        // SAFETY: x_s and y_s live until after the last replay.
        drop(unsafe { cand.launch(s) }.unwrap());
    }
    theirs.synchronize().unwrap();
    ours.synchronize().unwrap();

    println!(
        "graph replay, {N} floats per buffer, {BATCH} replays per round, {ROUNDS} rounds (median ratio)"
    );
    row(
        "launch",
        ratio(
            || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    base.launch().unwrap();
                }
                theirs.synchronize().unwrap();
                t.elapsed()
            },
            || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    // SAFETY: as above.
                    drop(unsafe { cand.launch(s) }.unwrap());
                }
                ours.synchronize().unwrap();
                t.elapsed()
            },
        ),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    row(
        "awaited",
        ratio(
            || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    base.launch().unwrap();
                    theirs.synchronize().unwrap();
                }
                t.elapsed()
            },
            || {
                let t = Instant::now();
                rt.block_on(async {
                    for _ in 0..BATCH {
                        // SAFETY: as above.
                        unsafe { cand.launch(s) }.unwrap().await.unwrap();
                    }
                });
                t.elapsed()
            },
        ),
    );
    drop(cand);
    drop(base);
    rt.block_on(async {
        drop(res.deallocate(x_s).unwrap());
        drop(res.deallocate(y_s).unwrap());
        res.reap_pending().await.unwrap();
    });
    assert_eq!(res.bytes_outstanding(), 0, "accounting back at 0 B");
}
