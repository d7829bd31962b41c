#!/usr/bin/env bash
# A/B of the service: build 3428f08 (growths under the tier's lock) against 9b64937 (outside it), alternating, in one call.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-bin3; O=$OUT/ab; mkdir -p $O
for i in 1 2 3; do
  for v in old new; do
    bin=$B/bin-service_bench; [ $v = old ] && bin=$B/bin-service_bench-3428f08
    timeout 100 $bin --clients 64,1024 --rounds 1 --fill-rounds 0 --out $O/$v$i > $O/$v$i.txt 2>&1
    echo "== $v $i"; grep -E "^\| (streamalloc|cuda-async)" $O/$v$i/service.md | cut -d'|' -f2,3,5,7,10
  done
done
