"""A thread's own CPU clock, named safely from another thread.

``time.pthread_getcpuclockid(ident)`` is undefined behaviour once the thread has
exited (its pthread handle may be reused or freed).  On Linux the CPU clock of a
thread can be named from its native id alone (``((~tid) << 3) | 6``, the kernel's
per-thread CPUCLOCK_SCHED clock), and the kernel answers ``EINVAL`` for a thread that
no longer exists: a thread that exits at the very moment it is sampled is seen as
gone, never read through a dangling handle.  The collector calls
``time.clock_gettime`` on the id itself, on its hot path; :func:`read_cpu` is for
everyone else.

A thread's clock failing never means by itself that the thread exited: after
``os.fork()`` CPython (3.10-3.13) leaves the forking thread's ``Thread.native_id`` at
its value in the parent, so the clock named from it is the parent's thread (``EINVAL``
in the child).  :func:`clock_for` names the clock again from what the running process
knows: the real native id of the calling thread, or the one recorded at the fork.
(Never ``pthread_getcpuclockid`` of a thread that has a native id: a thread whose
clock fails may be exiting, and reading its pthread handle then crashes.)
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional

from . import realthreads

if TYPE_CHECKING:
    from .tracking import Target

_clock_gettime = getattr(time, "clock_gettime", None)
_getcpuclockid = getattr(time, "pthread_getcpuclockid", None)
_LINUX = sys.platform.startswith("linux")
# Thread -> its real native id, for the thread that forked this process (the only
# thread a forked child has, and the only one whose native_id CPython leaves stale).
_native_after_fork: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def thread_clock_id(native_id: Optional[int], ident: Optional[int]) -> Optional[int]:
    """The clock id of a thread's CPU time, or ``None`` where none can be named.

    Off Linux, ``pthread_getcpuclockid`` is used, which is only safe while the thread
    runs: callers read it only for threads present in ``sys._current_frames()``.
    """
    if _clock_gettime is None:
        return None
    if _LINUX and native_id is not None:
        clock_id = ((~native_id) << 3) | 6
        try:
            _clock_gettime(clock_id)
        except OSError:
            return None  # already gone
        return clock_id
    return _pthread_clock(ident)


def _pthread_clock(ident: Optional[int]) -> Optional[int]:
    if _getcpuclockid is None or ident is None:
        return None
    try:
        clock_id = _getcpuclockid(ident)
        if _clock_gettime is not None:
            _clock_gettime(clock_id)
        return clock_id
    except (OSError, OverflowError):
        return None


def native_id_of(thread: Any) -> Optional[int]:
    """A ``threading.Thread``'s native id, right also in a forked child."""
    if thread is None:
        return None
    fixed = _native_after_fork.get(thread)
    return fixed if fixed is not None else getattr(thread, "native_id", None)


def native_id_of_ident(ident: int) -> Optional[int]:
    """The native id of the running thread ``ident`` that has no Thread object
    (started with ``_thread``), from the CPU clock id glibc names for it.  Only for
    a thread present in this tick's ``sys._current_frames()``, once per thread:
    ``pthread_getcpuclockid`` is undefined for one that has exited."""
    if not _LINUX or _getcpuclockid is None:
        return None
    try:
        return ~(_getcpuclockid(ident) >> 3)
    except (OSError, OverflowError):
        return None


def clock_for(target: "Target") -> Optional[int]:
    """The CPU clock of the OS thread ``target`` runs in, for a target present in
    this tick's ``sys._current_frames()``; ``None`` when none can be named."""
    ident = target.ident
    native_id = target.native_id
    if ident is not None and ident == realthreads.get_ident():
        native_id = realthreads.get_native_id()
    elif native_id is None and ident is not None:
        # a greenlet, or a thread without a Thread object: find its OS thread
        native_id = native_id_of(getattr(threading, "_active", {}).get(ident))
    return thread_clock_id(native_id, ident)


def remember_calling_thread() -> None:
    """Record the calling thread's real native id if its ``Thread.native_id`` is
    stale (a child forked before this module was imported: the fork hook below did
    not run, and the thread that forked is most likely the one starting a sampler)."""
    thread = getattr(threading, "_active", {}).get(realthreads.get_ident())
    if thread is not None and getattr(thread, "native_id", None) != realthreads.get_native_id():
        _remember_native_id_after_fork()


def _remember_native_id_after_fork() -> None:
    thread = getattr(threading, "_active", {}).get(realthreads.get_ident())
    if thread is not None:
        try:
            _native_after_fork[thread] = realthreads.get_native_id()
        except TypeError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_remember_native_id_after_fork)


def read_cpu(clock_id: Optional[int]) -> Optional[float]:
    """CPU seconds on ``clock_id``, or ``None`` when the thread is gone (or no clock)."""
    if clock_id is None or _clock_gettime is None:
        return None
    try:
        return _clock_gettime(clock_id)
    except OSError:
        return None
