"""The native engine: a C collector thread steered by the same controller.

The C thread (:mod:`sampler._native`) takes the samples without the GIL. This module
is its Python half, with the interface of :class:`sampler.collector.Collector`, so
the controller cannot tell the two apart. A small Python thread, the *feeder*, wakes
every :data:`REFRESH` seconds, takes the GIL once, and:

* tells the C thread which OS threads to read (the tracked threads, and the threads
  hosting tracked greenlets), with each one's thread state and CPU clock;
* drains the samples taken since, resolving code addresses to functions and lines
  while it holds the GIL (a code object is never kept: see :func:`_Resolver.frame`),
  and files each sample under its thread, and under the tracked greenlet whose
  outermost frame it shows.

A thread is thus first sampled up to ``REFRESH`` seconds after it starts (threads
joining a :class:`~sampler.groups.ThreadGroup` or appearing under ``ALL_THREADS``).
"""

from __future__ import annotations

import struct
import sys
import time
import traceback
from typing import Any, Optional

from . import _native, realthreads
from .clocks import read_cpu, thread_clock_id
from .marks import mark_entries
from .recorder import Recorder, clock_for_target
from .snapshot import Frame
from .tracking import Target, Tracker, collector_idents

REFRESH = 0.02
"""Seconds between the feeder's turns (each takes the GIL once)."""

MAX_KEY_CACHE_BYTES = 16 << 20
"""Bytes of raw stacks remembered to skip re-interning a stack seen before."""

MAX_KEPT_ERRORS = 10
_ENTRY = struct.Struct(_native.ENTRY_FORMAT)
_UNKNOWN = Frame("<unknown code>", "<unknown>", 0, None)
_TRUNCATED = Frame("<truncated>", "<stackshot>", 0, None)


class _Resolver:
    """Turns sampled code addresses into :class:`Frame` values, under the GIL.

    An address is resolved only through ``_native.code_at``, which hands back the
    object there only if it is still a live code object with the fingerprint taken
    when the sample was read; the code object is dropped at once (a profile keeps
    names and lines, never code, so a program that keeps making code keeps none of
    it alive). An address whose code was freed before it could be resolved becomes
    ``<unknown code>`` and is counted.
    """

    def __init__(self) -> None:
        self._frames: dict[tuple[int, int, int], Frame] = {}
        self.unresolved = 0

    def frame(self, code_addr: int, lasti: int, fingerprint: int) -> Frame:
        key = (code_addr, fingerprint, lasti)
        found = self._frames.get(key)
        if found is not None:
            return found
        code = _native.code_at(code_addr, fingerprint)
        if code is None:
            self.unresolved += 1
            return _UNKNOWN  # not cached: the next drain may still find it live
        found = Frame(getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno,
                      _line_of(code, lasti))
        del code
        if len(self._frames) > 1_000_000:
            self._frames.clear()
        self._frames[key] = found
        return found


def _line_of(code: Any, lasti: int) -> Optional[int]:
    if lasti < 0:
        return code.co_firstlineno
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return None


class _Slot:
    """One OS thread the C thread reads, and what its samples are filed under."""

    __slots__ = ("ident", "thread", "greenlets", "last_stack", "last_base", "last_marks")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.thread: Optional[Target] = None  # the thread itself, when tracked
        self.greenlets: list[tuple[Target, int]] = []  # (greenlet, its outermost frame)
        self.last_stack = 0
        self.last_base = 0
        self.last_marks = 0


