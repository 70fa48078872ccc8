"""Garbage in reference cycles: the collector's time, and whose it is.

``gc_cycles_part`` builds small object graphs that are reference cycles and drops
them, so the cyclic garbage collector runs often under it; ``gc_math_part`` is
arithmetic that allocates nothing that survives.  The truth of each part is its
thread CPU time in runs without a profiler (collections triggered in the cycles part
are part of its time, as a profiler that files them under the triggering stack shows
them).  The workload also times every collection itself with a ``gc.callbacks``
hook (``report``: ``gc_callback_seconds``), which the harness compares with the GC
time stackshot reports (``gc_seconds`` in its run's stats).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from . import seconds_per_unit_each

NAME = "gc_heavy"
DESCRIPTION = "reference cycles built and dropped (many collections) alternating with arithmetic"
PARTS = ("gc_cycles_part", "gc_math_part")
SINGLE_THREAD = True
CHUNK_SECONDS = 0.02


class GcNode:
    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.children = [self, peer]


def gc_cycles_part(n: int) -> int:
    made = 0
    for _ in range(n):
        a = GcNode(None)
        b = GcNode(a)
        a.peer = b
        made += len(a.children)
    return made


def gc_math_part(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 7) % 13
    return s


def calibrate(seconds: float) -> dict:
    cycles, math = seconds_per_unit_each([gc_cycles_part, gc_math_part], 20_000)
    return {"cycles": round(CHUNK_SECONDS / cycles), "math": round(CHUNK_SECONDS / math),
            "reps": max(1, round(seconds / (2 * CHUNK_SECONDS)))}


def setup(params: dict) -> Any:
    return dict(params, gc_cpu=[0.0, 0], opened=[])


def run(state: Any) -> dict:
    clock = time.thread_time
    spent = {"gc_cycles_part": 0.0, "gc_math_part": 0.0}
    totals, opened = state["gc_cpu"], state["opened"]

    def timing(phase: str, info: dict) -> None:
        if phase == "start":
            opened.append(clock())
        elif opened:
            totals[0] += clock() - opened.pop()
            totals[1] += 1

    gc.callbacks.append(timing)
    try:
        for _ in range(state["reps"]):
            t0 = clock()
            gc_cycles_part(state["cycles"])
            t1 = clock()
            gc_math_part(state["math"])
            t2 = clock()
            spent["gc_cycles_part"] += t1 - t0
            spent["gc_math_part"] += t2 - t1
    finally:
        gc.callbacks.remove(timing)
    return spent


def report(state: Any) -> dict:
    """The collections' CPU time as the workload's own hook measured it."""
    return {"gc_callback_seconds": state["gc_cpu"][0], "gc_collections": state["gc_cpu"][1]}
