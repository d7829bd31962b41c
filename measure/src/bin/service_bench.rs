//! An inference service measured three ways in one process and one run:
//! streamalloc (caching tier + futures + reaper), cudarc alone
//! (`CudaSlice` + `synchronize` in `spawn_blocking`), and NVIDIA's
//! cuda-async 0.5 (with the `peer-cuda-async` feature). See
//! `streamalloc_measure::service` for the service and what each way does.
//!
//! For each number of clients (`--clients`, default 1,64,1024) and each
//! round (`--rounds`, default 3), the ways run one after another in a
//! rotating order; each level sends about `--requests` requests (default
//! 4,096, at least 2 per client). Then "10,000 fills with a spawned task
//! awaiting each", streamalloc against cuda-async, interleaved over
//! `--fill-rounds` rounds (default 9, medians): streamalloc with each kind
//! of completion point (`completion()`, `completion_lazy()`), the fill
//! queued by the loop or in the task.
//!
//! Writes into `--out DIR` (default `service-out`): `service.csv` (every
//! round), `service.md` (the medians as a Markdown table, and the fills
//! row), `service.png` (requests/s and p99 against clients), `fills.csv`.
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin service_bench -- --out DIR          # CUDA
//! cargo run --release -p streamalloc-measure --features peer-cuda-async --bin service_bench -- --out DIR
//! cargo run --release -p streamalloc-measure --bin service_bench -- --sim             # simulated
//! ```
//! `--diag` adds, per level: for the streamalloc way (and, with
//! `--budget-quarter`, the two gated ways), the library's driver
//! calls per request by kind and the µs spent in each (through a
//! [`CountingGpu`]), and its futures' wait statistics; for every way, the
//! GPU's busy fraction and a request's mean time in progress on the GPU
//! (timing events around each request, [`Timeline`]); and after the fills
//! rows, one more round of each streamalloc fills row through a
//! [`CountingGpu`]: the library's driver calls per fill by kind.
//! `--budget-quarter` adds, per level, the same service under a budget of
//! a quarter of the peak demand (every client's largest request at once;
//! at least two of the largest), its three buffers taken as one unit
//! (`streamalloc+reserve`, `allocate_buffers`) and, beside it, awaited one
//! by one behind a tokio `Semaphore` that mirrors the budget
//! (`streamalloc+semaphore`): both stacks are the caching tier over the
//! budget (`AsyncResource::build`). `--budget-over-cache` puts the budget
//! above the cache instead; `--cross-stream done` has the cache lend
//! memory another stream freed only once the host saw the GPU done with it
//! (`CrossStreamReuse::Done`; default `wait`, behind a wait on the GPU).
//! The cache's virtual-memory arena serves either
//! way: a budget below the cache lends it the device and is charged for
//! every page the arena maps (a full budget refuses a growth, not a
//! placement in memory mapped already); above it, it counts what the
//! cache holds after each allocation.
//! `--staged` runs, instead, the service with real input and output
//! copies: each request's input written on the host into pinned memory,
//! copied in, its result copied out and checked; streamalloc through a
//! `HostPool`, cudarc and cuda-async with pinned buffers per client
//! (`staged.md`, `staged.csv`; see the `staged` module).
//! `--policy NAME`
//! sets the streamalloc way's (and the fills rows') wait policy (`default`, `park`, `spin20`,
//! `yield1ms`, `coalesced`), to tell completion costs from the rest.
//!
//! [`Timeline`]: streamalloc_measure::service::timeline::Timeline
//!
//! On the simulated device (or `--sim`) only the streamalloc way runs, with
//! simulated kernels, each operation `--sim-latency-us` long (default 5; a
//! longer one keeps more work queued, as a loaded GPU does): the numbers
//! measure the futures layer and the memory held only. The simulated
//! kernels run one at a time unless `--sim-kernels N` lets N of them, on
//! different streams, run side by side (as a GPU's SMs do): then a request
//! that waits on another stream's fence loses the overlap it would have
//! had; `--sim-host-fn-us N` runs host functions (the notifications) N µs
//! after their streams reach them, on a callback thread, as a driver does.
//! cuBLAS is loaded at run time: put `/usr/local/cuda/lib64` on
//! `LD_LIBRARY_PATH`.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use streamalloc::DriverCall;
use streamalloc::gpu::Gpu;
use streamalloc::gpu::cuda::cuda_present;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AnyResource, AsyncResource, WaitPolicy, WaitStats};
use streamalloc::{
    Budget, CacheConfig, CachingResource, CrossStreamReuse, Device, ResourceBuilder, SimResource,
    StreamOrderedResource,
};
use streamalloc_measure::calls::CountingGpu;
use streamalloc_measure::service::cuda_model::CudaModel;
use streamalloc_measure::service::fills::Point;
use streamalloc_measure::service::streamalloc_way::{Edge, Level, Memory};
use streamalloc_measure::service::{
    Dims, LevelResult, RequestKernels, SimKernels, csv_header, cudarc_way, fills, plot,
    streamalloc_way,
};

