"""``create_sampler`` and the controller it returns.

The controller is Racket's: a function taking a message and an optional argument
(``ctl('pause')``, ``ctl('set-delay!', 0.001)``, ``ctl('get-snapshots')``).  It is
also an object with a method per message and a context manager that stops on exit,
because that is what a Python user reaches for.
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import socket
import sys
import time
import weakref
from typing import Any, Hashable, Optional, Sequence

from . import engines, switchinterval
from .collector import Collector
from .recorder import Recorder
from .snapshot import RunInfo, Snapshots
from .tracking import Tracker, flatten

__all__ = ["create_sampler", "Sampler", "SamplerError", "MESSAGES"]

MESSAGES = (
    "pause", "resume", "stop", "set-tracked!", "set-delay!", "get-snapshots",
    "get-custom-snapshots", "get-errors",
)
_TAKES_ARGUMENT = {"set-tracked!", "set-delay!"}
_STOP_TIMEOUT = 5.0
_MISSING: Any = object()
_live: "weakref.WeakSet[Sampler]" = weakref.WeakSet()


class SamplerError(RuntimeError):
    """A message that is valid but not now (a ``'resume'`` without a ``'pause'``)."""


def _check_delay(delay: Any, what: str = "delay") -> float:
    if isinstance(delay, bool) or not isinstance(delay, numbers.Real):
        raise TypeError(f"{what} must be a real number of seconds >= 0, not {type(delay).__name__}: {delay!r}")
    value = float(delay)
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {delay!r}")
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
    """The controller of one sampler run.  Create it with :func:`create_sampler`."""

    def __init__(self, to_track: Any, delay: float, custom_keys: Sequence[Hashable],
                 engine: str = "python") -> None:
        self.custom_keys = tuple(custom_keys)
        self.engine = engine
        self._start_epoch = time.time()
        self._start = time.perf_counter()
        self._recorder = Recorder(self.custom_keys, self._start)
        collector_class: Any = Collector
        if engine == "native":
            from .native_engine import NativeCollector

            collector_class = NativeCollector
        self._collector = collector_class(Tracker(flatten(to_track)), delay, self._recorder)
        # Only a collector that takes the GIL needs the switch interval lowered.
        self._lowers_interval = getattr(self._collector, "needs_switch_interval", True)
        self._stop_time: Optional[float] = None
        self._forked = False
        # Time and process CPU while not paused (Racket's cpu time), accumulated at
        # each pause and stop; _open_* mark the start of the current interval.
        self._sampling_wall = 0.0
        self._process_cpu = 0.0
        self._open_wall: Optional[float] = self._start
        self._open_cpu: Optional[float] = time.process_time()
        self._want_interval(delay)
        _live.add(self)
        self._collector.start()

    # -- the Racket face ---------------------------------------------------------
    def __call__(self, message: str, arg: Any = _MISSING) -> Any:
        if not isinstance(message, str) or message not in MESSAGES:
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
        c = self._collector
        with c.state_lock:
            c.paused += 1
            if c.paused == 1 and not c.stopped:
                self._close_interval()
                self._release_interval()
        c.wake()

    def resume(self) -> None:
        """Undo one :meth:`pause`; a resume without a pause is an error."""
        c = self._collector
        with c.state_lock:
            if c.paused == 0:
                raise SamplerError("'resume' without a matching 'pause'")
            c.paused -= 1
            if c.paused == 0 and not c.stopped:
                self._open_interval()
                self._want_interval(c.delay)
        c.wake()

    def stop(self) -> None:
        """End the collector thread for good (idempotent); snapshots stay readable."""
        c = self._collector
        with c.state_lock:
            first = not c.stopped
            if first:
                c.stopped = True
                if not c.paused:
                    self._close_interval()
                self._stop_time = time.perf_counter()
        if first:
            self._release_interval()
            c.wake()
        if not self._forked:
            c.join(_STOP_TIMEOUT)

    def set_tracked(self, to_track: Any) -> None:
        """Track something else; a number changes the delay (Racket's documented form)."""
        if isinstance(to_track, numbers.Real) and not isinstance(to_track, bool):
            return self.set_delay(to_track)
        tracker = Tracker(flatten(to_track))
        c = self._collector
        with c.state_lock:
            c.tracker = tracker
        c.wake()

    def set_delay(self, delay: float) -> None:
        """Change the seconds between snapshots from now on."""
        value = _check_delay(delay)
        c = self._collector
        with c.state_lock:
            c.delay = value
            if not c.paused and not c.stopped:
                self._want_interval(value)
        c.wake()

    def get_snapshots(self) -> Snapshots:
        """Everything collected so far: a frozen copy, as often as you like."""
        flush = getattr(self._collector, "flush", None)
        if flush is not None:
            flush()  # samples the engine holds natively
        run = self._run_info()
        with self._recorder.lock:
            return self._recorder.snapshot(run)

    def get_custom_snapshots(self) -> list[tuple]:
        """Per sample, oldest first, the mark vectors of the custom keys, innermost
        extent first (Racket's ``continuation-mark-set->list*`` shape)."""
        with self._recorder.lock:
            return self._recorder.custom_snapshots()

    # -- state -----------------------------------------------------------------
    @property
    def errors(self) -> list[str]:
        """Tracebacks of exceptions raised inside the collector (never in the program)."""
        c = self._collector
        extra = c.error_count - len(c.errors)
        return list(c.errors) + ([f"... and {extra} more"] if extra > 0 else [])

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

    # -- accounting ---------------------------------------------------------------
    def _want_interval(self, delay: float) -> None:
        if self._lowers_interval:
            switchinterval.want(id(self), delay)

    def _release_interval(self) -> None:
        if self._lowers_interval:
            switchinterval.release(id(self))

    def _open_interval(self) -> None:
        self._open_wall = time.perf_counter()
        self._open_cpu = time.process_time()

    def _close_interval(self) -> None:
        if self._open_wall is not None and self._open_cpu is not None:
            self._sampling_wall += time.perf_counter() - self._open_wall
            self._process_cpu += time.process_time() - self._open_cpu
        self._open_wall = self._open_cpu = None

    def _run_info(self) -> RunInfo:
        c = self._collector
        with c.state_lock:
            wall, cpu = self._sampling_wall, self._process_cpu
            if self._open_wall is not None and self._open_cpu is not None:
                wall += time.perf_counter() - self._open_wall
                cpu += time.process_time() - self._open_cpu
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
        return extra

    def _after_fork_in_child(self) -> None:
        self._forked = True
        self._collector.reset_after_fork()
        if self._stop_time is None:
            self._stop_time = time.perf_counter()
        self._close_interval()


def create_sampler(
    to_track: Any,
    delay: float,
    custom_keys: Optional[Sequence[Hashable]] = None,
    *,
    use_errortrace: bool = False,
    engine: Optional[str] = None,
) -> Sampler:
    """Start a collector thread sampling ``to_track`` every ``delay`` seconds.

    ``to_track`` is a ``threading.Thread``, a :class:`ThreadGroup`, a greenlet,
    :data:`ALL_THREADS`, or a (nested) list of these.  Returns the controller.
    ``engine`` is ``'native'`` (read frames without the GIL; the default where the
    extension is built) or ``'python'`` (see :mod:`sampler.engines`).
    Arguments are checked before any thread starts.
    """
    keys = _check_custom_keys(custom_keys)
    flatten(to_track)
    value = _check_delay(delay)
    if use_errortrace:
        raise NotImplementedError(
            "use_errortrace=True (an instrumented shadow stack, seeing C functions too) "
            "is not implemented yet; sample the interpreter's own stack with the default"
        )
    return Sampler(to_track, value, keys, engines.choose(engine))


def _stop_all_at_exit() -> None:
    for s in list(_live):
        try:
            with s._collector.state_lock:
                running = not s._collector.stopped
            if running:
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
