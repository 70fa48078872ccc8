"""A long GIL-holding C call inside Python code.

``gil_sort_part`` sorts a big list (one ``sorted`` call holds the GIL for tens of
milliseconds, several sampling intervals); ``gil_python_part`` is a pure-Python loop
of about the same length.  While the sort runs no other Python thread -- a sampler's
collector included -- can run, so the next sample is late and lands right after the
call.  How the analyzer spreads that long interval (``interval='midpoint'``, Racket's
rule, or ``'end'``) decides whether the sort's time is charged to the right function.
The truth is each part's measured time in runs without a profiler.
"""

from __future__ import annotations

import random
import time
from typing import Any

from . import seconds_per_unit

NAME = "gil_call"
DESCRIPTION = "~40 ms sorted() calls (GIL held) alternating with ~40 ms of Python"
PARTS = ("gil_python_part", "gil_sort_part")
SINGLE_THREAD = True
CALL_SECONDS = 0.04


def gil_python_part(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 11) % 19
    return s


def gil_sort_part(data: list) -> int:
    ordered = sorted(data)
    return len(ordered)


def _data(size: int) -> list:
    rng = random.Random(42)
    return [rng.random() for _ in range(size)]


def calibrate(seconds: float) -> dict:
    probe = _data(100_000)
    per_item = seconds_per_unit(lambda reps: [sorted(probe) for _ in range(reps)], 5) / len(probe)
    size = round(CALL_SECONDS / per_item)
    unit = seconds_per_unit(gil_python_part, 300_000)
    return {"size": size, "n": round(CALL_SECONDS / unit),
            "reps": max(1, round(seconds / (2 * CALL_SECONDS)))}


def setup(params: dict) -> Any:
    return dict(params, data=_data(params["size"]))


def gil_main(reps: int, n: int, data: list) -> dict:
    clock = time.perf_counter
    spent = {"gil_python_part": 0.0, "gil_sort_part": 0.0}
    for _ in range(reps):
        t0 = clock()
        gil_python_part(n)
        t1 = clock()
        gil_sort_part(data)
        t2 = clock()
        spent["gil_python_part"] += t1 - t0
        spent["gil_sort_part"] += t2 - t1
    return spent


def run(state: Any) -> dict:
    return gil_main(state["reps"], state["n"], state["data"])
