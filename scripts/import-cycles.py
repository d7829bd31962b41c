#!/usr/bin/env python3
"""Lists import circles between the files of a Rust crate, from its `use
crate::…`, `use super::…` and `use self::…` lines and from paths written
inline in the code (`crate::gpu::CaptureId` in a field's type counts as an
import of gpu); re-exports through a mod.rs count as an import of that
mod.rs. Exits 1 when there is a circle.

    scripts/import-cycles.py [CRATE_SRC_DIR]     (default: src; .ci/run runs it)
"""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "src"
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            files[tuple(rel)] = p


def expand(tree):
    """'a::{b, c::{d, e}}' -> ['a::b', 'a::c::d', 'a::c::e']"""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree]
    head, body = tree[:i], tree[i + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur); cur = ""; continue
        depth += ch == "{"; depth -= ch == "}"; cur += ch
    parts.append(cur)
    return [head + q for p in parts if p.strip() for q in expand(p)]


def resolve(module, path):
    segs = [s.strip().split(" as ")[0] for s in path.split("::") if s.strip()]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(module)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    best = None
    for k in range(len(segs) + 1):
        key = tuple(base + segs[:k])
        if key in files:
            best = key
    return best


edges = {m: set() for m in files}
for m, p in files.items():
    text = open(p, encoding="utf-8").read()
    text = re.sub(r"//[^\n]*", "", text)
    # a file's own test modules do not count
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    paths = [p for u in re.findall(r"\buse\s+([^;]+);", text) for p in expand(u.replace("\n", " "))]
    # inline paths outside `use` lines and doc comments
    body = re.sub(r"\buse\s+[^;]+;", "", text)
    paths += re.findall(r"\bcrate(?:::[A-Za-z_][A-Za-z0-9_]*)+", body)
    for path in paths:
        t = resolve(m, path)
        if t is not None and t != m and t != ():
            edges[m].add(t)

# Tarjan's strongly connected components
index, low, stack, on, sccs, n = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(comp)
for v in files:
    if v not in index:
        visit(v)

name = lambda m: os.path.relpath(files[m])
for comp in sccs:
    print("circle: " + ", ".join(sorted(name(m) for m in comp)))
    for m in sorted(comp):
        for t in sorted(edges[m] & set(comp)):
            print(f"  {name(m)} -> {name(t)}")
print(f"{len(files)} files, {sum(len(e) for e in edges.values())} imports, {len(sccs)} circle(s)")
sys.exit(1 if sccs else 0)
