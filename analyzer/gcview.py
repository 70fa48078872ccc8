"""Garbage collection time in a profile: where ``<gc>`` frames go, and how much.

The sampler files each collection as a sample of the stack that triggered it plus a
``<gc>`` frame whose line is the generation (:mod:`sampler.gctime`).  By default
(``gc_frames='root'``) a profile shows every collection under one ``<gc>`` function
called from the root, apart from the program's functions (MLton's separate GC
time; a report stays short); ``'stack'`` keeps it under the stack that triggered it
(who made the garbage); ``'hide'`` drops that time from the profile (the samples
stay, as idle samples charged to nobody).
"""

from __future__ import annotations

from typing import Any

from sampler.gctime import is_gc_frame

GC_PLACEMENTS = ("stack", "root", "hide")


def check_gc(gc: Any) -> str:
    if gc not in GC_PLACEMENTS:
        raise ValueError(f"gc_frames must be one of {', '.join(map(repr, GC_PLACEMENTS))}, not {gc!r}")
    return gc


def place_gc(snapshots: Any, gc: str) -> Any:
    """``snapshots`` with its collections' samples moved as ``gc`` says (a new value;
    the same one for ``'stack'`` or when it has no collection)."""
    check_gc(gc)
    if gc == "stack":
        return snapshots
    gc_frames = {i for i, f in enumerate(snapshots.frames) if is_gc_frame(f)}
    if not gc_frames:
        return snapshots
    from sampler.snapshot import Snapshots

    stack_frame = list(snapshots.stack_frame)
    stack_parent = list(snapshots.stack_parent)
    at_root = {fid: sid for sid, (fid, parent) in enumerate(zip(stack_frame, stack_parent))
               if sid and parent == 0 and fid in gc_frames}
    moved: dict[int, int] = {}
    for sid in range(1, len(stack_frame)):
        fid = stack_frame[sid]
        if fid not in gc_frames:
            continue
        if gc == "hide":
            moved[sid] = 0
            continue
        root = at_root.get(fid)
        if root is None:
            root = at_root[fid] = len(stack_frame)
            stack_frame.append(fid)
            stack_parent.append(0)
        moved[sid] = root
    stacks = [moved.get(s, s) for s in snapshots.sample_stack]
    return Snapshots(
        frames=snapshots.frames, stack_frame=stack_frame, stack_parent=stack_parent,
        threads=snapshots.threads, sample_thread=snapshots.sample_thread, sample_stack=stacks,
        sample_wall=snapshots.sample_wall, sample_cpu=snapshots.sample_cpu,
        sample_marks=snapshots.sample_marks, wall_overflow=snapshots.wall_overflow,
        cpu_overflow=snapshots.cpu_overflow, mark_sets=snapshots.mark_sets,
        custom_keys=snapshots.custom_keys, runs=snapshots.runs)


def gc_times(profile: Any) -> dict[int, float]:
    """Generation -> time of the profile's collections (empty: none filed).

    At line granularity each generation is a node of its own; at function granularity
    the generations share one ``<gc>`` node, whose time is split as the sampler runs
    recorded it per generation (``RunInfo.extra``, ``gc_seconds`` or
    ``gc_wall_seconds`` by the profile's weight); without that record, all of it is
    under generation ``-1`` (unknown)."""
    out: dict[int, float] = {}
    total = 0.0
    for node in profile.nodes:
        frame = node.frame
        if frame is not None and len(frame) >= 4 and is_gc_frame(frame):
            total += node.self
            if frame[3] is not None:
                out[frame[3]] = out.get(frame[3], 0.0) + node.self
    if not total or out:
        return out
    key = "gc_wall_seconds" if profile.weight == "wall" else "gc_seconds"
    recorded: dict[int, float] = {}
    for run in profile.runs:
        for gen, seconds in (getattr(run, "extra", None) or {}).get(key, {}).items():
            recorded[int(gen)] = recorded.get(int(gen), 0.0) + float(seconds)
    whole = sum(recorded.values())
    if not whole:
        return {-1: total}
    return {gen: total * seconds / whole for gen, seconds in sorted(recorded.items())}
