"""Records an allocation trace of a PyTorch model (random weights, nothing
downloaded) in the format of `measure/traces/README.md` (gzip CSV
`op,id,size,stream`), so the cache can be measured on models it was not
tuned on. Run on the GPU machine, where python3 has torch:

    python3 measure/scripts/record_trace.py MODEL OUT.ops.csv.gz [--seed S]

MODEL is one of:
- `llama_infer`: a LLaMA-style decoder (16 layers, d 1024, grouped-query
  attention, SwiGLU, fp16) generating with a key/value cache that grows by
  `torch.cat` each token, as Hugging Face's dynamic cache does; batch 1-16,
  prompts 16-1024 tokens, 8-64 new tokens per call.
- `bert_train`: a BERT-base encoder (12 layers, d 768) trained with AdamW
  under bf16 autocast on batches whose sequence length changes every step
  (64-512); inputs copied on a side stream and handed to the main one with
  `record_stream`, so frees cross streams.
- `resnet_train`: a ResNet-50 (bottleneck blocks, channels-last, AMP with a
  gradient scaler) trained with SGD at batch 48 on 224 x 224 images;
  cuDNN's workspaces come through the allocator too.
- `gpt2_serve8`: GPT-2 medium (24 layers, d 1024, fp16) serving 48
  requests on 8 streams: each stream holds one request at a time (batch
  1-8, prompt 16-512, 16-96 new tokens) and the decode steps go round
  robin over the streams from one thread, as a continuous-batching server
  without batching does; each request's key/value cache grows by
  `torch.cat` on its own stream, and a finished request's stream takes the
  next one.
- `gpt2_train_side`: GPT-2 small trained with AdamW under bf16 autocast
  (batch 8, sequence 128-512): inputs copied on a data stream and handed
  over with `record_stream`; each gradient, as backward produces it, is
  copied into a flat bucket on a gradient stream (as DDP's all-reduce
  buckets are), scaled there (the stand-in for the all-reduce) and copied
  back before the optimizer step.
- `llama_serve4`: the `llama_infer` decoder in bf16 serving 32 requests on
  4 streams round robin (batch 1-16, prompts 16-768, 8-64 new tokens).

The recorder is PyTorch's own (`torch.cuda.memory._record_memory_history`):
each `alloc` and `free_requested` event of the device trace becomes an `a`
or `f` line (sizes as PyTorch's allocator saw them, rounded to 512 B; ids
fresh per allocation; streams numbered in order of first use). It prints
the op count, the streams and the peak of live requested bytes.
"""
import argparse, gzip, math, random, sys
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda"


# ---------------------------------------------------------------- llama
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + self.eps)).to(x.dtype) * self.w


def rotary(x, pos, base=10000.0):
    # x: (b, h, t, hd); pos: (t,)
    hd = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=x.device).float() / hd))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, pos, cache):
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kvh, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kvh, self.hd).transpose(1, 2)
        q, k = rotary(q, pos), rotary(k, pos)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        rep = self.h // self.kvh
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, kk, vv, is_causal=cache is None)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, (k, v)


class Llama(nn.Module):
    def __init__(self, vocab=32000, d=1024, layers=16, heads=16, kv_heads=4, hidden=2816):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaLayer(d, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids, start, caches):
        x = self.emb(ids)
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, pos, caches[i] if caches else None)
            new.append(c)
        return self.head(self.norm(x[:, -1:, :])), new


def llama_infer(rng):
    model = Llama().to(DEV, torch.float16).eval()
    with torch.inference_mode():
        for _ in range(24):
            b, p, n = rng.randint(1, 16), rng.randint(16, 1024), rng.randint(8, 64)
            ids = torch.randint(0, 32000, (b, p), device=DEV)
            logits, caches = model(ids, 0, None)
            for step in range(n):
                nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                logits, caches = model(nxt, p + step, caches)
            del logits, caches, ids, nxt
    torch.cuda.synchronize()


# ---------------------------------------------------------------- bert
class Bert(nn.Module):
    def __init__(self, vocab=30522, d=768, layers=12, heads=12, ff=3072, max_len=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, activation="gelu", batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.norm(self.enc(self.tok(ids) + self.pos(pos))))


def bert_train(rng):
    model = Bert().to(DEV).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    for _ in range(16):
        b, t = 16, 64 * rng.randint(1, 8)
        host = torch.randint(0, 30522, (2, b, t)).pin_memory()
        with torch.cuda.stream(side):
            both = host.to(DEV, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        both.record_stream(torch.cuda.current_stream())
        ids, labels = both[0], both[1]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del both, ids, labels, logits, loss
    torch.cuda.synchronize()


# ---------------------------------------------------------------- resnet
class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = mid * 4
        self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


def resnet50():
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, n, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(n):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def resnet_train(rng):
    model = resnet50().to(DEV, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(8):
        x = torch.randn(48, 3, 224, 224, device=DEV).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (48,), device=DEV)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
    torch.cuda.synchronize()


# ---------------------------------------------------------------- multi-stream
class GPT2Block(nn.Module):
    def __init__(self, d, h):
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
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, n_pos=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_pos, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, ids, past=None, last_only=False):
        start = 0 if past is None else past[0][0].shape[2]
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        new = []
        for i, blk in enumerate(self.blocks):
            x, c = blk(x, None if past is None else past[i])
            new.append(c)
        if last_only:
            x = x[:, -1:, :]
        return self.ln(x) @ self.wte.weight.T, new


