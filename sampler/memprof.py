"""Memprof for Python: OCaml's ``Gc.Memprof`` interface over CPython's allocators.

Every allocated word is sampled with probability ``sampling_rate``; a sampled block
(one allocation, holding ``n_samples`` sampled words) becomes *tracked*, and a
:class:`Tracker`'s callbacks follow it through its life: allocation, promotion,
deallocation. The semantics are the seeds' (OCaml 5's ``Gc.Memprof``); how CPython's
memory maps onto OCaml's minor and major heaps is below and in
``scribblings/memprof.md``.

The engine is the C extension :mod:`sampler._memprof` (allocator hooks, PEP 445). Where
it is not built, :func:`start` raises a one-line error saying so: there is no slow
fallback, because a profiler that silently costs five times more is worse than none.

CPython's mapping:

* **words**: ``WORD_SIZE`` bytes (8 on 64-bit). An allocation of ``n`` bytes is a block
  of ``ceil(n / WORD_SIZE)`` words; Python's allocators put no header in front of what
  they hand out, so ``Allocation.size`` is the whole request, rounded up to words.
* **minor**: blocks of at most ``MINOR_MAX_BYTES`` (512) bytes, the requests that
  CPython's small-object allocator (pymalloc) serves, where young objects live.
  **major**: larger blocks (served by the system ``malloc``), and promoted ones.
* **promote**: a minor block that survives the first garbage collection (any
  generation) that starts after it was sampled, seen at the end of that collection
  through :data:`gc.callbacks`.
* **dealloc**: the block is returned to the allocator (``free``, or ``realloc``, which
  is a deallocation of the old block and an allocation of the new one). CPython keeps
  freelists of some objects (floats, tuples, frames, dicts, lists): an object put on
  one is not returned to the allocator, so its deallocation is reported only when the
  freelist lets it go. A failed ``realloc`` (out of memory) of a tracked block still
  reports the block deallocated.
* **source**: ``NORMAL`` for the object allocator (``PyObject_Malloc``: Python
  objects), ``CUSTOM`` for the memory allocator (``PyMem_Malloc``: buffers that objects
  own, such as list item arrays; which allocator a type's buffers come from varies
  with the version). ``MARSHAL`` is never produced, as in OCaml 5.

Where callbacks run (none ever runs inside the allocator):

* an allocation callback runs on the allocating thread with the GIL, at its next safe
  point: its next Python function call or generator resumption (a frame evaluator is
  installed only while some thread has allocation callbacks waiting), on the main
  thread also the next eval-breaker check (``Py_AddPendingCall``, within a few
  bytecodes), and any collection the thread runs. A thread in a long loop that calls
  no Python function (only builtins) therefore runs its callbacks when the loop ends,
  or at its next collection. If the thread exits or the profile stops first, the
  callback is not called and the block is not tracked;
* promotion callbacks run at the end of a collection, on the thread that ran it;
* deallocation callbacks run at the next safe point of any thread.

A thread running a callback samples nothing and runs no other callback (no
re-entry); with several threads, callbacks of different threads may interleave, so
they must be thread-safe. A callback that raises has its exception reported through
:func:`sys.unraisablehook` and, like one that returns ``None``, ends the tracking of
its block.
"""

from __future__ import annotations

import atexit
import enum
import functools
import gc
import os
import struct
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

from .snapshot import Frame, Snapshots

try:
    from . import _memprof
    _UNAVAILABLE = ""
except ImportError as _exc:  # not built here: say so when someone asks for it
    _memprof = None  # type: ignore[assignment]
    _UNAVAILABLE = (f"sampler.memprof needs the C extension sampler._memprof, which is not built "
                    f"({_exc}); reinstall stackshot with a C compiler on CPython 3.10-3.13 (Linux)")

WORD_SIZE: int = _memprof.WORD_SIZE if _memprof is not None else struct.calcsize("P")
"""Bytes per word: sizes and samples are counted in words of this size."""

MINOR_MAX_BYTES = 512
"""Blocks of at most this many bytes are minor (pymalloc's small requests)."""

MAX_TRACKED: int = _memprof.MAX_RECORDS if _memprof is not None else 1 << 16
"""Sampled blocks held at once (waiting or tracked); more samples are dropped and
counted in :meth:`Profile.stats` (memory stays bounded)."""

Minor = TypeVar("Minor")
Major = TypeVar("Major")


class AllocationSource(enum.Enum):
    """What caused an allocation (see the module docstring for CPython's mapping)."""

    NORMAL = 0
    MARSHAL = 1
    CUSTOM = 2


