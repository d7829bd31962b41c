//! Reservations against a tokio `Semaphore` under a budget, on the
//! simulated device: the two gated ways of `service_bench --budget-quarter`
//! (`streamalloc+reserve` and `streamalloc+semaphore`, the same service,
//! stack and budget) in one process, interleaved over `--rounds` rounds,
//! with what each request cost the library.
//!
//! Per level and way it prints the medians of the rounds (requests/s, p50,
//! p99), the ratio of the reservations' requests/s and p99 to the
//! semaphore's (same round, then the median), and per request: the
//! simulated driver calls by kind (the library's: launches and the model's
//! copies are left out), the tries the budget refused, and how many
//! requests waited in the futures layer's queue.
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin reserve_bench -- [--clients 64,1024] [--requests 2048] [--rounds 3] [--sim-latency-us 5] [--budget-over-cache]
//! ```
//!
//! The simulated kernels make this a measure of the futures layer, the
//! cache and the budget, not of a GPU: on the GPU run
//! `service_bench --budget-quarter` (see BENCHMARKS.md).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AnyResource, AsyncResource};
use streamalloc::{Budget, CacheConfig, Device, ResourceBuilder, Stats};
use streamalloc_measure::service::streamalloc_way::{self, Level, Memory};
use streamalloc_measure::service::{Dims, LevelResult, SimKernels};

const STREAMS: usize = 8;

type BoxResult<T> = Result<T, Box<dyn Error>>;

struct Args {
    clients: Vec<usize>,
    requests: usize,
    rounds: usize,
    sim_latency_us: u64,
    workers: usize,
    /// The budget above the cache (`--budget-over-cache`); else below
    /// it, as in `service_bench`. The cache's virtual-memory arena serves
    /// either way: a budget below it lends it the device and is charged
    /// for every page it maps.
    budget_over_cache: bool,
}

fn parse_args() -> BoxResult<Args> {
    let mut args = Args {
        clients: vec![64, 1024],
        requests: 2048,
        rounds: 3,
        sim_latency_us: 5,
        workers: 4,
        budget_over_cache: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--clients" => {
                args.clients = value("--clients")?
                    .split(',')
                    .map(|c| c.trim().parse::<usize>().map(|n| n.max(1)))
                    .collect::<Result<_, _>>()?;
            }
            "--requests" => args.requests = value("--requests")?.parse()?,
            "--rounds" => args.rounds = value("--rounds")?.parse::<usize>()?.max(1),
            "--sim-latency-us" => args.sim_latency_us = value("--sim-latency-us")?.parse()?,
            "--workers" => args.workers = value("--workers")?.parse::<usize>()?.max(1),
            "--budget-over-cache" => args.budget_over_cache = true,
            other => return Err(format!("unknown argument {other} (see the file's docs)").into()),
        }
    }
    Ok(args)
}

/// The stack of `service_bench --budget-quarter`: the caching tier over a
/// budget of a quarter of the peak demand of `clients` (or under it, with
/// `over`), with a statistics layer on top that counts the budget's
/// refusals.
fn budgeted_stack(
    device: &Device<SimGpu>,
    clients: usize,
    over: bool,
) -> BoxResult<(AnyResource, Stats)> {
    let budget = Budget::new(streamalloc_way::quarter_budget(&Dims::BENCH, clients));
    let stats = Stats::new();
    let top = ResourceBuilder::new().stats_with(&stats);
    let res = match over {
        true => AsyncResource::build(device, &top.budget(&budget).cache(CacheConfig::default()))?
            .into_any(),
        false => AsyncResource::build(device, &top.cache(CacheConfig::default()).budget(&budget))?
            .into_any(),
    };
    Ok((res, stats))
}

/// One way's figures over one level.
struct Run {
    row: LevelResult,
    /// The library's simulated driver calls, by kind, per request.
    calls: Vec<(DriverCall, f64)>,
    refused_per_request: f64,
    waited_per_request: f64,
}

