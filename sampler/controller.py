"""``create_sampler`` and the controller it returns.

The controller is Racket's: a function taking a message and an optional argument
(``ctl('pause')``, ``ctl('set-delay!', 0.001)``, ``ctl('get-snapshots')``).  It is
also an object with a method per message and a context manager that stops on exit,
because that is what a Python user reaches for.
"""

from __future__ import annotations

import atexit
import itertools
import math
import numbers
import os
import socket
import sys
import time
import warnings
import weakref
from typing import Any, Hashable, Optional, Sequence

from . import engines, switchinterval
from .collector import Collector
from .gctime import GCWatch, native_gc_hook
from .shadow import check_mode, make_shadow, shadow_engine
from .recorder import Recorder
from .snapshot import RunInfo, Snapshots
from .tracking import Tracker, TrackingWarning, ended, flatten, not_started

__all__ = ["create_sampler", "Sampler", "SamplerError", "MESSAGES"]

MESSAGES = (
    "pause", "resume", "stop", "set-tracked!", "set-delay!", "get-snapshots",
    "get-custom-snapshots", "get-errors",
)
_TAKES_ARGUMENT = {"set-tracked!", "set-delay!"}
_STOP_TIMEOUT = 5.0
_MISSING: Any = object()
_live: "weakref.WeakSet[Sampler]" = weakref.WeakSet()
_tokens = itertools.count(1)


class SamplerError(RuntimeError):
    """A message that is valid but not now (a ``'resume'`` without a ``'pause'``)."""


MAX_DELAY = 86400.0
"""The longest delay accepted, one day: a longer one cannot be a profiling interval,
and beyond it the collector's deadline arithmetic loses its precision (``1e300``
passed the old check and killed the collector after one sample)."""
MIN_DELAY = 1e-6
"""The shortest positive delay accepted, one microsecond (``0`` still means "as often
as possible"): a subnormal delay such as ``5e-324`` made ``lateness // delay``
infinite and killed the collector."""


def _check_delay(delay: Any, what: str = "delay") -> float:
    """``delay`` as a float of seconds: 0, or from :data:`MIN_DELAY` to :data:`MAX_DELAY`.

    Compared before it is converted, so ``2**2000`` is refused with this message rather
    than an ``OverflowError`` from ``float()``.
    """
    if isinstance(delay, bool) or not isinstance(delay, numbers.Real):
        raise TypeError(f"{what} must be a real number of seconds >= 0, not {type(delay).__name__}: {delay!r}")
    bounds = (f"0 (as often as possible) or a finite number of seconds >= 0 from "
              f"{MIN_DELAY:g} to {MAX_DELAY:g} (one day)")
    if delay != delay or not 0 <= delay <= MAX_DELAY:  # NaN, infinities, huge ints
        shown = repr(delay) if not isinstance(delay, int) or abs(delay) < 10**30 else f"an int of {delay.bit_length()} bits"
        raise ValueError(f"{what} must be {bounds}, not {shown}")
    value = float(delay)
    if 0 < value < MIN_DELAY:
        raise ValueError(f"{what} {delay!r} is too short: it must be {bounds}")
    return value


def _check_custom_keys(custom_keys: Any) -> tuple:
    if custom_keys is None:
        return ()
    if not isinstance(custom_keys, (list, tuple)):
        raise TypeError(f"custom_keys must be a list of mark keys, not {type(custom_keys).__name__}: {custom_keys!r}")
    for i, key in enumerate(custom_keys):
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"custom_keys[{i}] must be hashable, not {type(key).__name__}") from None
    if len(set(custom_keys)) != len(custom_keys):
        raise ValueError(f"custom_keys has a key twice: {custom_keys!r}")
    return tuple(custom_keys)


