#!/usr/bin/env python3
"""Real models on PyTorch's allocator, then on streamalloc's (through
`torch.cuda.memory.CUDAPluggableAllocator`), in separate processes with the
same seeds; checks the outputs agree and writes, per model, the peak memory
reserved from the device, the time per step or token, and the allocator's
own time. Run on the GPU machine (PyTorch with CUDA; nothing downloaded):

    cargo build --release -p torch-alloc
    python3 torch-alloc/scripts/compare_models.py \\
        --lib target/release/libtorch_alloc.so --out OUT_DIR [--short] [--sanitize] \\
        [--hooks] [--models A,B] [--cross-stream done,wait] [--no-spread] [--free-running]

writes OUT_DIR/compare.json and OUT_DIR/compare.md, and prints the table.

Models (the shapes of `measure/scripts/record_trace.py`, whose model
classes are reused; random weights from seeds):
- `gpt2_infer`: GPT-2 small (124 M, fp16) generating greedily with its
  key/value cache on prompts of varying length and batch. Hugging Face's
  `GPT2LMHeadModel` from a config when `transformers` imports, else a
  GPT-2 of the same shape written here.
- `llama_serve4`: the LLaMA-style decoder of record_trace serving requests
  from four threads, each on its own `torch.cuda.Stream()` (batch 1-4,
  prompts 16-512, 8-32 new tokens: the weights are most of the memory).
- `llama_serve4_wide`: the same with the shape of the recorded
  `llama_serve4` trace (batch 1-16, prompts 16-768, 8-64 new tokens): the
  keys, values and activations of four concurrent requests are most of
  the memory, where an allocator's per-stream pools show.
- `llama_serve4_rr`: the server of the recorded `llama_serve4` trace
  itself (bf16, 32 requests of batch 1-16, prompts 16-768, 8-64 new
  tokens on four streams, decode steps round robin from one thread, so
  its outputs are deterministic): each request's keys and values grow by
  `torch.cat` on its own stream while the other three grow theirs, the
  pattern where PyTorch's per-stream pools hold the most (4.25x the live
  peak on the trace).
- `bert_train`: the BERT-base training step of record_trace (AdamW, bf16
  autocast, varying sequence length) with its inputs copied on a side
  stream. A pluggable allocator never sees `record_stream` (PyTorch drops
  it), so the step also makes the side stream wait for the main one before
  the side stream allocates again (`side.wait_stream(main)`): what a
  program must do for any allocator `record_stream` cannot reach.

Outputs. Every run takes every setting PyTorch offers for the same floats
from the same inputs (`deterministic()`: deterministic algorithms, warning
where an op has none, which the JSON lists; cuBLAS's fixed workspaces; no
TF32; no reduced-precision reductions in fp16/bf16 products; cuDNN
deterministic). The decoders are teacher-forced: PyTorch's first run
chooses its tokens, and every later run (streamalloc's, PyTorch's second)
is fed those tokens instead of its own choices, while it still computes
and records its own (`Forced`). With random bf16/fp16 weights the logits
are full of near ties: free-running, one float difference flips one token
and every token after it differs (the H100 call of 2026-12-06 saw 49 and
133 tokens differ, PyTorch against itself too); forced, both runs compute
on the same inputs, a flip stays one token, and the final logits of each
request compare. Runs agree when bitwise equal, or when the logits are
within twice PyTorch's own run-to-run spread (a second run of PyTorch's
allocator, fed the same tokens, made when the first two differ; 1e-3
relative at least) and no more tokens flipped than PyTorch flipped
against itself. `--free-running` compares free-running runs instead.

`--cross-stream done|wait|done,wait`: streamalloc's policy for memory
another stream freed (`STREAMALLOC_TORCH_CROSS_STREAM`): `done` (the
allocator's default) takes it only once the GPU is done with it, so no
PyTorch stream waits on another; `wait` lends it behind a wait on the GPU
(the library's default); `done,wait` runs streamalloc once with each
against the same PyTorch runs. Each run records the policy, the
allocations borrowed from another stream and the GPU waits queued for
them.

Peak reserved: `torch.cuda.max_memory_reserved()` for PyTorch's allocator;
for streamalloc, `streamalloc_torch_max_reserved_bytes` (the most the cache
held from the device, read after every allocation that may have grown it). Peak allocated:
`torch.cuda.max_memory_allocated()` and `streamalloc_torch_max_allocated_bytes`.
Allocator time: streamalloc's nanoseconds inside its alloc and free calls,
per call and as a share of the whole run (set-up and warm-ups included),
estimated from one call in eight, timed inside the C functions;
PyTorch's allocator does not expose its own.

`--hooks` also installs streamalloc's record_stream, empty_cache,
memory-fraction and capture begin/end hooks (`torch_hooks.py`: needs a C++
compiler, ninja and the CUDA runtime headers on the machine); with them
streamalloc asks the driver about captures only while `torch.cuda.graph`
says one is underway, as PyTorch's allocator does, instead of at every
call. Each run's JSON says whether they were installed, or why not.

`--sanitize` runs one short run of each model on streamalloc under
`compute-sanitizer --tool memcheck --track-stream-ordered-races all` and
records each run's ERROR SUMMARY (`--only-sanitize`: those runs alone; with
`--models` one model per call keeps each call short).
"""
import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODELS = ("gpt2_infer", "llama_serve4", "llama_serve4_wide", "llama_serve4_rr", "bert_train")
SEED = 7
# The allocator's policy for memory another stream freed (torch-alloc's
# `config`): `done` (its default) or `wait`.
CROSS_STREAM_ENV = "STREAMALLOC_TORCH_CROSS_STREAM"


