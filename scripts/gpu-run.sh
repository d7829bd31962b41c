#!/usr/bin/env bash
# Builds the test, example and bench binaries here (no CUDA toolkit needed:
# cudarc loads libcuda at run time) and copies them into gpu-bin/, an ignored
# folder that the device tool carries to the GPU machine.
#
#   scripts/gpu-run.sh build          # here
#   scripts/gpu-run.sh run [filter]   # there: runs every test binary with --include-ignored
#   scripts/gpu-run.sh sanitize       # there: the CUDA tests under compute-sanitizer, and a planted bug
#   scripts/gpu-run.sh examples       # there: every example on the GPU
#   scripts/gpu-run.sh measure DIR    # there: futures latency, then the allocation table (CSV, PNG) into DIR
#   scripts/gpu-run.sh all DIR        # there: run, examples, measure, sanitize (one device call)
#   scripts/gpu-run.sh traces DIR     # there: the GPT-2 traces through the driver pool, the cache
#                                     # and PyTorch (needs gpu-traces/, see the traces mode;
#                                     # TRACE_ARGS="--slack 10" passes options to trace_replay)
#   scripts/gpu-run.sh service DIR    # there: the inference service three ways (streamalloc,
#                                     # cudarc, cuda-async) and the 10,000 fills row, into DIR
#   scripts/gpu-run.sh subset DIR     # here: what gpu-call.sh runs, into DIR (BIN=DIR there)
#   scripts/gpu-run.sh suites DIR     # here: the CUDA suites, safety_cuda and the examples only (release)
#   scripts/gpu-run.sh host DIR       # here: the pinned host pool's CUDA tests, examples/staging,
#                                     # the host_staging measurement and service_bench (release;
#                                     # with cuda-async when CUDA_TOOLKIT_PATH is set), into DIR
#   scripts/gpu-run.sh host-run DIR   # there: runs them (tests, example, µs per copy table, then
#                                     # the service with real copies, service_bench --staged, into
#                                     # STAGED_OUT, default DIR/staged)
#   scripts/gpu-run.sh sleep DIR      # here: the sleep's CUDA test and examples/sleep (release)
#   scripts/gpu-run.sh sleep-run DIR  # there: runs them (prints sleep/wake times and the baseline)
#   scripts/gpu-call.sh N             # there: a session's whole call (suites, memcheck, traces,
#                                     # service, pairs) packed into $OUT/rN.tgz stage by stage
#
# With CUDA_TOOLKIT_PATH set (the CUDA headers, see scripts/cuda-headers.sh),
# `build` builds the measurement binaries with the cuda-async peer
# (feature peer-cuda-async of streamalloc-measure).
set -euo pipefail
cd "$(dirname "$0")/.."
# cuBLAS (the service benchmark and its test) is loaded at run time.
if [ -d /usr/local/cuda/lib64 ]; then
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# Where the binaries are (another folder can carry a subset).
BIN="${BIN:-gpu-bin}"
case "${1:-build}" in
build)
    rm -rf gpu-bin && mkdir -p gpu-bin
    cargo test --workspace --release --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"] + ("-lib" if m["target"]["kind"] == ["lib"] else "")
        shutil.copy(m["executable"], os.path.join("gpu-bin", "test-" + name))
'
    cargo build -p streamalloc --release --examples --features cublas --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "example" in m["target"]["kind"]:
        shutil.copy(m["executable"], os.path.join("gpu-bin", "example-" + m["target"]["name"]))
'
    # The measurement binaries (measure/src/bin/*), as bin-NAME; with the
    # cuda-async peer when its headers are there.
    peer=()
    if [ -n "${CUDA_TOOLKIT_PATH:-}" ]; then
        peer=(--features streamalloc-measure/peer-cuda-async)
        echo "building the measurement binaries with cuda-async (CUDA_TOOLKIT_PATH=$CUDA_TOOLKIT_PATH)"
    fi
    # A failed build must stop here, not leave an old binary behind.
    cargo build --workspace --release --bins "${peer[@]}" >/dev/null
    cargo build --workspace --release --bins "${peer[@]}" --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bin"]:
        shutil.copy(m["executable"], os.path.join("gpu-bin", "bin-" + m["target"]["name"]))