@dataclass(frozen=True)
class Allocation:
    """A sampled block, as given to the allocation callbacks.

    ``n_samples`` sampled words (>= 1) in a block of ``size`` words;
    ``callstack``: the allocating thread's Python frames when it allocated the block,
    innermost first (at most the profile's ``callstack_size``).
    """

    n_samples: int
    size: int
    source: AllocationSource
    callstack: tuple[Frame, ...]


def _none(_: Any) -> None:
    return None


@dataclass(frozen=True)
class Tracker(Generic[Minor, Major]):
    """The callbacks that follow a tracked block; each defaults to one returning None.

    ``alloc_minor`` / ``alloc_major`` receive the :class:`Allocation` and return the
    value to keep for the block (``None``: do not track it); ``promote`` turns a minor
    value into a major one (``None``: stop tracking); ``dealloc_minor`` /
    ``dealloc_major`` receive the value when the block is freed.
    """

    alloc_minor: Callable[[Allocation], Optional[Minor]] = _none
    alloc_major: Callable[[Allocation], Optional[Major]] = _none
    promote: Callable[[Minor], Optional[Major]] = _none
    dealloc_minor: Callable[[Minor], None] = _none
    dealloc_major: Callable[[Major], None] = _none


null_tracker: Tracker[Any, Any] = Tracker()
"""Tracks nothing: the allocation callbacks return None."""


class Profile:
    """A profile returned by :func:`start`: stopped by :func:`stop`, released by
    :func:`discard`."""

    def __init__(self, core: Any, sampling_rate: float, callstack_size: int, tracker: Tracker) -> None:
        self._core = core
        self.sampling_rate = sampling_rate
        self.callstack_size = callstack_size
        self.tracker = tracker

    @property
    def state(self) -> str:
        """``"sampling"``, ``"stopped"`` or ``"discarded"``."""
        return self._core.state

    def stats(self) -> dict[str, int]:
        """Counters: ``samples`` (sampled blocks), ``sampled_words`` (their
        ``n_samples`` summed), ``dropped`` (samples lost to the :data:`MAX_TRACKED`
        bound), ``records`` (blocks held now), ``records_peak``."""
        return self._core.stats()

    def estimated_bytes(self) -> float:
        """Unbiased estimate of the bytes allocated while sampling:
        ``sampled_words * WORD_SIZE / sampling_rate`` (0 at rate 0)."""
        if self.sampling_rate == 0:
            return 0.0
        return self.stats()["sampled_words"] * WORD_SIZE / self.sampling_rate

    def __repr__(self) -> str:
        return f"<memprof.Profile rate={self.sampling_rate} {self.state}>"


_lock = threading.Lock()
_sampling: Optional[Profile] = None
_alive: list[Profile] = []  # not discarded: their promotions need gc.callbacks


def _gc_callback(phase: str, info: dict) -> None:
    if _memprof is not None:
        _memprof.gc_phase(phase == "start")


@functools.lru_cache(maxsize=1 << 16)
def _frame(code: types.CodeType, lasti: int) -> Frame:
    line: Optional[int] = code.co_firstlineno
    if lasti >= 0:
        line = None
        for start, end, lineno in code.co_lines():
            if start <= lasti < end:
                line = lineno
                break
    return Frame(getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno, line)


_SOURCES = (AllocationSource.NORMAL, AllocationSource.MARSHAL, AllocationSource.CUSTOM)


def _make_allocation(n_samples: int, size: int, source: int, raw: tuple) -> Allocation:
    """Called by the engine (with sampling suspended) to build a callback's argument."""
    return Allocation(n_samples, size, _SOURCES[source], tuple(_frame(code, lasti) for code, lasti in raw))


