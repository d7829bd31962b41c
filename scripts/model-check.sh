#!/usr/bin/env bash
# Model checking of the bookkeeping core with loom: every interleaving (no
# preemption bound unless LOOM_MAX_PREEMPTIONS is set) of the loom models
# that sit next to the code they check (`mod loom_tests`, compiled only
# with `--cfg loom`, in src/resource/stream_ordered/loom_tests.rs,
# src/adaptors/debug_guard/resource.rs, src/adaptors/budget/resource.rs,
# src/cache/arena/kept.rs, src/cache/arena/vmm.rs (the arena's shared
# lock, within three preemptions), src/futures/notifier/loom_tests.rs and
# src/futures/wait_queue.rs).
#
# Builds into its own target dir (the cfg changes every crate's build), in
# release mode; about 40 s on 2 cores from cold, under a second to run.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
# Only the library: the measurement crate has no models and many dependencies.
timeout "${LOOM_TIMEOUT_SECS:-900}" cargo test --release -p streamalloc --lib loom_
