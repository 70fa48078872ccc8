"""The analyzed profile: a call graph of :class:`Node` values joined by :class:`Edge` values.

These are Racket's ``profile``, ``node`` and ``edge`` structs under Python names.  They
are plain mutable objects so that the analyzer, :func:`analyzer.merge` and the JSON
reader can build them incrementally; treat a finished :class:`Profile` as read-only.

Times are floats in ``profile.unit`` (seconds for snapshots taken by the sampler,
the input's own unit -- Racket's milliseconds by default -- for the raw shape).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Hashable, Iterator, Optional

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
"""Time units a profile can carry, with their size in seconds."""

BYTE_UNITS = ("B",)
"""Units of a profile that counts bytes (an allocation profile, from ``sampler.memprof``)
rather than time: ``weight='cpu'`` is then bytes allocated, ``'wall'`` bytes still live."""


class Node:
    """One function (or one line, at line granularity) of the call graph.

    ``id`` is the function's name (``None`` when unknown), ``src`` its location as text
    (``"file:firstline"``; ``None`` when unknown).  ``frame`` keeps the structured
    location -- a :class:`sampler.snapshot.Frame`, whose ``lineno`` is ``None`` at
    function granularity -- so renderers need not parse ``src``.  ``total`` counts the
    samples the node was on the stack for (once per sample, even when recursive),
    ``self`` those it was the innermost frame of.  ``callers`` and ``callees`` are
    :class:`Edge` lists, heaviest first.
    """

    __slots__ = ("id", "src", "frame", "thread_ids", "total", "self", "callers", "callees",
                 "is_root")

    def __init__(
        self,
        id: Any = None,
        src: Any = None,
        *,
        frame: Optional[tuple] = None,
        thread_ids: Optional[list[Any]] = None,
        total: float = 0.0,
        self_time: float = 0.0,
        is_root: bool = False,
    ) -> None:
        self.id = id
        self.src = src
        self.frame = frame
        self.thread_ids: list[Any] = [] if thread_ids is None else list(thread_ids)
        self.total = total
        self.self = self_time  # Racket's field name (the constructor cannot take `self=`)
        self.callers: list[Edge] = []
        self.callees: list[Edge] = []
        self.is_root = is_root  # only the ``*`` node: caller of outermost, callee of innermost

    @classmethod
    def make_root(cls) -> "Node":
        """A fresh ``*`` node: no id, no src, not listed in ``Profile.nodes``."""
        return cls(is_root=True)

    @property
    def name(self) -> str:
        """What to print for this node: the id, ``???`` for a nameless frame, ``*`` for the root."""
        if self.id is not None:
            return str(self.id)
        return "*" if self.is_root else "???"

    @property
    def key(self) -> Hashable:
        """What makes two nodes the same node: Racket's ``(id . src)``."""
        return (self.id, self.src)

    @property
    def filename(self) -> Optional[str]:
        return self.frame[1] if self.frame is not None else None

    @property
    def firstlineno(self) -> Optional[int]:
        return self.frame[2] if self.frame is not None else None

    @property
    def lineno(self) -> Optional[int]:
        return self.frame[3] if self.frame is not None else None

    def __repr__(self) -> str:
        where = f" {self.src}" if self.src is not None else ""
        return (f"<Node {self.name}{where} total={self.total:g} self={self.self:g} "
                f"callers={len(self.callers)} callees={len(self.callees)}>")


class Edge:
    """A caller→callee connection.

    ``total`` is the time of the samples in which the call appears (once per sample).
    ``caller_time`` is this edge's share of the *callee's* total (the callee's caller
    edges sum to its total); ``callee_time`` its share of the *caller's* total (the
    caller's callee edges sum to its total).  Racket divides a sample's time by the
    number of times the other end occurs in the stack, which is what keeps those sums
    exact under recursion.
    """

    __slots__ = ("total", "caller", "caller_time", "callee", "callee_time")

    def __init__(self, total: float, caller: Node, caller_time: float, callee: Node,
                 callee_time: float) -> None:
        self.total = total
        self.caller = caller
        self.caller_time = caller_time
        self.callee = callee
        self.callee_time = callee_time

    def __repr__(self) -> str:
        return (f"<Edge {self.caller.name} -> {self.callee.name} total={self.total:g} "
                f"caller_time={self.caller_time:g} callee_time={self.callee_time:g}>")


