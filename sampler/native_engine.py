"""The native engine: a C collector thread steered by the same controller.

The C thread (:mod:`sampler._native`) takes the samples without the GIL. This module
is its Python half, with the interface of :class:`sampler.collector.Collector`, so
the controller cannot tell the two apart. A small Python thread, the *feeder*, wakes
every :data:`REFRESH_STATIC` seconds (:data:`REFRESH` while greenlets are tracked), or
sooner when the C thread sees a new thread or a buffer half full, takes the GIL once,
and:

* tells the C thread which OS threads to read (the tracked threads, and the threads
  hosting tracked greenlets), with each one's thread state and CPU clock;
* drains the samples taken since, resolving code addresses to functions and lines
  while it holds the GIL (a code object is never kept: see :func:`_Resolver.frame`),
  and files each sample under its thread, and under the tracked greenlet whose
  outermost frame it shows.

A thread started with :mod:`threading` announces its start (sampler.groups) and is
read from its first instruction; one started otherwise (``_thread``, C code) is seen
by the C thread at its next tick once it runs Python, which wakes the feeder to look
it up: it is first sampled a tick and a GIL hand-off after it starts, when it
appears under ``ALL_THREADS``.
"""

from __future__ import annotations

import math
import os
import random
import struct
import sys
import threading
import time
import weakref
from bisect import bisect_right
from collections import deque
from operator import itemgetter
from typing import Any, NamedTuple, Optional

from . import _native, realthreads
from .clocks import clock_for, native_id_of_ident, read_cpu, thread_clock_id
from .greenlets import (HOOK_CODE, at_base, draw_place, greenlet_at, log_turns, switch_log, switches,
                        turn_length)
from .collector import Steering
from .groups import ThreadGroup, change_listeners, install_start_hook, notify_started, start_listeners
from .marks import filed_retired, hold_retired, mark_entries, release_retired, retirements
from .recorder import Recorder
from .snapshot import Frame
from .tracking import Target, Tracker, collector_idents, thread_target

REFRESH = 0.02
"""Seconds between the feeder's turns (each takes the GIL once) while greenlets are
tracked: where each one runs changes as it switches, unseen by the C thread."""

REFRESH_SWITCHING = 0.05
"""Seconds between the feeder's turns while a thread it reads switches greenlets more
than :data:`SWITCHING_RATE` times a second (and no greenlets are tracked: then
:data:`REFRESH`). Its switch log keeps the latest
:data:`sampler.greenlets.LOG_SIZE` switches, and the filing needs the ones since the
thread's last sample filed: a chatty gevent server (``gevent_chatty``, 60,000
switches a second) filled it in 0.27 s, about :data:`REFRESH_STATIC`, and each drain
then filed a quarter second's samples, 25 or so a tick at 1 ms, in one turn with
the GIL: tens of milliseconds in which the program could not run. Every 50 ms the
log reaches back as far as 330,000 switches a second need, and a turn holds the GIL
a fifth as long."""

SWITCHING_RATE = 16384
"""Switches a second of a thread (by its log's entries copied at the last turn) above
which the feeder turns come every :data:`REFRESH_SWITCHING`: then a quarter of its
log lasts :data:`REFRESH_STATIC`. (Every 50 ms for any thread that switches, the
benchmark's ``gevent_server``, 2,200 switches a second, filed 26.5 ms a second at
5 ms against 19.6: the turns' own cost, five times as many.)"""

PAUSED_FILING = 1.0
"""Seconds between the feeder's turns while paused, when marks are read: each files
what the engine took before the pause, so that the ids of extents that end meanwhile
are not kept for it (sampler.marks.hold_retired)."""

STARTING = 0.002
"""Seconds to the next turn after one that found a thread starting: a thread state
without frames, first seen less than :data:`STARTING_FOR` seconds ago. The C thread
wakes the feeder as the newest thread state, not read yet, gets its first frame;
this covers a thread that is not the newest any more by then."""

STARTING_FOR = 0.02
"""Seconds a thread state without frames counts as starting (after that, a C thread
between its calls into Python, say)."""

REFRESH_STATIC = 0.25
"""Seconds between turns otherwise: the set of threads to read changes only when a
thread starts, which announces itself or is seen by the C thread (it wakes the
feeder), or by a message or a group's ``add`` (which wake it too), and a buffer half
full wakes it too. Each turn
costs a CPU-bound program two GIL hand-offs besides the feeder's work. Measured
(3.11, CPU-bound threads under ``ALL_THREADS``, the time in which none made progress
against a run without a profiler, at 5 ms): one thread lost 1.3-1.6% of its time
with a turn every 20 ms, 0.35-0.38% every 100 ms, 0.25-0.29% with this period
(0.17-0.28% every 500 ms); four threads taking turns with the GIL 1.14-1.24% every
100 ms, 0.90-1.05% with this period. What is left with four is mostly the C thread
waking on a core where one of them runs (its short slice: ``ask_short_slice`` in
engine.c): tracking only the idle main thread, they lost 0.4-0.6%."""

MAX_KEY_CACHE_BYTES = 128 << 10
"""Bytes of raw stacks remembered to skip re-interning a stack seen before."""

MAX_FRAME_IDS = 8192
"""Instruction places (code object and offset) remembered with their frame ids, then
forgotten all at once (about 1.5 MiB at most)."""

MAX_KEY_BYTES = 4096
"""A raw stack longer than this (256 frames) is not remembered: deep stacks are
rarely seen twice, and remembering them would cost memory per new stack."""

_ENTRY = struct.Struct(_native.ENTRY_FORMAT)
_logged_at = itemgetter(0)  # a switch log entry's time
RECENT_RUNS = 16  # a thread's latest samples that found it running, kept for _unseen_run
RECENT_PLACES = 8  # a greenlet's latest places seen running, kept for _file_turns
MAX_PLACED_GREENLETS = 256  # greenlets per thread whose places are kept
LIKE_TURN = math.log(1.5)  # turn lengths within this log ratio are alike (draw_place)
MIN_TURN_US = 10
"""A turn between two samples that used less CPU is not filed on its own: it goes
with the sample. (A turn filed is three samples, one of them an idle marker; half
of a gevent server's turns used less, 1.2% of their CPU.)"""
MAX_TURNS = 8
"""Turns between two samples filed one by one; beyond, those in between (all but the
first and the last) one per greenlet where at most this many greenlets ran them,
else in :data:`MERGED_TURNS` runs (``_turns``, ``sampler.greenlets.draw_turns``)."""
MERGED_TURNS = 2
"""Runs that the CPU of turns of more than :data:`MAX_TURNS` greenlets between two
samples is filed in: greenlets drawn in proportion to the CPU each used in them, by
systematic sampling (one that used more than 1/MERGED_TURNS of it is always drawn),
each draw a run of 1/MERGED_TURNS of it. Each greenlet gets what it used, on average,
in a bounded number of runs a tick. Before, one run for each of the eight that used
the most, the rest of the CPU with the sample: twelve greenlets of 20-240 us turns
between samples 5 ms apart, the four smallest 1.0-3.9 points short each, the largest
1.3-2.4 over, 30 samples filed a tick (now 12, and no bias: each greenlet's share
spreads as a binomial's of the draws, 0.4-1.3 points for shares of 1-15% in 2 s of
CPU, half that in 8 s; their total variation distance is 2.1-6.7 points in runs of
2 s, 2.4-4.0 in runs of 4 s); a chatty gevent server (``gevent_chatty``, some
80 turns of 30 greenlets between two samples 1 ms apart) had 26 filed a tick, 129 ms
a second with the GIL held."""
MAX_OUTERMOST_STACKS = 1024  # greenlets' outermost functions interned as stacks (_place_of)
MAX_HELD = 10_000
"""Samples held while their thread is inside a collection (see ``_file``); more
are filed as read (a collection whose finalizers run for more than 10 s at 1 ms)."""
ASLEEP = _native.ASLEEP
ONCPU = _native.ONCPU
PARKED = _native.PARKED
PREEMPTED = _native.PREEMPTED
SAME = _native.SAME
_UNKNOWN = Frame("<unknown code>", "<unknown>", 0, None)
_C_ENTRY = -2  # the "instruction offset" of a C callable's entry on a shadow stack
_TRUNCATED = Frame("<truncated>", "<stackshot>", 0, None)
_HOOK_CODE_ADDRESS = id(HOOK_CODE)  # (the engine reads code objects by address)
_HOOK_FILE = HOOK_CODE.co_filename