def start(sampling_rate: float, callstack_size: int = sys.maxsize,
          tracker: Tracker[Minor, Major] = null_tracker) -> Profile:
    """Start sampling for a new profile, in every thread (threads started later join).

    ``sampling_rate``: the probability that each allocated word is sampled,
    ``0.0 <= sampling_rate <= 1.0`` (else ``ValueError``); ``callstack_size``: frames
    kept per sample (default: all; the engine keeps at most ``MAX_DEPTH``). Raises
    ``RuntimeError`` if a profile is already sampling, or if the engine is not built.
    """
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, (int, float)):
        raise TypeError(f"sampling_rate must be a number, not {type(sampling_rate).__name__}")
    if not 0.0 <= sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be between 0.0 and 1.0, not {sampling_rate!r}")
    if isinstance(callstack_size, bool) or not isinstance(callstack_size, int) or callstack_size < 0:
        raise ValueError(f"callstack_size must be an integer >= 0, not {callstack_size!r}")
    if not isinstance(tracker, Tracker):
        raise TypeError(f"tracker must be a memprof.Tracker, not {type(tracker).__name__}")
    if _memprof is None:
        raise RuntimeError(_UNAVAILABLE)
    global _sampling
    with _lock:
        if _sampling is not None:
            raise RuntimeError("a memprof profile is already sampling: stop it first")
        if _gc_callback not in gc.callbacks:
            gc.callbacks.append(_gc_callback)
        # a callback left at its default is passed as None: the engine then neither
        # calls it nor, for the allocation callbacks, records the block at all
        callbacks = [None if f is _none else f for f in (
            tracker.alloc_minor, tracker.alloc_major, tracker.promote, tracker.dealloc_minor,
            tracker.dealloc_major)]
        core = _memprof.start(float(sampling_rate), min(callstack_size, _memprof.MAX_DEPTH),
                              *callbacks, _make_allocation, threading.main_thread().ident)
        profile = _sampling = Profile(core, float(sampling_rate), callstack_size, tracker)
        _alive.append(profile)
    return profile


def stop() -> None:
    """Stop sampling for the current profile, in every thread. Allocation callbacks
    not yet run are dropped (those blocks are not tracked); promotion and
    deallocation callbacks of tracked blocks still run until :func:`discard`.
    Raises ``RuntimeError`` if no profile is sampling."""
    global _sampling
    with _lock:
        if _sampling is None:
            raise RuntimeError("no memprof profile is sampling")
        profile, _sampling = _sampling, None
        profile._core.stop()


def discard(profile: Profile) -> None:
    """Release all state of a stopped profile: no more callbacks for it. Raises
    ``RuntimeError`` if the profile is still sampling."""
    if not isinstance(profile, Profile):
        raise TypeError(f"discard needs a memprof.Profile, not {type(profile).__name__}")
    with _lock:
        if profile is _sampling:
            raise RuntimeError("cannot discard a profile that is still sampling: stop it first")
        profile._core.discard()
        if profile in _alive:
            _alive.remove(profile)
        if not _alive and _gc_callback in gc.callbacks:
            gc.callbacks.remove(_gc_callback)


class AllocationLog:
    """A tracker that keeps every sampled block, for :func:`to_snapshots`.

    ``log.tracker`` records each block's thread, callstack and ``n_samples`` when its
    allocation callback runs, and marks it freed when its deallocation callback runs
    (it is promoted as is). ``log.blocks`` is the list of ``[thread name, callstack,
    n_samples, still live]``. Memory: one small list per sampled block, like the
    engine's own bound (:data:`MAX_TRACKED` live at once).
    """

    def __init__(self) -> None:
        self.blocks: list[list] = []
        self._lock = threading.RLock()  # reentrant: a callback may run where the lock is held
        self.tracker: Tracker[list, list] = Tracker(self._alloc, self._alloc, _same, self._free, self._free)

    def _alloc(self, a: Allocation) -> list:
        block = [threading.current_thread().name, a.callstack, a.n_samples, True]
        with self._lock:
            self.blocks.append(block)
        return block

    @staticmethod
    def _free(block: list) -> None:
        block[3] = False


def _same(value: Any) -> Any:
    return value


