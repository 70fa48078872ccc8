"""Busy threads beside sleeping and blocked ones.

The main thread and one worker compute (about 2 : 1); beside them one thread naps in
short ``time.sleep`` calls, one waits on an ``Event`` and one on a ``Lock`` for the
whole run.  On a CPU profile the sleepers should be (nearly) absent: the truth is
each thread's own CPU time (``time.thread_time``) in runs without a profiler, so
the few microseconds a napping thread spends waking up are counted too.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from . import seconds_per_unit

NAME = "sleepers"
DESCRIPTION = "2 busy threads (2:1) beside a napping, an Event-blocked and a Lock-blocked thread"
PARTS = ("slp_busy_main", "slp_busy_worker", "slp_napper", "slp_event_waiter", "slp_lock_waiter")
SINGLE_THREAD = False


def slp_spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 5) % 17
    return s


def slp_busy_main(n: int) -> int:
    return slp_spin(n)


def slp_busy_worker(n: int) -> int:
    return slp_spin(n)


def slp_napper(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.002)


def slp_event_waiter(release: threading.Event) -> None:
    release.wait()


def slp_lock_waiter(lock: threading.Lock) -> None:
    with lock:
        pass


def _timed(fn: Any, arg: Any, out: dict) -> None:
    t0 = time.thread_time()
    fn(arg)
    out[fn.__name__] = time.thread_time() - t0


def calibrate(seconds: float) -> dict:
    unit = seconds_per_unit(slp_spin, 300_000)
    return {"main_units": round(seconds * 2 / 3 / unit), "worker_units": round(seconds / 3 / unit)}


def setup(params: dict) -> Any:
    return params


def slp_main(main_units: int, worker_units: int) -> dict:
    out: dict = {}
    stop, release, lock = threading.Event(), threading.Event(), threading.Lock()
    lock.acquire()
    idle = [threading.Thread(target=_timed, args=(slp_napper, stop, out), name="napper"),
            threading.Thread(target=_timed, args=(slp_event_waiter, release, out), name="event"),
            threading.Thread(target=_timed, args=(slp_lock_waiter, lock, out), name="lock")]
    worker = threading.Thread(target=_timed, args=(slp_busy_worker, worker_units, out), name="worker")
    for t in idle + [worker]:
        t.start()
    _timed(slp_busy_main, main_units, out)
    worker.join()
    stop.set()
    release.set()
    lock.release()
    for t in idle:
        t.join()
    return out


def run(state: Any) -> dict:
    return slp_main(state["main_units"], state["worker_units"])
