"""What to sample: validating ``to_track`` and finding, at each tick, the stacks of
the threads and greenlets it names.

``to_track`` is a ``threading.Thread``, a :class:`~sampler.groups.ThreadGroup`, a
greenlet, :data:`ALL_THREADS`, or a (nested) list or tuple of them.  Each tick turns
it into :class:`Target` values: one per live execution context, with its top frame
taken from ``sys._current_frames()`` (whose keys are real OS thread idents).

A greenlet runs inside one thread and is only on that thread's stack while it runs.
When it is suspended its ``gr_frame`` chain ends at its own outermost frame; when it
runs, the thread whose stack ends at that same frame is the one running it.
"""

from __future__ import annotations

import threading
import weakref
from types import CodeType, FrameType
from typing import Any, Hashable, Iterable, NamedTuple, Optional

from .clocks import native_id_of, native_id_of_ident, remember_calling_thread
from .groups import GreenletGroup, ThreadGroup, _finished, generation
from . import greenlets as _switches
from .patched import is_thread, os_thread_view, owner_of, remember_calling_os_thread

try:
    import greenlet as _greenlet_module

    _GreenletType: Optional[type] = _greenlet_module.greenlet
except ImportError:  # pragma: no cover - greenlet is a dependency
    _greenlet_module = None
    _GreenletType = None


class _AllThreads:
    """Sentinel: every thread of the process, present and future."""

    _instance: Optional["_AllThreads"] = None

    def __new__(cls) -> "_AllThreads":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "sampler.ALL_THREADS"

    def __reduce__(self) -> str:
        return "ALL_THREADS"


ALL_THREADS = _AllThreads()
"""Track every thread of the process (but the samplers' own), present and future."""

# Idents of every collector thread of every sampler: never sampled.
collector_idents: set[int] = set()


class Target(NamedTuple):
    """What is known of one context to sample, fixed for its life (cached)."""

    key: Hashable  # identity across ticks
    name: str
    native_id: Optional[int]
    ident: Optional[int]  # the OS thread it runs in
    kind: str  # 'thread' or 'greenlet'


def is_greenlet(obj: Any) -> bool:
    return _GreenletType is not None and isinstance(obj, _GreenletType)


def flatten(to_track: Any) -> tuple:
    """Validate ``to_track`` and return its leaves, or raise ``TypeError`` naming the
    first element that is not trackable (with its position in nested lists)."""
    leaves: list[Any] = []

    def walk(value: Any, path: str, depth: int) -> None:
        if depth > 100:
            raise TypeError(f"to_track is nested too deeply at {path}")
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", depth + 1)
        elif isinstance(value, (ThreadGroup, GreenletGroup, _AllThreads)) or is_thread(value) or is_greenlet(value):
            leaves.append(value)
        else:
            where = f" at {path}" if path != "to_track" else ""
            raise TypeError(
                f"cannot track {value!r}{where}: expected a threading.Thread, a ThreadGroup, "
                "a greenlet, a GreenletGroup, sampler.ALL_THREADS, or a list of them"
            )

    walk(to_track, "to_track", 0)
    return tuple(leaves)


def _bottom(frame: Optional[FrameType]) -> Optional[FrameType]:
    while frame is not None and frame.f_back is not None:
        frame = frame.f_back
    return frame


