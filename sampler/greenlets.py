"""Which greenlet each OS thread is running: a ``greenlet.settrace`` hook per thread.

A sample of a thread shows the stack of the greenlet running in it, but not which
greenlet that is.  The hook is told of every switch in its thread (greenlet calls it
in the target's context, once the switch is made) and keeps the running greenlet's
:class:`GreenletRecord`: a small id stable for the life of the process, a name
(gevent's ``Greenlet`` name and the function it runs, else that function), and its
parent's id (gevent's ``spawning_greenlet``, else ``greenlet.parent``).

The Python engine reads :func:`running_in` of the sampled thread when it records a
sample (it holds the GIL, so the two agree).  The native engine reads stacks without
the GIL and files them later: it names the greenlet by the address of the stack's
outermost frame, fixed for a greenlet's life, which the hook learns once per greenlet
(:func:`at_base`).

The hook is installed in the thread that creates a sampler tracking threads (greenlet
hooks are per thread), chained with the trace function already there, and removed
when the last sampler using it stops, if it is still the thread's trace function and
the stop is made in that thread; otherwise it stays, inert, passing events on.
Overhead: a C call per switch where the extension is built (:class:`NativeSwitchHook`,
whose every uncommon case is :class:`SwitchHook`'s Python, and which knows the
thread's CPU clock without a system call between reschedulings:
``sampler/_native/switchclock.h``), a Python call in the Python twin, where the CPU
clock read at each switch is most of it (see ``scribblings/greenlets.md``).
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import sys
import weakref
from bisect import bisect_right
from collections import deque
from time import perf_counter_ns, thread_time_ns
from types import CodeType, FrameType
from typing import Any, Callable, Optional

from . import realthreads

try:
    import greenlet as _greenlet
except ImportError:  # pragma: no cover - greenlet is a dependency
    _greenlet = None  # type: ignore[assignment]

try:
    from ._native import frame_address as _frame_address
    from ._native import note_switching as _note_switching
    from ._native import SwitchHook as _NativeSwitchHook
    from ._native import draw_turns as _native_draw_turns
    from ._native import log_turns as _native_log_turns
    from ._native import turn_length as _native_turn_length
    from ._native import draw_place as _native_draw_place
except ImportError:  # the native engine is not built: no addresses needed
    _frame_address = None
    _note_switching = None
    _NativeSwitchHook = None
    _native_draw_turns = _native_log_turns = _native_turn_length = _native_draw_place = None

_ids = itertools.count(1)
# id(greenlet) -> its record (a dead greenlet's until pruned: see _prune)
_records: dict[int, "GreenletRecord"] = {}
# address of a greenlet's outermost frame -> its record (native engine; a dead
# greenlet's until pruned or looked up)
_by_base: dict[int, "GreenletRecord"] = {}
_PRUNE_AT = 256
_prune_at = _PRUNE_AT  # prune the records of dead greenlets when there are this many
# OS thread ident -> the hook installed in it
_hooks: dict[int, "SwitchHook"] = {}
LOG_SIZE = 16384
"""Switches remembered per thread, for the native engine's samples filed later."""
_TAIL_COPY = 256  # switch log entries copied at first by switch_log(since_ns=...)
_COPY_TRIES = 4  # copies of a log's newest entries tried before the whole log is copied
_logged_at = operator.itemgetter(0)  # a switch log entry's perf_counter_ns()
_cpu_logged = operator.itemgetter(2)  # a switch log entry's thread CPU clock
_last_turn = operator.itemgetter(3)  # a turn drawn's last end (draw_turns)


# Called with each greenlet the first time a hook sees it (when it first runs, or
# when a greenlet it spawned first runs), in its thread (see groups.GreenletGroup).
new_greenlet_listeners: "set[Callable[[Any], None]]" = set()


