"""A thread's own CPU clock, named safely from another thread.

``time.pthread_getcpuclockid(ident)`` is undefined behaviour once the thread has
exited (its pthread handle may be reused or freed).  On Linux the CPU clock of a
thread can be named from its native id alone (``((~tid) << 3) | 6``, the kernel's
per-thread CPUCLOCK_SCHED clock), and the kernel answers ``EINVAL`` for a thread that
no longer exists: a thread that exits at the very moment it is sampled is seen as
gone, never read through a dangling handle.  The collector calls
``time.clock_gettime`` on the id itself, on its hot path; :func:`read_cpu` is for
everyone else.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

_clock_gettime = getattr(time, "clock_gettime", None)


def thread_clock_id(native_id: Optional[int], ident: Optional[int]) -> Optional[int]:
    """The clock id of a thread's CPU time, or ``None`` where none can be named.

    Off Linux, ``pthread_getcpuclockid`` is used, which is only safe while the thread
    runs: callers read it only for threads present in ``sys._current_frames()``.
    """
    if _clock_gettime is None:
        return None
    if sys.platform.startswith("linux") and native_id is not None:
        clock_id = ((~native_id) << 3) | 6
        try:
            _clock_gettime(clock_id)
        except OSError:
            return None  # already gone
        return clock_id
    getcpuclockid = getattr(time, "pthread_getcpuclockid", None)
    if getcpuclockid is not None and ident is not None:
        try:
            return getcpuclockid(ident)
        except OSError:
            return None
    return None


def read_cpu(clock_id: Optional[int]) -> Optional[float]:
    """CPU seconds on ``clock_id``, or ``None`` when the thread is gone (or no clock)."""
    if clock_id is None or _clock_gettime is None:
        return None
    try:
        return _clock_gettime(clock_id)
    except OSError:
        return None
