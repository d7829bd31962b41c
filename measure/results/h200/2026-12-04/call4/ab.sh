#!/usr/bin/env bash
# Device call 4 of 2026-12-04: A/B of the service at 64 and 1,024 clients, build 022dc1f +
# a NO_TAKE switch (a growth takes no other stream's kept block) in bin-service_bench_ab.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-bin2; O=$OUT/ab; mkdir -p $O
for i in 1 2 3 4; do
  for v in take notake; do
    if [ $v = notake ]; then export NO_TAKE=1; else unset NO_TAKE; fi
    timeout 60 $B/bin-service_bench_ab --out $O/$v$i --clients 64,1024 --rounds 1 --fill-rounds 1 --seed $((2026+i)) > $O/$v$i.txt 2>&1
    grep -E "^\| (streamalloc|cuda-async) \| (64|1024) " $O/$v$i/service.md | sed "s/^/$v$i /"
  done
done
tar czf $OUT/ab.tgz -C $OUT ab
