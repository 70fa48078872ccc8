"""The gap a sampler leaves in the program: a leaf loop that times its own pauses.

``gap_leaf`` runs a tight loop of a few operations and reads ``perf_counter_ns``
every iteration; whenever two readings are more than ``THRESHOLD_NS`` (10 µs) apart,
the thread was stopped in between (its GIL taken by the collector, a hand-off, an
external sampler stopping the process, or the OS running something else) and the
pause is recorded.  The harness subtracts the pauses of the paired no-profiler run
and divides by the profiler's ticks: the time the program lost per sample
(DESIGN.md, "Measuring what a sample costs").  Judged, like ``deep``, against py-spy
at 1000 Hz for attribution (it is one function, so that part is trivial).
"""

from __future__ import annotations

import time
from array import array
from typing import Any

from . import seconds_per_unit

NAME = "gap"
DESCRIPTION = "a leaf loop recording every pause > 10 µs between its iterations"
PARTS: tuple = ()
SINGLE_THREAD = True
THRESHOLD_NS = 10_000
CHUNK = 200_000


def gap_leaf(n: int, gaps: array) -> int:
    """``n`` iterations; each pause longer than the threshold appends (its end, its length) in ns."""
    clock = time.perf_counter_ns
    s = 0
    prev = clock()
    for i in range(n):
        s += i & 7
        now = clock()
        if now - prev > THRESHOLD_NS:
            gaps.append(now)
            gaps.append(now - prev)
        prev = now
    return s


def calibrate(seconds: float) -> dict:
    per_iteration = seconds_per_unit(lambda n: gap_leaf(n, array("q")), CHUNK)
    return {"chunks": max(1, round(seconds / (per_iteration * CHUNK))), "chunk": CHUNK}


def setup(params: dict) -> Any:
    return dict(params, gaps=array("q"))


def gap_main(chunks: int, chunk: int, gaps: array) -> None:
    for _ in range(chunks):
        gap_leaf(chunk, gaps)


def run(state: Any) -> dict:
    gap_main(state["chunks"], state["chunk"], state["gaps"])
    return {}


def report(state: Any) -> dict:
    """The pauses the loop saw (read after the run, outside the timed part)."""
    ends, lengths = state["gaps"][0::2], state["gaps"][1::2]
    return {"gap_count": len(lengths), "gap_ns": sum(lengths), "gap_longest_ns": max(lengths, default=0),
            "iterations": state["chunks"] * state["chunk"],
            # (start, end) of every pause, perf_counter_ns: matched to a sampler's ticks by the child
            "gap_intervals": [(e - n, e) for e, n in zip(ends, lengths)]}