class GreenletRecord:
    """What is known of one greenlet (never the greenlet itself: held weakly)."""

    __slots__ = ("id", "name", "named", "parent", "base", "code", "is_main", "ref", "spawn")

    def __init__(self, g: Any) -> None:
        self.id = next(_ids)
        self.is_main = getattr(g, "parent", None) is None
        name = _name_of(g, self.is_main)
        # (a started greenlet no longer has its ``run``: then the sampler names it
        # after the outermost function of its first sample)
        self.named = name is not None
        self.name = name or f"greenlet-{id(g):x}"
        parent = getattr(g, "spawning_greenlet", None)
        parent = parent() if isinstance(parent, weakref.ref) else parent
        if parent is None:
            parent = getattr(g, "parent", None)
        self.parent = record_of(parent).id if parent is not None else 0
        # Where it was spawned: (name, file, first line, line) frames, outermost
        # first; gevent's spawning_stack, or else its first switcher's stack (the hook)
        self.spawn: tuple = _frames(getattr(g, "spawning_stack", None), _GEVENT_SPAWN_FILES)
        self.base = 0
        # its outermost function's code, learnt with base: where the native engine
        # files CPU the greenlet used where no sample saw it
        self.code: Optional[CodeType] = None
        # No callback: a greenlet can die inside a pending call (greenlet frees a
        # finished thread's greenlets from the main thread's pending calls), and
        # Python code run there while a profile function is set and another thread
        # adds a pending call loops forever on 3.11 (the interpreter re-dispatches the
        # entry of the callback's frame to handle the pending calls it cannot run
        # from inside one: seen 2 runs in 150 of the use_errortrace stress). Dead
        # greenlets' records are pruned instead (_prune).
        self.ref = weakref.ref(g)

    def __repr__(self) -> str:
        return f"<greenlet {self.id} {self.name!r} parent={self.parent}>"


def _name_of(g: Any, is_main: bool) -> Optional[str]:
    if is_main:
        return "main greenlet"
    if type(g).__name__ == "Hub":
        return "Hub"
    func = getattr(g, "_run", None) or getattr(g, "run", None)
    args = getattr(g, "args", None)
    if getattr(func, "__name__", "") == "_handle_and_close_when_done" and args and callable(args[0]):
        func = args[0]  # a gevent server's connection: named after its handler
    func_name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    gname = getattr(g, "name", None)
    if isinstance(gname, str) and gname:
        return f"{gname} ({func_name})" if func_name and func_name not in gname else gname
    return func_name


SPAWN_DEPTH = 64
"""Frames kept of the stack that spawned a greenlet (innermost ones)."""
_GEVENT_SPAWN_FILES = ("gevent/greenlet.py", "gevent\\greenlet.py")


def _frames(frame: Any, skip: tuple = ()) -> tuple:
    """A frame chain (a real frame or gevent's ``_Frame``, innermost first, walked
    in one go) as ``(name, file, first line, line)`` tuples, outermost first; the
    innermost frames in files ending with ``skip`` (gevent's spawn itself) left out."""
    out = []
    while frame is not None and len(out) < SPAWN_DEPTH:
        code = frame.f_code
        if out or not code.co_filename.endswith(skip) or not skip:
            out.append((getattr(code, "co_qualname", code.co_name), code.co_filename,
                        code.co_firstlineno, frame.f_lineno))
        frame = frame.f_back
    out.reverse()
    return tuple(out)


def record_of(g: Any) -> GreenletRecord:
    """The record of greenlet ``g``, made the first time it is asked for."""
    rec = _records.get(id(g))
    if rec is None or rec.ref() is not g:
        if len(_records) >= _prune_at:
            _prune()
        rec = _records[id(g)] = GreenletRecord(g)
        for listener in list(new_greenlet_listeners):
            listener(g)
    return rec


