#!/usr/bin/env bash
# One device call of a session, run there: `scripts/gpu-call.sh N` (N names
# the archive). The binaries come from `BIN` (default gpu-bin, see
# `scripts/gpu-run.sh build`; a BUILD file in it says which commit), the
# traces from gpu-traces/ (the shared traces, and many_streams.ops.csv.gz
# from `bin-synth_trace many_streams`).
# Stages, each packed into $OUT/rN.tgz as it ends: the nine CUDA suites,
# memcheck over two, the traces (ROUNDS rounds against torch_cpp_replay.py),
# the service, the eight-stream trace, the pairs table, the synthetic
# shapes of gpu-traces/unseen/ beside PyTorch (if there), then SLOTS rounds
# against torch_slots_replay.py (the same bookkeeping as trace_replay).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-gpu-bin}; R=r$1; O=$OUT/$R; mkdir -p $O
date -u > $O/gpu.txt; cat $B/BUILD 2>/dev/null >> $O/gpu.txt; nproc >> $O/gpu.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $O/gpu.txt; SECONDS=0
pack() { echo "$1 at $SECONDS s" >> $O/gpu.txt; tar czf $OUT/$R.tgz -C $OUT $R; }
# STAGES (default all but the last four) picks stages: tests san safety
# traces service many bench unseen slots, and host torch viz sleep (the
# pinned host pool, PyTorch on streamalloc, the memory viewer export, sleep
# and wake: issues 35, 36, 32).
want() { case " ${STAGES:-tests san safety traces service many bench unseen slots} " in *" $1 "*) return 0;; esac; return 1; }
want tests && for t in cache cache_arena cache_graph buffer_cuda gpu_cuda futures_cuda resource service_cuda graph_cuda gpu_adaptors host_cuda sleep_cuda; do
  [ -x $B/test-$t ] || continue
  echo "=== $t"; timeout 100 $B/test-$t --include-ignored --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done > $O/tests.txt 2>&1; pack tests
