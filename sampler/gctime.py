"""Garbage collection time, accounted from ``gc.callbacks`` (MLton's separate GC line).

An in-process sampler cannot sample during a collection: the collecting thread holds
the GIL from ``start`` to ``stop`` (the Python engine's collector cannot run), and the
native engine, which can, sees only the Python frame that happened to allocate.  So
the collections are timed by a ``gc.callbacks`` hook instead, in the thread that
collects:

* at ``start``: the thread, the monotonic clock, the generation and the stack that
  triggered the collection (code objects and instruction offsets, innermost first,
  at most :data:`MAX_DEPTH`; code objects only, never frames, so no local variable
  lives longer because a collection ran);
* at ``stop``: the durations, appended to a bounded buffer the engine drains with
  :meth:`GCWatch.take` (a full buffer drops collections and counts them).

The hook is ``sampler._native.GCHook`` (C, ``sampler/_native/gchook.h``) where the
extension is built, else the Python twin in this module; both give the same events.

The engine files each event before the first regular sample of that thread taken
after the collection ended (:meth:`sampler.recorder.Recorder.record_gc`): a sample of
the triggering stack plus a ``<gc>`` frame carrying the generation, weighing the
collection's durations, whose time is taken out of the next regular sample's
interval so that nothing is counted twice.

CPU time, without reading the CPU clock in the common case.  Reading the thread's
CPU clock is a system call (about 1.3-1.6 µs here; twice per collection it alone
would exceed the 2 µs budget), while the monotonic clock is read in user space.
The rule:

* a generation whose previous collection lasted at least :data:`CPU_CLOCK_ABOVE_US`
  of wall time (and the first collection of each generation) reads the thread's
  CPU clock at both ends: long collections, where the time is, are measured, and
  charged no more than their wall time (the CPU clock's reads bracket the wall
  clock's, and a kernel without IRQ time accounting charges the thread the
  interrupts it serves in between: 420 µs for a 98 µs collection, seen under load);
* a collection not measured is charged its wall duration as CPU, at most
  :data:`CPU_CLOCK_ABOVE_US`: a short generation that suddenly takes long was most
  likely descheduled (if it really grew, the next one is measured);
* whatever the case, the recorder charges a collection no more CPU than its thread
  used since its last sample (less what earlier collections took of it), read from
  the thread's CPU clock at the sample the collection is filed before: time the
  thread waited for a core is never charged as CPU, and the thread's total is
  never more than it used.

So an unmeasured collection is charged too much by at most :data:`CPU_CLOCK_ABOVE_US`
(when its thread waited for a core inside it), and too little only when a
generation's collections suddenly grow past it (the first that does is charged
:data:`CPU_CLOCK_ABOVE_US`; the next is measured).

Cost per collection (``python benchmarks/bench_gctime.py``, best of 7 interleaved
runs of 5,000 ``gc.collect(0)``, two runs per Python on a loaded 2-core machine): the
C hook adds 0.99-1.07 µs (3.10 1.01, 3.11 1.02-1.07, 3.12 0.99-1.00, 3.13 1.01-1.04;
up to 1.9 µs when the machine is busiest), what a ``gc.callbacks`` Python function
that does nothing adds (0.89-1.04 µs: the interpreter builds the info dict and makes
two calls, whatever the hook); the Python twin adds 3.9-5.4 µs (the hook that read
both CPU clocks at every collection added 8.6-9.7 µs).

Why C matters beyond cost: CPython 3.11's ``frame.f_back`` (``PyFrame_GetBack``)
reads the caller's interpreter frame, then allocates its frame object, and an
allocation could start a collection right there (3.12 defers collections to the
eval loop; 3.10 has no data stack).  A Python hook in that collection runs
bytecode, so the GIL can change hands; the walked thread then returns, its data
stack chunk is freed, and ``f_back`` finishes on freed memory.  The Python
engine's collector walks other threads' frames with ``f_back``: with the Python
hook, ``tests/native_stress.py deep_oscillation`` crashed 3.11 (SIGSEGV in
``_PyFrame_MakeAndSetFrameObject``).  The C hook runs no bytecode, so the GIL
stays put through the collection, and ``gc_time`` is on by default on both
engines where it is built.  (A program's own Python ``gc.callbacks`` or
finalizers can still open that window on 3.11; nothing here can close it.)
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque
from typing import Any, Optional

from . import realthreads
from .snapshot import Frame

try:  # the C hook; its Python twin below when the extension is not built
    from ._native import GCHook as _GCHook
except ImportError:
    _GCHook = None
try:
    from ._native import frame_address as _frame_address
except ImportError:
    _frame_address = None

MAX_DEPTH = 128
"""Frames kept of a collection's triggering stack (the innermost ones)."""

