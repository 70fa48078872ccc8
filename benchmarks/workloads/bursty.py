"""Bursts of pure Python separated by sleeps: ~3 ms of work, then an 8 ms nap, repeated.

Nearly all of the thread's CPU goes to ``bst_crunch``; ``bst_nap`` only enters and
leaves ``time.sleep``.  A collector that must take the GIL gets it when the thread
goes to sleep, so its samples land in the nap, and a CPU-weighted profile then
charges the burst just before to the sleep (DESIGN.md, "Where samples land": 99%
sleep at 5 ms on the first landing).  The truth is each part's own CPU time
(``time.thread_time``) in runs without a profiler.
"""

from __future__ import annotations

import time
from typing import Any

from . import seconds_per_unit

NAME = "bursty"
DESCRIPTION = "~3 ms of pure Python (bst_crunch), then an 8 ms sleep (bst_nap), repeated"
PARTS = ("bst_crunch", "bst_nap")
SINGLE_THREAD = True
BURST_SECONDS = 0.003
NAP_SECONDS = 0.008


def bst_crunch(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 9) % 29
    return s


def bst_nap(seconds: float) -> None:
    time.sleep(seconds)


def calibrate(seconds: float) -> dict:
    unit = seconds_per_unit(bst_crunch, 100_000)
    # wall seconds per run: the naps are most of it
    return {"n": round(BURST_SECONDS / unit), "reps": max(1, round(seconds / (BURST_SECONDS + NAP_SECONDS)))}


def setup(params: dict) -> Any:
    return params


def bst_main(reps: int, n: int) -> dict:
    clock = time.thread_time
    spent = {"bst_crunch": 0.0, "bst_nap": 0.0}
    for _ in range(reps):
        t0 = clock()
        bst_crunch(n)
        t1 = clock()
        bst_nap(NAP_SECONDS)
        t2 = clock()
        spent["bst_crunch"] += t1 - t0
        spent["bst_nap"] += t2 - t1
    return spent


def run(state: Any) -> dict:
    return bst_main(state["reps"], state["n"])
