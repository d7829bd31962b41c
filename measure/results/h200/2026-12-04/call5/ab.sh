#!/usr/bin/env bash
# Device call 5 of 2026-12-04: A/B/C of the service at 64 and 1,024 clients, build 022dc1f +
# switches in bin-service_bench_ab: NO_WAIT=1 (never wait on another stream's fence: only
# ranges the GPU is known done with cross streams), STRICT_FIRST=1 (ranges usable with no
# wait and memory behind them first, a wait only where the alternative is new memory).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-bin2; O=$OUT/abc; mkdir -p $O
for i in 1 2 3; do
  for v in base nowait strict; do
    unset NO_WAIT STRICT_FIRST
    [ $v = nowait ] && export NO_WAIT=1
    [ $v = strict ] && export STRICT_FIRST=1
    timeout 60 $B/bin-service_bench_ab --out $O/$v$i --clients 64,1024 --rounds 1 --fill-rounds 1 --seed $((2026+i)) --diag > $O/$v$i.txt 2>&1
    grep -E "^\| (streamalloc|cuda-async) \| (64|1024) " $O/$v$i/service.md | sed "s/^/$v$i /"
    grep -E "diag streamalloc (64|1024) clients, library" $O/$v$i.txt | grep -o "^.*clients\|StreamWaitEvent [0-9.]*×\|MemCreate [0-9.]*×" | tr '\n' ' '; echo
  done
done
tar czf $OUT/abc.tgz -C $OUT abc
