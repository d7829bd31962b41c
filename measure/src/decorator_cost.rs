//! What the decorators add to a pair, measured so that two builds (or two
//! hosts) can be told apart: `bench_table --decorators [ROUNDS [PAIRS]]`.
//!
//! The question is issue 31's: how many nanoseconds Budget + Stats +
//! Tracing (no subscriber) add to an allocate + free pair of the
//! stream-ordered resource on the null backend, and what the same stack
//! costs over the cache against the cache's own pair. A difference of a few
//! tens of nanoseconds between two loops of some 100 ns each is lost in a
//! table of single runs (a run of the resource's pair moves by 1.5× from
//! one to the next on a shared machine), so this mode runs the four loops
//! (the resource, the stack over it, the cache, the stack over the cache)
//! interleaved, round after round, and compares like with like:
//!
//! - **best minus best**: each loop's fastest round, the one the machine
//!   disturbed least; the steadiest figure a loaded machine gives.
//! - **median minus median**: what a typical round costs.
//!
//! Each round times every loop once, in an order that alternates from one
//! round to the next (forward, then backward), so that a drift of the
//! machine's speed over a round weighs on both sides of each comparison
//! alike. A warm-up round, not counted, comes first.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant;

use streamalloc::gpu::Gpu;
use streamalloc::{CacheConfig, DeviceMemoryResource, ResourceBuilder, StreamId};

use crate::support::{self, Bench, NullGpu};

/// Rounds of `--decorators` when none are given.
pub const DEFAULT_ROUNDS: usize = 15;
/// Pairs per loop and round of `--decorators` when none are given.
pub const DEFAULT_PAIRS: usize = 200_000;
/// The sizes measured: the table's middle size first, then its smallest.
pub const SIZES: [(usize, &str); 2] = [(64 << 10, "64 KiB"), (256, "256 B")];
/// The sizes measured on a GPU: the allocation table's three.
pub const CUDA_SIZES: [(usize, &str); 3] =
    [(256, "256 B"), (64 << 10, "64 KiB"), (4 << 20, "4 MiB")];
/// Pairs per loop and round on a GPU when none are given (a driver pair
/// takes about ten times the null backend's).
pub const DEFAULT_CUDA_PAIRS: usize = 20_000;

/// How many rounds of how many pairs: `--decorators [ROUNDS [PAIRS]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Rounds counted (after one warm-up round).
    pub rounds: usize,
    /// Pairs of each loop in each round.
    pub pairs: usize,
}

impl Plan {
    /// The plan the arguments after `--decorators` name: none for the
    /// defaults, ROUNDS, or ROUNDS and PAIRS (each at least 1).
    ///
    /// # Errors
    /// A message naming the argument that is not a positive count, or the
    /// first argument too many.
    pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<Plan, String> {
        let mut args = args.into_iter();
        let mut count = |what: &str, default: usize| match args.next() {
            None => Ok(default),
            Some(arg) => match arg.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "--decorators: {what} must be a count above 0, not {arg:?}"
                )),
            },
        };
        let plan = Plan {
            rounds: count("ROUNDS", DEFAULT_ROUNDS)?,
            pairs: count("PAIRS", DEFAULT_PAIRS)?,
        };
        match args.next() {
            None => Ok(plan),
            Some(extra) => Err(format!(
                "--decorators takes [ROUNDS [PAIRS]], not the extra {extra:?}"
            )),
        }
    }
}

/// The best and the median of one loop's rounds, in ns per pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The fastest round.
    pub best: f64,
    /// The median round (of an even count, the mean of the middle two).
    pub median: f64,
}

impl Summary {
    /// The summary of `rounds` (ns per pair each); `None` for no rounds.
    pub fn of(rounds: &[f64]) -> Option<Summary> {
        let mut sorted = rounds.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Some(Summary {
            best: sorted[0],
            median,
        })
    }

    /// What `self` adds over `base`: best minus best, median minus median.
    pub fn over(self, base: Summary) -> Summary {
        Summary {
            best: self.best - base.best,
            median: self.median - base.median,
        }
    }

    /// `self` over `base`, best over best and median over median.
    pub fn ratio(self, base: Summary) -> Summary {
        Summary {
            best: self.best / base.best,
            median: self.median / base.median,
        }
    }
}

/// One size's four summaries.
#[derive(Debug, Clone, Copy)]
pub struct SizeResult {
    /// The size's label.
    pub label: &'static str,
    /// The stream-ordered resource's pair.
    pub resource: Summary,
    /// Budget + Stats + Tracing over the resource.
    pub stack: Summary,
    /// The cache's pair.
    pub cache: Summary,
    /// Budget + Stats + Tracing over the cache.
    pub stack_cache: Summary,
}

/// Nanoseconds per pair of `pairs` pairs of `bytes` on `r`.
fn time_loop<R: DeviceMemoryResource>(r: &R, stream: StreamId, bytes: usize, pairs: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..pairs {
        Bench::<NullGpu>::pair(r, stream, black_box(bytes));
    }
    t0.elapsed().as_nanos() as f64 / pairs as f64
}

