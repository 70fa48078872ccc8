"""What instrumented stacks cost (issue 13): use_errortrace against cProfile and
pyinstrument on the same work.  Measured, never asserted: run it and read the numbers.

    python benchmarks/bench_errortrace.py [--rounds N] [--json FILE]

Workloads: ``calls`` (call-heavy: small Python functions and builtins called in a
loop) and ``nbody`` (pyperformance's n-body shape: arithmetic in loops, few calls).
Each configuration runs the same work in alternating rounds (baseline, then every
profiler, the order rotated each round), and its cost is the median over rounds of
its CPU time over the round's baseline CPU time; the baseline-to-baseline spread of
the rounds is printed beside it (DESIGN.md, "Measuring what a sample costs").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sampler  # noqa: E402
from benchmarks.workloads import nbody  # noqa: E402


def _leaf(x: int) -> int:
    return x * 2 + 1


class _Point:
    def __init__(self, x: int) -> None:
        self.x = x

    def norm(self) -> int:
        return abs(self.x)


def calls(n: int) -> int:
    """Call-heavy: per iteration three Python calls and two builtins."""
    total = 0
    for i in range(n):
        total += _leaf(i) + _Point(i).norm() + len((i,)) + min(i, 3)
    return total


def _nbody_work() -> Callable[[], Any]:
    params = nbody.calibrate(0.5)
    state = nbody.setup(params)
    return lambda: nbody.run(state)


def _stackshot(mode: Any) -> Callable[[], Any]:
    def start() -> Any:
        return sampler.create_sampler(threading.current_thread(), 0.001, use_errortrace=mode)

    return start


def _cprofile() -> Any:
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def _pyinstrument() -> Any:
    try:
        import pyinstrument
    except ImportError:
        return None
    prof = pyinstrument.Profiler(interval=0.001)
    prof.start()
    return prof


CONFIGS: dict[str, Callable[[], Any]] = {
    "stackshot": _stackshot(False),
    "stackshot errortrace='python'": _stackshot("python"),
    "stackshot errortrace=True": _stackshot(True),
    "cProfile": _cprofile,
    "pyinstrument 1ms": _pyinstrument,
}


def _stop(handle: Any) -> None:
    if handle is None:
        return
    for name in ("stop", "disable"):
        method = getattr(handle, name, None)
        if method is not None:
            method()
            return


MECHANISMS: dict[str, str] = {}  # config -> what kept its instrumented stacks


def _mechanism(handle: Any) -> str | None:
    """What keeps a sampler's shadow stacks: the eval-frame hook, sys.monitoring or a
    profile function (None: not an instrumented sampler)."""
    shadow = getattr(handle, "_shadow", None)
    if shadow is None:
        return None
    if getattr(shadow, "hooked", False):
        return "eval-frame hook"
    return "sys.monitoring" if sys.version_info >= (3, 12) else "profile function"


def _timed(work: Callable[[], Any], config: str | None) -> float | None:
    handle = CONFIGS[config]() if config else None
    if config and handle is None:
        return None
    mechanism = _mechanism(handle)
    if mechanism:
        MECHANISMS[config] = mechanism  # type: ignore[index]
    t0 = time.process_time()
    try:
        work()
    finally:
        spent = time.process_time() - t0
        _stop(handle)
    return spent


def measure(rounds: int) -> dict:
    n = 500_000
    works = {"calls": lambda: calls(n), "nbody": _nbody_work()}
    out: dict = {"python": sys.version.split()[0], "engine": sampler.engines.choose(None), "workloads": {}}
    names = list(CONFIGS)
    for wname, work in works.items():
        work()  # warm up
        ratios: dict[str, list] = {c: [] for c in names}
        baselines = []
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            base = _timed(work, None)
            baselines.append(base)
            for c in order:
                spent = _timed(work, c)
                if spent is not None and base:
                    ratios[c].append(spent / base)
        spread = (max(baselines) - min(baselines)) / statistics.median(baselines)
        out["workloads"][wname] = {
            "baseline_seconds": statistics.median(baselines), "baseline_spread": spread,
            "ratios": {c: statistics.median(v) if v else None for c, v in ratios.items()},
        }
    out["mechanisms"] = dict(MECHANISMS)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    result = measure(args.rounds)
    print(f"Python {result['python']}, engine {result['engine']} (CPU time over the baseline's, median of "
          f"{args.rounds} rounds)")
    for wname, w in result["workloads"].items():
        print(f"  {wname}: baseline {w['baseline_seconds']:.3f} s, baseline spread {w['baseline_spread']:.1%}")
        cprofile = w["ratios"].get("cProfile")
        for c, ratio in w["ratios"].items():
            if ratio is None:
                print(f"    {c:32} not installed")
                continue
            versus = f"   {ratio / cprofile:.2f} of cProfile's" if cprofile and c != "cProfile" else ""
            how = f"   ({result['mechanisms'][c]})" if c in result["mechanisms"] else ""
            print(f"    {c:32} {ratio:.2f}x{versus}{how}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