class _Resolver:
    """Turns sampled code addresses into :class:`Frame` values.

    It never touches a sampled address: the object there may have been freed since
    the sample. The C thread sends, once per code object it meets (and again when
    another object is met at the same address), a copy of what a profile needs: the
    qualified name, the file, the first line and the line table. Lines are looked up
    in that table through a stand-in code object that has nothing else of the
    original. A profile therefore keeps no code object alive, and a program that
    keeps making code keeps none of its code through the profiler.
    """

    MAX_CODES = 512  # then forget them all; the C thread sends them again as it meets them
    # (a cache, not the profile: the recorder keeps the frames; small, so that a
    # program that keeps making code costs the profiler bounded memory)

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._codes: dict[tuple[int, int], tuple[str, str, int, Any]] = {}
        self._frames: dict[tuple[int, int, int], Frame] = {}
        self.unresolved = 0

    def learn(self, codes: list) -> None:
        """File the code copies of one drain (before its samples)."""
        if len(self._codes) + len(codes) > self.MAX_CODES or len(self._frames) > 2 * self.MAX_CODES:
            self._codes.clear()
            self._frames.clear()
            self._engine.forget_codes()
        for addr, fp, firstlineno, code_bytes, name_kind, name, file_kind, filename, table in codes:
            self._codes[(addr, fp)] = (_text(name, name_kind) or "<unknown>", _text(filename, file_kind),
                                       firstlineno, (code_bytes, table))

    def frame(self, code_addr: int, lasti: int, fingerprint: int) -> Frame:
        key = (code_addr, fingerprint, lasti)
        found = self._frames.get(key)
        if found is not None:
            return found
        code = self._codes.get((code_addr, fingerprint))
        if code is None:
            self.unresolved += 1
            return _UNKNOWN
        name, filename, firstlineno, (code_bytes, table) = code
        lines = _line_table(code_bytes, firstlineno, table) if lasti >= 0 else None
        found = self._frames[key] = Frame(name, filename, firstlineno, _line_of(lines, firstlineno, lasti))
        return found


def _text(raw: bytes, kind: int) -> str:
    """A copied string's characters (1, 2 or 4 bytes each) as text."""
    if kind == 1:
        return raw.decode("latin-1")
    return raw.decode("utf-16-le" if kind == 2 else "utf-32-le", errors="replace")


def _template() -> None:
    pass


_NO_TABLE = {"co_exceptiontable": b""} if sys.version_info >= (3, 11) else {}


def _line_table(code_bytes: int, firstlineno: int, table: bytes) -> Optional[Any]:
    """A stand-in code object carrying a copied line table (for ``co_lines``), made
    when a new instruction offset is to be resolved and dropped after: only the
    table's bytes are kept, so what a profile keeps per function stays small."""
    if not table or code_bytes <= 0 or code_bytes % 2:
        return None
    try:
        return _template.__code__.replace(co_code=bytes(code_bytes), co_linetable=table,
                                          co_firstlineno=firstlineno, **_NO_TABLE)
    except (ValueError, TypeError, OverflowError):
        return None


def _line_of(lines: Optional[Any], firstlineno: int, lasti: int) -> Optional[int]:
    if lasti < 0:
        return firstlineno
    if lines is None:
        return None
    try:
        for start, end, line in lines.co_lines():
            if start <= lasti < end:
                return line
    except (ValueError, SystemError):  # a torn copy of a table
        return None
    return None


def _in_groups(groups: list) -> bool:
    """Whether the calling thread's current group is one of ``groups`` or under one."""
    group = ThreadGroup.current()
    while group is not None:
        if group in groups:
            return True
        group = group.parent
    return False


def _referent(key: Any) -> Any:
    """What a target's key names (targets name threads and greenlets weakly)."""
    return key() if isinstance(key, weakref.ref) else key


SLEEP_PLACES = 8
"""Places (raw stacks) remembered per thread as where it was found asleep: a loop
that waits in a few places (a sleep, a socket read, a queue) keeps them all."""


def _remember(places: dict, raw: bytes, keep: int) -> None:
    """Put ``raw`` last in ``places`` (an insertion-ordered set), dropping the oldest
    beyond ``keep``."""
    places.pop(raw, None)
    places[raw] = None
    if len(places) > keep:
        del places[next(iter(places))]


class _CollectionStart(NamedTuple):
    """A thread's clocks as a collection it was read inside began, and the stack that
    triggered it (its event's pairs: :meth:`NativeCollector._file_gc`)."""

    wall_us: int
    cpu_us: int
    stack: Any


class _Slot:
    """One OS thread the C thread reads, and what its samples are filed under."""

    __slots__ = ("ident", "thread", "greenlets", "last_stack", "last_base", "last_marks", "last_wall_us",
                 "last_cpu_us", "slept_in", "ran", "ran_at", "runs", "switches", "places", "latest", "starts",
                 "last_read", "filed")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.thread: Optional[Target] = None  # the thread itself, when tracked
        self.greenlets: list[tuple[Target, int]] = []  # (greenlet, its outermost frame)
        self.last_stack = 0
        self.last_base = 0
        self.last_marks = 0
        self.last_wall_us = 0
        self.last_cpu_us = 0
        # the walks (raw stacks) the thread was last found asleep in, oldest first
        self.slept_in: dict[bytes, None] = {}
        # (stack, base, marks, greenlet) last seen running
        self.ran: Optional[tuple[int, int, int, Any]] = None
        self.ran_at: Optional[int] = None  # the wall clock of that sample, if it is the last
        # the places it was seen running at its latest such samples, oldest first
        self.runs: deque = deque(maxlen=RECENT_RUNS)
        self.switches = False  # its thread switches greenlets (NativeCollector._switches)
        # greenlet record -> its places seen running lately (_file_turns), for the
        # greenlets seen running latest (at most MAX_PLACED_GREENLETS)
        self.places: dict[Any, list] = {}
        # greenlet record -> where its latest sample found it (running or waiting),
        # for the greenlets found latest (at most MAX_PLACED_GREENLETS)
        self.latest: dict[Any, tuple] = {}
        # greenlet record -> the places its first samples in a turn found it at, by
        # the length of their turns (_remember_start)
        self.starts: dict[Any, dict[int, list]] = {}
        # (frames, base, marks) of its last sample that came with frames: what a
        # SAME sample (the C thread read them again) shows
        self.last_read: Optional[tuple[bytes, int, tuple]] = None
        # a sample of it was filed: the clocks above are that sample's, not zeros
        self.filed = False


def _remember_place(places: dict, rec: Any, place: tuple) -> None:
    """Add ``place`` to greenlet ``rec``'s recent places (``_Slot.places``)."""
    seen = places.get(rec) or []
    seen.append(place)
    if len(seen) > RECENT_PLACES:
        del seen[0]
    _remember_last(places, rec, seen)


def _turn_bucket(turn_us: int) -> int:
    """The bucket of turns about as long as one of ``turn_us`` of CPU: within half
    again (:data:`LIKE_TURN`), on a fixed scale."""
    return int(math.log(max(turn_us, 1)) / LIKE_TURN)


