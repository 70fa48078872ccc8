"""Garbage collection time, accounted from ``gc.callbacks`` (MLton's separate GC line).

An in-process sampler cannot sample during a collection: the collecting thread holds
the GIL from ``start`` to ``stop`` (the Python engine's collector cannot run), and the
native engine, which can, sees only the Python frame that happened to allocate.  So
the collections are timed by a ``gc.callbacks`` hook instead, in the thread that
collects:

* at ``start``: the thread, its wall and CPU clocks, and the stack that triggered the
  collection (code objects and instruction offsets, innermost first, at most
  :data:`MAX_DEPTH`; code objects only, never frames, so no local variable lives
  longer because a collection ran);
* at ``stop``: the durations, appended to :attr:`GCWatch.events` (a deque: the
  collecting thread appends, the engine's single writer pops, no lock).

The engine files each event before the first regular sample of that thread taken
after the collection ended (:meth:`sampler.recorder.Recorder.record_gc`): a sample of
the triggering stack plus a ``<gc>`` frame carrying the generation, weighing the
collection's durations, whose time is taken out of the next regular sample's
interval so that nothing is counted twice.

Both clocks are read: on a loaded machine a collection's wall time includes time the
thread waited for a core, and CPU weighting must not charge that.  Reading the
thread's CPU clock is a system call (about 1.6 µs each on the development machines,
half the hook's cost).  Cost per collection: ``python benchmarks/bench_gctime.py``.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque
from typing import Any, Optional

from . import realthreads
from .snapshot import Frame

MAX_DEPTH = 128
"""Frames kept of a collection's triggering stack (the innermost ones)."""

MAX_EVENTS = 100_000
"""Collections kept between two drains; older ones are dropped (and counted)."""

GC_NAME = "<gc>"
GC_FILE = "<gc>"


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

    ``install`` and ``remove`` are idempotent; the hook is one bound method, so
    removing it never touches another tool's callback.
    """

    def __init__(self, start: float) -> None:
        self.start = start  # the recorder's perf_counter() origin
        # One tuple per collection: (ident, stack, generation, end_us, wall_us, cpu_us),
        # the stack ((code, lasti), ...) innermost first, times in microseconds
        # (end_us since the recorder's start).
        self.events: deque = deque(maxlen=MAX_EVENTS)
        self.collections = 0
        self.active = False  # False while paused: collections are not recorded
        self._open: Optional[tuple] = None
        self._hook = self._callback
        self._ident: Any = realthreads.get_ident

    def install(self) -> None:
        # The OS thread's ident function itself (gevent's original when patched):
        # the hook runs inside every collection and must not look it up each time.
        self._ident = realthreads._original("_thread", "get_ident")
        if self._hook not in gc.callbacks:
            gc.callbacks.append(self._hook)

    def remove(self) -> None:
        try:
            gc.callbacks.remove(self._hook)
        except ValueError:
            pass
        self._open = None

    def _callback(self, phase: str, info: dict, _getframe: Any = sys._getframe,
                  _perf: Any = time.perf_counter, _cpu: Any = time.thread_time) -> None:
        if not self.active:
            return
        if phase == "start":
            stack = []
            f = _getframe(0).f_back  # None when no Python code triggered it (a thread's start)
            while f is not None and len(stack) < MAX_DEPTH:
                stack.append((f.f_code, f.f_lasti))
                f = f.f_back
            self._open = (self._ident(), tuple(stack), _perf(), _cpu())
            return
        opened = self._open
        self._open = None
        if opened is None:
            return
        cpu, end = _cpu(), _perf()
        ident, stack, wall0, cpu0 = opened
        if ident != self._ident():
            return
        self.collections += 1
        self.events.append((ident, stack, info["generation"], int((end - self.start) * 1e6),
                            int((end - wall0) * 1e6), max(0, int((cpu - cpu0) * 1e6))))

    def take(self, until_us: Optional[int] = None) -> list:
        """Pop the events that ended before ``until_us`` (all when ``None``), oldest first."""
        out = []
        events = self.events
        while events:
            try:
                event = events[0]
            except IndexError:
                break
            if until_us is not None and event[3] > until_us:
                break
            out.append(events.popleft())
        return out
