"""Build ``Snapshots`` values by hand, as the collector would have recorded them.

A test states what was sampled -- ``(thread, cpu_seconds, wall_seconds, [frames
innermost first])`` in sampling order -- and :func:`snapshots` interns frames and
stacks and encodes per-thread microsecond deltas exactly like the real store, so the
analyzer is tested on the very value it receives from the sampler.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

from sampler.snapshot import OVERFLOW, Frame, RunInfo, Snapshots, ThreadInfo

FrameSpec = Union[str, Frame, tuple]


def frame(spec: FrameSpec) -> Frame:
    """``'f'`` → ``Frame('f', 'f.py', 1, 2)``; a tuple → ``Frame(*spec)`` (lineno optional)."""
    if isinstance(spec, Frame):
        return spec
    if isinstance(spec, str):
        return Frame(spec, f"{spec}.py", 1, 2)
    if isinstance(spec, tuple) and len(spec) == 3:
        return Frame(*spec, None)
    return Frame(*spec)


def snapshots(
    samples: Sequence[tuple],
    *,
    custom_keys: Sequence[Any] = (),
    cpu_time: Optional[float] = None,
    thread_names: Optional[Mapping[Any, str]] = None,
) -> Snapshots:
    """``Snapshots`` from ``(thread, cpu_s, wall_s, [frames innermost first][, marks])`` rows.

    ``thread`` is any hashable label (ids are given in order of first appearance and
    the name is ``str(label)`` unless ``thread_names`` says otherwise).  An empty frame
    list is an idle sample.  ``marks`` is the sample's mark set, innermost extent
    first, each extent a ``{key: value}`` dict or a one-value-per-key tuple.
    ``cpu_time`` is the run's process CPU time (default: the CPU the threads used).
    """
    frames: list[Frame] = []
    frame_ids: dict[Frame, int] = {}
    stack_frame, stack_parent = [0], [0]
    stack_ids: dict[tuple[int, int], int] = {}
    threads: list[ThreadInfo] = []
    tids: dict[Any, int] = {}
    last: dict[int, tuple[int, int]] = {}
    mark_sets: list[tuple] = [()]
    mark_ids: dict[tuple, int] = {(): 0}
    cols: dict[str, list[int]] = {k: [] for k in ("thread", "stack", "wall", "cpu", "marks")}
    overflow: dict[str, dict[int, int]] = {"wall": {}, "cpu": {}}
    keys = list(custom_keys)
    used_cpu = 0.0
    for row in samples:
        label, cpu, wall, stack = row[:4]
        tid = tids.get(label)
        if tid is None:
            tid = tids[label] = len(threads)
            name = (thread_names or {}).get(label, str(label))
            threads.append(ThreadInfo(tid, name, 1000 + tid, "thread", 0, wall, cpu))
        sid = 0
        for spec in reversed(list(stack)):  # intern outermost first
            fr = frame(spec)
            fid = frame_ids.get(fr)
            if fid is None:
                fid = frame_ids[fr] = len(frames)
                frames.append(fr)
            key = (sid, fid)
            nxt = stack_ids.get(key)
            if nxt is None:
                nxt = stack_ids[key] = len(stack_frame)
                stack_frame.append(fid)
                stack_parent.append(sid)
            sid = nxt
        cpu_us, wall_us = round(cpu * 1e6), round(wall * 1e6)
        prev = last.get(tid)
        index = len(cols["thread"])
        for col, now, before in (("cpu", cpu_us, prev and prev[0]), ("wall", wall_us, prev and prev[1])):
            delta = 0 if prev is None else now - before
            if delta < 0:
                raise ValueError(f"sample {index}: the {col} clock of thread {label!r} went back")
            if delta >= OVERFLOW:
                overflow[col][index] = delta
                delta = OVERFLOW
            cols[col].append(delta)
        if prev is not None:
            used_cpu += (cpu_us - prev[0]) / 1e6
        last[tid] = (cpu_us, wall_us)
        cols["thread"].append(tid)
        cols["stack"].append(sid)
        marks = row[4] if len(row) > 4 else ()
        ms = tuple(_extent(e, keys) for e in marks)
        mid = mark_ids.get(ms)
        if mid is None:
            mid = mark_ids[ms] = len(mark_sets)
            mark_sets.append(ms)
        cols["marks"].append(mid)
    run = RunInfo(process_cpu=used_cpu if cpu_time is None else cpu_time,
                  custom_keys=tuple(keys))
    return Snapshots(
        frames=frames, stack_frame=stack_frame, stack_parent=stack_parent, threads=threads,
        sample_thread=cols["thread"], sample_stack=cols["stack"], sample_wall=cols["wall"],
        sample_cpu=cols["cpu"], sample_marks=cols["marks"] if keys else None,
        wall_overflow=overflow["wall"], cpu_overflow=overflow["cpu"],
        mark_sets=mark_sets, custom_keys=keys, runs=[run],
    )


def _extent(extent: Union[Mapping[Any, Any], Sequence[Any]], keys: list[Any]) -> tuple:
    if isinstance(extent, Mapping):
        unknown = set(extent) - set(keys)
        if unknown:
            raise ValueError(f"mark keys {unknown!r} are not among custom_keys {keys!r}")
        return tuple(extent.get(k) for k in keys)
    if len(extent) != len(keys):
        raise ValueError(f"a mark extent needs one value per custom key {keys!r}")
    return tuple(extent)