def _remember_start(starts: dict, rec: Any, place: tuple, turn_us: int, weight: int) -> None:
    """Add ``place``, where a sample first found greenlet ``rec`` in a turn of
    ``turn_us`` of CPU, to its starts (``_Slot.starts``), with ``weight``: the CPU
    other greenlets used in that sample's interval. Kept per bucket of turn length
    (:func:`_turn_bucket`), the latest :data:`RECENT_PLACES` of each, with their
    weights' sum: a start is drawn for every turn a sample finds, and drawn this
    way it costs 0.8 us against 5 us for comparing each start's turn length and
    drawing with ``random.choices``."""
    buckets = starts.get(rec) or {}
    bucket = _turn_bucket(turn_us)
    kept = buckets.get(bucket)
    if kept is None:
        kept = buckets[bucket] = [deque(maxlen=RECENT_PLACES), 0]
    if len(kept[0]) == RECENT_PLACES:
        kept[1] -= kept[0][0][1]
    kept[0].append((place, weight))
    kept[1] += weight
    _remember_last(starts, rec, buckets)


def _remember_last(latest: dict, rec: Any, value: Any) -> None:
    """Keep ``value`` as greenlet ``rec``'s in ``latest``, for the greenlets met last
    (at most :data:`MAX_PLACED_GREENLETS`)."""
    latest.pop(rec, None)
    if len(latest) >= MAX_PLACED_GREENLETS:
        del latest[next(iter(latest))]
    latest[rec] = value


def _other_thread_now(target: Target, states: dict) -> bool:
    """Whether the OS thread with ``target``'s ident is no longer the one it named: a
    thread started with ``_thread`` got the ident of one that ended (the tracker's
    cache cannot tell, neither has a ``Thread`` object; the Python engine's recorder
    finds it from the frames). Kept, the target would read the ended thread's clock,
    and the new thread would never be sampled (seen: the second to fifth of five
    such threads started one after another)."""
    if target.kind != "thread" or not target.native_id or target.ident not in states:
        return False
    # (3.10's thread states have no native id: glibc's clock id for the ident says it)
    raw = isinstance(target.key, tuple) and target.key[0] == "ident"
    native_id = states[target.ident][1] or (native_id_of_ident(target.ident) if raw else None)
    return bool(native_id) and native_id != target.native_id


