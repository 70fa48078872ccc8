"""Thread groups: Python's counterpart of Racket's custodians.

A Racket custodian manages the threads created under it and its sub-custodians, and
tracking a custodian samples all of them, including threads created later.  Here a
:class:`ThreadGroup` is made current with ``with group:``; every thread *started*
while a group is current (in the starting thread or greenlet) joins that group, and
its own current group is that group too, so the threads it starts join as well.
Groups nest: a group created while another is current is its subgroup.  Dead threads
leave their group when it is next looked at.

Starting a thread is observed by wrapping ``threading.Thread.start`` the first time a
group is created; threads started with the low-level ``_thread`` module are not seen
(add them with :meth:`ThreadGroup.add`).

Membership is changed by the starting threads and read by the collector at once, so
every change is one atomic operation on a dict (never a list rebuilt from a copy,
which loses a thread added meanwhile), and each change bumps :func:`generation`, which
tells a tracker when the members it cached are out of date.  A finished thread leaves
its group when the group is next looked at or when the group has doubled since it was
last pruned, so a group nobody reads does not keep every thread it ever had.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import weakref
from typing import Any, Callable, Iterator, Optional

_current: contextvars.ContextVar[Optional["ThreadGroup"]] = contextvars.ContextVar(
    "stackshot_thread_group", default=None
)
_original_start = None
_install_lock = threading.Lock()
_changes = itertools.count()
_generation = [0]


def generation() -> int:
    """A number that changes whenever any group gains or loses a member or a subgroup."""
    return _generation[0]


def _changed() -> None:
    _generation[0] = next(_changes) + 1

# Called in a thread as it starts running, when it is a group member, a tracked
# thread that had not started when tracking began, or any thread started with
# threading while a listener is registered: an engine that learns of threads only
# now and then (the native one) sees it from its first instruction (waiting for its
# next look, every 20 ms, it missed the CPU each new thread used before).
start_listeners: "set[Callable[[], None]]" = set()


# Called when a thread joins a group explicitly (ThreadGroup.add, possibly a thread
# that runs already, which announces nothing): an engine that looks the members up
# only now and then looks at once.
change_listeners: "set[Callable[[], None]]" = set()


def _notify(listeners: "set[Callable[[], None]]") -> None:
    for listener in list(listeners):
        try:
            listener()
        except Exception:  # a profiler's trouble never reaches the program
            pass


def notify_started() -> None:
    """Tell every listener that the calling thread has just started."""
    _notify(start_listeners)


def install_start_hook() -> None:
    """Wrap ``Thread.start`` once so that a new thread joins the current group, and
    announces its start while anyone listens (:data:`start_listeners`)."""
    global _original_start
    with _install_lock:
        if _original_start is not None:
            return
        original = threading.Thread.start

        def start(self: threading.Thread) -> None:
            group = _current.get()
            if group is None and not start_listeners:
                return original(self)
            _start_announced(self, original, group)

        start.__doc__ = original.__doc__
        start.__wrapped__ = original  # type: ignore[attr-defined]
        threading.Thread.start = start  # type: ignore[method-assign]
        _original_start = original


def _start_announced(thread: threading.Thread, original: Callable[[threading.Thread], None],
                     group: Optional["ThreadGroup"]) -> None:
    """Start ``thread`` so that it joins ``group`` (if any) and, as it starts running,
    makes it its own current group and announces its start."""
    inner_run = thread.run

    def run_announced() -> None:
        if group is not None:
            _current.set(group)
        try:
            notify_started()
            inner_run()
        finally:
            # The thread holds this function and it holds the thread: break the
            # cycle, so that a program without the cyclic collector does not keep
            # every finished thread.
            thread.__dict__.pop("run", None)

    thread.run = run_announced  # type: ignore[method-assign]
    if group is not None:
        group._join(thread)
    try:
        original(thread)
    except BaseException:
        thread.__dict__.pop("run", None)
        if group is not None:
            group._discard(thread)
        raise
    if group is not None:
        _changed()  # its ident is known now


class ThreadGroup:
    """A set of threads and subgroups that can be tracked as one (a custodian)."""

    def __init__(self, name: Optional[str] = None, parent: Optional["ThreadGroup"] = None) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"ThreadGroup name must be a str, not {type(name).__name__}")
        if parent is not None and not isinstance(parent, ThreadGroup):
            raise TypeError(f"ThreadGroup parent must be a ThreadGroup, not {type(parent).__name__}")
        install_start_hook()
        self.name = name or f"group-{id(self):x}"
        self.parent = parent if parent is not None else _current.get()
        # Weak references to the member threads, in order of joining, with no
        # callback: a thread object often dies as its thread ends, and a callback ran
        # there as the thread's only frame (the profiler's own code in the profile:
        # a stress test's churning threads were sampled in it); dead ones go when the
        # group is pruned.
        self._members: dict[weakref.ref, None] = {}
        self._pruned_at = 0
        self._children: list[ThreadGroup] = []
        self._tokens: list[contextvars.Token] = []
        if self.parent is not None:
            self.parent._children.append(self)
            _changed()

    @staticmethod
    def current() -> Optional["ThreadGroup"]:
        """The group current in this thread (or greenlet), if any."""
        return _current.get()

    def __enter__(self) -> "ThreadGroup":
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._tokens.pop())

    def add(self, thread: threading.Thread) -> None:
        """Make ``thread`` a member explicitly (for instance one already running)."""
        if not isinstance(thread, threading.Thread):
            raise TypeError(f"ThreadGroup.add takes a threading.Thread, not {type(thread).__name__}")
        self._join(thread)
        _notify(change_listeners)

    def _join(self, thread: threading.Thread) -> None:
        ref = weakref.ref(thread)
        if ref not in self._members:
            self._members[ref] = None
            _changed()
            if len(self._members) > 2 * self._pruned_at + 16:
                self._prune()

    def _discard(self, thread: threading.Thread) -> None:
        if self._members.pop(weakref.ref(thread), 0) is None:
            _changed()

    def _live_members(self) -> list[threading.Thread]:
        return [t for t in map(weakref.ref.__call__, list(self._members)) if t is not None]

    def _prune(self) -> None:
        # A thread that has finished leaves, and one no longer alive as an object;
        # one not yet started stays (it may start).
        for ref in list(self._members):
            t = ref()
            if (t is None or _finished(t)) and self._members.pop(ref, 0) is None:
                _changed()
        self._pruned_at = len(self._members)

    def threads(self, recursive: bool = True) -> list[threading.Thread]:
        """The live member threads (of subgroups too, by default)."""
        self._prune()
        out = [t for t in self._live_members() if t.ident is not None]
        if recursive:
            for child in self._children:
                out.extend(child.threads())
        return out

    def subgroups(self) -> Iterator["ThreadGroup"]:
        return iter(list(self._children))

    def __repr__(self) -> str:
        return f"<ThreadGroup {self.name!r}: {len(self.threads(False))} live threads, {len(self._children)} subgroups>"


def _finished(t: threading.Thread) -> bool:
    """Whether ``t`` has run and ended.  Not ``ident is not None and not
    is_alive()``: a thread being started has its ident a moment before it counts as
    alive (``Thread._started`` is set after), and pruning it then lost it for good."""
    started = getattr(t, "_started", None)
    # In this order: "started" must be seen before "not alive", or a thread that
    # becomes started between the two reads looks finished.
    if t.ident is None or (started is not None and not started.is_set()):
        return False
    return not t.is_alive()


class _WeakGreenlets:
    """Greenlets held weakly, with no callback: a greenlet can die inside the
    interpreter's pending calls, where Python code must not run (see
    ``greenlets.GreenletRecord``), so dead ones are dropped when the set has doubled
    since it was last pruned, and never seen meanwhile."""

    __slots__ = ("_refs", "_prune_at")

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self._prune_at = 16

    def __contains__(self, g: Any) -> bool:
        ref = self._refs.get(id(g))
        return ref is not None and ref() is g

    def __iter__(self) -> Iterator[Any]:
        return iter([g for g in (ref() for ref in list(self._refs.values())) if g is not None])

    def add(self, g: Any) -> None:
        if len(self._refs) >= self._prune_at:
            for key, ref in list(self._refs.items()):
                if ref() is None:
                    self._refs.pop(key, None)
            self._prune_at = max(16, 2 * len(self._refs))
        self._refs[id(g)] = weakref.ref(g)

    def discard(self, g: Any) -> None:
        if g in self:
            self._refs.pop(id(g), None)


class GreenletGroup:
    """Greenlets tracked as one, including those spawned later: a thread group for
    greenlets.

    A greenlet joins when it first runs if it was spawned by a member, or by a
    greenlet that is inside ``with group:`` at that moment (the spawner is gevent's
    ``spawning_greenlet``, else the greenlet's ``parent``, which for a plain greenlet
    is the one that made it).  Neither greenlet nor gevent tells when a greenlet is
    made, only when it first runs: so a block that spawns greenlets should also wait
    for them to start (``with group: gevent.joinall(jobs)``), and a greenlet spawned
    before the block by the same greenlet that first runs inside it joins too.  The
    gevent hub never joins.  What first runs is seen by the greenlet switch hook of
    the thread the group is made in (:mod:`sampler.greenlets`); greenlets of other
    threads join only through :meth:`add`.  Finished greenlets leave.  Tracking a
    group samples each live member while it runs.  :meth:`close` gives the hook back.
    """

    def __init__(self, name: Optional[str] = None) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"GreenletGroup name must be a str, not {type(name).__name__}")
        from . import greenlets

        self.name = name or f"greenlet-group-{id(self):x}"
        self._members = _WeakGreenlets()
        self._spawning = _WeakGreenlets()  # inside ``with group:``
        self._entered: list[Any] = []
        self._greenlets = greenlets
        self._hook = greenlets.attach()
        greenlets.new_greenlet_listeners.add(self._first_run)

    def __enter__(self) -> "GreenletGroup":
        current = self._greenlets.current_greenlet()
        self._entered.append(current)
        self._spawning.add(current)
        return self

    def __exit__(self, *exc: object) -> None:
        current = self._entered.pop()
        if current not in self._entered:
            self._spawning.discard(current)

    def add(self, g: Any) -> None:
        """Make greenlet ``g`` a member explicitly (one already running, say)."""
        from .tracking import is_greenlet

        if not is_greenlet(g):
            raise TypeError(f"GreenletGroup.add takes a greenlet, not {type(g).__name__}")
        self._join(g)

    def _join(self, g: Any) -> None:
        if g not in self._members:
            self._members.add(g)
            _changed()

    def _first_run(self, g: Any) -> None:
        if type(g).__name__ == "Hub":
            return
        spawner = getattr(g, "spawning_greenlet", None)
        spawner = spawner() if isinstance(spawner, weakref.ref) else spawner
        if spawner is None:
            spawner = getattr(g, "parent", None)
        if spawner is not None and (spawner in self._members or spawner in self._spawning):
            self._join(g)

    def greenlets(self) -> list[Any]:
        """The live members (started and not finished)."""
        return [g for g in list(self._members) if not getattr(g, "dead", True)]

    def close(self) -> None:
        """Stop watching for new greenlets (members stay); idempotent."""
        self._greenlets.new_greenlet_listeners.discard(self._first_run)
        hook, self._hook = self._hook, None
        self._greenlets.release(hook)

    def __repr__(self) -> str:
        return f"<GreenletGroup {self.name!r}: {len(self.greenlets())} live greenlets>"
