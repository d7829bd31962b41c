#!/usr/bin/env python3
"""Loads a snapshot streamalloc exported for PyTorch's memory viewer
(`MemorySnapshot::to_torch_pickle`, written by the `memory_viz` binary)
with PyTorch's own `torch.cuda._memory_viz` tools, and writes what they
make: the segment and trace plots (HTML), the segment summary and the
trace as text. Exits non-zero when a tool fails or makes nothing.

    python3 measure/scripts/check_memory_viz.py SNAPSHOT.pickle [OUT_DIR]

Needs PyTorch (no GPU: the tools only read the pickle).
"""
import os
import pickle
import sys

from torch.cuda import _memory_viz as viz

path = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(path))
with open(path, "rb") as f:
    data = pickle.load(f)

segments = data["segments"]
traces = data["device_traces"]
blocks = sum(len(s["blocks"]) for s in segments)
events = sum(len(t) for t in traces)
print(f"{len(segments)} segments, {blocks} blocks, {events} trace entries")
actions = sorted({e["action"] for t in traces for e in t})
print("actions:", ", ".join(actions))

made = {
    "segment_plot.html": viz.segment_plot(data),
    "trace_plot.html": viz.trace_plot(data),
    "trace_plot_segments.html": viz.trace_plot(data, plot_segments=True),
    "segsum.txt": viz.segsum(data),
    "trace.txt": viz.trace(data),
}
for name, text in made.items():
    assert text and len(text) > 100, f"{name}: nothing made"
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
    print(f"wrote {os.path.join(out, name)} ({len(text)} chars)")
print(made["segsum.txt"])
print("OK: torch.cuda._memory_viz read the snapshot")