class Tracker:
    """Turns the tracked leaves into this tick's targets.

    The list of thread targets is cached until the thread set changes: for
    :data:`ALL_THREADS`, until the idents of ``sys._current_frames()`` or the
    ``Thread`` objects behind them change; for threads and groups, until a group
    gains or loses a member (:func:`sampler.groups.generation`) or a cached thread is
    no longer where it was.  A rebuild drops what it no longer needs, so finished
    threads are not kept alive by the cache.  Targets name their thread or greenlet
    through a weak reference, for the same reason.
    """

    def __init__(self, leaves: Iterable[Any]) -> None:
        self.leaves = tuple(leaves)
        self.all_threads = any(isinstance(x, _AllThreads) for x in self.leaves)
        self.threads = [x for x in self.leaves if is_thread(x)]
        self.groups = [x for x in self.leaves if isinstance(x, ThreadGroup)]
        self.greenlets = [x for x in self.leaves if is_greenlet(x)]
        self.greenlet_groups = [x for x in self.leaves if isinstance(x, GreenletGroup)]
        # greenlet -> [id of its outermost frame, ident of the thread it was seen
        # in, the codes it can start in (known before it starts)]
        self._greenlet_places: dict[Any, list[Any]] = {}
        remember_calling_thread()
        remember_calling_os_thread()
        # the cached thread targets: (ident, Thread object or None, Target)
        self._entries: list[tuple[int, Any, Target]] = []
        self._signature: Any = None
        for g in self.greenlets:
            self._learn_place(g, threading.get_ident())
        # Which greenlet runs at each sample, in this thread (the hook is per thread).
        self.switch_hook = (_switches.attach() if self.all_threads or self.threads or self.groups
                            else None)
        # ... and in the threads started from now on (see greenlets.follow_new_threads)
        if self.switch_hook is not None:
            _switches.follow_new_threads()

    def release(self) -> None:
        """Give back the greenlet switch hook (when the sampler stops or tracks
        something else); idempotent."""
        hook, self.switch_hook = self.switch_hook, None
        _switches.release(hook)
        if hook is not None:
            _switches.unfollow_new_threads()

    def _learn_place(self, g: Any, current_ident: int) -> None:
        """Find where ``g`` lives now, if that can be seen from here."""
        place = self._greenlet_places.setdefault(g, [None, None, _run_codes(g)])
        if g.gr_frame is not None:
            place[0] = id(_bottom(g.gr_frame))
        elif _greenlet_module is not None and g is _greenlet_module.getcurrent():
            import sys

            place[0] = id(_bottom(sys._getframe()))
            place[1] = current_ident

    def targets(self, frames: dict[int, FrameType]) -> list[tuple[Target, Optional[FrameType]]]:
        """This tick's ``(target, top frame)`` pairs; the frame is ``None`` for a
        greenlet that is switched out.

        Liveness is left to the frames: a thread that has exited has none.
        """
        active = getattr(threading, "_active", {})
        if self.all_threads:
            idents = list(frames)
            signature = (idents, [owner_of(i, active) for i in idents])
        else:
            signature = (generation(), [t.ident for t in self.threads])
        if signature != self._signature:
            self._entries, complete = self._rebuild(frames, active)
            self._signature = signature if complete else None
        out: list[tuple[Target, Optional[FrameType]]] = []
        stale = False
        for ident, owner, target in self._entries:
            frame = frames.get(ident)
            if frame is None or owner_of(ident, active) is not owner:
                stale = True  # exited (or its ident was reused): rebuild next tick
                continue
            out.append((target, frame))
        if stale:
            self.invalidate()
        greenlets = self.greenlets
        if self.greenlet_groups:
            greenlets = list(dict.fromkeys(greenlets + [g for group in self.greenlet_groups
                                                        for g in group.greenlets()]))
            if len(self._greenlet_places) > 2 * len(greenlets) + 16:
                self._greenlet_places = {g: p for g, p in self._greenlet_places.items()
                                         if not g.dead}
        if greenlets:
            # A greenlet whose thread is tracked is sampled with it, under a context
            # of its own (see Recorder.append_sample): never twice.
            hosts = {t.ident for t, _ in out}
            for g in greenlets:
                pair = self._greenlet_target(g, frames)
                if pair is not None and not (self.all_threads or pair[0].ident in hosts):
                    out.append(pair)
        return out

    def invalidate(self) -> None:
        """Build the thread targets again at the next tick (the recorder found one
        that no longer matches its thread: a raw thread whose ident was reused)."""
        self._signature = None

    def _rebuild(self, frames: dict[int, FrameType], active: dict
                 ) -> tuple[list[tuple[int, Any, Target]], bool]:
        """The thread targets, and whether they are complete (a thread that has
        started but is not in ``frames`` yet makes the next tick look again)."""
        entries = []
        if self.all_threads:
            for ident in frames:
                if ident not in collector_idents:
                    t = owner_of(ident, active)
                    entries.append((ident, t, thread_target(t, ident)))
            return entries, True
        threads = list(self.threads)
        for group in self.groups:
            threads.extend(group.threads())
        seen: set[int] = set()
        complete = True
        for tracked in threads:
            # (under gevent's patching, the OS thread it runs in, named as such)
            ident, t = os_thread_view(tracked, frames, active)
            if ident is None or ident in seen or ident in collector_idents:
                continue
            if ident not in frames:
                if not _finished(t):
                    complete = False  # starting: look again next tick
                continue
            owner = owner_of(ident, active)
            if (owner is not None and owner is not t) or (owner is None and not t.is_alive()):
                continue  # finished; its ident now belongs to another thread
            seen.add(ident)
            entries.append((ident, owner, thread_target(t, ident)))
        return entries, complete

    def _greenlet_target(self, g: Any, frames: dict[int, FrameType]
                         ) -> Optional[tuple[Target, Optional[FrameType]]]:
        if g.dead:
            return None
        place = self._greenlet_places.setdefault(g, [None, None, _run_codes(g)])
        name = f"greenlet {getattr(g, 'name', None) or hex(id(g))}"
        suspended = g.gr_frame
        if suspended is not None:
            place[0] = id(_bottom(suspended))
            return Target(_weak_key(g), name, None, place[1], "greenlet"), None
        if not g:
            return None  # not started yet
        candidates = [place[1]] if place[1] in frames else []
        candidates += [i for i in frames if i != place[1] and i not in collector_idents]
        run_codes = place[2] if place[0] is None else ()
        for ident in candidates:
            frame = frames[ident]
            bottom = _bottom(frame)
            if place[0] is None:
                # Never seen switched out: the thread whose switch hook says it runs
                # g (sampler.greenlets), or running a greenlet that starts in g's
                # run function, is running g, since g is running somewhere.
                running = _switches.running_in(ident, frame)
                if bottom is None or not (
                        (running is not None and running.ref() is g) or bottom.f_code in run_codes):
                    continue
                place[0] = id(bottom)
            if id(bottom) == place[0]:
                place[1] = ident
                return Target(_weak_key(g), name, None, ident, "greenlet"), frame
        return None


