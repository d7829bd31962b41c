//! Replays an allocation trace through resource stacks, side by side in one
//! process: nanoseconds per operation (the bookkeeping control subtracted,
//! as `torch_cpp_replay.py` does for PyTorch), the trace's peak of live
//! requested bytes, the peak device memory each stack held, and their ratio.
//!
//! ```text
//! trace_replay TRACE [--stack NAME[,NAME...]]... [--sim | --null] [--sim-capacity BYTES]
//!              [--repeat N] [--png OUT.png] [--budget-ratio R] [--calls]
//!              [--slack PERCENT] [--max-mapping BYTES] [--sim-drain N] [--no-move]
//! trace_replay TRACE --cut N OUT.csv.gz
//! ```
//!
//! - `--stack`: `resource` (the driver's pool alone), `cache`,
//!   `cache-budget`, or `all`; by default `resource` and `cache`.
//! - `--sim`: the simulated device (deterministic), even where CUDA is
//!   present; without CUDA the simulated device is used anyway, and said.
//! - `--null`: driver calls that do nothing (`support::NullGpu`), so
//!   ns/op is the stack's own bookkeeping, with no device to simulate (for
//!   profiling; held memory reads 0).
//! - `--repeat N`: N rounds (default 1), each replaying every stack once on a
//!   fresh stack, interleaved so that drift of the host touches all alike.
//! - `--png OUT.png`: after the timed rounds, one more replay per stack that
//!   reads the held bytes along the way, drawn against the live requested
//!   bytes.
//! - `--calls`: after the timed rounds, one more replay per stack through a
//!   backend that counts every driver call by kind (and times it): a
//!   `calls` line per stack with the counts, the time spent inside driver
//!   calls per operation, and what the counted calls would cost on the
//!   H200 per operation (`notes/vmm-costs.md`; on the simulated device the
//!   counts are deterministic), then the measured time inside each kind
//!   (`us_KIND`, microseconds in all).
//! - `--slack PERCENT`: the cache's [`CacheConfig::slack_percent`](streamalloc::CacheConfig::slack_percent) (how far
//!   over the live high-water mark its arena maps ahead and holds memory;
//!   default 7), to weigh growths against memory held on one trace.
//! - `--max-mapping BYTES`: the cache's
//!   [`CacheConfig::max_mapping_bytes`](streamalloc::CacheConfig::max_mapping_bytes)
//!   (the most one physical allocation of the arena covers; default 1
//!   GiB), to weigh the granularity of giving memory back.
//! - `--no-move`: the cache with
//!   [`CacheConfig::move_memory(false)`](streamalloc::CacheConfig::move_memory)
//!   (pages past the slack target grow instead of taking the holes'
//!   memory), to weigh memory held against driver calls on one trace.
//! - `--sim-drain N`: on `--sim`, run the device's queued work after
//!   every N operations (default 1, as a GPU keeps up with a replay that
//!   launches no kernels); a larger N shows what depends on when the GPU
//!   completes work (the cache's held bytes should not).
//! - `--budget-ratio R`: the `cache-budget` stack's limit, R × the peak
//!   requested (default 1.10).
//! - `--cut N OUT`: writes the first N operations, the blocks they leave live
//!   freed at the end, as gzip CSV (the CI traces of `measure/tests/data/`).
//!
//! One line per stack and round, `key=value` pairs:
//!
//! ```text
//! trace=gpt2_train.ops.csv.gz stack=cache backend=cuda rep=0 ops=18085 ns_per_op=1157.2 ...
//! ```
//!
//! Exits 1 when a stack failed (its line says why), 2 on bad arguments or a
//! bad trace.

use std::path::PathBuf;
use std::process::ExitCode;

use streamalloc::DriverCall;
use streamalloc::gpu::cuda::{CudaGpu, cuda_present};
use streamalloc_measure::trace::plot::{HeldSeries, write_png};
use streamalloc_measure::trace::{
    DeviceKind, Replay, ReplayConfig, Requested, StackKind, Trace, replay_stack,
};

const MIB: f64 = (1u64 << 20) as f64;
/// The simulated device's memory: an H200's (nothing is really allocated).
const SIM_CAPACITY: usize = 140 << 30;
/// Points per held line of the plot.
const PLOT_SAMPLES: usize = 2000;

