"""The "function bias" test: a call-heavy part beside a loop-heavy part.

Profilers driven by call and return events pay (and may charge) a cost per call, so
they tend to inflate functions that make many small calls.  Here ``fb_call_heavy``
calls a tiny function in a loop and ``fb_loop_heavy`` does comparable arithmetic
inline.  Each part is calibrated *alone* in a fresh process, then sized so that the
call-heavy part takes about 25% of the time (the share the Scalene paper used);
the truth is what each part then measures in place, in runs without a profiler.
"""

from __future__ import annotations

import time
from typing import Any

from . import seconds_per_unit_each

NAME = "function_bias"
DESCRIPTION = "call-heavy (25%) beside loop-heavy (75%), calibrated alone first"
PARTS = ("fb_call_heavy", "fb_loop_heavy")
SINGLE_THREAD = True
CALL_SHARE = 0.25
CHUNK_SECONDS = 0.02  # one call-heavy + one loop-heavy stretch


def fb_tiny(i: int) -> int:
    return (i * 3) % 11


def fb_call_heavy(n: int) -> int:
    s = 0
    for i in range(n):
        s += fb_tiny(i)
    return s


def fb_loop_heavy(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 3) % 11
    return s


def calibrate(seconds: float) -> dict:
    call_unit, loop_unit = seconds_per_unit_each([fb_call_heavy, fb_loop_heavy], 200_000)
    n_call = round(CHUNK_SECONDS * CALL_SHARE / call_unit)
    n_loop = round(CHUNK_SECONDS * (1 - CALL_SHARE) / loop_unit)
    return {"chunks": max(1, round(seconds / CHUNK_SECONDS)), "n_call": n_call, "n_loop": n_loop,
            "calibrated_share": {"fb_call_heavy": n_call * call_unit / (n_call * call_unit + n_loop * loop_unit),
                                 "fb_loop_heavy": n_loop * loop_unit / (n_call * call_unit + n_loop * loop_unit)},
            "seconds_per_call_unit": call_unit, "seconds_per_loop_unit": loop_unit}


def setup(params: dict) -> Any:
    return params


def fb_main(chunks: int, n_call: int, n_loop: int) -> dict:
    clock = time.perf_counter
    spent = {"fb_call_heavy": 0.0, "fb_loop_heavy": 0.0}
    for _ in range(chunks):
        t0 = clock()
        fb_call_heavy(n_call)
        t1 = clock()
        fb_loop_heavy(n_loop)
        t2 = clock()
        spent["fb_call_heavy"] += t1 - t0
        spent["fb_loop_heavy"] += t2 - t1
    return spent


def run(state: Any) -> dict:
    return fb_main(state["chunks"], state["n_call"], state["n_loop"])
