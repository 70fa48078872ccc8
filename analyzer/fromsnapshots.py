"""Reading a ``Snapshots`` value: weight its samples and sum them by distinct stack.

This is the only place that walks samples one by one, and it does only what must be
done per sample: add its share of each interval to a key naming its (thread, group,
stack).  Keys are built by C-level ``map`` passes over the columns, and the one
Python loop indexes a flat list, so a million samples cost a fraction of a second
whatever the number of threads.  Everything after works on distinct keys.

The ``'end'`` rule adds each sample's delta -- the gap that ends at it -- to its own
key; a thread's first sample has delta 0.  ``'active'`` and ``'split'`` (the native
engine's default) move deltas between samples first (``weights.clock_deltas``), then
add them as ``'end'`` does.

The midpoint rule, in doubled units so halves stay integers: the gap ``d`` that
ends at a sample is charged ``d`` to it and ``d`` to the previous sample of the same
thread; then a thread's first sample gets its gap to the second once more, and its
last sample its own gap once more (Racket's "first: next - cur, last: cur - prev").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from operator import add
from typing import Any, Hashable, Optional, Sequence

from .graph import NodeInfo, StackRow
from .markfilter import MISSING
from .weights import clock_deltas, interval_weights

_FLAT_LIMIT = 1 << 22  # sum into a flat list up to this many keys, a dict beyond


class Group:
    """The samples of one profile-to-be: rows by stack id, thread times, sample count."""

    __slots__ = ("rows", "thread_times", "sample_number")

    def __init__(self) -> None:
        self.rows: dict[int, list] = {}  # stack id -> [weight, {thread ids}]
        self.thread_times: dict[int, int] = {}
        self.sample_number = 0

    def add(self, tid: int, stack: int, w: int) -> None:
        row = self.rows.get(stack)
        if row is None:
            self.rows[stack] = [w, {tid}]
        else:
            row[0] += w
            row[1].add(tid)


def aggregate(
    snapshots: Any,
    *,
    clock: str,
    interval: str,
    threads: Optional[set] = None,
    group_of_mark_set: Optional[Sequence[Hashable]] = None,
    deltas: Optional[Sequence[int]] = None,
) -> dict[Hashable, Group]:
    """Sum weights per (group, thread, stack); weights stay integers (``weights.SCALE``).

    ``group_of_mark_set[m]`` names the group of samples with mark set ``m``
    (``MISSING`` drops them); without it every sample goes to group ``None``.
    ``threads`` limits the threads.  A sample keeps the weight it has in its whole
    thread, whichever samples around it are dropped.  Idle samples (stack 0) are
    weighted -- they bound their neighbours' intervals -- but add nothing to any row,
    thread time or sample count.  ``deltas``: what ``weights.clock_deltas`` gives
    for these samples, when already known (from them before their collections were
    moved: ``gcview.place_gc``).
    """
    if deltas is None:
        deltas = clock_deltas(snapshots, clock, interval)
    thread_col, stack_col = snapshots.sample_thread, snapshots.sample_stack
    n = len(thread_col)
    n_stacks = len(snapshots.stack_frame)

    # -- groups: numbers 0..G-1, and G for samples that belong to none
    if group_of_mark_set is None:
        names: list[Hashable] = [None]
        group_col = None
        only_group = 0
    else:
        names = [g for g in dict.fromkeys(group_of_mark_set) if g is not MISSING]
        number = {g: i for i, g in enumerate(names)}
        gnum = [len(names) if g is MISSING else number[g] for g in group_of_mark_set]
        marks_col = snapshots.sample_marks
        if marks_col is None:  # every sample has mark set 0
            group_col, only_group = None, gnum[0]
        elif len(set(gnum)) == 1:
            group_col, only_group = None, gnum[0]
        else:
            group_col, only_group = list(map(gnum.__getitem__, marks_col)), -1
    n_groups = len(names)
    if not n or only_group == n_groups:
        return {}

    # -- threads: slots 0..S-1 for the wanted ones
    present = set(thread_col)
    wanted = sorted(present if threads is None else present & threads)
    if not wanted:
        return {}
    slot = {t: i for i, t in enumerate(wanted)}
    junk = len(wanted) * n_groups  # the bucket of samples that count for nothing

    # -- one key per sample: bucket * n_stacks + stack, bucket = slot * n_groups + group
    n_threads = max(present) + 1
    if group_col is None:
        base = [junk * n_stacks] * n_threads
        for t, i in slot.items():
            base[t] = (i * n_groups + only_group) * n_stacks
        if len(present) == 1 and base[wanted[0]] == 0:
            keys: Sequence[int] = stack_col
        else:
            keys = list(map(add, map(base.__getitem__, thread_col), stack_col))
    else:
        width = n_groups + 1
        table = [junk * n_stacks] * (n_threads * width)
        for t, i in slot.items():
            for g in range(n_groups):
                table[t * width + g] = (i * n_groups + g) * n_stacks
        bucket = map(table.__getitem__, map(add, map(width.__mul__, thread_col), group_col))
        keys = list(map(add, bucket, stack_col))

    # -- the pass over the samples
    size = (junk + 1) * n_stacks
    acc: Any = [0] * size if size <= _FLAT_LIMIT else defaultdict(int)
    single: set[int] = set()  # threads seen once: Racket drops them
    if len(present) == 1:
        weights = interval_weights(deltas, interval)
        if weights is None:
            single.add(wanted[0])
        else:
            for k, w in zip(keys, weights):
                acc[k] += w
    elif interval != "midpoint":  # 'end', and 'active' and 'split' on their moved deltas
        for k, d in zip(keys, deltas):
            acc[k] += d
        single = _single_sample_threads(thread_col, wanted)
    else:
        prev = [junk * n_stacks] * n_threads
        for t, k, d in zip(thread_col, keys, deltas):
            acc[k] += d
            acc[prev[t]] += d
            prev[t] = k
        first = dict(zip(reversed(thread_col), range(n - 1, -1, -1)))
        last = dict(zip(thread_col, range(n)))
        single = {t for t in wanted if first[t] == last[t]}
        for t in wanted:
            if t in single:
                continue
            i0, i_last = first[t], last[t]
            acc[keys[i0]] += deltas[thread_col.index(t, i0 + 1)]
            acc[keys[i_last]] += deltas[i_last]

    # -- distinct keys back to (group, thread, stack)
    groups = [Group() for _ in names]
    for k, count in Counter(keys).items():
        b, stack = divmod(k, n_stacks)
        if b == junk or stack == 0:
            continue
        i, g = divmod(b, n_groups)
        tid = wanted[i]
        group = groups[g]
        group.sample_number += count
        if tid in single:
            group.thread_times[tid] = 0
            continue
        w = acc[k]
        group.thread_times[tid] = group.thread_times.get(tid, 0) + w
        group.add(tid, stack, w)
    return {names[g]: group for g, group in enumerate(groups) if group.sample_number}


def _single_sample_threads(thread_col: Sequence[int], wanted: Sequence[int]) -> set[int]:
    counts = Counter(thread_col)
    return {t for t in wanted if counts[t] < 2}


def node_rows(snapshots: Any, rows: dict[int, list], granularity: str
              ) -> tuple[list[StackRow], list[Optional[NodeInfo]]]:
    """Translate stack-id rows into node rows, merging stacks that differ only below
    the granularity (two lines of one function are one node at function granularity).

    Node ids are qualified names; ``src`` is ``"file:firstline"`` (``"file:line"`` at
    line granularity), ``None`` for a frame without a file.
    """
    from sampler.snapshot import Frame

    infos: list[Optional[NodeInfo]] = [None]
    frame_node: list[int] = []
    index: dict[tuple, int] = {}
    by_line = granularity == "line"
    for f in snapshots.frames:
        key = tuple(f) if by_line else f.function_key
        i = index.get(key)
        if i is None:
            i = index[key] = len(infos)
            line = f.lineno if by_line else f.firstlineno
            if not f.filename:
                src = None
            elif line is None:
                src = f.filename
            else:
                src = f"{f.filename}:{line}"
            frame = Frame(f.name, f.filename, f.firstlineno, f.lineno if by_line else None)
            infos.append(NodeInfo(f.name, src, frame))
        frame_node.append(i)
    merged: dict[tuple[int, ...], list] = {}
    get_node = frame_node.__getitem__
    stack_of = snapshots.stack
    for sid, (w, tids) in rows.items():
        nodes = tuple(map(get_node, stack_of(sid)))
        row = merged.get(nodes)
        if row is None:
            merged[nodes] = [w, tids]
        else:
            row[0] += w
            row[1] = row[1] | tids
    return [(k, w, tids) for k, (w, tids) in merged.items()], infos