# ------------------------------------------------------------------ child
class Dev:
    """The device the models run on: "cuda", or "cpu" for a dry run of the
    script's logic on a machine without a GPU (no streams, no memory
    figures, PyTorch's allocator only)."""

    def __init__(self, torch, name):
        self.torch, self.name, self.cuda = torch, name, name == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def stream(self):
        return self.torch.cuda.Stream() if self.cuda else None

    def current(self):
        return self.torch.cuda.current_stream() if self.cuda else None

    def wait(self, later, earlier):
        """`later` waits for the work queued on `earlier` so far."""
        if self.cuda:
            later.wait_stream(earlier)

    def on(self, stream):
        import contextlib

        return self.torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()


def install_streamalloc(lib_path):
    """Makes streamalloc PyTorch's allocator; must run before any CUDA
    tensor exists. Returns the library, for its statistics."""
    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        lib_path, "streamalloc_torch_alloc", "streamalloc_torch_free"
    )
    torch.cuda.memory.change_current_allocator(alloc)
    lib = ctypes.CDLL(lib_path)
    for name in ("streamalloc_torch_max_reserved_bytes", "streamalloc_torch_max_allocated_bytes",
                 "streamalloc_torch_reserved_bytes", "streamalloc_torch_failures"):
        getattr(lib, name).restype = ctypes.c_uint64
        getattr(lib, name).argtypes = [ctypes.c_int]
    lib.streamalloc_torch_last_error.restype = ctypes.c_size_t
    return lib


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
        "allocs", "frees", "alloc_nanos", "free_nanos", "failures",
        "cache_hits", "cache_borrows", "cache_misses", "cross_stream_done",
        "cache_cross_stream_waits")]


def install_rmm():
    """Makes RMM's pool PyTorch's allocator, as `rmm.allocators.torch`
    does, with statistics above and below the pool: the pool starts at
    2 MiB and grows (RMM's default of half the free memory up front would
    make "reserved" meaningless). Returns (below, above)."""
    import rmm
    import torch
    from rmm.allocators.torch import rmm_torch_allocator

    below = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    pool = rmm.mr.PoolMemoryResource(below, initial_pool_size=2**21)
    above = rmm.mr.StatisticsResourceAdaptor(pool)
    rmm.mr.set_current_device_resource(above)
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    return below, above


def sa_stats(lib):
    s = Stats()
    if lib.streamalloc_torch_stats(0, ctypes.byref(s)) != 0:
        return None
    return {name: getattr(s, name) for name, _ in Stats._fields_}


def last_error(lib):
    buf = ctypes.create_string_buffer(1024)
    lib.streamalloc_torch_last_error(buf, ctypes.c_size_t(1024))
    return buf.value.decode(errors="replace")


def gpt2_model(torch):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12)
        model = GPT2LMHeadModel(cfg)
        kind = "transformers.GPT2LMHeadModel"

        def step(ids, past):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            return out.logits, out.past_key_values
    except ImportError:
        model = MiniGPT2(torch)
        kind = "GPT-2 small written here (no transformers)"

        def step(ids, past):
            return model(ids, past)
    return model, step, kind


