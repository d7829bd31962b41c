#!/usr/bin/env bash
# Builds the futures layer's GPU binaries here and copies them to gpu-bin/
# (ignored by git), for the GPU machine, which has no Rust toolchain:
#
#   bash scripts/gpu-futures.sh build   # here
#   bash scripts/gpu-futures.sh run     # there, from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-build}" in
build)
    mkdir -p gpu-bin
    cargo build --release --example gpu_latency --example service --example pipeline --example reaper
    for e in gpu_latency service pipeline reaper; do cp "target/release/examples/$e" gpu-bin/; done
    t=$(cargo test --release --test futures_cuda --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*futures_cuda[^"]*\)".*/\1/p' | tail -1)
    cp "$t" gpu-bin/futures_cuda
    b=$(cargo bench --bench futures --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*deps\/futures-[^"]*\)".*/\1/p' | tail -1)
    cp "$b" gpu-bin/bench_futures
    ls -l gpu-bin
    ;;
run)
    nvidia-smi -L || true
    ./gpu-bin/futures_cuda --include-ignored --test-threads=1
    ./gpu-bin/gpu_latency
    ./gpu-bin/service
    ./gpu-bin/pipeline
    ./gpu-bin/reaper
    ./gpu-bin/bench_futures --bench --warm-up-time 1 --measurement-time 3
    ;;
*) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