def _prune() -> None:
    """Drop the records of dead greenlets; the next prune comes when the records have
    doubled (amortized: one record looked at per record made)."""
    global _prune_at
    for key, rec in list(_records.items()):
        if rec.ref() is None:
            del _records[key]
    for base, rec in list(_by_base.items()):
        if rec.ref() is None:
            del _by_base[base]
    _prune_at = max(_PRUNE_AT, 2 * len(_records))


def _bottom(frame: Optional[FrameType]) -> Optional[FrameType]:
    while frame is not None and frame.f_back is not None:
        frame = frame.f_back
    return frame


def _learn_base(rec: GreenletRecord, frame: Optional[FrameType]) -> None:
    """Learn the greenlet's outermost frame from one of its frames (and its name
    from it, for a greenlet that had none)."""
    bottom = _bottom(frame)
    if bottom is None or bottom.f_code is HOOK_CODE:
        # a hook's own frame (an inert hook left in the thread calls this one: at a
        # first switch it is the greenlet's only frame) is neither its function nor
        # its base (3.13: one greenlet in 5 named "SwitchHook.__call__" in a run
        # after another sampler's)
        return
    rec.code = bottom.f_code
    if not rec.named:
        code = bottom.f_code
        rec.name = getattr(code, "co_qualname", code.co_name)
        rec.named = True
    if _frame_address is not None:
        rec.base = _frame_address(bottom)
        _by_base[rec.base] = rec


class SwitchHook:
    """The trace function of one thread: keeps :attr:`current` up to date, and logs
    each switch with the clocks.

    The clocks are read when the hook's own work is done, so the CPU of a switch
    (the call to ``switch()``, greenlet's work and this hook's) is the switcher's,
    and the greenlet switched to is charged from where its own code goes on. (Read
    in the middle of the hook, the rest of it went to the greenlet switched to: a
    worker switched to after a nap of the main greenlet, caches cold, was charged
    5-6 us a turn of it, 4-5 now.) A tracer the hook chains runs after the reading,
    in the greenlet switched to, whose stack a sample finds it on: its CPU is that
    greenlet's, where its samples are filed."""

    def __init__(self, previous: Optional[Callable[..., Any]]) -> None:
        self.previous = previous
        self.users = 0
        self.current: Optional[GreenletRecord] = None
        # (perf_counter_ns() at the switch, the greenlet switched to, the thread's
        # CPU clock then: thread_time_ns()), oldest first. The CPU clock tells the
        # native engine what each greenlet used between two samples (here one
        # system call, 0.2-1.2 us per switch by host; the C hook mostly estimates it).
        self.log: deque = deque(maxlen=LOG_SIZE)
        self.switched = False  # its thread has switched since the hook was made

    def _first_switch(self) -> None:
        """Tell the native engine that this thread switches greenlets: it then files
        each of the thread's samples, never one for a stretch showing one stack (the
        hub's loop at two ticks, other greenlets run between them)."""
        self.switched = True
        if _note_switching is not None:
            _note_switching()

    def __call__(self, event: str, args: Any) -> None:
        switched_to = None
        if self.users and (event == "switch" or event == "throw"):
            try:
                if not self.switched:
                    self._first_switch()
                target = args[1]
                rec = _records.get(id(target))
                if rec is None or rec.ref() is not target:
                    rec = record_of(target)
                    if not rec.spawn and getattr(target, "parent", None) is args[0]:
                        # first run, started by its parent: spawned from there
                        rec.spawn = _frames(args[0].gr_frame)
                origin, self.current = self.current, rec
                switched_to = rec
                if not rec.base or not rec.named:
                    # it runs now: its frames are the caller's
                    _learn_base(rec, sys._getframe(0).f_back)
                if origin is not None and not origin.base and origin.ref() is args[0]:
                    _learn_base(origin, args[0].gr_frame)  # suspended: read in one go
            except Exception:  # a profiler's trouble never reaches the program
                pass
        if switched_to is not None:  # (logged once the hook's work is done: see above)
            try:
                self.log.append((perf_counter_ns(), switched_to, thread_time_ns()))
            except Exception:  # (as above)
                pass
        if self.previous is not None:
            self.previous(event, args)