def MiniGPT2(torch):
    """GPT-2 small: 12 layers, d 768, 12 heads, learned positions,
    pre-LayerNorm, GELU MLP, key/value cache by concatenation."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d=768, h=12):
            super().__init__()
            self.h = h
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, past):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
            if past is not None:
                k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            x = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return x, (k, v)

    class GPT2(nn.Module):
        def __init__(self, vocab=50257, d=768, layers=12, n_pos=1024):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_pos, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)

        def forward(self, ids, past):
            start = 0 if past is None else past[0][0].shape[2]
            pos = torch.arange(start, start + ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(pos)
            new = []
            for i, blk in enumerate(self.blocks):
                x, c = blk(x, None if past is None else past[i])
                new.append(c)
            return self.ln(x) @ self.wte.weight.T, new

    return GPT2()


def run_gpt2(torch, dev, rng, short, forced=None):
    model, step, kind = gpt2_model(torch)
    model = model.to(dev.name, torch.float16 if dev.cuda else torch.float32).eval()
    requests = 2 if short else 16
    outputs, times = [], []
    with torch.inference_mode():
        for r in range(requests + 1):  # the first is a warm-up, not timed
            b, p, n = rng.randint(1, 8), rng.randint(16, 896), rng.randint(8, 32)
            if short:
                p, n = min(p, 128), min(n, 8)
            ids = torch.randint(0, 50257, (b, p), device=dev.name)
            feed = forced.take(r - 1, b, n) if forced and r > 0 else None
            dev.sync()
            t0 = time.perf_counter()
            logits, past = step(ids, None)
            toks = []
            for s in range(n):
                nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                toks.append(nxt)
                logits, past = step(nxt if feed is None else feed[:, s:s + 1], past)
            dev.sync()
            if r > 0:
                times.append((time.perf_counter() - t0) / n)
                outputs.append({"tokens": torch.cat(toks, 1).cpu(),
                                "logits": logits[:, -1, :].float().cpu()})
            del logits, past, ids, toks
    return outputs, times, "per token", kind


def run_llama_serve4_wide(torch, dev, rng, short, forced=None):
    return run_llama_serve4(torch, dev, rng, short, forced, wide=True)


def run_llama_serve4(torch, dev, rng, short, forced=None, wide=False):
    sys.path.insert(0, str(ROOT / "measure" / "scripts"))
    from record_trace import Llama

    model = Llama().to(dev.name, torch.float16 if dev.cuda else torch.float32).eval()
    dev.sync()
    # The wide shape's requests are about four times the work of the narrow
    # one's: three a thread keep a run near a minute on an H100.
    # Short (and under memcheck): one request a thread for the wide shape,
    # whose memcheck did not finish in 290 s with two (H100, 2026-12-06).
    per_thread = (1 if wide else 2) if short else (3 if wide else 6)
    cap = (128, 8) if short else ((768, 64) if wide else (512, 32))
    batch = 16 if wide and not short else 4
    plans = [[(rng.randint(1, batch), rng.randint(16, cap[0]), rng.randint(8, cap[1])) for _ in range(per_thread)]
             for _ in range(4)]
    # Inputs made up front from one generator, so that the four threads'
    # interleaving cannot change them.
    inputs = [[torch.randint(0, 32000, (b, p), device=dev.name) for b, p, _ in plan] for plan in plans]
    # The reference run's tokens, fed instead of this run's choices (see
    # `Forced`): outputs are listed thread by thread, request by request.
    feeds = [[forced.take(i * per_thread + j, b, n) if forced else None
              for j, (b, _, n) in enumerate(plan)] for i, plan in enumerate(plans)]
    dev.sync()
    results = [[None] * per_thread for _ in range(4)]
    tokens = [0] * 4
    errors = []

    def serve(i):
        try:
            stream = dev.stream()
            dev.wait(stream, dev.current())
            with torch.inference_mode(), dev.on(stream):
                for j, (b, p, n) in enumerate(plans[i]):
                    feed = feeds[i][j]
                    logits, caches = model(inputs[i][j], 0, None)
                    toks = []
                    for s in range(n):
                        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                        toks.append(nxt)
                        logits, caches = model(nxt if feed is None else feed[:, s:s + 1], p + s, caches)
                    results[i][j] = {"tokens": torch.cat(toks, 1).cpu(),
                                     "logits": logits[:, -1, :].float().cpu()}
                    tokens[i] += b * n
                    del logits, caches, toks
                dev.sync()
        except Exception as e:  # reported by the parent
            errors.append(repr(e))

    # One warm-up request on the default stream (kernels loaded, cuBLAS
    # set up), not timed.
    with torch.inference_mode():
        model(inputs[0][0][:, :16], 0, None)
    dev.sync()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=serve, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dev.sync()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError("; ".join(errors))
    outputs = [r for thread in results for r in thread]
    return outputs, [wall / sum(tokens)], "per token (4 streams)", "record_trace.Llama"


def run_llama_serve4_rr(torch, dev, rng, short, forced=None):
    """The server of record_trace's `llama_serve4` trace: one thread, four
    streams, each holding one request at a time (batch 1-16, prompts
    16-768, 8-64 new tokens), decode steps round robin over the streams,
    a finished request's stream taking the next one. Each request's keys
    and values grow by `torch.cat` on its own stream while the others
    grow theirs: where PyTorch's per-stream pools hold the most."""
    sys.path.insert(0, str(ROOT / "measure" / "scripts"))
    from record_trace import Llama

    model = Llama().to(dev.name, torch.bfloat16 if dev.cuda else torch.float32).eval()
    count, cap = (4, (128, 8)) if short else (32, (768, 64))
    plans = [(rng.randint(1, 16), rng.randint(16, cap[0]), rng.randint(8, cap[1])) for _ in range(count)]
    inputs = [torch.randint(0, 32000, (b, p), device=dev.name) for b, p, _ in plans]
    feeds = [forced.take(j, b, n) if forced else None for j, (b, _, n) in enumerate(plans)]
    streams = [dev.stream() for _ in range(4)]
    with torch.inference_mode():
        model(inputs[0][:, :16], 0, None)  # warm-up (kernels, cuBLAS), not timed
    dev.sync()
    for s in streams:
        dev.wait(s, dev.current())
    outputs = [None] * count
    queue, active, tokens = list(range(count)), [None] * 4, 0
    # The time of each round over the four streams, per token it decoded:
    # the schedule depends only on the plans, so round k is the same work
    # in every run and two runs' rounds pair up (`paired_time_ratio`).
    rounds = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        while queue or any(a is not None for a in active):
            r0, r_tokens = time.perf_counter(), 0
            for i, s in enumerate(streams):
                with dev.on(s):
                    if active[i] is None and queue:
                        j = queue.pop(0)
                        logits, caches = model(inputs[j], 0, None)
                        active[i] = [j, 0, logits, caches, []]
                    a = active[i]
                    if a is None:
                        continue
                    j, done, logits, caches, toks = a
                    b, p, n = plans[j]
                    if done >= n:
                        outputs[j] = {"tokens": torch.cat(toks, 1).cpu(),
                                      "logits": logits[:, -1, :].float().cpu()}
                        tokens += b * n
                        active[i] = None
                        continue
                    nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                    toks.append(nxt)
                    feed = feeds[j]
                    a[2], a[3] = model(nxt if feed is None else feed[:, done:done + 1], p + done, caches)
                    a[1] += 1
                    r_tokens += b
            if r_tokens:
                rounds.append((time.perf_counter() - r0) / r_tokens)
    dev.sync()
    wall = time.perf_counter() - t0
    return outputs, rounds, f"per token (4 streams, round robin; whole run {wall / tokens * 1e3:.2f} ms)", \
        "record_trace.Llama"


