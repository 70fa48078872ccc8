"""How much time each sample stands for: where the thread ran, the interval's end, or
Racket's midpoint rule.

A sampler sees a thread only at instants; the time between two consecutive samples
of a thread (an *interval*) has to be given to someone.  Two rules:

``'midpoint'`` (Racket's)
    Each interval is split evenly between the two samples that bound it, so a middle
    sample gets ``(next - prev) / 2``, a thread's first sample ``next - cur`` and its
    last ``cur - prev`` (the two ends take their one interval whole, so the weights
    of a thread add up to its time from first to last sample *plus* half of its first
    and last intervals, as in Racket).
``'end'``
    Each interval is charged wholly to the sample that *ends* it: a sample gets
    ``cur - prev``, a thread's first sample ``0`` (no interval ends there), and the
    weights of a thread add up to exactly its time from first to last sample.

``'active'`` (the default for snapshots' CPU time)
    As ``'end'``, except where the thread was idle right after the sample ending the
    interval (it used less than :data:`IDLE_FRACTION` of the next interval in CPU
    time): then the interval's CPU is charged to the sample that *started* it, the
    last place the thread was seen running. A thread that computes and then blocks
    (a burst of work, then a sleep or a wait for I/O) spent that CPU before it
    blocked, not in the call it blocked in. Under wall-clock weighting it is
    ``'end'``. Measured on ``benchmarks`` workload ``bursty`` (3 ms of work, 8 ms of
    sleep), sampled where the thread really is (the native engine), ``'end'`` gives
    the caller of ``sleep`` 15--19% of the CPU that was spent in the work.

Why not one rule: in CPython a thread inside a long C call (``sorted`` of a big list, a
pathological regex) holds the GIL, so the collector cannot run until the call
returns; the late sample shows where the thread is *after* the call, still in the
function that made it.  The midpoint rule gives half of that long interval to the
*previous* sample, which was somewhere else.  Measured (``benchmarks/RESULTS.md``,
workload ``gil_call``): 20--24 points of attribution error with ``'midpoint'``,
0.3--2.9 with ``'end'``; on every other workload the rules agree within noise.

Defaults (``interval=None``, "the input's natural rule", :func:`resolve_interval`):
``'active'`` for ``Snapshots``, ``'midpoint'`` for Racket's raw shape (so Racket's own
examples give Racket's numbers).

Edge cases (:func:`sample_weights`, ``fromsnapshots.aggregate`` and ``rawshape``
handle them alike; the raw shape has no idle markers -- a raw sample without frames
adds its time, as in Racket):

* A thread seen once is dropped (Racket's rule): one instant is no interval.  Its
  sample counts in ``sample_number`` and its thread time is 0.
* Idle markers (snapshot samples with stack 0: a greenlet switched out, the
  profiler's own frames) bound intervals like any sample and get a weight, but they
  have no frames, so that weight is charged to nobody.  Under ``'end'`` the interval
  *ending* at an idle marker is the idle time, and the one after it goes to the next
  real sample; under ``'midpoint'`` half of each neighbouring interval is lost with
  the marker.
* A thread's first sample: under ``'end'`` it weighs 0 (its frames appear, and it
  counts in ``sample_number``, with zero time); under ``'midpoint'`` it takes its one
  interval whole.  (Snapshot deltas are 0 at a thread's first sample by format, so
  ``'end'`` can use the deltas as they are; the raw shape's ``'end'`` weights start
  with an explicit 0.)

Weights are integers: microsecond deltas for ``'end'``, *twice* the midpoint weight
for ``'midpoint'`` (so halves stay exact); :data:`SCALE` turns them into seconds.
"""

from __future__ import annotations

from itertools import compress
from operator import add
from typing import Any, Iterator, Optional, Sequence