HOOK_CODE = SwitchHook.__call__.__code__

if _NativeSwitchHook is not None:
    class NativeSwitchHook(_NativeSwitchHook):  # type: ignore[misc,valid-type]
        """:class:`SwitchHook` with its common case in C (``sampler/_native/switchhook.h``):
        a switch to a greenlet whose record is whole, from one that needs nothing
        learnt, is logged without a Python frame; every other event goes to
        :meth:`SwitchHook.__call__` (``_slow``), which this class shares, with its
        attributes, so the two hooks do the same. Measured with two greenlets
        switching back and forth (``python -m benchmarks.bench_greenlets``): see
        ``scribblings/greenlets.md``, cost and limits."""

        def __init__(self, previous: Optional[Callable[..., Any]]) -> None:
            SwitchHook.__init__(self, previous)  # type: ignore[arg-type]
            self.records = _records
            self.estimate_cpu = os.environ.get(CLOCK_ENV_VAR) != "read"

        _first_switch = SwitchHook._first_switch
        _slow = SwitchHook.__call__
else:
    NativeSwitchHook = None  # type: ignore[assignment,misc]

CLOCK_ENV_VAR = "STACKSHOT_SWITCH_CLOCK"
"""``read`` makes new C hooks read the thread's CPU clock at every switch, a system
call, where they would know it without one between reschedulings
(``sampler/_native/switchclock.h``; the benchmarks compare the two)."""

HOOK_ENV_VAR = "STACKSHOT_SWITCH_HOOK"
"""``python`` makes new hooks the Python twin even where the C one is built (the
tests run each engine with its own: the Python engine with the Python hook)."""


def _hook_class() -> Any:
    """The class of the hooks made from now on: the C one where it is built."""
    if NativeSwitchHook is not None and os.environ.get(HOOK_ENV_VAR) != "python":
        return NativeSwitchHook
    return SwitchHook


def attach() -> Optional[SwitchHook]:
    """Install (or share) the switch hook of the calling thread; ``None`` without
    greenlet."""
    if _greenlet is None:
        return None
    ident = realthreads.get_ident()
    hook = _hooks.get(ident)
    if hook is None or _greenlet.gettrace() is not hook:
        previous = _greenlet.gettrace()
        if hook is not None and hook.users and previous is not None:
            hook.users += 1  # another tracer chains ours: keep it
            return hook
        hook = _hook_class()(previous)
        hook.current = record_of(_greenlet.getcurrent())
        hook.log.append((perf_counter_ns(), hook.current, thread_time_ns()))
        _learn_base(hook.current, sys._getframe(0))
        _greenlet.settrace(hook)
        _hooks[ident] = hook
    hook.users += 1
    return hook


def _restart_logs_in_child() -> None:
    """In a forked child, start the switch logs over: the child's threads have CPU
    clocks of their own, from zero, and a log that went on from the parent's
    (CPU clock in the seconds, say, while the child's samples read milliseconds)
    is out of order, so the native engine could not tell the child's turns from
    it (the workers of a child forked from a switching parent: 20% of the CPU for
    32% until the log's 16,384 entries had turned over)."""
    ident = realthreads.get_ident()
    for owner, hook in _hooks.items():
        hook.log.clear()
        if owner == ident and hook.current is not None:  # (the only thread in the child)
            hook.log.append((perf_counter_ns(), hook.current, thread_time_ns()))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_logs_in_child)


def release(hook: Optional[SwitchHook]) -> None:
    """One user fewer; the last one removes the hook if it can (see the module
    docstring)."""
    if hook is None or hook.users <= 0:
        return
    hook.users -= 1
    if hook.users:
        return
    for ident, h in list(_hooks.items()):
        if h is hook and ident == realthreads.get_ident() and _greenlet.gettrace() is hook:
            _greenlet.settrace(hook.previous)
            del _hooks[ident]


