#!/usr/bin/env bash
# Miri over the simulated device and the resource bookkeeping (no CUDA: the
# cudarc backend loads libcuda at run time, which Miri cannot do, and no test
# run here touches it). Needs the nightly toolchain with miri:
#   rustup component add --toolchain nightly miri rust-src
# Unit tests of sim:: and resource::, then the integration suites that run on
# SimGpu, with proptest cut to 4 cases and the stress test to 1 s (Miri is
# ~100x slower). Isolation is off because proptest reads the working
# directory and the stress test the clock. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo +nightly miri test --lib -- sim:: resource::
PROPTEST_CASES=4 STREAMALLOC_SOAK_SECS=1 MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-disable-isolation" \
  cargo +nightly miri test --no-fail-fast \
  --test smoke --test resource --test bad_input --test model --test sim_regressions --test stress \
  --test fault_sweep
