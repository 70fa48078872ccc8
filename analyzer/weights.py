"""How much time each sample stands for: Racket's midpoint rule, or the interval's end.

A sampler sees a thread only at instants; the time between two instants has to be
given to someone.  Racket splits each gap between a thread's consecutive samples
evenly between the two (so a middle sample gets ``(next - prev) / 2``, the first
``next - cur`` and the last ``cur - prev``), and drops a thread seen only once.

In CPython a thread inside a long C call holds the GIL, so the collector runs late
and its sample shows where the thread went *after* the call; the midpoint rule then
gives half of the long gap to the previous sample, which was elsewhere.  ``'end'``
charges each gap wholly to the sample that ends it (a thread's first sample gets 0).

Weights are integers: microsecond deltas for ``'end'``, *twice* the midpoint weight
for ``'midpoint'`` (so halves stay exact); :data:`SCALE` turns them into seconds.
"""

from __future__ import annotations

from itertools import compress
from operator import add
from typing import Any, Iterator, Optional, Sequence

INTERVALS = ("midpoint", "end")
CLOCKS = ("cpu", "wall")
SCALE = {"midpoint": 0.5e-6, "end": 1e-6}
"""Seconds per weight unit, for weights of snapshot deltas (integer microseconds)."""

_FEW_THREADS = 6  # up to this many, split columns with C-speed passes per thread


def interval_weights(deltas: Sequence[int], interval: str) -> Optional[list]:
    """Per-sample weights of one thread from its deltas (time since its previous sample).

    ``None`` when the thread has fewer than two samples: one instant is no interval.
    """
    n = len(deltas)
    if n < 2:
        return None
    if interval == "end":
        return list(deltas)
    out = [2 * deltas[1]]
    out.extend(map(add, deltas[1:n - 1], deltas[2:]))
    out.append(2 * deltas[n - 1])
    return out


def time_weights(times: Sequence[Any], interval: str) -> Optional[list]:
    """Per-sample weights of one thread from absolute times, oldest first (raw shape).

    Floats, whatever the input's number type, as Racket's JSON has them.
    """
    n = len(times)
    if n < 2:
        return None
    if interval == "end":
        return [0.0] + [float(times[i] - times[i - 1]) for i in range(1, n)]
    out = [float(times[1] - times[0])]
    out.extend((times[i + 1] - times[i - 1]) / 2 for i in range(1, n - 1))
    out.append(float(times[n - 1] - times[n - 2]))
    return out


def split_by_thread(thread_col: Sequence[int], columns: Sequence[Sequence[Any]],
                    wanted: Optional[set] = None) -> Iterator[tuple[int, list[Sequence[Any]]]]:
    """Yield ``(thread id, [column restricted to that thread, ...])`` for each thread.

    Order within a thread is kept.  With one thread the columns are passed through
    untouched; with a few, each is filtered by C-level ``compress`` passes; with many,
    sample indices are bucketed once.  ``wanted`` limits the threads yielded.
    """
    present = set(thread_col)
    if wanted is not None:
        chosen = sorted(present & wanted)
    else:
        chosen = sorted(present)
    if len(present) == 1 and chosen:
        yield chosen[0], list(columns)
        return
    if len(chosen) <= _FEW_THREADS:
        for t in chosen:
            sel = bytes(map(t.__eq__, thread_col))
            yield t, [list(compress(c, sel)) for c in columns]
        return
    buckets: dict[int, list[int]] = {t: [] for t in chosen}
    for i, t in enumerate(thread_col):
        b = buckets.get(t)
        if b is not None:
            b.append(i)
    for t in chosen:
        idx = buckets[t]
        yield t, [[c[i] for i in idx] for c in columns]


def sample_weights(snapshots: Any, clock: str = "cpu", *, interval: str = "midpoint") -> list[float]:
    """Seconds of ``clock`` time each sample of ``snapshots`` stands for.

    The same rule :func:`analyzer.analyze_samples` uses, for tools that need per-sample
    numbers (exporters): ``0.0`` for the sample of a thread seen once.  Idle samples
    (stack 0) get their weight too; callers decide whether idle time counts.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(map(repr, CLOCKS))}, not {clock!r}")
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(map(repr, INTERVALS))}, "
                         f"not {interval!r}")
    deltas = snapshots.cpu_deltas() if clock == "cpu" else snapshots.wall_deltas()
    n = len(deltas)
    scale = SCALE[interval]
    out = [0.0] * n
    index = range(n)
    for _tid, (idx, d) in split_by_thread(snapshots.sample_thread, [index, deltas]):
        w = interval_weights(d, interval)
        if w is not None:
            for i, x in zip(idx, w):
                out[i] = x * scale
    return out