#[path = "service_bench/staged.rs"]
mod staged;

const STREAMS: usize = 8;

type BoxResult<T> = Result<T, Box<dyn Error>>;

struct Args {
    out: PathBuf,
    clients: Vec<usize>,
    requests: usize,
    rounds: usize,
    fill_rounds: usize,
    seed: u64,
    sim: bool,
    sim_latency_us: u64,
    sim_kernels: usize,
    sim_host_fn_us: u64,
    workers: usize,
    diag: bool,
    policy: Option<WaitPolicy>,
    budget_quarter: bool,
    budget_over_cache: bool,
    cross_stream: CrossStreamReuse,
    staged: bool,
}

fn parse_args() -> BoxResult<Args> {
    let mut args = Args {
        out: PathBuf::from("service-out"),
        clients: vec![1, 64, 1024],
        requests: 4096,
        rounds: 3,
        fill_rounds: 9,
        seed: 2026,
        sim: false,
        sim_latency_us: 5,
        sim_kernels: 1,
        sim_host_fn_us: 0,
        workers: 4,
        diag: false,
        policy: None,
        budget_quarter: false,
        budget_over_cache: false,
        cross_stream: CrossStreamReuse::Wait,
        staged: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--out" => args.out = PathBuf::from(value("--out")?),
            "--clients" => {
                args.clients = value("--clients")?
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--clients {c}: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
                if args.clients.contains(&0) {
                    return Err("--clients: every count must be at least 1".into());
                }
            }
            "--requests" => args.requests = value("--requests")?.parse()?,
            "--rounds" => args.rounds = value("--rounds")?.parse::<usize>()?.max(1),
            "--fill-rounds" => args.fill_rounds = value("--fill-rounds")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--workers" => args.workers = value("--workers")?.parse::<usize>()?.max(1),
            "--sim" => args.sim = true,
            "--sim-latency-us" => args.sim_latency_us = value("--sim-latency-us")?.parse()?,
            "--sim-kernels" => args.sim_kernels = value("--sim-kernels")?.parse()?,
            "--sim-host-fn-us" => args.sim_host_fn_us = value("--sim-host-fn-us")?.parse()?,
            "--diag" => args.diag = true,
            "--budget-quarter" => args.budget_quarter = true,
            "--budget-over-cache" => args.budget_over_cache = true,
            "--cross-stream" => {
                args.cross_stream = match value("--cross-stream")?.as_str() {
                    "wait" => CrossStreamReuse::Wait,
                    "done" => CrossStreamReuse::Done,
                    other => return Err(format!("--cross-stream {other}: wait or done").into()),
                }
            }
            "--staged" => args.staged = true,
            "--policy" => args.policy = Some(parse_policy(&value("--policy")?)?),
            other => return Err(format!("unknown argument {other} (see the file's docs)").into()),
        }
    }
    Ok(args)
}

/// The streamalloc way's wait policy, by name (`--policy`): `default`,
/// `park` (park at once: every wait is a host-function notification),
/// `spin20` (spin 20 µs on the first poll, as cuda-async's inline spin),
/// `yield1ms` (yield and query for up to 1 ms before parking: almost no
/// notification for waits), `coalesced` (the default, but behind points
/// park at once and a notification covers the stream's end).
fn parse_policy(name: &str) -> BoxResult<WaitPolicy> {
    let us = Duration::from_micros;
    Ok(match name {
        "default" => WaitPolicy::DEFAULT,
        "park" => WaitPolicy::PARK_AT_ONCE,
        "spin20" => WaitPolicy {
            spin: us(20),
            ..WaitPolicy::DEFAULT
        },
        "yield1ms" => WaitPolicy {
            yield_for: us(1000),
            ..WaitPolicy::DEFAULT
        },
        // Behind points park at once and one notification covers the
        // stream's end (how every parked future was notified before
        // notifications targeted the oldest parked point).
        "coalesced" => WaitPolicy {
            behind: streamalloc::WhenBehind::Park,
            ..WaitPolicy::DEFAULT
        },
        other => {
            return Err(
                format!("--policy {other}: default, park, spin20, yield1ms or coalesced").into(),
            );
        }
    })
}

