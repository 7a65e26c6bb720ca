#!/usr/bin/env python3
"""Summarizes a dev/trace_cupti.c timeline per replay of the decode graph.

    dev/trace_cupti.py TRACE.tsv [STEPS] [FIRST_POSITIONS] [GRAPH]

A replay is the kernels of one graph launch (one correlation id); the replays
with the most common kernel count are the decode steps (or, with GRAPH, the
replays of that graph id: a server runs one graph per batch bucket and the
steps that carry prompt rows in others), and the last STEPS of them (default
100) are summarized. First a line per graph: its launches, kernels and mean
span. Per kernel of a step, in stream order:
its duration (end - start) and its exposed time, the part of the step it
alone adds (end - max(the ends before it), never negative); the exposed
times of a step add up to its span. Printed: the step span and the gap
between steps, the exposed time summed per kernel name, and the first
FIRST_POSITIONS kernels of a step one by one (default 16), with how long
each started before the previous one ended (overlap, from programmatic
dependent launch).

    dev/trace_cupti.py --gaps TRACE.tsv GRAPH [STEPS]

What runs between two consecutive replays of graph GRAPH (the last STEPS
pairs with no other graph's kernels between them): per gap, the kernels
outside graphs and the copies and memsets (by name: count, busy us), and the
idle time (the gap minus the union of those)."""
import bisect
import sys
from collections import defaultdict


def median(v):
    w = sorted(v)
    return (w[(len(w) - 1) // 2] + w[len(w) // 2]) / 2


def short(name):
    cut = name.find("(")
    return name[:cut] if cut > 0 else name


def gaps(path, want, steps):
    recs = []
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) < 10:
            continue
        recs.append((int(f[0]), int(f[1]), f[2], int(f[3]), short(f[9]), int(f[4])))
    recs.sort()
    reps = defaultdict(list)
    for s, e, gid, corr, nm, gx in recs:
        if gid == want:
            reps[corr].append((s, e))
    spans = sorted((min(s for s, _ in v), max(e for _, e in v)) for v in reps.values())
    starts = [r[0] for r in recs]
    clean = []
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        between = recs[bisect.bisect_left(starts, e0):bisect.bisect_left(starts, s1)]
        if not any(r[2] != "0" for r in between) and s1 - e0 <= 50_000_000:
            clean.append((e0, s1, between))
    clean = clean[-steps:]
    if not clean:
        print("no clean gaps for graph", want)
        return
    per = defaultdict(lambda: [0, 0.0])
    gl, idle = [], []
    for e0, s1, between in clean:
        gl.append(s1 - e0)
        busy, cur_s, cur_e = 0, None, None
        for s, e, gid, corr, nm, gx in between:
            key = nm if not nm.startswith("[") else f"{nm} {gx} B"
            per[key][0] += 1
            per[key][1] += min(e, s1) - s
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, min(e, s1)
            else:
                cur_e = max(cur_e, min(e, s1))
        if cur_e is not None:
            busy += cur_e - cur_s
        idle.append(s1 - e0 - busy)
    n = len(clean)
    print(f"graph {want}: {n} clean gaps, mean {sum(gl) / n / 1e3:.1f} us (median {median(gl) / 1e3:.1f}), "
          f"idle {sum(idle) / n / 1e3:.1f} us (median {median(idle) / 1e3:.1f})")
    for k, (c, b) in sorted(per.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {c / n:6.2f} a gap  {b / n / 1e3:8.1f} us  {k[:110]}")


def main():
    if sys.argv[1] == "--gaps":
        gaps(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 100)
        return
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    want = sys.argv[4] if len(sys.argv) > 4 else None
    groups = defaultdict(list)
    graph_of = {}
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) < 10 or f[2] == "0":
            continue
        groups[int(f[3])].append((int(f[0]), int(f[1]), short(f[9]), int(f[4]), int(f[6]), int(f[7])))
        graph_of[int(f[3])] = f[2]
    if not groups:
        print("no graph kernels in", path)
        return
    per_graph = defaultdict(list)
    for corr, g in groups.items():
        per_graph[graph_of[corr]].append(g)
    for gid, reps in sorted(per_graph.items(), key=lambda kv: -sum(max(e for _, e, *_ in g) - min(s for s, *_ in g)
                                                                     for g in kv[1])):
        spans = [max(e for _, e, *_ in g) - min(s for s, *_ in g) for g in reps]
        print(f"graph {gid}: {len(reps)} launches of {len(reps[0])} kernels, mean span {sum(spans) / len(spans) / 1e3:.1f} us")
    if want is not None:
        reps = sorted((sorted(g) for g in per_graph.get(want, [])), key=lambda g: g[0][0])[-steps:]
        if not reps:
            print("no launches of graph", want)
            return
        n = len(reps[0])
        reps = [g for g in reps if len(g) == n]
    else:
        counts = defaultdict(int)
        for g in groups.values():
            counts[len(g)] += 1
        n = max(counts, key=lambda k: counts[k])
        reps = sorted((sorted(g) for g in groups.values() if len(g) == n), key=lambda g: g[0][0])[-steps:]
    span, gap = [], []
    per_name = defaultdict(float)
    pos = [[0.0, 0.0, 0.0] for _ in range(n)]  # duration, exposed, overlap
    for i, g in enumerate(reps):
        t0 = g[0][0]
        prev_end = t0
        for j, (s, e, nm, gx, bx, regs) in enumerate(g):
            exp = max(0, e - prev_end)
            per_name[(nm, gx, bx, regs)] += exp
            pos[j][0] += e - s
            pos[j][1] += exp
            pos[j][2] += max(0, prev_end - s) if j else 0
            prev_end = max(prev_end, e)
        span.append(prev_end - t0)
        if i + 1 < len(reps):
            gap.append(reps[i + 1][0][0] - prev_end)
    R = len(reps)
    print(f"{R} steps of {n} kernels: span {sum(span) / R / 1e3:.1f} us, gap to the next step "
          f"{(sum(gap) / len(gap) / 1e3) if gap else 0:.1f} us (median {(median(gap) / 1e3) if gap else 0:.1f}: "
          f"the mean takes in the host's pauses, e.g. between a bench's repetitions)")
    print("exposed us per step by kernel (name, grid, block, registers):")
    tot = sum(per_name.values()) / R
    for (nm, gx, bx, regs), v in sorted(per_name.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {v / R / 1e3:8.1f} {100 * v / R / tot:5.1f}%  grid {gx:5d} block {bx:4d} regs {regs:3d}  {nm[:110]}")
    print(f"first {first} kernels of a step (us: duration, exposed, started before the previous end):")
    g = reps[-1]
    for j in range(min(first, n)):
        print(f"  {j:3d} {pos[j][0] / R / 1e3:7.2f} {pos[j][1] / R / 1e3:7.2f} {pos[j][2] / R / 1e3:7.2f}  "
              f"grid {g[j][3]:5d} block {g[j][4]:4d} regs {g[j][5]:3d}  {g[j][2][:100]}")


if __name__ == "__main__":
    main()
