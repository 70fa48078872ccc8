"""The gap a sampler leaves in a program whose threads take turns with the GIL.

``gap`` measures one thread; with one busy thread the machine's other core is idle,
and whatever the collector does there costs the program nothing.  Here four threads
run the same leaf loop at once, so the GIL changes hands every switch interval and
the running thread moves between the cores: a collector thread that wakes on a core
where the program runs takes that core from it, and a collector that takes the GIL
waits among four threads for it.

Each loop adds up its own steps that took at most ``THRESHOLD_NS`` (10 µs): the time
that thread was making progress.  ``gap_ns`` is the wall time of the loops minus the
sum over the threads, the time in which no thread made progress (GIL hand-offs, the
collector's turns, the OS); the harness subtracts that of the paired no-profiler run
(``gap_excess_*``).  Two of the threads loop three times as long as the other two
(``gt_heavy``, ``gt_light``): their CPU times, measured, are the truth for
attribution (py-spy is no reference here: it counted the main thread's ``join``
as running for 3-12% of its samples).
"""

from __future__ import annotations

import time
from typing import Any

from . import seconds_per_unit
from .threads import run_busy_threads

NAME = "gap_threads"
DESCRIPTION = ("4 threads (2 light, 2 heavy: 1:3) running a leaf loop that times its own steps; "
               "the time none made progress")
PARTS = ("gt_light", "gt_heavy")
SINGLE_THREAD = False
THRESHOLD_NS = 10_000
CHUNK = 200_000


def gt_leaf(n: int, out: list) -> int:
    """``n`` iterations; appends (first reading, last reading, ns in steps <= threshold)."""
    clock = time.perf_counter_ns
    s = 0
    ran = 0
    first = prev = clock()
    for i in range(n):
        s += i & 7
        now = clock()
        if now - prev <= THRESHOLD_NS:
            ran += now - prev
        prev = now
    out.append((first, prev, ran))
    return s


def calibrate(seconds: float) -> dict:
    per_iteration = seconds_per_unit(lambda n: gt_leaf(n, []), CHUNK)
    # (the threads take turns: the work of all of them is what fills the run; a light
    # thread does one share of it, a heavy one three)
    return {"chunks": max(1, round(seconds / (per_iteration * CHUNK * sum(WEIGHTS)))), "chunk": CHUNK}


def setup(params: dict) -> Any:
    return dict(params, spans=[])


def gt_light(chunks: int, chunk: int, spans: list) -> None:
    for _ in range(chunks):
        gt_leaf(chunk, spans)


def gt_heavy(chunks: int, chunk: int, spans: list) -> None:
    for _ in range(chunks):
        gt_leaf(chunk, spans)


WORKERS = (gt_light, gt_heavy, gt_light, gt_heavy)
WEIGHTS = (1, 3, 1, 3)  # chunks of each worker, in units of ``chunks``


def run(state: Any) -> dict:
    units = [w * state["chunks"] for w in WEIGHTS]
    return run_busy_threads(WORKERS, units, state["chunk"], state["spans"])


def report(state: Any) -> dict:
    """The time in which no thread made progress (read after the run, untimed)."""
    spans = state["spans"]
    wall = max(s[1] for s in spans) - min(s[0] for s in spans)
    ran = sum(s[2] for s in spans)
    return {"gap_ns": wall - ran, "gap_count": len(spans),
            "iterations": len(spans) * state["chunk"]}
