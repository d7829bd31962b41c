#!/usr/bin/env bash
# Call 1: GPU tests, item 7 with the lending budget, held memory of the
# traces on the GPU (sim-vs-GPU), the multi-stream recordings.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-gpu-bin-h1}; O=$OUT/c; mkdir -p $O/traces-ms $O/held; SECONDS=0; END=${END:-540}
pack() { echo "$1 at $SECONDS s" >> $O/gpu.txt; tar czf $OUT/c.tgz -C $OUT c; }
date -u > $O/gpu.txt; cat $B/BUILD >> $O/gpu.txt; nproc >> $O/gpu.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $O/gpu.txt
for t in cuda:--include-ignored:100 futures:--ignored:30 cache:--ignored:30 resource:--ignored:30; do
  IFS=: read -r t which secs <<< "$t"
  echo "=== $t"; timeout $secs $B/test-$t $which --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done > $O/tests.txt 2>&1; pack tests
timeout 60 $B/bin-service_bench --budget-quarter --clients 64,1024 --rounds 3 --fill-rounds 1 --diag --out $O/service-lend > $O/service-lend.log 2>&1; echo "service-lend exit $?" >> $O/gpu.txt
timeout 60 $B/bin-service_bench --budget-quarter --budget-over-cache --clients 64,1024 --rounds 3 --fill-rounds 1 --out $O/service-over > $O/service-over.log 2>&1; echo "service-over exit $?" >> $O/gpu.txt; pack service
for m in llama_serve4 gpt2_serve8; do
  (PYTHONUNBUFFERED=1 timeout 330 python3 measure/scripts/record_trace.py $m $O/traces-ms/$m.ops.csv.gz > $O/record-$m.txt 2>&1; echo "exit $? at $SECONDS" >> $O/record-$m.txt) &
done
for f in gpu-traces/gpt2_train.ops.csv.gz gpu-traces/gpt2_train_side.ops.csv.gz gpu-traces/unseen/*.ops.csv.gz gpu-traces/gpt2_infer.ops.csv.gz; do
  n=$(basename $f .ops.csv.gz); timeout 90 $B/bin-trace_replay $f --stack resource,cache --calls > $O/held/$n.txt 2>&1; echo "exit $?" >> $O/held/$n.txt
done; pack held
wait; pack record
for m in llama_serve4 gpt2_serve8; do
  f=$O/traces-ms/$m.ops.csv.gz; [ -s $f ] || continue
  l=$(( END - SECONDS )); [ $l -gt 10 ] || break
  timeout $(( l > 120 ? 120 : l )) $B/bin-trace_replay $f --stack resource,cache --calls --png $O/held/$m.png > $O/held/$m.txt 2>&1; echo "exit $?" >> $O/held/$m.txt
done; pack held-ms
cat $O/gpu.txt $O/tests.txt $O/record-*.txt
grep -E "^\| " $O/service-lend/service.md $O/service-over/service.md | head -20
grep -h "stack=" $O/held/*.txt | sed 's/ us_.*//' | cut -c1-330
