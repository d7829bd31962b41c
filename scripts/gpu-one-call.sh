#!/usr/bin/env bash
# A session's GPU work in one device call, for when starts are scarce:
# `BIN=DIR END=SECONDS scripts/gpu-one-call.sh` there; DIR built here with
# `scripts/gpu-run.sh suites DIR`, plus bin-service_bench and bin-bench_table
# (with the cuda-async peer), a previous build's service_bench as
# bin-service_bench-old (optional) and libtorch_alloc.so.
# In turn, each packed into $OUT/c.tgz as it ends:
# - the GPU tests;
# - the budget-quarter service (issue 31 item 7), the old and the new
#   build in turn, twice (SERVICE_ARGS adds to it, e.g. --budget-over-cache);
# - the decorators' pairs on the null backend and on the GPU
#   (`bench_table --decorators`, `--decorators-cuda`, item 6)
#   and the whole pairs table (the CUDA rows);
# - PyTorch on streamalloc: the four-stream servers (TORCH_MODELS, default
#   the round robin of the recorded trace and the wide one), PyTorch's
#   second run skipped (their outputs are not deterministic on PyTorch's
#   own allocator), capped at TORCH_S (240 s);
# - memcheck over the wide server, capped at SAN_S (200 s);
# - every trace in DIR/replay/ (e.g. `synth_trace` shapes) through the
#   driver pool and the cache (`trace_replay --stack resource,cache --calls`);
# - the recorded traces through the driver pool, the cache and PyTorch's
#   allocator from C++ (`gpu-run.sh traces`: TRACE_NAMES, ROUNDS, default
#   2), when gpu-traces/ travelled and bin-trace_replay is in DIR;
# until END (default 570 s). STAGES picks and orders the stages (default
# "tests service bench replay torch memcheck traces").
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-gpu-bin}; O=$OUT/c; mkdir -p $O; SECONDS=0; END=${END:-570}
pack() { echo "$1 at $SECONDS s" >> $O/gpu.txt; tar czf $OUT/c.tgz -C $OUT c; }
left() { local l=$(( END - SECONDS )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
date -u > $O/gpu.txt; cat $B/BUILD >> $O/gpu.txt; nproc >> $O/gpu.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $O/gpu.txt
stages=" ${STAGES:-tests service bench replay torch memcheck traces} "
has() { [[ $stages == *" $1 "* ]]; }
if has tests; then
for t in cuda:--include-ignored:100 futures:--ignored:30 cache:--ignored:30 resource:--ignored:30; do
  IFS=: read -r t which secs <<< "$t"
  echo "=== $t"; timeout $secs $B/test-$t $which --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done > $O/tests.txt 2>&1; pack tests
fi
if has service; then
builds=new; [ -x $B/bin-service_bench-old ] && builds="old new"
for i in 1 2; do for b in $builds; do f=$B/bin-service_bench; [ $b = old ] && f=$B/bin-service_bench-old
  timeout 60 $f --budget-quarter --clients 64,1024 --rounds 3 --fill-rounds 1 --diag ${SERVICE_ARGS:-} --out $O/service-$b-$i > $O/service-$b-$i.log 2>&1
  echo "service $b $i exit $?" >> $O/gpu.txt
done; done; pack service
fi
if has bench; then
timeout 60 $B/bin-bench_table --decorators > $O/decorators.txt 2>&1; echo "decorators exit $?" >> $O/gpu.txt
timeout 90 $B/bin-bench_table --decorators-cuda > $O/decorators-cuda.txt 2>&1; echo "decorators-cuda exit $?" >> $O/gpu.txt
timeout 100 $B/bin-bench_table $O/bench > $O/bench.log 2>&1; echo "bench exit $?" >> $O/gpu.txt; pack bench
fi
if has replay && [ -d $B/replay ]; then
  mkdir -p $O/replay
  for f in $B/replay/*.csv.gz; do n=$(basename $f .csv.gz)
    timeout $(left 60) $B/bin-trace_replay $f --stack resource,cache --calls > $O/replay/$n.txt 2>&1; echo "replay $n exit $? at $SECONDS" >> $O/gpu.txt
  done; pack replay
fi
if has torch; then
timeout $(left ${TORCH_S:-240}) python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/torch --hooks --no-spread --models ${TORCH_MODELS:-llama_serve4_rr,llama_serve4_wide} > $O/torch.txt 2>&1; echo "torch exit $? at $SECONDS" >> $O/gpu.txt
rm -f $O/torch/*.pt; pack torch
fi
if has memcheck; then
timeout $(left ${SAN_S:-200}) python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out $O/memcheck-wide --only-sanitize --hooks --models llama_serve4_wide > $O/memcheck.txt 2>&1; echo "memcheck exit $? at $SECONDS" >> $O/memcheck.txt; rm -f $O/memcheck-wide/*.pt; pack memcheck
fi
if has traces && [ -d gpu-traces ] && [ -x $B/bin-trace_replay ]; then
  BIN=$B ROUNDS=${ROUNDS:-2} TRACE_NAMES="${TRACE_NAMES:-llama_serve4 gpt2_serve8 gpt2_train_side gpt2_infer gpt2_train}" \
    timeout $(left ${TRACES_S:-400}) scripts/gpu-run.sh traces $O/traces > $O/traces.log 2>&1; echo "traces exit $? at $SECONDS" >> $O/gpu.txt
  rm -f $O/traces/*.png.tmp; pack traces
  python3 measure/scripts/trace_ratios.py $O/traces 2>&1 | tail -20
fi
cat $O/gpu.txt $O/tests.txt; tail -4 $O/memcheck.txt
for f in $O/service-*/service.md; do echo "== $f"; grep -E "^\| streamalloc\+" $f; done
tail -18 $O/decorators.txt
grep -E "^(cuda) +pair +(StreamOrderedResource|CachingResource|Budget)" $O/bench/bench_table.txt
grep -h "ratio=" $O/replay/*.txt 2>/dev/null | sed -E 's/.*trace=([^ ]*) stack=([^ ]*) .*ratio=([0-9.]*).*/\1 \2 \3/'
tail -4 $O/torch.txt; cat $O/torch/compare.md 2>/dev/null
