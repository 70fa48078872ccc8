"""Clocks: a thread's own CPU time, read safely from another thread.

``time.pthread_getcpuclockid(ident)`` is undefined behaviour once the thread has
exited (its pthread handle may be reused or freed).  On Linux the CPU clock of a
thread can be named from its native id alone (``((~tid) << 3) | 6``, the kernel's
CPUCLOCK_SCHED per-thread clock), and the kernel answers ``EINVAL`` for a thread that
no longer exists, so a thread that exits at the very moment it is sampled is seen as
gone rather than crashing the collector.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

_clock_gettime = getattr(time, "clock_gettime", None)


def _linux_clock_id(native_id: int) -> int:
    return ((~native_id) << 3) | 6


def thread_cpu_reader(native_id: Optional[int], ident: Optional[int]) -> Callable[[], Optional[float]]:
    """A function returning the thread's CPU seconds, or ``None`` once it is gone.

    Falls back to wall-clock-free ``None`` where no per-thread clock can be named
    safely (then the analyzer can still weight samples by wall time).
    """
    if sys.platform.startswith("linux") and native_id is not None and _clock_gettime is not None:
        clock_id = _linux_clock_id(native_id)

        def read() -> Optional[float]:
            try:
                return _clock_gettime(clock_id)
            except OSError:
                return None

        try:
            read()
        except Exception:  # pragma: no cover - kernels without the encoding
            pass
        else:
            return read
    getcpuclockid = getattr(time, "pthread_getcpuclockid", None)
    if getcpuclockid is not None and ident is not None and _clock_gettime is not None:
        # Not Linux: only safe while the thread is alive, which the caller checks.
        try:
            clock_id = getcpuclockid(ident)
        except OSError:
            return lambda: None

        def read_posix() -> Optional[float]:
            try:
                return _clock_gettime(clock_id)
            except OSError:
                return None

        return read_posix
    return lambda: None


def process_cpu() -> float:
    """Process CPU seconds (user + system, all threads)."""
    return time.process_time()


def own_thread_cpu() -> float:
    """CPU seconds of the calling thread (the collector's own cost)."""
    return time.thread_time()
