"""Sharing ``sys.setswitchinterval`` between samplers.

The collector needs the GIL to take a snapshot, and a CPU-bound thread only drops
it every switch interval (5 ms by default): asked for 1000 Hz, a naive sampler got
about 300 Hz here.  While some sampler runs with a delay below the interval, the
interval is lowered to half the smallest delay; when the last one pauses or stops,
the interval the program had is put back -- unless the program set one of its own
meanwhile: its ``sys.setswitchinterval`` call wins and is never overwritten.
"""

from __future__ import annotations

import sys

from . import realthreads

_lock = realthreads.allocate_lock()
_wanted: dict[int, float] = {}
_saved: list[float] = []  # the program's own interval while we hold it lowered
_ours: list[float] = []  # the interval we set (as read back), while we hold it lowered
_FLOOR = 0.0001  # below this the interpreter spends its time switching


def want(owner: int, delay: float) -> None:
    """``owner`` samples every ``delay`` seconds from now on."""
    with _lock:
        _wanted[owner] = delay
        _apply()


def release(owner: int) -> None:
    """``owner`` no longer needs a lowered interval (paused or stopped)."""
    with _lock:
        _wanted.pop(owner, None)
        _apply()


def _apply() -> None:
    current = sys.getswitchinterval()
    if _saved and current != _ours[0]:  # the program set its own: that is its interval now
        _saved[0] = current
    base = _saved[0] if _saved else current
    target = min((max(d / 2, _FLOOR) for d in _wanted.values()), default=base)
    if target < base:
        if not _saved:
            _saved.append(base)
            _ours.append(0.0)
        sys.setswitchinterval(target)
        _ours[0] = sys.getswitchinterval()  # read back: the interpreter rounds it
    elif _saved:
        _ours.clear()
        sys.setswitchinterval(_saved.pop())


def forget_after_fork() -> None:
    """In a forked child no collector runs: give the child its interval back."""
    global _lock
    _lock = realthreads.allocate_lock()
    _wanted.clear()
    _apply()
