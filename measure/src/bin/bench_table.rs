//! Prints the whole allocation comparison as one table, with its own timing
//! loop (the median of several runs), and writes it as CSV.
//!
//! Peers, per backend (the simulated device always; CUDA device 0 when it
//! opens): the raw driver pair (`cuMemAllocAsync` + `cuMemFreeAsync`, or the
//! simulated pair), cudarc's own `CudaSlice` (CUDA only), the stream-ordered
//! resource, and the caching tier; the cross-stream pattern against the raw
//! driver sequences; and pairs per second from 1 to 16 threads, each on its
//! own stream. Ratios are against the raw driver measured in the same run.
//!
//! `--null-only` measures the null backend alone (the bookkeeping, in
//! seconds rather than minutes), for before/after comparisons of the
//! resource's hot path. `--observe-only` measures, on the simulated
//! device, what observing costs: the futures layer's pair with the memory history
//! off, on and on with backtraces, and a snapshot of a stack holding
//! 1,000 and 10,000 live blocks, alone and beside 4 threads that allocate.
//! `--decorators [ROUNDS [PAIRS]]` measures what Budget + Stats + Tracing
//! add to a pair of the resource and of the cache on the null backend, the
//! loops interleaved round after round, by best and by median (the module
//! `decorator_cost` of the measurement crate says why; BENCHMARKS.md, "What
//! the decorators add", cites it).
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin bench_table -- [OUT_DIR]
//! cargo run --release -p streamalloc-measure --bin bench_table -- --null-only [OUT_DIR]
//! cargo run --release -p streamalloc-measure --bin bench_table -- --observe-only [OUT_DIR]
//! cargo run --release -p streamalloc-measure --bin bench_table -- --decorators [ROUNDS [PAIRS]]
//! cargo run --release -p streamalloc-measure --bin bench_table -- --profile-pair N
//! cargo run --release -p streamalloc-measure --bin bench_table -- --profile-stack N
//! cargo run --release -p streamalloc-measure --bin bench_table -- --profile-cache N SIZE [classes]
//! python3 scripts/plot_bench.py OUT_DIR/bench_table.csv OUT_DIR/throughput.png
//! ```

use streamalloc_measure::{decorator_cost, support};

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use streamalloc::gpu::Gpu;
use support::{Bench, SCALING_SIZE, SIZES, THREADS};

/// Runs per measurement; the median is reported.
const RUNS: usize = 7;
/// Wall time one run aims at.
const RUN_TARGET: Duration = Duration::from_millis(40);

/// One line of the table.
struct Row {
    backend: &'static str,
    kind: &'static str,
    peer: String,
    size: String,
    threads: usize,
    ns_per_pair: f64,
    baseline_ns: f64,
}