class Profile:
    """The result of :func:`analyzer.analyze_samples`: Racket's ``profile`` struct.

    ``total_time`` is the time observed in samples, ``cpu_time`` the process CPU time
    while sampling (Racket's "out of"), ``sample_number`` the samples analysed,
    ``thread_times`` the observed time per thread id, ``nodes`` every node except
    ``root`` in topological order (callers before callees, each layer heaviest first).

    Beyond Racket: ``thread_names`` (thread id → name), ``weight`` (``'cpu'`` or
    ``'wall'``: which clock the times are), ``granularity`` (``'function'`` or
    ``'line'``), ``interval`` (how sample weights were derived) and ``unit`` (a time
    unit of :data:`UNITS`, or ``'B'``: bytes, see :attr:`quantity`).
    """

    __slots__ = ("total_time", "cpu_time", "sample_number", "thread_times", "nodes", "root",
                 "thread_names", "weight", "granularity", "interval", "unit", "source", "runs")

    def __init__(
        self,
        total_time: float,
        cpu_time: float,
        sample_number: int,
        thread_times: dict[Any, float],
        nodes: list[Node],
        root: Node,
        *,
        thread_names: Optional[dict[Any, str]] = None,
        weight: str = "cpu",
        granularity: str = "function",
        interval: str = "midpoint",
        unit: str = "s",
    ) -> None:
        self.total_time = total_time
        self.cpu_time = cpu_time
        self.sample_number = sample_number
        self.thread_times = thread_times
        self.nodes = nodes
        self.root = root
        self.thread_names: dict[Any, str] = {} if thread_names is None else thread_names
        self.weight = weight
        self.granularity = granularity
        self.interval = interval
        self.unit = unit
        # The Snapshots analysed, when the profile covers all of them: the flame graph
        # and the exports need the stacks themselves, which the graph has lost.
        self.source: Any = None
        # The sampler runs behind the profile (sampler.snapshot.RunInfo), when it was
        # analysed from snapshots: the report's header says how they sampled.
        self.runs: tuple = ()

    @property
    def quantity(self) -> str:
        """What the numbers measure: ``'bytes'`` (unit ``'B'``, an allocation profile) or
        ``'time'``."""
        return "bytes" if self.unit in BYTE_UNITS else "time"

    def _repr_html_(self) -> str:
        from .exports.notebook import profile_html

        return profile_html(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        from .exports.notebook import profile_pretty

        profile_pretty(self, p, cycle)

    def edges(self) -> Iterator[Edge]:
        """Every edge once (including those of the root), callers' order."""
        for n in (self.root, *self.nodes):
            yield from n.callees

    def find(self, id: Any, src: Any = ...) -> Node:
        """The node named ``id`` (and at ``src``, if given).

        Raises ``KeyError`` when no node or several nodes match, naming the candidates,
        since a silently picked namesake would mislead.
        """
        found = [n for n in self.nodes if n.id == id and (src is ... or n.src == src)]
        if len(found) == 1:
            return found[0]
        if not found:
            raise KeyError(f"no node {id!r}" + ("" if src is ... else f" at {src!r}"))
        raise KeyError(f"{len(found)} nodes named {id!r}: at " + ", ".join(repr(n.src) for n in found))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return (f"<Profile {self.weight} total={self.total_time:g}{self.unit} "
                f"(out of {self.cpu_time:g}{self.unit}), {self.sample_number} samples, "
                f"{len(self.thread_times)} thread(s), {len(self.nodes)} nodes>")


def finish(root: Node, nodes: list[Node]) -> list[Node]:
    """Sort every node's edges heaviest first and return ``nodes`` in topological order.

    Shared by the analyzer, merging and the JSON reader, so all three produce the
    same order from the same graph.
    """
    from .topo import topological_layers

    for n in (root, *nodes):
        n.callers.sort(key=_caller_time, reverse=True)  # stable, even reversed
        n.callees.sort(key=_callee_time, reverse=True)
    ordered: list[Node] = []
    for layer in topological_layers(root, nodes):
        ordered.extend(layer)
    return ordered


_caller_time = attrgetter("caller_time")
_callee_time = attrgetter("callee_time")
