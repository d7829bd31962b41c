"""A synthetic allocation trace of the inference service's request pattern
(`service_bench`), in the format of measure/traces/README.md, so that
`trace_replay --sim` and `placement_floor.py` can look at it offline and
deterministically:

    python3 measure/scripts/service_trace.py CLIENTS REQUESTS SEED OUT.csv.gz

CLIENTS clients on 8 streams (client i on stream i % 8) keep one request
each in flight until REQUESTS were sent. A request draws its rows as the
service does (batch 1-8 times 16-256 tokens in steps of 16), allocates
its three buffers (rows x 1 KiB, rows x 4 KiB, rows x 256 B), waits
behind the requests queued on its stream before it, runs for a time
proportional to its rows, and frees its buffers once done (with a little
jitter, as awaited completions arrive). The order of events is what
matters to placement, not the times.
"""
import gzip, heapq, random, sys
C, N, seed, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
STREAMS = 8
ops = []
nid = 0
ev = []  # (time, kind, client, ids)
stream_free_at = [0.0] * STREAMS
def submit(t, c):
    global nid
    rows = rng.randint(1, 8) * 16 * rng.randint(1, 16)
    s = c % STREAMS
    ids = []
    for per in (1024, 4096, 256):
        ops.append(("a", nid, rows * per, s)); ids.append(nid); nid += 1
    start = max(t, stream_free_at[s])
    done = start + rows * 1.0 + 50
    stream_free_at[s] = done
    heapq.heappush(ev, (done + rng.uniform(0, 30), c, ids, s))
sent = 0
for c in range(C):
    submit(0.0, c); sent += 1
while ev:
    t, c, ids, s = heapq.heappop(ev)
    for i in ids:
        ops.append(("f", i, 0, s))
    if sent < N:
        submit(t, c); sent += 1
sizes = {}
with gzip.open(out, "wt") as f:
    f.write("op,id,size,stream\n")
    for op, i, size, s in ops:
        if op == "a": sizes[i] = size
        f.write(f"{op},{i},{size if op == 'a' else sizes[i]},{s}\n")
