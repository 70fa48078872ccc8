"""A main greenlet that naps between the turns of two worker greenlets (work 1 : 2).

Each round the main greenlet switches to each worker in turn (each computes a chunk
and switches back), then sleeps 2 ms: a scheduler that waits for its next timer.
A sampler's ticks mostly find the main greenlet asleep, with CPU used since the
last tick that went into the workers, not into the line of the sleep (the native
engine once filed it there: the sleep's line had 73-83% of the thread's CPU). The
truth is each part's CPU time (``time.thread_time``) in runs without a profiler:
each worker's chunks, and the main greenlet's own (the thread's CPU less the
workers'), a few percent.
"""

from __future__ import annotations

import time
from typing import Any

from . import seconds_per_unit

NAME = "greenlet_naps"
DESCRIPTION = "a main greenlet napping 2 ms between turns of 2 worker greenlets (work 1:2)"
PARTS = ("gn_main", "gn_light", "gn_heavy")
SINGLE_THREAD = True
CHUNK_SECONDS = 0.0003  # the light worker's time per turn (the heavy one's twice that)
NAP_SECONDS = 0.002


def gn_spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 7) % 19
    return s


def _worker(name: str, n: int, spent: dict) -> None:
    from greenlet import getcurrent

    main = getcurrent().parent
    clock = time.thread_time
    while True:
        t0 = clock()
        gn_spin(n)
        spent[name] += clock() - t0
        main.switch()


def gn_light(n: int, spent: dict) -> None:
    _worker("gn_light", n, spent)


def gn_heavy(n: int, spent: dict) -> None:
    _worker("gn_heavy", n, spent)


def calibrate(seconds: float) -> dict:
    unit = seconds_per_unit(gn_spin, 300_000)
    n = round(CHUNK_SECONDS / unit)
    per_round = 3 * CHUNK_SECONDS + NAP_SECONDS
    return {"rounds": max(1, round(seconds / per_round)), "units": [n, 2 * n]}


def setup(params: dict) -> Any:
    return params


def gn_main(rounds: int, units: list) -> dict:
    from greenlet import greenlet

    spent = {"gn_light": 0.0, "gn_heavy": 0.0}
    workers = [greenlet(gn_light), greenlet(gn_heavy)]
    t0 = time.thread_time()
    for g, n in zip(workers, units):
        g.switch(n, spent)  # (the first turn starts it)
    for _ in range(rounds - 1):
        time.sleep(NAP_SECONDS)
        for g in workers:
            g.switch()
    time.sleep(NAP_SECONDS)
    total = time.thread_time() - t0
    for g in workers:
        g.throw(greenlet.GreenletExit)  # (ended here, in this thread, not by a collection)
    spent["gn_main"] = max(0.0, total - spent["gn_light"] - spent["gn_heavy"])
    return spent


def run(state: Any) -> dict:
    return gn_main(state["rounds"], state["units"])
