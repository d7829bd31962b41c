#!/usr/bin/env bash
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-sel2; O=$OUT/r3; mkdir -p $O
date -u > $O/gpu.txt; SECONDS=0
pack() { tar czf $OUT/r3.tgz -C $OUT r3; echo "$1 at $SECONDS s" >> $O/gpu.txt; }
timeout 100 $B/test-cache_arena --include-ignored --test-threads=1 > $O/cache_arena.txt 2>&1; pack tests
cs="compute-sanitizer --error-exitcode 86 --report-api-errors no --tool memcheck --track-stream-ordered-races all"
timeout 100 $cs $B/test-cache_arena --include-ignored --test-threads=1 on_cuda > $O/san-cache_arena.txt 2>&1; echo "exit $?" >> $O/san-cache_arena.txt; pack san
timeout 100 $B/test-trace_replay --include-ignored --test-threads=1 cuda > $O/trace_replay_cuda.txt 2>&1; pack tr
BIN=$B timeout 200 scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1; pack traces
timeout 150 $B/bin-bench_table $O/bench > $O/bench_table.txt 2>&1; pack bench
cat $O/gpu.txt; grep -E "test |result" $O/cache_arena.txt | grep -v " ok$" ; grep -E "ERROR SUMMARY|result|exit" $O/san-cache_arena.txt; grep result $O/trace_replay_cuda.txt
grep -o "stack=[a-z]* backend=cuda rep=[0-9] ops=[0-9]* ns_per_op=[0-9.]*" $O/traces.log; grep -h ns_per_op $O/traces/*.torch.txt | cut -c1-90
grep -E "^cuda +(pair|threads) +(raw driver pair|CachingResource)" $O/bench_table.txt