BASE_DEPTH = 256
"""Frames walked for the address of a triggering stack's outermost frame (deeper: 0)."""

MAX_EVENTS = 100_000
"""Collections kept between two drains; further ones are dropped (and counted)."""

MAX_FRAMES = 1 << 20
"""Frames of triggering stacks kept between two drains (the C hook's ring)."""

CPU_CLOCK_ABOVE_US = 100
"""A generation's collections read the thread's CPU clock once one of them lasted
this long (wall); shorter ones are charged their wall time, at most this."""

GC_NAME = "<gc>"
GC_FILE = "<gc>"


STACKS_KEPT = 8
"""Distinct stacks a hook gives one tuple each until its next ``take()`` (the C
hook's ``SS_GC_MEMO``)."""


def native_gc_hook() -> bool:
    """Whether the C hook (``sampler._native.GCHook``) is built here."""
    return _GCHook is not None


def gc_frame(generation: int) -> Frame:
    """The frame a collection of ``generation`` appears as: one function, ``<gc>`` in
    ``<gc>``, whose *line* is the generation (one node per generation at line
    granularity, one in all at function granularity: a report stays short)."""
    return Frame(GC_NAME, GC_FILE, 0, generation)


def is_gc_frame(frame: Any) -> bool:
    """Whether a :class:`~sampler.snapshot.Frame` is a collection's ``<gc>`` frame."""
    return frame[0] == GC_NAME and frame[1] == GC_FILE


