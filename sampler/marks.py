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
from collections import deque
from types import FrameType
from typing import Any, Callable, Hashable, Iterator, Optional, TypeVar

from . import realthreads
from .engines import _native  # None where the native engine is not built: marks live on frames only

F = TypeVar("F", bound=Callable[..., Any])

# frame -> ((key, value), ...), outermost extent first.  Read by the collector with
# one dict lookup per frame it walks; written only by the frame's own thread, each
# change one store of a new tuple (a reader never sees a half-made change).
frame_marks: dict[FrameType, tuple[tuple[Hashable, Any], ...]] = {}


def _unmark(frame: FrameType, entry: tuple) -> None:
    """Take ``entry`` (compared by identity) off ``frame``; doing it twice is harmless."""
    old = frame_marks.get(frame, ())
    rest = tuple(e for e in old if e is not entry)
    if len(rest) != len(old):
        if rest:
            frame_marks[frame] = rest
        else:
            frame_marks.pop(frame, None)

# The native engine cannot read frame_marks without the GIL: each extent is also
# pushed, as an entry id, on the thread's native mark stack (sampler._native), and the
# id is looked up here when the samples are filed. A sample carrying an id was copied
# before its extent ended (the collector reads the stack again if it changed), so the
# first drain that begins after the end holds it, if an earlier one did not: an id
# stays known until every native collector that reads marks has filed such a drain
# (hold_retired, filed_retired), however late. Not for a fixed time: under load a
# drain came 6.3 s after the samples it filed were taken, and with a grace of 5 s a
# sample in 'tiny' was filed without its mark (3.12, 2 samples in 3,065).
_entries: dict[int, tuple[Hashable, Any]] = {}
_retired: deque = deque()  # (retirement number, entry id), in about that order
_retirement = itertools.count(1)
_last_retired = [0]  # the latest retirement number given
_holders: dict[int, list] = {}  # id(cell) -> cell: [retirement number its collector filed up to]
_forgetting = realthreads.allocate_lock()
_next_entry = itertools.count(1)


def mark_entries(ids: tuple) -> Iterator[tuple[Hashable, Any]]:
    """The ``(key, value)`` of each native entry id still known, in order."""
    for i in ids:
        entry = _entries.get(i)
        if entry is not None:
            yield entry


def retirements() -> int:
    """The number of the latest extent to end (read before a drain: every sample
    carrying the id of one that ended by then is in that drain or filed already)."""
    return _last_retired[0]


def hold_retired() -> list:
    """A native collector that reads marks starts (before its first sample): ids of
    extents that end from now on stay known until it has filed them. Returns its hold."""
    cell = [_last_retired[0]]
    _holders[id(cell)] = cell
    return cell


def filed_retired(hold: list, upto: int) -> None:
    """The collector of ``hold`` has filed every sample that can carry the id of an
    extent retired with a number up to ``upto``."""
    if upto > hold[0]:
        hold[0] = upto
    _forget()


def release_retired(hold: list) -> None:
    """The collector of ``hold`` will file no more samples (stopped, or in a forked child)."""
    _holders.pop(id(hold), None)
    _forget()


def _forget() -> None:
    """Forget the ids every holder has filed (all of them when none holds)."""
    if not _forgetting.acquire(False):
        return  # another thread forgets now (or this one, from a signal handler)
    try:
        holds = list(_holders.values())
        limit = min(h[0] for h in holds) if holds else _last_retired[0]
        while _retired and _retired[0][0] <= limit:
            _entries.pop(_retired.popleft()[1], None)
    finally:
        _forgetting.release()


def _native_enter(frame: FrameType, key: Hashable, value: Any, holder: list) -> None:
    """Push the extent on the thread's native mark stack; its id goes into ``holder``
    first, so that an interruption after any step can still undo them all."""
    eid = next(_next_entry) & 0xFFFFFFFF or next(_next_entry)
    holder[0] = eid
    _entries[eid] = (key, value)
    _native.mark_push(frame, eid)


def _native_exit(holder: list) -> None:
    """Take the extent off the native mark stack (idempotent). Its id stays known while
    a native collector may hold a sample carrying it (see hold_retired).

    An interruption can cut this short anywhere, and the caller runs it again: so the
    id in ``holder`` is cleared last (cleared first, an interruption before the
    removal left the extent on the native stack, carried by every later sample of
    its frame, and its id known for good: 10 ids left by the interruption tests)."""
    eid = holder[0]
    if eid and _native is not None:
        _native.mark_remove(eid)
        if _holders:
            n = next(_retirement)
            _retired.append((n, eid))  # (twice, if run again: harmless)
            _last_retired[0] = n
        else:  # no collector reads marks: no sample can carry it
            _entries.pop(eid, None)
        holder[0] = 0


class mark:
    """Set ``key`` to ``value`` for a dynamic extent: a context manager and decorator.

    A ``KeyboardInterrupt`` (or any exception a signal handler raises) can land
    between any two instructions of ``__enter__`` and ``__exit__``.  A mark left
    behind would be carried by every later sample of its frame, so both are written
    to end in a consistent state when interrupted: ``__enter__`` commits in one store
    and undoes a commit that an interruption cut short before it returned;
    ``__exit__`` takes the mark off (idempotently) inside ``try`` and takes it off
    again on the interruption before letting it go on.

    Two places stay open, which Python code cannot guard: an interruption handled at
    the entry of ``__exit__``, before its ``try`` (3.11+ check for signals there),
    and, on 3.10 only, one handled between ``__enter__``'s commit and its return
    (3.10 checks between most instructions; 3.11+ only at function entries, backward
    jumps and after calls, and there are none after the commit).
    """

    __slots__ = ("key", "value", "_frames", "_entry_ids")

    def __init__(self, key: Hashable, value: Any) -> None:
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"mark key must be hashable, not {type(key).__name__}") from None
        self.key = key
        self.value = value
        # (frame, entry, [native entry id]) per open extent
        self._frames: list[tuple[FrameType, tuple, list]] = []

    def __enter__(self) -> "mark":
        frame = sys._getframe(1)
        extent = (frame, (self.key, self.value), [0])
        try:
            self._frames.append(extent)
            if _native is not None:
                _native_enter(frame, self.key, self.value, extent[2])
            frame_marks[frame] = frame_marks.get(frame, ()) + (extent[1],)
            return self
        except BaseException:
            _unmark(frame, extent[1])
            _native_exit(extent[2])
            if extent in self._frames:
                self._frames.remove(extent)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._close(sys._getframe(1))
        except BaseException:
            self._close(sys._getframe(1))
            raise

    def _close(self, frame: FrameType) -> None:
        extents = self._frames
        if extents and extents[-1][0] is frame:
            frame, entry, native_id = extents[-1]
            _unmark(frame, entry)
            _native_exit(native_id)
            extents.pop()

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
            out.extend(e[1] for e in reversed(entries) if e[0] == key)
        f = f.f_back
    return out
