"""Racket's raw sampler result, so Racket's own examples can be fed in unchanged.

The shape is ``(cpu_time, [(thread_id, thread_time, frame, frame, ...), ...])``:
samples newest first, frames innermost first, each frame a ``(name, src)`` pair of
hashable values (either may be ``None``).  Times are in the input's own unit
(Racket's milliseconds); the profile keeps them unscaled.

Unlike snapshots, Racket has no idle marker: a sample with no frames adds its time
to ``total_time`` and its thread's time, as in Racket.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

from .graph import NodeInfo, StackRow
from .weights import time_weights


class RawInput:
    """The raw shape, validated and summed by distinct stack."""

    __slots__ = ("cpu_time", "sample_number", "thread_times", "rows", "infos")

    def __init__(self) -> None:
        self.cpu_time: Any = 0
        self.sample_number = 0
        self.thread_times: dict[Any, Any] = {}
        self.rows: list[StackRow] = []
        self.infos: list[Optional[NodeInfo]] = [None]


def is_raw_shape(value: Any) -> bool:
    """Does ``value`` look like ``(cpu_time, [samples...])``?"""
    return (isinstance(value, (tuple, list)) and len(value) == 2
            and isinstance(value[0], numbers.Real) and not isinstance(value[0], bool)
            and isinstance(value[1], (list, tuple)))


def read_raw(value: Any, *, interval: str, threads: Optional[Any] = None) -> RawInput:
    """Validate and aggregate; ``threads`` (a set or a predicate on ids) selects threads.

    Bad samples raise ``TypeError`` naming the sample's position in the list.
    """
    out = RawInput()
    cpu_time, samples = value
    out.cpu_time = float(cpu_time)
    node_index: dict[tuple, int] = {}
    by_thread: dict[Any, list[tuple[Any, tuple[int, ...]]]] = {}
    for k, sample in enumerate(samples):
        if not isinstance(sample, (tuple, list)) or len(sample) < 2:
            raise TypeError(f"raw sample {k} must be (thread_id, thread_time, frame, ...), "
                            f"got {sample!r:.80}")
        tid, t = sample[0], sample[1]
        if not isinstance(t, numbers.Real) or isinstance(t, bool):
            raise TypeError(f"raw sample {k}: thread time must be a real number, got {t!r:.80}")
        try:
            hash(tid)
        except TypeError:
            raise TypeError(f"raw sample {k}: thread id must be hashable, "
                            f"got {type(tid).__name__}") from None
        nodes = []
        for j in range(2, len(sample)):
            f = sample[j]
            if not isinstance(f, (tuple, list)) or len(f) != 2:
                raise TypeError(f"frame {j - 2} of raw sample {k} must be a (name, src) pair, "
                                f"got {f!r:.80}")
            key = (f[0], f[1])
            try:
                i = node_index.get(key)
            except TypeError:
                raise TypeError(f"frame {j - 2} of raw sample {k}: name and src must be "
                                f"hashable, got {f!r:.80}") from None
            if i is None:
                i = node_index[key] = len(out.infos)
                out.infos.append(NodeInfo(f[0], f[1]))
            nodes.append(i)
        by_thread.setdefault(tid, []).append((t, tuple(nodes)))

    rows: dict[tuple[int, ...], list] = {}
    for tid, seq in by_thread.items():
        if threads is not None and not threads(tid):
            continue
        out.sample_number += len(seq)
        seq.reverse()  # newest first -> oldest first
        weights = time_weights([t for t, _ in seq], interval)
        if weights is None:
            out.thread_times[tid] = 0.0
            continue
        out.thread_times[tid] = sum(weights)
        for (_, stack), w in zip(seq, weights):
            row = rows.get(stack)
            if row is None:
                rows[stack] = [w, {tid}]
            else:
                row[0] += w
                row[1].add(tid)
    out.thread_times = _sorted_dict(out.thread_times)
    out.rows = [(k, w, tids) for k, (w, tids) in rows.items()]
    return out


def _sorted_dict(d: dict) -> dict:
    try:
        return dict(sorted(d.items()))
    except TypeError:
        return d