#[allow(clippy::too_many_arguments, reason = "one level of one way")]
async fn run_way(
    over: bool,
    gpu: &Arc<SimGpu>,
    device: &Device<SimGpu>,
    kernels: &Arc<SimKernels>,
    memory: Memory,
    clients: usize,
    per: usize,
) -> BoxResult<Run> {
    let (res, stats) = budgeted_stack(device, clients, over)?;
    let level = Level {
        dims: Dims::BENCH,
        clients,
        requests_per_client: per,
        seed: 2026,
        memory,
    };
    let mut edges = Vec::new();
    let mut observe = |_| {
        let calls: Vec<u64> = DriverCall::ALL.iter().map(|&c| gpu.call_count(c)).collect();
        edges.push((calls, stats.snapshot().overall, res.queue_stats()));
    };
    let row = streamalloc_way::run_level_observed(&res, kernels, level, &mut observe).await?;
    let left = streamalloc_way::release_all(&res).await?;
    if left != 0 {
        return Err(format!("{} B outstanding after the level", left).into());
    }
    let [(c0, s0, q0), (c1, s1, q1)] = &edges[..] else {
        return Err("the level did not report its two edges".into());
    };
    let n = row.requests.max(1) as f64;
    let calls = DriverCall::ALL
        .iter()
        .zip(c0.iter().zip(c1))
        .filter(|&(&c, _)| !matches!(c, DriverCall::Launch | DriverCall::CopyAsync))
        .filter(|&(_, (a, b))| b > a)
        .map(|(&c, (a, b))| (c, (b - a) as f64 / n))
        .collect();
    Ok(Run {
        row,
        calls,
        refused_per_request: (s1.refused_tries - s0.refused_tries) as f64 / n,
        waited_per_request: ((q1.served + q1.failed + q1.cancelled)
            - (q0.served + q0.failed + q0.cancelled)) as f64
            / n,
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> BoxResult<()> {
    let args = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()?;
    let gpu = SimGpu::builder()
        .op_latency(Duration::from_micros(args.sim_latency_us))
        .build();
    let device = Device::simulated(&gpu, STREAMS);
    let kernels = Arc::new(SimKernels::new(gpu.clone()));
    println!(
        "simulated device, {STREAMS} streams, {} µs per op; tokio {} workers; {} rounds; budget {} the cache",
        args.sim_latency_us,
        args.workers,
        args.rounds,
        match args.budget_over_cache {
            true => "over",
            false => "under",
        }
    );
    rt.block_on(async {
        for &clients in &args.clients {
            let per = args.requests.div_ceil(clients).max(2);
            let budget = streamalloc_way::quarter_budget(&Dims::BENCH, clients);
            let ways = [
                Memory::Reserved,
                Memory::Semaphore {
                    permits: streamalloc_way::semaphore_permits(budget),
                },
            ];
            let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
            for round in 0..args.rounds {
                // Alternate which way goes first.
                for k in 0..2 {
                    let w = (k + round) % 2;
                    let run = run_way(
                        args.budget_over_cache,
                        &gpu,
                        &device,
                        &kernels,
                        ways[w],
                        clients,
                        per,
                    ).await?;
                    runs[w].push(run);
                }
            }
            println!(
                "\n{clients} clients, {per} requests each, budget {} MiB:",
                budget >> 20
            );
            for (w, memory) in ways.iter().enumerate() {
                let rs = &runs[w];
                let rps = median(rs.iter().map(|r| r.row.requests_per_s()).collect());
                let p50 = median(rs.iter().map(|r| r.row.p50.as_secs_f64() * 1e3).collect());
                let p99 = median(rs.iter().map(|r| r.row.p99.as_secs_f64() * 1e3).collect());
                let held = median(rs.iter().map(|r| r.row.held_ratio()).collect());
                let last = rs.last().ok_or("no round")?;
                let calls: Vec<String> = last
                    .calls
                    .iter()
                    .map(|(c, n)| format!("{c:?} {n:.2}"))
                    .collect();
                println!(
                    "  {:<22} {rps:>8.0} req/s  p50 {p50:>8.2} ms  p99 {p99:>8.2} ms  held/live {held:.2}x\n    per request (last round): refused tries {:.2}, waited {:.2}; calls: {}",
                    memory.way_name(),
                    last.refused_per_request,
                    last.waited_per_request,
                    calls.join(", ")
                );
            }
            let ratio = |f: &dyn Fn(&LevelResult) -> f64| {
                median(
                    runs[0]
                        .iter()
                        .zip(&runs[1])
                        .map(|(r, s)| f(&r.row) / f(&s.row))
                        .collect(),
                )
            };
            println!(
                "  reserve / semaphore: requests/s {:.2}x, p99 {:.2}x (median of the rounds' ratios)",
                ratio(&|r| r.requests_per_s()),
                ratio(&|r| r.p99.as_secs_f64())
            );
        }
        let races = gpu.races();
        if !races.is_empty() {
            return Err(format!("{} race(s) on the simulated device", races.len()).into());
        }
        Ok(())
    })
}
