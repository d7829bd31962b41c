//! Stress: 16 threads of mixed work on one resource over a threaded
//! simulated device with the race detector on, for a bounded time; the
//! invariants and the detector are checked at the end.
//!
//! The runs last 2 s (and 1 s on a slow device) in CI. For a soak, set
//! `STREAMALLOC_SOAK_SECS` (each test runs that long):
//!
//! ```text
//! STREAMALLOC_SOAK_SECS=600 cargo test --release --test stress -- --nocapture
//! ```

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{Access, AllocTag, DeviceBlock, DeviceMemoryResource};
use support::assert_quiescent_invariants;

const THREADS: usize = 16;
const STREAMS: usize = 8;
const CAPACITY: usize = 4 << 30;
/// Iterations every thread runs whatever the clock says, so that a stalled
/// machine still exercises something (and the count below is not a timing
/// assertion).
const MIN_ITERATIONS: u64 = 50;

fn duration(default_secs: u64) -> Duration {
    let secs = std::env::var("STREAMALLOC_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(default_secs);
    Duration::from_secs(secs)
}

#[test]
fn sixteen_threads_of_mixed_work() {
    stress(SimGpu::builder().capacity(CAPACITY).seed(7).build(), 2);
}

/// The same on a device whose kernels take 20 µs each: queues grow, frees
/// stay pending longer, and cross-stream reuse meets work still running.
#[test]
fn sixteen_threads_on_a_slow_device() {
    let gpu = SimGpu::builder()
        .capacity(CAPACITY)
        .seed(11)
        .op_latency(Duration::from_micros(20))
        .build();
    stress(gpu, 1);
}

fn stress(gpu: std::sync::Arc<SimGpu>, default_secs: u64) {
    let f = support::sim_with(gpu.clone(), STREAMS);
    let (r, pool) = (&f.resource, &f.pool);
    let deadline = Instant::now() + duration(default_secs);
    let ops = AtomicU64::new(0);
    let handoffs = AtomicU64::new(0);
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<DeviceBlock>()).unzip();

    let leftovers: Vec<Vec<DeviceBlock>> = std::thread::scope(|scope| {
        let handles: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(t, inbox)| {
                let next = senders[(t + 1) % THREADS].clone();
                let (gpu, ops, handoffs) = (&gpu, &ops, &handoffs);
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(t as u64);
                    let sid = |s: usize| pool.id(s).unwrap();
                    let raw = |s: usize| pool.raw(sid(s)).unwrap();
                    let mut mine: Vec<DeviceBlock> = Vec::new();
                    let mut iterations = 0;
                    while iterations < MIN_ITERATIONS || Instant::now() < deadline {
                        iterations += 1;
                        ops.fetch_add(1, Ordering::Relaxed);
                        match rng.u8(..10) {
                            // Allocate on some stream and write it there.
                            0..=2 if mine.len() < 8 => {
                                let s = rng.usize(..STREAMS);
                                let size = rng.usize(0..=1 << 20);
                                let block = r.allocate(size, sid(s), AllocTag("stress")).unwrap();
                                if size > 0 {
                                    gpu.launch_kernel(raw(s), &[MemAccess::write(&block)])
                                        .unwrap();
                                    r.finish_block_use(block.id(), sid(s), Access::Write)
                                        .unwrap();
                                }
                                mine.push(block);
                            }
                            // A hooked use on any stream.
                            3..=5 if !mine.is_empty() => {
                                let block = &mine[rng.usize(..mine.len())];
                                let s = rng.usize(..STREAMS);
                                let access = if rng.bool() {
                                    Access::Write
                                } else {
                                    Access::Read
                                };
                                r.prepare_block_use(block.id(), sid(s), access).unwrap();
                                if block.size() > 0 {
                                    let touch = match access {
                                        Access::Write => MemAccess::write(block),
                                        Access::Read => MemAccess::read(block),
                                    };
                                    gpu.launch_kernel(raw(s), &[touch]).unwrap();
                                }
                                r.finish_block_use(block.id(), sid(s), access).unwrap();
                            }
                            // Free here, or hand over to the next thread.
                            6 | 7 if !mine.is_empty() => {
                                let block = mine.swap_remove(rng.usize(..mine.len()));
                                if rng.bool() {
                                    handoffs.fetch_add(1, Ordering::Relaxed);
                                    next.send(block).unwrap();
                                } else {
                                    r.deallocate(block).unwrap();
                                }
                            }
                            // Reap: all streams, or one stream by sequence.
                            8 => r.reap_pending().unwrap(),
                            9 => {
                                let s = rng.usize(..STREAMS);
                                let seq = r.pending_free_seq(sid(s));
                                gpu.stream_synchronize(raw(s)).unwrap();
                                r.reap_through(sid(s), seq);
                            }
                            _ => {}
                        }
                        // Blocks handed over by the previous thread: read on
                        // one of our streams, then free.
                        while let Ok(block) = inbox.try_recv() {
                            let s = rng.usize(..STREAMS);
                            r.prepare_block_use(block.id(), sid(s), Access::Read)
                                .unwrap();
                            if block.size() > 0 {
                                gpu.launch_kernel(raw(s), &[MemAccess::read(&block)])
                                    .unwrap();
                            }
                            r.finish_block_use(block.id(), sid(s), Access::Read)
                                .unwrap();
                            r.deallocate(block).unwrap();
                        }
                        assert!(r.bytes_outstanding() >= mine.iter().map(|b| b.size()).sum());
                    }
                    (mine, inbox)
                })
            })
            .collect();
        drop(senders);
        handles
            .into_iter()
            .map(|h| {
                let (mut mine, inbox) = h.join().expect("a stress thread panicked");
                mine.extend(inbox.try_iter());
                mine
            })
            .collect()
    });

    for block in leftovers.into_iter().flatten() {
        r.deallocate(block).unwrap();
    }
    r.reap_pending().unwrap();
    gpu.run_until_idle();
    assert_quiescent_invariants(r);
    assert_eq!(r.live_blocks(), 0);
    assert_eq!(r.bytes_outstanding(), 0);
    assert_eq!(gpu.free_bytes(), CAPACITY, "the device lost memory");
    let races = gpu.races();
    assert!(
        races.is_empty(),
        "{} races: {:#?}",
        races.len(),
        &races[..races.len().min(5)]
    );
    let ops = ops.load(Ordering::Relaxed);
    assert!(
        ops >= THREADS as u64 * MIN_ITERATIONS,
        "only {ops} operations ran"
    );
    eprintln!(
        "stress: {ops} operations, {} hand-overs, {} events pooled",
        handoffs.load(Ordering::Relaxed),
        r.pooled_events()
    );
}
