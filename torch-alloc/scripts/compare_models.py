#!/usr/bin/env python3
"""Real models on PyTorch's allocator, then on streamalloc's (through
`torch.cuda.memory.CUDAPluggableAllocator`), in separate processes with the
same seeds; checks the outputs agree and writes, per model, the peak memory
reserved from the device, the time per step or token, and the allocator's
own time. Run on the GPU machine (PyTorch with CUDA; nothing downloaded):

    cargo build --release -p torch-alloc
    python3 torch-alloc/scripts/compare_models.py \\
        --lib target/release/libtorch_alloc.so --out OUT_DIR [--short] [--sanitize]

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

Outputs agree when the generated tokens are identical and the logits or
losses are within the run-to-run spread of PyTorch's own allocator (a
second run of it, when the first two are not bitwise identical), or 1e-3
relative when that spread is 0 and the two allocators' outputs still
differ (kernels may pick other algorithms for other addresses).

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
        "cache_hits", "cache_borrows", "cache_misses")]


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


def run_gpt2(torch, dev, rng, short):
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
            dev.sync()
            t0 = time.perf_counter()
            logits, past = step(ids, None)
            toks = []
            for _ in range(n):
                nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                toks.append(nxt)
                logits, past = step(nxt, past)
            dev.sync()
            if r > 0:
                times.append((time.perf_counter() - t0) / n)
                outputs.append({"tokens": torch.cat(toks, 1).cpu(),
                                "logits": logits[:, -1, :].float().cpu()})
            del logits, past, ids, toks
    return outputs, times, "per token", kind


def run_llama_serve4_wide(torch, dev, rng, short):
    return run_llama_serve4(torch, dev, rng, short, wide=True)


def run_llama_serve4(torch, dev, rng, short, wide=False):
    sys.path.insert(0, str(ROOT / "measure" / "scripts"))
    from record_trace import Llama

    model = Llama().to(dev.name, torch.float16 if dev.cuda else torch.float32).eval()
    dev.sync()
    # The wide shape's requests are about four times the work of the narrow
    # one's: three a thread keep a run near a minute on an H100.
    per_thread = 2 if short else (3 if wide else 6)
    cap = (128, 8) if short else ((768, 64) if wide else (512, 32))
    batch = 16 if wide and not short else 4
    plans = [[(rng.randint(1, batch), rng.randint(16, cap[0]), rng.randint(8, cap[1])) for _ in range(per_thread)]
             for _ in range(4)]
    # Inputs made up front from one generator, so that the four threads'
    # interleaving cannot change them.
    inputs = [[torch.randint(0, 32000, (b, p), device=dev.name) for b, p, _ in plan] for plan in plans]
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
                    logits, caches = model(inputs[i][j], 0, None)
                    toks = []
                    for s in range(n):
                        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                        toks.append(nxt)
                        logits, caches = model(nxt, p + s, caches)
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


def run_llama_serve4_rr(torch, dev, rng, short):
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
    streams = [dev.stream() for _ in range(4)]
    with torch.inference_mode():
        model(inputs[0][:, :16], 0, None)  # warm-up (kernels, cuBLAS), not timed
    dev.sync()
    for s in streams:
        dev.wait(s, dev.current())
    outputs = [None] * count
    queue, active, tokens = list(range(count)), [None] * 4, 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        while queue or any(a is not None for a in active):
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
                    a[2], a[3] = model(nxt, p + done, caches)
                    a[1] += 1
    dev.sync()
    wall = time.perf_counter() - t0
    return outputs, [wall / tokens], "per token (4 streams, round robin)", "record_trace.Llama"


def run_bert_train(torch, dev, rng, short):
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
    import torch

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = random.Random(SEED)
    t0 = time.perf_counter()
    dev = Dev(torch, args.device)
    outputs, times, unit, kind = RUNNERS[args.model](torch, dev, rng, args.short)
    dev.sync()
    res = {"model": args.model, "allocator": args.allocator, "kind": kind, "unit": unit,
           "time_median": statistics.median(times), "time_all": times,
           "wall_s": time.perf_counter() - t0, "steps": len(times)}
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
        # by new memory.
        for k in ("cache_hits", "cache_borrows", "cache_misses"):
            res[k] = after[k]
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
        res.update(allocator_calls=0, allocator_ns_per_call=0.0, allocator_share=0.0, failures=0)
    torch.save(outputs, args.result + ".pt")
    Path(args.result).write_text(json.dumps(res, indent=1))


# ----------------------------------------------------------------- parent
def run_child(args, model, allocator, tag, sanitize=False):
    result = str(Path(args.out) / f"{model}.{tag}.json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model,
           "--allocator", allocator, "--lib", args.lib, "--result", result]
    if args.short or sanitize:
        cmd.append("--short")
    cmd += ["--device", args.device]
    if args.hooks:
        cmd.append("--hooks")
    if sanitize:
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--track-stream-ordered-races", "all",
               "--error-exitcode", "0"] + cmd
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0")
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
    """Largest differences between two runs' outputs: (tokens differing,
    largest relative difference of the floating outputs, bitwise equal)."""
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


def parent(args):
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"torch": torch.__version__, "cuda": torch.version.cuda, "models": {}}
    if torch.cuda.is_available():
        report["device"] = torch.cuda.get_device_name(0)
    for model in args.models.split(","):
        print(f"{model}:", flush=True)
        if args.only_sanitize:
            report["models"][model] = {"memcheck": run_child(args, model, "streamalloc", "memcheck", sanitize=True)}
            continue
        ref = run_child(args, model, "torch", "torch")
        ours = run_child(args, model, "streamalloc", "streamalloc")
        row = {"torch": ref, "streamalloc": ours}
        if "error" not in ref and "error" not in ours:
            load = lambda tag: torch.load(out / f"{model}.{tag}.json.pt", weights_only=True)
            toks, rel, bitwise = compare(torch, load("torch"), load("streamalloc"))
            spread = 0.0
            if not bitwise and not args.no_spread:
                again = run_child(args, model, "torch", "torch2")
                if "error" not in again:
                    _, spread, _ = compare(torch, load("torch"), load("torch2"))
            tol = max(2 * spread, 1e-3)
            row["outputs"] = {"bitwise": bitwise, "tokens_differing": toks, "max_rel_diff": rel,
                              "torch_run_to_run_rel": spread, "tolerance": tol,
                              "agree": toks == 0 and rel <= tol}
            row["reserved_ratio"] = ours["peak_reserved"] / ref["peak_reserved"]
            row["time_ratio"] = ours["time_median"] / ref["time_median"]
            row["reserved_over_allocated"] = ours["peak_reserved"] / max(1, ours["peak_allocated"])
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
            row["memcheck"] = run_child(args, model, "streamalloc", "memcheck", sanitize=True)
        report["models"][model] = row
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    md = table(report)
    (out / "compare.md").write_text(md)
    print(md)


def table(report):
    mib = lambda b: f"{b / 2**20:.0f}"
    lines = [f"PyTorch {report['torch']} (CUDA {report['cuda']}) on {report.get('device', '?')}", "",
             "| model | outputs | peak reserved MiB, PyTorch / streamalloc (ratio) | peak reserved / allocated, PyTorch / streamalloc "
             "| time, PyTorch / streamalloc (ratio) | streamalloc allocator time | memcheck |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model, row in report["models"].items():
        if "torch" not in row:
            lines.append(f"| {model} | | | | | | {row['memcheck']['summary']} |")
            continue
        ref, ours = row["torch"], row["streamalloc"]
        if "error" in ref or "error" in ours:
            lines.append(f"| {model} | run failed: see {model}.*.log | | | | | |")
            continue
        o = row["outputs"]
        agree = ("bitwise" if o["bitwise"] else
                 f"{'agree' if o['agree'] else 'DIFFER'}: {o['tokens_differing']} tokens, rel {o['max_rel_diff']:.1e}")
        unit = ref["unit"]
        fmt = lambda s: f"{s * 1e3:.2f} ms"
        mc = row.get("memcheck", {}).get("summary", "not run")
        fails = f", {ours['failures']} failures" if ours.get("failures") else ""
        lines.append(
            f"| {model} | {agree} | {mib(ref['peak_reserved'])} / {mib(ours['peak_reserved'])} "
            f"({row['reserved_ratio']:.2f}x) | {row['torch_reserved_over_allocated']:.3f}x / {row['reserved_over_allocated']:.3f}x | "
            f"{fmt(ref['time_median'])} / {fmt(ours['time_median'])} {unit} ({row['time_ratio']:.3f}x) | "
            f"{ours['allocator_ns_per_call']:.0f} ns/call, {100 * ours['allocator_share']:.2f}% of the run{fails} | {mc} |")
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
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a dry run of the script without a GPU (runs streamalloc's side on PyTorch's "
                         "allocator too, so only the logic is checked)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=("torch", "streamalloc", "rmm"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
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
