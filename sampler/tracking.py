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
from types import FrameType
from typing import Any, Hashable, Iterable, NamedTuple, Optional

from .groups import ThreadGroup

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
        elif isinstance(value, (threading.Thread, ThreadGroup, _AllThreads)) or is_greenlet(value):
            leaves.append(value)
        else:
            where = f" at {path}" if path != "to_track" else ""
            raise TypeError(
                f"cannot track {value!r}{where}: expected a threading.Thread, a ThreadGroup, "
                "a greenlet, sampler.ALL_THREADS, or a list of them"
            )

    walk(to_track, "to_track", 0)
    return tuple(leaves)


def _bottom(frame: Optional[FrameType]) -> Optional[FrameType]:
    while frame is not None and frame.f_back is not None:
        frame = frame.f_back
    return frame


class Tracker:
    """Turns the tracked leaves into this tick's targets."""

    def __init__(self, leaves: Iterable[Any]) -> None:
        self.leaves = tuple(leaves)
        self.all_threads = any(isinstance(x, _AllThreads) for x in self.leaves)
        self.threads = [x for x in self.leaves if isinstance(x, threading.Thread)]
        self.groups = [x for x in self.leaves if isinstance(x, ThreadGroup)]
        self.greenlets = [x for x in self.leaves if is_greenlet(x)]
        # greenlet -> [id of its outermost frame, ident of the thread it was seen
        # in, code of its run function (known before it starts)]
        self._greenlet_places: dict[Any, list[Any]] = {}
        # ident -> (the Thread object seen with it, its Target)
        self._thread_targets: dict[int, tuple[Any, Target]] = {}
        for g in self.greenlets:
            self._learn_place(g, threading.get_ident())

    def _learn_place(self, g: Any, current_ident: int) -> None:
        """Find where ``g`` lives now, if that can be seen from here."""
        place = self._greenlet_places.setdefault(g, [None, None, _run_code(g)])
        if g.gr_frame is not None:
            place[0] = id(_bottom(g.gr_frame))
        elif _greenlet_module is not None and g is _greenlet_module.getcurrent():
            import sys

            place[0] = id(_bottom(sys._getframe()))
            place[1] = current_ident

    def targets(self, frames: dict[int, FrameType]) -> list[tuple[Target, Optional[FrameType]]]:
        """This tick's ``(target, top frame)`` pairs; the frame is ``None`` for a
        greenlet that is switched out.

        Liveness is left to the recorder where it can: the CPU clock of a thread that
        has exited cannot be read, which is cheaper than ``Thread.is_alive()`` and
        also right when a dead thread's ident has been reused.
        """
        out: list[tuple[Target, Optional[FrameType]]] = []
        cache = self._thread_targets
        if self.all_threads:
            active = getattr(threading, "_active", {})
            for ident, frame in frames.items():
                if ident in collector_idents:
                    continue
                t = active.get(ident)
                cached = cache.get(ident)
                if cached is None or cached[0] is not t:
                    cached = cache[ident] = (t, _thread_target(t, ident))
                out.append((cached[1], frame))
        else:
            threads = self.threads
            if self.groups:
                threads = list(threads)
                for group in self.groups:
                    threads.extend(group.threads())
            seen: set[int] = set()
            for t in threads:
                ident = t.ident
                frame = frames.get(ident)  # type: ignore[arg-type]
                if frame is None or ident in seen or ident in collector_idents:
                    continue
                seen.add(ident)  # type: ignore[arg-type]
                cached = cache.get(ident)
                if cached is None or cached[0] is not t:
                    cached = cache[ident] = (t, _thread_target(t, ident))
                target = cached[1]
                if target.native_id is None and not t.is_alive():
                    continue  # no CPU clock to tell: ask the thread
                out.append((target, frame))
        for g in self.greenlets:
            pair = self._greenlet_target(g, frames)
            if pair is not None:
                out.append(pair)
        return out

    def _greenlet_target(self, g: Any, frames: dict[int, FrameType]
                         ) -> Optional[tuple[Target, Optional[FrameType]]]:
        if g.dead:
            return None
        place = self._greenlet_places.setdefault(g, [None, None, _run_code(g)])
        name = f"greenlet {getattr(g, 'name', None) or hex(id(g))}"
        suspended = g.gr_frame
        if suspended is not None:
            place[0] = id(_bottom(suspended))
            return Target(g, name, None, place[1], "greenlet"), None
        if not g:
            return None  # not started yet
        candidates = [place[1]] if place[1] in frames else []
        candidates += [i for i in frames if i != place[1] and i not in collector_idents]
        run_code = place[2] if place[0] is None else None
        for ident in candidates:
            frame = frames[ident]
            bottom = _bottom(frame)
            if place[0] is None:
                # Never seen switched out: the thread running a greenlet that starts
                # in g's run function is running g, since g is running somewhere.
                if run_code is None or bottom is None or bottom.f_code is not run_code:
                    continue
                place[0] = id(bottom)
            if id(bottom) == place[0]:
                place[1] = ident
                return Target(g, name, None, ident, "greenlet"), frame
        return None


def _thread_target(t: Optional[threading.Thread], ident: int) -> Target:
    if t is None:  # started with _thread: no Thread object, no native id
        return Target(("ident", ident), f"thread {ident}", None, ident, "thread")
    return Target(t, t.name, t.native_id, ident, "thread")


def _run_code(g: Any) -> Any:
    try:
        run = g.run
    except AttributeError:
        return None
    code = getattr(run, "__code__", None)
    if code is None:
        code = getattr(getattr(run, "__func__", None), "__code__", None)
    return code
