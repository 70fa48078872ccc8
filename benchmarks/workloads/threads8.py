"""Eight busy threads with CPU shares 1 : 2 : ... : 8 by construction, and measured.

The issue-9 case of many busy threads: a collector that must take the GIL competes
with all of them for it (DESIGN.md: with N busy threads it wins about one hand-off in
N+1), so its achieved rate here, beside its rate on one busy thread (``deep``), shows
whether sampling keeps up.  The truth is each thread's own CPU time
(``time.thread_time``) in runs without a profiler.
"""

from __future__ import annotations

from typing import Any

from .threads import calibrate_units, run_busy_threads

NAME = "threads8"
DESCRIPTION = "8 busy threads with CPU shares 1:2:...:8, main thread joins"
PARTS = tuple(f"thr8_work_{i}" for i in range(1, 9))
SINGLE_THREAD = False
WEIGHTS = tuple(range(1, 9))


def thr8_spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 3) % 17
    return s


def thr8_work_1(n: int) -> int:
    return thr8_spin(n)


def thr8_work_2(n: int) -> int:
    return thr8_spin(n)


def thr8_work_3(n: int) -> int:
    return thr8_spin(n)


def thr8_work_4(n: int) -> int:
    return thr8_spin(n)


def thr8_work_5(n: int) -> int:
    return thr8_spin(n)


def thr8_work_6(n: int) -> int:
    return thr8_spin(n)


def thr8_work_7(n: int) -> int:
    return thr8_spin(n)


def thr8_work_8(n: int) -> int:
    return thr8_spin(n)


WORKERS = (thr8_work_1, thr8_work_2, thr8_work_3, thr8_work_4,
           thr8_work_5, thr8_work_6, thr8_work_7, thr8_work_8)


def calibrate(seconds: float) -> dict:
    return {"units": calibrate_units(thr8_spin, WEIGHTS, seconds)}


def setup(params: dict) -> Any:
    return params


def thr8_main(units: list) -> dict:
    return run_busy_threads(WORKERS, units)


def run(state: Any) -> dict:
    return thr8_main(state["units"])
