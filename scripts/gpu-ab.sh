#!/usr/bin/env bash
# Run on the GPU machine: the service benchmark of two builds, alternating
# in one call (A/B: does a change move the service, or did the machine?).
# OLD and NEW name folders holding bin-service_bench; ROUNDS alternations;
# then one more pairs table of NEW. Everything lands in $OUT/ab.tgz.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
O=$OUT/ab; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
for r in $(seq ${ROUNDS:-2}); do
  for b in old new; do
    d=$OLD; [ $b = new ] && d=$NEW
    timeout 120 $d/bin-service_bench --out $O/$b$r --rounds 1 --clients ${CLIENTS:-64,1024} --fill-rounds 3 --diag > $O/$b$r.txt 2>&1
    echo "== $b round $r ($(cat $d/BUILD))"; grep -E "^\| (streamalloc|cudarc|cuda-async) " $O/$b$r.txt | grep "round 0" | cut -d'|' -f2-7,10
    grep -E "diag streamalloc" $O/$b$r.txt | cut -c1-300
  done
done
[ -x $NEW/bin-bench_table ] && timeout 120 $NEW/bin-bench_table $O/bench > $O/bench_table.txt 2>&1
grep -E "^cuda +(pair|threads) +(raw driver pair|CachingResource)" $O/bench_table.txt 2>/dev/null
tar czf $OUT/ab.tgz -C $OUT ab; rm -rf $O