fn main() -> BoxResult<()> {
    let args = parse_args()?;
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()?;
    println!(
        "tokio: multi-thread, {} workers; model {:?}; {} streams per way; seed {}",
        args.workers,
        Dims::BENCH,
        STREAMS,
        args.seed
    );
    let cuda = !args.sim && cuda_present();
    if !cuda {
        println!("device: SIMULATED (only the streamalloc way; cudarc and cuda-async need CUDA)");
    }
    match (args.staged, cuda) {
        (true, true) => rt.block_on(staged::on_cuda(&args)),
        (true, false) => rt.block_on(staged::on_sim(&args)),
        (false, true) => rt.block_on(on_cuda(&args)),
        (false, false) => rt.block_on(on_sim(&args)),
    }
}

fn requests_per_client(args: &Args, clients: usize) -> usize {
    args.requests.div_ceil(clients).max(2)
}

/// The simulated device of `--sim` (each operation `--sim-latency-us`
/// long, [`STREAMS`] streams) and the streamalloc way's stack on it: the
/// caching tier over the stream-ordered resource, futures on top.
#[allow(clippy::type_complexity)]
fn sim_stack(
    args: &Args,
) -> BoxResult<(
    Arc<SimGpu>,
    Device<SimGpu>,
    AsyncResource<CachingResource<Arc<SimResource>>>,
)> {
    let gpu = SimGpu::builder()
        .op_latency(Duration::from_micros(args.sim_latency_us))
        .concurrent_kernels(args.sim_kernels)
        .host_fn_latency(Duration::from_micros(args.sim_host_fn_us))
        .build();
    let device = Device::simulated(&gpu, STREAMS);
    let inner = Arc::new(SimResource::new(&device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }?;
    Ok((gpu, device, res))
}

async fn on_sim(args: &Args) -> BoxResult<()> {
    let (gpu, device, res) = sim_stack(args)?;
    let kernels = Arc::new(SimKernels::new(gpu.clone()));
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let per = requests_per_client(args, clients).min(64);
        let counts =
            || -> Vec<u64> { DriverCall::ALL.iter().map(|&c| gpu.call_count(c)).collect() };
        let before = counts();
        let row = streamalloc_way::run_level(&res, &kernels, Dims::BENCH, clients, per, args.seed)
            .await?;
        println!("{}", row.markdown_row());
        if args.diag {
            print_sim_calls(&gpu, &before, row.requests);
        }
        if args.budget_quarter {
            for memory in gated(clients) {
                let before = counts();
                let res = budgeted_stack(
                    &device,
                    clients,
                    None,
                    args.budget_over_cache,
                    args.cross_stream,
                )?;
                let level = level_of(args, clients, per, memory);
                let gated_row = observed_level(&res, &kernels, level, &mut |_, _| {}).await?;
                println!("{}", gated_row.markdown_row());
                if args.diag {
                    print_sim_calls(&gpu, &before, gated_row.requests);
                }
                rows.push((0, gated_row));
            }
        }
        rows.push((0, row));
    }
    let races = gpu.races();
    println!("race detector: {} race(s)", races.len());
    let left = streamalloc_way::release_all(&res).await?;
    println!("outstanding at the end: {left} B");
    write_outputs(args, &rows, &[], "simulated device")?;
    if !races.is_empty() || left != 0 {
        return Err("races or outstanding bytes on the simulated device".into());
    }
    Ok(())
}

/// `--diag` on the simulated device: the driver calls of the level just
/// run, per request (`before`: the counts before it), launches left out.
fn print_sim_calls(gpu: &SimGpu, before: &[u64], requests: usize) {
    let per_request: Vec<String> = DriverCall::ALL
        .iter()
        .zip(before)
        .filter(|&(&c, &b)| gpu.call_count(c) > b && c != DriverCall::Launch)
        .map(|(&c, &b)| {
            let n = (gpu.call_count(c) - b) as f64 / requests.max(1) as f64;
            format!("{c:?} {n:.2}")
        })
        .collect();
    println!(
        "  diag simulated driver calls per request (with the release before the level): {}",
        per_request.join(", ")
    );
}