struct Args {
    trace: PathBuf,
    stacks: Vec<StackKind>,
    sim: bool,
    null: bool,
    sim_capacity: usize,
    repeat: usize,
    png: Option<PathBuf>,
    budget_ratio: f64,
    calls: bool,
    slack: Option<usize>,
    max_mapping: Option<usize>,
    sim_drain: Option<usize>,
    no_move: bool,
    cut: Option<(usize, PathBuf)>,
}

const USAGE: &str = "usage: trace_replay TRACE [--stack resource|cache|cache-budget|all]... \
[--sim | --null] [--sim-capacity BYTES] [--repeat N] [--png OUT.png] [--budget-ratio R] [--calls] [--slack PERCENT] [--max-mapping BYTES] [--sim-drain N] [--no-move] | TRACE --cut N OUT.csv.gz";

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        trace: PathBuf::new(),
        stacks: Vec::new(),
        sim: false,
        null: false,
        sim_capacity: SIM_CAPACITY,
        repeat: 1,
        png: None,
        budget_ratio: ReplayConfig::default().budget_ratio,
        calls: false,
        slack: None,
        max_mapping: None,
        sim_drain: None,
        no_move: false,
        cut: None,
    };
    let mut trace = None;
    fn value<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: `{v}` is not a valid value"))
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--stack" => {
                let names: String = value("--stack", args.next())?;
                for name in names.split(',') {
                    if name == "all" {
                        out.stacks.extend(StackKind::ALL);
                    } else {
                        out.stacks.push(StackKind::from_name(name).ok_or_else(|| {
                            format!("unknown stack `{name}` (resource, cache, cache-budget, all)")
                        })?);
                    }
                }
            }
            "--sim" => out.sim = true,
            "--null" => out.null = true,
            "--calls" => out.calls = true,
            "--no-move" => out.no_move = true,
            "--slack" => out.slack = Some(value("--slack", args.next())?),
            "--max-mapping" => out.max_mapping = Some(value("--max-mapping", args.next())?),
            "--sim-drain" => out.sim_drain = Some(value("--sim-drain", args.next())?),
            "--sim-capacity" => out.sim_capacity = value("--sim-capacity", args.next())?,
            "--repeat" => out.repeat = value("--repeat", args.next())?,
            "--png" => out.png = Some(value("--png", args.next())?),
            "--budget-ratio" => out.budget_ratio = value("--budget-ratio", args.next())?,
            "--cut" => {
                let n = value("--cut", args.next())?;
                out.cut = Some((n, value("--cut", args.next())?));
            }
            "-h" | "--help" => return Err(USAGE.into()),
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            path if trace.is_none() => trace = Some(PathBuf::from(path)),
            extra => return Err(format!("unexpected argument `{extra}`")),
        }
    }
    out.trace = trace.ok_or("no trace given")?;
    if out.stacks.is_empty() {
        out.stacks = vec![StackKind::Resource, StackKind::Cache];
    }
    if out.sim && out.null {
        return Err("--sim and --null exclude each other".into());
    }
    if out.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    if !out.budget_ratio.is_finite() || out.budget_ratio <= 0.0 {
        return Err("--budget-ratio must be positive".into());
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("trace_replay: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let trace = match Trace::read(&args.trace) {
        Ok(trace) => trace,
        Err(e) => {
            eprintln!("trace_replay: {}: {e}", args.trace.display());
            return ExitCode::from(2);
        }
    };
    if let Some((n, out)) = &args.cut {
        let cut = trace.cut(*n);
        return match cut.write_gz(out) {
            Ok(()) => {
                println!("{}: {} operations", out.display(), cut.ops.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("trace_replay: {}: {e}", out.display());
                ExitCode::from(2)
            }
        };
    }
    let backend = match backend(&args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("trace_replay: {e}");
            return ExitCode::from(2);
        }
    };
    let backend_name = match backend {
        DeviceKind::Cuda(_) => "cuda",
        DeviceKind::Sim { .. } => "sim",
        DeviceKind::Null => "null",
    };
    let name = args
        .trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let requested = Requested::of(&trace);
    let mut config = ReplayConfig {
        budget_ratio: args.budget_ratio,
        ..ReplayConfig::default()
    };
    if let Some(bytes) = args.max_mapping {
        config.cache = config.cache.max_mapping_bytes(bytes);
    }
    if args.no_move {
        config.cache = config.cache.move_memory(false);
    }
    if let Some(slack) = args.slack {
        config.cache = config.cache.slack_percent(slack);
    }
    if let Some(every) = args.sim_drain {
        config.sim_drain_every = every;
    }
    let mut failed = false;
    for rep in 0..args.repeat {
        for &stack in &args.stacks {
            let head = format!("trace={name} stack={stack} backend={backend_name} rep={rep}");
            match replay_stack(stack, &backend, &trace, requested.peak, &config) {
                Ok(r) => println!(
                    "{head} ops={} ns_per_op={:.1} control_ns_per_op={:.1} \
                     peak_requested={} ({:.1} MiB) peak_held={} ({:.1} MiB) ratio={:.3} held_at_end={}",
                    r.ops,
                    r.ns_per_op,
                    r.control_ns_per_op,
                    requested.peak,
                    requested.peak as f64 / MIB,
                    r.held.high,
                    r.held.high as f64 / MIB,
                    r.held.high as f64 / requested.peak.max(1) as f64,
                    r.held.current,
                ),
                Err(e) => {
                    failed = true;
                    println!("{head} failed: {e}");
                }
            }
        }
    }
    if args.calls {
        let counting = ReplayConfig {
            count_calls: true,
            ..config
        };
        for &stack in &args.stacks {
            let head = format!("trace={name} stack={stack} backend={backend_name} calls:");
            match replay_stack(stack, &backend, &trace, requested.peak, &counting) {
                Ok(Replay {
                    calls: Some(calls),
                    ops,
                    ns_per_op,
                    ..
                }) => {
                    let ops = ops.max(1) as f64;
                    let in_calls: u64 = DriverCall::ALL.iter().map(|&c| calls.nanos(c)).sum();
                    println!(
                        "{head} {} in_calls_ns_per_op={:.1} h200_model_ns_per_op={:.1} \
                         ns_per_op_counting={ns_per_op:.1} {}",
                        calls.line(),
                        in_calls as f64 / ops,
                        calls.modelled_total_us() * 1e3 / ops,
                        calls.times_line(),
                    );
                }
                Ok(_) => {
                    failed = true;
                    println!("{head} failed: no counts came back");
                }
                Err(e) => {
                    failed = true;
                    println!("{head} failed: {e}");
                }
            }
        }
    }
    if let Some(png) = &args.png {
        config.sample_every = Some(trace.ops.len().div_ceil(PLOT_SAMPLES).max(1));
        let mut runs = Vec::new();
        for &stack in &args.stacks {
            match replay_stack(stack, &backend, &trace, requested.peak, &config) {
                Ok(r) => runs.push((stack, r)),
                Err(e) => {
                    failed = true;
                    println!("plot: stack={stack} failed: {e}");
                }
            }
        }
        let series: Vec<HeldSeries<'_>> = runs
            .iter()
            .map(|(stack, r)| HeldSeries {
                label: format!(
                    "{stack}: held (peak {:.0} MiB, {:.2}x)",
                    r.held.high as f64 / MIB,
                    r.held.high as f64 / requested.peak.max(1) as f64
                ),
                samples: &r.samples,
            })
            .collect();
        let title = format!("{name} on {backend_name}: live requested vs held");
        match write_png(png, &title, &requested, &series) {
            Ok(true) => println!("plot: {}", png.display()),
            Ok(false) => println!(
                "plot: {} (no font found: drawn without text)",
                png.display()
            ),
            Err(e) => {
                failed = true;
                println!("plot failed: {e}");
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn backend(args: &Args) -> Result<DeviceKind, String> {
    let sim = DeviceKind::Sim {
        capacity: args.sim_capacity,
    };
    if args.sim {
        return Ok(sim);
    }
    if args.null {
        return Ok(DeviceKind::Null);
    }
    if !cuda_present() {
        println!("no CUDA driver here: replaying on the simulated device");
        return Ok(sim);
    }
    CudaGpu::open(0)
        .map(DeviceKind::Cuda)
        .map_err(|e| format!("CUDA device 0: {e}"))
}