def to_snapshots(profile: Profile, log: AllocationLog, *, live: bool = False) -> Snapshots:
    """The samples of ``log`` (the tracker of ``profile``) as a :class:`Snapshots`
    value the analyzer reads, weighed by estimated bytes instead of time.

    Each sampled block is one sample, with its callstack, on its allocating thread,
    weighing its estimated bytes, ``round(n_samples * WORD_SIZE / sampling_rate)``,
    in the slot that holds microseconds (1 us = 1 byte). The two delta columns are
    two views: the CPU column holds every block's bytes (**allocated**), the wall
    column the bytes of the blocks not freed yet (**still live**, 0 for a freed
    block), so the analyzer's ``weight='cpu'`` profiles bytes allocated and
    ``weight='wall'`` bytes still live; it reads the profile in bytes (``unit='B'``)
    because the run's ``RunInfo.engine`` is ``"memprof"``. ``live=True`` keeps only
    the blocks not freed yet, in both columns. Call it after a safe point, such as
    ``gc.collect()``, so that the last deallocations have been reported, and before
    :func:`discard`.

    The analyzer charges a sample its own delta (its rule for snapshots,
    ``interval='end'``, the only one it accepts for allocation samples) and gives a
    thread's first sample nothing: so each thread starts with one sample of the
    empty stack and deltas 0. The run's ``process_cpu`` (the analyzer's "out of")
    is the profile's whole estimate, :meth:`Profile.estimated_bytes`, in the same
    unit (10**6 bytes a second).
    """
    from .snapshot import OVERFLOW, RunInfo, StackTrie, ThreadInfo

    if profile.sampling_rate <= 0:
        raise ValueError("a profile sampled at rate 0 has no samples to weigh")
    trie = StackTrie()
    thread_ids: dict[str, int] = {}
    threads: list[ThreadInfo] = []
    cols: dict[str, list[int]] = {"thread": [], "stack": [], "allocated": [], "live": []}
    overflow: dict[str, dict[int, int]] = {"allocated": {}, "live": {}}
    with log._lock:
        blocks = [list(b) for b in log.blocks]
    for name, callstack, n_samples, alive in blocks:
        if live and not alive:
            continue
        tid = thread_ids.get(name)
        if tid is None:
            tid = thread_ids[name] = len(threads)
            threads.append(ThreadInfo(tid, name, None, "thread", 0, 0.0, 0.0))
            for col, value in (("thread", tid), ("stack", 0), ("allocated", 0), ("live", 0)):
                cols[col].append(value)
        weight = round(n_samples * WORD_SIZE / profile.sampling_rate)
        cols["thread"].append(tid)
        cols["stack"].append(trie.path_id(trie.frame_id(f) for f in reversed(callstack)))
        for col, value in (("allocated", weight), ("live", weight if alive else 0)):
            if value >= OVERFLOW:
                overflow[col][len(cols[col])] = value
                value = OVERFLOW
            cols[col].append(value)
    try:
        whole = profile.estimated_bytes()
    except RuntimeError:  # discarded: what the log holds
        whole = float(sum(cols["allocated"]) + sum(v - OVERFLOW for v in overflow["allocated"].values()))
    run = RunInfo(pid=os.getpid(), python=sys.version.split()[0], engine="memprof",
                  process_cpu=whole / 1e6,
                  extra={"memprof": {"sampling_rate": profile.sampling_rate, "live": live,
                                     "weight": "estimated bytes (1 us = 1 byte)",
                                     "cpu": "live" if live else "allocated", "wall": "live"}})
    return Snapshots(frames=trie.frames, stack_frame=trie.stack_frame, stack_parent=trie.stack_parent,
                     threads=threads, sample_thread=cols["thread"], sample_stack=cols["stack"],
                     sample_wall=cols["live"], sample_cpu=cols["allocated"],
                     wall_overflow=overflow["live"], cpu_overflow=overflow["allocated"], runs=[run])


class Recorder:
    """A memprof profile with a sampler's controls, for the front ends
    (``stackshot --memory RATE``, ``profile(memory=RATE)``): it starts sampling every
    thread's allocations when created, into an :class:`AllocationLog`;
    :meth:`stop` stops, lets the last deallocations be reported, and releases the
    engine; :meth:`get_snapshots` gives :func:`to_snapshots` (both views: allocated
    and still live at the stop).
    """

    def __init__(self, sampling_rate: float, callstack_size: int = sys.maxsize) -> None:
        self.log = AllocationLog()
        self.profile = start(sampling_rate, callstack_size, self.log.tracker)
        self._final: Optional[Snapshots] = None

    def stop(self) -> None:
        """Stop sampling (once; later calls do nothing) and release the profile."""
        if self._final is not None:
            return
        if self.profile.state == "sampling":
            stop()
        gc.collect()  # a safe point: deallocation callbacks waiting now run
        self._final = to_snapshots(self.profile, self.log)
        discard(self.profile)

    def get_snapshots(self) -> Snapshots:
        """The allocations sampled so far (all of them after :meth:`stop`)."""
        return self._final if self._final is not None else to_snapshots(self.profile, self.log)


def _at_exit() -> None:
    """At interpreter exit, stop and discard what is left, so that no callback runs
    while the interpreter is being torn down."""
    with _lock:
        if _sampling is not None:
            _sampling._core.stop()
    for profile in list(_alive):
        try:
            profile._core.discard()
        except RuntimeError:
            pass


atexit.register(_at_exit)
if _memprof is not None and hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_memprof.after_fork)