INTERVALS = ("midpoint", "end", "active")
NATURAL_INTERVAL = {"snapshots": "active", "raw": "midpoint"}
"""The rule ``interval=None`` stands for, by input: see the module docstring."""
CLOCKS = ("cpu", "wall")
SCALE = {"midpoint": 0.5e-6, "end": 1e-6, "active": 1e-6}
IDLE_FRACTION = 0.1
"""Below this share of CPU over the next interval, a thread counts as idle after a sample."""
"""Seconds per weight unit, for weights of snapshot deltas (integer microseconds)."""

_FEW_THREADS = 6  # up to this many, split columns with C-speed passes per thread


def resolve_interval(interval: Optional[str], *, raw: bool = False) -> str:
    """The rule to use: ``interval`` itself, or for ``None`` the input's natural rule
    (``'end'`` for snapshots, ``'midpoint'`` for the raw shape, ``raw=True``).

    An unknown rule is a ``ValueError`` naming the valid ones.
    """
    if interval is None:
        return NATURAL_INTERVAL["raw" if raw else "snapshots"]
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(map(repr, INTERVALS))}, "
                         f"not {interval!r}")
    return interval


def clock_deltas(snapshots: Any, clock: str, interval: str) -> Sequence[int]:
    """The per-sample deltas that rule ``interval`` charges, as ``'end'`` would charge
    them: for ``'active'`` CPU, each interval that ends where its thread went idle is
    moved onto the sample before it (see the module docstring)."""
    if clock != "cpu":
        return snapshots.wall_deltas()
    cpu = snapshots.cpu_deltas()
    if interval != "active":
        return cpu
    wall = snapshots.wall_deltas()
    stacks = snapshots.sample_stack
    out = list(cpu)
    last: dict[int, int] = {}  # thread -> index of its previous sample
    before: dict[int, int] = {}  # thread -> index of the sample before that
    for i, t in enumerate(snapshots.sample_thread):
        j = last.get(t)
        if j is not None:
            h = before.get(t)
            # j ends an interval and i tells whether the thread was idle after j
            if (h is not None and stacks[j] and stacks[h] and out[j]
                    and cpu[i] < IDLE_FRACTION * wall[i]):
                out[h] += out[j]
                out[j] = 0
            before[t] = j
        last[t] = i
    return out


def interval_weights(deltas: Sequence[int], interval: str) -> Optional[list]:
    """Per-sample weights of one thread from its deltas (time since its previous sample).

    ``None`` when the thread has fewer than two samples: one instant is no interval.
    """
    n = len(deltas)
    if n < 2:
        return None
    if interval != "midpoint":  # 'active' deltas come already moved (clock_deltas)
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
    if interval != "midpoint":  # the raw shape has no wall times: 'active' is 'end'
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


def sample_weights(snapshots: Any, clock: str = "cpu", *,
                   interval: Optional[str] = None) -> list[float]:
    """Seconds of ``clock`` time each sample of ``snapshots`` stands for.

    The same rule :func:`analyzer.analyze_samples` uses, for tools that need per-sample
    numbers (exporters), and the same default: ``interval=None`` is ``'end'`` for
    snapshots (each interval charged to the sample that ends it; ``'midpoint'`` is
    Racket's even split, see the module docstring for why ``'end'`` is the default).

    Edge cases, as in the analysis:

    * a thread seen once: its sample gets ``0.0`` (Racket drops such threads);
    * a thread's first sample: ``0.0`` under ``'end'`` (no interval ends there),
      its one interval whole under ``'midpoint'``; its last sample: its own interval
      under both rules (whole under ``'midpoint'``, as Racket's "last: cur - prev");
    * idle samples (stack 0) bound intervals and get their weight like any sample
      (the interval ending at them under ``'end'``, half of each neighbour under
      ``'midpoint'``); callers decide whether idle time counts -- the analysis and
      the exporters charge it to nobody.

    Under ``'end'`` a thread's weights sum to its clock time from its first to its
    last sample.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(map(repr, CLOCKS))}, not {clock!r}")
    interval = resolve_interval(interval)
    deltas = clock_deltas(snapshots, clock, interval)
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
