//! The cache's memory ratio on traces it was never tuned on: the recorded
//! GPT-2 cuts scaled to half and twice their sizes, and the synthetic
//! shapes of [`synthetic`] (a ramp, a sawtooth of large blocks, layered
//! passes at varying batch, many streams, a spike after a plateau, a long
//! churn of small blocks, key/value caches grown on four streams),
//! replayed on the simulated device (manual progress: the held bytes are
//! the same at every run, so these bound a deterministic figure). Two of
//! them are known gaps, bound where they are (each test says why).
//!
//! Each test also prints the driver calls of the replay, so that a change
//! of policy shows what it costs in growths of the arena.

mod common;

use common::{SIM, cut};
use streamalloc::DriverCall;
use streamalloc_measure::trace::{
    ReplayConfig, Requested, StackKind, Trace, replay_stack, synthetic,
};

/// Issue 13's target for the default cache, on every trace.
const TARGET: f64 = 1.10;
const MIB: usize = 1 << 20;

/// Replays `trace` through the default cache and checks its ratio against
/// the target.
fn check(name: &str, trace: &Trace) {
    check_within(name, trace, TARGET);
}

/// Replays `trace` through the default cache and checks its ratio against
/// `bound`.
fn check_within(name: &str, trace: &Trace, bound: f64) {
    let requested = Requested::of(trace);
    let config = ReplayConfig {
        count_calls: true,
        ..ReplayConfig::default()
    };
    let replay = replay_stack(StackKind::Cache, &SIM, trace, requested.peak, &config)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let ratio = replay.held.high as f64 / requested.peak as f64;
    let calls = replay.calls.expect("counted");
    println!(
        "{name}: ops={} peak_requested={:.0} MiB ratio={ratio:.4} growths={} unmaps={} {}",
        trace.ops.len(),
        requested.peak as f64 / MIB as f64,
        calls.count(DriverCall::MemCreate),
        calls.count(DriverCall::MemUnmap),
        calls.line(),
    );
    assert!(ratio >= 1.0, "{name}: ratio {ratio} below 1");
    assert!(
        ratio <= bound,
        "{name}: peak held is {ratio:.4}x the peak requested, above {bound}"
    );
}

#[test]
fn gpt2_cuts_scaled_to_half_and_twice_their_sizes() {
    for name in ["gpt2_infer", "gpt2_train"] {
        let trace = cut(name);
        for factor in [0.5, 2.0] {
            check(
                &format!("{name}x{factor}"),
                &synthetic::scaled(&trace, factor),
            );
        }
    }
}

#[test]
fn a_pure_growth_ramp() {
    check("ramp", &synthetic::ramp(11, 6 << 30));
}

/// A known gap: 1.209×, the target missed. Half of each phase's blocks
/// stay live at random places and the next phase's larger blocks fit none
/// of the holes: the pages live blocks touch stay within 1.01× of the live
/// bytes, but no placement that leaves blocks where they are holds less
/// than 1.21× here (1.21–1.48× with other seeds), and the holes' mappings
/// each span blocks that stay live, so none goes back whole. Moving the
/// holes' memory where the new blocks go (`arena/vmm.rs`,
/// `alias_unbacked`) brought it to 1.0755× on the simulator by mapping
/// parts of handles, but the H100's driver refuses `cuMemMap` at a
/// non-zero offset (2026-12-06): only whole handles move, which none of
/// these holes is. The driver's pool held 1.12× on the H100.
/// `notes/fragmentation-floors.md`, "Moving memory by mapping it again".
#[test]
fn a_sawtooth_of_large_blocks() {
    check_within("sawtooth", &synthetic::sawtooth(12, 12, 4 << 30), 1.21);
}

/// The same shape on other seeds (the H100's pool: 1.237×, 1.113× and
/// 1.125× on seeds 1, 2 and 100): a change that helps the test's seed by
/// luck may hurt the shape. Each bound is the seed's figure today, rounded
/// up; the H100 held the same bytes as the simulator on seeds 12, 100 and
/// 103 (its other two figures, 1.424× and 1.281×, came from a build that
/// tried maps the driver refused).
#[test]
fn a_sawtooth_of_large_blocks_on_other_seeds() {
    for (seed, bound) in [
        (1, 1.46),
        (2, 1.34),
        (100, 1.43),
        (101, 1.31),
        (102, 1.29),
        (103, 1.25),
    ] {
        check_within(
            &format!("sawtooth({seed})"),
            &synthetic::sawtooth(seed, 12, 4 << 30),
            bound,
        );
    }
}

