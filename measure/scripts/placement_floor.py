"""What any placement that never moves a live block can reach on a trace.

    python3 measure/scripts/placement_floor.py TRACE.csv.gz [TRACE...]

For each trace (the format of measure/traces/README.md; synthetic shapes
from `synth_trace`), replays it through a few placement policies over one
address range in 512-byte units and prints, against the trace's peak of
live requested bytes:

- `extent`: the highest page (2 MiB) any block reached, at its peak. What a
  cache holds when nothing mapped is ever given back (every page it used
  stays mapped), the cache's figure whenever it unmaps nothing.
- `touched`: the most pages live blocks touched at once. What a cache
  holds at best if every page no live block touches could be given back or
  moved at once (one physical handle per page, fences always complete):
  the floor of any policy that does not move live data, at this page size.

Policies: `best` (smallest free range that fits, lowest address among
equal ones), `first` (lowest address that fits), and `best/small<T` (best
fit, requests under T bytes in a region of their own).

The Rust cache's figure (`trace_replay TRACE --sim --stack cache`) sits
near `best`'s extent when it gives nothing back; no policy here gets below
`touched`.
"""

import bisect
import gzip
import sys

PAGE = 2 << 20
UNIT = 512
TOP = 1 << 44  # the address range: far more than any trace uses
SMALL_BASE = 1 << 45  # where the small region starts (its own range)


class Placement:
    """Free ranges of one address range, by start and by (size, start)."""

    def __init__(self, first_fit):
        self.first_fit = first_fit
        self.by_start = {0: TOP}
        self.by_end = {TOP: 0}
        self.by_size = [(TOP, 0)]

    def _remove(self, start):
        size = self.by_start.pop(start)
        del self.by_end[start + size]
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, start)))

    def _add(self, start, size):
        self.by_start[start] = size
        self.by_end[start + size] = start
        bisect.insort(self.by_size, (size, start))

    def alloc(self, size):
        if self.first_fit:
            start = min(s for s, n in self.by_start.items() if n >= size)
            free = self.by_start[start]
        else:
            free, start = self.by_size[bisect.bisect_left(self.by_size, (size, -1))]
        self._remove(start)
        if free > size:
            self._add(start + size, free - size)
        return start

    def free(self, start, size):
        if start + size in self.by_start:
            after = self.by_start[start + size]
            self._remove(start + size)
            size += after
        if start in self.by_end:
            before = self.by_end[start]
            size += self.by_start[before]
            self._remove(before)
            start = before
        self._add(start, size)


def read(path):
    ops = []
    with gzip.open(path, "rt") as f:
        for line in f:
            kind, ident, size, _stream = line.strip().split(",")
            if kind in ("a", "f"):
                ops.append((kind == "a", int(ident), int(size)))
    return ops


def pages_of(start, size):
    return range(start // PAGE, (start + size - 1) // PAGE + 1)


def replay(ops, first_fit=False, small_below=0):
    """(peak extent, peak pages touched) over the peak live bytes."""
    large, small = Placement(first_fit), Placement(first_fit)
    live, refs = {}, {}
    now = peak = touched = peak_touched = 0
    ends = {False: 0, True: 0}
    peak_extent = 0
    for is_alloc, ident, size in ops:
        rounded = -(-max(size, 1) // UNIT) * UNIT
        if is_alloc:
            is_small = rounded < small_below
            start = (small if is_small else large).alloc(rounded)
            ends[is_small] = max(ends[is_small], start + rounded)
            start += SMALL_BASE if is_small else 0
            live[ident] = (start, rounded, is_small)
            now += size
            peak = max(peak, now)
            for p in pages_of(start, rounded):
                refs[p] = refs.get(p, 0) + 1
                touched += refs[p] == 1
            peak_touched = max(peak_touched, touched)
            extent = sum(-(-e // PAGE) for e in ends.values())
            peak_extent = max(peak_extent, extent)
        else:
            start, rounded, is_small = live.pop(ident)
            now -= size
            base = SMALL_BASE if is_small else 0
            (small if is_small else large).free(start - base, rounded)
            for p in pages_of(start, rounded):
                refs[p] -= 1
                touched -= refs[p] == 0
    return peak_extent * PAGE / peak, peak_touched * PAGE / peak


POLICIES = [
    ("best", {}),
    ("first", {"first_fit": True}),
    ("best/small<64K", {"small_below": 64 << 10}),
    ("best/small<256K", {"small_below": 256 << 10}),
    ("best/small<1M", {"small_below": 1 << 20}),
]


def main(paths):
    if not paths:
        sys.exit(__doc__)
    for path in paths:
        ops = read(path)
        for name, kwargs in POLICIES:
            extent, touched = replay(ops, **kwargs)
            print(f"{path} {name:16s} extent={extent:.3f} touched={touched:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