# Threads started while a sampler follows new threads get the hook (follow_new_threads):
# Thread.start, wrapped once, makes the new thread's run install it first.
_following = 0
_installed: list = []  # hooks installed in new threads, not yet released
_start_wrapped = False


def _run_with_hook(thread: Any, inner: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        hook = None
        if _following:
            try:
                hook = attach()
                _installed.append(hook)
            except Exception:  # a profiler's trouble never reaches the program
                hook = None
        try:
            inner()
        finally:
            # (the thread holds this function and it holds the thread: break the cycle)
            thread.__dict__.pop("run", None)
            if hook is not None:
                try:
                    _installed.remove(hook)  # (not released by the sampler's stop yet)
                except ValueError:
                    pass
                else:
                    release(hook)  # in its own thread: removed if still its trace function
    return run


def _wrap_thread_start() -> None:
    """Wrap the standard ``Thread.start`` once (gevent's Thread derives from it)."""
    global _start_wrapped
    if _start_wrapped:
        return
    _start_wrapped = True
    base = realthreads._original("threading", "Thread")
    original = base.start

    def start(self: Any) -> None:
        if _following:
            self.run = _run_with_hook(self, self.run)
        try:
            return original(self)
        except BaseException:
            self.__dict__.pop("run", None)
            raise

    start.__doc__ = original.__doc__
    start.__wrapped__ = original  # type: ignore[attr-defined]
    base.start = start


def follow_new_threads() -> None:
    """Install the switch hook in every thread started from now on (through
    ``threading.Thread.start``), until :func:`unfollow_new_threads`: greenlet hooks
    are per thread, and only a thread can install its own."""
    global _following
    if _greenlet is None:
        return
    _wrap_thread_start()
    _following += 1


def unfollow_new_threads() -> None:
    """One follower fewer; the last one releases the hooks installed in other
    threads: they stay there, inert, passing events on, until their thread ends
    (only a thread can remove its own)."""
    global _following
    if _following <= 0:
        return
    _following -= 1
    while not _following and _installed:
        try:
            release(_installed.pop())
        except IndexError:  # a thread ending released its own meanwhile
            break


def running_in(ident: Optional[int], top: Optional[FrameType] = None) -> Optional[GreenletRecord]:
    """The greenlet running in OS thread ``ident`` now (``None``: no hook there).

    ``top`` is the thread's top frame. Where it is the hook's own, the thread is
    switching: the switch is made (the frames below the hook are the target's) but
    the hook has not yet said so, so the greenlet is the target of the switch the
    hook is handling, if it has a record (``None`` when the target has no frames
    yet: its first run starts with the hook)."""
    hook = _hooks.get(ident) if ident is not None else None
    if hook is None or not hook.users:
        return None
    if top is not None and top.f_code is HOOK_CODE:
        if top.f_back is None:
            return None  # a greenlet's first switch: none of its frames yet
        args = top.f_locals.get("args")  # (origin, target)
        target = args[1] if isinstance(args, tuple) and len(args) == 2 else None
        rec = _records.get(id(target)) if target is not None else None
        return rec if rec is not None and rec.ref() is target else None
    return hook.current


def at_base(base: int) -> Optional[GreenletRecord]:
    """The live greenlet whose outermost frame is at address ``base``, if known
    (a greenlet that has finished no longer names its address, which new frames
    may reuse). Never a thread's main greenlet: when its thread ends it still says
    it is alive (greenlet keeps it), while its frames' memory goes to new frames
    (a greenlet started later in another thread was taken for it, and none of its
    samples was filed); the switch log names main greenlets."""
    rec = _by_base.get(base)
    if rec is not None and rec.is_main:
        return None
    if rec is not None:
        g = rec.ref()
        if g is None or getattr(g, "dead", True):
            if _by_base.get(base) is rec:
                del _by_base[base]
            return None
    return rec


def switch_log(ident: int, since_ns: Optional[int] = None) -> list:
    """A copy of the switches remembered for OS thread ``ident`` (see
    :func:`running_at`); empty where no hook runs. With ``since_ns``, only the
    latest ones, from the second latest logged by ``perf_counter_ns()`` time
    ``since_ns`` on (or all, if fewer were): the entry in force then, and the one
    before it, for a clock read a little off.

    (The whole log, 16,384 entries once a gevent server has run 8 s, took 48 us to
    copy at each of the native engine's drains, 50 a second.) The hook appends
    from the log's own thread, with the GIL: a copy in one C call is whole, but
    the iterators a copy of the newest entries is made with are objects, whose
    making can run a collection, and the Python it may run (a ``gc`` callback, a
    finalizer) can let the GIL go to the log's thread, which switches: the copy
    then fails (the deque was mutated) and is made again; after a few such
    failures, the whole log is copied (one C call, its iterator made first). (A
    stress run of greenlets switching under the native engine, filing the
    collections of a drain, lost its feeder to that error on 3.10 and 3.12.)"""
    hook = _hooks.get(ident)
    if hook is None or not hook.users:
        return []
    log = hook.log
    if since_ns is None:
        return list(log)
    want, failures = _TAIL_COPY, 0
    while True:
        try:
            tail = list(itertools.islice(reversed(log), want))  # (newest first)
        except RuntimeError:  # (mutated during iteration: see above)
            failures += 1
            if failures < _COPY_TRIES:
                continue
            tail = list(log)[::-1]  # (all of it, newest first)
            break
        if len(tail) < want or tail[-2][0] <= since_ns:  # (all of it, or two logged by then)
            break
        want *= 4
    tail.reverse()
    del tail[:max(bisect_right(tail, since_ns, key=_logged_at) - 2, 0)]
    return tail


def _check_runs(fn: str, keep: int, runs: int, point: float) -> None:
    """The draw's own arguments, checked alike by the twins that draw (as the C ones
    check them: one message)."""
    if not (keep >= 0 and 1 <= runs <= 65536 and 0 <= point < 1):
        raise ValueError(f"{fn}: need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, "
                         f"got {keep}, {runs} and {point!r}")


def draw_turns_py(log: list, i: int, j: int, keep: int, runs: int, point: float) -> list:
    """The turns ``i + 1`` to ``j - 1`` of switch ``log`` (:func:`switch_log`; turn
    ``k`` runs from entry ``k - 1``, its greenlet's, to entry ``k``) merged per
    greenlet: if at most ``keep`` greenlets ran them, each is drawn all it used;
    else their CPU is cut in ``runs`` equal parts, each drawn to the greenlet whose
    CPU, laid end to end in the order the greenlets first ran, holds the point
    ``(point + n) / runs`` of the whole (systematic sampling; ``point`` in [0, 1),
    drawn by the caller). ``[record, CPU drawn ns, CPU used ns, index of its last
    turn's end, turns]`` for each greenlet drawn, in the order each first ran. (The C
    one, ``sampler/_native/turnmerge.h``, is :func:`draw_turns` where it is built.)"""
    if not 1 <= i <= j <= len(log):
        raise ValueError(f"draw_turns: need 1 <= i <= j <= len(log) ({len(log)}), got i={i}, j={j}")
    _check_runs("draw_turns", keep, runs, point)
    merged: dict[Any, list] = {}
    for k in range(i + 1, j):
        began, ended = log[k - 1], log[k]
        turn = merged.get(began[1])
        if turn is None:
            merged[began[1]] = [began[1], 0, ended[2] - began[2], k, 1]
        else:
            turn[2] += ended[2] - began[2]
            turn[3] = k
            turn[4] += 1
    turns = list(merged.values())
    if len(turns) <= keep:
        return [[rec, used, used, last, n] for rec, _, used, last, n in turns if used > 0]
    total = sum(turn[2] for turn in turns)
    if total <= 0:
        return []
    step = total / runs
    reached = list(itertools.accumulate(turn[2] for turn in turns))
    for d in range(runs):  # (float(total) / runs * (point + d) as the C one does)
        turns[min(bisect_right(reached, (point + d) * step), len(turns) - 1)][1] += 1
    return [[rec, int(draws * step), used, last, n] for rec, draws, used, last, n in turns if draws]


draw_turns = _native_draw_turns or draw_turns_py


def log_turns_py(log: list, since_ns: int, until_ns: int, origin_us: float, keep: int, runs: int,
                 point: float) -> list:
    """The turns of greenlets in a thread whose switch ``log`` is this
    (:func:`switch_log`), from its CPU clock ``since_ns`` (a sample's) to
    ``until_ns`` (the next one's), in order: ``(record, CPU used, wall clock where
    it ended, the CPU to find turns like it by)``, microseconds, wall clocks on the
    clock whose zero is ``origin_us`` on the log's (the last: 0 for several turns
    merged). The first is the turn running at ``since_ns`` (from there), the last
    the one running at ``until_ns`` (up to there; its end: 0); turns of no CPU in
    between are left out. Empty where the log does not reach back to ``since_ns``
    or shows no switch in between.

    Beyond ``keep`` turns, those in between (all but the first and the last) are
    merged per greenlet and drawn (:func:`draw_turns`, with ``runs`` and
    ``point``), in the order each greenlet's last one ended (the CPU to find turns
    like it by: the greenlet's one turn, else 0). (The C one,
    ``sampler/_native/turnmerge.h``, is :func:`log_turns` where it is built; it
    converts wall clocks alike below 2**53 ns.)"""
    _check_runs("log_turns", keep, runs, point)
    if not log or len(log[0]) < 3:
        return []
    i = bisect_right(log, since_ns, key=_cpu_logged)
    if i == 0 or i == len(log) or log[i][2] > until_ns:
        return []
    j = bisect_right(log, until_ns, i, key=_cpu_logged)  # log[i:j]: the switches between
    first = log[i - 1][1], (log[i][2] - since_ns) // 1000, int(log[i][0] / 1000 - origin_us)
    final = log[j - 1][1], (until_ns - log[j - 1][2]) // 1000, 0
    if j - i + 1 <= keep:  # (each turn k of the middle: from log[k - 1] to log[k])
        middle = [(log[k - 1][1], (log[k][2] - log[k - 1][2]) // 1000, int(log[k][0] / 1000 - origin_us))
                  for k in range(i + 1, j)]
        turns = [(rec, used, ended_us, used) for rec, used, ended_us in [first, *middle, final]]
    else:  # the turns in between, one per greenlet
        drawn = draw_turns_py(log, i, j, keep, runs, point)  # [rec, drawn, used, last, n]
        drawn.sort(key=_last_turn)  # (in the order they ended)
        middle = [(rec, drawn_ns // 1000, int(log[last][0] / 1000 - origin_us), 0 if n > 1 else used // 1000)
                  for rec, drawn_ns, used, last, n in drawn]
        turns = [(*first, first[1]), *middle, (*final, final[1])]
    return [turn for turn in turns[:-1] if turn[1] > 0] + turns[-1:]  # (no CPU: left out)


def turn_length_py(log: list, cpu_ns: int) -> int:
    """The CPU (us) of the turn of the greenlet running at its thread's CPU clock
    ``cpu_ns``, by the thread's switch ``log`` (a turn not over when the log was
    copied: so far; before the log or no log: 0). (The C one is :func:`turn_length`.)"""
    if not log or len(log[0]) < 3:
        return 0
    i = bisect_right(log, cpu_ns, key=_cpu_logged)
    began_ns = log[i - 1][2] if i else 0
    ended_ns = log[i][2] if i < len(log) else cpu_ns
    return max(ended_ns - began_ns, 0) // 1000


log_turns = _native_log_turns or log_turns_py
turn_length = _native_turn_length or turn_length_py


def draw_place_py(places: list, used: int, like: float, point: float) -> tuple:
    """One of a greenlet's ``places`` (the native engine's ``_Slot.places``: each a
    place seen running, with the log of the CPU of the turn it was seen in), for a
    turn no sample saw that used ``used`` us of CPU: drawn uniformly (``point`` in
    [0, 1), drawn by the caller) among those seen in turns most like it, within
    ``like`` of the closest log ratio of turn lengths (the native engine's
    ``LIKE_TURN``: within half again); ``used`` 0: among all. (The C one,
    ``sampler/_native/turnmerge.h``, is :func:`draw_place` where it is built.)"""
    if not places or not 0 <= point < 1 or not like >= 0:
        raise ValueError(f"draw_place: need places, like >= 0 and 0 <= point < 1, "
                         f"got {len(places)} places, {like!r} and {point!r}")
    if used > 0 and len(places) > 1:
        log_used = math.log(used)
        ratios = [abs(place[4] - log_used) for place in places]
        reach = min(ratios) + like
        places = [place for place, ratio in zip(places, ratios) if ratio <= reach]
    return places[min(int(point * len(places)), len(places) - 1)]


draw_place = _native_draw_place or draw_place_py


def switches(ident: int) -> bool:
    """Whether OS thread ``ident``'s hook has seen a greenlet switch there."""
    hook = _hooks.get(ident)
    return hook is not None and hook.switched


def running_at(log: list, t_ns: int, base: int = 0, since_ns: Optional[int] = None
               ) -> Optional[GreenletRecord]:
    """The greenlet running at ``perf_counter_ns()`` time ``t_ns`` according to
    ``log`` (:func:`switch_log`); ``None`` before the log's first entry.

    With ``base``, the address of the outermost frame of a stack read by ``t_ns``
    (and after ``since_ns``, when given), where the greenlet logged last does not
    start there:

    * the one logged next, if it does: the hook logs a switch from inside it, after
      the switch, so a stack can show the new greenlet's frames (the hook's frame on
      top of a resumed greenlet's) just before the entry that names it;
    * else the latest one logged since ``since_ns`` that does: the stack was read
      some time before ``t_ns`` (the native engine's thread can lose its core between
      its read and its clock), and switches came in between."""
    i = bisect_right(log, t_ns, key=_logged_at)
    logged = log[i - 1][1] if i else None
    if not base or (logged is not None and logged.base == base):
        return logged
    if i < len(log) and log[i][1].base == base:
        return log[i][1]
    if since_ns is not None:
        j = i - 2
        while j >= 0 and log[j + 1][0] > since_ns:  # (entry j in force after since_ns)
            if log[j][1].base == base:
                return log[j][1]
            j -= 1
    return logged


def greenlet_at(log: list, t_ns: int, base: int, since_ns: Optional[int] = None
                ) -> Optional[GreenletRecord]:
    """The greenlet whose stack, starting at the frame at address ``base``, was read
    by ``perf_counter_ns()`` time ``t_ns`` (after ``since_ns``, if given) in a thread
    whose switch log is ``log``: the one the log says ran then (see
    :func:`running_at`), if its outermost frame is ``base``; else the live one whose
    outermost frame that is; else the log's. ``None``: not known.

    The log comes first: stacks are filed after the fact, and by then a greenlet
    that has finished may have left its frames' addresses to a new one (handlers and
    clients of a server come and go). The address comes second: the hook learns a
    greenlet's outermost frame when it switches away from it the first time."""
    logged = running_at(log, t_ns, base, since_ns) if log else None
    if logged is not None and logged.base == base:
        return logged
    return (at_base(base) if base else None) or logged


def current_greenlet() -> Any:
    """The greenlet running now (``None`` without greenlet)."""
    return _greenlet.getcurrent() if _greenlet is not None else None