/// The ways on CUDA, by name.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    Streamalloc,
    /// `--budget-quarter`: three buffers as one unit, under the budget.
    Reserved,
    /// `--budget-quarter`: a tokio `Semaphore` in front, under the budget.
    Semaphore,
    Cudarc,
    #[cfg(feature = "peer-cuda-async")]
    CudaAsync,
}

impl Way {
    /// How a streamalloc way's requests obtain their buffers at `clients`
    /// (each one by one for the plain way, and for the others too, which
    /// run no streamalloc level).
    fn memory(self, clients: usize) -> Memory {
        match self {
            Way::Reserved => Memory::Reserved,
            Way::Semaphore => Memory::Semaphore {
                permits: streamalloc_way::semaphore_permits(streamalloc_way::quarter_budget(
                    &Dims::BENCH,
                    clients,
                )),
            },
            _ => Memory::EachBuffer,
        }
    }
}

const WAYS: &[Way] = &[
    Way::Streamalloc,
    Way::Reserved,
    Way::Semaphore,
    Way::Cudarc,
    #[cfg(feature = "peer-cuda-async")]
    Way::CudaAsync,
];

async fn on_cuda(args: &Args) -> BoxResult<()> {
    // The first device gives the cudarc context (the primary context, which
    // every way shares); the streamalloc way opens a fresh one per level.
    let ctx = cuda_context()?;
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let model = Arc::new(CudaModel::new(&ctx, Dims::BENCH, max_clients)?);
    println!("every output element must be {}", model.expected_output());
    // (b) cudarc: its own streams.
    let streams = (0..STREAMS)
        .map(|_| ctx.new_stream())
        .collect::<Result<Vec<_>, _>>()?;
    // (c) cuda-async: its own context handle and streams.
    // A peer that cannot start costs its rows, not the others'.
    #[cfg(feature = "peer-cuda-async")]
    let peer = match streamalloc_measure::service::cuda_async_way::CudaAsyncWay::new(
        &ctx,
        model.clone(),
        STREAMS,
    ) {
        Ok(p) => Some(Arc::new(p)),
        Err(e) => {
            println!("cuda-async: could not start ({e}); its rows are left out");
            None
        }
    };
    let ways: Vec<Way> = WAYS
        .iter()
        .copied()
        .filter(|w| {
            #[cfg(feature = "peer-cuda-async")]
            if *w == Way::CudaAsync {
                return peer.is_some();
            }
            matches!(w, Way::Streamalloc | Way::Cudarc)
                || (args.budget_quarter && matches!(w, Way::Reserved | Way::Semaphore))
        })
        .collect();
    #[cfg(not(feature = "peer-cuda-async"))]
    println!("cuda-async: not built (build with --features peer-cuda-async and CUDA_TOOLKIT_PATH)");

    let level = async |way: Way, clients: usize, per: usize| -> BoxResult<LevelResult> {
        if args.diag {
            model.timeline().begin();
        }
        let row = match way {
            Way::Streamalloc | Way::Reserved | Way::Semaphore => {
                // A fresh device (its own memory pool) per level: the pool
                // keeps what it reserved (release threshold: all), so a level
                // run on the last one's would report that level's memory.
                let device = Device::cuda(0, STREAMS)?;
                streamalloc_level(args, &device, &model, way, clients, per).await?
            }
            Way::Cudarc => {
                cudarc_way::run_level(&ctx, &streams, &model, clients, per, args.seed).await?
            }
            #[cfg(feature = "peer-cuda-async")]
            Way::CudaAsync => {
                let peer = peer.as_ref().ok_or("cuda-async did not start")?;
                peer.run_level(clients, per, args.seed).await?
            }
        };
        if let Some(busy) = busy_after(&ctx, &model)? {
            println!("  diag {way:?} {clients} clients: {busy}");
        }
        // Client 0's last answer: every request has at least 16 rows.
        if !model.output_matches(0, 16) {
            return Err(format!("{way:?} at {clients} clients: wrong output").into());
        }
        Ok(row)
    };
    let rows = run_rounds(
        args,
        &ways,
        &table_header(),
        level,
        LevelResult::markdown_row,
    )
    .await?;

    // 10,000 fills with a spawned task awaiting each.
    let fill_device = Device::cuda(0, STREAMS)?;
    let res = streamalloc_stack(&fill_device, &model, args.policy)?;
    let targets = fills::fill_targets(&res)?;
    // Rows: the plain loop, then per kind of point the fill queued by the
    // loop and the fill queued in the task, then cuda-async.
    let mut fill_rows: Vec<(String, Vec<Duration>)> =
        vec![("plain loop (no future)".to_string(), Vec::new())];
    for point in Point::ALL {
        fill_rows.push((
            format!(
                "streamalloc {}: fill queued by the loop, a spawned task awaits its completion",
                point.name()
            ),
            Vec::new(),
        ));
        fill_rows.push((
            format!(
                "streamalloc {}: a spawned task queues the fill and awaits it",
                point.name()
            ),
            Vec::new(),
        ));
    }
    #[cfg(feature = "peer-cuda-async")]
    if peer.is_some() {
        fill_rows.push((
            "cuda-async 0.5: a spawned task awaits a DeviceOp (queued on first poll)".to_string(),
            Vec::new(),
        ));
    }
    let (r2, t2) = (res.clone(), targets.clone());
    let fill_rounds = args.fill_rounds.max(1);
    #[cfg(feature = "peer-cuda-async")]
    let peer2 = peer.clone();
    // Measured inside a task, as a request handler would run.
    let fill_rows = tokio::spawn(async move {
        // Warm-up of each.
        for point in Point::ALL {
            fills::spawned_await(&r2, &t2, point).await?;
            fills::spawned_fill_and_await(&r2, &t2, point).await?;
        }
        #[cfg(feature = "peer-cuda-async")]
        if let Some(p) = &peer2 {
            p.fills().await?;
        }
        for _ in 0..fill_rounds {
            fill_rows[0].1.push(fills::plain(&r2, &t2)?);
            for (k, point) in Point::ALL.into_iter().enumerate() {
                fill_rows[1 + 2 * k]
                    .1
                    .push(fills::spawned_await(&r2, &t2, point).await?);
                fill_rows[2 + 2 * k]
                    .1
                    .push(fills::spawned_fill_and_await(&r2, &t2, point).await?);
            }
            #[cfg(feature = "peer-cuda-async")]
            if let Some(p) = &peer2 {
                fill_rows[1 + 2 * Point::ALL.len()].1.push(p.fills().await?);
            }
        }
        Ok::<_, Box<dyn Error + Send + Sync>>(fill_rows)
    })
    .await
    .expect("fills task")
    .map_err(|e| e as Box<dyn Error>)?;
    if args.diag {
        fill_calls(&fill_device, &model, args.policy).await?;
    }
    for (block, _) in targets {
        res.deallocate(block)?;
    }
    res.reap_pending().await?;
    let fill_medians: Vec<(String, f64)> = fill_rows
        .iter()
        .map(|(name, v)| (name.clone(), median_us(v)))
        .collect();
    let mut f = std::fs::File::create(args.out.join("fills.csv"))?;
    writeln!(f, "row,round,us_per_op")?;
    for (name, v) in &fill_rows {
        for (i, d) in v.iter().enumerate() {
            writeln!(f, "\"{name}\",{i},{:.4}", d.as_secs_f64() * 1e6)?;
        }
    }
    println!(
        "\n10,000 4-byte fills on {STREAMS} streams, a spawned task awaiting each (medians of {fill_rounds} rounds, µs per op):"
    );
    for (name, us) in &fill_medians {
        println!("  {us:8.3}  {name}");
    }
    // The card's own name (the table once said "H200" whatever ran it).
    let card = ctx.name().unwrap_or_else(|_| "CUDA device 0".into());
    write_outputs(args, &rows, &fill_medians, &card)?;
    Ok(())
}

