#!/usr/bin/env bash
# Issue 31's decorators, two builds in turn on one machine:
# `scripts/gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR`, each DIR holding a
# `bin-bench_table` (`cargo build --release -p streamalloc-measure --bin
# bench_table`). Runs `--null-only` three times per build, alternating, and
# prints per build the median of the 9 rows (3 runs x 3 sizes) of the
# resource's pair, the cache's and the Budget+Stats+Tracing stack's, with
# what the stack adds (goal: <= 50 ns). Then the whole table once per build
# (the simulated device, and CUDA device 0 when it opens) and the CUDA pair
# rows, with the stack over the resource (goal: <= 1.3x).
set -uo pipefail
old="${1:?usage: gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR}"
new="${2:?usage: gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR}"
out="${3:?usage: gpu-decorators-ab.sh OLD_DIR NEW_DIR OUT_DIR}"
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for i in 1 2 3; do
    for b in old new; do
        dir=$old; [ $b = new ] && dir=$new
        timeout 120 "$dir/bin-bench_table" --null-only "$out/null-$b-$i" > /dev/null 2>&1
    done
done
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
rows() { # BUILD BACKEND PEER: the ns/pair of the pair rows, one per line
    cat "$out"/null-$1-*/bench_table.txt 2>/dev/null |
        awk -v peer="$3" -v be="$2" '$1 == be && $2 == "pair" {
            name = $3; for (i = 4; i <= NF - 6; i++) name = name " " $i
            if (name == peer) print $(NF - 2) }'
}
for b in old new; do
    res=$(rows $b null StreamOrderedResource | median)
    cache=$(rows $b null CachingResource | median)
    stack=$(rows $b null Budget+Stats+Tracing | median)
    echo "null $b: resource $res ns, cache $cache ns, stack $stack ns;" \
        "the stack adds $(awk -v s="$stack" -v r="$res" 'BEGIN {printf "%.1f", s - r}') ns"
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
