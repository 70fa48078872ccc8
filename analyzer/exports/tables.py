"""Racket's caller/callee table as plain data, for the flame graph page and notebooks.

The numbers come from :func:`analyzer.analyze_samples` (never recomputed here): one
table for all threads and, for up to ``max_threads`` threads, one per thread, each
for CPU and for wall time, so the page's selectors switch tables without a server.
"""

from __future__ import annotations

from typing import Any, Optional

from sampler.snapshot import Snapshots


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def profile_table(profile: Any, fids: dict[tuple, int]) -> dict[str, Any]:
    """One Profile as ``{"total", "nodes": [[idx, name, src, total, self, fid, callers, callees]]}``.

    Edges are ``[idx, time, name, local%]``.  Those to and from Racket's ``*`` root
    (entry points, self time) are left out: the node row already shows them.  A
    caller's time is its share of the node's total (``caller_time``), a callee's the
    node's time spent calling it (``callee_time``), as in Racket's text renderer.
    """
    index = {id(n): i + 1 for i, n in enumerate(profile.nodes)}
    rows = []
    for i, node in enumerate(profile.nodes, 1):
        frame = node.frame
        fid = fids.get(tuple(frame[:3]), -1) if frame is not None else -1
        callers = [[index[id(e.caller)], e.caller_time, e.caller.name,
                    _pct(e.caller_time, node.total)] for e in node.callers if id(e.caller) in index]
        callees = [[index[id(e.callee)], e.callee_time, e.callee.name,
                    _pct(e.callee_time, node.total)] for e in node.callees if id(e.callee) in index]
        rows.append([i, node.name, None if node.src is None else str(node.src), node.total,
                     node.self, fid, callers, callees])
    return {"total": profile.total_time, "nodes": rows}


def caller_callee_tables(snapshots: Snapshots, fids: dict[tuple, int], *,
                         max_threads: int = 8) -> Optional[dict[str, Any]]:
    """Tables keyed ``"cpu:all"``, ``"wall:all"``, ``"cpu:<thread id>"`` …; ``None``
    when the analyzer is not importable (the page then says so)."""
    try:
        from analyzer.analyze import analyze_samples
    except ImportError:
        return None
    present = sorted(set(snapshots.sample_thread))
    scopes: list[tuple[str, Any]] = [("all", None)]
    if 1 < len(present) <= max_threads:  # with one thread, its table is the "all" one
        scopes += [(str(t), [t]) for t in present]
    out: dict[str, Any] = {}
    for clock in ("cpu", "wall"):
        for name, threads in scopes:
            profile = analyze_samples(snapshots, weight=clock, threads=threads)
            out[f"{clock}:{name}"] = profile_table(profile, fids)
    return out