/// `--diag`: one more round of each streamalloc fills row over a stack on
/// a [`CountingGpu`] of `device`, printing the library's driver calls per
/// fill by kind (the fill's own `MemsetAsync` included): how often a lazy
/// point found its stream idle (a `StreamQuery` and no `EventRecord`).
async fn fill_calls<G: Gpu>(
    device: &Device<G>,
    model: &CudaModel,
    policy: Option<WaitPolicy>,
) -> BoxResult<()> {
    let (counting, counted) = counting_device(device)?;
    let res = streamalloc_stack(&counted, model, policy)?;
    let targets = fills::fill_targets(&res)?;
    let (r2, t2, c2) = (res.clone(), targets.clone(), counting.clone());
    let lines = tokio::spawn(async move {
        let mut lines = Vec::new();
        for point in Point::ALL {
            for in_task in [false, true] {
                let before = c2.counts();
                let per_op = if in_task {
                    fills::spawned_fill_and_await(&r2, &t2, point).await?
                } else {
                    fills::spawned_await(&r2, &t2, point).await?
                };
                let shape = if in_task {
                    "in the task"
                } else {
                    "by the loop"
                };
                lines.push(format!(
                    "  diag fills, {} queued {shape} ({:.2} µs per op counted):{}",
                    point.name(),
                    per_op.as_secs_f64() * 1e6,
                    c2.counts().since(&before).per_request_line(fills::FILLS)
                ));
            }
        }
        Ok::<_, Box<dyn Error + Send + Sync>>(lines)
    })
    .await
    .expect("fill calls task")
    .map_err(|e| e as Box<dyn Error>)?;
    for line in lines {
        println!("{line}");
    }
    for (block, _) in targets {
        res.deallocate(block)?;
    }
    res.reap_pending().await?;
    Ok(())
}

