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
_program: list[float] = []  # the program's own interval, as last seen
_ours: list[float] = []  # every interval we have set (to tell ours from the program's)
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
    # Each step reads the state afresh and ends in a consistent state whatever ran in
    # between: the program's own interval is whatever is set that is not one of ours
    # (noted before we set it, never forgotten), so a handler that lowered or
    # restored the interval in the middle of this call cannot make us lose it.
    while True:
        seen = _generation[0]
        current = sys.getswitchinterval()
        ours = any(abs(current - v) <= 1e-6 for v in list(_ours))
        if not ours:
            _program[:] = [current]  # the program's own (set before us, or meanwhile)
        base = _program[0] if _program else current
        target = min((max(d / 2, _FLOOR) for d in list(_wanted.values())), default=base)
        if target < base:
            if target not in _ours:
                _ours.append(target)
                del _ours[:-16]  # a few distinct delays at most
            sys.setswitchinterval(target)
        elif ours:
            sys.setswitchinterval(base)
        if _generation[0] == seen:
            return


def forget_after_fork() -> None:
    """In a forked child no collector runs: give the child its interval back."""
    global _lock
    _lock = realthreads.allocate_rlock()
    _wanted.clear()
    _apply()