/// Measures one size on `bench`'s device (the null backend, or a GPU).
fn measure_size<G: Gpu>(
    bench: &Bench<G>,
    plan: Plan,
    bytes: usize,
    label: &'static str,
) -> SizeResult {
    let s0 = bench.stream(0);
    // The stacks of `bench_table`'s rows and of `--profile-stack` and
    // `--profile-stack-cache` (no tracing subscriber is installed).
    let stack = ResourceBuilder::new()
        .budget(&streamalloc::Budget::new(1 << 60))
        .stats()
        .tracing()
        .build(bench.resource.clone());
    let stack_cache = ResourceBuilder::new()
        .budget(&streamalloc::Budget::new(1 << 60))
        .stats()
        .tracing()
        .cache(CacheConfig::default())
        .build(bench.resource.clone());
    let cache = &*bench.cache;
    let resource = &*bench.resource;
    let mut rounds: [Vec<f64>; 4] = Default::default();
    for round in 0..=plan.rounds {
        let mut order = [0, 1, 2, 3];
        if round % 2 == 1 {
            order.reverse();
        }
        for which in order {
            let ns = match which {
                0 => time_loop(resource, s0, bytes, plan.pairs),
                1 => time_loop(&stack, s0, bytes, plan.pairs),
                2 => time_loop(cache, s0, bytes, plan.pairs),
                _ => time_loop(&stack_cache, s0, bytes, plan.pairs),
            };
            // Nothing piles up between loops: the frees drain (through the
            // budget, which settles) before the next loop starts.
            bench.sync();
            stack
                .reap_pending()
                .expect("the null backend's reap succeeds");
            // Round 0 warms up: caches, branch predictors, the arena.
            if round > 0 {
                rounds[which].push(ns);
            }
        }
    }
    let summary = |r: &[f64]| Summary::of(r).expect("at least one round");
    SizeResult {
        label,
        resource: summary(&rounds[0]),
        stack: summary(&rounds[1]),
        cache: summary(&rounds[2]),
        stack_cache: summary(&rounds[3]),
    }
}

/// Runs `plan` for every size of [`SIZES`] on the null backend.
pub fn measure(plan: Plan) -> Vec<SizeResult> {
    let null = support::null();
    SIZES
        .iter()
        .map(|&(bytes, label)| measure_size(&null, plan, bytes, label))
        .collect()
}

/// Runs `plan` for every size of [`CUDA_SIZES`] on `gpu` (a real device,
/// whose driver pair the decorators are read against: issue 31's "the
/// stack is at most 1.3x the resource it wraps").
pub fn measure_on<G: Gpu>(gpu: &Bench<G>, plan: Plan) -> Vec<SizeResult> {
    CUDA_SIZES
        .iter()
        .map(|&(bytes, label)| measure_size(gpu, plan, bytes, label))
        .collect()
}

/// The report: per size, each loop's best and median, and what the stack
/// adds to the resource and to the cache; `backend` names the device.
pub fn report(plan: Plan, backend: &str, results: &[SizeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "what Budget+Stats+Tracing (no subscriber) add to a pair, {backend}, one thread:\n\
         {} rounds (after a warm-up) of {} pairs per loop, the loops interleaved\n",
        plan.rounds, plan.pairs
    );
    let _ = writeln!(
        out,
        "{:<7} {:<35} {:>10} {:>10}",
        "size", "ns per pair", "best", "median"
    );
    let _ = writeln!(out, "{}", "-".repeat(65));
    for r in results {
        let mut row = |name: &str, s: Summary, unit: &str, digits: usize| {
            let _ = writeln!(
                out,
                "{:<7} {:<35} {:>9.digits$}{unit} {:>9.digits$}{unit}",
                r.label, name, s.best, s.median
            );
        };
        row("StreamOrderedResource", r.resource, " ", 1);
        row("Budget+Stats+Tracing over it", r.stack, " ", 1);
        row(
            "  added to the resource's pair",
            r.stack.over(r.resource),
            " ",
            1,
        );
        row(
            "  the stack / the resource",
            r.stack.ratio(r.resource),
            "x",
            2,
        );
        row("CachingResource", r.cache, " ", 1);
        row("Budget+Stats+Tracing over the cache", r.stack_cache, " ", 1);
        row(
            "  added to the cache's pair",
            r.stack_cache.over(r.cache),
            " ",
            1,
        );
        row(
            "  the stack / the cache",
            r.stack_cache.ratio(r.cache),
            "x",
            2,
        );
    }
    out.push_str(
        "\nadded: best minus best, median minus median (ns per pair); \
         x: the stack over the cache's pair / the cache's alone.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_arguments_take_the_defaults_and_counts_override_them() {
        let defaults = Plan {
            rounds: DEFAULT_ROUNDS,
            pairs: DEFAULT_PAIRS,
        };
        assert_eq!(Plan::parse([]), Ok(defaults));
        assert_eq!(
            Plan::parse(["3"]),
            Ok(Plan {
                rounds: 3,
                ..defaults
            })
        );
        assert_eq!(
            Plan::parse(["3", "1000"]),
            Ok(Plan {
                rounds: 3,
                pairs: 1000
            })
        );
    }

    #[test]
    fn a_count_that_is_not_positive_or_an_extra_argument_is_refused() {
        for args in [
            &["0"][..],
            &["x"],
            &["3", "0"],
            &["3", "-5"],
            &["3", "4", "5"],
        ] {
            let refused = Plan::parse(args.iter().copied());
            assert!(refused.is_err(), "{args:?} gave {refused:?}");
        }
        let message = Plan::parse(["3", "4", "5"]).unwrap_err();
        assert!(message.contains("\"5\""), "{message}");
    }

    #[test]
    fn the_summary_is_the_best_and_the_median_and_differences_pair_them() {
        let odd = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((odd.best, odd.median), (1.0, 3.0));
        let even = Summary::of(&[4.0, 10.0, 2.0, 6.0]).unwrap();
        assert_eq!((even.best, even.median), (2.0, 5.0));
        assert_eq!(Summary::of(&[]), None);
        let added = even.over(odd);
        assert_eq!((added.best, added.median), (1.0, 2.0));
        let ratio = even.ratio(odd);
        assert_eq!((ratio.best, ratio.median), (2.0, 5.0 / 3.0));
    }
}