def run_bert_train(torch, dev, rng, short, forced=None):
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "measure" / "scripts"))
    from record_trace import Bert

    model = Bert().to(dev.name).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side, main = dev.stream(), dev.current()
    steps = 2 if short else 16
    losses, times = [], []
    for i in range(steps + 1):  # the first is a warm-up, not timed
        b, t = 16, 64 * rng.randint(1, 8)
        host = torch.randint(0, 30522, (2, b, t))
        if dev.cuda:
            host = host.pin_memory()
        dev.sync()
        t0 = time.perf_counter()
        # The side stream allocates only once ordered after the main one's
        # uses of its earlier copies (record_stream never reaches a
        # pluggable allocator).
        dev.wait(side, main)
        with dev.on(side):
            both = host.to(dev.name, non_blocking=True)
        dev.wait(main, side)
        if dev.cuda:
            both.record_stream(main)
        ids, labels = both[0], both[1]
        with torch.autocast(dev.name, dtype=torch.bfloat16):
            logits = model(ids)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().float().cpu()
        dev.sync()
        if i > 0:
            times.append(time.perf_counter() - t0)
            losses.append({"loss": value})
        del both, ids, labels, logits, loss
    return losses, times, "per step", "record_trace.Bert"


class Forced:
    """Teacher forcing: the token sequences a reference run chose (its
    outputs' "tokens", one (batch, new tokens) tensor per request, in the
    order the outputs are listed), fed to the model instead of this run's
    own choices. Both runs then compute on the same inputs: a token that
    float noise flips at a near tie (random weights in bf16 or fp16 give
    many) changes that one choice, not every step after it, and the
    logits of the two runs compare. Each run still computes and records
    its own choice (the argmax), so the two runs make the same kernels and
    the same allocations."""

    def __init__(self, torch, dev, path):
        self.outputs = torch.load(path, weights_only=True)
        self.dev = dev

    def take(self, k, b, n):
        """Request `k`'s tokens on the device (made before the timed part,
        on the current stream), checked against its plan of `b` rows and
        `n` new tokens."""
        toks = self.outputs[k]["tokens"]
        if tuple(toks.shape) != (b, n):
            raise RuntimeError(f"request {k}: the reference decoded {tuple(toks.shape)}, "
                               f"this run plans {(b, n)}")
        return toks.to(self.dev.name)


