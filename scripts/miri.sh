#!/usr/bin/env bash
# Miri over the simulated device, the resource bookkeeping, and (phase 2) the
# futures, adaptor and cache suites. No CUDA: the cudarc backend loads
# libcuda at run time, which Miri cannot do, and no test run here touches it.
# Needs the nightly toolchain with miri:
#   rustup component add --toolchain nightly miri rust-src
# Proptest is cut to 4 cases and the stress tests to 1 s (Miri is ~100x
# slower); tests that only repeat work (thousands of resources, soak loops)
# are `#[cfg_attr(miri, ignore)]`. Isolation is off because proptest reads the
# working directory and the stress and futures tests the clock.
#   scripts/miri.sh          both phases (about 25 minutes on 2 cores)
#   scripts/miri.sh core     phase 1 only (sim, resource; about 10 minutes)
#   scripts/miri.sh layers   phase 2 only (futures, adaptors, cache)
set -euo pipefail
cd "$(dirname "$0")/.."
phase="${1:-all}"
export PROPTEST_CASES=4 STREAMALLOC_SOAK_SECS=1
export MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-disable-isolation"
if [ "$phase" = all ] || [ "$phase" = core ]; then
  cargo +nightly miri test --lib -- sim:: resource:: cache::
  cargo +nightly miri test --no-fail-fast \
    --test smoke --test resource --test bad_input --test model --test sim_regressions --test stress \
    --test fault_sweep --test hostile_input
fi
if [ "$phase" = all ] || [ "$phase" = layers ]; then
  cargo +nightly miri test --no-fail-fast \
    --test compose --test panics --test cache \
    --test adaptor_budget --test adaptor_debug_guard --test adaptor_retry --test adaptor_stats \
    --test futures_alloc --test futures_event --test futures_drop
fi