/// The context of CUDA device 0 (its primary context, which every way
/// shares), the device printed.
fn cuda_context() -> BoxResult<Arc<cudarc::driver::CudaContext>> {
    let device = Device::cuda(0, 1)?;
    println!("device: {device}");
    let gpu = device
        .gpu()
        .cuda()
        .ok_or("Device::cuda gave no CUDA backend")?;
    Ok(gpu.context().clone())
}

/// The measured levels on CUDA, after a warm-up level of each way (cuBLAS
/// handles, the PTX module, the pools): for each round and number of
/// clients, every way once, in an order rotated by the round; each row
/// printed under `header` as `line` writes it, and returned with its round.
async fn run_rounds<W: Copy, T>(
    args: &Args,
    ways: &[W],
    header: &str,
    mut level: impl AsyncFnMut(W, usize, usize) -> BoxResult<T>,
    line: impl Fn(&T) -> String,
) -> BoxResult<Vec<(usize, T)>> {
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    for &way in ways {
        level(way, 64.min(max_clients), 2).await?;
    }
    println!("\n{header}");
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        for &clients in &args.clients {
            let per = requests_per_client(args, clients);
            for k in 0..ways.len() {
                let way = ways[(k + round) % ways.len()];
                let row = level(way, clients, per).await?;
                println!("{}   (round {round})", line(&row));
                rows.push((round, row));
            }
        }
    }
    Ok(rows)
}

/// One level of a streamalloc way (plain, or gated under
/// `--budget-quarter`) on `device`. With `--diag`, the same stack runs
/// over a backend that counts its calls, and the library's driver calls
/// per request are printed (for the plain way, its futures' wait
/// statistics too).
async fn streamalloc_level<G: Gpu>(
    args: &Args,
    device: &Device<G>,
    model: &Arc<CudaModel>,
    way: Way,
    clients: usize,
    per: usize,
) -> BoxResult<LevelResult> {
    let memory = way.memory(clients);
    let level = level_of(args, clients, per, memory);
    if !args.diag {
        return level_on_stack(args, device, model, level, &mut |_, _| {}).await;
    }
    let (counting, counted) = counting_device(device)?;
    let mut edges = Vec::new();
    let mut observe = |_: Edge, waits: WaitStats| edges.push((counting.counts(), waits));
    let row = level_on_stack(args, &counted, model, level, &mut observe).await?;
    if let [(c0, w0), (c1, w1)] = &edges[..] {
        let calls = c1.since(c0).per_request_line(row.requests);
        if memory == Memory::EachBuffer {
            println!(
                "  diag streamalloc {clients} clients, library driver calls per request:{calls}"
            );
            println!(
                "  diag streamalloc wait stats over the level: {}",
                wait_delta(w0, w1, row.requests)
            );
        } else {
            println!("  diag {way:?} {clients} clients, library driver calls per request:{calls}");
        }
    }
    Ok(row)
}

/// `level` on its way's stack over `device`: the plain stack
/// ([`streamalloc_stack`]), or the budgeted one for a gated level
/// ([`budgeted_stack`]), waiting as `--policy` says.
async fn level_on_stack<G: Gpu>(
    args: &Args,
    device: &Device<G>,
    model: &Arc<CudaModel>,
    level: Level,
    observe: &mut (dyn FnMut(Edge, WaitStats) + Send),
) -> BoxResult<LevelResult> {
    if level.memory == Memory::EachBuffer {
        let res = streamalloc_stack(device, model, args.policy)?;
        return observed_level(&res, model, level, observe).await;
    }
    let res = budgeted_stack(
        device,
        level.clients,
        Some(model),
        args.budget_over_cache,
        args.cross_stream,
    )?;
    if let Some(p) = args.policy {
        res.set_wait_policy(p);
    }
    observed_level(&res, model, level, observe).await
}

