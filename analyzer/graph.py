"""Racket's accounting, applied to aggregated stacks: from weighted stacks to a call graph.

Every input path (snapshots, Racket's raw shape) first sums the weights of identical
stacks, so the work here is proportional to the number of *distinct* stacks times
their depth, never to the number of samples.  Racket's rules are linear in the
weight, so charging a distinct stack once with the summed weight of its samples
gives exactly what charging each sample would.
"""

from __future__ import annotations

from collections import Counter
from operator import add
from typing import Any, Iterable, Optional, Sequence

from .model import Edge, Node, finish

StackRow = tuple[Sequence[int], float, Iterable[Any]]
"""``(nodes innermost first, summed weight, thread ids)``; nodes are 1-based indices."""


class NodeInfo:
    """What a node is, before any time is charged to it."""

    __slots__ = ("id", "src", "frame")

    def __init__(self, id: Any, src: Any, frame: Optional[tuple] = None) -> None:
        self.id = id
        self.src = src
        self.frame = frame


def build_graph(
    rows: Iterable[StackRow], infos: Sequence[Optional[NodeInfo]], *, scale: float = 1.0,
    single_thread: Any = None, one_thread: bool = False,
) -> tuple[Node, list[Node]]:
    """Charge every row to its nodes and edges, then make :class:`Node` values.

    ``infos[i]`` describes node ``i`` (``infos[0]`` is unused: index 0 is the root).
    Times are multiplied by ``scale`` at the end (rows carry integer microseconds or
    half-microseconds, which sum exactly).  ``one_thread=True`` says every row comes
    from the one thread ``single_thread``, which saves a thread-id set per node.

    For a row of weight ``t`` and stack ``s`` (innermost first), per Racket:
    ``total += t`` once per distinct node, ``s[0].self += t``; each adjacent pair
    and the two root edges (``* → outermost``, ``innermost → *``) get
    ``caller_time += t / count(callee)`` and ``callee_time += t / count(caller)``,
    and ``edge.total += t`` once per distinct edge.
    """
    size = len(infos)
    width = max(size, 1)  # edge key: caller * width + callee (0 is the root)
    self_: list[Any] = [0] * size
    slow_total: list[Any] = [0] * size
    fast: dict[int, Any] = {}  # edge key -> weight, from stacks without repeated nodes
    slow: dict[int, list] = {}  # edge key -> [total, caller_time, callee_time], the others
    by_tids: dict[frozenset, list] = {}
    fast_get, slow_get = fast.get, slow.get
    for stack, w, row_tids in rows:
        depth = len(stack)
        if not depth:
            continue
        stack = tuple(stack)
        self_[stack[0]] += w
        if not one_thread:
            by_tids.setdefault(frozenset(row_tids), []).append(stack)
        if len(set(stack)) == depth:
            # no recursion: every count is 1, every edge occurs once, so all three edge
            # times get ``w``; node totals are derived from the edges into them later
            for key in map(add, map(width.__mul__, stack[1:] + (0,)), stack):
                fast[key] = fast_get(key, 0) + w
            key = stack[0] * width
            fast[key] = fast_get(key, 0) + w
            continue
        counts = Counter(stack)
        for n in counts:
            slow_total[n] += w
        once: set[int] = set()
        prev, prev_count = 0, 1
        for i in range(depth, -1, -1):
            if i:
                n = stack[i - 1]
                count = counts[n]
            else:  # innermost -> *
                n, count = 0, 1
            key = prev * width + n
            e = slow_get(key)
            if e is None:
                e = slow[key] = [0, 0.0, 0.0]
            e[1] += w / count
            e[2] += w / prev_count
            if key not in once:
                once.add(key)
                e[0] += w
            prev, prev_count = n, count

    total = slow_total
    for key, w in fast.items():
        callee = key % width
        if callee:
            total[callee] += w
    tids: Optional[list[set]] = None
    if not one_thread:
        tids = [set() for _ in range(size)]
        for tid_set, stacks in by_tids.items():
            for n in set().union(*stacks):
                tids[n] |= tid_set

    root = Node.make_root()
    made: list[Any] = [None] * size
    made[0] = root
    nodes: list[Node] = []
    keys = sorted(fast.keys() | slow.keys())
    used = {k % width for k in keys}  # a node on any stack is the callee of some edge
    used.discard(0)
    for i in sorted(used):
        info = infos[i]
        assert info is not None
        ids = [single_thread] if tids is None else _sorted(tids[i])
        made[i] = node = Node(info.id, info.src, frame=info.frame, thread_ids=ids,
                              total=total[i] * scale, self_time=self_[i] * scale)
        nodes.append(node)
    for key in keys:
        w = fast_get(key, 0)
        t, caller_time, callee_time = slow_get(key) or (0, 0, 0)
        a, b = divmod(key, width)
        ler, lee = made[a], made[b]
        edge = Edge((t + w) * scale, ler, (caller_time + w) * scale, lee,
                    (callee_time + w) * scale)
        ler.callees.append(edge)
        lee.callers.append(edge)
    return root, finish(root, nodes)


def _sorted(ids: set) -> list:
    try:
        return sorted(ids)
    except TypeError:  # raw-shape thread ids need only be hashable
        return list(ids)