class NativeCollector:
    """The collector interface of :class:`~sampler.collector.Collector`, natively."""

    engine_name = "native"
    needs_switch_interval = False  # the C thread never waits for the GIL

    def __init__(self, tracker: Tracker, delay: float, recorder: Recorder) -> None:
        self.state_lock = realthreads.allocate_lock()
        self._wake = realthreads.allocate_lock()
        self._wake.acquire()
        self._done = realthreads.allocate_lock()
        self._done.acquire()
        self.tracker = tracker
        self.delay = delay
        self.recorder = recorder
        self.paused = 0
        self.stopped = False
        self.ident: Optional[int] = None
        self.error_count = 0
        self.errors: list[str] = []
        self._engine = _native.Engine(delay, marks=bool(recorder.custom_keys))
        self._resolver = _Resolver()
        self._slots: dict[int, _Slot] = {}  # slot number -> slot (this turn's and the last)
        self._previous: set[int] = set()
        self._slot_of: dict[int, int] = {}  # ident -> slot number
        self._next_slot = 0
        self._keys: dict[bytes, int] = {}
        self._keys_bytes = 0
        self._greenlet_bases: dict[Any, int] = {}
        self._applied: tuple = (None, None)
        self._tracker_applied: Optional[Tracker] = None
        self._stats_after_stop: Optional[dict] = None
        self._forked = False

    # -- the collector interface --------------------------------------------------
    def start(self) -> None:
        self._refresh_targets()
        self._engine.start()
        self.ident = realthreads.start_new_thread(self._main, ())

    def wake(self) -> None:
        """Apply the controller's changes now (pause, resume, delay, tracked set)."""
        with self.state_lock:
            state = (self.delay, bool(self.paused or self.stopped))
            tracker = self.tracker
        if self._forked:
            return
        if tracker is not self._tracker_applied and not state[1]:
            self._refresh_targets()  # set-tracked! takes effect now, not at the next turn
        if state != self._applied:
            self._engine.set_state(*state)
            self._applied = state
        try:
            self._wake.release()
        except RuntimeError:
            pass

    def join(self, timeout: float) -> bool:
        if self._done.acquire(timeout=timeout):
            self._done.release()
            return True
        return False

    def flush(self) -> None:
        """File every sample taken so far (the controller calls this before a snapshot)."""
        if not self._forked:
            self._drain()

    def reset_after_fork(self) -> None:
        """In a forked child neither thread exists: keep what was filed, stop for good."""
        self._forked = True
        self.state_lock = realthreads.allocate_lock()
        self._wake = realthreads.allocate_lock()
        self._wake.acquire()
        self._done = realthreads.allocate_lock()
        self.stopped = True
        self._engine.forget_after_fork()
        self._stats_after_stop = dict(self._stats(), collector_cpu=0.0)
        self.recorder.lock = realthreads.allocate_lock()
        self.recorder.repair()

    def _stats(self) -> dict:
        if self._stats_after_stop is not None:
            return self._stats_after_stop
        return self._engine.stats()

    @property
    def ticks(self) -> int:
        return self._stats()["ticks"]

    @property
    def late_ticks(self) -> int:
        return self._stats()["late_ticks"]

    @property
    def missed_ticks(self) -> int:
        return self._stats()["missed_ticks"]

    @property
    def collector_cpu(self) -> float:
        """CPU seconds of the C thread and the feeder together: all the sampler costs."""
        feeder = read_cpu(self._feeder_clock) if getattr(self, "_feeder_clock", None) else None
        return self._stats()["collector_cpu"] + (feeder or self._feeder_final)

    _feeder_final = 0.0

    def extra_info(self) -> dict:
        """What only this engine knows, for ``RunInfo.extra``."""
        stats = self._stats()
        return {
            "lost_samples": stats["lost_samples"],
            "failed_reads": stats["failed_reads"],
            "unresolved_frames": self._resolver.unresolved,
        }

    @property
    def torn_samples(self) -> int:
        return self._stats()["torn_samples"]

    # -- the feeder thread ---------------------------------------------------------
    def _main(self) -> None:
        collector_idents.add(realthreads.get_ident())
        self._feeder_clock = thread_clock_id(realthreads.get_native_id(), realthreads.get_ident())
        try:
            while True:
                with self.state_lock:
                    stopped, paused = self.stopped, self.paused
                if stopped:
                    break
                if paused:
                    self._wake.acquire()
                    continue
                self._wake.acquire(timeout=REFRESH)
                try:
                    self._refresh_targets()
                    self._drain()
                except Exception:
                    self._record_error()
        except BaseException:  # never let anything reach the program
            self._record_error()
        finally:
            try:
                self._engine.stop()
                self._stats_after_stop = self._engine.stats()
                self._drain()
            except BaseException:
                self._record_error()
            collector_idents.discard(realthreads.get_ident())
            self._feeder_final = time.thread_time()
            self._feeder_clock = None
            try:
                self._done.release()
            except RuntimeError:
                pass

    def _record_error(self) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(traceback.format_exc())

    # -- what to read ----------------------------------------------------------------
    def _refresh_targets(self) -> None:
        """Give the C thread the OS threads to read now.

        Runs under the recorder's lock, so that no drain files samples while the
        slots they go to are being changed."""
        with self.state_lock:
            tracker = self.tracker
        with self.recorder.lock:
            self._tracker_applied = tracker
            frames = sys._current_frames()
            pairs = tracker.targets(frames)
            states = _native.thread_states()
            wanted: dict[int, tuple[Optional[Target], list]] = {}
            for target, frame in pairs:
                if target.kind == "greenlet":
                    base = self._greenlet_base(target, frame)
                    if base is None:
                        continue
                    hosts = [target.ident] if target.ident in frames else [
                        i for i in frames if i not in collector_idents]
                    for ident in hosts:
                        wanted.setdefault(ident, (None, []))[1].append((target, base))
                elif target.ident in states:
                    wanted[target.ident] = (target, wanted.get(target.ident, (None, []))[1])
            del frames, pairs
            native = []
            current: dict[int, _Slot] = {}
            for ident, (thread, greenlets) in wanted.items():
                tstate, native_id = states.get(ident, (0, 0))
                if not tstate:
                    continue
                number = self._slot_of.get(ident)
                if number is None:
                    number = self._slot_of[ident] = self._next_slot
                    self._next_slot += 1
                    self._slots[number] = _Slot(ident)
                slot = current[number] = self._slots[number]
                slot.thread, slot.greenlets = thread, greenlets
                native.append((number, tstate, ident, self._clock(slot, native_id)))
            # Samples already buffered may name a slot no longer wanted: keep it one
            # more turn, then forget it (the thread has gone or is no longer tracked).
            for number in [n for n in self._slots if n not in current and n not in self._previous]:
                del self._slots[number]
            self._previous = set(current)
            self._slot_of = {ident: n for ident, n in self._slot_of.items() if n in self._slots}
            self._engine.set_targets(native)

    def _clock(self, slot: _Slot, native_id: int) -> Optional[int]:
        if slot.ident == realthreads.get_ident():
            return thread_clock_id(realthreads.get_native_id(), slot.ident)
        if slot.thread is not None:
            clock = clock_for_target(slot.thread)
            if clock is not None:
                return clock
        return thread_clock_id(native_id or None, slot.ident)

    def _greenlet_base(self, target: Target, frame: Any) -> Optional[int]:
        """The address of the greenlet's outermost frame (fixed for its life)."""
        g = target.key
        base = self._greenlet_bases.get(g)
        if base is None:
            bottom = frame if frame is not None else getattr(g, "gr_frame", None)
            if bottom is None:
                return None
            while bottom.f_back is not None:
                bottom = bottom.f_back
            base = self._greenlet_bases[g] = _native.frame_address(bottom)
        return base

    # -- filing the samples -------------------------------------------------------------
    def _drain(self) -> None:
        recorder = self.recorder
        start_us = recorder.start * 1e6
        with recorder.lock:  # held across the drain: samples are filed in order
            samples = self._engine.drain()
            for number, flags, wall_ns, cpu_ns, base, raw, marks in samples:
                slot = self._slots.get(number)
                if slot is None:
                    continue
                wall_us = int(wall_ns / 1000 - start_us)
                cpu_us = cpu_ns // 1000
                if raw is None:  # the thread did not run since its last sample
                    sid, base, mid = slot.last_stack, slot.last_base, slot.last_marks
                else:
                    sid = self._stack_id(raw, flags)
                    mid = self._mark_set(marks) if marks else 0
                    slot.last_stack, slot.last_base, slot.last_marks = sid, base, mid
                if slot.thread is not None:
                    ctx = recorder.context(slot.thread, None, wall_us, cpu_us)
                    recorder.append_sample(ctx, sid, wall_us, cpu_us, mid)
                for target, gbase in slot.greenlets:
                    ctx = recorder.context(target, None, wall_us, cpu_us)
                    if gbase == base and sid:
                        recorder.append_sample(ctx, sid, wall_us, cpu_us, mid)
                    elif ctx.running and not getattr(target.key, "dead", False):
                        # switched out: close its interval once
                        recorder.append_sample(ctx, 0, wall_us, cpu_us, 0)
                        ctx.running = False

    def _stack_id(self, raw: bytes, flags: int) -> int:
        sid = self._keys.get(raw)
        if sid is not None:
            return sid
        frame = self._resolver.frame
        frames = [frame(code, lasti, fp) for code, lasti, fp in _ENTRY.iter_unpack(raw)]
        frames.reverse()  # outermost first
        if flags & _native.TRUNCATED:
            frames.insert(0, _TRUNCATED)
        sid = self.recorder.stack_id(frames)
        if _UNKNOWN in frames:
            return sid  # resolve again next time: the code may be found live then
        if self._keys_bytes + len(raw) > MAX_KEY_CACHE_BYTES:
            self._keys.clear()
            self._keys_bytes = 0
        self._keys[raw] = sid
        self._keys_bytes += len(raw)
        return sid

    def _mark_set(self, entries: tuple) -> int:
        recorder = self.recorder
        index = recorder.key_index
        vectors = []
        for key, value in mark_entries(entries):
            i = index.get(key)
            if i is not None:
                vector: list[Any] = [None] * len(index)
                vector[i] = value
                vectors.append(tuple(vector))
        return recorder.mark_set_id(tuple(vectors))
