"""What timing garbage collections costs (issue 13): the ``gc.callbacks`` hook of
:mod:`sampler.gctime`, per collection.  Measured, never asserted.

    python benchmarks/bench_gctime.py

Collections of an empty young generation (``gc.collect(0)``) are timed with no hook,
with a do-nothing callback (what any ``gc.callbacks`` hook pays: the interpreter
builds the info dict and calls it twice) and with stackshot's hook; the best of
several runs of each, interleaved, the events drained between runs as the engines
drain them.
"""

from __future__ import annotations

import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sampler.gctime import GCWatch  # noqa: E402

N = 5000


def _per_collection() -> float:
    t0 = time.perf_counter()
    for _ in range(N):
        gc.collect(0)
    return (time.perf_counter() - t0) / N


def _nothing(phase: str, info: dict) -> None:
    pass


def main() -> None:
    watch = GCWatch(time.perf_counter())
    watch.active = True
    best = {"none": float("inf"), "empty callback": float("inf"), "stackshot": float("inf")}
    for _ in range(7):
        best["none"] = min(best["none"], _per_collection())
        gc.callbacks.append(_nothing)
        try:
            best["empty callback"] = min(best["empty callback"], _per_collection())
        finally:
            gc.callbacks.remove(_nothing)
        watch.install()
        try:
            best["stackshot"] = min(best["stackshot"], _per_collection())
        finally:
            watch.remove()
            watch.take()
    print(f"Python {sys.version.split()[0]}: gc.collect(0) takes {best['none'] * 1e6:.2f} µs; "
          f"an empty callback adds {(best['empty callback'] - best['none']) * 1e6:.2f} µs, "
          f"stackshot's hook {(best['stackshot'] - best['none']) * 1e6:.2f} µs per collection")


if __name__ == "__main__":
    main()