class Sampler:
    """The controller of one sampler run.  Create it with :func:`create_sampler`.

    Every message is safe to send from any thread, at any time, and from a signal
    handler -- also one that interrupted another message, or ran while the collector
    was recording: no message waits for a lock that its own thread may hold (see
    :class:`~sampler.collector.Collector` for the contract with the collector).
    Changes are single atomic stores, and what follows from them (the accounting of
    sampled time, the shared switch interval) is brought in line by :meth:`_sync`,
    which is idempotent and runs again until the state it acted on is still current.

    A controller that becomes unreachable without ``stop`` is stopped then (its
    collector thread ends and the switch interval is given back); one still running
    at interpreter exit is stopped at exit.
    """

    def __init__(self, to_track: Any, delay: float, custom_keys: Sequence[Hashable],
                 engine: str = "python", gc_time: bool = True, use_errortrace: Any = False) -> None:
        self.custom_keys = tuple(custom_keys)
        self.engine = engine
        self._start_epoch = time.time()
        self._start = time.perf_counter()
        self._recorder = Recorder(self.custom_keys, self._start)
        collector_class: Any = Collector
        if engine == "native":
            from .native_engine import NativeCollector

            collector_class = NativeCollector
        leaves = flatten(to_track)
        tracker = Tracker(leaves)  # (holds the thread's greenlet switch hook)
        try:
            self._collector = collector_class(tracker, delay, self._recorder)
        except BaseException:
            tracker.release()
            raise
        self._watch_leaves(leaves)
        self._gc_watch = GCWatch(self._start) if gc_time else None
        self._collector.gc_watch = self._gc_watch
        self.use_errortrace = use_errortrace
        self._shadow = make_shadow(use_errortrace, engine) if use_errortrace else None
        self._collector.shadow = self._shadow
        # Only a collector that takes the GIL needs the switch interval lowered.
        self._lowers_interval = getattr(self._collector, "needs_switch_interval", True)
        self._token = next(_tokens)  # this run's claim on the switch interval
        self._stop_time: Optional[float] = None
        self._forked = False
        # Time and process CPU while not paused (Racket's cpu time): closed intervals
        # as (wall, cpu) items, and the open one's start, if any.  Lists, because an
        # append or a pop is atomic even against a signal handler.
        self._closed: list[tuple[float, float]] = []
        self._opened: list[tuple[float, float]] = [(self._start, time.process_time())]
        if self._lowers_interval:
            switchinterval.want(self._token, delay)
        _live.add(self)
        self._finalizer = weakref.finalize(self, _stop_dropped, self._collector, self._token)
        if self._gc_watch is not None:
            self._gc_watch.active = True
            self._gc_watch.install()
        if self._shadow is not None:
            try:
                self._shadow.install()
            except BaseException:  # nothing of this run may stay behind
                self._collector.stopped = True
                self._collector.tracker.release()
                if self._gc_watch is not None:
                    self._gc_watch.remove()
                self._finalizer.detach()
                switchinterval.release(self._token)
                _live.discard(self)
                raise
        self._collector.start()

    # -- the Racket face ---------------------------------------------------------
    def __call__(self, message: str, arg: Any = _MISSING) -> Any:
        if not isinstance(message, str):  # a wrong kind of value, not a wrong message
            raise TypeError(f"a sampler message is a string, one of {', '.join(MESSAGES)}; "
                            f"not {type(message).__name__} {message!r:.60}")
        if message not in MESSAGES:
            raise ValueError(f"unknown sampler message {message!r}; valid messages: {', '.join(MESSAGES)}")
        if message in _TAKES_ARGUMENT:
            if arg is _MISSING:
                raise TypeError(f"the {message!r} message needs an argument")
        elif arg is not _MISSING:
            raise TypeError(f"the {message!r} message takes no argument, got {arg!r}")
        if message == "pause":
            return self.pause()
        if message == "resume":
            return self.resume()
        if message == "stop":
            return self.stop()
        if message == "set-tracked!":
            return self.set_tracked(arg)
        if message == "set-delay!":
            return self.set_delay(arg)
        if message == "get-snapshots":
            return self.get_snapshots()
        if message == "get-custom-snapshots":
            return self.get_custom_snapshots()
        return self.errors

    # -- methods -----------------------------------------------------------------
    def pause(self) -> None:
        """Stop collecting until a matching :meth:`resume`; pauses nest."""
        self._collector.pause()
        self._sync()
        self._collector.wake()

    def resume(self) -> None:
        """Undo one :meth:`pause`; a resume without a pause is an error."""
        try:
            self._collector.resume()
        except IndexError:
            raise SamplerError("'resume' without a matching 'pause'") from None
        self._sync()
        self._collector.wake()

    def stop(self) -> None:
        """End the collector thread for good (idempotent); snapshots stay readable."""
        c = self._collector
        if not c.stopped:
            if self._stop_time is None:
                self._stop_time = time.perf_counter()
            c.stopped = True
            c.wake()
        self._sync()
        if not self._forked:
            c.join(_STOP_TIMEOUT)
        c.tracker.release()  # the greenlet switch hook (sampler.greenlets)
        self._warn_never_started()

    def set_tracked(self, to_track: Any) -> None:
        """Track something else; a number changes the delay (Racket's documented form)."""
        if isinstance(to_track, numbers.Real) and not isinstance(to_track, bool):
            return self.set_delay(to_track)
        leaves = flatten(to_track)
        old, self._collector.tracker = self._collector.tracker, Tracker(leaves)
        old.release()
        self._collector.wake()
        self._warn_never_started()
        self._watch_leaves(leaves)

    def set_delay(self, delay: float) -> None:
        """Change the seconds between snapshots from now on."""
        self._collector.delay = _check_delay(delay)
        self._sync()
        self._collector.wake()

    def get_snapshots(self) -> Snapshots:
        """Everything collected so far: a frozen copy, as often as you like."""
        flush = getattr(self._collector, "flush", None)
        if flush is not None:
            flush()  # the samples an engine holds natively
        return self._recorder.snapshot(self._run_info())

    def get_custom_snapshots(self) -> list[tuple]:
        """Per sample, oldest first, the mark vectors of the custom keys, innermost
        extent first (Racket's ``continuation-mark-set->list*`` shape)."""
        return self._recorder.custom_snapshots()

    # -- state -----------------------------------------------------------------
    @property
    def errors(self) -> list[str]:
        """Tracebacks of exceptions raised inside the collector (never in the program)."""
        c = self._collector
        errors = list(c.errors)
        extra = c.error_count - len(errors)
        return errors + ([f"... and {extra} more"] if extra > 0 else [])

    @property
    def paused(self) -> bool:
        return self._collector.paused > 0

    @property
    def stopped(self) -> bool:
        return self._collector.stopped

    @property
    def delay(self) -> float:
        return self._collector.delay

    def __enter__(self) -> "Sampler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "paused" if self.paused else "sampling"
        return f"<Sampler {state}, delay {self.delay}s, {len(self._recorder.sample_thread)} samples>"

    # -- what can never be sampled ---------------------------------------------------
    def _watch_leaves(self, leaves: tuple) -> None:
        """Warn now of what has already ended, and remember the threads not started
        yet: one that is still not started when it stops being tracked (at ``stop``
        or ``set-tracked!``) was never sampled, and is warned of then."""
        self._unstarted = not_started(leaves)
        for what in ended(leaves):
            warnings.warn(f"the sampler tracks something it can never sample: {what}",
                          TrackingWarning, stacklevel=_caller_level())

    def _warn_never_started(self) -> None:
        unstarted, self._unstarted = getattr(self, "_unstarted", []), []
        for t in unstarted:
            if t.ident is None:
                warnings.warn(f"thread {t.name!r} was tracked but never started while it was: "
                              "it was never sampled (start it before the sampler stops)",
                              TrackingWarning, stacklevel=_caller_level())

    # -- keeping the consequences in line ---------------------------------------------
    def _sync(self) -> None:
        """Make the sampled-time accounting and the switch interval follow the
        collector's state.  Idempotent; a handler or another thread that changes the
        state meanwhile makes it look again, so the last one to finish leaves it right."""
        c = self._collector
        while True:
            state = (c.paused, c.stopped, c.delay)
            if self._gc_watch is not None:
                self._gc_watch.active = not (state[0] or state[1] or self._forked)
                if state[1] or self._forked:
                    self._gc_watch.remove()
            if self._shadow is not None and (state[1] or self._forked):
                self._shadow.remove()
            if not state[0] and not state[1] and not self._forked:
                if not self._opened:
                    self._opened.append((time.perf_counter(), time.process_time()))
                if self._lowers_interval:
                    switchinterval.want(self._token, state[2])
            else:
                self._close_interval()
                if self._lowers_interval:
                    switchinterval.release(self._token)
            if (c.paused, c.stopped, c.delay) == state:
                return

    def _close_interval(self) -> None:
        opened = None
        while self._opened:
            try:
                opened = self._opened.pop()
            except IndexError:
                break
        if opened is not None:
            self._closed.append((time.perf_counter() - opened[0], time.process_time() - opened[1]))

    def _run_info(self) -> RunInfo:
        c = self._collector
        closed = self._closed[:]
        opened = self._opened[:1]
        wall = sum(w for w, _ in closed)
        cpu = sum(p for _, p in closed)
        if opened:
            wall += time.perf_counter() - opened[0][0]
            cpu += time.process_time() - opened[0][1]
        end = self._stop_time if self._stop_time is not None else time.perf_counter()
        delay = c.delay
        from . import __version__

        return RunInfo(
            pid=os.getpid(), host=socket.gethostname(),
            python=f"{sys.implementation.name} {sys.version.split()[0]}",
            stackshot=__version__, start_epoch=self._start_epoch, duration=end - self._start,
            sampling_wall=wall, process_cpu=cpu, requested_delay=delay, ticks=c.ticks,
            late_ticks=c.late_ticks, missed_ticks=c.missed_ticks,
            torn_samples=getattr(c, "torn_samples", self._recorder.torn_samples),
            achieved_rate=c.ticks / wall if wall > 0 else 0.0,
            requested_rate=1 / delay if delay > 0 else math.inf,
            collector_cpu=c.collector_cpu, custom_keys=self.custom_keys, stopped=c.stopped,
            errors=tuple(self.errors), extra=self._extra_info(), engine=self.engine,
        )

    def _extra_info(self) -> dict:
        extra = dict(getattr(self._collector, "extra_info", dict)())
        if self._forked:
            extra["forked_child"] = True
        if self._shadow is not None:  # the samples are of instrumented stacks
            extra["use_errortrace"] = self.use_errortrace
            extra["shadow_overflow"] = self._shadow.overflow
        if self._gc_watch is not None:
            extra["gc_collections"] = self._gc_watch.collections
            # per generation, of the collections filed (in sampled threads)
            extra["gc_seconds"] = {str(g): us / 1e6 for g, us in sorted(self._recorder.gc_cpu.items())}
            extra["gc_wall_seconds"] = {str(g): us / 1e6 for g, us in sorted(self._recorder.gc_wall.items())}
        return extra

    def _after_fork_in_child(self) -> None:
        self._forked = True
        if self._gc_watch is not None:  # the child's collections are nobody's to read
            self._gc_watch.active = False
            self._gc_watch.remove()
        if self._shadow is not None:
            self._shadow.remove()
        self._collector.reset_after_fork()
        if self._stop_time is None:
            self._stop_time = time.perf_counter()
        self._close_interval()


