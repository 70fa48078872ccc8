"""A main greenlet that naps between the turns of two worker greenlets (work 1 : 2).

Each round the main greenlet switches to each worker in turn (each computes a chunk
and switches back), then sleeps 2 ms: a scheduler that waits for its next timer.
A sampler's ticks mostly find the main greenlet asleep, with CPU used since the
last tick that went into the workers, not into the line of the sleep (the native
engine once filed it there: the sleep's line had 73-83% of the thread's CPU). The
truth is each part's CPU time (``time.thread_time``) in runs without a profiler:
each worker's turns, and the main greenlet's own (the thread's CPU less the
workers'), a few percent. A worker's turn runs from its first line after the
switch to it until the main greenlet runs again: its ``main.switch()`` is its own,
as a profiler charges it (timed to the chunk alone, the workers' truth left out
some 10 us a turn, switching out and back in after a nap, and gn_main came out
2-3 points short).
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
        spent["switched out at"] = clock()
        spent[name] += spent["switched out at"] - t0
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

    clock = time.thread_time
    spent = {"gn_light": 0.0, "gn_heavy": 0.0, "switched out at": 0.0}
    workers = [(greenlet(gn_light), "gn_light"), (greenlet(gn_heavy), "gn_heavy")]
    t0 = clock()
    for (g, name), n in zip(workers, units):
        g.switch(n, spent)  # (the first turn starts it)
        spent[name] += clock() - spent["switched out at"]
    for _ in range(rounds - 1):
        time.sleep(NAP_SECONDS)
        for g, name in workers:
            g.switch()
            spent[name] += clock() - spent["switched out at"]
    time.sleep(NAP_SECONDS)
    total = clock() - t0
    for g, _ in workers:
        g.throw(greenlet.GreenletExit)  # (ended here, in this thread, not by a collection)
    del spent["switched out at"]
    spent["gn_main"] = max(0.0, total - spent["gn_light"] - spent["gn_heavy"])
    return spent


def run(state: Any) -> dict:
    return gn_main(state["rounds"], state["units"])
