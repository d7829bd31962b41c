#!/usr/bin/env bash
# A session's GPU work in one device call, for when starts are scarce:
# `BIN=DIR END=SECONDS bash scripts/gpu-one-call.sh` there, DIR built here
# with `scripts/gpu-one-call.sh build DIR` (below). Each stage is packed
# into $OUT/c.tgz as it ends, so a call cut short keeps what finished:
#
# - tests: the GPU tests (cuda, futures, cache, resource);
# - service: the budget-quarter service (issue 31 item 7), reservations
#   against a semaphore: this build, the build before as
#   bin-service_bench-old (optional), and this build with the cache's
#   cross-stream policy `done` (`--cross-stream done`), twice each
#   (SERVICE_ARGS adds to every run, e.g. --budget-over-cache);
# - bench: the decorators' interleaved pairs on the null backend, this
#   build and bin-bench_table-old (optional) in turn, twice, then on the
#   GPU (`bench_table --decorators-cuda`: over the driver pool and the
#   cache, 256 B, 64 KiB, 4 MiB), item 6; WHOLE_TABLE=1 adds the whole
#   pairs table;
# - probe: whether the driver maps part of a handle, at offset 0 and at an
#   offset (`scripts/probe_map_offset.py`), and a C pair of the PyTorch
#   shim on the real driver (bin-c_pair, optional);
# - replay: every trace in DIR/replay/ (the sawtooth seeds) through the
#   driver pool and the cache (`trace_replay --stack resource,cache --calls`);
# - torch: PyTorch on streamalloc (issue 36), `compare_models.py --hooks`:
#   the round-robin server of the recorded trace (32 requests; PyTorch's
#   run alone takes about 100 s on an H100), then GPT-2, BERT and the
#   threaded server with PyTorch's second run (the spread), then the wide
#   server; each capped by what is left;
# - memcheck: compute-sanitizer over the wide server's short run;
# - traces: the recorded traces through the driver pool, the cache and
#   PyTorch's allocator from C++ (`gpu-run.sh traces`), when gpu-traces/
#   travelled.
#
# until END (default 570 s). STAGES picks and orders the stages (default
# "tests service bench probe replay torch memcheck traces").
set -u
if [ "${1:-}" = build ]; then
  # Here (no GPU): everything the stages run, into DIR (about 35 MiB of
  # the 64 MiB a call carries); OLD=DIR' copies the -old binaries from an
  # earlier build.
  set -e
  cd "$(dirname "$0")/.."
  D=${2:?usage: gpu-one-call.sh build DIR}
  export CUDA_TOOLKIT_PATH=$(scripts/cuda-headers.sh)
  scripts/gpu-run.sh suites "$D"
  cargo build --release -p streamalloc-measure --features peer-cuda-async \
    --bin service_bench --bin bench_table --bin trace_replay --bin synth_trace
  for b in service_bench bench_table trace_replay synth_trace; do cp "target/release/$b" "$D/bin-$b"; done
  cargo build --release -p torch-alloc
  cp target/release/libtorch_alloc.so "$D/"
  cargo bench -p torch-alloc --bench c_pair --no-run 2>&1 |
    sed -nE 's/.*Executable .*\((.*)\)$/\1/p' | head -1 | xargs -I{} cp {} "$D/bin-c_pair"
  if [ -n "${OLD:-}" ]; then
    cp "$OLD/bin-service_bench" "$D/bin-service_bench-old"
    cp "$OLD/bin-bench_table" "$D/bin-bench_table-old"
  fi
  rm -f "$D"/example-*
  mkdir -p "$D/replay"
  for s in 1 2 12 100 103; do "$D/bin-synth_trace" sawtooth --seed $s "$D/replay/sawtooth_$s.ops.csv.gz"; done
  rm -f "$D/bin-synth_trace"
  strip "$D"/bin-* "$D"/libtorch_alloc.so
  echo "build $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes'), built $(date -u +%FT%TZ)" >"$D/BUILD"
  du -sh "$D"
  exit 0
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-gpu-bin}; O=$OUT/c; mkdir -p $O; SECONDS=0; END=${END:-570}
pack() { echo "$1 at $SECONDS s" >> $O/gpu.txt; rm -f $O/*/*.pt; tar czf $OUT/c.tgz -C $OUT c; }
left() { local l=$(( END - SECONDS )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
date -u > $O/gpu.txt; cat $B/BUILD >> $O/gpu.txt; nproc >> $O/gpu.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $O/gpu.txt
stages=" ${STAGES:-tests service bench probe replay torch memcheck traces} "
has() { [[ $stages == *" $1 "* ]]; }
if has tests; then
for t in cuda:--include-ignored:100 futures:--ignored:30 cache:--ignored:30 resource:--ignored:30; do
  IFS=: read -r t which secs <<< "$t"
  echo "=== $t"; timeout $secs $B/test-$t $which --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done > $O/tests.txt 2>&1; pack tests
fi
if has service; then
svc() { # name, binary, extra arguments
  timeout $(left 70) $2 --budget-quarter --clients 64,1024 --rounds 3 --fill-rounds 1 --diag ${SERVICE_ARGS:-} "${@:3}" \
    --out $O/service-$1 > $O/service-$1.log 2>&1
  echo "service $1 exit $? at $SECONDS" >> $O/gpu.txt
}
for i in 1 2; do
  svc new-$i $B/bin-service_bench
  [ -x $B/bin-service_bench-old ] && svc old-$i $B/bin-service_bench-old
  svc done-$i $B/bin-service_bench --cross-stream done
done; pack service
fi
if has bench; then
for i in 1 2; do for b in new old; do f=$B/bin-bench_table; [ $b = old ] && f=$B/bin-bench_table-old
  [ -x $f ] || continue
  timeout 40 $f --decorators 9 > $O/decorators-$b-$i.txt 2>&1; echo "decorators $b $i exit $?" >> $O/gpu.txt
done; done
timeout 60 $B/bin-bench_table --decorators-cuda > $O/decorators-cuda.txt 2>&1; echo "decorators-cuda exit $?" >> $O/gpu.txt
if [ -n "${WHOLE_TABLE:-}" ]; then
  timeout $(left 100) $B/bin-bench_table $O/bench > $O/bench.log 2>&1; echo "bench exit $?" >> $O/gpu.txt
fi; pack bench
fi
if has probe; then
timeout 15 python3 scripts/probe_map_offset.py > $O/probe_map_offset.txt 2>&1
[ -x $B/bin-c_pair ] && { timeout 30 $B/bin-c_pair 100000 --cuda --announce; timeout 30 $B/bin-c_pair 100000 --cuda; } > $O/c_pair.txt 2>&1
pack probe
fi
if has replay && [ -d $B/replay ]; then
  mkdir -p $O/replay
  for f in $B/replay/*.csv.gz; do n=$(basename $f .csv.gz)
    timeout $(left 60) $B/bin-trace_replay $f --stack resource,cache --calls > $O/replay/$n.txt 2>&1; echo "replay $n exit $? at $SECONDS" >> $O/gpu.txt
  done; pack replay
fi
if has torch; then
cmp() { # name, seconds, compare_models options
  local d=$1 s=$2; shift 2
  timeout $(left $s) python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/$d --hooks "$@" > $O/$d.txt 2>&1
  echo "$d exit $? at $SECONDS" >> $O/gpu.txt; pack $d
}
cmp torch-rr ${RR_S:-240} --no-spread --models llama_serve4_rr
cmp torch-small ${SMALL_S:-200} --models gpt2_infer,bert_train,llama_serve4
cmp torch-wide ${WIDE_S:-200} --no-spread --models llama_serve4_wide
fi
if has memcheck; then
timeout $(left ${SAN_S:-200}) python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/memcheck-wide --only-sanitize --hooks --models llama_serve4_wide > $O/memcheck.txt 2>&1; echo "memcheck exit $? at $SECONDS" >> $O/memcheck.txt; pack memcheck
fi
if has traces && [ -d gpu-traces ] && [ -x $B/bin-trace_replay ]; then
  BIN=$B ROUNDS=${ROUNDS:-2} TRACE_NAMES="${TRACE_NAMES:-llama_serve4 gpt2_serve8 gpt2_train_side gpt2_infer gpt2_train}" \
    timeout $(left ${TRACES_S:-400}) scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1; echo "traces exit $? at $SECONDS" >> $O/gpu.txt
  rm -f $O/traces/*.png.tmp; pack traces
  python3 measure/scripts/trace_ratios.py $O/traces 2>&1 | tail -20
fi
cat $O/gpu.txt $O/tests.txt 2>/dev/null; tail -4 $O/memcheck.txt 2>/dev/null
for f in $O/service-*/service.md; do [ -f $f ] && { echo "== $f"; grep -E "^\| streamalloc\+" $f; }; done
grep -hE "added|/ the" $O/decorators-*-1.txt 2>/dev/null; tail -30 $O/decorators-cuda.txt 2>/dev/null
cat $O/probe_map_offset.txt 2>/dev/null; tail -12 $O/c_pair.txt 2>/dev/null
grep -h "ratio=" $O/replay/*.txt 2>/dev/null | sed -E 's/.*trace=([^ ]*) stack=([^ ]*) .*ratio=([0-9.]*).*/\1 \2 \3/'
for d in torch-rr torch-small torch-wide; do cat $O/$d/compare.md 2>/dev/null; done
