"""The gap a sampler leaves in a busy thread beside a pool of idle ones.

A server keeps threads waiting for work (a thread pool, a connection pool's
keep-alive threads) beside the few that compute. ``gap_pool`` runs ``gap``'s leaf
loop in the main thread while ``IDLE`` threads wait on an event for the whole run:
a sampler that tracks every thread looks at each of them at every tick, and
whatever it does for a thread that has not run is paid for in the busy thread's
pauses (read as in ``gap``, against the paired no-profiler run). The loop alternates
two callers of the leaf, one running it twice as long as the other, with their CPU
times measured: the truth for attribution (py-spy is no reference here: stopping
33 threads 1000 times a second, it left so many pauses that reading them after the
run took up to 40% of its samples).
"""

from __future__ import annotations

import threading
import time
from array import array
from typing import Any

from . import gap
from .gap import THRESHOLD_NS, gap_leaf

NAME = "gap_pool"
DESCRIPTION = (f"gap's leaf loop (callers 1:2) beside 32 idle threads waiting on an event; "
               f"pauses > {THRESHOLD_NS // 1000} µs")
PARTS = ("gp_short", "gp_long")
SINGLE_THREAD = False
IDLE = 32


def calibrate(seconds: float) -> dict:
    return gap.calibrate(seconds)


def setup(params: dict) -> Any:
    release = threading.Event()
    pool = [threading.Thread(target=release.wait, name=f"pool_{i}", daemon=True) for i in range(IDLE)]
    for t in pool:
        t.start()
    return dict(params, gaps=array("q"), release=release, pool=pool)


def gp_short(chunk: int, gaps: array) -> None:
    gap_leaf(chunk, gaps)


def gp_long(chunk: int, gaps: array) -> None:
    gap_leaf(chunk, gaps)
    gap_leaf(chunk, gaps)


def pool_main(chunks: int, chunk: int, gaps: array) -> dict:
    clock = time.thread_time
    short = long_ = 0.0
    for _ in range(max(1, chunks // 3)):
        t0 = clock()
        gp_short(chunk, gaps)
        t1 = clock()
        gp_long(chunk, gaps)
        long_ += clock() - t1
        short += t1 - t0
    return {"gp_short": short, "gp_long": long_}


def run(state: Any) -> dict:
    parts = pool_main(state["chunks"], state["chunk"], state["gaps"])
    # (the pool goes with the run, a millisecond or two: left to report(), py-spy,
    # still sampling, gave 5% of its samples to the pauses being read there)
    state["release"].set()
    for t in state["pool"]:
        t.join()
    return parts


def report(state: Any) -> dict:
    """The loop's pauses (as ``gap``)."""
    return gap.report(state)
