#!/usr/bin/env bash
# Issue 31's decorators, two builds in turn on one machine:
# `scripts/gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR`, each DIR holding a
# `bin-bench_table` (`cargo build --release -p streamalloc-measure --bin
# bench_table`) that knows `--decorators` (from a1a953a on; build a1a953a
# itself for the library before issue 31's item 6 was finished). Runs
# `--decorators` three times per build, alternating (each: 15 rounds of
# 200,000 pairs of every loop, interleaved, after a warm-up), and prints
# per run and build what Budget+Stats+Tracing add to the resource's pair
# (goal: <= 50 ns) and to the cache's, best minus best and median minus
# median, and the stack over the cache (goal: <= 1.5x). Then the whole
# table once per build (the simulated device, and CUDA device 0 when it
# opens) and the CUDA pair rows, with the stack over the resource (goal:
# <= 1.3x).
set -uo pipefail
old="${1:?usage: gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR}"
new="${2:?usage: gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR}"
out="${3:?usage: gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR}"
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for i in 1 2 3; do
    for b in old new; do
        dir=$old; [ $b = new ] && dir=$new
        timeout 120 "$dir/bin-bench_table" --decorators > "$out/decorators-$b-$i.txt" 2>&1
        echo "=== decorators, $b, run $i (best, median)"
        grep -E "^[0-9].*(adds|added to|over the cache +[0-9.]+x|/ the cache)" "$out/decorators-$b-$i.txt" ||
            echo "no figures: see $out/decorators-$b-$i.txt"
    done
done
for b in old new; do
    dir=$old; [ $b = new ] && dir=$new
    timeout 240 "$dir/bin-bench_table" "$out/full-$b" > "$out/full-$b.txt" 2>&1
    echo "=== cuda pair rows, $b"
    grep -E "^cuda +pair +(raw driver pair|StreamOrderedResource|CachingResource|Budget\+Stats\+Tracing)" \
        "$out/full-$b.txt" || echo "no CUDA rows (no device?)"
    for size in "256 B" "64 KiB" "4 MiB"; do
        awk -v size="$size" '$1 == "cuda" && $2 == "pair" {
                name = $3; for (i = 4; i <= NF - 6; i++) name = name " " $i
                sz = $(NF - 5) " " $(NF - 4)
                if (sz == size && name == "StreamOrderedResource") r = $(NF - 2)
                if (sz == size && name == "Budget+Stats+Tracing") s = $(NF - 2) }
            END { if (r > 0) printf "  %s: stack / resource %.2fx\n", size, s / r }' "$out/full-$b.txt"
    done
done
