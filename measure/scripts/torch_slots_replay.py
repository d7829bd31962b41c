"""PyTorch's caching allocator on a trace, with the bookkeeping of
`trace_replay` instead of a hash map: the same as
measure/traces/torch_cpp_replay.py (C++ through raw_alloc_with_stream /
raw_delete, a fresh cache each repeat, a control loop subtracted), except
that each operation's slot in a table of live blocks is worked out before
the clock starts and the table is written before it, as `trace_replay`
does since 2026-12-05. Run both scripts to see what the bookkeeping alone
moves in PyTorch's figure; the cache's figure is comparable to this one.

    python3 measure/scripts/torch_slots_replay.py TRACE.ops.csv.gz [repeats]
"""
import csv, gzip, json, os, sys
import torch
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <chrono>
namespace A = c10::cuda::CUDACachingAllocator;
double replay(const std::vector<int64_t>& kind, const std::vector<int64_t>& slot,
              const std::vector<int64_t>& size, const std::vector<int64_t>& stream,
              int64_t nstreams, int64_t nslots, bool do_alloc) {
  std::vector<cudaStream_t> ss;
  ss.push_back(c10::cuda::getCurrentCUDAStream().stream());
  for (int64_t i = 1; i < nstreams; i++) ss.push_back(c10::cuda::getStreamFromPool().stream());
  std::vector<void*> live(nslots, nullptr);  // written here, before the clock
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < kind.size(); i++) {
    int64_t s = slot[i];
    if (kind[i]) {
      live[s] = do_alloc ? A::raw_alloc_with_stream(size[i], ss[stream[i]]) : (void*)(intptr_t)(size[i] + 1);
    } else if (s >= 0 && live[s]) {
      if (do_alloc) A::raw_delete(live[s]);
      live[s] = nullptr;
    }
  }
  for (auto p : live) if (p && do_alloc) A::raw_delete(p);
  cudaDeviceSynchronize();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / kind.size();
}
"""
mod = load_inline("trace_slots_replay", cpp_sources=src, functions=["replay"], with_cuda=True,
                  extra_cflags=["-O2"], verbose=False)
path = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
kind, slots, sizes, streams = [], [], [], []
by_id, free, nslots = {}, [], 0
with gzip.open(path, "rt") as f:
    for r in csv.DictReader(f):
        a = r["op"] == "a"
        if a:
            if free:
                s = free.pop()
            else:
                s, nslots = nslots, nslots + 1
            by_id[int(r["id"])] = s
        else:
            s = by_id.pop(int(r["id"]), -1)
            if s >= 0:
                free.append(s)
        kind.append(1 if a else 0); slots.append(s)
        sizes.append(int(r["size"])); streams.append(int(r["stream"]))
n = 1 + max(streams)
for i in range(reps):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    t = mod.replay(kind, slots, sizes, streams, n, nslots, True)
    c = mod.replay(kind, slots, sizes, streams, n, nslots, False)
    st = torch.cuda.memory_stats()
    print(json.dumps(dict(trace=os.path.basename(path), rep=i, harness="slots", ns_per_op=round(t - c, 1),
                          control_ns_per_op=round(c, 1), peak_reserved=st["reserved_bytes.all.peak"],
                          peak_allocated=st["allocated_bytes.all.peak"])), flush=True)