impl Row {
    /// Millions of pairs per second, all threads together.
    fn mpairs(&self) -> f64 {
        1e3 / self.ns_per_pair
    }
    /// This row's time over the raw driver's, same run (< 1: faster).
    fn ratio(&self) -> f64 {
        self.ns_per_pair / self.baseline_ns
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Nanoseconds per call of `f`: calibrated so that a run takes about
/// `RUN_TARGET`, median of `RUNS` runs.
fn time(mut f: impl FnMut()) -> f64 {
    let mut iters = 1_000u64;
    loop {
        let t0 = Instant::now();
        for _ in 0..iters {
            f();
        }
        let dt = t0.elapsed();
        if dt >= RUN_TARGET / 4 || iters >= 1 << 26 {
            let per = dt.as_secs_f64() / iters as f64;
            iters = ((RUN_TARGET.as_secs_f64() / per) as u64).max(100);
            break;
        }
        iters *= 4;
    }
    median(
        (0..RUNS)
            .map(|_| {
                let t0 = Instant::now();
                for _ in 0..iters {
                    f();
                }
                t0.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect(),
    )
}

/// Nanoseconds of wall time per pair summed over all threads (so pairs per
/// second in all is `threads / ns * 1e9`), median of `RUNS` runs.
fn time_threads(threads: usize, f: impl Fn(usize) + Send + Sync) -> f64 {
    let mut iters = 1_000u64;
    loop {
        let dt = support::run_threads(threads, iters, &f);
        if dt >= RUN_TARGET / 4 || iters >= 1 << 24 {
            let per = dt.as_secs_f64() / iters as f64;
            iters = ((RUN_TARGET.as_secs_f64() / per) as u64).max(100);
            break;
        }
        iters *= 4;
    }
    median(
        (0..RUNS)
            .map(|_| support::run_threads(threads, iters, &f).as_nanos() as f64 / iters as f64)
            .collect(),
    )
}

fn measure<G: Gpu>(b: &Bench<G>, cudarc: bool, rows: &mut Vec<Row>) {
    measure_pairs(b, cudarc, rows);
    measure_cross(b, rows);
    measure_threads(b, rows);
}

fn measure_pairs<G: Gpu>(b: &Bench<G>, cudarc: bool, rows: &mut Vec<Row>) {
    let (backend, s0, r0) = (b.name, b.stream(0), b.raw(0));
    for (bytes, label) in SIZES {
        let raw = time(|| b.raw_pair(r0, black_box(bytes)));
        b.sync();
        let mut peers = vec![("raw driver pair".to_string(), raw)];
        if cudarc {
            let stream = b.pool.cuda_stream(s0).unwrap().clone();
            peers.push((
                "cudarc CudaSlice".into(),
                time(|| support::cudarc_pair(&stream, black_box(bytes))),
            ));
            b.sync();
        }
        peers.push((
            "StreamOrderedResource".into(),
            time(|| Bench::<G>::pair(&*b.resource, s0, black_box(bytes))),
        ));
        b.sync();
        peers.push((
            "CachingResource".into(),
            time(|| Bench::<G>::pair(&*b.cache, s0, black_box(bytes))),
        ));
        b.sync();
        // The same cache without its two capture queries per pair (issue
        // 19): their cost is the ratio of the row above to this one.
        let unaware = streamalloc::CachingResource::with_config(
            b.resource.clone(),
            streamalloc::CacheConfig::default().capture_aware(false),
        );
        peers.push((
            "Cache, no capture query".into(),
            time(|| Bench::<G>::pair(&unaware, s0, black_box(bytes))),
        ));
        drop(unaware);
        b.sync();
        // The adaptor stack a service would run, over the same resource (no
        // tracing subscriber installed): compare with StreamOrderedResource.
        let stack = streamalloc::ResourceBuilder::new()
            .budget(&streamalloc::Budget::new(1 << 60))
            .stats()
            .tracing()
            .build(b.resource.clone());
        peers.push((
            "Budget+Stats+Tracing".into(),
            time(|| Bench::<G>::pair(&stack, s0, black_box(bytes))),
        ));
        drop(stack);
        b.sync();
        for (peer, ns) in peers {
            rows.push(Row {
                backend,
                kind: "pair",
                peer,
                size: label.into(),
                threads: 1,
                ns_per_pair: ns,
                baseline_ns: raw,
            });
        }
    }
}

fn measure_cross<G: Gpu>(b: &Bench<G>, rows: &mut Vec<Row>) {
    let backend = b.name;
    let (s0, s1, r0, r1) = (b.stream(0), b.stream(1), b.raw(0), b.raw(1));
    let n = SCALING_SIZE;
    let raw_full = time(|| b.cross_raw(r0, r1, n));
    b.sync();
    let raw_min = time(|| b.cross_raw_minimal(r0, r1, n));
    b.sync();
    let resource = time(|| Bench::<G>::cross(&*b.resource, s0, s1, n));
    b.sync();
    let cache = time(|| Bench::<G>::cross(&*b.cache, s0, s1, n));
    b.sync();
    for (peer, ns) in [
        ("raw sequence (6 calls)", raw_full),
        ("raw minimal (4 calls)", raw_min),
        ("StreamOrderedResource", resource),
        ("CachingResource", cache),
    ] {
        rows.push(Row {
            backend,
            kind: "cross-stream",
            peer: peer.into(),
            size: "64 KiB".into(),
            threads: 1,
            ns_per_pair: ns,
            baseline_ns: raw_full,
        });
    }
}

fn measure_threads<G: Gpu>(b: &Bench<G>, rows: &mut Vec<Row>) {
    let (backend, n) = (b.name, SCALING_SIZE);
    for threads in THREADS {
        let raw = time_threads(threads, |t| b.raw_pair(b.raw(t), n));
        b.sync();
        let resource = time_threads(threads, |t| Bench::<G>::pair(&*b.resource, b.stream(t), n));
        b.sync();
        let cache = time_threads(threads, |t| Bench::<G>::pair(&*b.cache, b.stream(t), n));
        b.sync();
        for (peer, ns) in [
            ("raw driver pair", raw),
            ("StreamOrderedResource", resource),
            ("CachingResource", cache),
        ] {
            rows.push(Row {
                backend,
                kind: "threads",
                peer: peer.into(),
                size: "64 KiB".into(),
                threads,
                // Wall time per pair of one thread: divide by the threads to
                // get the time per pair of the whole machine.
                ns_per_pair: ns / threads as f64,
                baseline_ns: raw / threads as f64,
            });
        }
    }
}

/// What observing costs, on `b`: the pair through the futures layer over
/// the cache (where the history records) with the history off, on, and on
/// with backtraces; a snapshot of the stack with many live blocks, alone
/// and while threads allocate.
fn measure_observe<G: Gpu>(b: &Bench<G>, rows: &mut Vec<Row>) {
    use streamalloc::record_memory_history;
    use streamalloc::{AsyncResource, CacheConfig, Device, ResourceBuilder};

    let backend = b.name;
    let device = Device::new(b.gpu.clone(), b.pool.clone()).expect("the pool is the gpu's");
    let layers = ResourceBuilder::new().cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).expect("a futures layer on the bench");
    let s0 = b.stream(0);
    let bytes = SCALING_SIZE;
    let pair = || {
        let block = res
            .try_allocate(black_box(bytes), s0, streamalloc::AllocTag("bench"))
            .unwrap();
        drop(res.deallocate(block).unwrap());
    };
    record_memory_history(0, false);
    let off = time(pair);
    record_memory_history(1 << 16, false);
    let on = time(pair);
    record_memory_history(1 << 16, true);
    let traced = time(pair);
    record_memory_history(0, false);
    for (peer, ns) in [
        ("history off", off),
        ("history on", on),
        ("history on, backtraces", traced),
    ] {
        rows.push(Row {
            backend,
            kind: "futures pair",
            peer: peer.into(),
            size: "64 KiB".into(),
            threads: 1,
            ns_per_pair: ns,
            baseline_ns: off,
        });
    }
    // Snapshots of a stack holding `live` blocks over 8 streams.
    for live in [1_000, 10_000] {
        let blocks: Vec<_> = (0..live)
            .map(|i| {
                res.try_allocate(4096, b.stream(i % 8), streamalloc::AllocTag("held"))
                    .unwrap()
            })
            .collect();
        let alone = time(|| {
            black_box(res.snapshot());
        });
        rows.push(Row {
            backend,
            kind: "snapshot",
            peer: format!("{live} live blocks"),
            size: "-".into(),
            threads: 1,
            ns_per_pair: alone,
            baseline_ns: alone,
        });
        for block in blocks {
            drop(res.deallocate(block).unwrap());
        }
    }
    // Pairs of 4 threads on their own streams, with and without a fifth
    // thread taking snapshots back to back (of a stack holding 1,000 live
    // blocks): what a snapshot taken under load costs the others.
    let held: Vec<_> = (0..1_000)
        .map(|i| {
            res.try_allocate(4096, b.stream(8 + i % 4), streamalloc::AllocTag("held"))
                .unwrap()
        })
        .collect();
    let threaded = |i: usize| {
        let s = b.stream(i);
        let block = res
            .try_allocate(black_box(bytes), s, streamalloc::AllocTag("bench"))
            .unwrap();
        drop(res.deallocate(block).unwrap());
    };
    let quiet = time_threads(4, threaded);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (loaded, snapshots) = std::thread::scope(|scope| {
        let taker = scope.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                black_box(res.snapshot());
                n += 1;
            }
            n
        });
        let loaded = time_threads(4, threaded);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (loaded, taker.join().unwrap())
    });
    eprintln!("  {snapshots} snapshots taken during the loaded runs");
    for (peer, ns) in [("no snapshots", quiet), ("snapshots back to back", loaded)] {
        rows.push(Row {
            backend,
            kind: "futures pair",
            peer: peer.into(),
            size: "64 KiB".into(),
            threads: 4,
            ns_per_pair: ns,
            baseline_ns: quiet,
        });
    }
    for block in held {
        drop(res.deallocate(block).unwrap());
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<7} {:<13} {:<24} {:>7} {:>7} {:>11} {:>11} {:>10}",
        "backend", "kind", "peer", "size", "threads", "ns/pair", "M pairs/s", "x raw time"
    );
    let _ = writeln!(out, "{}", "-".repeat(98));
    for r in rows {
        let _ = writeln!(
            out,
            "{:<7} {:<13} {:<24} {:>7} {:>7} {:>11.1} {:>11.3} {:>10}",
            r.backend,
            r.kind,
            r.peer,
            r.size,
            r.threads,
            r.ns_per_pair,
            r.mpairs(),
            // The null backend's raw calls cost next to nothing: a ratio to
            // them says nothing, its ns/pair is the bookkeeping itself.
            if r.backend == "null" && r.kind != "futures pair" {
                "-".to_string()
            } else {
                format!("{:.3}", r.ratio())
            }
        );
    }
    out.push_str(
        "\nns/pair: wall time per pair for the whole machine (threads rows: divided by threads).\n\
         x raw time: this peer's time / the raw driver's, same run (0.2x = 5 times faster).\n\
         cross-stream rows are against the 6-call raw sequence.\n\
         null backend: driver calls that do nothing, so ns/pair is the bookkeeping alone.\n\
         futures pair rows: x is against the first row of their group (history off; no snapshots).\n\
         snapshot rows: ns per snapshot of the whole stack.\n",
    );
    out
}