def thread_target(t: Optional[threading.Thread], ident: int) -> Target:
    if t is None:
        # Started with _thread: no Thread object.  Its native id tells it apart from
        # an earlier thread that had the same ident.
        native_id = native_id_of_ident(ident)
        return Target(("ident", ident, native_id), f"thread {ident}", native_id, ident, "thread")
    return Target(_weak_key(t), t.name, native_id_of(t), ident, "thread")


def _weak_key(obj: Any) -> Hashable:
    """A key that names ``obj`` without keeping it alive (equal to other weak
    references to it while it lives, hashed like it)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


def key_has_ended(key: Hashable) -> bool:
    """Whether the context of a target key has ended for good."""
    if isinstance(key, tuple) and key[0] == "greenlet":  # (see Recorder._greenlet_context)
        g = key[2].ref()
        return g is None or bool(getattr(g, "dead", True))
    if isinstance(key, weakref.ref):
        obj = key()
        if obj is None:
            return True
        if isinstance(obj, threading.Thread):
            return not obj.is_alive()
        return bool(getattr(obj, "dead", True))
    return True  # a raw thread: a new one with its ident gets a new key


def _run_codes(g: Any) -> tuple:
    """The code a greenlet can start in, known before it starts: its ``run``, and
    for a gevent ``Greenlet`` its ``_run`` (gevent's own ``run`` is compiled and
    calls ``self._run``, the program's function, which is then the outermost frame)."""
    codes = []
    for name in ("run", "_run"):
        run = getattr(g, name, None)
        code = getattr(run, "__code__", None)
        if code is None:
            code = getattr(getattr(run, "__func__", None), "__code__", None)
        if isinstance(code, CodeType):
            codes.append(code)
    return tuple(codes)


class TrackingWarning(UserWarning):
    """A thread given to track can never be sampled: it has ended, or it was never
    started while it was tracked."""


def ended(leaves: Iterable[Any]) -> list[str]:
    """The threads among ``leaves`` that have already ended, described for a warning:
    they will never be sampled."""
    out = []
    for x in leaves:
        if isinstance(x, threading.Thread) and x.ident is not None and not x.is_alive():
            out.append(f"thread {x.name!r} has already ended")
    return out


def not_started(leaves: Iterable[Any]) -> list[threading.Thread]:
    """The threads among ``leaves`` that have not been started (yet)."""
    return [x for x in leaves if isinstance(x, threading.Thread) and x.ident is None]
