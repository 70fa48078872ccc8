"""Small helpers shared by the sampler tests: real busy work and bounded waits."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, NoReturn

import pytest


def native_missing(what: str) -> NoReturn:
    """End the calling test because ``what`` (a part of ``sampler._native``) is not
    built: a skip, or a failure where ``STACKSHOT_REQUIRE_NATIVE=1`` (CI) wants it."""
    if os.environ.get("STACKSHOT_REQUIRE_NATIVE") == "1":
        pytest.fail(f"{what} is not built (sampler._native) -- required when STACKSHOT_REQUIRE_NATIVE=1",
                    pytrace=False)
    pytest.skip(f"{what} is not built here")


def spin(seconds: float) -> int:
    """Burn CPU in Python for ``seconds`` of wall time (a real, sampleable stack)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(range(50))
    return n


def spin_until_sampled(ctl, samples: int = 5, timeout: float = 20.0) -> None:
    """Burn CPU in Python until ``ctl`` holds ``samples`` samples: as long as the
    machine needs to let the collector run (never a fixed time a loaded machine may
    not honour), and never longer than ``timeout``."""
    end = time.perf_counter() + timeout
    while len(ctl.get_snapshots()) < samples:
        assert time.perf_counter() < end, f"fewer than {samples} samples after {timeout} s"
        spin(0.005)



def spin_sampled(seconds: float, samples: int = 3, timeout: float = 30.0) -> int:
    """Burn ``seconds`` of CPU, then on until every running, unpaused sampler of
    this process took ``samples`` more samples: for code that a front end profiles (where
    the test holds no controller) and whose profile the test reads.  On a loaded
    machine the whole process can go unscheduled for longer than a fixed spin (seen in
    CI: one tick in 50 ms of the thread's CPU), so no fixed amount of work promises a
    sample.

    The polling runs in the profiled thread, so it must not run the sampler's own
    Python code (a sample landing in ``get_snapshots`` would put the profiler's frames
    into the profile under test): it reads counters only (:func:`_samples_taken`)."""
    from sampler.controller import _live

    def running() -> list:
        return [s for s in list(_live) if not s._collector.stopped and not s._collector._pauses]

    from run_helpers import spin as spin_cpu

    before = {s: _samples_taken(s) for s in running()}
    n = spin_cpu(seconds)
    end = time.perf_counter() + timeout
    while any(_samples_taken(s) < before.get(s, 0) + samples for s in running()):
        assert time.perf_counter() < end, f"fewer than {samples} samples after {timeout} s"
        n += spin(0.005)
    return n


def _samples_taken(s) -> int:
    """How many samples the sampler ``s`` has taken, read without calling any Python
    function of the sampler: the native engine's C counter, or the length of the
    Python engine's sample array."""
    engine = getattr(s._collector, "_engine", None)
    if engine is not None:
        return engine.stats()["samples"]
    return len(s._recorder.sample_stack)


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``predicate``; fail the test (never hang) after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def function_names(snapshots, sample_index: int) -> list[str]:
    """Names of the frames of one sample, innermost first."""
    return [f.name for f in snapshots.stack_frames(snapshots.sample_stack[sample_index])]


def names_seen(snapshots) -> set[str]:
    seen: set[str] = set()
    for sid in set(snapshots.sample_stack):
        seen.update(f.name for f in snapshots.stack_frames(sid))
    return seen


class Worker:
    """A thread running ``fn`` in a loop until stopped, so tests control its life."""

    def __init__(self, fn: Callable[[], object], name: str = "worker") -> None:
        self.stop_flag = threading.Event()
        self.fn = fn
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            self.fn()

    def __enter__(self) -> "Worker":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        self.thread.join(20)


def switch_error_margin(cpu_deltas, boundaries: int, sds: float = 4.0) -> float:
    """A bound (``sds`` standard deviations) on the CPU seconds misattributed at
    ``boundaries`` switches from one part of a program to another, for samples whose
    CPU intervals (seconds, samples with a stack only) are ``cpu_deltas``.

    Under the 'end' rule only an interval that straddles a switch can be charged to
    the wrong part, by a share of it uniform over [0, d], and a switch falls into an
    interval with a chance proportional to its length: the error per switch has a
    variance of E[d^3] / (3 E[d]).  Sums over switches with errors of both signs (a
    part gains at its start what it loses at its end): sd = sqrt(n) times that.  On a
    loaded machine the collector runs late and intervals grow: the margin grows with
    them, so a test that runs until the margin is small enough never fails by luck.
    """
    deltas = [d for d in cpu_deltas if d > 0]
    if not deltas:
        return float("inf")
    per_switch = sum(d ** 3 for d in deltas) / (3 * sum(deltas))
    return sds * (boundaries * per_switch) ** 0.5