DECODERS = ("gpt2_infer", "llama_serve4", "llama_serve4_wide", "llama_serve4_rr")


def deterministic(torch):
    """Every setting PyTorch offers for the same floats from the same
    inputs: deterministic algorithms (warning where an op has none, so the
    run's JSON names them), cuBLAS's fixed workspaces (the parent sets
    `CUBLAS_WORKSPACE_CONFIG`), no TF32, no reduced-precision reductions
    in fp16 and bf16 matrix products, cuDNN deterministic and not
    benchmarking. Both allocators' runs take the same settings."""
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


RUNNERS = {"gpt2_infer": run_gpt2, "llama_serve4": run_llama_serve4, "llama_serve4_wide": run_llama_serve4_wide, "llama_serve4_rr": run_llama_serve4_rr, "bert_train": run_bert_train}


def child(args):
    on_gpu = args.device == "cuda"
    lib = install_streamalloc(args.lib) if args.allocator == "streamalloc" and on_gpu else None
    rmm_stats = install_rmm() if args.allocator == "rmm" else None
    hooks = "not asked (--hooks)"
    if lib and args.hooks:
        sys.path.insert(0, str(HERE))
        import torch_hooks

        hooks = torch_hooks.install(args.lib) or "installed"
    import warnings

    import torch

    deterministic(torch)
    rng = random.Random(SEED)
    t0 = time.perf_counter()
    dev = Dev(torch, args.device)
    forced = Forced(torch, dev, args.forced) if args.forced else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs, times, unit, kind = RUNNERS[args.model](torch, dev, rng, args.short, forced)
        dev.sync()
    res = {"model": args.model, "allocator": args.allocator, "kind": kind, "unit": unit,
           "time_median": statistics.median(times), "time_all": times,
           "wall_s": time.perf_counter() - t0, "steps": len(times),
           "teacher_forced": forced is not None,
           # The ops PyTorch has no deterministic kernel for, as it warned.
           "nondeterministic_ops": sorted({str(w.message).splitlines()[0] for w in caught
                                           if "determinis" in str(w.message)})}
    if lib:
        after = sa_stats(lib)
        if after is None:
            raise RuntimeError(f"streamalloc could not open device 0: {last_error(lib)}")
        res["peak_reserved"] = after["peak_reserved_bytes"]
        res["peak_allocated"] = after["peak_allocated_bytes"]
        calls = after["allocs"] + after["frees"]
        nanos = after["alloc_nanos"] + after["free_nanos"]
        res["allocator_calls"] = calls
        res["allocator_ns_per_call"] = nanos / calls if calls else 0.0
        # Of the whole run (model set-up and warm-ups included).
        res["allocator_share"] = nanos / 1e9 / res["wall_s"]
        res["failures"] = after["failures"]
        # Allocations served from the stream's own memory, by memory another
        # stream freed (ordered behind it, maybe by a wait on the GPU), and
        # by new memory; the policy for memory another stream freed, and the
        # waits on the GPU it queued (each holds a stream behind another's
        # work).
        for k in ("cache_hits", "cache_borrows", "cache_misses", "cache_cross_stream_waits"):
            res[k] = after[k]
        res["cross_stream"] = "done" if after["cross_stream_done"] else "wait"
        res["hooks"] = hooks
        if after["failures"]:
            res["last_error"] = last_error(lib)
    elif rmm_stats:
        below, above = rmm_stats
        res["peak_reserved"] = below.allocation_counts.peak_bytes
        res["peak_allocated"] = above.allocation_counts.peak_bytes
    else:
        res["peak_reserved"] = torch.cuda.max_memory_reserved() if dev.cuda else 1
        res["peak_allocated"] = torch.cuda.max_memory_allocated() if dev.cuda else 1
    if args.allocator == "streamalloc" and not lib:  # the CPU dry run
        res.update(allocator_calls=0, allocator_ns_per_call=0.0, allocator_share=0.0, failures=0,
                   cache_cross_stream_waits=0,
                   cross_stream=os.environ.get(CROSS_STREAM_ENV, "done"))
    torch.save(outputs, args.result + ".pt")
    Path(args.result).write_text(json.dumps(res, indent=1))


