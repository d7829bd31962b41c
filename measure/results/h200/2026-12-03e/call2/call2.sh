#!/usr/bin/env bash
# Device call 2: traces and service (before any sanitizer), bench table, every CUDA suite, examples, sanitizer.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-sel2; O=$OUT/r; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt 2>&1
date -u >> $O/gpu.txt
SECONDS=0
pack() { tar czf $OUT/r.tgz -C $OUT r; echo "$1 at $SECONDS s" >> $O/gpu.txt; }
BIN=$B timeout 200 scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1; pack traces
BIN=$B timeout 120 scripts/gpu-run.sh service $O/service > $O/service.log 2>&1; pack service
timeout 150 $B/bin-bench_table $O/bench > $O/bench_table.txt 2>&1; pack bench
for t in $B/test-*; do
  echo "=== $t"; timeout 100 $t --include-ignored --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked|failed"
done > $O/tests.txt 2>&1; pack tests
BIN=$B timeout 150 scripts/gpu-run.sh examples > $O/examples.log 2>&1; pack examples
cs="compute-sanitizer --error-exitcode 86 --report-api-errors no --tool memcheck --track-stream-ordered-races all"
for t in cache_arena cache_graph gpu_cuda buffer_cuda; do
  echo "=== memcheck $t"; timeout 150 $cs $B/test-$t --include-ignored --test-threads=1 cuda > $O/san-$t.log 2>&1; echo "exit $?"; grep -E "ERROR SUMMARY|test result" $O/san-$t.log | tail -2
done > $O/sanitize.txt 2>&1
for e in graph kernel; do echo "=== memcheck example-$e"; timeout 60 $cs $B/example-$e > $O/san-ex-$e.log 2>&1; echo "exit $?"; grep "ERROR SUMMARY" $O/san-ex-$e.log; done >> $O/sanitize.txt 2>&1
echo "=== planted (must exit 86)" >> $O/sanitize.txt; timeout 60 $cs $B/example-planted_race bug > /dev/null 2>&1; echo "exit $?" >> $O/sanitize.txt
pack sanitize
cat $O/gpu.txt; grep -B1 -E "FAILED|failed|panicked" $O/tests.txt | head -20; grep -c "test result: ok" $O/tests.txt; cat $O/sanitize.txt; grep -E "^\| (streamalloc|cudarc|cuda-async|plain)" $O/service/service.md | head -20
