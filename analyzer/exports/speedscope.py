"""speedscope JSON: one sampled profile per thread, samples in the order they were taken.

speedscope's "Time Order" view replays samples left to right, so unlike the other
exports this one keeps every sample (no aggregation): each thread becomes a
``"sampled"`` profile whose ``samples[i]`` is a list of indices into the shared frame
table, outermost first, and whose ``weights[i]`` is that sample's weight in seconds
(the analyzer's per-sample rule), or for allocation samples (``sampler.memprof``) its
estimated bytes, with the unit ``"bytes"``.  Samples without frames (an idle thread) and
threads with no framed sample are left out.

Open the result with ``speedscope FILE`` (``npm install -g speedscope``) or by
dropping it on the speedscope web page; nothing is uploaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from sampler.snapshot import Snapshots

from ._common import (
    FunctionStacks, PathLike, _check_clock, check_snapshots, is_memory, sample_weights, write_output,
)

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


def _exporter_name() -> str:
    try:
        from importlib.metadata import version

        return f"stackshot@{version('stackshot')}"
    except Exception:  # not installed (running from a checkout)
        return "stackshot"


def speedscope_document(snapshots: Snapshots, *, clock: str = "cpu",
                        name: Optional[str] = None) -> dict[str, Any]:
    """The speedscope file as plain data (what :func:`to_speedscope` serialises)."""
    check_snapshots(snapshots)
    _check_clock(clock)
    stacks = FunctionStacks.build(snapshots)
    weights = sample_weights(snapshots, clock)
    unit, measure = "seconds", f"{clock} time"
    if is_memory(snapshots):  # allocation samples: whole bytes
        from analyzer.memory import BYTES_PER_SECOND_SLOT, view

        unit, measure = "bytes", f"bytes {view(clock)}"
        weights = [round(w * BYTES_PER_SECOND_SLOT) for w in weights]
    paths: dict[int, list[int]] = {}
    per_thread: dict[int, tuple[list[list[int]], list[float]]] = {}
    for i, (tid, sid) in enumerate(zip(snapshots.sample_thread, snapshots.sample_stack)):
        if sid == 0:
            continue
        node = stacks.of_stack[sid]
        path = paths.get(node)
        if path is None:
            path = paths[node] = stacks.path(node)
        samples, ws = per_thread.setdefault(tid, ([], []))
        samples.append(path)
        ws.append(weights[i])
    profiles = []
    ends: list[float] = []
    for tid in sorted(per_thread):
        samples, ws = per_thread[tid]
        info = snapshots.threads[tid]
        total = sum(ws)
        ends.append(total)
        profiles.append({
            "type": "sampled",
            "name": f"{info.name} ({info.kind} {tid}, {measure})",
            "unit": unit,
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": ws,
        })
    frames = []
    for fname, filename, firstlineno in stacks.functions:
        frame: dict[str, Any] = {"name": fname}
        if filename:
            frame["file"] = filename
        if firstlineno:
            frame["line"] = firstlineno
        frames.append(frame)
    heaviest = ends.index(max(ends)) if ends else 0
    if name is None:
        run = snapshots.runs[0] if snapshots.runs else None
        name = f"stackshot profile of pid {run.pid} on {run.host}" if run and run.pid else "stackshot profile"
    return {
        "$schema": SCHEMA_URL,
        "exporter": _exporter_name(),
        "name": name,
        "activeProfileIndex": heaviest,
        "shared": {"frames": frames},
        "profiles": profiles,
    }


def to_speedscope(snapshots: Snapshots, *, clock: str = "cpu", name: Optional[str] = None) -> str:
    """The speedscope JSON text of ``snapshots``, weighted by ``clock`` ('cpu' or 'wall')."""
    return json.dumps(speedscope_document(snapshots, clock=clock, name=name),
                      separators=(",", ":"), ensure_ascii=False)


def write_speedscope(snapshots: Snapshots, path: PathLike, *, clock: str = "cpu",
                     name: Optional[str] = None) -> Path:
    """Write :func:`to_speedscope` to ``path`` (conventionally ``*.speedscope.json``)."""
    return write_output(path, to_speedscope(snapshots, clock=clock, name=name))
