//! What the trace tests share: the simulated device they replay on and the
//! cuts of recorded traces in `tests/data/`.

use streamalloc_measure::trace::{DeviceKind, Trace};

/// A simulated device larger than any trace's peak (an H200's 140 GiB).
pub const SIM: DeviceKind = DeviceKind::Sim {
    capacity: 140 << 30,
};

/// The cut `tests/data/{name}.first50k.csv.gz`: a recorded trace's first
/// 50,000 operations, the blocks left live freed at the end
/// (`trace_replay TRACE --cut 50000 OUT.csv.gz`).
pub fn cut(name: &str) -> Trace {
    cut_of(name, "first50k")
}

/// `name`'s cut `which` (`first200k`: its first 200,000 operations), from
/// `tests/data/{name}.{which}.csv.gz`.
pub fn cut_of(name: &str, which: &str) -> Trace {
    let path = format!(
        "{}/tests/data/{name}.{which}.csv.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}
