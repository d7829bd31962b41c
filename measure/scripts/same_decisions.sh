#!/usr/bin/env bash
# Checks that two builds of the cache make the same placement decisions:
# the peak and final memory held, to the byte, and the count of every
# driver call, replaying on the simulated device every recorded trace
# (gpu-traces/, gpu-traces/unseen/, measure/tests/data/, measure/traces/)
# and the synthetic shapes of measure/tests/trace_unseen.rs (the tests'
# seeds and others, drained every operation and every third). For a
# change meant to make the cache faster and nothing else.
#
#     measure/scripts/same_decisions.sh BEFORE_DIR AFTER_DIR [TRACE...]
#
# GPU_TRACES names the folder of the recorded traces (default: the
# repository's gpu-traces/, which git ignores). Each DIR holds the `trace_replay` and `synth_trace` binaries of one
# build (`cargo build --release -p streamalloc-measure --bin trace_replay
# --bin synth_trace`, copied out of target/release). With TRACE files,
# only those are replayed. Prints one line per replay, `same` or
# `DIFFERENT` with both figures; exits 1 when any differs.
set -euo pipefail

before=${1:?usage: same_decisions.sh BEFORE_DIR AFTER_DIR [TRACE...]}
after=${2:?usage: same_decisions.sh BEFORE_DIR AFTER_DIR [TRACE...]}
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
gpu_traces=${GPU_TRACES:-$root/gpu-traces}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

traces=("$@")
if [ ${#traces[@]} -eq 0 ]; then
    for f in "$gpu_traces"/*.csv.gz "$gpu_traces"/unseen/*.csv.gz \
        "$root"/measure/tests/data/*.csv.gz "$root"/measure/traces/*.csv.gz; do
        [ -e "$f" ] && traces+=("$f")
    done
    # The shapes of trace_unseen.rs: the tests' seeds (synth_trace's
    # default), seeds 1 and 2, and the sawtooth's other seeds.
    for shape in ramp sawtooth layered many_streams plateau_then_spike churn kv_serving; do
        for seed in default 1 2; do
            out="$work/$shape-$seed.csv.gz"
            if [ "$seed" = default ]; then
                "$before/synth_trace" "$shape" "$out" >/dev/null
            else
                "$before/synth_trace" "$shape" --seed "$seed" "$out" >/dev/null
            fi
            traces+=("$out")
        done
    done
    for seed in 100 101 102 103; do
        "$before/synth_trace" sawtooth --seed "$seed" "$work/sawtooth-$seed.csv.gz" >/dev/null
        traces+=("$work/sawtooth-$seed.csv.gz")
    done
fi

# The figures of one replay that decisions fix: memory held and the
# count of each driver call (no timings).
decisions() {
    "$1/trace_replay" "$2" --sim --stack cache --calls --sim-drain "$3" |
        tr ' ' '\n' |
        grep -E '^(ops|peak_requested|peak_held|held_at_end|[A-Z][A-Za-z]*|set_access_handles)=' |
        tr '\n' ' '
}

status=0
for t in "${traces[@]}"; do
    for drain in 1 3; do
        b=$(decisions "$before" "$t" "$drain")
        a=$(decisions "$after" "$t" "$drain")
        name="$(basename "$t") drain=$drain"
        if [ "$a" = "$b" ]; then
            echo "same      $name: $a"
        else
            echo "DIFFERENT $name"
            echo "  before: $b"
            echo "  after:  $a"
            status=1
        fi
    done
done
exit $status
