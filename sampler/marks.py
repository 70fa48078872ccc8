"""Marks: Python's counterpart of Racket's continuation marks.

``with mark(key, value):`` attaches ``(key, value)`` to the frame that runs the
``with`` for its dynamic extent.  Because a mark lives on a frame, it belongs to the
thread or greenlet whose stack holds that frame, and follows a generator or coroutine
when it is resumed elsewhere: exactly what a sampler walking that stack should see.
A sampler created with ``custom_keys`` records, per sample, one tuple per marked
extent on the sampled stack (innermost first) holding each custom key's value
(``None`` where that extent set another key).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
import time
from collections import deque
from types import FrameType
from typing import Any, Callable, Hashable, Iterator, Optional, TypeVar

try:
    from . import _native
except ImportError:  # the native engine is not built: marks live on frames only
    _native = None  # type: ignore[assignment]

F = TypeVar("F", bound=Callable[..., Any])

# frame -> [(key, value), ...], outermost extent first.  Read by the collector with
# one dict lookup per frame it walks; written only by the frame's own thread.
frame_marks: dict[FrameType, list[tuple[Hashable, Any]]] = {}

# The native engine cannot read frame_marks without the GIL: each extent is also
# pushed, as an entry id, on the thread's native mark stack (sampler._native), and the
# id is looked up here when the samples are filed. An id stays known for
# RETIRED_GRACE seconds after its extent ends, so that samples still buffered by the
# engine (drained every few milliseconds) can be filed with it.
RETIRED_GRACE = 5.0
_entries: dict[int, tuple[Hashable, Any]] = {}
_retired: deque = deque()  # (time retired, entry id), oldest first
_next_entry = itertools.count(1)


def mark_entries(ids: tuple) -> Iterator[tuple[Hashable, Any]]:
    """The ``(key, value)`` of each native entry id still known, in order."""
    for i in ids:
        entry = _entries.get(i)
        if entry is not None:
            yield entry


def _native_enter(frame: FrameType, key: Hashable, value: Any) -> int:
    now = time.monotonic()
    while _retired and now - _retired[0][0] > RETIRED_GRACE:
        _entries.pop(_retired.popleft()[1], None)
    eid = next(_next_entry) & 0xFFFFFFFF or next(_next_entry)
    _entries[eid] = (key, value)
    _native.mark_push(frame, eid)
    return eid


def _native_exit(eid: int) -> None:
    _native.mark_remove(eid)
    _retired.append((time.monotonic(), eid))


class mark:
    """Set ``key`` to ``value`` for a dynamic extent: a context manager and decorator."""

    __slots__ = ("key", "value", "_frames", "_entry_ids")

    def __init__(self, key: Hashable, value: Any) -> None:
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"mark key must be hashable, not {type(key).__name__}") from None
        self.key = key
        self.value = value
        self._frames: list[FrameType] = []
        self._entry_ids: list[int] = []

    def __enter__(self) -> "mark":
        frame = sys._getframe(1)
        self._frames.append(frame)
        frame_marks.setdefault(frame, []).append((self.key, self.value))
        if _native is not None:
            self._entry_ids.append(_native_enter(frame, self.key, self.value))
        return self

    def __exit__(self, *exc: object) -> None:
        if _native is not None and self._entry_ids:
            _native_exit(self._entry_ids.pop())
        frame = self._frames.pop()
        entries = frame_marks.get(frame)
        if entries:
            entries.pop()
            if not entries:
                del frame_marks[frame]

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` so every call of it runs inside this mark."""
        key, value = self.key, self.value
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def marked_coroutine(*args: Any, **kwargs: Any) -> Any:
                with mark(key, value):
                    return await fn(*args, **kwargs)
            return marked_coroutine  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def marked_generator(*args: Any, **kwargs: Any) -> Any:
                with mark(key, value):
                    return (yield from fn(*args, **kwargs))
            return marked_generator  # type: ignore[return-value]

        @functools.wraps(fn)
        def marked(*args: Any, **kwargs: Any) -> Any:
            with mark(key, value):
                return fn(*args, **kwargs)
        return marked  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"mark({self.key!r}, {self.value!r})"


def current_marks(key: Hashable, frame: Optional[FrameType] = None) -> list[Any]:
    """Values of ``key`` on the calling stack, innermost first (for the program itself)."""
    f = frame if frame is not None else sys._getframe(1)
    out = []
    while f is not None:
        entries = frame_marks.get(f)
        if entries:
            out.extend(v for k, v in reversed(entries) if k == key)
        f = f.f_back
    return out
