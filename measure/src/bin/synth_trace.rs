//! Writes one of the synthetic traces of `tests/trace_unseen.rs` as a trace
//! file (gzip CSV, the format of `measure/traces/README.md`), so that it
//! can be replayed on CUDA with `trace_replay` and read by other tools
//! (`measure/scripts/placement_floor.py`).
//!
//! ```text
//! synth_trace SHAPE [--seed N] OUT.csv.gz
//! ```
//!
//! `SHAPE` is one of `ramp`, `sawtooth`, `layered`, `many_streams`,
//! `plateau_then_spike`, `churn`, `kv_serving`, built with the sizes of the test of that
//! name; `--seed` picks another seed than the test's (the same shape, other
//! sizes and orders). Exits 2 on bad arguments, 1 when the file cannot be
//! written.

use std::process::ExitCode;

use streamalloc_measure::trace::{Trace, synthetic};

/// A shape's generator, with the test's sizes, from a seed.
type Generator = fn(u64) -> Trace;

/// The shapes: name, the test's seed, and the generator.
const SHAPES: [(&str, u64, Generator); 7] = [
    ("ramp", 11, |s| synthetic::ramp(s, 6 << 30)),
    ("sawtooth", 12, |s| synthetic::sawtooth(s, 12, 4 << 30)),
    ("layered", 13, |s| synthetic::layered(s, 24, 40)),
    ("many_streams", 14, |s| {
        synthetic::many_streams(s, 8, 48, 40_000)
    }),
    ("plateau_then_spike", 15, |s| {
        synthetic::plateau_then_spike(s, 20_000, 3 << 30)
    }),
    ("churn", 16, |s| synthetic::plateau_then_spike(s, 20_000, 0)),
    ("kv_serving", 18, |s| synthetic::kv_serving(s, 4, 12, 16)),
];

const USAGE: &str = "usage: synth_trace SHAPE [--seed N] OUT.csv.gz \
    (SHAPE: ramp, sawtooth, layered, many_streams, plateau_then_spike, churn, kv_serving)";

/// The shape's generator, the seed and the output path, from the arguments.
fn parse(args: &[String]) -> Result<(Generator, u64, &str), String> {
    let mut seed = None;
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--seed" {
            let value = it.next().ok_or("--seed needs a value")?;
            seed = Some(
                value
                    .parse::<u64>()
                    .map_err(|e| format!("--seed {value}: {e}"))?,
            );
        } else if arg.starts_with("--") {
            return Err(format!("unknown option {arg}"));
        } else {
            positional.push(arg.as_str());
        }
    }
    let [shape, out] = positional[..] else {
        return Err("expected SHAPE and OUT.csv.gz".into());
    };
    let (_, test_seed, make) = SHAPES
        .iter()
        .find(|(name, _, _)| *name == shape)
        .ok_or_else(|| format!("unknown shape {shape}"))?;
    Ok((*make, seed.unwrap_or(*test_seed), out))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (make, seed, out) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("synth_trace: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let trace = make(seed);
    if let Err(e) = trace.write_gz(out) {
        eprintln!("synth_trace: {out}: {e}");
        return ExitCode::from(1);
    }
    println!(
        "wrote {out}: {} ops, {} streams, seed {seed}",
        trace.ops.len(),
        trace.streams
    );
    ExitCode::SUCCESS
}
