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


def _timed(fn: Any, n: int, args: tuple, out: dict, lock: threading.Lock, start: threading.Event) -> None:
    start.wait()
    t0 = time.thread_time()
    fn(n, *args)
    used = time.thread_time() - t0
    with lock:  # (a worker may run in several threads: their times add up)
        out[fn.__name__] = out.get(fn.__name__, 0.0) + used


def calibrate_units(spin: Any, weights: tuple, seconds: float) -> list:
    """Units of ``spin`` per thread, in the ratio ``weights``, about ``seconds`` of CPU in all."""
    unit = seconds_per_unit(spin, 300_000)
    base = seconds / sum(weights) / unit
    return [round(base * w) for w in weights]


def run_busy_threads(workers: tuple, units: list, *args: Any) -> dict:
    """Each worker in its own thread on its units (then ``args``), all released at once;
    their CPU times, by worker (summed over the threads of a worker that runs in more
    than one)."""
    out: dict = {}
    lock = threading.Lock()
    start = threading.Event()
    threads = [threading.Thread(target=_timed, args=(fn, n, args, out, lock, start), name=fn.__name__)
               for fn, n in zip(workers, units)]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join()
    return out


def thr_work_1(n: int) -> int:
    return thr_spin(n)


def thr_work_2(n: int) -> int:
    return thr_spin(n)


def thr_work_3(n: int) -> int:
    return thr_spin(n)


def calibrate(seconds: float) -> dict:
    return {"units": calibrate_units(thr_spin, WEIGHTS, seconds)}


def setup(params: dict) -> Any:
    return params


def thr_main(units: list) -> dict:
    return run_busy_threads((thr_work_1, thr_work_2, thr_work_3), units)


def run(state: Any) -> dict:
    return thr_main(state["units"])
