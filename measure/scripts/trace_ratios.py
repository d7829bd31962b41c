#!/usr/bin/env python3
"""Per round of `scripts/gpu-run.sh traces DIR`: the cache's and PyTorch's
ns/op (the median of each round's two repeats) and PyTorch's over the
cache's, for each trace with PyTorch's figures in DIR; then the median
and the range over the rounds.

    python3 measure/scripts/trace_ratios.py DIR
"""
import json
import re
import statistics
import sys
from pathlib import Path


def rounds(path, parse):
    """{round: [ns_per_op, ...]} from a file where `round=N` lines open
    each round."""
    out, cur = {}, None
    for line in Path(path).read_text().splitlines():
        m = re.match(r"round=(\d+)", line)
        if m:
            cur = int(m.group(1))
            continue
        ns = parse(line)
        if cur is not None and ns is not None:
            out.setdefault(cur, []).append(ns)
    return out


def ours(line):
    m = re.search(r"stack=cache backend=\w+ rep=\d+ .*? ns_per_op=([0-9.]+)", line)
    return float(m.group(1)) if m else None


def torch(line):
    if not line.startswith("{"):
        return None
    return float(json.loads(line)["ns_per_op"])


def main(d):
    traces = sorted(p.name[: -len(".torch.txt")] for p in Path(d).glob("*.torch.txt"))
    if not traces:
        print(f"no PyTorch figures in {d}")
    for trace in traces:
        a = rounds(Path(d) / f"{trace}.streamalloc.txt", ours)
        b = rounds(Path(d) / f"{trace}.torch.txt", torch)
        ratios = []
        for r in sorted(set(a) & set(b)):
            x, y = statistics.median(a[r]), statistics.median(b[r])
            ratios.append(y / x)
            print(f"{trace} round {r}: cache {x:.1f} ns/op, PyTorch {y:.1f} ns/op, PyTorch/cache {y / x:.2f}x")
        if ratios:
            print(f"{trace}: PyTorch/cache median {statistics.median(ratios):.2f}x, "
                  f"range {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} rounds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces-out")
