"""Three busy threads whose CPU shares are 1 : 2 : 3 by construction, and measured.

Each worker spins through its own amount of pure-Python work; the main thread only
waits for them.  Because of the GIL they take turns, so a profiler has to tell the
threads apart and weigh each by the CPU it really got.  The truth is each thread's
own CPU time (``time.thread_time``) in runs without a profiler.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from . import seconds_per_unit

NAME = "threads"
DESCRIPTION = "3 busy threads with CPU shares 1:2:3, main thread joins"
PARTS = ("thr_work_1", "thr_work_2", "thr_work_3")
SINGLE_THREAD = False
WEIGHTS = (1, 2, 3)


def thr_spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 7) % 13
    return s


def _timed(fn: Any, n: int, name: str, out: dict) -> None:
    t0 = time.thread_time()
    fn(n)
    out[name] = time.thread_time() - t0


def thr_work_1(n: int) -> int:
    return thr_spin(n)


def thr_work_2(n: int) -> int:
    return thr_spin(n)


def thr_work_3(n: int) -> int:
    return thr_spin(n)


def calibrate(seconds: float) -> dict:
    unit = seconds_per_unit(thr_spin, 300_000)
    base = seconds / sum(WEIGHTS) / unit
    return {"units": [round(base * w) for w in WEIGHTS]}


def setup(params: dict) -> Any:
    return params


def thr_main(units: list) -> dict:
    out: dict = {}
    workers = [threading.Thread(target=_timed, args=(fn, n, fn.__name__, out), name=fn.__name__)
               for fn, n in zip((thr_work_1, thr_work_2, thr_work_3), units)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out


def run(state: Any) -> dict:
    return thr_main(state["units"])
