"""A program that shares one core with two busy processes, profiled under ALL_THREADS.

Run as ``python one_core_workload.py SECONDS``: it pins itself (and so every thread
it starts, the sampler's among them) to one core, starts two busy processes pinned
to the same core, and repeats two parts, each timed with ``time.thread_time``: pure
Python (``py_part``) and ``hashlib`` over 64 KiB blocks (``hash_part``, which lets
the GIL go while it computes and takes it back after), a random amount of each
every time.  (With fixed amounts the loop had a fixed period, ~2 ms on 3.11 on one
machine, and the collector's 1 ms ticks and the scheduler's slices cut it at the
same points every time: the hash part was charged 65-90% of the CPU for 59%. 3.12,
whose loop has another period, was right there, and wrong too with its loop cut to
3.11's period.)  On one shared core the thread is never found on a core by the
collector (the collector has the core while it reads): every sample that finds it
preempted must be judged by the kernel's other answers.  Prints one JSON line:
each part's measured CPU and what the profile charged it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

BLOCKS = [os.urandom(1 << 16) for _ in range(8)]


def py_part(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 7) % 13
    return s


def hash_part(rounds: int) -> str:
    h = hashlib.sha256()
    for _ in range(rounds):
        for b in BLOCKS:
            h.update(b)
    return h.hexdigest()


def main(seconds: float) -> None:
    import sampler
    from analyzer import sample_weights
    from run_helpers import busy_processes_on

    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    busy = busy_processes_on(core, 2)
    try:
        measured = {"py_part": 0.0, "hash_part": 0.0}
        ctl = sampler.create_sampler(sampler.ALL_THREADS, 0.001, engine="native")
        draw = random.Random(1).randint
        while sum(measured.values()) < seconds:
            for fn, arg in ((py_part, draw(20_000, 60_000)), (hash_part, draw(4, 12))):
                t0 = time.thread_time()
                fn(arg)
                measured[fn.__name__] += time.thread_time() - t0
        ctl.stop()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    snaps = ctl.get_snapshots()
    charged = {"py_part": 0.0, "hash_part": 0.0}
    for sid, w in zip(snaps.sample_stack, sample_weights(snaps, "cpu", interval="end")):
        names = {snaps.frames[i].name for i in snaps.stack(sid)} if sid else set()
        for part in charged:
            if part in names:
                charged[part] += w
    print(json.dumps({"measured": measured, "charged": charged, "samples": len(snaps)}))


if __name__ == "__main__":
    main(float(sys.argv[1]))
