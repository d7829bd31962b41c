#!/usr/bin/env bash
# One device call (run there, carrying BIN and .whl, the RMM wheels: see
# the device notes): the GPU suites, sleep/wake, the staged service, then PyTorch
# on streamalloc beside PyTorch's allocator (and RMM's pool while time
# allows), each model its own invocation. END: seconds the whole may take.
B=${BIN:-gpu-bin-f}; END=${END:-530}; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0; mkdir -p /tmp/a /tmp/t
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
BIN=$B STAGES="tests" bash scripts/gpu-call.sh A
echo "suites done at $SECONDS s"
( nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 60 $B/test-cuda --include-ignored --test-threads=1 --nocapture sleep:: > /tmp/a/sleep.txt 2>&1; echo "sleep exit $?"
  timeout 60 $B/example-sleep >> /tmp/a/sleep.txt 2>&1; echo "example-sleep exit $? at $SECONDS s"
  timeout ${STAGED_S:-110} $B/bin-service_bench --staged --clients 64,1024 --out /tmp/a/staged > /tmp/a/staged.txt 2>&1; echo "staged exit $? at $SECONDS s"
) > /tmp/a/log.txt 2>&1
tar czf $OUT/a.tgz -C /tmp a; cat /tmp/a/log.txt
cat /tmp/a/staged/*.md 2>/dev/null | grep -E "^\|" | head -20
grep -E "cycle|last cycle|test result" /tmp/a/sleep.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for m in ${MODELS:-llama_serve4_wide gpt2_infer llama_serve4 bert_train}; do
  left=$((END - SECONDS)); [ $left -lt 40 ] && { echo "$m skipped: $left s left"; continue; }
  rmm=--rmm; [ $left -lt ${RMM_IF:-200} ] && rmm=
  t=$(( left < 150 ? left : 150 ))
  timeout $t python3 torch-alloc/scripts/compare_models.py --lib $B/libtorch_alloc.so --out /tmp/t/$m --models $m $rmm --hooks > /tmp/t/$m.txt 2>&1
  echo "$m $rmm exit $? at $SECONDS s"; rm -f /tmp/t/$m/*.pt
done > /tmp/t/log.txt 2>&1
tar czf $OUT/t.tgz -C /tmp t; cat /tmp/t/log.txt; cat /tmp/t/*/compare.md