'
    # Stripped: the tree that travels to the GPU machine is capped at 64 MiB.
    strip gpu-bin/*
    # Which commit the binaries are (scripts/gpu-call.sh prints it there).
    echo "build $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes'), built $(date -u +%FT%TZ)" >gpu-bin/BUILD
    ls -la gpu-bin
    ;;
suites)
    # Here: only the test binaries with GPU tests (test-cuda, every
    # GPU-only test; cache, resource and futures, whose CUDA variants are
    # their ignored tests) and the examples that need no cuBLAS, in
    # release, into DIR (no measurement crate): what a call that checks
    # correctness runs (`BIN=DIR STAGES="safety tests san" scripts/gpu-call.sh N`
    # there).
    dir="${2:?usage: gpu-run.sh suites DIR}"
    rm -rf "$dir" && mkdir -p "$dir"
    tests=(cuda cache resource futures)
    cargo test --release -p streamalloc --no-run "${tests[@]/#/--test=}" --message-format=json 2>/dev/null |
        DIR="$dir" python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], os.path.join(os.environ["DIR"], "test-" + m["target"]["name"]))
'
    examples=(quickstart service pipeline kernel graph adaptor_stack reaper staging sleep)
    cargo build --release -p streamalloc "${examples[@]/#/--example=}" --message-format=json 2>/dev/null |
        DIR="$dir" python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "example" in m["target"]["kind"]:
        shutil.copy(m["executable"], os.path.join(os.environ["DIR"], "example-" + m["target"]["name"]))
'
    strip "$dir"/*
    echo "build $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes'), built $(date -u +%FT%TZ)" >"$dir/BUILD"
    ls "$dir"
    du -sh "$dir"
    ;;
host)
    # Here: what issue 35's pinned host pool runs on the GPU (a few MiB).
    dir="${2:?usage: gpu-run.sh host DIR}"
    rm -rf "$dir" && mkdir -p "$dir"
    cargo test --release -p streamalloc --no-run --test=cuda --message-format=json 2>/dev/null |
        DIR="$dir" python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], os.path.join(os.environ["DIR"], "test-" + m["target"]["name"]))
'
    cargo build --release -p streamalloc --example staging
    cp target/release/examples/staging "$dir/example-staging"
    peer=()
    if [ -n "${CUDA_TOOLKIT_PATH:-}" ]; then peer=(--features peer-cuda-async); fi
    cargo build --release -p streamalloc-measure --bin host_staging --bin service_bench "${peer[@]}"
    cp target/release/host_staging "$dir/bin-host_staging"
    cp target/release/service_bench "$dir/bin-service_bench"
    strip "$dir"/*
    echo "build $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes'), built $(date -u +%FT%TZ)" >"$dir/BUILD"
    ls "$dir"
    du -sh "$dir"
    ;;
host-run)
    # There: the host pool's CUDA tests, the staging example, and the
    # µs-per-copy table (pool vs pinning per request vs pageable).
    dir="${2:?usage: gpu-run.sh host-run DIR}"
    cat "$dir/BUILD"
    status=0
    "$dir/test-cuda" --include-ignored --test-threads=1 host:: || status=1
    timeout 120 "$dir/example-staging" || status=1
    timeout 300 "$dir/bin-host_staging" || status=1
    # The service with real input and output copies: streamalloc through
    # its HostPool beside cudarc and cuda-async with pinned buffers per
    # client, every result checked on the host.
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    timeout 400 "$dir/bin-service_bench" --staged --clients "${STAGED_CLIENTS:-64,1024}" \
        --out "${STAGED_OUT:-$dir/staged}" ${STAGED_ARGS:-} || status=1
    exit $status
    ;;
sleep)
    # Here: what issue 35's sleep and wake runs on the GPU (a few MiB).
    dir="${2:?usage: gpu-run.sh sleep DIR}"
    rm -rf "$dir" && mkdir -p "$dir"
    cargo test --release -p streamalloc --no-run --test=cuda --message-format=json 2>/dev/null |
        DIR="$dir" python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], os.path.join(os.environ["DIR"], "test-" + m["target"]["name"]))
'
    cargo build --release -p streamalloc --example sleep
    cp target/release/examples/sleep "$dir/example-sleep"
    strip "$dir"/*
    echo "build $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes'), built $(date -u +%FT%TZ)" >"$dir/BUILD"
    ls "$dir"
    du -sh "$dir"
    ;;
sleep-run)
    # There: the sleep's CUDA test (its printed times: sleep and wake
    # beside copy out + free and allocate + copy in) and the example.
    dir="${2:?usage: gpu-run.sh sleep-run DIR}"
    cat "$dir/BUILD"
    status=0
    "$dir/test-cuda" --include-ignored --test-threads=1 --nocapture sleep:: || status=1
    timeout 120 "$dir/example-sleep" || status=1
    exit $status
    ;;
subset)
    # The binaries scripts/gpu-call.sh runs, into DIR (gpu-bin is about
    # 100 MiB, over the 64 MiB the device tool carries): run there with
    # BIN=DIR.
    dir="${2:?usage: gpu-run.sh subset DIR}"
    mkdir -p "$dir"
    for f in bin-bench_table bin-service_bench bin-trace_replay BUILD \
        test-{cuda,cache,resource,futures,service_cuda}; do
        cp "gpu-bin/$f" "$dir/"
    done
    du -sh "$dir"
    ;;
run)
    filter="${2:-}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    status=0
    for t in $BIN/test-*; do
        echo "=== $t"
        "$t" --include-ignored --test-threads=1 --nocapture $filter || status=1
    done
    exit $status
    ;;
examples)
    for e in quickstart service pipeline reaper multi_gpu adaptor_stack kernel gemm staging; do
        echo "=== example $e"
        timeout 120 "$BIN/example-$e" || echo "example $e failed: $?"
    done
    ;;
measure)
    dir="${2:-bench-out}"
    mkdir -p "$dir"
    # Three runs: the host's timing moves by tens of percent between
    # processes, so the ratios are read across runs.
    : > "$dir/gpu_latency.txt"
    for run in 1 2 3; do
        echo "=== gpu_latency run $run" | tee -a "$dir/gpu_latency.txt"
        timeout 240 $BIN/bin-gpu_latency 2>&1 | tee -a "$dir/gpu_latency.txt" || true
    done
    echo "=== driver_costs" | tee -a "$dir/gpu_latency.txt"
    timeout 120 $BIN/bin-driver_costs 2>&1 | tee -a "$dir/gpu_latency.txt" || true
    echo "=== buffer_costs (three runs)" | tee "$dir/buffer_costs.txt"
    for run in 1 2 3; do
        timeout 120 $BIN/bin-buffer_costs 2>&1 | tee -a "$dir/buffer_costs.txt" || true
    done
    echo "=== bench_table"
    timeout 240 $BIN/bin-bench_table "$dir" 2>&1 | tee "$dir/bench_table.txt" || true
    python3 measure/scripts/plot_bench.py "$dir/bench_table.csv" "$dir/throughput.png" || true
    ;;
traces)
    # Copies nothing: before the device call, copy the shared traces folder
    # (the two .ops.csv.gz and torch_cpp_replay.py) into gpu-traces/ in the
    # checkout (ignored) and carry it. First one pass of the Rust stacks
    # that counts and times the driver calls by kind and samples held
    # memory for the PNG; then ROUNDS rounds (default 3), each timing the
    # cache twice and PyTorch's caching allocator from C++ twice, one right
    # after the other: the host's speed moves by up to 2x within one call,
    # so each round's ratio compares neighbours
    # (`measure/scripts/trace_ratios.py DIR` prints them). PyTorch's
    # extension compiles on the spot the first time, about a minute. The
    # timed runs, ours and PyTorch's, are pinned to one core (PIN, default
    # core 3, `PIN=` for none), so that both meet the same core's load.
    # TORCH_REPLAY=measure/scripts/torch_slots_replay.py times PyTorch with
    # the same bookkeeping as trace_replay (slots, no hash map).
    # TRACE_NAMES (default "gpt2_infer gpt2_train") names the traces in it.
    dir="${2:-traces-out}"
    pin=""
    if command -v taskset >/dev/null; then pin="taskset -c ${PIN-3}"; fi
    [ -n "${PIN-x}" ] || pin=""
    traces="${TRACES:-gpu-traces}"
    stacks="${STACKS:-resource,cache}"
    mkdir -p "$dir"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    for t in ${TRACE_NAMES:-gpt2_infer gpt2_train}; do
        f="$traces/$t.ops.csv.gz"
        echo "=== $t: streamalloc ($stacks), calls and plot"
        timeout 300 "$BIN/bin-trace_replay" "$f" --stack "$stacks" --calls --png "$dir/$t.png" ${TRACE_ARGS:-} 2>&1 |
            tee "$dir/$t.streamalloc.txt" || echo "trace_replay $t failed"
        : > "$dir/$t.torch.txt"
        for round in $(seq "${ROUNDS:-3}"); do
            echo "=== $t: round $round"
            echo "round=$round" | tee -a "$dir/$t.streamalloc.txt" "$dir/$t.torch.txt" >/dev/null
            timeout 120 $pin "$BIN/bin-trace_replay" "$f" --stack cache --repeat 2 ${TRACE_ARGS:-} 2>&1 |
                tee -a "$dir/$t.streamalloc.txt" || echo "trace_replay $t failed"
            timeout 400 $pin python3 "${TORCH_REPLAY:-$traces/torch_cpp_replay.py}" "$f" 2 2>&1 |
                tee -a "$dir/$t.torch.txt" || echo "torch_cpp_replay $t failed"
        done
    done
    ;;
service)
    # The inference service, three ways in one process (cuda-async only if
    # built with it: the binary says), then the 10,000 fills row. cuBLAS is
    # loaded at run time from the CUDA libraries.
    dir="${2:-service-out}"
    mkdir -p "$dir"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    timeout 500 "$BIN/bin-service_bench" --out "$dir" ${SERVICE_ARGS:-} 2>&1 | tee "$dir/service.txt"
    ;;
all)
    dir="${2:-bench-out}"
    mkdir -p "$dir"
    "$0" run > "$dir/tests.log" 2>&1 && echo "tests: all passed" || echo "tests: FAILURES (see tests.log)"
    grep -E "^=== |test result|FAILED|panicked|^cuda|cuda:" "$dir/tests.log" | grep -v "^test .* ok$" | head -80
    "$0" examples 2>&1 | tee "$dir/examples.log" || true
    "$0" measure "$dir"
    "$0" sanitize 2>&1 | tee "$dir/sanitize.log" || true
    ;;
sanitize)
    # API errors are off: two tests provoke them on purpose (a 1 PiB request,
    # a device that does not exist).
    cs="compute-sanitizer --error-exitcode 86 --report-api-errors no"
    racecheck="$cs --tool memcheck --track-stream-ordered-races all"
    log=$(mktemp)
    check() { # name, then the command; prints the verdict lines and the exit code
        local name=$1 code=0
        shift
        "$@" >"$log" 2>&1 || code=$?
        grep -E "Use-|ERROR SUMMARY|test result|planted" "$log" | head -8
        echo "$name exit: $code"
    }
    echo "=== memcheck (stream-ordered races) over the CUDA tests"
    check memcheck $racecheck $BIN/test-cuda --include-ignored --test-threads=1 resource::
    echo "=== synccheck over the CUDA tests"
    check synccheck $cs --tool synccheck $BIN/test-cuda --include-ignored --test-threads=1 resource::
    echo "=== memcheck (stream-ordered races) over the buffer tests and the kernel example"
    check "buffer memcheck" $racecheck $BIN/test-cuda --include-ignored --test-threads=1 buffer::
    check "kernel memcheck" $racecheck $BIN/example-kernel
    echo "=== planted bug in the kernel example (an escaped address): must be reported (exit 86)"
    check "kernel planted" $racecheck $BIN/example-kernel plant
    echo "=== planted bug: must be reported (exit 86)"
    check "planted bug" $racecheck $BIN/example-planted_race bug
    echo "=== the same through the hooks: must be clean (exit 0)"
    check fixed $racecheck $BIN/example-planted_race fixed
    ;;
esac
