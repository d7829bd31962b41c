//! Allocation cost: one allocate + free pair, per peer (the raw seam, the
//! stream-ordered resource, the caching tier) and size; the cross-stream
//! pattern; and throughput from 1 to 16 threads, each on its own stream.
//! On the simulated device and on the null backend (driver calls that do
//! nothing: what is left is the bookkeeping). Read ratios between peers of
//! one run, not absolute times.
//!
//! ```text
//! cargo bench --bench pairs
//! ```
//!
//! The same comparison on a GPU, with cudarc's own pair beside it, is the
//! measurement crate's `bench_table`.

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use streamalloc::gpu::Gpu;

use support::{Bench, SCALING_SIZE, SIZES, THREADS};

fn pairs<G: Gpu>(c: &mut Criterion, b: &Bench<G>) {
    let mut group = c.benchmark_group(format!("pair/{}", b.name));
    let (s, raw) = (b.stream(0), b.raw(0));
    for (bytes, label) in SIZES {
        group.bench_with_input(BenchmarkId::new("raw", label), &bytes, |bn, &n| {
            bn.iter(|| b.raw_pair(raw, black_box(n)))
        });
        group.bench_with_input(BenchmarkId::new("resource", label), &bytes, |bn, &n| {
            bn.iter(|| Bench::<G>::pair(&*b.resource, s, black_box(n)))
        });
        group.bench_with_input(BenchmarkId::new("cache", label), &bytes, |bn, &n| {
            bn.iter(|| Bench::<G>::pair(&*b.cache, s, black_box(n)))
        });
        b.sync();
    }
    group.finish();
}

fn cross<G: Gpu>(c: &mut Criterion, b: &Bench<G>) {
    let mut group = c.benchmark_group(format!("cross_stream/{}", b.name));
    let (sa, sb) = (b.stream(0), b.stream(1));
    let (ra, rb) = (b.raw(0), b.raw(1));
    let n = SCALING_SIZE;
    group.bench_function("raw_minimal", |bn| {
        bn.iter(|| b.cross_raw_minimal(ra, rb, n))
    });
    group.bench_function("raw_full", |bn| bn.iter(|| b.cross_raw(ra, rb, n)));
    group.bench_function("resource", |bn| {
        bn.iter(|| Bench::<G>::cross(&*b.resource, sa, sb, n))
    });
    group.bench_function("cache", |bn| {
        bn.iter(|| Bench::<G>::cross(&*b.cache, sa, sb, n))
    });
    b.sync();
    group.finish();
}

fn threads<G: Gpu>(c: &mut Criterion, b: &Bench<G>) {
    let mut group = c.benchmark_group(format!("threads/{}", b.name));
    let n = SCALING_SIZE;
    for threads in THREADS {
        // One iteration is one pair on every thread.
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(BenchmarkId::new("raw", threads), |bn| {
            bn.iter_custom(|iters| {
                support::run_threads(threads, iters, |t| b.raw_pair(b.raw(t), n))
            })
        });
        group.bench_function(BenchmarkId::new("resource", threads), |bn| {
            bn.iter_custom(|iters| {
                support::run_threads(threads, iters, |t| {
                    Bench::<G>::pair(&*b.resource, b.stream(t), n)
                })
            })
        });
        group.bench_function(BenchmarkId::new("cache", threads), |bn| {
            bn.iter_custom(|iters| {
                support::run_threads(threads, iters, |t| {
                    Bench::<G>::pair(&*b.cache, b.stream(t), n)
                })
            })
        });
        b.sync();
    }
    group.finish();
}

fn all(c: &mut Criterion) {
    let sim = support::sim();
    pairs(c, &sim);
    cross(c, &sim);
    threads(c, &sim);
    drop(sim);
    // No events on the null backend: the pairs and the threads, not the
    // cross-stream rows.
    let null = support::null();
    pairs(c, &null);
    threads(c, &null);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = all
}
criterion_main!(benches);