cs="compute-sanitizer --error-exitcode 86 --report-api-errors no --tool memcheck --track-stream-ordered-races all"
want san && for t in ${SAN_TESTS:-cache_arena cache_graph}; do echo "=== memcheck $t"; timeout 100 $cs $B/test-$t --include-ignored --test-threads=1 > $O/san-$t.log 2>&1; echo "exit $?"; grep -E "ERROR SUMMARY" $O/san-$t.log; done > $O/sanitize.txt 2>&1; pack san
# The shortcuts of the ordering rules on the GPU (tests/safety_cuda.rs),
# with test-safety_cuda-old (the same test built on an older commit, if
# carried) beside it, then under memcheck with stream-ordered race tracking.
want safety && {
  for t in safety_cuda safety_cuda-old; do
    [ -x $B/test-$t ] || continue
    echo "=== $t"; timeout 150 $B/test-$t --include-ignored --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|cuda:|round|left|right"
  done
  echo "=== memcheck safety_cuda"; timeout 200 $cs $B/test-safety_cuda --include-ignored --test-threads=1 > $O/san-safety.log 2>&1; echo "exit $?"
  grep -E "ERROR SUMMARY|test result" $O/san-safety.log
} > $O/safety.txt 2>&1; want safety && pack safety
# Multi-stream traces recorded from PyTorch (measure/scripts/record_trace.py,
# the models of RECORD, in parallel: each process records only its own
# allocations), returned in $OUT/traces-ms.tgz; the traces stage then
# replays them (TRACE_NAMES).
want record && {
  for m in ${RECORD:-gpt2_serve8 gpt2_train_side llama_serve4}; do
    (PYTHONUNBUFFERED=1 timeout ${RECORD_S:-240} python3 measure/scripts/record_trace.py $m gpu-traces/$m.ops.csv.gz > $O/record-$m.txt 2>&1; echo "exit $?" >> $O/record-$m.txt) &
  done; wait; cat $O/record-*.txt
  mkdir -p $OUT/traces-ms; for m in ${RECORD:-gpt2_serve8 gpt2_train_side llama_serve4}; do cp gpu-traces/$m.ops.csv.gz $OUT/traces-ms/; done
  tar czf $OUT/traces-ms.tgz -C $OUT traces-ms && rm -rf $OUT/traces-ms
} > $O/record.txt 2>&1; want record && pack record
want traces && BIN=$B TRACES=gpu-traces ROUNDS=${ROUNDS:-4} timeout ${TRACES_S:-300} scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1; pack traces
python3 measure/scripts/trace_ratios.py $O/traces > $O/trace_ratios.txt 2>&1
want service && BIN=$B timeout 150 scripts/gpu-run.sh service $O/service > $O/service.log 2>&1; pack service
want many && timeout 60 $B/bin-trace_replay gpu-traces/many_streams.ops.csv.gz --stack resource,cache --repeat 2 > $O/many_streams.txt 2>&1; pack many
want bench && timeout 150 $B/bin-bench_table $O/bench > $O/bench_table.txt 2>&1; pack bench
# The synthetic shapes of measure/tests/trace_unseen.rs (and other seeds),
# written by bin-synth_trace into gpu-traces/unseen/: memory held by the
# driver pool, the cache and PyTorch's allocator (one repeat each).
if want unseen && [ -d gpu-traces/unseen ]; then
  for f in gpu-traces/unseen/*.ops.csv.gz; do
    echo "=== $f"; timeout 60 $B/bin-trace_replay $f --stack resource,cache 2>&1 | grep -o "stack=.*ratio=[0-9.]*" | sed 's/peak_requested.*peak_held=[0-9]* //'
    timeout 120 python3 gpu-traces/torch_cpp_replay.py $f 1 2>&1 | tail -1
  done > $O/unseen.txt 2>&1; pack unseen
fi
if want slots && [ "${SLOTS:-0}" != 0 ]; then
  BIN=$B TRACES=gpu-traces ROUNDS=$SLOTS TORCH_REPLAY=measure/scripts/torch_slots_replay.py timeout 200 scripts/gpu-run.sh traces $O/slots > $O/slots.log 2>&1
  python3 measure/scripts/trace_ratios.py $O/slots > $O/slots_ratios.txt 2>&1; pack slots
fi
# The pinned host pool: its CUDA tests ran above; the staging example and
# the µs per copy (pool vs pinning per request vs pageable).
want host && [ -x $B/bin-host_staging ] && {
  timeout 120 $B/example-staging; echo "exit $?"; timeout 300 $B/bin-host_staging; echo "exit $?"
  # The service with real input and output copies (service_bench --staged).
  [ -x $B/bin-service_bench ] && { timeout 400 $B/bin-service_bench --staged --clients 64,1024 --out $O/staged; echo "exit $?"; }
} > $O/host.txt 2>&1 && pack host
# PyTorch on streamalloc: three models on both allocators, then memcheck
# over one short run of each on streamalloc.
want torch && [ -f $B/libtorch_alloc.so ] && {
  timeout ${TORCH_S:-300} python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/torch ${TORCH_ARGS:-}; echo "exit $?"
  for m in ${TORCH_SAN:-}; do timeout 200 python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/memcheck-$m --only-sanitize --models $m; echo "memcheck $m exit $?"; done
} > $O/torch.txt 2>&1; rm -f $O/torch/*.pt $O/memcheck-*/*.pt; want torch && pack torch
# A snapshot exported by memory_viz, read by PyTorch's own _memory_viz;
# the out-of-memory report example.
want viz && [ -x $B/bin-memory_viz ] && {
  $B/bin-memory_viz $O/viz && python3 measure/scripts/check_memory_viz.py $O/viz/snapshot.pickle $O/viz; echo "exit $?"
  timeout 60 $B/example-oom_report; echo "exit $?"
} > $O/viz.txt 2>&1; want viz && pack viz
want sleep && [ -x $B/example-sleep ] && { timeout 120 $B/example-sleep; echo "exit $?"; } > $O/sleep.txt 2>&1; want sleep && pack sleep
cat $O/gpu.txt $O/record.txt $O/tests.txt $O/sanitize.txt $O/safety.txt $O/host.txt $O/viz.txt $O/sleep.txt 2>/dev/null; tail -40 $O/torch.txt 2>/dev/null; cat $O/torch/compare.md 2>/dev/null
cat $O/trace_ratios.txt $O/slots_ratios.txt $O/unseen.txt 2>/dev/null
grep -ho "stack=[a-z]* backend=cuda rep=[0-9] ops=[0-9]* ns_per_op=[0-9.]*.*ratio=[0-9.]*" $O/traces/*.streamalloc.txt $O/many_streams.txt 2>/dev/null | sed 's/peak_requested.*peak_held=[0-9]* //' | cut -c1-160 | head -12
grep -h peak_reserved $O/traces/*.torch.txt 2>/dev/null | head -2 | cut -c1-200
grep -E "^cuda +(pair|threads) +(raw driver pair|CachingResource|StreamOrderedResource)" $O/bench_table.txt 2>/dev/null
grep -E "^\| (streamalloc|cudarc|cuda-async)" $O/service/service.md 2>/dev/null; grep -E "completion|cuda-async 0.5" $O/service/service.md 2>/dev/null
rm -rf $O
