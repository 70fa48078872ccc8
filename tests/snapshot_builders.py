"""Build ``Snapshots`` values by hand, as the collector would have recorded them.

A test states what was sampled -- ``(thread, cpu_seconds, wall_seconds, [frames
innermost first])`` in sampling order -- and :func:`snapshots` interns frames and
stacks and encodes per-thread microsecond deltas exactly like the real store, so the
analyzer is tested on the very value it receives from the sampler.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

from sampler.snapshot import OVERFLOW, Frame, RunInfo, Snapshots, StackTrie, ThreadInfo

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
    builder = SnapshotsBuilder(custom_keys)
    for row in samples:
        label, cpu, wall, stack = row[:4]
        builder.sample(label, cpu, wall, [frame(spec) for spec in reversed(list(stack))],
                       row[4] if len(row) > 4 else (),
                       name=(thread_names or {}).get(label, str(label)))
    return builder.build(RunInfo(process_cpu=builder.used_cpu if cpu_time is None else cpu_time,
                                 custom_keys=tuple(builder.custom_keys)))


class SnapshotsBuilder:
    """Samples, one at a time, encoded into a ``Snapshots`` value as the collector does.

    The one encoder behind every hand-built test value (:func:`snapshots` here and
    ``export_builders.build``), so that the analyzer and the exporters are tested on
    the same encoding: frames and stacks interned by :class:`StackTrie`, each
    thread's clocks as microsecond deltas since its previous sample (``OVERFLOW`` and
    the exact value where one does not fit), mark sets interned.
    """

    def __init__(self, custom_keys: Sequence[Any] = ()) -> None:
        self.custom_keys = list(custom_keys)
        self.used_cpu = 0.0
        """CPU seconds the threads used between their samples (a run's default CPU time)."""
        self._trie = StackTrie()
        self._threads: list[ThreadInfo] = []
        self._thread_ids: dict[Any, int] = {}
        self._last: dict[int, tuple[int, int]] = {}
        self._mark_sets: list[tuple] = [()]
        self._mark_ids: dict[tuple, int] = {(): 0}
        self._cols: dict[str, list[int]] = {k: [] for k in ("thread", "stack", "wall", "cpu", "marks")}
        self._overflow: dict[str, dict[int, int]] = {"wall": {}, "cpu": {}}

    def sample(self, thread: Any, cpu: float, wall: float, frames: Sequence[Frame],
               marks: Sequence[Any] = (), *, name: str, kind: str = "thread",
               native_id: Optional[int] = None) -> None:
        """Append one sample of ``thread`` (any hashable label) whose clocks read ``cpu``
        and ``wall`` seconds, in ``frames`` (outermost first; none: idle).

        ``name``, ``kind`` and ``native_id`` (the OS thread's; default: one of its
        own) describe the thread when it is first seen: greenlets of one OS thread
        share it. ``marks`` is the mark set, innermost extent first (see
        :func:`snapshots`).
        """
        cols, last = self._cols, self._last
        tid = self._thread_ids.get(thread)
        if tid is None:
            tid = self._thread_ids[thread] = len(self._threads)
            self._threads.append(ThreadInfo(tid, name, 1000 + tid if native_id is None else native_id,
                                            kind, 0, wall, cpu))
        sid = self._trie.path_id(self._trie.frame_id(fr) for fr in frames)
        cpu_us, wall_us = round(cpu * 1e6), round(wall * 1e6)
        prev = last.get(tid)
        index = len(cols["thread"])
        for col, now, before in (("cpu", cpu_us, prev and prev[0]), ("wall", wall_us, prev and prev[1])):
            delta = 0 if prev is None else now - before
            if delta < 0:
                raise ValueError(f"sample {index}: the {col} clock of thread {thread!r} went back")
            if delta >= OVERFLOW:
                self._overflow[col][index] = delta
                delta = OVERFLOW
            cols[col].append(delta)
        if prev is not None:
            self.used_cpu += (cpu_us - prev[0]) / 1e6
        last[tid] = (cpu_us, wall_us)
        cols["thread"].append(tid)
        cols["stack"].append(sid)
        ms = tuple(_extent(e, self.custom_keys) for e in marks)
        mid = self._mark_ids.get(ms)
        if mid is None:
            mid = self._mark_ids[ms] = len(self._mark_sets)
            self._mark_sets.append(ms)
        cols["marks"].append(mid)

    def build(self, run: RunInfo) -> Snapshots:
        """The value of every sample so far, as one ``run``."""
        cols, keys, trie = self._cols, self.custom_keys, self._trie
        return Snapshots(
            frames=trie.frames, stack_frame=trie.stack_frame, stack_parent=trie.stack_parent,
            threads=self._threads, sample_thread=cols["thread"], sample_stack=cols["stack"],
            sample_wall=cols["wall"], sample_cpu=cols["cpu"],
            sample_marks=cols["marks"] if keys else None,
            wall_overflow=self._overflow["wall"], cpu_overflow=self._overflow["cpu"],
            mark_sets=self._mark_sets, custom_keys=keys, runs=[run],
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