fn csv(rows: &[Row]) -> String {
    let mut out =
        String::from("backend,kind,peer,size,threads,ns_per_pair,mpairs_per_s,ratio_vs_raw_time\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.2},{:.4},{:.4}",
            r.backend,
            r.kind,
            r.peer,
            r.size,
            r.threads,
            r.ns_per_pair,
            r.mpairs(),
            r.ratio()
        );
    }
    out
}

/// `bench_table --profile-pair N`: N allocate + free pairs of the resource on
/// the null backend and nothing else, for an instruction profile of the
/// bookkeeping (`valgrind --tool=callgrind`, see BENCHMARKS.md).
fn profile_pair(n: usize) {
    let null = support::null();
    let s0 = null.stream(0);
    for _ in 0..n {
        Bench::<support::NullGpu>::pair(&*null.resource, s0, black_box(64 << 10));
    }
}

/// `bench_table --profile-cache N SIZE`: N pairs of SIZE bytes through the
/// cache on the null backend (its virtual-memory arena), for an instruction
/// profile of the cache's hot path.
fn profile_cache(n: usize, size: usize, classes: bool) {
    let null = support::null();
    let s0 = null.stream(0);
    let config = streamalloc::CacheConfig::default().virtual_memory(!classes);
    let cache = streamalloc::CachingResource::with_config(null.resource.clone(), config);
    for _ in 0..n {
        Bench::<support::NullGpu>::pair(&cache, s0, black_box(size));
    }
}

