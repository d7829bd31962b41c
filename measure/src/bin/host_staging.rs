//! What staging a request's input and output through pinned host memory
//! costs (issue 35, item 2): µs per copy, host → device and back, of 1 MiB
//! and 16 MiB, three ways in the same run on the same stream:
//!
//! - **pool**: a `HostBuffer` from a warm `HostPool`, one future per copy
//!   awaited (the crate's path);
//! - **pin per request**: `cuMemHostAlloc`, the two async copies each
//!   followed by a stream synchronize, `cuMemFreeHost` (what a user of
//!   cudarc without a pool does);
//! - **pageable**: a `Vec` per request and the synchronous
//!   `cuMemcpyHtoD`/`cuMemcpyDtoH` (the driver stages it through its own
//!   pinned buffers).
//!
//! Rounds interleave the three ways (the order rotates); each row reports
//! the median over rounds of µs per copy and its ratio to the pool's.
//! Needs CUDA; `--sim` runs the pool and per-request pinning on the
//! simulated device as a smoke test (its times mean nothing).
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin host_staging [-- --sim]
//! ```

use std::time::Instant;

use streamalloc::AsyncResource;
use streamalloc::gpu::Gpu;
use streamalloc::{AllocTag, Buffer, Device, DeviceMemoryResource, StreamId};
use streamalloc::{HostPool, HostPoolConfig};

const ROUNDS: usize = 9;
const TAG: AllocTag = AllocTag("staging");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Pool,
    PinPerRequest,
    Pageable,
}

struct Setup<R> {
    device: Device,
    res: AsyncResource<R>,
    pool: HostPool,
    s: StreamId,
}

/// `requests` round trips of `bytes` through the pool; seconds.
async fn pool_way<R: DeviceMemoryResource + 'static>(
    st: &Setup<R>,
    dev: &mut Buffer<u8>,
    bytes: usize,
    requests: usize,
) -> f64 {
    let t = Instant::now();
    for _ in 0..requests {
        let mut h = st.pool.allocate::<u8>(bytes, TAG).expect("pool");
        st.res
            .copy_to_device(&h, dev, st.s)
            .expect("copy in")
            .await
            .expect("copy in done");
        st.res
            .copy_to_host(dev, &mut h, st.s)
            .expect("copy out")
            .await
            .expect("copy out done");
    }
    t.elapsed().as_secs_f64()
}

/// `requests` round trips pinning and unpinning per request; seconds.
fn pin_way<R>(st: &Setup<R>, dev: &Buffer<u8>, bytes: usize, requests: usize) -> f64 {
    let gpu = st.device.gpu();
    let raw = st.device.streams().raw(st.s).expect("stream");
    let t = Instant::now();
    for _ in 0..requests {
        let mem = gpu.host_alloc(bytes, None).expect("pin");
        // SAFETY: `raw` is a stream of the device's pool, alive while
        // `st.device` is; `dev` is a live buffer of `bytes` bytes on it,
        // ordered on that very stream (no other stream uses it); `mem` was
        // just pinned by this backend, and each copy is synchronized before
        // the next step and before the free, so the memory is idle when
        // freed and never touched by the host meanwhile.
        unsafe {
            gpu.copy_to_device_async(dev.block().ptr(), mem.addr, bytes, raw)
                .expect("copy in");
            gpu.stream_synchronize(raw).expect("sync");
            gpu.copy_to_host_async(mem.addr, dev.block().ptr(), bytes, raw)
                .expect("copy out");
            gpu.stream_synchronize(raw).expect("sync");
            gpu.host_free(mem).expect("unpin");
        }
    }
    t.elapsed().as_secs_f64()
}

