#!/usr/bin/env bash
# Run on the GPU machine: records allocation traces of models the cache was
# not tuned on (`measure/scripts/record_trace.py`, PyTorch's own recorder),
# then replays them as `gpu-run.sh traces` does the GPT-2 ones (driver
# pool and cache with driver-call counts and a plot, then ROUNDS rounds of
# the cache against torch_cpp_replay.py). The binaries come from BIN
# (default gpu-bin), torch_cpp_replay.py from gpu-traces/. Everything
# lands in $OUT/rec.tgz (the device tool brings back few files).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-gpu-bin}; O=$OUT/rec; T=$O/new-traces; mkdir -p $T
models=${MODELS:-llama_infer bert_train resnet_train}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
cat $B/BUILD >> $O/gpu.txt 2>/dev/null
for m in $models; do
  echo "=== record $m"
  timeout 150 python3 measure/scripts/record_trace.py $m $T/$m.ops.csv.gz 2>&1 | tail -5
done | tee $T/record.txt
tar czf $OUT/rec.tgz -C $OUT rec
cp gpu-traces/torch_cpp_replay.py $T/
BIN=$B TRACES=$T TRACE_NAMES="$models" ROUNDS=${ROUNDS:-2} timeout 300 scripts/gpu-run.sh traces $O/replay > $O/replay.log 2>&1
rm -f $T/torch_cpp_replay.py
tar czf $OUT/rec.tgz -C $OUT rec && rm -rf $O/replay/*.png.tmp
cat $O/gpu.txt
grep -h "ratio=" $O/replay/*.streamalloc.txt | sed 's/peak_requested=[0-9]* //; s/peak_held=[0-9]* //' | cut -c1-200
grep -h peak_reserved $O/replay/*.torch.txt | cut -c1-200
rm -rf $O
