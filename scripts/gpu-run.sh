#!/usr/bin/env bash
# Builds the test, example and bench binaries here (no CUDA toolkit needed:
# cudarc loads libcuda at run time) and copies them into gpu-bin/, an ignored
# folder that the device tool carries to the GPU machine.
#
#   scripts/gpu-run.sh build          # here
#   scripts/gpu-run.sh run [filter]   # there: runs every test binary with --include-ignored
#   scripts/gpu-run.sh sanitize       # there: the CUDA tests under compute-sanitizer, and a planted bug
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-build}" in
build)
    rm -rf gpu-bin && mkdir -p gpu-bin
    cargo test --release --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"] + ("-lib" if m["target"]["kind"] == ["lib"] else "")
        shutil.copy(m["executable"], os.path.join("gpu-bin", "test-" + name))
'
    cargo build --release --examples --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "example" in m["target"]["kind"]:
        shutil.copy(m["executable"], os.path.join("gpu-bin", "example-" + m["target"]["name"]))
'
    ls -la gpu-bin
    ;;
run)
    filter="${2:-}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    status=0
    for t in gpu-bin/test-*; do
        echo "=== $t"
        "$t" --include-ignored --test-threads=1 --nocapture $filter || status=1
    done
    exit $status
    ;;
sanitize)
    # API errors are off: two tests provoke them on purpose (a 1 PiB request,
    # a device that does not exist).
    cs="compute-sanitizer --error-exitcode 86 --report-api-errors no"
    racecheck="$cs --tool memcheck --track-stream-ordered-races all"
    echo "=== memcheck (stream-ordered races) over the CUDA tests"
    $racecheck gpu-bin/test-gpu_cuda --include-ignored --test-threads=1 2>&1 | tail -4 || true
    echo "memcheck exit: ${PIPESTATUS[0]}"
    echo "=== synccheck over the CUDA tests"
    $cs --tool synccheck gpu-bin/test-gpu_cuda --include-ignored --test-threads=1 2>&1 | tail -4 || true
    echo "synccheck exit: ${PIPESTATUS[0]}"
    echo "=== planted bug: must be reported"
    $racecheck gpu-bin/example-planted_race bug 2>&1 | grep -E "Use-|ERROR SUMMARY|planted" | head -8 || true
    echo "planted bug exit: ${PIPESTATUS[0]}"
    echo "=== the same through the hooks: must be clean"
    $racecheck gpu-bin/example-planted_race fixed 2>&1 | grep -E "Use-|ERROR SUMMARY|planted" | head -8 || true
    echo "fixed exit: ${PIPESTATUS[0]}"
    ;;
esac