/// One streamalloc level on `res`, calling `observe` with the futures'
/// wait statistics right before the clients start and right after the
/// last one ended; then every byte given back, or an error.
async fn observed_level<R, K>(
    res: &AsyncResource<R>,
    kernels: &Arc<K>,
    level: Level,
    observe: &mut (dyn FnMut(Edge, WaitStats) + Send),
) -> BoxResult<LevelResult>
where
    R: streamalloc::DeviceMemoryResource + ?Sized + 'static,
    K: RequestKernels,
{
    let mut observe_edge = |edge| observe(edge, res.wait_stats());
    let row = streamalloc_way::run_level_observed(res, kernels, level, &mut observe_edge).await?;
    finish_level(res, level.clients).await?;
    Ok(row)
}

/// A streamalloc level of `clients` clients sending `per` requests each,
/// seeded by `--seed`, the buffers obtained as `memory` says.
fn level_of(args: &Args, clients: usize, per: usize, memory: Memory) -> Level {
    Level {
        dims: Dims::BENCH,
        clients,
        requests_per_client: per,
        seed: args.seed,
        memory,
    }
}

/// `--diag`: `device`'s streams over a backend that counts the library's
/// driver calls into `device`'s, and that backend.
#[allow(clippy::type_complexity)]
fn counting_device<G: Gpu>(
    device: &Device<G>,
) -> BoxResult<(Arc<CountingGpu<G>>, Device<CountingGpu<G>>)> {
    let counting = Arc::new(CountingGpu::new(device.gpu().clone()));
    let counted = Device::new(counting.clone(), device.streams().clone())?;
    Ok((counting, counted))
}

/// The streamalloc way's stack on `device` (a fresh CUDA device 0, or
/// one over a [`CountingGpu`] of it): the caching tier over the
/// stream-ordered resource, futures on top, waiting as `policy` says (the
/// default when `None`); the model's cuBLAS handles for its streams made
/// beforehand.
fn streamalloc_stack<G: Gpu>(
    device: &Device<G>,
    model: &CudaModel,
    policy: Option<WaitPolicy>,
) -> BoxResult<AsyncResource<CachingResource<Arc<StreamOrderedResource<G>>>>> {
    prepare_streams(device, model)?;
    let inner = Arc::new(StreamOrderedResource::new(device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(CachingResource::new(inner), device) }?;
    if let Some(p) = policy {
        res.set_wait_policy(p);
    }
    Ok(res)
}

/// The model's cuBLAS handles for every stream of `device` (CUDA device
/// 0, or a [`CountingGpu`] over it), made before a level so that none is
/// made while requests are timed.
fn prepare_streams<G: Gpu>(device: &Device<G>, model: &CudaModel) -> BoxResult<()> {
    for id in device.streams().ids() {
        let raw = device.raw(id)?.get() as cudarc::driver::sys::CUstream;
        // SAFETY: a live stream of device 0's primary context, the model's.
        unsafe { model.prepare_stream(raw)? };
    }
    Ok(())
}

/// The two gated ways of `--budget-quarter` at `clients`: reservations,
/// and a semaphore that mirrors the budget.
fn gated(clients: usize) -> [Memory; 2] {
    [Way::Reserved, Way::Semaphore].map(|way| way.memory(clients))
}

/// The stack of `--budget-quarter` on `device`: the caching tier over a
/// budget of a quarter of the peak demand of `clients` (under it with
/// `over`, `--budget-over-cache`), futures on top (type-erased); the
/// model's cuBLAS handles for its streams made beforehand on CUDA; the
/// cache lends memory another stream freed as `cross_stream` says
/// (`--cross-stream`).
fn budgeted_stack<G: Gpu>(
    device: &Device<G>,
    clients: usize,
    model: Option<&CudaModel>,
    over: bool,
    cross_stream: CrossStreamReuse,
) -> BoxResult<AnyResource> {
    if let Some(model) = model {
        prepare_streams(device, model)?;
    }
    let budget = Budget::new(streamalloc_way::quarter_budget(&Dims::BENCH, clients));
    let top = ResourceBuilder::new();
    let config = CacheConfig::default().cross_stream(cross_stream);
    Ok(match over {
        true => AsyncResource::build(device, &top.budget(&budget).cache(config))?.into_any(),
        false => AsyncResource::build(device, &top.cache(config).budget(&budget))?.into_any(),
    })
}

/// After a streamalloc level: every byte given back, or an error.
async fn finish_level<R: streamalloc::DeviceMemoryResource + ?Sized + 'static>(
    res: &AsyncResource<R>,
    clients: usize,
) -> BoxResult<()> {
    let left = streamalloc_way::release_all(res).await?;
    if left != 0 {
        return Err(format!(
            "streamalloc at {clients} clients: {left} B outstanding after the level"
        )
        .into());
    }
    Ok(())
}

