#!/usr/bin/env bash
# Device call 1 of the session: CUDA suites, service (3 ways), fills, traces, bench table.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-sel; O=$OUT/r; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt 2>&1
date -u >> $O/gpu.txt
SECONDS=0
pack() { tar czf $OUT/r.tgz -C $OUT r; }
for t in cache_arena cache_graph futures_cuda futures_lazy gpu_cuda buffer_cuda service_cuda cache; do
  echo "=== $t"; timeout 120 $B/test-$t --include-ignored --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked|failed" 
done > $O/tests.txt 2>&1
echo "tests done at $SECONDS s" >> $O/gpu.txt
pack
BIN=$B timeout 280 scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1
echo "traces done at $SECONDS s" >> $O/gpu.txt
pack
BIN=$B timeout 240 scripts/gpu-run.sh service $O/service > $O/service.log 2>&1
echo "service done at $SECONDS s" >> $O/gpu.txt
pack
timeout 60 $B/bin-service_bench --out $O/fills-diag --clients 1 --requests 64 --rounds 1 --fill-rounds 3 --diag > $O/fills-diag.txt 2>&1
timeout 60 $B/bin-driver_costs > $O/driver_costs.txt 2>&1
echo "diag done at $SECONDS s" >> $O/gpu.txt
pack
timeout 120 $B/bin-bench_table $O/bench > $O/bench_table.txt 2>&1
echo "bench done at $SECONDS s" >> $O/gpu.txt
pack
timeout 60 $B/example-graph > $O/example-graph.txt 2>&1
timeout 60 python3 measure/scripts/vmm_alias_probe.py > $O/alias_probe.txt 2>&1
pack
cat $O/gpu.txt; cat $O/tests.txt | grep -v "^test result: ok" | head -40; grep -E "^\|" $O/service/*.md 2>/dev/null | head -30
