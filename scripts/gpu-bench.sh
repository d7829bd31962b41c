#!/usr/bin/env bash
# Allocation benchmarks on the GPU machine, from binaries built here.
#
# The GPU machine has the CUDA driver but no Rust toolchain, so the
# benchmarks are built on this machine and carried over in gpu-bin/
# (ignored by git):
#
#   scripts/gpu-bench.sh build        # here: builds, copies into gpu-bin/
#   scripts/gpu-bench.sh run [OUT]    # there: runs them, writes OUT/
#
# `run` prints the one-table comparison (examples/bench_table.rs), writes
# OUT/bench_table.{txt,csv}, plots OUT/throughput.png when python3 has
# matplotlib, and with CRITERION=1 also runs the criterion bench
# (benches/alloc.rs, about two minutes) into OUT/criterion.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=gpu-bin

case "${1:-run}" in
build)
    cargo build --release --example bench_table
    exe=$(cargo bench --bench alloc --no-run 2>&1 |
        grep -m1 -o 'target/release/deps/alloc-[0-9a-f]*')
    mkdir -p "$BIN"
    cp target/release/examples/bench_table "$BIN/bench_table"
    cp "$exe" "$BIN/alloc_bench"
    ls -l "$BIN"
    ;;
run)
    OUT=${2:-${OUT:-bench-out}}
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
        tee "$OUT/gpu.txt" || true
    "$BIN/bench_table" "$OUT" | tee "$OUT/bench_table.log"
    if python3 -c 'import matplotlib' 2>/dev/null; then
        python3 scripts/plot_bench.py "$OUT/bench_table.csv" "$OUT/throughput.png"
    else
        echo "no matplotlib: skipping the plot (the CSV is in $OUT)"
    fi
    if [ "${CRITERION:-0}" = 1 ]; then
        CRITERION_HOME="$OUT/criterion" "$BIN/alloc_bench" --bench --noplot |
            tee "$OUT/criterion.log"
    fi
    ;;
*)
    echo "usage: $0 build | run [OUT_DIR]" >&2
    exit 2
    ;;
esac