/// With `--diag`: the GPU timeline of the level just run (every stream of
/// the context synchronized first, so that its events are complete).
fn busy_after(
    ctx: &Arc<cudarc::driver::CudaContext>,
    model: &CudaModel,
) -> BoxResult<Option<streamalloc_measure::service::timeline::Busy>> {
    if !model.timeline().recording() {
        return Ok(None);
    }
    ctx.synchronize()?;
    Ok(model.timeline().finish())
}

/// A level's wait statistics, per request.
fn wait_delta(a: &WaitStats, b: &WaitStats, requests: usize) -> String {
    let per = |x: u64, y: u64| (y - x) as f64 / requests.max(1) as f64;
    format!(
        "per request: points {:.2}, queries {:.2}, frontier queries {:.2}, spins {:.2}, yields {:.2}, parks {:.2}, notifications {:.2}",
        per(a.points, b.points),
        per(a.queries, b.queries),
        per(a.frontier_queries, b.frontier_queries),
        per(a.spins, b.spins),
        per(a.yields, b.yields),
        per(a.parks, b.parks),
        per(a.notifications, b.notifications),
    )
}

fn median_us(v: &[Duration]) -> f64 {
    let mut us: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    us.get(us.len() / 2).copied().unwrap_or(f64::NAN)
}

fn table_header() -> String {
    "| way | clients | requests | requests/s | p50 | p99 | peak held | peak live requested | held / requested | threads blocked (peak) | process threads (peak) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".to_string()
}

/// For each (way, clients), the round with the median requests/s, of rows
/// whose plain figures `row` gives.
fn medians<T: Clone>(rows: &[(usize, T)], row: impl Fn(&T) -> &LevelResult) -> Vec<T> {
    let mut keys: Vec<(String, usize)> = Vec::new();
    for (_, r) in rows {
        let k = (row(r).way.clone(), row(r).clients);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(way, clients)| {
            let mut of: Vec<&T> = rows
                .iter()
                .map(|(_, r)| r)
                .filter(|r| row(r).way == way && row(r).clients == clients)
                .collect();
            of.sort_by(|a, b| row(a).requests_per_s().total_cmp(&row(b).requests_per_s()));
            of[of.len() / 2].clone()
        })
        .collect()
}

fn write_outputs(
    args: &Args,
    rows: &[(usize, LevelResult)],
    fills: &[(String, f64)],
    device: &str,
) -> BoxResult<()> {
    let mut csv = std::fs::File::create(args.out.join("service.csv"))?;
    writeln!(csv, "round,{}", csv_header())?;
    for (round, r) in rows {
        writeln!(csv, "{round},{}", r.csv_row())?;
    }
    let med = medians(rows, |r| r);
    let mut md = std::fs::File::create(args.out.join("service.md"))?;
    writeln!(
        md,
        "Inference service on {device}: per way and clients, the round (of {}) with the median requests/s.\n",
        args.rounds
    )?;
    writeln!(md, "{}", table_header())?;
    for r in &med {
        writeln!(md, "{}", r.markdown_row())?;
    }
    if !fills.is_empty() {
        writeln!(
            md,
            "\n| 10,000 4-byte fills on {STREAMS} streams, a spawned task awaiting each | µs per op (median) |\n| --- | --- |"
        )?;
        for (name, us) in fills {
            writeln!(md, "| {name} | {us:.3} |")?;
        }
    }
    let png = args.out.join("service.png");
    match plot::write_png(
        &png,
        &format!("Inference service on {device}: requests/s and p99 by clients"),
        &med,
    ) {
        Ok(true) => println!("wrote {}", png.display()),
        Ok(false) => println!("wrote {} (no font found: no text)", png.display()),
        Err(e) => println!("no plot: {e}"),
    }
    println!("\n{}", table_header());
    for r in &med {
        println!("{}", r.markdown_row());
    }
    println!("wrote {}", args.out.display());
    Ok(())
}
