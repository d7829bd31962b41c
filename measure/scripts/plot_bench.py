#!/usr/bin/env python3
"""Plots throughput against threads from examples/bench_table's CSV.

usage: plot_bench.py bench_table.csv throughput.png
One panel per backend (null / sim / cuda), one line per peer, pairs per
second (all threads together) on a log scale.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    series = defaultdict(lambda: defaultdict(list))
    with open(src, newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] != "threads":
                continue
            series[row["backend"]][row["peer"]].append(
                (int(row["threads"]), float(row["mpairs_per_s"]))
            )
    backends = sorted(series)
    fig, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 4), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        for peer, points in sorted(series[backend].items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=peer)
        ax.set_title(f"{backend}: allocate + free pairs, 64 KiB")
        ax.set_xlabel("threads (one stream each)")
        ax.set_ylabel("M pairs/s (all threads)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
