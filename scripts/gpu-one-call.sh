#!/usr/bin/env bash
# A session's GPU work in one device call, for when starts are scarce:
# `BIN=DIR END=SECONDS scripts/gpu-one-call.sh` there; DIR built here with
# `scripts/gpu-run.sh suites DIR`, plus bin-service_bench, bin-bench_table
# (and the previous build's as bin-bench_table-old) and libtorch_alloc.so.
# In turn, each packed into $OUT/c.tgz as it ends: the GPU tests, the
# budget-quarter service, the null-backend pairs of the two builds in turn
# and the whole pairs table, PyTorch on streamalloc (the four-stream
# models), memcheck over the wide one, then the multi-stream recordings
# with the time left before END (default 570 s). TORCH_S, SAN_S, RECORD_S
# cap the three last steps (170, 90, 120 s), TORCH_MODELS picks the models,
# SERVICE_ARGS adds to the service (e.g. --budget-over-cache).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-gpu-bin}; O=$OUT/c; mkdir -p $O/traces-ms; SECONDS=0; END=${END:-570}
pack() { echo "$1 at $SECONDS s" >> $O/gpu.txt; tar czf $OUT/c.tgz -C $OUT c; }
left() { local l=$(( END - SECONDS )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
date -u > $O/gpu.txt; cat $B/BUILD >> $O/gpu.txt; nproc >> $O/gpu.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $O/gpu.txt
for t in cuda:--include-ignored:100 futures:--ignored:30 cache:--ignored:30 resource:--ignored:30; do
  IFS=: read -r t which secs <<< "$t"
  echo "=== $t"; timeout $secs $B/test-$t $which --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done > $O/tests.txt 2>&1; pack tests
timeout 100 $B/bin-service_bench --budget-quarter --clients 64,1024 --rounds 1 --fill-rounds 1 ${SERVICE_ARGS:-} --out $O/service > $O/service.log 2>&1; echo "service exit $?" >> $O/gpu.txt; pack service
for i in 1 2 3; do for b in old new; do f=$B/bin-bench_table; [ $b = old ] && f=$B/bin-bench_table-old; timeout 40 $f --null-only $O/null-$b-$i > /dev/null 2>&1; done; done
timeout 100 $B/bin-bench_table $O/bench > $O/bench.log 2>&1; echo "bench exit $?" >> $O/gpu.txt; pack bench
timeout $(left ${TORCH_S:-170}) python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/torch --hooks --models ${TORCH_MODELS:-llama_serve4,llama_serve4_wide} > $O/torch.txt 2>&1; echo "torch exit $? at $SECONDS" >> $O/gpu.txt
rm -f $O/torch/*.pt; pack torch
timeout $(left ${SAN_S:-90}) python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/memcheck-wide --only-sanitize --hooks --models llama_serve4_wide > $O/memcheck.txt 2>&1; echo "memcheck exit $? at $SECONDS" >> $O/memcheck.txt; rm -f $O/memcheck-wide/*.pt; pack memcheck
r=$(left ${RECORD_S:-120}); for m in gpt2_serve8 llama_serve4 gpt2_train_side; do
  (PYTHONUNBUFFERED=1 timeout $r python3 measure/scripts/record_trace.py $m $O/traces-ms/$m.ops.csv.gz > $O/record-$m.txt 2>&1; echo "exit $?" >> $O/record-$m.txt) &
done; wait; pack record
cat $O/gpu.txt $O/tests.txt $O/record-*.txt; tail -4 $O/memcheck.txt
grep -E "^\| streamalloc" $O/service/service.md
grep -E "^(null|cuda) +pair +(StreamOrderedResource|CachingResource|Budget)" $O/bench/bench_table.txt
tail -4 $O/torch.txt; cat $O/torch/compare.md 2>/dev/null
