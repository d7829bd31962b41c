//! The CPU cost of the driver primitives a completion future can be built
//! on, measured on one thread (CUDA only). Used to choose the design of the
//! futures layer; see BENCHMARKS.md.
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin driver_costs   # needs a CUDA GPU
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::{CudaContext, result, sys};

const N: usize = 20_000;
const BIG: usize = 8 << 20;
const OPS: usize = 400;

fn us(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !streamalloc::gpu::cuda::cuda_present() {
        println!("no CUDA driver: nothing to measure");
        return Ok(());
    }
    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    let stream = ctx.new_stream()?;
    let s = stream.cu_stream();
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    // SAFETY (every block below): the stream, event and allocations are
    // this context's and outlive the calls; the host slot is pinned and
    // mapped, written only by the GPU and read with atomic loads.
    let big = unsafe { result::malloc_async(s, BIG)? };
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    let rc = unsafe { sys::cuMemHostAlloc(&mut host, 64, sys::CU_MEMHOSTALLOC_DEVICEMAP) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "cuMemHostAlloc");
    let mut dptr: sys::CUdeviceptr = 0;
    let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "cuMemHostGetDevicePointer");
    // SAFETY: 64 pinned bytes, 8-aligned.
    let slot = unsafe { &*(host as *const AtomicU64) };
    let write = |v: u64| unsafe {
        let rc = sys::cuStreamWriteValue64_v2(s, dptr, v, 0);
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "cuStreamWriteValue64");
    };
    let sync = || unsafe { result::stream::synchronize(s) }.unwrap();
    let memset = |n: usize| unsafe { result::memset_d8_async(big, 1, n, s) }.unwrap();

    sync();
    let t = Instant::now();
    for _ in 0..N {
        unsafe { result::event::record(ev, s)? };
    }
    let record = us(t, N);
    sync();
    let t = Instant::now();
    for i in 0..N {
        write(i as u64 + 1);
    }
    let wv = us(t, N);
    sync();
    let t = Instant::now();
    for _ in 0..N {
        let _ = unsafe { result::event::query(ev) };
    }
    let query = us(t, N);
    // What `completion_lazy()` (and cuda-async's first poll) asks instead.
    let t = Instant::now();
    for _ in 0..N {
        let rc = unsafe { sys::cuStreamQuery(s) };
        assert_eq!(
            rc,
            sys::CUresult::CUDA_SUCCESS,
            "cuStreamQuery, idle stream"
        );
    }
    let stream_query = us(t, N);
    let t = Instant::now();
    for _ in 0..N {
        ctx.bind_to_thread()?;
    }
    let bind = us(t, N);
    // What a capture-aware layer pays to ask whether a stream is capturing.
    let t = Instant::now();
    for _ in 0..N {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        let (g, n, e, c) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let rc = unsafe { sys::cuStreamGetCaptureInfo_v3(s, &mut status, &mut id, g, n, e, c) };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "cuStreamGetCaptureInfo");
    }
    let capture = us(t, N);

    let mut rows = Vec::new();
    for (name, mode) in [("plain", 0), ("+ event record", 1), ("+ write value", 2)] {
        sync();
        let t = Instant::now();
        for i in 0..OPS {
            memset(BIG);
            match mode {
                1 => unsafe { result::event::record(ev, s)? },
                2 => write(1_000_000 + i as u64),
                _ => {}
            }
        }
        let submit = us(t, OPS);
        sync();
        rows.push((name, submit, us(t, OPS)));
    }

    // Wake latency of a 4-byte memset: event polling vs the host slot.
    let mut lat_ev = Vec::with_capacity(N);
    let mut lat_sq = Vec::with_capacity(N);
    let mut lat_wv = Vec::with_capacity(N);
    for i in 0..N {
        let t = Instant::now();
        memset(4);
        while unsafe { sys::cuStreamQuery(s) } != sys::CUresult::CUDA_SUCCESS {}
        lat_sq.push(t.elapsed());
        let t = Instant::now();
        memset(4);
        unsafe { result::event::record(ev, s)? };
        while unsafe { result::event::query(ev) }.is_err() {}
        lat_ev.push(t.elapsed());
        let v = 2_000_000 + i as u64;
        let t = Instant::now();
        memset(4);
        write(v);
        while slot.load(Ordering::Acquire) < v {
            std::hint::spin_loop();
        }
        lat_wv.push(t.elapsed());
    }
    let pct = |mut v: Vec<std::time::Duration>| {
        v.sort();
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
        (at(0.5), at(0.99))
    };
    let (e50, e99) = pct(lat_ev);
    let (s50, s99) = pct(lat_sq);
    let (w50, w99) = pct(lat_wv);

    println!("| primitive | µs per call |");
    println!("| --- | --- |");
    println!("| cuEventRecord, idle stream | {record:.3} |");
    println!("| cuStreamWriteValue64 to pinned host memory, idle stream | {wv:.3} |");
    println!("| cuEventQuery, complete event | {query:.3} |");
    println!("| cuStreamQuery, idle stream | {stream_query:.3} |");
    println!("| CudaContext::bind_to_thread (already bound) | {bind:.3} |");
    println!("| cuStreamGetCaptureInfo, stream not capturing | {capture:.3} |");
    println!();
    println!("| 8 MiB memset loop | submit only | in all |");
    println!("| --- | --- | --- |");
    for (name, submit, all) in rows {
        println!("| {name} | {submit:.2} | {all:.2} |");
    }
    println!();
    println!("| 4-byte memset, spin until seen | p50 | p99 |");
    println!("| --- | --- | --- |");
    println!("| event record + cuEventQuery loop | {e50:.2} | {e99:.2} |");
    println!("| cuStreamQuery loop | {s50:.2} | {s99:.2} |");
    println!("| write value + host memory load loop | {w50:.2} | {w99:.2} |");
    Ok(())
}