def serve_round_robin(n_streams, requests, prefill, decode):
    """Serves `requests` (a list of plans) on `n_streams` streams, one
    request per stream at a time, decode steps round robin from one thread."""
    streams = [torch.cuda.Stream() for _ in range(n_streams)]
    torch.cuda.synchronize()
    queue = list(requests)
    active = [None] * n_streams
    while queue or any(a is not None for a in active):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                if active[i] is None and queue:
                    plan = queue.pop(0)
                    active[i] = [plan, 0] + list(prefill(plan))
                a = active[i]
                if a is None:
                    continue
                plan, done = a[0], a[1]
                if done >= plan[-1]:
                    active[i] = None
                    continue
                a[2], a[3] = decode(plan, done, a[2], a[3])
                a[1] += 1
    torch.cuda.synchronize()


def gpt2_serve8(rng):
    model = GPT2(d=1024, layers=24, heads=16).to(DEV, torch.float16).eval()
    plans = [(rng.randint(1, 8), rng.randint(16, 512), rng.randint(16, 96)) for _ in range(48)]

    def prefill(plan):
        b, p, _ = plan
        ids = torch.randint(0, 50257, (b, p), device=DEV)
        return model(ids, None, last_only=True)

    def decode(plan, step, logits, past):
        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
        return model(nxt, past)

    with torch.inference_mode():
        serve_round_robin(8, plans, prefill, decode)


def llama_serve4(rng):
    model = Llama().to(DEV, torch.bfloat16).eval()
    plans = [(rng.randint(1, 16), rng.randint(16, 768), rng.randint(8, 64)) for _ in range(32)]

    def prefill(plan):
        b, p, _ = plan
        ids = torch.randint(0, 32000, (b, p), device=DEV)
        return model(ids, 0, None)

    def decode(plan, step, logits, caches):
        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
        return model(nxt, plan[1] + step, caches)

    with torch.inference_mode():
        serve_round_robin(4, plans, prefill, decode)


def gpt2_train_side(rng):
    model = GPT2().to(DEV).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data, grads = torch.cuda.Stream(), torch.cuda.Stream()
    params = [p for p in model.parameters() if p.requires_grad]
    bucket_bytes = 25 * 2**20
    pending = []

    def ready(p):
        # DDP-style: a gradient joins a bucket on the gradient stream as
        # soon as backward produced it; a full bucket is "reduced" there.
        grads.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(grads):
            pending.append(p)
            if sum(q.grad.numel() * q.grad.element_size() for q in pending) >= bucket_bytes:
                flush()

    def flush():
        if not pending:
            return
        flat = torch.cat([q.grad.reshape(-1) for q in pending])
        flat.mul_(0.5)
        off = 0
        for q in pending:
            n = q.grad.numel()
            q.grad.copy_(flat[off:off + n].view_as(q.grad))
            off += n
        pending.clear()

    hooks = [p.register_post_accumulate_grad_hook(ready) for p in params]
    for _ in range(8):
        b, t = 8, 128 * rng.randint(1, 4)
        host = torch.randint(0, 50257, (2, b, t)).pin_memory()
        with torch.cuda.stream(data):
            both = host.to(DEV, non_blocking=True)
        torch.cuda.current_stream().wait_stream(data)
        both.record_stream(torch.cuda.current_stream())
        ids, labels = both[0], both[1]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(ids)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        with torch.cuda.stream(grads):
            flush()
        torch.cuda.current_stream().wait_stream(grads)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del both, ids, labels, logits, loss
    for h in hooks:
        h.remove()
    torch.cuda.synchronize()


MODELS = {"llama_infer": llama_infer, "bert_train": bert_train, "resnet_train": resnet_train,
          "gpt2_serve8": gpt2_serve8, "gpt2_train_side": gpt2_train_side, "llama_serve4": llama_serve4}


def convert(entries, out):
    """Writes the `alloc`/`free_requested` events as trace lines; returns
    (ops, streams, peak live requested bytes)."""
    ids, streams, live = {}, {}, {}
    next_id, ops, cur, peak = 0, 0, 0, 0
    with gzip.open(out, "wt") as f:
        f.write("op,id,size,stream\n")
        for e in entries:
            act = e["action"]
            if act not in ("alloc", "free_requested"):
                continue
            s = streams.setdefault(e["stream"], len(streams))
            if act == "alloc":
                if e["addr"] in ids:
                    sys.exit(f"address {e['addr']:#x} allocated twice without a free")
                ids[e["addr"]] = next_id
                live[next_id] = e["size"]
                f.write(f"a,{next_id},{e['size']},{s}\n")
                next_id += 1
                cur += e["size"]
                peak = max(peak, cur)
            else:
                i = ids.pop(e["addr"], None)
                if i is None:
                    continue  # allocated before the recording began
                size = live.pop(i)
                f.write(f"f,{i},{size},{s}\n")
                cur -= size
            ops += 1
    return ops, len(streams), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    limit = 16_000_000  # llama_serve4 passes 4,000,000 events
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=limit)
    MODELS[args.model](rng)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    entries = snap["device_traces"][torch.cuda.current_device()]
    if len(entries) >= limit:
        sys.exit(f"{len(entries)} events: the recorder's ring of {limit} overflowed")
    ops, nstreams, peak = convert(entries, args.out)
    print(f"model={args.model} ops={ops} streams={nstreams} peak_requested={peak} "
          f"peak_requested_mib={peak / 2**20:.1f} torch_peak_reserved={torch.cuda.max_memory_reserved()}")


if __name__ == "__main__":
    main()