def _stop_dropped(collector: Collector, token: int) -> None:
    """A controller became unreachable (or the interpreter is exiting): nobody can
    read what it collects any more, so end its collector and give the interval back.
    Holds no reference to the controller, only to what it owned."""
    collector.stopped = True
    if collector.gc_watch is not None:
        collector.gc_watch.remove()
    if collector.shadow is not None:
        collector.shadow.remove()
    # (from any thread: the last user's release makes the hook inert, and only its
    # own thread takes it out of greenlet's trace)
    collector.tracker.release()
    collector.wake()
    switchinterval.release(token)


def create_sampler(
    to_track: Any,
    delay: float,
    custom_keys: Optional[Sequence[Hashable]] = None,
    *,
    use_errortrace: Any = False,
    engine: Optional[str] = None,
    gc_time: Optional[bool] = None,
) -> Sampler:
    """Start a collector thread sampling ``to_track`` every ``delay`` seconds.

    ``to_track`` is a ``threading.Thread``, a :class:`ThreadGroup`, a greenlet,
    :data:`ALL_THREADS`, or a (nested) list of these.  Returns the controller.
    ``engine`` is ``'native'`` (read frames without the GIL; the default where the
    extension is built) or ``'python'`` (see :mod:`sampler.engines`).
    ``use_errortrace``: ``True`` samples an instrumented shadow stack kept by
    interpreter events instead of the interpreter's frames, with C functions as
    frames of their own; ``'python'`` keeps Python frames only, for less cost (see
    :mod:`sampler.shadow`).
    ``gc_time``: time every garbage collection (``gc.callbacks``) and file it as a
    sample of the stack that triggered it plus a ``<gc>`` frame (see
    :mod:`sampler.gctime`); ``False`` leaves collections inside the samples around them.
    The default, ``None``, is ``True`` wherever the C hook is built (either engine),
    and on the native engine; ``False`` on the Python engine without the extension:
    the Python twin of the hook runs Python code inside every collection, which lets
    the GIL change hands there, and that crashed CPython 3.11 under the Python
    collector's frame walk (see :mod:`sampler.gctime`).
    Arguments are checked before any thread starts.
    """
    keys = _check_custom_keys(custom_keys)
    flatten(to_track)
    value = _check_delay(delay)
    mode = check_mode(use_errortrace)
    if gc_time is not None and not isinstance(gc_time, bool):
        raise TypeError(f"gc_time must be True or False, not {type(gc_time).__name__}: {gc_time!r}")
    chosen = engines.choose(engine)
    if mode:
        chosen = shadow_engine(chosen, engine)
    if gc_time is None:
        gc_time = chosen == "native" or native_gc_hook()
    return Sampler(to_track, value, keys, chosen, gc_time, mode)


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the code that called the sampler
    (the first frame outside this package)."""
    here = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame, level = frame.f_back, level + 1
    return level


def _stop_all_at_exit() -> None:
    for s in list(_live):
        try:
            if not s._collector.stopped:
                s.stop()
        except Exception:
            pass


def _after_fork_in_child() -> None:
    switchinterval.forget_after_fork()
    for s in list(_live):
        s._after_fork_in_child()


atexit.register(_stop_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
