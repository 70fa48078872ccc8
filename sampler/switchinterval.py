"""Sharing ``sys.setswitchinterval`` between samplers.

The collector needs the GIL to take a snapshot, and a CPU-bound thread only drops
it every switch interval (5 ms by default): asked for 1000 Hz, a naive sampler got
about 300 Hz here.  While some sampler runs with a delay below the interval, the
interval is lowered to half the smallest delay; when the last one pauses or stops,
the interval the program had is put back -- unless the program set one of its own
meanwhile: its ``sys.setswitchinterval`` call wins and is never overwritten.

:func:`want` and :func:`release` are called from controller messages, which may run
in a signal handler that interrupted one of them on the same thread.  The lock is
reentrant (so that handler does not deadlock), and :func:`_apply` computes the
interval from the claims as they are when it ends: a call that ran in between bumps
the generation, and the interrupted one computes again.
"""

from __future__ import annotations

import sys

from . import realthreads

_lock = realthreads.allocate_rlock()
_wanted: dict[int, float] = {}
_saved: list[float] = []  # the program's own interval while we hold it lowered
_ours: list[float] = []  # every interval we set while we hold it lowered
_generation = [0]
_FLOOR = 0.0001  # below this the interpreter spends its time switching


def want(owner: int, delay: float) -> None:
    """``owner`` samples every ``delay`` seconds from now on."""
    with _lock:
        _wanted[owner] = delay
        _generation[0] += 1
        _apply()


def release(owner: int) -> None:
    """``owner`` no longer needs a lowered interval (paused or stopped)."""
    with _lock:
        if owner in _wanted:
            _wanted.pop(owner, None)
            _generation[0] += 1
        _apply()


def _apply() -> None:
    # Ordering keeps _saved truthful at every instruction: the program's interval is
    # saved before the interval is lowered, and forgotten after it is put back; the
    # interval we set is noted before we set it.
    while True:
        seen = _generation[0]
        current = sys.getswitchinterval()
        if _saved and _ours and all(abs(current - v) > 1e-6 for v in list(_ours)):
            # none of ours (a handler may have interrupted us between noting a value
            # and setting it, so any value we noted counts as ours): the program set
            # its own, and that is its interval now
            _saved[0] = current
        saved = _saved[:1]
        base = saved[0] if saved else current
        target = min((max(d / 2, _FLOOR) for d in list(_wanted.values())), default=base)
        if target < base:
            if not _saved:
                _saved.append(base)
            if target not in _ours:
                _ours.append(target)
                del _ours[:-16]  # a few distinct delays at most; keep it bounded
            sys.setswitchinterval(target)
        elif saved:
            sys.setswitchinterval(saved[0])
            _saved.clear()
            _ours.clear()
        if _generation[0] == seen:
            return


def forget_after_fork() -> None:
    """In a forked child no collector runs: give the child its interval back."""
    global _lock
    _lock = realthreads.allocate_rlock()
    _wanted.clear()
    _apply()
