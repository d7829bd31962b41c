//! The memory ratio of the stacks on cuts of the real GPT-2 traces, replayed
//! on the simulated device (manual progress: the same held bytes at every
//! run, so these are bounds on a deterministic figure, not timing tests).
//!
//! The cuts in `tests/data/` are the first 50,000 operations of each trace of
//! `measure/traces/` (gpt2_train has 18,085: all of it), the blocks left
//! live freed at the end, made with
//! `trace_replay TRACE --cut 50000 OUT.csv.gz`.

mod common;

use common::{SIM, cut};
use streamalloc_measure::trace::{ReplayConfig, Requested, StackKind, Trace, replay_stack};

/// What the caching tier must reach (issue 13): peak held at most 1.10× the
/// peak live requested bytes, on every trace. The virtual-memory arena holds
/// 1.07× on both (slack 7%).
const CACHE_TARGET: f64 = 1.10;
const CACHE_BOUND_INFER: f64 = CACHE_TARGET;
const CACHE_BOUND_TRAIN: f64 = CACHE_TARGET;
/// The resource alone on the simulated device holds what is live, rounded
/// up to 256-byte granules (the simulator does not model the driver's
/// chunked reservations, which make it 1.40× on the H200).
const RESOURCE_BOUND: f64 = 1.001;

/// Peak held over peak requested of `stack` on `trace`.
fn ratio(trace: &Trace, stack: StackKind) -> f64 {
    let requested = Requested::of(trace);
    let replay = replay_stack(stack, &SIM, trace, requested.peak, &ReplayConfig::default())
        .unwrap_or_else(|e| panic!("{stack}: {e}"));
    assert_eq!(replay.ops, trace.ops.len());
    replay.held.high as f64 / requested.peak as f64
}

fn check(name: &str, stack: StackKind, bound: f64) {
    let trace = cut(name);
    let ratio = ratio(&trace, stack);
    println!("{name} {stack}: peak held / peak requested = {ratio:.4} (bound {bound})");
    // Below 1 would mean held memory is not read where the blocks live.
    assert!(ratio >= 1.0, "{name} {stack}: ratio {ratio} below 1");
    assert!(
        ratio <= bound,
        "{name} {stack}: peak held is {ratio:.4}x the peak requested, above the bound {bound}"
    );
}

#[test]
fn cache_ratio_on_gpt2_infer() {
    check("gpt2_infer", StackKind::Cache, CACHE_BOUND_INFER);
}

#[test]
fn cache_ratio_on_gpt2_train() {
    check("gpt2_train", StackKind::Cache, CACHE_BOUND_TRAIN);
}

#[test]
fn resource_ratio_on_gpt2_infer() {
    check("gpt2_infer", StackKind::Resource, RESOURCE_BOUND);
}

#[test]
fn resource_ratio_on_gpt2_train() {
    check("gpt2_train", StackKind::Resource, RESOURCE_BOUND);
}

#[test]
fn the_cut_files_are_the_traces_first_operations_completed() {
    let infer = cut("gpt2_infer");
    let train = cut("gpt2_train");
    // 50,000 operations, then one free per block still live.
    assert!(infer.ops.len() > 50_000, "{}", infer.ops.len());
    assert_eq!(train.ops.len(), 18_086, "the whole trace and one free");
    assert_eq!((infer.streams, train.streams), (1, 2));
    for trace in [&infer, &train] {
        let requested = Requested::of(trace);
        assert_eq!(requested.after.last(), Some(&0), "everything is freed");
    }
}

#[test]
fn simulated_ratios_are_the_same_at_every_run() {
    let trace = cut("gpt2_train");
    let first = ratio(&trace, StackKind::Cache);
    let second = ratio(&trace, StackKind::Cache);
    assert_eq!(first.to_bits(), second.to_bits());
}

#[test]
fn cache_under_a_budget_of_the_target_stays_inside_it_on_both_traces() {
    // The budget is charged for what the cache takes from the device, so
    // held memory stays under the limit, and the cache gives idle memory
    // back instead of failing.
    let ratio_limit = ReplayConfig::default().budget_ratio;
    for name in ["gpt2_infer", "gpt2_train"] {
        check(name, StackKind::CacheBudget, ratio_limit);
    }
}

/// The training trace's cost is its growths of the arena (about 60 µs each
/// on the H200, `notes/vmm-costs.md`): 142 with growths of at most the
/// block's size again, 56 with geometric steps up to the slack. A count on
/// the simulated device is deterministic, so this bounds a figure, not a
/// time. Nothing is unmapped during the replay: no memory churns between
/// idle and new.
#[test]
fn the_training_trace_grows_the_arena_in_few_steps() {
    use streamalloc::DriverCall;
    let trace = cut("gpt2_train");
    let requested = Requested::of(&trace);
    let config = ReplayConfig {
        count_calls: true,
        ..ReplayConfig::default()
    };
    let replay = replay_stack(StackKind::Cache, &SIM, &trace, requested.peak, &config).unwrap();
    let calls = replay.calls.expect("counted");
    println!("gpt2_train cache: {}", calls.line());
    let growths = calls.count(DriverCall::MemCreate);
    assert!(growths <= 64, "{growths} growths of the arena");
    assert_eq!(calls.count(DriverCall::MemMap), growths, "one mapping each");
    assert_eq!(calls.count(DriverCall::MemUnmap), 0);
    assert_eq!(calls.count(DriverCall::MemRelease), 0);
}
