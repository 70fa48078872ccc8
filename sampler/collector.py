"""The collector thread: wakes at absolute deadlines and records a tick.

Racket's sampler sleeps ``delay`` after each snapshot, so every tick's own cost and
every late wake-up push the next one back.  Here ticks are scheduled against
absolute deadlines: a tick that runs late is counted, and deadlines that passed
entirely are counted as missed and skipped, never caught up with a burst.  Time is
cut into slots of ``delay`` and each tick falls at a point drawn at random in its
slot (as the native engine's, ``tick_offset`` in ``_native/engine.c``): ticks a fixed
``delay`` apart lock onto a program that repeats at a fixed period and see the same
few points of it every time.

The collector is a real OS thread (also under gevent), waits on a real lock so that
the controller can wake it at once (pause, resume, stop), and never lets an exception
escape into the program: each is recorded and reported through the controller.
"""

from __future__ import annotations

import random
import sys
import time
import traceback
from typing import Any, Optional

from . import realthreads
from .clocks import read_cpu, thread_clock_id
from .gctime import GCWatch
from .recorder import Recorder
from .tracking import Tracker, collector_idents

MAX_KEPT_ERRORS = 10
_SHORT_WAIT = 0.02


class Steering:
    """What every engine's collector shares with the controller: what to sample and
    how often, the pause depth, a wake-up call, an end it can wait for, and the
    errors it kept (see :class:`Collector`'s contract)."""

    def __init__(self, tracker: Tracker, delay: float, recorder: Recorder) -> None:
        self.tracker = tracker
        self.delay = delay
        self.recorder = recorder
        self.stopped = False
        self.ident: Optional[int] = None
        self.error_count = 0
        self.errors: list[str] = []
        self._pauses: list[None] = []  # one item per pause not yet resumed
        self.gc_watch: Optional[GCWatch] = None  # collections to file (set before start)
        self.shadow: Any = None  # use_errortrace: the shadow stacks to sample (set before start)
        self._fresh_locks()

    def _record_error(self) -> None:
        """Keep the exception being handled (never let it reach the program)."""
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(traceback.format_exc())

    def _fresh_locks(self) -> None:
        """New locks (also in a forked child, where the old ones may be held forever)."""
        self._wake = realthreads.allocate_lock()
        self._wake.acquire()  # held: acquire(timeout) is an interruptible sleep
        self._done = realthreads.allocate_lock()
        self._done.acquire()  # released when the thread ends

    @property
    def paused(self) -> int:
        """How many pauses are not resumed yet."""
        return len(self._pauses)

    def pause(self) -> int:
        """One more pause; returns the depth it made (1 for the first)."""
        self._pauses.append(None)
        return len(self._pauses)

    def resume(self) -> int:
        """Undo one pause; returns the depth left.  ``IndexError`` when not paused."""
        self._pauses.pop()
        return len(self._pauses)

    def _wake_thread(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:  # already awake
            pass

    def _ended(self) -> None:
        """The thread's last act: let :meth:`join` return."""
        try:
            self._done.release()
        except RuntimeError:
            pass

    def join(self, timeout: float) -> bool:
        if self._done.acquire(timeout=timeout):
            self._done.release()
            return True
        return False


class Collector(Steering):
    """Scheduling state shared by the collector thread and the controller.

    The contract with the controller (any engine's collector class that keeps it can
    be dropped in):

    * constructor ``(tracker, delay, recorder)``; :meth:`start`, :meth:`wake`,
      :meth:`join`, :meth:`reset_after_fork`.
    * The controller writes ``tracker``, ``delay`` and ``stopped`` as plain
      attributes, and pauses through :meth:`pause` / :meth:`resume` (``paused`` is
      the nesting depth, read-only); then it calls :meth:`wake`.  No lock is shared:
      each write is one atomic store (or one list append/pop, for the pause depth),
      and the collector reads each value at the top of each turn of its loop.  So a
      controller message can run anywhere -- in any thread, or in a signal handler
      that interrupted another message, or the collector's own code on the main
      thread -- without ever waiting for a lock its own thread holds.
    * The collector is the recorder's only writer; readers read the recorder
      without a lock (see :mod:`sampler.recorder`).
    * Statistics (``ticks``, ``late_ticks``, ``missed_ticks``, ``errors``,
      ``error_count``, ``collector_cpu``) are written by the collector thread only.
    """

    def __init__(self, tracker: Tracker, delay: float, recorder: Recorder) -> None:
        super().__init__(tracker, delay, recorder)
        # statistics (written by the collector thread only)
        self.ticks = 0
        self.late_ticks = 0
        self.missed_ticks = 0
        self._final_cpu: Optional[float] = None
        self._clock: Optional[int] = None

    # -- controller side -------------------------------------------------------
    @property
    def collector_cpu(self) -> float:
        """CPU seconds the collector thread has used, read from outside it (reading
        it on every tick would add a system call to the hot path)."""
        if self._final_cpu is not None:
            return self._final_cpu
        cpu = read_cpu(self._clock)
        return cpu if cpu is not None else 0.0

    def start(self) -> None:
        self.ident = realthreads.start_new_thread(self._main, ())

    def wake(self) -> None:
        self._wake_thread()

    def reset_after_fork(self) -> None:
        """In a forked child the thread is gone and its locks may be held forever."""
        self._fresh_locks()
        self._done.release()  # nothing to wait for
        self.stopped = True
        if self._final_cpu is None:
            self._final_cpu = 0.0  # the parent's collector cannot be read from here
        self.recorder.lock = realthreads.allocate_rlock()
        self.recorder.repair()

    # -- the thread ------------------------------------------------------------
    def _main(self) -> None:
        collector_idents.add(realthreads.get_ident())
        self._clock = thread_clock_id(realthreads.get_native_id(), realthreads.get_ident())
        try:
            self._loop()
        except BaseException:  # never let anything reach the program
            self._record_error()
        finally:
            collector_idents.discard(realthreads.get_ident())
            self._final_cpu = time.thread_time()
            self._ended()

    def _loop(self) -> None:
        # slot: where the current slot of `delay` begins (None: a new run of ticks,
        # its first tick at once); deadline: the tick's point in it, drawn
        slot: Optional[float] = None
        deadline = 0.0
        offset = random.Random().random  # (the point in each slot, see tick_offset)
        perf_counter = time.perf_counter
        while True:
            if self.stopped:
                return
            if self._pauses:
                self._wake.acquire()
                slot = None
                continue
            delay, tracker = self.delay, self.tracker
            now = perf_counter()
            if slot is None:
                slot = deadline = now
            elif now < deadline:
                wait = deadline - now
                if wait <= _SHORT_WAIT:
                    # Cheaper than a lock wait on these machines (measured: 20 vs
                    # 30 us of CPU per wake-up at 1 ms); a pause or stop is seen at
                    # the next deadline, at most _SHORT_WAIT later.
                    realthreads.sleep(wait)
                else:
                    self._wake.acquire(timeout=wait)
                continue
            lateness = now - deadline
            if delay > 0:
                if lateness > delay / 2:
                    self.late_ticks += 1
                if lateness >= delay:
                    skipped = int(lateness // delay)
                    self.missed_ticks += skipped
                    slot += skipped * delay
            self._tick(tracker, now)
            self.ticks += 1
            slot += delay
            deadline = slot + delay * offset() if delay > 0 else slot
            if delay <= 0:
                realthreads.sleep(0)  # let the program run between back-to-back ticks

    def _tick(self, tracker: Tracker, now: float) -> None:
        """One pass: the frames of every thread, the targets among them (cached by
        the tracker), one walk each (mostly a cache hit, see the recorder).  No lock:
        this thread is the recorder's only writer.  Frames are dropped when the tick
        ends, but the top frame of each sampled context, which the recorder keeps
        until that context's next sample."""
        recorder = self.recorder
        try:
            frames = sys._current_frames()
            targets = tracker.targets(frames)
            del frames
            # The collections are filed by the recorder once it has read the threads'
            # CPU clocks, before their samples (see Recorder.record_tick).
            if self.shadow is not None:
                recorder.record_tick_shadow(targets, now, self.shadow, gc_watch=self.gc_watch)
            else:
                recorder.record_tick(targets, now, gc_watch=self.gc_watch)
            if recorder.targets_stale:
                recorder.targets_stale = False
                tracker.invalidate()
            if self.ticks % 256 == 255:
                recorder.forget_dead({t.key for t, _ in targets})
            del targets
        except Exception:
            self._record_error()
            recorder.repair()
