"""The recorder: the collector's side of the snapshot store.

The collector calls :meth:`Recorder.record_tick` with the tick's targets; it interns
each stack as ``(code object, instruction offset)`` pairs (reading ``f_lineno`` costs
about twice as much as walking the frame, so lines are resolved later, off the hot
path) and appends one row to compact columns.  :meth:`Recorder.snapshot` freezes a
consistent copy into a :class:`~sampler.snapshot.Snapshots`, resolving lines then.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from types import CodeType, FrameType
from typing import Any, Callable, Hashable, Optional, Sequence

from . import realthreads
from .clocks import read_cpu, thread_clock_id
from .marks import frame_marks
from .snapshot import OVERFLOW, Frame, RunInfo, Snapshots, ThreadInfo
from .tracking import Target

_MAX_DELTA = OVERFLOW - 1
clock_gettime = getattr(time, "clock_gettime", None)


class _Context:
    """Per thread/greenlet state between ticks."""

    __slots__ = ("id", "wall_us", "cpu_us", "clock", "running", "kind", "ident")

    def __init__(self, cid: int, wall_us: int, cpu_us: int, clock: Optional[int],
                 kind: str, ident: Optional[int]) -> None:
        self.id = cid
        self.wall_us = wall_us
        self.cpu_us = cpu_us
        self.clock = clock  # the CPU clock id of the OS thread it runs in
        self.running = True
        self.kind = kind
        self.ident = ident


def _line_of(code: CodeType, lasti: int) -> Optional[int]:
    if lasti < 0:
        return code.co_firstlineno
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return None


def clock_for_target(target: Target) -> Optional[int]:
    native_id = target.native_id
    if native_id is None and target.ident is not None:
        # a greenlet, or a thread without a Thread object: find its OS thread
        owner = getattr(threading, "_active", {}).get(target.ident)
        native_id = getattr(owner, "native_id", None)
        if native_id is None and target.ident == realthreads.get_ident():
            native_id = realthreads.get_native_id()
    return thread_clock_id(native_id, target.ident)


class Recorder:
    """Interned frames and stacks plus the sample columns of one sampler run."""

    def __init__(self, custom_keys: Sequence[Any], start: float) -> None:
        self.lock = realthreads.allocate_lock()
        self.custom_keys = tuple(custom_keys)
        self._key_index = {k: i for i, k in enumerate(self.custom_keys)}
        self.start = start  # perf_counter() at the start of the run
        # interning
        self._frame_ids: dict[tuple[CodeType, int], int] = {}
        self._raw_frames: list[tuple[CodeType, int]] = []
        self._resolved: list[Frame] = []
        self._stack_ids: dict[tuple, int] = {}
        self._trie: dict[tuple[int, int], int] = {}
        self.stack_frame = array("I", [0])
        self.stack_parent = array("I", [0])
        self._mark_ids: dict[tuple, int] = {(): 0}
        self._mark_sets: list[tuple] = [()]
        # contexts and samples
        self._contexts: dict[Hashable, _Context] = {}
        self.threads: list[ThreadInfo] = []
        self.sample_thread = array("I")
        self.sample_stack = array("I")
        self.sample_wall = array("I")
        self.sample_cpu = array("I")
        self.sample_marks: Optional[array] = array("I") if self.custom_keys else None
        self.wall_overflow: dict[int, int] = {}
        self.cpu_overflow: dict[int, int] = {}
        self.torn_samples = 0

    # -- hot path --------------------------------------------------------------
    def record_tick(self, targets: list[tuple[Target, Optional[FrameType]]], now: float,
                    current_frames: Callable[[], dict] = sys._current_frames) -> None:
        """Append one sample per running target (called with ``self.lock`` held).

        ``now`` is when the collector took the GIL for this tick.  The GIL can change hands while the collector walks a stack, and the thread
        walked may then move on, its frames returning and dropping their marks. So
        after the walks, each thread must still be in the frame its walk started
        from (then every caller read was live throughout, and stack and marks agree);
        a thread that moved is walked again from where it is now, twice at most, and
        otherwise counted in ``torn_samples`` instead of being recorded.
        """
        wall_us = int((now - self.start) * 1e6)
        contexts = self._contexts
        walked = []
        for target, frame in targets:
            ctx = contexts.get(target.key)
            if ctx is None:
                clock = clock_for_target(target)
                if clock is None and target.native_id is not None:
                    continue  # exited just now
                ctx = self._new_context(target, clock, wall_us)
            elif ctx.clock is None and target.ident is not None:
                # a greenlet first seen switched out, before its thread was known
                ctx.clock = clock_for_target(target)
            if frame is None:
                # A greenlet that is not running: close its interval once.
                if ctx.running:
                    cpu = read_cpu(ctx.clock)
                    if cpu is not None:
                        self._append(ctx, 0, wall_us, int(cpu * 1e6), 0)
                    ctx.running = False
                continue
            if ctx.clock is None:
                cpu_us = ctx.cpu_us
            else:
                try:
                    cpu_us = int(clock_gettime(ctx.clock) * 1e6)
                except OSError:
                    continue  # the thread has exited
            walked.append((target, ctx, cpu_us, frame) + self._walk(frame))
        if walked and time.perf_counter() - now < sys.getswitchinterval() / 2:
            # No other thread can have run: CPython only takes the GIL from a thread
            # that has held it for a whole switch interval (and the collector gives
            # it up nowhere on this path), so every walk saw a still picture.
            for target, ctx, cpu_us, frame, tkey, marks in walked:
                if not self._store(ctx, tkey, frame, marks, wall_us, cpu_us):
                    self.torn_samples += 1
            return
        for attempt in range(3):
            if not walked:
                return
            fresh = current_frames()
            again = []
            for target, ctx, cpu_us, frame, tkey, marks in walked:
                now_at = fresh.get(target.ident)
                if now_at is frame and self._store(ctx, tkey, frame, marks, wall_us, cpu_us):
                    continue
                if target.kind == "thread" and now_at is not None and attempt < 2:
                    again.append((target, ctx, cpu_us, now_at) + self._walk(now_at))
                else:
                    self.torn_samples += 1
            walked = again

    def _walk(self, frame: FrameType) -> tuple[tuple, list]:
        """The stack key (code ids and offsets, innermost first) and the marks."""
        key: list[Any] = []
        append = key.append
        marks: list[tuple] = []
        want_marks = self.sample_marks is not None
        f: Optional[FrameType] = frame
        while f is not None:
            # ids, not code objects: hashing a code object is slow, and every id in
            # a stored key belongs to a code object kept alive in _raw_frames.
            append(id(f.f_code))
            append(f.f_lasti)
            if want_marks:
                entries = frame_marks.get(f)
                if entries:
                    marks.extend(self._mark_entry(k, v) for k, v in reversed(entries)
                                 if k in self._key_index)
            f = f.f_back
        return tuple(key), marks

    def _store(self, ctx: _Context, tkey: tuple, frame: FrameType, marks: list,
               wall_us: int, cpu_us: int) -> bool:
        sid = self._stack_ids.get(tkey)
        if sid is None:
            sid = self._intern_stack(tkey, frame)
            if sid is None:
                return False
        mid = 0
        if marks:
            mset = tuple(marks)
            mid = self._mark_ids.get(mset, -1)
            if mid < 0:
                mid = self._mark_ids[mset] = len(self._mark_sets)
                self._mark_sets.append(mset)
        ctx.running = True
        self._append(ctx, sid, wall_us, cpu_us, mid)
        return True

    def _append(self, ctx: _Context, sid: int, wall_us: int, cpu_us: int, mid: int) -> None:
        index = len(self.sample_thread)
        dw = wall_us - ctx.wall_us
        dc = cpu_us - ctx.cpu_us
        if dc < 0:  # a clock that went back (should not happen): never store a negative
            dc = 0
            cpu_us = ctx.cpu_us
        if dw < 0:
            dw = 0
            wall_us = ctx.wall_us
        ctx.wall_us = wall_us
        ctx.cpu_us = cpu_us
        if dw > _MAX_DELTA:
            self.wall_overflow[index] = dw
            dw = OVERFLOW
        if dc > _MAX_DELTA:
            self.cpu_overflow[index] = dc
            dc = OVERFLOW
        # Columns are appended in one order; snapshot() trims to the shortest.
        self.sample_stack.append(sid)
        self.sample_wall.append(dw)
        self.sample_cpu.append(dc)
        if self.sample_marks is not None:
            self.sample_marks.append(mid)
        self.sample_thread.append(ctx.id)

    # -- entry points for other engines (frames already resolved) -------------------
    @property
    def key_index(self) -> dict:
        """Custom key -> its position in a mark vector."""
        return self._key_index

    def stack_id(self, frames: Sequence[Frame]) -> int:
        """Intern a stack of resolved frames, outermost first; 0 for the empty stack."""
        frame_ids = self._frame_ids
        sid = 0
        for frame in frames:
            fid = frame_ids.get(frame)  # type: ignore[call-overload]
            if fid is None:
                fid = len(self._raw_frames)
                self._raw_frames.append(frame)  # type: ignore[arg-type]
                frame_ids[frame] = fid  # type: ignore[index]
            child = self._trie.get((sid, fid))
            if child is None:
                child = len(self.stack_frame)
                self.stack_parent.append(sid)
                self.stack_frame.append(fid)
                self._trie[(sid, fid)] = child
            sid = child
        return sid

    def context(self, target: Target, clock: Optional[int], wall_us: int,
                cpu_us: Optional[int] = None) -> _Context:
        """The context of ``target``, created at ``wall_us`` (and ``cpu_us``) if new."""
        ctx = self._contexts.get(target.key)
        if ctx is None:
            ctx = self._new_context(target, clock, wall_us, cpu_us)
        return ctx

    def append_sample(self, ctx: _Context, stack_id: int, wall_us: int, cpu_us: int,
                      mark_set: int = 0) -> None:
        """Record one sample of ``ctx`` (a non-empty stack means it is running)."""
        if stack_id:
            ctx.running = True
        self._append(ctx, stack_id, wall_us, cpu_us, mark_set)

    def mark_set_id(self, marks: tuple) -> int:
        """Intern a tuple of mark vectors (innermost extent first); 0 for none."""
        if not marks:
            return 0
        mid = self._mark_ids.get(marks, -1)
        if mid < 0:
            mid = self._mark_ids[marks] = len(self._mark_sets)
            self._mark_sets.append(marks)
        return mid

    def _mark_entry(self, key: Hashable, value: Any) -> tuple:
        entry: list[Any] = [None] * len(self.custom_keys)
        entry[self._key_index[key]] = value
        return tuple(entry)

    def _new_context(self, target: Target, clock: Optional[int], wall_us: int,
                     cpu_us: Optional[int] = None) -> _Context:
        if cpu_us is None:
            cpu = read_cpu(clock)
            cpu_us = int(cpu * 1e6) if cpu is not None else 0
        cid = len(self.threads)
        self.threads.append(ThreadInfo(cid, target.name, target.native_id, target.kind, 0,
                                       wall_us / 1e6, cpu_us / 1e6))
        ctx = _Context(cid, wall_us, cpu_us, clock, target.kind, target.ident)
        self._contexts[target.key] = ctx
        return ctx

    def _intern_stack(self, tkey: tuple, frame: FrameType) -> Optional[int]:
        """Intern a stack not seen before (the slow path), or return None when the
        thread moved since ``tkey`` was read.

        The walk is done again to get the code objects themselves.
        """
        pairs = []
        f: Optional[FrameType] = frame
        while f is not None:
            pairs.append((f.f_code, f.f_lasti))
            f = f.f_back
        key = tuple(x for code, lasti in pairs for x in (id(code), lasti))
        if key != tkey:
            return None
        frame_ids = self._frame_ids
        sid = 0
        for pair in reversed(pairs):  # outermost first
            fid = frame_ids.get(pair)
            if fid is None:
                fid = len(self._raw_frames)
                self._raw_frames.append(pair)
                frame_ids[pair] = fid
            child = self._trie.get((sid, fid))
            if child is None:
                child = len(self.stack_frame)
                self.stack_parent.append(sid)
                self.stack_frame.append(fid)
                self._trie[(sid, fid)] = child
            sid = child
        self._stack_ids[key] = sid
        return sid

    def forget_dead(self, live_keys: set) -> None:
        """Drop per-context state of contexts that have ended, so that a long run
        seeing thousands of short threads does not keep their objects alive.  A
        context that is merely untracked for a while keeps its id."""
        for key in [k for k in self._contexts if k not in live_keys and _has_ended(k)]:
            del self._contexts[key]

    def repair(self) -> None:
        """Trim the columns to a common length after an interrupted append."""
        cols = [self.sample_thread, self.sample_stack, self.sample_wall, self.sample_cpu]
        if self.sample_marks is not None:
            cols.append(self.sample_marks)
        n = min(len(c) for c in cols)
        for c in cols:
            del c[n:]
        for ov in (self.wall_overflow, self.cpu_overflow):
            for i in [i for i in ov if i >= n]:
                del ov[i]
        n_stacks = min(len(self.stack_frame), len(self.stack_parent))
        del self.stack_frame[n_stacks:]
        del self.stack_parent[n_stacks:]

    # -- freezing ----------------------------------------------------------------
    def _resolve_frames(self) -> list[Frame]:
        raw = self._raw_frames
        resolved = self._resolved
        for item in raw[len(resolved):]:
            if isinstance(item, Frame):  # resolved by the engine already
                resolved.append(item)
                continue
            code, lasti = item
            resolved.append(Frame(getattr(code, "co_qualname", code.co_name), code.co_filename,
                                  code.co_firstlineno, _line_of(code, lasti)))
        return resolved

    def snapshot(self, run: RunInfo) -> Snapshots:
        """A frozen, consistent copy (call with ``self.lock`` held)."""
        n = min(len(self.sample_thread), len(self.sample_stack), len(self.sample_wall),
                len(self.sample_cpu),
                len(self.sample_marks) if self.sample_marks is not None else len(self.sample_cpu))
        n_stacks = min(len(self.stack_frame), len(self.stack_parent))
        resolved = self._resolve_frames()
        # Several instruction offsets can fall on one line: keep one Frame per value.
        canonical: dict[Frame, int] = {}
        frame_map = [canonical.setdefault(f, len(canonical)) for f in resolved]
        frames = list(canonical)
        stack_frame = array("I", (frame_map[f] if i else 0
                                  for i, f in enumerate(self.stack_frame[:n_stacks])))
        return Snapshots(
            frames=frames,
            stack_frame=stack_frame,
            stack_parent=self.stack_parent[:n_stacks],
            threads=self.threads[:],
            sample_thread=self.sample_thread[:n],
            sample_stack=self.sample_stack[:n],
            sample_wall=self.sample_wall[:n],
            sample_cpu=self.sample_cpu[:n],
            sample_marks=None if self.sample_marks is None else self.sample_marks[:n],
            wall_overflow={i: v for i, v in self.wall_overflow.items() if i < n},
            cpu_overflow={i: v for i, v in self.cpu_overflow.items() if i < n},
            mark_sets=self._mark_sets[:],
            custom_keys=self.custom_keys,
            runs=[run],
        )

    def custom_snapshots(self) -> list[tuple]:
        """Racket's get-custom-snapshots: per sample, its mark vectors, oldest first."""
        if self.sample_marks is None:
            return [() for _ in range(len(self.sample_thread))]
        sets = self._mark_sets
        n = min(len(self.sample_thread), len(self.sample_marks))
        return [sets[m] for m in self.sample_marks[:n]]


def _has_ended(key: Hashable) -> bool:
    if isinstance(key, threading.Thread):
        return not key.is_alive()
    if isinstance(key, tuple):
        return True
    return bool(getattr(key, "dead", True))
