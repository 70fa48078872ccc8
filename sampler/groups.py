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
"""

from __future__ import annotations

import contextvars
import threading
from typing import Callable, Iterator, Optional

_current: contextvars.ContextVar[Optional["ThreadGroup"]] = contextvars.ContextVar(
    "stackshot_thread_group", default=None
)
_original_start = None
_install_lock = threading.Lock()

# Called in a thread as it starts running, when it is a group member or a tracked
# thread that had not started when tracking began: an engine that learns of threads
# only now and then (the native one) sees it from its first instruction.
start_listeners: "set[Callable[[], None]]" = set()


def notify_started() -> None:
    """Tell every listener that the calling thread has just started."""
    for listener in list(start_listeners):
        try:
            listener()
        except Exception:  # a profiler's trouble never reaches the program
            pass


def _install_start_hook() -> None:
    """Wrap ``Thread.start`` once so that a new thread joins the current group."""
    global _original_start
    with _install_lock:
        if _original_start is not None:
            return
        original = threading.Thread.start

        def start(self: threading.Thread) -> None:
            group = _current.get()
            if group is None:
                return original(self)
            inner_run = self.run

            def run_in_group() -> None:
                _current.set(group)
                notify_started()
                inner_run()

            self.run = run_in_group  # type: ignore[method-assign]
            group._members.append(self)
            try:
                original(self)
            except BaseException:
                group._discard(self)
                raise

        start.__doc__ = original.__doc__
        start.__wrapped__ = original  # type: ignore[attr-defined]
        threading.Thread.start = start  # type: ignore[method-assign]
        _original_start = original


class ThreadGroup:
    """A set of threads and subgroups that can be tracked as one (a custodian)."""

    def __init__(self, name: Optional[str] = None, parent: Optional["ThreadGroup"] = None) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"ThreadGroup name must be a str, not {type(name).__name__}")
        if parent is not None and not isinstance(parent, ThreadGroup):
            raise TypeError(f"ThreadGroup parent must be a ThreadGroup, not {type(parent).__name__}")
        _install_start_hook()
        self.name = name or f"group-{id(self):x}"
        self.parent = parent if parent is not None else _current.get()
        self._members: list[threading.Thread] = []
        self._children: list[ThreadGroup] = []
        self._tokens: list[contextvars.Token] = []
        if self.parent is not None:
            self.parent._children.append(self)

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
        if thread not in self._members:
            self._members.append(thread)

    def _discard(self, thread: threading.Thread) -> None:
        try:
            self._members.remove(thread)
        except ValueError:
            pass

    def _prune(self) -> None:
        # A thread that has finished leaves; one not yet started stays (it may start).
        self._members = [t for t in self._members if t.is_alive() or t.ident is None]

    def threads(self, recursive: bool = True) -> list[threading.Thread]:
        """The live member threads (of subgroups too, by default)."""
        self._prune()
        out = [t for t in self._members if t.ident is not None]
        if recursive:
            for child in self._children:
                out.extend(child.threads())
        return out

    def subgroups(self) -> Iterator["ThreadGroup"]:
        return iter(list(self._children))

    def __repr__(self) -> str:
        return f"<ThreadGroup {self.name!r}: {len(self.threads(False))} live threads, {len(self._children)} subgroups>"
