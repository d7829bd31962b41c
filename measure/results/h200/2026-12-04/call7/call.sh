#!/usr/bin/env bash
# Device call 7 of 2026-12-04: build 5e455c7 (review refactors of the kept-block entry and merge_next): the suites and the allocation table.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-bin2; R=r$1; O=$OUT/$R; mkdir -p $O
date -u > $O/gpu.txt; SECONDS=0
pack() { tar czf $OUT/$R.tgz -C $OUT $R; echo "$1 at $SECONDS s" >> $O/gpu.txt; }
if [ "$1" = 1 ]; then
BIN=$B timeout 120 scripts/gpu-run.sh service $O/service > $O/service.log 2>&1; pack service
BIN=$B TRACES=gpu-traces timeout 200 scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1; pack traces
timeout 60 $B/bin-trace_replay gpu-traces/many_streams.ops.csv.gz --stack resource,cache --repeat 2 --calls > $O/many_streams.txt 2>&1; pack many
timeout 60 $B/bin-service_bench --out $O/diag64 --clients 64 --rounds 1 --fill-rounds 1 --diag > $O/diag64.txt 2>&1; pack diag
else
timeout 150 $B/bin-bench_table $O/bench > $O/bench_table.txt 2>&1; pack bench
for t in cache cache_arena cache_graph buffer_cuda gpu_cuda futures_cuda resource service_cuda graph_cuda; do
  echo "=== $t"; timeout 100 $B/test-$t --include-ignored --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done > $O/tests.txt 2>&1; pack tests
cs="compute-sanitizer --error-exitcode 86 --report-api-errors no --tool memcheck --track-stream-ordered-races all"
for t in cache_arena cache_graph; do echo "=== memcheck $t"; timeout 100 $cs $B/test-$t --include-ignored --test-threads=1 > $O/san-$t.log 2>&1; echo "exit $?"; grep -E "ERROR SUMMARY" $O/san-$t.log; done > $O/sanitize.txt 2>&1; pack san
fi
cat $O/gpu.txt $O/tests.txt $O/sanitize.txt
grep -o "stack=[a-z]* backend=cuda rep=[0-9] ops=[0-9]* ns_per_op=[0-9.]*.*ratio=[0-9.]*" $O/traces.log $O/many_streams.txt | cut -c1-220; grep -h ns_per_op $O/traces/*.torch.txt | cut -c1-120
grep -E "^cuda +(pair|threads) +(raw driver pair|CachingResource|StreamOrderedResource)" $O/bench_table.txt
grep -E "^\| (streamalloc|cudarc|cuda-async)" $O/service/service.md; grep -E "completion|cuda-async 0.5" $O/service/service.md