/// `requests` round trips through pageable memory; seconds (CUDA only).
fn pageable_way<R>(st: &Setup<R>, dev: &Buffer<u8>, bytes: usize, requests: usize) -> Option<f64> {
    let cuda = st.device.gpu().cuda()?;
    cuda.context().bind_to_thread().expect("bind");
    let raw = st.device.streams().raw(st.s).expect("stream");
    // SAFETY: the stream is alive (the device's pool), and idle after the
    // synchronize: the synchronous copies below do not overlap its work.
    unsafe { st.device.gpu().stream_synchronize(raw) }.expect("sync");
    let t = Instant::now();
    for _ in 0..requests {
        let mut v = vec![0u8; bytes];
        // SAFETY: `dev` is a live device buffer of `bytes` bytes whose work
        // is done (synchronized above; these copies are synchronous), and
        // `v` is `bytes` bytes of host memory the calls may read and write.
        unsafe {
            cudarc::driver::sys::cuMemcpyHtoD_v2(dev.block().ptr(), v.as_ptr().cast(), bytes)
                .result()
                .expect("copy in");
            cudarc::driver::sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), dev.block().ptr(), bytes)
                .result()
                .expect("copy out");
        }
        std::hint::black_box(&v);
    }
    Some(t.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let sim = std::env::args().any(|a| a == "--sim");
    if sim {
        // SAFETY: set before any thread reads the environment.
        unsafe { std::env::set_var(streamalloc::DEVICE_ENV, "sim") };
    }
    let device = Device::open(0, 1);
    if device.simulator().is_some() && !sim {
        eprintln!("no CUDA device: pass --sim for a smoke run on the simulated device");
        std::process::exit(2);
    }
    println!("device: {device}");
    let res = AsyncResource::on(&device).expect("resource");
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0).expect("stream");
    let st = Setup {
        device: device.clone(),
        res,
        pool,
        s,
    };
    println!(
        "{:<8} {:<16} {:>12} {:>10}",
        "size", "way", "µs per copy", "vs pool"
    );
    for (bytes, requests) in [(1usize << 20, 64usize), (16 << 20, 16)] {
        let mut dev = st
            .res
            .allocate_buffer::<u8>(bytes, s, TAG)
            .await
            .expect("device buffer");
        // Warm: the pool pins its block, the driver loads what it loads.
        pool_way(&st, &mut dev, bytes, 2).await;
        pin_way(&st, &dev, bytes, 1);
        let _ = pageable_way(&st, &dev, bytes, 1);
        let ways = [Way::Pool, Way::PinPerRequest, Way::Pageable];
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
        for round in 0..ROUNDS {
            for k in 0..ways.len() {
                let i = (k + round) % ways.len();
                let secs = match ways[i] {
                    Way::Pool => Some(pool_way(&st, &mut dev, bytes, requests).await),
                    Way::PinPerRequest => Some(pin_way(&st, &dev, bytes, requests)),
                    Way::Pageable => pageable_way(&st, &dev, bytes, requests),
                };
                // Two copies per request.
                if let Some(secs) = secs {
                    times[i].push(secs * 1e6 / (2 * requests) as f64);
                }
            }
        }
        let pool_us = median(times[0].clone());
        for (way, t) in ways.iter().zip(times) {
            if t.is_empty() {
                println!(
                    "{:<8} {:<16} {:>12} {:>10}",
                    mib(bytes),
                    name(*way),
                    "-",
                    "-"
                );
                continue;
            }
            let us = median(t);
            println!(
                "{:<8} {:<16} {:>12.1} {:>9.2}x",
                mib(bytes),
                name(*way),
                us,
                us / pool_us
            );
        }
    }
    let stats = st.pool.stats();
    println!(
        "pool: {} pins, {} reuses, {} MiB pinned at most",
        stats.pins,
        stats.reuses,
        stats.peak_held_bytes >> 20
    );
}

fn mib(bytes: usize) -> String {
    format!("{} MiB", bytes >> 20)
}

fn name(way: Way) -> &'static str {
    match way {
        Way::Pool => "pool",
        Way::PinPerRequest => "pin per request",
        Way::Pageable => "pageable",
    }
}
