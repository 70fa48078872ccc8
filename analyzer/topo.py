"""Topological layering of a call graph (Eades–Lin–Smyth), in O((V + E) log V).

A call graph has cycles (recursion, mutual recursion, callbacks), so "callers before
callees" needs a choice of which edges to ignore.  Racket's profiler makes the
Eades–Lin–Smyth choice, weighted by time: repeatedly peel off sinks (nothing left to
call) to the right and sources (nothing left calling them) to the left; when neither
exists, take the node whose remaining incoming time is smallest relative to its
outgoing time as a source.  Edges that go forward in the resulting order form an
acyclic graph, and each node's layer is one past its deepest such caller.

Racket's first version rescanned every node to find the next source, which is
quadratic and timed out on large programs.  Here the ratios live in a heap with
lazy invalidation, and sources and sinks are detected by counting remaining edges
(exact, where subtracting float times to exactly zero is not).
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

from .model import Node


def topological_layers(root: Node, nodes: Sequence[Node]) -> list[list[Node]]:
    """Layers of ``nodes`` (the root excluded), each sorted by total time, heaviest first.

    Nodes are numbered breadth-first from ``root`` (then any node not reachable from
    it, in the given order); ties anywhere are broken by that number, so the result
    is deterministic.
    """
    # -- number the nodes: breadth-first from the root, then the unreachable rest
    index: dict[Node, int] = {}
    order: list[Node] = []
    member = set(nodes)
    queue = [root]
    head = 0
    while head < len(queue):
        cur = queue[head]
        head += 1
        for e in cur.callees:
            n = e.callee
            if n is not root and n in member and n not in index:
                index[n] = len(order)
                order.append(n)
                queue.append(n)
    for n in nodes:
        if n not in index:
            index[n] = len(order)
            order.append(n)
    size = len(order)
    if not size:
        return []

    # -- adjacency without the root and without self loops, from the callee lists
    succ: list[list[tuple[int, float, float]]] = [[] for _ in range(size)]
    pred: list[list[tuple[int, float, float]]] = [[] for _ in range(size)]
    in_w = [0.0] * size
    out_w = [0.0] * size
    in_c = [0] * size
    out_c = [0] * size
    for i, n in enumerate(order):
        for e in n.callees:
            j = index.get(e.callee)
            if j is None or j == i:
                continue
            succ[i].append((j, e.caller_time, e.callee_time))
            pred[j].append((i, e.caller_time, e.callee_time))
            out_w[i] += e.caller_time
            out_c[i] += 1
            in_w[j] += e.callee_time
            in_c[j] += 1

    # -- Eades–Lin–Smyth with weights: peel sinks right, sources left
    alive = [True] * size
    version = [0] * size
    dirty: set[int] = set()  # ratios changed since the heap was last brought up to date
    heap = [(in_w[i] / out_w[i] if out_w[i] > 0 else math.inf, i, 0) for i in range(size)]
    heapq.heapify(heap)
    sinks = [i for i in range(size) if out_c[i] == 0]
    sources = [i for i in range(size) if in_c[i] == 0 and out_c[i] != 0]
    left: list[int] = []
    right_rounds: list[list[int]] = []
    remaining = size
    while remaining:
        cur_sinks = [i for i in sinks if alive[i]]
        cur_sources = [i for i in sources if alive[i]]
        if not cur_sinks and not cur_sources:
            for i in dirty:  # only now do changed ratios matter
                if alive[i]:
                    version[i] += 1
                    w_in, w_out = in_w[i], out_w[i]
                    r = (w_in if w_in > 0 else 0.0) / w_out if w_out > 0 else math.inf
                    heapq.heappush(heap, (r, i, version[i]))
            dirty.clear()
            while True:  # every live node has one current entry in the heap
                _, i, v = heapq.heappop(heap)
                if alive[i] and v == version[i]:
                    break
            cur_sources = [i]
        new_sinks: list[int] = []
        new_sources: list[int] = []
        removed_sinks: list[int] = []
        removed_sources: list[int] = []
        for group, out in ((cur_sinks, removed_sinks), (cur_sources, removed_sources)):
            for i in group:
                if not alive[i]:
                    continue
                alive[i] = False
                remaining -= 1
                out.append(i)
                # i's edges go from both ends: each callee loses an incoming edge (and
                # its callee_time), becoming a source when none is left; each caller
                # loses an outgoing edge (and its caller_time), becoming a sink.
                for edges, count, weight, at, emptied in (
                        (succ[i], in_c, in_w, 2, new_sources), (pred[i], out_c, out_w, 1, new_sinks)):
                    for edge in edges:
                        j = edge[0]
                        if alive[j]:
                            count[j] -= 1
                            weight[j] -= edge[at]
                            if count[j] == 0:
                                emptied.append(j)
                            else:
                                dirty.add(j)
        left.extend(removed_sources)
        right_rounds.append(removed_sinks)
        sinks, sources = new_sinks, new_sources
    linear = left
    for rnd in reversed(right_rounds):
        linear.extend(rnd)

    # -- layers: one past the deepest caller that comes earlier in the order
    pos = [0] * size
    for p, i in enumerate(linear):
        pos[i] = p
    layer = [0] * size
    height = 0
    for i in linear:
        best = -1
        for j, _a, _b in pred[i]:
            if pos[j] < pos[i] and layer[j] > best:
                best = layer[j]
        layer[i] = best + 1
        if best + 1 > height:
            height = best + 1
    layers: list[list[int]] = [[] for _ in range(height + 1)]
    for i in linear:
        layers[layer[i]].append(i)
    return [
        [order[i] for i in sorted(ids, key=lambda i: (-order[i].total, pos[i]))]
        for ids in layers if ids
    ]
