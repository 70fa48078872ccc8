"""Merging analysed profiles (Racket's ``profile-merge``, without its bug).

Racket's merge walks each node's callee edges but never adds a callee edge the
merged node lacks, so merged profiles lose calls.  Here every edge is taken once
from its caller's callee list and added to both ends.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Union

from .model import Edge, Node, Profile, finish

_ROOT: Hashable = object()


def merge(*profiles: Union[Profile, Iterable[Profile]]) -> Profile:
    """One profile holding the sum of ``profiles`` (also accepts a single list).

    Nodes are matched by ``(id, src)``; totals, selfs, edge times, thread times,
    ``total_time``, ``cpu_time`` and ``sample_number`` are summed, thread ids united.
    Profiles must agree on ``weight``, ``granularity`` and ``unit``: adding CPU seconds
    to wall seconds, or a line to a function, would give a number that means nothing.
    """
    if len(profiles) == 1 and not isinstance(profiles[0], Profile):
        profiles = tuple(profiles[0])
    ps: list[Profile] = []
    for p in profiles:
        if not isinstance(p, Profile):
            raise TypeError(f"merge() takes Profile values, not {type(p).__name__}")
        ps.append(p)
    for attr in ("weight", "granularity", "unit"):
        kinds = {getattr(p, attr) for p in ps}
        if len(kinds) > 1:
            raise ValueError(f"cannot merge profiles of different {attr}: "
                             f"{', '.join(sorted(map(repr, kinds)))}")
    first = ps[0] if ps else Profile(0.0, 0.0, 0, {}, [], Node.make_root())
    intervals = {p.interval for p in ps}

    root = Node.make_root()
    table: dict[Hashable, Node] = {}
    nodes: list[Node] = []
    thread_sets: dict[Hashable, set] = {}

    def translate(n: Node) -> Node:
        if n.is_root:
            return root
        key = n.key
        got = table.get(key)
        if got is None:
            got = table[key] = Node(n.id, n.src, frame=n.frame)
            thread_sets[key] = set()
            nodes.append(got)
        return got

    edges: dict[tuple[Hashable, Hashable], Edge] = {}
    thread_times: dict[Any, Any] = {}
    thread_names: dict[Any, str] = {}
    for p in ps:
        root.total += p.root.total
        for n in p.nodes:
            m = translate(n)
            m.total += n.total
            m.self += n.self
            thread_sets[n.key].update(n.thread_ids)
        for e in p.edges():
            ler, lee = translate(e.caller), translate(e.callee)
            key = (_ROOT if ler is root else ler.key, _ROOT if lee is root else lee.key)
            got = edges.get(key)
            if got is None:
                got = edges[key] = Edge(0, ler, 0, lee, 0)
                ler.callees.append(got)
                lee.callers.append(got)
            got.total += e.total
            got.caller_time += e.caller_time
            got.callee_time += e.callee_time
        for t, v in p.thread_times.items():
            thread_times[t] = thread_times.get(t, 0) + v
        thread_names.update(p.thread_names)
    for node_key, n in table.items():
        try:
            n.thread_ids = sorted(thread_sets[node_key])
        except TypeError:
            n.thread_ids = list(thread_sets[node_key])
    try:
        thread_times = dict(sorted(thread_times.items()))
    except TypeError:
        pass
    return Profile(
        sum(p.total_time for p in ps), sum(p.cpu_time for p in ps),
        sum(p.sample_number for p in ps), thread_times, finish(root, nodes), root,
        thread_names=thread_names, weight=first.weight, granularity=first.granularity,
        interval=first.interval if len(intervals) <= 1 else "mixed", unit=first.unit)