class NativeCollector(Steering):
    """The collector interface of :class:`~sampler.collector.Collector`, natively."""

    engine_name = "native"
    needs_switch_interval = False  # the C thread never waits for the GIL

    def __init__(self, tracker: Tracker, delay: float, recorder: Recorder) -> None:
        super().__init__(tracker, delay, recorder)
        self._engine = _native.Engine(delay, marks=bool(recorder.custom_keys))
        self._resolver = _Resolver(self._engine)
        self._switch_logs: dict[int, list] = {}
        self._turn_memo: tuple = (None, 0, 0)  # (see _turn_length)
        self._filed_until: dict[int, int] = {}  # (see _file)
        chance = random.Random()  # (for the places drawn: _unseen_run, _file_turns)
        self._draw = chance.randrange
        self._uniform = chance.random
        self._slots: dict[int, _Slot] = {}  # slot number -> slot (this turn's and the last)
        self._previous: set[int] = set()
        self._slot_of: dict[int, int] = {}  # ident -> slot number
        self._next_slot = 0
        self._keys: dict[bytes, int] = {}
        self._fids: dict[tuple, int] = {}  # (code, lasti, fingerprint) -> the recorder's frame id
        # stacks with the greenlet switch hook's frame and only the sampler's code
        # above it: where the sampler ran, not the program, so never a place to file
        # a run no sample saw (_unseen_run): one sample of a worker's first switch
        # took 8-13% of its CPU at 5 ms. (A tracer the hook chains, above it, is the
        # program's: taken for the sampler's, one got 3% of the CPU for 33%.)
        self._hook_stacks: set[int] = set()
        self._hook_file_fids: set[int] = set()  # frames of the hook's module (sampler.greenlets)
        self._outermost_stacks: dict[Any, int] = {}  # code -> its stack (_place_of)
        self._keys_bytes = 0
        self._greenlet_bases: dict[Any, int] = {}
        self._applied: tuple = (None, None)
        self._tracker_applied: Optional[Tracker] = None
        self._static = False  # the tracked set cannot change by itself (see _refresh_targets)
        self._polls = False  # greenlets are tracked: look every REFRESH seconds
        self._switching = False  # a thread read switches greenlets fast: file every REFRESH_SWITCHING
        self._filed_at = time.monotonic()  # (when _file last ran)
        # (ident, native id) of thread states without frames (an ident can be an ended
        # thread's) -> when first seen so
        self._frameless: dict[tuple[int, int], float] = {}
        self._starting = False  # a thread was starting at the last turn: look again soon
        self._stats_after_stop: Optional[dict] = None
        self._forked = False
        self._draining: Optional[int] = None  # the thread filing samples now
        self._gc_pending: dict[int, list] = {}  # ident -> collections not filed yet, oldest first
        self._held: list = []  # samples read inside a collection not over yet (see _file)
        self._c_frames: list = []  # use_errortrace: C callables' frames by id
        self._marks_hold: Optional[list] = None  # (sampler.marks.hold_retired)

    # -- the collector interface (see sampler.collector.Collector) ---------------
    def start(self) -> None:
        install_start_hook()  # (threads started with threading announce their start)
        start_listeners.add(self._thread_started)
        change_listeners.add(self._wake_thread)
        self._refresh_targets()
        if self.shadow is not None:
            self._engine.set_shadow(True)
        if self.recorder.custom_keys:
            self._marks_hold = hold_retired()  # before the first sample
        try:
            self._engine.start()
        except BaseException:
            self._release_marks()
            raise
        self.ident = realthreads.start_new_thread(self._main, ())

    def wake(self) -> None:
        """Apply the controller's changes now (pause, resume, delay, tracked set)."""
        state = (self.delay, bool(self.paused or self.stopped))
        tracker = self.tracker
        if self._forked:
            return
        if tracker is not self._tracker_applied and not state[1]:
            self._refresh_targets()  # set-tracked! takes effect now, not at the next turn
        if state != self._applied:
            self._engine.set_state(*state)
            self._applied = state
        self._wake_thread()

    def _wake_thread(self) -> None:
        """End the feeder's wait, whichever it is in: the engine's between turns, or
        the lock's while paused (a wake meant for the other one only brings a turn,
        or a look at the state, forward)."""
        super()._wake_thread()
        self._engine.wake_feeder()

    def flush(self) -> None:
        """File every sample taken so far (the controller calls this before a snapshot).

        Called again on a thread that is already filing (a signal handler asking for
        the profile in the middle of a drain), it files nothing: the outer drain is
        half way through older samples, which must go first."""
        if not self._forked and self._draining != realthreads.get_ident():
            try:
                self._drain()
            except Exception:  # the collector's trouble, kept, never the program's
                self._record_error()

    def reset_after_fork(self) -> None:
        """In a forked child neither thread exists: keep what was filed, stop for good."""
        self._forked = True
        self._fresh_locks()
        self._done.release()  # nothing to wait for
        self.stopped = True
        self._engine.forget_after_fork()
        self._stats_after_stop = dict(self._stats(), collector_cpu=0.0)
        self._release_marks()  # (the samples still buffered are never filed here)
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
            # whether the kernel gave the collector its short slice (the rate with
            # busy threads depends on it: scribblings/sampler.md)
            "short_slice": bool(stats.get("short_slice", 0)),
            # how the collector read this process's memory ("process_vm_readv", or
            # "/proc/self/mem" where a seccomp profile refuses the system call)
            "read_via": stats.get("read_via", ""),
            # whether it hears of code objects' ends (False: a function made where a
            # freed one was can carry its name for up to 10 ms: codewatch.h)
            "code_watch": bool(stats.get("code_watch", 0)),
            # samples whose frames above the data stack (generators run from C) the
            # walk could not read whole: filed from the frame that ran them, which
            # got their own time (scribblings/sampler.md)
            "tops_left_out": stats.get("tops_left_out", 0),
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
                if self.stopped:
                    break
                if self.paused:
                    if self._marks_hold is None:
                        self._wake.acquire()
                    else:
                        try:
                            self._drain()
                        except Exception:
                            self._record_error()
                        self._wake.acquire(timeout=PAUSED_FILING)
                    continue
                # (the turn with the GIL starts when the wait ends, with the request for
                # the GIL: see PARKED in _file)
                self._engine.feeder_wait(STARTING if self._starting else REFRESH if self._polls else
                                         REFRESH_SWITCHING if self._switching else REFRESH_STATIC)
                try:
                    if not self._static:
                        self._refresh_targets()
                    self._drain()
                except Exception:
                    self._record_error()
                finally:
                    self._engine.feeder_turn_over()
        except BaseException:  # never let anything reach the program
            self._record_error()
        finally:
            start_listeners.discard(self._thread_started)
            change_listeners.discard(self._wake_thread)
            try:
                self._engine.stop()
                self._stats_after_stop = self._engine.stats()
                self._drain()
            except BaseException:
                self._record_error()
            self._release_marks()
            collector_idents.discard(realthreads.get_ident())
            self._feeder_final = time.thread_time()
            self._feeder_clock = None
            self._ended()

    # -- what to read ----------------------------------------------------------------
    def _thread_started(self) -> None:
        """A group member or an announced thread starts (called in that thread): if
        this sampler tracks it, read it from the next tick on. Only this thread is
        added (the next turn's lookup confirms it): a program starting thousands of
        threads pays the same small cost for each."""
        if self.stopped or self.paused or self._forked:
            return
        thread = threading.current_thread()
        tracker = self.tracker
        if not (tracker.all_threads or thread in tracker.threads or _in_groups(tracker.groups)):
            return
        ident = realthreads.get_ident()
        target = thread_target(thread, ident)
        with self.recorder.lock:
            number = self._slot_number(ident, target)
            slot = self._slots[number]
            slot.thread = target
            self._previous.add(number)
            self._engine.add_target((number, _native.current_thread_state(), ident,
                                     self._clock(slot, 0), self._tid(slot, 0)))

    def _watch_unstarted(self, tracker: Tracker) -> None:
        """Tracked threads not started yet announce their start (see groups)."""
        for t in tracker.threads:
            if t.ident is None and not getattr(t, "_stackshot_announces", False):
                inner_run = t.run

                def run_and_announce(inner_run: Any = inner_run) -> None:
                    notify_started()
                    inner_run()

                t.run = run_and_announce  # type: ignore[method-assign]
                t._stackshot_announces = True  # type: ignore[attr-defined]

    def _refresh_targets(self) -> None:
        """Give the C thread the OS threads to read now.

        Runs under the recorder's lock, so that no drain files samples while the
        slots they go to are being changed."""
        tracker = self.tracker
        with self.recorder.lock:
            if tracker is not self._tracker_applied:
                self._watch_unstarted(tracker)
            self._tracker_applied = tracker
            # Started threads alone never change what is read (a thread that exits
            # is dropped by the C thread itself): no need to look again each turn.
            self._static = not (tracker.all_threads or tracker.groups or tracker.greenlets
                                or tracker.greenlet_groups) and all(
                t.ident is not None for t in tracker.threads)
            # Greenlets move unseen by the C thread; the rest changes as threads start.
            self._polls = bool(tracker.greenlets or tracker.greenlet_groups)
            self._engine.watch_threads(not (self._static or self._polls))
            frames = sys._current_frames()
            pairs = tracker.targets(frames)
            states = _native.thread_states()
            if any(_other_thread_now(target, states) for target, _ in pairs):
                tracker.invalidate()
                pairs = tracker.targets(frames)
            # (a thread that has no frame yet is not a target yet; one that stays
            # without frames, a C thread between calls into Python, is not starting)
            now = time.monotonic()
            seen = self._frameless
            self._frameless = {(i, native_id): seen.get((i, native_id), now)
                               for i, (_, native_id) in states.items() if i not in frames}
            self._starting = not self._static and any(
                now - since < STARTING_FOR for since in self._frameless.values())
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
                number = self._slot_number(ident, thread)
                slot = current[number] = self._slots[number]
                slot.thread, slot.greenlets = thread, greenlets
                native.append((number, tstate, ident, self._clock(slot, native_id), self._tid(slot, native_id)))
            # Samples already buffered may name a slot no longer wanted: keep it one
            # more turn, then forget it (the thread has gone or is no longer tracked).
            for number in [n for n in self._slots if n not in current and n not in self._previous]:
                del self._slots[number]
            self._previous = set(current)
            self._slot_of = {ident: n for ident, n in self._slot_of.items() if n in self._slots}
            self._engine.set_targets(native)

    def _slot_number(self, ident: int, thread: Optional[Target]) -> int:
        """The slot of OS thread ``ident`` while it runs ``thread`` (``None``: it only
        hosts tracked greenlets). A thread that got an ended thread's ident gets a slot
        of its own: the ended thread's last samples may still wait in the C buffers,
        and filed under the new thread they gave it the old one's CPU clock (ten
        threads started one after another, each 30 ms of CPU: a third to a half of
        their time lost)."""
        number = self._slot_of.get(ident)
        if number is not None:
            known = self._slots[number].thread
            if thread is None or known is None or known.key == thread.key:
                return number
        number = self._slot_of[ident] = self._next_slot
        self._next_slot += 1
        self._slots[number] = _Slot(ident)
        return number

    def _clock(self, slot: _Slot, native_id: int) -> Optional[int]:
        if slot.ident == realthreads.get_ident():
            return thread_clock_id(realthreads.get_native_id(), slot.ident)
        if slot.thread is not None:
            clock = clock_for(slot.thread)
            if clock is not None:
                return clock
        return thread_clock_id(native_id or None, slot.ident)

    @staticmethod
    def _tid(slot: _Slot, native_id: int) -> int:
        """The kernel's id of the thread (0: unknown), for its run state."""
        if slot.ident == realthreads.get_ident():
            return realthreads.get_native_id()
        if slot.thread is not None and slot.thread.native_id:
            return slot.thread.native_id
        return native_id or 0

    def _greenlet_base(self, target: Target, frame: Any) -> Optional[int]:
        """The address of the greenlet's outermost frame (fixed for its life)."""
        g = _referent(target.key)
        base = self._greenlet_bases.get(target.key)
        if base is None:
            bottom = frame if frame is not None else getattr(g, "gr_frame", None)
            if bottom is None:
                return None
            while bottom.f_back is not None:
                bottom = bottom.f_back
            base = self._greenlet_bases[target.key] = _native.frame_address(bottom)
        return base

    # -- filing the samples -------------------------------------------------------------
    def _drain(self) -> None:
        with self.recorder.lock:  # held across the drain: samples are filed in order
            self._draining = realthreads.get_ident()
            try:
                hold = self._marks_hold
                # Extents that ended by now: a sample carrying one was taken before
                # it ended, so it is in this drain's buffer or was filed before.
                ended = retirements()
                ticks = self._engine.stats()["ticks"] if hold is not None and self.paused else None
                try:
                    self._file(*self._engine.drain())
                finally:
                    self.recorder.forget_collection_stacks()
                if hold is not None:
                    if ticks is not None:
                        now = retirements()
                        if self._engine.stats()["ticks"] == ticks:
                            ended = now  # no tick since the drain began: none can carry them
                    filed_retired(hold, ended)
            finally:
                self._draining = None

    def _release_marks(self) -> None:
        hold, self._marks_hold = self._marks_hold, None
        if hold is not None:
            release_retired(hold)

    def _file(self, samples: list, codes: list) -> None:
        """File one drain's samples under their threads and greenlets."""
        recorder = self.recorder
        start_us = recorder.start * 1e6
        if codes:
            self._resolver.learn(codes)
        # (the copies of the drain before: the switches since the one before that)
        now = time.monotonic()
        copied = max(map(len, self._switch_logs.values()), default=0)
        self._switching = copied > SWITCHING_RATE * (now - self._filed_at)
        self._filed_at = now
        self._switch_logs = {}  # this drain's copies (sampler.greenlets)
        self._turn_memo = (None, 0, 0)  # (see _turn_length)
        # each thread's last sample filed before this drain: where its copy starts
        self._filed_until = {}
        for slot in self._slots.values():
            until = self._filed_until.get(slot.ident)
            self._filed_until[slot.ident] = slot.last_wall_us if until is None else min(until, slot.last_wall_us)
        # A thread inside a collection is read there (the C thread needs no GIL), and
        # those samples' CPU is the collection's, which is known once it has ended
        # (its event). Finalizers that run Python let the GIL go inside it, and this
        # thread files meanwhile: the thread's samples from the collection's start
        # are held until then. (Filed as read, with the finalizer on top: collections
        # running 20 us finalizers had 17-21% of the CPU under them.) Looked at
        # before the events are taken: one that ends in between has its event taken.
        opened = self.gc_watch.opened if self.gc_watch is not None and not self.stopped else None
        if self._held:
            samples = self._held + samples
            self._held = []
        pending = self._take_gc()
        for sample in samples:
            number, flags, read_ns, wall_ns, cpu_ns, base, raw, marks = sample
            slot = self._slots.get(number)
            if slot is None:
                continue
            if flags & SAME:  # the stack its last sample with frames showed, read again
                if slot.last_read is None:
                    continue  # (cannot be: that sample came before it, in this drain)
                raw, base, marks = slot.last_read
                flags &= ~SAME
                sample = (number, flags, read_ns, wall_ns, cpu_ns, base, raw, marks)
            elif raw is not None:
                slot.last_read = (raw, base, marks)
            wall_us = int(wall_ns / 1000 - start_us)
            if (opened is not None and slot.ident == opened[0] and wall_us >= opened[1]
                    and len(self._held) < MAX_HELD):
                self._held.append(sample)
                continue
            cpu_us = cpu_ns // 1000
            inside = None
            if pending:
                inside = self._file_gc(pending, slot, wall_us, cpu_us)
                if inside is not None:  # read during a collection: its CPU is the collection's
                    if raw is None or inside.wall_us <= slot.last_wall_us:
                        continue  # (a collection seen by an earlier sample already)
                    wall_us, cpu_us = inside.wall_us, max(inside.cpu_us, slot.last_cpu_us)
            if raw is None:  # the thread did not run since its last sample
                still = slot.ran_at == slot.last_wall_us  # (where it was seen running)
                self._file_sample(slot, slot.last_stack, slot.last_base, slot.last_marks, wall_us, cpu_us)
                if still:
                    slot.ran_at = wall_us
                continue
            # The thread used CPU since its last sample but is found where it waits:
            # asleep now, or in the very place (same frames, same offsets) it was
            # found asleep in before: woken but not yet given a core on a busy
            # machine, or not yet blocked on the way in (the kernel says runnable for
            # both). That CPU went on from where it was last seen running, not into
            # the call it waits in: file the run first, as a sample there when the CPU
            # ran out (at the latest, now), then the wait with no CPU of its own.
            # (Only within one greenlet, the same outermost frame: after a switch the
            # CPU went into the greenlet found now, wherever the last one ran.)
            # So is a thread parked by the feeder's own turn with the GIL (PARKED):
            # it held the GIL when the feeder asked for it and is found off its core,
            # awake, without it: stopped where it handed it over, after the C call
            # that kept it (up to 10% of the time of 10 ms sorted() calls filed at
            # their caller's line, under load; engine.c says when the flag is set).
            asleep = bool(flags & ASLEEP)
            # (in a place it slept in but on a core, or preempted there without
            # having blocked since an earlier look: computing there, as a C call
            # does between letting the GIL go and waiting to take it back)
            waiting = inside is None and (asleep or bool(flags & PARKED) or (
                raw in slot.slept_in and not flags & (ONCPU | PREEMPTED)))
            # (Same greenlet, not only the same outermost frame's address: a greenlet
            # started after another one ended gets its frames' memory, and the dead
            # one's last stack went under the new one when it was first found asleep,
            # 15 runs in 20 on 3.11 and 3.13.)
            sid = (self.recorder.collection_stack(inside.stack) if inside is not None and inside.stack
                   else self._stack_id(raw, flags))
            mid = self._mark_set(marks) if marks else 0
            switched = self._switched_since(slot, wall_us)
            # (the greenlet whose frames were read: looked up in the switches logged
            # while the read went on, not since the thread's last filing, which turns
            # filed before it move on: a handler's stack, read as it switched away,
            # was filed under the client it switched to once the handler had ended:
            # up to 18 of 17,000 handler samples in 10 s of a server on 3.10)
            current = self._greenlet_read(slot, base, read_ns, wall_ns)
            before = None  # (the CPU used in the interval before the turn found: _file_turns)
            if switched and inside is None and cpu_us > slot.last_cpu_us:
                before = self._file_turns(slot, current, sid, base, mid, waiting, wall_us, cpu_us)
            turns = before is not None
            if not turns and waiting and cpu_us > slot.last_cpu_us:
                ran = self._where_it_ran(slot, base, current, wall_us)
                if ran is not None:
                    ran_until = min(wall_us, slot.last_wall_us + (cpu_us - slot.last_cpu_us))
                    self._file_sample(slot, *ran[:3], ran_until, cpu_us, greenlet=ran[3])
            running = self._file_sample(slot, sid, base, mid, wall_us, cpu_us, switched, current, looked_up=True)
            if asleep:
                _remember(slot.slept_in, raw, SLEEP_PLACES)
            # (what _file_turns draws from: kept once the thread switches greenlets)
            placed = running is not None and (slot.switches or self._switches(slot))
            if placed and sid not in self._hook_stacks:
                _remember_last(slot.latest, running, (sid, base, mid, running))
            slot.ran_at = None
            if not waiting and sid not in self._hook_stacks:
                slot.ran = (sid, base, mid, running)
                slot.ran_at = wall_us
                slot.runs.append(slot.ran)
                if placed:
                    turn_us = self._turn_length(slot, cpu_us)
                    _remember_place(slot.places, running, slot.ran + (math.log(max(turn_us, 1)),))
                    if turns:
                        _remember_start(slot.starts, running, slot.ran, turn_us, before)

    def _where_it_ran(self, slot: _Slot, base: int, current: Any, wall_us: int) -> Optional[tuple]:
        """Where to file the CPU a thread used since its last sample, found waiting
        now (``base``: the outermost frame of the stack found, of greenlet
        ``current``): ``(stack, base, marks, greenlet)``, or ``None`` to leave it
        with the wait.

        In the greenlet found waiting: where it was last seen running, or, if no
        sample saw that run, one of its recent places (:meth:`_unseen_run`). If the
        thread switched to other greenlets since, and the one found waiting is not
        where it was last seen running, the CPU went into those: one of their recent
        places. (Left with the wait, a greenlet computing 0.5 ms between 2 ms sleeps
        of the main one got 17-27% of the thread's CPU for nearly all of it: the rest
        went to the line of the sleep.)"""
        ran = slot.ran
        if ran is not None and ran[1] == base and ran[3] is current:
            return ran if slot.ran_at == slot.last_wall_us else self._unseen_run(slot, ran)
        return self._run_in_others(slot, current, wall_us)

    def _run_in_others(self, slot: _Slot, current: Any, wall_us: int) -> Optional[tuple]:
        """One of the recent places seen running of the greenlets other than
        ``current`` that ran in ``slot``'s thread since its last sample and by
        ``wall_us`` (the one running then, and those switched to since), drawn at
        random (in proportion to how often each was seen); ``None`` when there were
        none, or none of them was seen running.

        A greenlet that has ended since counts: the switch log says it ran in the
        interval, and the run is filed under it by name (``_file_sample``), not by
        its outermost frame's address, which a greenlet started since may have.
        (Counting only the greenlets still alive when the samples were filed, the
        workers of a run of 0.4 s, whose samples were mostly filed after they had
        ended, lost their CPU to the line where the main greenlet napped: 18-28% of
        the thread's CPU for 3%.)"""
        log = self._switch_log(slot)
        if not log:
            return None
        i, until_ns = self._since_last_sample(slot, log, wall_us)
        others = set()  # (greenlet records: compared by identity)
        if i:  # (the one running at the last sample, then the ones switched to since)
            i -= 1
        while i < len(log) and log[i][0] <= until_ns:
            if log[i][1] is not current:
                others.add(log[i][1])
            i += 1
        places = [r for r in slot.runs if r[3] in others] if others else []
        return places[self._draw(len(places))] if places else None

    def _file_turns(self, slot: _Slot, current: Any, sid: int, base: int, mid: int, waiting: bool,
                    wall_us: int, cpu_us: int) -> Optional[int]:
        """File the CPU that ``slot``'s thread used since its last sample, greenlet by
        greenlet, before the sample at ``wall_us``, ``cpu_us`` (stack ``sid``,
        outermost frame ``base``, marks ``mid``), which found greenlet ``current``
        running or, if ``waiting``, waiting. Returns the CPU (us) used in the
        interval before the turn the sample found (by other greenlets), ``None``
        where the switch log cannot say (no switch in between, or the log does not
        reach back that far).

        The hook logs the thread's CPU clock at each switch, so what each greenlet
        used between the two samples is known, not guessed. Where in the greenlet
        is guessed, turn by turn:

        * The turn the last sample found, from there on: at that sample's place.
        * A turn no sample saw: at one of its greenlet's places seen running lately,
          among those seen in turns of about the same CPU (:meth:`_place_of`).
        * The turn the sample found, up to it: found running, it is split as an
          interval without switches is, between the sample's place and one of the
          places where the greenlet's earlier turns were first found (where its
          turns begin, as near as the samples tell), with a run of 1 us there (no
          such place yet: wholly the sample's). Found waiting, it goes to one of
          the greenlet's places seen running, else it stays with the sample, in the
          place it waits in.

        The start is drawn among those of turns like the one found (of the same
        bucket of lengths, :meth:`_start_of`), in proportion to the CPU other
        greenlets used before each in its interval.
        Why: a sample that is the first of its turn gets half of the turn up to it,
        where a sample after another in the same turn gets half of the whole
        interval before it; it is short by half of what other greenlets used in that
        interval. The halves of turn beginnings given to starts make that up, place
        by place, only if each start is drawn as often as its sample was short; drawn
        alike, a place where turns begin (found early in them, after little of the
        turn) is short. A busy gevent server's hashing, which begins its handlers'
        turns, got 0.4-3.8 points too little at 1 ms with starts drawn alike (the
        rendering 1.3 too much on average on 3.11, 1.8 on 3.12); drawn like this, the
        rendering is 0.7 too little to 1.7 too much (24 runs on 3.10-3.13: 0.7 too
        much on average).

        Turns merged (more than :data:`MAX_TURNS` between two samples: one per
        greenlet) are drawn among all of their greenlet's places: their CPU is no
        turn's length. (Compared with turn lengths, the benchmark's gevent server at
        5 ms, a rendering turn and a hashing turn of each handler merged, went to
        places of rendering turns: the rendering 2.4 points too much on average in
        12 runs; 0.3 in 8 runs drawn among all.)

        Each run is filed as two samples at its place, one with no CPU where the run
        begins, so that ``'split'`` gives it wholly to its greenlet, not half to the
        place filed before it, another greenlet's.

        Measured (greenlet_naps, a main greenlet napping 2 ms between turns of two
        workers of 0.3 and 0.6 ms, runs of 0.4 s): filed as one run at a place drawn
        among all of the greenlets that ran, the first worker got 5-23% of the
        thread's CPU for 32%: the ticks locked onto the rounds, one every 3.0 ms,
        and seldom found it. Drawn among all of a greenlet's places, a gevent
        handler's turns no sample saw, mostly its short ones, went to its long
        ones' places (3-4 points too much for the rendering at 1 ms). With the
        found turn wholly the sample's, a busy gevent server's hashing, which
        begins its handlers' turns, got 1.8-3.4 points too little; split with the
        greenlet's place before the turn (its last sample), 2.1-4.4 too little."""
        turns = self._turns(slot, cpu_us)
        if not turns:
            return None
        before = cpu_us - slot.last_cpu_us - turns[-1][1]
        seen = slot.ran if slot.ran_at == slot.last_wall_us else None  # (the last sample's place)
        last = len(turns) - 1
        for n, (rec, used, ended_us, like) in enumerate(turns):
            if n == last and rec is current:
                break  # (the sample's own)
            if used < MIN_TURN_US:
                continue  # (goes with the sample)
            place = seen if n == 0 and seen is not None and seen[3] is rec else self._place_of(slot, rec, like)
            if place is not None:  # (None: nothing known of it; the sample gets it)
                self._file_run(slot, place, slot.last_cpu_us + used, max(ended_us, slot.last_wall_us))
        if waiting:
            places = slot.places.get(current) if current is not None else None
            if places:
                self._file_run(slot, draw_place(places, 0, LIKE_TURN, self._uniform()), cpu_us, wall_us)
        elif current is not None and slot.starts.get(current) and cpu_us - slot.last_cpu_us > 1:
            # (1 us there, alone: the sample of no CPU before it would only keep that
            # 1 us from being halved with the place filed before)
            start = self._start_of(slot.starts[current], self._turn_length(slot, cpu_us))
            self._file_sample(slot, *start[:3], slot.last_wall_us, slot.last_cpu_us + 1, greenlet=start[3])
        else:  # the found turn is wholly the sample's
            self._file_sample(slot, sid, base, mid, slot.last_wall_us, slot.last_cpu_us, greenlet=current)
        return before

    def _start_of(self, buckets: dict, turn_us: int) -> tuple:
        """One of a greenlet's starts (``_Slot.starts``: ``buckets``) for a turn of
        ``turn_us`` of CPU: among those seen in turns like it (the nearest bucket of
        turn lengths that has any), drawn in proportion to the CPU other greenlets
        used before each (all alike where none did)."""
        bucket = _turn_bucket(turn_us)
        kept = buckets.get(bucket)
        if kept is None:
            kept = buckets[min(buckets, key=lambda b: abs(b - bucket))]
        starts, total = kept
        if total <= 0:
            return starts[self._draw(len(starts))][0]
        left = self._uniform() * total
        for place, weight in starts:
            left -= weight
            if left < 0:
                return place
        return starts[-1][0]

    def _turn_length(self, slot: _Slot, cpu_us: int) -> int:
        """The CPU (us) of the turn of ``slot``'s thread's greenlet that was running
        at its CPU clock ``cpu_us``, by the switch log (a turn not over when the log
        was copied: so far; no log: 0). The last answer is kept for the drain (a
        sample that begins a turn asks twice: for its start and for its place)."""
        memo = self._turn_memo
        if memo[0] is slot and memo[1] == cpu_us:
            return memo[2]
        length = turn_length(self._switch_log(slot), cpu_us * 1000)
        self._turn_memo = (slot, cpu_us, length)
        return length

    def _place_of(self, slot: _Slot, rec: Any, used: int = 0) -> Optional[tuple]:
        """Where to file CPU that greenlet ``rec`` used where no sample saw it: one of
        its places seen running lately, drawn at random (in proportion to how often
        each was seen) among those seen in turns most like this one (``used`` us of
        CPU); if no sample found it running, where its latest sample found it
        waiting; if none found it, its outermost function (at its first line: the
        greenlet ran, where in it is not known). ``None``: nothing is known of it.
        (Given to the greenlet found by the sample instead, or to another one that
        ran, the CPU of a worker no tick found running went to the other worker:
        14-23% of the thread's CPU for 32% in runs of 0.4 s.)"""
        places = slot.places.get(rec)
        if places:
            return draw_place(places, used, LIKE_TURN, self._uniform())
        wait = slot.latest.get(rec)  # (none seen running: found waiting)
        if wait is not None:
            return wait
        code = rec.code
        if code is None or not rec.base:
            return None
        sid = self._outermost_stacks.get(code)
        if sid is None:
            frame = Frame(getattr(code, "co_qualname", code.co_name), code.co_filename,
                          code.co_firstlineno, code.co_firstlineno)
            sid = self.recorder.path_id([self.recorder.frame_id(frame)])
            if len(self._outermost_stacks) >= MAX_OUTERMOST_STACKS:
                self._outermost_stacks.clear()
            self._outermost_stacks[code] = sid
        return (sid, rec.base, 0, rec)

    def _turns(self, slot: _Slot, cpu_us: int) -> list[tuple[Any, int, int, int]]:
        """The turns of greenlets in ``slot``'s thread since its last sample and by
        the thread's CPU clock ``cpu_us``, by the switch log, in order: ``(record,
        CPU used, wall clock where it ended, the CPU to find turns like it by)``,
        microseconds (the last: 0 for several turns merged). The first is the turn
        running at the last sample (from there), the last the one running at
        ``cpu_us`` (up to there; its end: 0); turns of no CPU in between are left
        out. Empty where the log does not reach back to the last sample or shows
        no switch in between.

        Beyond :data:`MAX_TURNS` turns, those in between are merged per greenlet,
        or, run by more than :data:`MAX_TURNS` greenlets, are :data:`MERGED_TURNS`
        runs of greenlets drawn in proportion to the CPU each used in them (the CPU
        to find turns like it by: the greenlet's one turn, else 0). (A chatty
        gevent server logs some 80 switches between two samples 1 ms apart; made
        one tuple at a time, they took 83 us a sample.) Found by
        :func:`sampler.greenlets.log_turns`, in C where it is built."""
        return log_turns(self._switch_log(slot), slot.last_cpu_us * 1000, cpu_us * 1000, self.recorder.start * 1e6,
                         MAX_TURNS, MERGED_TURNS, self._uniform())

    def _file_run(self, slot: _Slot, place: tuple, cpu_us: int, wall_us: int) -> None:
        """File a run at ``place`` (``(stack, base, marks, greenlet)``) from ``slot``'s
        last sample to CPU clock ``cpu_us``, ending by ``wall_us``: a sample with no
        CPU there first, so that the run is wholly its own (see :meth:`_file_turns`).
        (What :meth:`_file_sample` does, for a run, without its arguments' and flags'
        passing: a chatty gevent server files some four runs a sample, and its filing
        took 4% less CPU so.)"""
        began_us, began_cpu_us = slot.last_wall_us, slot.last_cpu_us
        if cpu_us <= began_cpu_us:
            return
        until_us = min(wall_us, began_us + (cpu_us - began_cpu_us))
        sid, base, mid, running = place[0], place[1], place[2], place[3]  # (places drawn carry more)
        slot.last_stack, slot.last_base, slot.last_marks = sid, base, mid
        slot.last_wall_us, slot.last_cpu_us = until_us, cpu_us
        if running is None:
            running = self._greenlet_at(slot, base, until_us, began_us)
        recorder = self.recorder
        if slot.thread is not None:
            ctx = recorder.context(slot.thread, None, began_us, began_cpu_us)
            recorder.append_run(ctx, sid, began_us, began_cpu_us, until_us, cpu_us, mid, running)
        if slot.greenlets:
            self._file_in_greenlets(slot, sid, base, mid, began_us, began_cpu_us, until_us, cpu_us, running,
                                    False, True)

    def _unseen_run(self, slot: _Slot, ran: tuple) -> tuple:
        """Where to file the CPU a thread used between two samples that both found it
        waiting: one of the places it was seen running lately (in the same greenlet,
        the same outermost frame), drawn at random. It woke, ran and waited again
        between two ticks, and no sample saw where; the last place seen running was
        the guess before, and work that wakes more often than the delay is always
        filed there: a handler woken every 4 ms that parses for 1 ms and responds for
        1 ms, sampled every 5 ms, was charged 34-44% of its CPU for parsing (the last
        place seen was mostly the responder: a tick that finds the handler responding
        is followed by ticks that find it waiting). Drawn in proportion to how often
        each place was seen running, the guess is right on average."""
        places = [r for r in slot.runs if r[1] == ran[1] and r[3] is ran[3]]
        return places[self._draw(len(places))] if places else ran

    def _take_gc(self) -> dict:
        """The collections not filed yet, by thread (those of threads not read are
        dropped: no sample of theirs will ever come to file them before)."""
        pending = self._gc_pending
        watch = self.gc_watch
        if watch is not None and watch.pending:
            for event in watch.take():
                pending.setdefault(event[0], []).append(event)
        if pending:
            read = {slot.ident for slot in self._slots.values()}
            for ident in [i for i in pending if i not in read]:
                del pending[ident]
        return pending

    def _file_gc(self, pending: dict, slot: _Slot, wall_us: int, cpu_us: int) -> Optional[_CollectionStart]:
        """File the collections of ``slot``'s thread that ended before ``wall_us``
        (the sample there read the thread's CPU clock at ``cpu_us``). When the sample
        was read while the thread was inside a collection, the clocks (wall, CPU) the
        thread had as that collection began and the stack that triggered it (its
        event's pairs); else ``None``.

        Such a sample's CPU belongs to the collection, whose sample is filed before
        the first one read after it ended and is charged no more CPU than the thread
        used since the last sample filed (recorder.record_gc). (Filed as read, a
        collection longer than the interval lost all but its last interval's CPU to
        the frame that allocated: a young heap's full collection, 10% of the GC time
        of a run, on 3.10 and 3.12.) Where the thread ran up to the collection is
        still known, so it is filed there, at the collection's start: at the stack
        that triggered the collection, not the one read, which can have on top a
        finalizer the collection runs (its time is the collection's). (Dropped,
        the thread's run up to there went to the next sample: code that makes
        garbage for 20 ms, then computes for 20 ms, with collections half of the
        first part's time, sampled every 5 ms, was charged 1.4-5 points of its CPU
        too little for the garbage; 8-12 points with parts of 5 ms.)"""
        events = pending.get(slot.ident)
        if not events:
            return None
        if events[0][3] <= wall_us:
            n = 0
            while n < len(events) and events[n][3] <= wall_us:
                n += 1
            self._switch_log(slot)  # (this drain's copy, which the recorder can use)
            self.recorder.record_gc(events[:n], cpu_us, self._switch_logs)
            del events[:n]
        # (events: (ident, stack, generation, end_us, wall_us, cpu_us, base))
        if not events or events[0][3] - events[0][4] > wall_us:
            return None
        _, stack, _, end_us, gc_wall_us, gc_cpu_us, _ = events[0]
        began_us = end_us - gc_wall_us
        # the collection's CPU up to the sample, as its share of the collection's wall time
        spent_us = gc_cpu_us * (wall_us - began_us) // max(gc_wall_us, 1)
        return _CollectionStart(began_us, max(cpu_us - spent_us, 0), stack)

    def _file_sample(self, slot: _Slot, sid: int, base: int, mid: int, wall_us: int, cpu_us: int,
                     switched: bool = False, greenlet: Any = None, looked_up: bool = False) -> Any:
        """One sample of the OS thread of ``slot``: under the thread, if tracked, and
        under the tracked greenlet whose outermost frame it shows; the record of the
        greenlet it showed (``None``: not known). ``switched``: the thread switched
        greenlets since its last sample (``Recorder.append_sample``). ``greenlet``:
        the greenlet it is of, where known (a run at a place a sample saw in it),
        else found from the switch log and ``base``: a greenlet started since may
        have the frame memory, and so the outermost frame's address, of one ended.
        ``looked_up``: ``greenlet`` is the answer of the lookup, ``None`` included
        (a thread with no greenlets: not looked up twice). (A run at one place is
        :meth:`_file_run`.)"""
        since_us, since_cpu_us = slot.last_wall_us, slot.last_cpu_us  # (read after the last sample)
        slot.last_stack, slot.last_base, slot.last_marks = sid, base, mid
        slot.last_wall_us, slot.last_cpu_us = wall_us, cpu_us
        slot.filed = True
        running = greenlet if greenlet is not None or looked_up else self._greenlet_at(slot, base, wall_us, since_us)
        if slot.thread is not None:
            recorder = self.recorder
            ctx = recorder.context(slot.thread, None, wall_us, cpu_us)
            recorder.append_sample(ctx, sid, wall_us, cpu_us, mid, running, switched)
        if slot.greenlets:
            self._file_in_greenlets(slot, sid, base, mid, since_us, since_cpu_us, wall_us, cpu_us, running,
                                    switched, False)
        return running

    def _file_in_greenlets(self, slot: _Slot, sid: int, base: int, mid: int, since_us: int, since_cpu_us: int,
                           wall_us: int, cpu_us: int, running: Any, switched: bool, run: bool) -> None:
        """File a sample (or a run: ``run``) of ``slot``'s OS thread from ``since_us``,
        ``since_cpu_us`` to ``wall_us``, ``cpu_us`` under the greenlets tracked in it:
        under the one whose outermost frame it shows, and a marker that closes the
        interval of one that was running (see :meth:`_file_sample`)."""
        recorder = self.recorder
        at_us, at_cpu_us = (since_us, since_cpu_us) if run else (wall_us, cpu_us)
        for target, gbase in slot.greenlets:
            ctx = recorder.context(target, None, at_us, at_cpu_us)
            # (where a switch hook says which greenlet ran, it must agree: a finished
            # greenlet's frame address can be reused by the next one's frames)
            if gbase == base and sid and (running is None or running.ref() is _referent(target.key)):
                if run:
                    recorder.append_run(ctx, sid, since_us, since_cpu_us, wall_us, cpu_us, mid)
                else:
                    recorder.append_sample(ctx, sid, wall_us, cpu_us, mid, switched=switched)
            elif ctx.running and not getattr(_referent(target.key), "dead", True):
                # switched out: close its interval once
                recorder.append_sample(ctx, 0, at_us, at_cpu_us, 0)
                ctx.running = False

    @staticmethod
    def _switches(slot: _Slot) -> bool:
        """Whether ``slot``'s thread has switched greenlets (then for good: its
        greenlets' places are kept from then on). (Kept from the start, they cost
        every sample of a thread with a hook 0.7 us, a fifth of its filing, in
        threads that never switch.)"""
        slot.switches = switches(slot.ident)
        return slot.switches

    def _switch_log(self, slot: _Slot) -> list:
        """This drain's copy of the switch log of ``slot``'s thread (empty: no hook),
        from the thread's last sample filed before the drain on: what the drain's
        samples look up in the log is at or after it."""
        log = self._switch_logs.get(slot.ident)
        if log is None:
            since_us = self._filed_until.get(slot.ident, slot.last_wall_us)
            since_ns = int((since_us + self.recorder.start * 1e6) * 1000)
            log = self._switch_logs[slot.ident] = switch_log(slot.ident, since_ns)
        return log

    def _switched_since(self, slot: _Slot, wall_us: int) -> bool:
        """Whether the switch hook logged a greenlet switch of ``slot``'s thread since
        its last sample and by ``wall_us``. Never for its first sample: there is no
        interval before it to have been left. (Counted from the sampler's start, the
        switch into a tracked greenlet, logged where another sampler's hook followed
        the thread, put an idle marker before the greenlet's first sample: a CI run
        on 3.12 found one in a greenlet that never yields.)"""
        if not slot.filed:
            return False
        log = self._switch_log(slot)
        if not log:
            return False
        i, until_ns = self._since_last_sample(slot, log, wall_us)
        return i < len(log) and log[i][0] <= until_ns

    def _since_last_sample(self, slot: _Slot, log: list, wall_us: int) -> tuple[int, float]:
        """The index of the first entry of switch ``log`` logged after ``slot``'s last
        sample, and ``wall_us`` on the log's clock (ns): the switches in between."""
        origin_us = self.recorder.start * 1e6
        i = bisect_right(log, (slot.last_wall_us + origin_us) * 1000, key=_logged_at)
        return i, (wall_us + origin_us) * 1000

    def _greenlet_at(self, slot: _Slot, base: int, wall_us: int, since_us: int) -> Any:
        """The greenlet a sample of ``slot`` showed, read after ``since_us`` and by
        ``wall_us`` (see ``greenlet_at``)."""
        origin_us = self.recorder.start * 1e6
        return self._greenlet_read(slot, base, int((since_us + origin_us) * 1000),
                                   int((wall_us + origin_us) * 1000))

    def _greenlet_read(self, slot: _Slot, base: int, read_ns: int, wall_ns: int) -> Any:
        """The greenlet whose stack, outermost frame ``base``, a read of ``slot``'s
        thread found from ``read_ns`` to ``wall_ns`` (the engine's clock, which the
        switch log's is: see ``greenlet_at``)."""
        if not base:
            return None
        log = self._switch_log(slot)
        if not log:  # (what greenlet_at does then, without its arguments' arithmetic)
            return at_base(base)
        return greenlet_at(log, wall_ns, base, read_ns)

    def _stack_id(self, raw: bytes, flags: int) -> int:
        sid = self._keys.get(raw)
        if sid is not None:
            return sid
        # A stack not met before mostly repeats frames that were (its callers, its
        # function at another line): each entry's frame is interned once, not once
        # per stack (a 50-deep stack not met before cost ~95 us of the feeder's turn
        # with the GIL, where the program waits; about half of all filing on the
        # deep benchmark at 1 ms).
        fids = self._fids
        ids = []
        known = True
        hooked = False  # the switch hook's frame, with only the sampler's code above it
        hook_sought = True
        for entry in _ENTRY.iter_unpack(raw):
            fid = fids.get(entry)
            if fid is None:
                code, lasti, fp = entry
                frame = self._resolver.frame(code, lasti, fp) if lasti != _C_ENTRY else self._c_frame(code)
                fid = self.recorder.frame_id(frame)
                if frame.filename == _HOOK_FILE:
                    self._hook_file_fids.add(fid)
                if frame is _UNKNOWN:
                    known = False  # (its code may come with the next drain)
                else:
                    if len(fids) >= MAX_FRAME_IDS:
                        fids.clear()
                    fids[entry] = fid
            if hook_sought:  # (innermost first: what runs above the hook comes first)
                if entry[0] == _HOOK_CODE_ADDRESS:
                    hooked, hook_sought = True, False
                elif fid not in self._hook_file_fids:
                    hook_sought = False  # the program's code: a tracer the hook chains
            ids.append(fid)
        if flags & _native.TRUNCATED:
            ids.append(self.recorder.frame_id(_TRUNCATED))
        ids.reverse()  # outermost first
        sid = self.recorder.path_id(ids)
        if hooked:
            self._hook_stacks.add(sid)
        if not known or len(raw) > MAX_KEY_BYTES:
            return sid
        if self._keys_bytes + len(raw) > MAX_KEY_CACHE_BYTES:
            self._keys.clear()
            self._keys_bytes = 0
        self._keys[raw] = sid
        self._keys_bytes += len(raw)
        return sid

    def _c_frame(self, cid: int) -> Frame:
        """The frame of C callable ``cid`` on a shadow stack (use_errortrace)."""
        if cid >= len(self._c_frames):
            self._c_frames = _native.shadow_c_frames()
        return self._c_frames[cid] if cid < len(self._c_frames) else _UNKNOWN

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


if hasattr(os, "register_at_fork"):  # the module's own locks, in a forked child
    os.register_at_fork(after_in_child=_native.after_fork)
