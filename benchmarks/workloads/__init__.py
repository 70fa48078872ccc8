"""The benchmark workloads: programs whose profile we can judge.

Each module is one workload and offers the same small interface, used by
:mod:`benchmarks.child` in a fresh interpreter:

``NAME``, ``DESCRIPTION``
    how the tables name and explain it.
``PARTS``
    the functions whose share of the time is known because the workload *measures*
    it (with ``perf_counter`` or ``thread_time`` around each part, in runs without a
    profiler), or ``()`` when no truth is known and the workload is judged against
    py-spy at 1000 Hz instead.  A part's share is the inclusive time of that function
    over the sum of the parts' inclusive times.
``SINGLE_THREAD``
    whether every sample falls in one thread (then a sampler's rate can be read off
    its sample count).
``calibrate(seconds) -> params``
    run pieces of the work without a profiler and size it so one run lasts about
    ``seconds``; the same params are then used for every profiler, so all of them
    do exactly the same work.
``setup(params) -> state`` (untimed) and ``run(state) -> {part: seconds}`` (timed).
``report(state) -> dict`` (optional, untimed)
    figures the workload measured about itself during the run (``gap``: the pauses
    its loop saw, as in ``gap_pool``; ``gap_threads``: the time no thread made
    progress), kept as the run's ``workload_stats``.

Function names carry a per-workload prefix so that a bare function name identifies
one function across every profiler's output format.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any, Callable

WORKLOADS = ("deep", "function_bias", "threads", "sleepers", "gil_call", "greenlets",
             "bursty", "handoff", "io_mix", "gevent_server", "gevent_chatty", "threads8", "spectral_norm", "nbody", "gap",
             "gap_threads", "gap_pool", "gc_heavy", "greenlet_naps")
DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def load(name: str) -> Any:
    """The workload module called ``name`` (a :data:`WORKLOADS` entry)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return importlib.import_module(f"{__name__}.{name}")


def is_workload_file(filename: str | None) -> bool:
    """Whether a profiler's file name points into this directory.

    Profilers spell paths differently (absolute, relative, shortened), so the
    check accepts any path whose last two components are ``workloads/<module>.py``
    of one of our modules.
    """
    if not filename:
        return False
    head, base = os.path.split(filename)
    return os.path.basename(head) == "workloads" and base[:-3] in WORKLOADS and base.endswith(".py")


def seconds_per_unit(fn: Callable[[int], Any], units: int, repeat: int = 7) -> float:
    """Seconds one unit of ``fn`` takes: the fastest of ``repeat`` timed calls.

    The machine is shared, and other processes only ever *add* time to a call, so the
    fastest call is the least disturbed estimate; a calibration every later run
    inherits should not carry one preempted call.
    """
    return seconds_per_unit_each([fn], units, repeat)[0]


def seconds_per_unit_each(fns: list, units: int, repeat: int = 7) -> list[float]:
    """:func:`seconds_per_unit` of several functions, their calls interleaved.

    Interleaving exposes them all to the same moments of the machine, so the
    *ratio* between them (what a calibrated split depends on) is not skewed by a
    burst of load that hit only one of them.
    """
    for fn in fns:
        fn(max(1, units // 10))  # warm caches and the specialising interpreter
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn(units)
            best[i] = min(best[i], time.perf_counter() - t0)
    return [b / units for b in best]
