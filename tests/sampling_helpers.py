"""Small helpers shared by the sampler tests: real busy work and bounded waits."""

from __future__ import annotations

import threading
import time
from typing import Callable


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