#[test]
fn layered_passes_at_a_varying_batch() {
    check("layered", &synthetic::layered(13, 24, 40));
}

/// A known gap: 1.168×, the target missed. The eight streams here peak at
/// different times (their peaks add up to 1.83× the trace's peak), and
/// churn blocks of random sizes. With an arena per stream it held 1.58×
/// (whole idle pages moved between streams), then 1.27× (free ranges lent
/// in place); one arena shared by all streams, free neighbours merged
/// whoever freed them, brought it to 1.145×, and preferring memory a
/// stream may use without a GPU-side wait on another stream to 1.18–1.20×
/// (where a fence seen complete counted as "usable as it is", so the
/// figure moved with the GPU's timing: 1.13–1.20× as the simulated GPU
/// ran its work every 1 to 1,024 operations). Placement that ignores
/// fences (`arena/vmm.rs`, "Decisions the GPU's timing does not change")
/// holds 1.168×, the same whether the simulated GPU runs its work after
/// every operation or every four (1.153× when the first look for memory
/// this stream may use as it is also tried windows without memory in
/// other streams' ranges, at twice the time per operation on the null
/// backend). What is left is the churn's own
/// fragmentation: one stream of such churn holds 1.20×, and no placement
/// that leaves blocks where they are holds under about 1.15× on it
/// (`notes/fragmentation-floors.md`). The bound keeps it from getting
/// worse.
#[test]
fn many_streams_churning() {
    check_within(
        "many_streams",
        &synthetic::many_streams(14, 8, 48, 40_000),
        1.17,
    );
}

#[test]
fn a_spike_after_a_plateau() {
    check(
        "plateau_then_spike",
        &synthetic::plateau_then_spike(15, 20_000, 3 << 30),
    );
}

/// A known gap: 1.21×, the target missed (the same before the arena grew
/// ahead). Blocks of 4 KiB to 4 MiB, about 512 MiB live, freed at random
/// for 20,000 operations: the free space ends up in holes smaller than the
/// next large block, and a page stays held while any live block touches
/// it, so the arena grows at its end while the holes stay mapped. Even
/// giving back every page no live block touches, at once, no placement
/// that leaves blocks where they are holds less than about 1.15× on this
/// shape with 2 MiB pages (`notes/fragmentation-floors.md`). The bound
/// keeps it from getting worse.
#[test]
fn a_long_churn_of_small_blocks() {
    check_within("churn", &synthetic::plateau_then_spike(16, 20_000, 0), 1.25);
}

/// Four requests served at once, one per stream, each growing a key and
/// a value cache per layer by a token a step as `torch.cat` does (the
/// grown copy allocated, then the old one freed), while the other streams
/// grow theirs and requests end and start at random (the pattern issue 33
/// names in its Llama-style serving trace). 1.083×: the old copies, freed
/// among temporaries whose sizes repeat, were kept out of the arena by
/// each stream and held 1.125× (1.106–1.152× on seeds 18–21), where a
/// best fit over one address range blind to streams (`placement_floor.py`)
/// reaches 1.06–1.12×; a block is now kept only if its size was asked for
/// lately (`arena/kept.rs`, `notes/fragmentation-floors.md`).
#[test]
fn kv_caches_grown_on_four_streams_at_once() {
    check("kv_serving", &synthetic::kv_serving(18, 4, 12, 16));
}

/// The simulated replay's figure does not hang on when the simulated GPU
/// runs its work: eight streams churning hold the same peak whether the
/// device runs after every operation or every third (a GPU a little
/// behind the host). Fails where a fence seen complete changes where a
/// block goes (`arena/vmm.rs`, "Decisions the GPU's timing does not
/// change").
#[test]
fn many_streams_hold_the_same_whatever_the_gpus_lag() {
    let trace = synthetic::many_streams(17, 8, 32, 12_000);
    let peak = Requested::of(&trace).peak;
    let held = |every: usize| {
        let config = ReplayConfig {
            sim_drain_every: every,
            ..ReplayConfig::default()
        };
        let replay = replay_stack(StackKind::Cache, &SIM, &trace, peak, &config).unwrap();
        replay.held.high
    };
    let (keeping_up, lagging) = (held(1), held(3));
    println!(
        "many_streams(17): {:.4} drained every operation, {:.4} every third",
        keeping_up as f64 / peak as f64,
        lagging as f64 / peak as f64
    );
    assert_eq!(keeping_up, lagging);
}