class GCWatch:
    """A ``gc.callbacks`` hook that times every collection (see the module docstring).

    The hook is :class:`sampler._native.GCHook` where the extension is built, else
    this module's Python twin (``native=False`` asks for the twin).  ``install`` and
    ``remove`` are idempotent; the hook is one object, so removing it never touches
    another tool's callback.
    """

    def __init__(self, start: float, native: Optional[bool] = None,
                 max_events: int = MAX_EVENTS) -> None:
        if native is None:
            native = _GCHook is not None
        elif native and _GCHook is None:
            raise ValueError("GCWatch(native=True): the C extension sampler._native is not built")
        if not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"GCWatch: max_events must be a positive int, not {max_events!r}")
        self.start = start  # the recorder's perf_counter() origin
        self.native = native
        self._ident: Any = realthreads.get_ident
        if native:
            # perf_counter() is CLOCK_MONOTONIC on Linux, the clock the C hook reads
            self._c = _GCHook(int(start * 1e9), max_events, MAX_FRAMES, CPU_CLOCK_ABOVE_US * 1000)
            self._hook: Any = self._c
            return
        self._c = None
        self.max_events = max_events
        # One tuple per collection: (ident, stack, generation, end_us, wall_us, cpu_us,
        # base), the stack ((code, lasti), ...) innermost first, times in microseconds
        # (end_us since the recorder's start), base the address of the stack's
        # outermost frame as the engine reports it (which greenlet ran; 0: unknown).
        self.events: deque = deque()
        self._collections = 0
        self._dropped = 0
        self._active = False
        self._open: Optional[tuple] = None
        self._last_wall = [-1.0] * 3  # per generation, seconds; -1: none yet
        self._stacks: list[tuple] = []  # the last stacks, until the next take()
        self._hook = self._callback

    @property
    def hook(self) -> Any:
        """The object in ``gc.callbacks`` while installed."""
        return self._hook

    @property
    def active(self) -> bool:
        """False while paused: collections are not recorded."""
        return self._c.active if self._c is not None else self._active

    @active.setter
    def active(self, value: bool) -> None:
        if self._c is not None:
            self._c.active = bool(value)
        else:
            self._active = bool(value)
            if not value:
                self._open = None  # (its end is not recorded: never under way again)

    @property
    def collections(self) -> int:
        """Collections recorded (taken or not)."""
        return self._c.collections if self._c is not None else self._collections

    @property
    def dropped(self) -> int:
        """Collections not recorded because :data:`MAX_EVENTS` were waiting."""
        return self._c.dropped if self._c is not None else self._dropped

    @property
    def pending(self) -> int:
        """Collections recorded and not taken yet."""
        return self._c.pending if self._c is not None else len(self.events)

    @property
    def opened(self) -> Optional[tuple[int, int]]:
        """The collection under way, if recorded: ``(thread ident, start in
        microseconds since the recorder's start)``; else ``None``. Finalizers that
        run Python code let the GIL go inside a collection, and the engines then
        hold that thread's samples until the collection has ended and been timed."""
        if self._c is not None:
            return self._c.opened
        opened = self._open
        if opened is None:
            return None
        ident, _stack, _generation, _cpu0, wall0, _base = opened  # (as _callback makes it)
        return ident, int((wall0 - self.start) * 1e6)

    def install(self) -> None:
        # The OS thread's ident function itself (gevent's original when patched):
        # the hook runs inside every collection and must not look it up each time.
        self._ident = realthreads._original("_thread", "get_ident")
        if not any(h is self._hook for h in gc.callbacks):
            gc.callbacks.append(self._hook)

    def remove(self) -> None:
        callbacks = gc.callbacks
        for i, h in enumerate(callbacks):
            if h is self._hook:
                del callbacks[i]
                break
        if self._c is None:
            self._open = None

    def _callback(self, phase: str, info: dict, _getframe: Any = sys._getframe,
                  _perf: Any = time.perf_counter, _cpu: Any = time.thread_time) -> None:
        if not self._active:
            return
        if phase == "start":
            if len(self.events) >= self.max_events:
                self._dropped += 1
                self._open = None
                return
            stack = []
            f = _getframe(0).f_back  # None when no Python code triggered it (a thread's start)
            bottom, walked = None, 0
            while f is not None and walked < BASE_DEPTH:
                if walked < MAX_DEPTH:
                    stack.append((f.f_code, f.f_lasti))
                bottom, f, walked = f, f.f_back, walked + 1
            base = _frame_address(bottom) if bottom is not None and f is None and _frame_address else 0
            gen = min(max(info.get("generation", 0), 0), 2)
            last = self._last_wall[gen]
            cpu0 = _cpu() if last < 0 or last >= CPU_CLOCK_ABOVE_US / 1e6 else None
            frames = tuple(stack)
            # one tuple for a stack met again, up to the next take() (see gchook.h)
            kept = self._stacks
            for seen in kept:
                if seen == frames:
                    frames = seen
                    break
            else:
                if len(kept) >= STACKS_KEPT:
                    kept.pop(0)
                kept.append(frames)
            self._open = (self._ident(), frames, gen, cpu0, _perf(), base)
            return
        opened = self._open
        self._open = None
        if opened is None:
            return
        end = _perf()
        ident, stack, gen, cpu0, wall0, base = opened
        cpu = _cpu() if cpu0 is not None else None
        if ident != self._ident():
            return
        wall = end - wall0
        self._last_wall[gen] = wall
        wall_us = int(wall * 1e6)
        if cpu is not None:  # (no more than its wall time: see gchook.h)
            cpu_us = min(max(0, int((cpu - cpu0) * 1e6)), wall_us)
        else:
            cpu_us = min(wall_us, CPU_CLOCK_ABOVE_US)
        self._collections += 1
        self.events.append((ident, stack, gen, int((end - self.start) * 1e6), wall_us, cpu_us, base))

    def take(self, until_us: Optional[int] = None) -> list:
        """Pop the events that ended before ``until_us`` (all when ``None``), oldest first.

        No more than were there when it began: where a collection follows every
        allocation (``gc.set_threshold(1)``), events come in as fast as they are
        taken (in the C hook, each one taken allocates and logs another, from this
        very thread). Taken until none was left, a full test run found the feeder
        inside this loop with the process at 17 GB, while a test held the
        threshold at 1."""
        if self._c is not None:
            return self._c.take(until_us)
        self._stacks = []  # (their code objects are not kept past a take)
        out = []
        events = self.events
        for _ in range(len(events)):
            try:
                event = events[0]
            except IndexError:
                break
            if until_us is not None and event[3] > until_us:
                break
            out.append(events.popleft())
        return out
