"""pstats: the marshal file of ``cProfile``, so Python's own tools read a sampled profile.

``pstats.Stats(path)`` loads it, and so do snakeviz, tuna and gprof2dot
(``gprof2dot -f pstats FILE | dot -Tsvg -o graph.svg``).  The file maps each
function ``(filename, firstlineno, name)`` to ``(cc, nc, tt, ct, callers)``; a
sampler sees no calls, so the fields mean:

* ``tt`` (own time): weighted seconds in which the function was the innermost frame;
* ``ct`` (cumulative): weighted seconds in which it was anywhere on the stack, counted
  once per sample however deep the recursion (the analyzer's rule, and cProfile's);
* ``nc`` = ``cc``: the number of samples that saw the function on the stack;
* ``callers[f] = (nc, cc, tt, ct)``: the same, restricted to the samples in which
  ``f`` called this function directly.

For allocation samples (``sampler.memprof``), ``tt`` and ``ct`` are estimated *bytes*
(bytes allocated with ``clock='cpu'``, bytes still live with ``'wall'``), written
where pstats expects seconds: pstats prints them as "seconds", so read its
``tottime`` and ``cumtime`` columns as bytes.

Marshal is used only because pstats reads nothing else; :func:`to_pstats` writes
numbers, strings and tuples, nothing that runs code when loaded.
"""

from __future__ import annotations

import marshal
from pathlib import Path

from sampler.snapshot import Snapshots

from ._common import PathLike, _check_clock, check_snapshots, is_memory, weighted_rows, write_output


NO_SAMPLES = ("~", 0, "<no samples>")
"""The one entry of an empty profile's file: ``pstats.Stats`` rejects an empty table."""


def pstats_dict(snapshots: Snapshots, *, clock: str = "cpu") -> dict:
    """The dictionary pstats keeps in ``Stats.stats``, for ``snapshots``."""
    check_snapshots(snapshots)
    column = {"cpu": 1, "wall": 2}[_check_clock(clock)]
    totals = weighted_rows(snapshots, (clock,))
    scale = 1e6 if is_memory(snapshots) else 1.0  # weights are seconds, or bytes / 10**6
    stacks = totals.stacks
    per_node: dict[int, list[float]] = {}
    for (_tid, node, _marks), row in totals.rows.items():
        acc = per_node.setdefault(node, [0, 0.0])
        acc[0] += row[0]
        acc[1] += row[column] * scale
    keys = [(str(fn), int(line or 0), str(name)) for name, fn, line in stacks.functions]
    # per function: [samples, tt, ct]; per (callee, caller): [samples, tt, ct]
    funcs: dict[int, list[float]] = {}
    edges: dict[tuple[int, int], list[float]] = {}
    for node, (count, weight) in per_node.items():
        path = stacks.path(node)  # outermost first
        for f in set(path):
            acc = funcs.setdefault(f, [0, 0.0, 0.0])
            acc[0] += count
            acc[2] += weight
        funcs[path[-1]][1] += weight
        pairs = set(zip(path, path[1:]))  # (caller, callee)
        for caller, callee in pairs:
            acc = edges.setdefault((callee, caller), [0, 0.0, 0.0])
            acc[0] += count
            acc[2] += weight
        if len(path) > 1:
            edges[(path[-1], path[-2])][1] += weight
    stats: dict = {}
    for f, (count, tt, ct) in funcs.items():
        stats[keys[f]] = (int(count), int(count), tt, ct, {})
    for (callee, caller), (count, tt, ct) in edges.items():
        stats[keys[callee]][4][keys[caller]] = (int(count), int(count), tt, ct)
    if not stats:
        # pstats refuses an empty table; say "no samples" the way it shows builtins
        stats[NO_SAMPLES] = (0, 0, 0.0, 0.0, {})
    return stats


def to_pstats(snapshots: Snapshots, *, clock: str = "cpu") -> bytes:
    """The bytes of a pstats file for ``snapshots``, weighted by ``clock``."""
    return marshal.dumps(pstats_dict(snapshots, clock=clock))


def write_pstats(snapshots: Snapshots, path: PathLike, *, clock: str = "cpu") -> Path:
    """Write :func:`to_pstats` to ``path`` (conventionally ``*.prof`` or ``*.pstats``)."""
    return write_output(path, to_pstats(snapshots, clock=clock))
