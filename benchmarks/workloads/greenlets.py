"""Three greenlets in one thread taking turns, with work in the ratio 1 : 2 : 3.

Each worker does a chunk of work, then switches back to the hub, which resumes the
next worker.  A profiler that follows calls and returns sees a switch as a call that
"returns" much later into another stack; a sampler just sees whichever greenlet is
running.  The truth is each worker's measured time between its switches, in runs
without a profiler.
"""

from __future__ import annotations

import time
from typing import Any

from . import seconds_per_unit

NAME = "greenlets"
DESCRIPTION = "3 greenlets (work 1:2:3) switching through a hub in one thread"
PARTS = ("gl_worker_1", "gl_worker_2", "gl_worker_3")
SINGLE_THREAD = True
WEIGHTS = (1, 2, 3)
CHUNK_SECONDS = 0.003  # the smallest worker's time between two switches


def gl_spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 13) % 23
    return s


def _worker(name: str, chunks: int, n: int, spent: dict) -> None:
    from greenlet import getcurrent

    hub = getcurrent().parent
    clock = time.perf_counter
    total = 0.0
    for _ in range(chunks):
        t0 = clock()
        gl_spin(n)
        total += clock() - t0
        hub.switch()
    spent[name] = total


def gl_worker_1(chunks: int, n: int, spent: dict) -> None:
    _worker("gl_worker_1", chunks, n, spent)


def gl_worker_2(chunks: int, n: int, spent: dict) -> None:
    _worker("gl_worker_2", chunks, n, spent)


def gl_worker_3(chunks: int, n: int, spent: dict) -> None:
    _worker("gl_worker_3", chunks, n, spent)


def calibrate(seconds: float) -> dict:
    unit = seconds_per_unit(gl_spin, 300_000)
    n = round(CHUNK_SECONDS / unit)
    per_round = CHUNK_SECONDS * sum(WEIGHTS)
    return {"chunks": max(1, round(seconds / per_round)), "units": [n * w for w in WEIGHTS]}


def setup(params: dict) -> Any:
    return params


def gl_hub(chunks: int, units: list) -> dict:
    from greenlet import greenlet

    spent: dict = {}
    workers = [greenlet(fn) for fn in (gl_worker_1, gl_worker_2, gl_worker_3)]
    for g, n in zip(workers, units):
        g.switch(chunks, n, spent)
    while any(not g.dead for g in workers):
        for g in workers:
            if not g.dead:
                g.switch()
    return spent


def run(state: Any) -> dict:
    return gl_hub(state["chunks"], state["units"])
