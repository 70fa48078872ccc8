"""Primitives of real OS threads, even when gevent has monkey-patched the program.

Under gevent's monkey-patching ``threading.Thread`` is a greenlet, ``time.sleep``
yields to the hub and ``threading.Lock`` is a gevent lock.  The collector must be a
real thread that wakes on its own, and the thread ids it uses must be the keys of
``sys._current_frames()``, so everything here comes from gevent's saved originals
when gevent has patched the module, and from the standard library otherwise.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


def _original(module: str, name: str) -> Any:
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None:
        try:
            if gevent_monkey.is_module_patched(module):
                return gevent_monkey.get_original(module, name)
        except Exception:  # an unexpected gevent version: fall back to the module
            pass
    return getattr(__import__(module), name)


def start_new_thread(function: Callable[..., object], args: tuple) -> int:
    """Start ``function(*args)`` in a real OS thread; return its ident."""
    return _original("_thread", "start_new_thread")(function, args)


def allocate_lock() -> Any:
    """A real lock, usable between real threads whatever gevent patched."""
    return _original("_thread", "allocate_lock")()


def allocate_rlock() -> Any:
    """A real reentrant lock: a signal handler that interrupts its holder and takes
    it again (on the same thread) goes through instead of deadlocking."""
    return _original("_thread", "RLock")()


def get_ident() -> int:
    """The ident of the calling OS thread, as ``sys._current_frames()`` keys it."""
    return _original("_thread", "get_ident")()


def get_native_id() -> int:
    return _original("_thread", "get_native_id")()


def sleep(seconds: float) -> None:
    """Block the calling OS thread (never yielding to a gevent hub)."""
    _original("time", "sleep")(seconds)