/// `bench_table --profile-stack N`: as `--profile-pair`, through the
/// Budget + Stats + Tracing stack of the table (no subscriber), for a
/// profile of what the adaptors add over the resource.
fn profile_stack(n: usize) {
    let null = support::null();
    let s0 = null.stream(0);
    let stack = streamalloc::ResourceBuilder::new()
        .budget(&streamalloc::Budget::new(1 << 60))
        .stats()
        .tracing()
        .build(null.resource.clone());
    for _ in 0..n {
        Bench::<support::NullGpu>::pair(&stack, s0, black_box(64 << 10));
    }
}

/// `bench_table --profile-stack-cache N`: as `--profile-cache N 65536`,
/// with the Budget + Stats + Tracing stack over the cache, for a profile
/// of what the adaptors add over the cache's pair.
fn profile_stack_cache(n: usize) {
    let null = support::null();
    let s0 = null.stream(0);
    let stack = streamalloc::ResourceBuilder::new()
        .budget(&streamalloc::Budget::new(1 << 60))
        .stats()
        .tracing()
        .cache(streamalloc::CacheConfig::default())
        .build(null.resource.clone());
    for _ in 0..n {
        Bench::<support::NullGpu>::pair(&stack, s0, black_box(64 << 10));
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    let count = |n: Option<String>| n.and_then(|n| n.parse().ok()).unwrap_or(100_000);
    if first.as_deref() == Some("--profile-pair") {
        profile_pair(count(args.next()));
        return Ok(());
    }
    if first.as_deref() == Some("--profile-cache") {
        let n = count(args.next());
        let size = count(args.next());
        profile_cache(n, size, args.next().as_deref() == Some("classes"));
        return Ok(());
    }
    if first.as_deref() == Some("--profile-stack-cache") {
        profile_stack_cache(count(args.next()));
        return Ok(());
    }
    if first.as_deref() == Some("--profile-stack") {
        profile_stack(count(args.next()));
        return Ok(());
    }
    if first.as_deref() == Some("--decorators") {
        let rest: Vec<String> = args.collect();
        let plan = decorator_cost::Plan::parse(rest.iter().map(String::as_str))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let results = decorator_cost::measure(plan);
        print!("{}", decorator_cost::report(plan, "null backend", &results));
        return Ok(());
    }
    if first.as_deref() == Some("--decorators-cuda") {
        let rest: Vec<String> = args.collect();
        let mut plan = decorator_cost::Plan::parse(rest.iter().map(String::as_str))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        if rest.len() < 2 {
            plan.pairs = decorator_cost::DEFAULT_CUDA_PAIRS;
        }
        let Some(gpu) = support::cuda() else {
            eprintln!("--decorators-cuda: no CUDA device");
            std::process::exit(2);
        };
        let results = decorator_cost::measure_on(&gpu, plan);
        print!(
            "{}",
            decorator_cost::report(plan, "CUDA device 0", &results)
        );
        return Ok(());
    }
    if first.as_deref() == Some("--observe-only") {
        let out_dir = args.next().unwrap_or_else(|| "target/bench-table".into());
        let mut rows = Vec::new();
        // On the simulated device: the futures layer needs events and
        // notifier streams, which the null backend does not make.
        eprintln!("measuring what observing costs on the simulated device...");
        measure_observe(&support::sim(), &mut rows);
        let table = table(&rows);
        print!("{table}");
        std::fs::create_dir_all(&out_dir)?;
        std::fs::write(format!("{out_dir}/observe_table.txt"), &table)?;
        return Ok(());
    }
    let null_only = first.as_deref() == Some("--null-only");
    let first = if null_only { args.next() } else { first };
    let out_dir = first.unwrap_or_else(|| "target/bench-table".into());
    let mut rows = Vec::new();
    eprintln!("measuring the null backend (bookkeeping only)...");
    let null = support::null();
    measure_pairs(&null, false, &mut rows);
    measure_threads(&null, &mut rows);
    drop(null);
    if !null_only {
        eprintln!("measuring the simulated device...");
        let sim = support::sim();
        measure(&sim, false, &mut rows);
        measure_observe(&sim, &mut rows);
        drop(sim);
        match support::cuda() {
            Some(gpu) => {
                eprintln!("measuring CUDA device 0...");
                measure(&gpu, true, &mut rows);
            }
            None => eprintln!("no CUDA device: only the simulated device was measured"),
        }
    }
    let table = table(&rows);
    print!("{table}");
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(format!("{out_dir}/bench_table.txt"), &table)?;
    std::fs::write(format!("{out_dir}/bench_table.csv"), csv(&rows))?;
    eprintln!("wrote {out_dir}/bench_table.txt and {out_dir}/bench_table.csv");
    Ok(())
}
