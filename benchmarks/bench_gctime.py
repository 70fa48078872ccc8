"""What timing garbage collections costs (issue 13): the ``gc.callbacks`` hook of
:mod:`sampler.gctime`, per collection.  Measured, never asserted.

    python benchmarks/bench_gctime.py [--depth N]

``--depth N`` measures from N frames deep: the hook walks the triggering stack to its
outermost frame (whose address says which greenlet ran), up to 256 frames (deeper, it keeps the innermost 128 and no address).

Collections of an empty young generation (``gc.collect(0)``) are timed with no hook,
with a do-nothing Python callback (what any ``gc.callbacks`` hook pays: the
interpreter builds the info dict and calls it twice), with stackshot's C hook
(``sampler._native.GCHook``, when built) and with its Python twin; the best of
several runs of each, interleaved, the events drained between runs as the engines
drain them.
"""

from __future__ import annotations

import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sampler.gctime import GCWatch, native_gc_hook  # noqa: E402

N = 5000


def _per_collection() -> float:
    t0 = time.perf_counter()
    for _ in range(N):
        gc.collect(0)
    return (time.perf_counter() - t0) / N


def _nothing(phase: str, info: dict) -> None:
    pass


def _at_depth(n: int, fn):
    """``fn()`` called ``n`` frames deep."""
    return fn() if n <= 1 else _at_depth(n - 1, fn)


def main() -> None:
    depth = int(sys.argv[sys.argv.index("--depth") + 1]) if "--depth" in sys.argv else 0
    sys.setrecursionlimit(max(sys.getrecursionlimit(), depth + 100))
    _at_depth(depth, _measure)


def _measure() -> None:
    watches = {"Python twin": GCWatch(time.perf_counter(), native=False)}
    if native_gc_hook():
        watches["C hook"] = GCWatch(time.perf_counter(), native=True)
    for watch in watches.values():
        watch.active = True
    best = {"none": float("inf"), "empty callback": float("inf")}
    best.update({name: float("inf") for name in watches})
    for _ in range(7):
        best["none"] = min(best["none"], _per_collection())
        gc.callbacks.append(_nothing)
        try:
            best["empty callback"] = min(best["empty callback"], _per_collection())
        finally:
            gc.callbacks.remove(_nothing)
        for name, watch in watches.items():
            watch.install()
            try:
                best[name] = min(best[name], _per_collection())
            finally:
                watch.remove()
                watch.take()
    added = {name: (t - best["none"]) * 1e6 for name, t in best.items() if name != "none"}
    depth = len(_stack())
    print(f"Python {sys.version.split()[0]}, {depth} frames deep: gc.collect(0) takes {best['none'] * 1e6:.2f} µs; added per "
          f"collection: " + ", ".join(f"{name} {us:.2f} µs" for name, us in added.items()))


def _stack() -> list:
    frame, out = sys._getframe(), []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


if __name__ == "__main__":
    main()
