"""``threading.Thread`` objects under gevent's monkey-patching, and the OS threads they
name.

After ``gevent.monkey.patch_all()``, ``threading.Thread`` is gevent's class (a
subclass of the original), ``threading.get_ident()`` returns the id of the running
greenlet, and the main thread's ``ident`` and the keys of ``threading._active`` are
greenlet ids too -- never the keys of ``sys._current_frames()``, which the sampler
reads.  A Thread object's ``native_id`` still names its OS thread (the main thread's
was set at start-up; a patched thread's is the OS thread its greenlet runs in), so a
Thread object is turned into the OS thread it runs in through its native id.  A
program that patches itself while a sampler runs (``stackshot script.py``) goes on
being sampled: everything here is read afresh, never cached from before the patch.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

from . import realthreads
from .clocks import native_id_of, native_id_of_ident

# The standard library's Thread class, whatever gevent has patched (gevent's Thread
# and _DummyThread derive from it).
_BASE_THREAD: type = realthreads._original("threading", "Thread")
# native id -> ident of its OS thread, learned from the threads that called in.
_os_ident_of_native: dict[int, int] = {}


def is_thread(obj: Any) -> bool:
    """Whether ``obj`` is a ``threading.Thread``, patched by gevent or not."""
    return isinstance(obj, (_BASE_THREAD, threading.Thread))


def threading_patched() -> bool:
    """Whether gevent has replaced ``threading.Thread`` (cheap: read on every tick)."""
    return threading.Thread is not _BASE_THREAD


def remember_calling_os_thread() -> None:
    """Learn the OS ident of the calling thread (a program thread calling the API:
    the collector, which does the look-ups later, cannot learn it)."""
    _os_ident_of_native[realthreads.get_native_id()] = realthreads.get_ident()


def os_ident_of(thread: Any, frames: Optional[dict] = None) -> Optional[int]:
    """The ident (a key of ``sys._current_frames()``) of the OS thread ``thread`` runs
    in, or ``None`` when it has not started or cannot be found."""
    ident = thread.ident
    if ident is None or not threading_patched():
        return ident
    native = native_id_of(thread)
    if native is None:
        return None
    if frames is None:
        frames = sys._current_frames()
    known = _os_ident_of_native.get(native)
    if known is not None and known in frames:
        return known
    if native == realthreads.get_native_id():
        found: Optional[int] = realthreads.get_ident()
    else:
        # A thread present in these frames (see clocks.native_id_of_ident).
        found = next((i for i in frames if native_id_of_ident(i) == native), None)
    if found is not None:
        _os_ident_of_native[native] = found
    return found


def owner_of(ident: int, active: dict) -> Any:
    """The Thread object of the OS thread ``ident`` (``None`` for a thread started
    with ``_thread``).  Under patching, ``threading._active`` is keyed by greenlet
    ids: the OS thread that runs the main thread is found by its native id."""
    owner = active.get(ident)
    if owner is None:
        # (Also while gevent patches: it re-keys the main thread a moment before it
        # replaces threading.Thread.)
        main = threading.main_thread()
        native = native_id_of(main)
        if native is not None and main.ident != ident:
            known = _os_ident_of_native.get(native)
            if known is None and threading_patched():
                known = os_ident_of(main)
            if known == ident:
                return main
    return owner


def os_thread_view(thread: Any, frames: dict, active: dict) -> tuple[Optional[int], Any]:
    """``(OS ident, Thread object that names that OS thread)`` for a tracked Thread;
    under patching the second is the OS thread's own (the main thread for a greenlet
    of the main thread), so that its name and id are the OS thread's."""
    ident = os_ident_of(thread, frames)
    if ident is None or not threading_patched():
        return ident, thread
    return ident, owner_of(ident, active) or thread


def _forget_after_fork() -> None:
    _os_ident_of_native.clear()
    remember_calling_os_thread()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
remember_calling_os_thread()