# ----------------------------------------------------------------- parent
def run_child(args, model, allocator, tag, sanitize=False, forced=None, cross_stream=None):
    result = str(Path(args.out) / f"{model}.{tag}.json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model,
           "--allocator", allocator, "--lib", args.lib, "--result", result]
    if args.short or sanitize:
        cmd.append("--short")
    cmd += ["--device", args.device]
    if args.hooks:
        cmd.append("--hooks")
    if forced:
        cmd += ["--forced", forced]
    if sanitize:
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--track-stream-ordered-races", "all",
               "--error-exitcode", "0"] + cmd
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0")
    if cross_stream:
        env[CROSS_STREAM_ENV] = cross_stream
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log = Path(args.out) / f"{model}.{tag}.log"
    log.write_text(p.stdout + p.stderr)
    print(f"  {model} on {allocator} ({tag}): rc={p.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
    if sanitize:
        summary = [l for l in (p.stdout + p.stderr).splitlines() if "ERROR SUMMARY" in l]
        return {"rc": p.returncode, "summary": summary[-1] if summary else "no summary (see log)",
                "log": str(log)}
    if p.returncode != 0:
        return {"error": (p.stdout + p.stderr)[-2000:]}
    return json.loads(Path(result).read_text())


def compare(torch, a, b):
    """Differences between two runs' outputs: (tokens differing, largest
    relative difference of the floating outputs, bitwise equal). Under
    teacher forcing the tokens are each run's own choices on the same
    inputs: a difference is a near tie that float noise flipped, one
    choice, not the rest of a sequence."""
    tok_diff, rel, bitwise = 0, 0.0, True
    for x, y in zip(a, b):
        for key in x:
            u, v = x[key], y[key]
            if key == "tokens":
                tok_diff += int((u != v).sum())
                bitwise &= bool(torch.equal(u, v))
            else:
                bitwise &= bool(torch.equal(u, v))
                scale = float(u.abs().max()) or 1.0
                rel = max(rel, float((u - v).abs().max()) / scale)
    return tok_diff, rel, bitwise


def paired_ratio(ref, ours):
    """The median of step-by-step time ratios, where both runs made the
    same steps (same plans, same inputs: step k is the same work in each),
    else None. Less moved by a slow stretch of the host than a ratio of
    two runs' medians: each step is read against its own twin."""
    if len(ref) != len(ours) or len(ref) < 2:
        return None
    return statistics.median(o / r for r, o in zip(ref, ours) if r > 0)


def verdict(bitwise, toks, rel, spread_toks, spread_rel):
    """Whether two runs agree: bitwise, or the logits within twice PyTorch's
    own run-to-run spread (1e-3 relative at least) and no more tokens
    flipped than PyTorch flipped against itself. Returns (agree, tolerance)."""
    tol = max(2 * spread_rel, 1e-3)
    return bitwise or (rel <= tol and toks <= spread_toks), tol


def parent(args):
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = [p for p in args.cross_stream.split(",") if p]
    if not policies or any(p not in ("done", "wait") for p in policies):
        sys.exit(f"--cross-stream: a list of done and wait, not {args.cross_stream!r}")
    report = {"torch": torch.__version__, "cuda": torch.version.cuda, "models": {},
              "teacher_forcing": not args.free_running, "cross_stream": policies}
    if torch.cuda.is_available():
        report["device"] = torch.cuda.get_device_name(0)
    for model in args.models.split(","):
        print(f"{model}:", flush=True)
        if args.only_sanitize:
            report["models"][model] = {"memcheck": run_child(args, model, "streamalloc", "memcheck", sanitize=True,
                                                             cross_stream=policies[0])}
            continue
        # The reference: PyTorch's allocator, choosing its own tokens. Every
        # later run of a decoder is fed its tokens (teacher forcing).
        ref = run_child(args, model, "torch", "torch")
        forced = None
        if model in DECODERS and not args.free_running and "error" not in ref:
            forced = str(out / f"{model}.torch.json.pt")
        load = lambda tag: torch.load(out / f"{model}.{tag}.json.pt", weights_only=True)
        runs = {}
        for i, policy in enumerate(policies):
            tag = "streamalloc" if i == 0 else f"streamalloc-{policy}"
            runs[policy] = (tag, run_child(args, model, "streamalloc", tag, forced=forced, cross_stream=policy))
        ours = runs[policies[0]][1]
        row = {"torch": ref, "streamalloc": ours}
        if len(policies) > 1:
            row["streamalloc_by_policy"] = {p: r for p, (_, r) in runs.items()}
        spread = None
        if "error" not in ref:
            row["by_policy"] = {}
            for policy, (tag, res) in runs.items():
                if "error" in res:
                    continue
                toks, rel, bitwise = compare(torch, load("torch"), load(tag))
                if not bitwise and spread is None and not args.no_spread:
                    # PyTorch against itself, fed the same tokens.
                    again = run_child(args, model, "torch", "torch2", forced=forced)
                    spread = (0, 0.0, True)
                    if "error" not in again:
                        spread = compare(torch, load("torch"), load("torch2"))
                        row["torch2"] = again
                s_toks, s_rel, s_bitwise = spread or (0, 0.0, True)
                agree, tol = verdict(bitwise, toks, rel, s_toks, s_rel)
                row["by_policy"][policy] = {
                    "outputs": {"bitwise": bitwise, "tokens_differing": toks, "max_rel_diff": rel,
                                "torch_run_to_run_rel": s_rel, "torch_run_to_run_tokens": s_toks,
                                "torch_run_to_run_bitwise": s_bitwise, "spread_run": spread is not None,
                                "teacher_forced": forced is not None, "tolerance": tol, "agree": agree},
                    "reserved_ratio": res["peak_reserved"] / ref["peak_reserved"],
                    "time_ratio": res["time_median"] / ref["time_median"],
                    "paired_time_ratio": paired_ratio(ref["time_all"], res["time_all"]),
                    "reserved_over_allocated": res["peak_reserved"] / max(1, res["peak_allocated"]),
                }
            if policies[0] in row["by_policy"]:
                row.update(row["by_policy"][policies[0]])
            row["torch_reserved_over_allocated"] = ref["peak_reserved"] / max(1, ref["peak_allocated"])
        if args.rmm:
            theirs = run_child(args, model, "rmm", "rmm")
            row["rmm"] = theirs
            if "error" not in theirs and "error" not in ours and "error" not in ref:
                toks, rel, bitwise = compare(torch, load("torch"), load("rmm"))
                row["rmm_outputs"] = {"bitwise": bitwise, "tokens_differing": toks, "max_rel_diff": rel}
                row["rmm_reserved_ratio"] = ours["peak_reserved"] / theirs["peak_reserved"]
                row["rmm_time_ratio"] = ours["time_median"] / theirs["time_median"]
        if args.sanitize:
            row["memcheck"] = run_child(args, model, "streamalloc", "memcheck", sanitize=True,
                                        cross_stream=policies[0])
        report["models"][model] = row
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    md = table(report)
    (out / "compare.md").write_text(md)
    print(md)


def table(report):
    mib = lambda b: f"{b / 2**20:.0f}"
    forcing = "teacher-forced (each run fed PyTorch's first run's tokens)" if report.get("teacher_forcing") \
        else "free-running"
    lines = [f"PyTorch {report['torch']} (CUDA {report['cuda']}) on {report.get('device', '?')}; "
             f"decoders {forcing}", "",
             "| model | outputs | peak reserved MiB, PyTorch / streamalloc (ratio) | peak reserved / allocated, PyTorch / streamalloc "
             "| time, PyTorch / streamalloc (ratio) | streamalloc allocator time | memory another stream freed | memcheck |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, row in report["models"].items():
        if "torch" not in row:
            lines.append(f"| {model} | | | | | | | {row['memcheck']['summary']} |")
            continue
        ref = row["torch"]
        if "error" in ref:
            lines.append(f"| {model} | run failed: see {model}.*.log | | | | | | |")
            continue
        by_result = row.get("streamalloc_by_policy") or {report["cross_stream"][0]: row["streamalloc"]}
        for policy, ours in by_result.items():
            name = model if len(by_result) == 1 else f"{model} ({policy})"
            cmp = row.get("by_policy", {}).get(policy)
            if "error" in ours or cmp is None:
                lines.append(f"| {name} | run failed: see {model}.*.log | | | | | | |")
                continue
            o = cmp["outputs"]
            spread = (f"; PyTorch against itself: {o['torch_run_to_run_tokens']} tokens, "
                      f"rel {o['torch_run_to_run_rel']:.1e}" if o["spread_run"] else "")
            agree = ("bitwise" if o["bitwise"] else
                     f"{'agree' if o['agree'] else 'DIFFER'}: {o['tokens_differing']} tokens, "
                     f"rel {o['max_rel_diff']:.1e}{spread}")
            unit = ref["unit"]
            fmt = lambda s: f"{s * 1e3:.2f} ms"
            mc = row.get("memcheck", {}).get("summary", "not run")
            fails = f", {ours['failures']} failures" if ours.get("failures") else ""
            again = row.get("torch2", {})
            # PyTorch's own run-to-run time, where it ran twice: the noise
            # a time ratio is read against.
            twice = ""
            if "time_median" in again:
                ap = paired_ratio(ref["time_all"], again["time_all"])
                twice = (f"; PyTorch again {fmt(again['time_median'])} ({again['time_median'] / ref['time_median']:.3f}x"
                         + (f"; step by step {ap:.3f}x" if ap is not None else "") + ")")
            pr = cmp.get("paired_time_ratio")
            paired = f"; step by step {pr:.3f}x" if pr is not None else ""
            lines.append(
                f"| {name} | {agree} | {mib(ref['peak_reserved'])} / {mib(ours['peak_reserved'])} "
                f"({cmp['reserved_ratio']:.2f}x) | {row['torch_reserved_over_allocated']:.3f}x / "
                f"{cmp['reserved_over_allocated']:.3f}x | "
                f"{fmt(ref['time_median'])} / {fmt(ours['time_median'])} {unit} ({cmp['time_ratio']:.3f}x{paired}){twice} | "
                f"{ours['allocator_ns_per_call']:.0f} ns/call, {100 * ours['allocator_share']:.2f}% of the run{fails} | "
                f"{ours.get('cross_stream', '?')}: {ours.get('cache_borrows', 0)} borrowed, "
                f"{ours.get('cache_cross_stream_waits', '?')} GPU waits | {mc} |")
    rmm_rows = [(m, r) for m, r in report["models"].items() if "rmm" in r]
    if rmm_rows:
        lines += ["", "| model | RMM pool: outputs vs PyTorch | peak reserved MiB, RMM / streamalloc (ratio) "
                  "| time, RMM / streamalloc (ratio) |", "| --- | --- | --- | --- |"]
        for model, row in rmm_rows:
            theirs, ours = row["rmm"], row["streamalloc"]
            if "error" in theirs or "rmm_reserved_ratio" not in row:
                lines.append(f"| {model} | run failed: see {model}.rmm.log | | |")
                continue
            o = row["rmm_outputs"]
            agree = "bitwise" if o["bitwise"] else f"{o['tokens_differing']} tokens, rel {o['max_rel_diff']:.1e}"
            lines.append(f"| {model} | {agree} | {mib(theirs['peak_reserved'])} / {mib(ours['peak_reserved'])} "
                         f"({row['rmm_reserved_ratio']:.2f}x) | {theirs['time_median'] * 1e3:.2f} / "
                         f"{ours['time_median'] * 1e3:.2f} ms ({row['rmm_time_ratio']:.3f}x) |")
    nondet = sorted({op for row in report["models"].values() for k in ("torch", "streamalloc")
                     if isinstance(row.get(k), dict) for op in row[k].get("nondeterministic_ops", [])})
    if nondet:
        lines += ["", "Ops PyTorch ran without a deterministic kernel (its warnings):", ""]
        lines += [f"- {op}" for op in nondet]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libtorch_alloc.so")
    ap.add_argument("--out", help="directory for compare.json, compare.md, logs")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--short", action="store_true", help="a few steps per model")
    ap.add_argument("--no-spread", action="store_true",
                    help="no second run of PyTorch's allocator when the outputs differ (its run-to-run spread)")
    ap.add_argument("--sanitize", action="store_true", help="also a short memcheck run of each model on streamalloc")
    ap.add_argument("--only-sanitize", action="store_true", help="only the memcheck runs")
    ap.add_argument("--hooks", action="store_true",
                    help="compile torch_hooks.py's extension so that record_stream, empty_cache and "
                         "memory fractions reach streamalloc")
    ap.add_argument("--rmm", action="store_true",
                    help="also RMM's pool through the same hook (rmm.allocators.torch; needs rmm installed)")
    ap.add_argument("--cross-stream", default="done",
                    help="streamalloc's policy for memory another stream freed (STREAMALLOC_TORCH_CROSS_STREAM): "
                         "done (its default: only once the GPU is done with it), wait (behind a wait on the GPU), "
                         "or done,wait: one streamalloc run of each, compared against the same PyTorch runs")
    ap.add_argument("--free-running", action="store_true",
                    help="no teacher forcing: each decoder run chooses its own tokens")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a dry run of the script without a GPU (runs streamalloc's side on PyTorch's "
                         "allocator too, so only the logic is checked)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=("torch", "streamalloc", "rmm"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--forced", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = str(Path(args.lib).resolve())
    if args.child:
        child(args)
    else:
        if not args.out:
            ap.error("--out is required")
        parent(args)


if __name__ == "__main__":
    main()
