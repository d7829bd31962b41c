#!/usr/bin/env bash
# Builds the test, example and bench binaries here (no CUDA toolkit needed:
# cudarc loads libcuda at run time) and copies them into gpu-bin/, an ignored
# folder that the device tool carries to the GPU machine.
#
#   scripts/gpu-run.sh build          # here
#   scripts/gpu-run.sh run [filter]   # there: runs every test binary with --include-ignored
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
esac
