"""Profile code in one step: :func:`profile_thunk`, and :func:`profile` as a context
manager or a decorator (Racket's ``profile-thunk`` and ``profile``).

Each starts a sampler on the calling thread (and, with ``threads=True``, on a fresh
:class:`~sampler.groups.ThreadGroup` the code runs in, so the threads it starts are
sampled too), runs the code, stops, analyses the snapshots and hands the profile to a
renderer.  The sampler's own bookkeeping is left out of the profile (see
:func:`trim_snapshots`), so what is shown is the code and what called it.

This is the ``stackshot`` layer: it uses both ``sampler`` (to collect) and
``analyzer`` (to analyse and render); ``sampler`` itself never imports the analyzer.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import os
import sys
import threading
import time
from array import array
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

from sampler import realthreads
from sampler.controller import Sampler, create_sampler
from sampler.groups import ThreadGroup
from sampler.shadow import check_mode
from sampler.snapshot import Frame, Snapshots, StackTrie, merge

from analyzer import Profile, analyze_samples, render_text

from .children import ChildCounter, ChildProfiles

__all__ = ["profile_thunk", "profile", "Profiler", "TEXT", "call_renderer", "trim_snapshots"]

T = TypeVar("T")
Renderer = Callable[..., Any]
ORDERS = ("topological", "self", "total")
"""The orders the analyzer's text renderer knows (checked before any code runs)."""


class _TextRenderer:
    """The default renderer: the analyzer's text report, printed to standard output.

    A named object rather than ``analyzer.render_text`` itself so that it has a
    readable repr in signatures and help.
    """

    def __call__(self, profile: "Profile", order: str = "topological") -> None:
        render_text(profile, sys.stdout, order=order)
        sys.stdout.flush()

    def __repr__(self) -> str:
        return "<text renderer>"


TEXT = _TextRenderer()
"""Racket's text layout, printed to ``sys.stdout``: the default ``render``."""


# ----------------------------------------------------------------------------------
# Renderers
# ----------------------------------------------------------------------------------
def call_renderer(render: Renderer, profile: "Profile", order: str) -> Any:
    """Call ``render`` with the profile, and the order if it accepts one.

    A renderer with a parameter named ``order`` gets it by keyword (so the analyzer's
    ``render_text(profile, file=None, *, order=...)`` works as is); one whose second
    positional parameter is required gets it positionally (Racket's ``(render profile
    order)``); any other -- ``render_dot(profile, file=None, ...)`` -- gets the
    profile alone, since an optional second parameter is not there for the order.

    A renderer that *returns* a string (as ``analyzer.render_text`` and
    ``render_dot`` do) has it printed to standard output, because a renderer whose
    work silently vanished would surprise everyone.
    """
    try:
        params = list(inspect.signature(render).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the profile alone
        params = []
    named = {p.name: p for p in params}
    accepts_order = named.get("order")
    if accepts_order is not None and accepts_order.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
        result = render(profile, order=order)
    else:
        positional = [p for p in params if p.kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        if len(positional) >= 2 and positional[1].default is inspect.Parameter.empty:
            result = render(profile, order)
        else:
            result = render(profile)
    if isinstance(result, str):
        sys.stdout.write(result)
        sys.stdout.flush()
    return result


def _check_renderer(name: str, render: Any) -> None:
    if render is not None and not callable(render):
        raise TypeError(f"{name} must be a callable taking a profile (or None), "
                        f"not {type(render).__name__}: {render!r:.60}")


def _check_periodic(periodic_renderer: Any) -> Optional[tuple[float, Renderer]]:
    if periodic_renderer is None:
        return None
    if not (isinstance(periodic_renderer, (tuple, list)) and len(periodic_renderer) == 2):
        raise TypeError("periodic_renderer must be a pair (seconds, renderer), "
                        f"not {periodic_renderer!r:.60}")
    seconds, render = periodic_renderer
    if (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
            or not math.isfinite(seconds) or seconds <= 0):
        raise ValueError(f"periodic_renderer's seconds must be a finite number > 0, not {seconds!r}")
    if not callable(render):
        raise TypeError(f"periodic_renderer's renderer must be callable, not {type(render).__name__}")
    return float(seconds), render


def _check_memory(memory: Any) -> Optional[float]:
    """``memory=``: ``None`` (profile time) or a sampling rate, 0 < rate <= 1, where the
    memprof engine is built (else a one-line ``RuntimeError`` saying so)."""
    if memory is None:
        return None
    if isinstance(memory, bool) or not isinstance(memory, numbers.Real):
        raise TypeError(f"memory must be a sampling rate (a number such as 1e-4), "
                        f"not {type(memory).__name__}")
    if not 0.0 < memory <= 1.0:
        raise ValueError(f"memory is a sampling rate per word, 0 < memory <= 1, not {memory!r}")
    from sampler import memprof

    if memprof._memprof is None:
        raise RuntimeError(memprof._UNAVAILABLE)
    return float(memory)


def _check_order(order: Any) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, not {order!r}")
    return order


# ----------------------------------------------------------------------------------
# Leaving the profiler's own frames out
# ----------------------------------------------------------------------------------
def _run_thunk(thunk: Callable[[], T]) -> T:
    """The one frame between the profiler and the profiled code (see trim_snapshots)."""
    return thunk()


_NOT_OURS = frozenset({"demo.py"})  # the bundled demo is a program to profile, not the profiler


def _own_files() -> frozenset[str]:
    """``co_filename`` of every module of the ``stackshot`` and ``sampler`` packages but
    the demo program.

    Built from a function's own ``co_filename`` in each package (so the strings are
    exactly those frames carry, relative or absolute, however the package was
    imported) and each package directory's listing (so modules not imported yet
    count too).
    """
    names: set[str] = set()
    for here in (_run_thunk.__code__.co_filename, create_sampler.__code__.co_filename):
        folder = os.path.dirname(here)
        try:
            listing = os.listdir(folder or ".")
        except OSError:
            listing = []
        names.update(os.path.join(folder, f) for f in listing
                     if f.endswith(".py") and f not in _NOT_OURS)
        names.add(here)
    from .children import BOOTSTRAP_DIR  # a child's sitecustomize, under --subprocesses

    names.add(os.path.join(BOOTSTRAP_DIR, "sitecustomize.py"))
    return frozenset(names)


def _runpy_files() -> frozenset[str]:
    """``co_filename`` of ``runpy`` and of the import machinery it uses to find and
    load a ``__main__`` (``"<frozen runpy>"`` and the like on 3.11+)."""
    import importlib._bootstrap as bootstrap
    import importlib._bootstrap_external as external
    import runpy

    names = {runpy._run_code.__code__.co_filename,  # type: ignore[attr-defined]
             getattr(runpy, "__file__", None),
             bootstrap._call_with_frames_removed.__code__.co_filename,  # type: ignore[attr-defined]
             external.SourceLoader.get_code.__code__.co_filename}
    return frozenset(n for n in names if n)


def cell_entries() -> tuple[Callable[..., Any], ...]:
    """In IPython, the function that runs a cell's code (``InteractiveShell.run_code``):
    cutting there starts a notebook's profile at the user's code, without the
    kernel's ipykernel, tornado, asyncio and traitlets frames above it.  Empty
    outside IPython (it is never imported here)."""
    if "IPython" not in sys.modules:
        return ()
    try:
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        return ()
    return (InteractiveShell.run_code,)


def _code_key(fn: Any) -> tuple[str, int]:
    """Where a function (or code object) starts: what a :class:`Frame` of it records,
    whether its name is recorded qualified (3.11+) or not."""
    code = getattr(fn, "__code__", fn)
    return (code.co_filename, code.co_firstlineno)


def trim_snapshots(
    snapshots: Snapshots,
    entries: Iterable[Callable[..., Any]] = (),
    *,
    overhead: Optional[Iterable[Callable[..., Any]]] = None,
    own_files: Optional[Iterable[str]] = None,
    launch_files: Optional[Iterable[str]] = None,
    outside_is_idle: bool = False,
) -> Snapshots:
    """The snapshots without the profiler's own frames and work.

    * In a stack that passes through an *entry* function (the frame that calls the
      profiled code: :func:`_run_thunk`, the command line's runner), that frame and
      every frame outside it are cut, and so are the ``runpy``, import machinery
      and sampler frames that follow it, so the profiled code's own outermost frame
      becomes the root.
    * A sample taken inside an *overhead* function is the profiler at work
      (starting, stopping, the command line before and after the program), inside
      an entry too (a ``with profile()`` block in a notebook cell, whose entry is
      the cell's runner: a collection as the stop joins the collector thread): it
      becomes an idle sample (stack 0), which bounds its neighbours' intervals but
      is charged to nobody.  By default the overhead functions are
      :class:`Profiler`'s ``__enter__`` and ``__exit__``.
    * So is a sample whose innermost frame is the sampler's own code.
    * Launcher frames (``own_files`` and ``launch_files``: the sampler's modules,
      ``runpy``) at the root of a stack are cut.
    * With ``outside_is_idle``, a sample that is in no entry at all (the host's own
      work around the profiled code: a notebook kernel between a magic and the
      cell's code) is idle too -- except in a greenlet's context: a greenlet runs
      from its own root, never inside the entry of the code that spawned it, and the
      host (a notebook kernel) runs none of its own in the sampled thread.
    * Other frames of the sampler's own code (a thread group's hook around
      ``Thread.start`` and ``run``, say) are spliced out: their caller is shown
      calling their callee, as it would be without the profiler.

    Runs, threads, times and marks are kept; frames no stack uses any more are
    dropped.
    """
    own = frozenset(own_files) if own_files is not None else _own_files()
    launch = frozenset(launch_files) if launch_files is not None else _runpy_files()
    skip = own | launch
    entry_keys = {_code_key(fn) for fn in entries}
    overhead_keys = {_code_key(fn) for fn in (
        overhead if overhead is not None else (Profiler.__enter__, Profiler.__exit__))}
    frames = snapshots.frames
    keys = [(f.filename, f.firstlineno) for f in frames]
    old_sf, old_sp = snapshots.stack_frame, snapshots.stack_parent
    n = len(old_sf)
    # Where a stack's walk from its root stands: ROOT, still among launcher frames at
    # the root; OUTER, in frames outside any entry; OVERHEAD, inside the profiler's
    # own work; STRIP, just past an entry, skipping runpy and sampler frames; INNER,
    # in the profiled code.
    ROOT, OUTER, OVERHEAD, STRIP, INNER = 0, 1, 2, 3, 4
    state = bytearray(n)  # stack 0, the empty stack, is ROOT
    new_id = array("I", bytes(4 * n))
    trie = StackTrie()  # frames keyed by their old id: frames stored twice stay two

    def intern(parent: int, old_frame: int) -> int:
        return trie.stack_id(parent, trie.frame_id(frames[old_frame], key=old_frame))

    final = array("I", bytes(4 * n))
    kept = array("I", bytes(4 * n))  # final, but for outside_is_idle (greenlets)
    for s in range(1, n):
        p, f = old_sp[s], old_sf[s]
        fr = frames[f]
        st = state[p]
        outside = st in (ROOT, OUTER, OVERHEAD)
        if outside and keys[f] in entry_keys:
            state[s], new_id[s] = STRIP, 0  # cut: the profiled code starts inside
        elif st == OVERHEAD or keys[f] in overhead_keys:
            state[s], new_id[s] = OVERHEAD, 0
        elif st in (ROOT, STRIP) and fr.filename in skip:
            state[s], new_id[s] = st, 0
        elif fr.filename in own:  # spliced out: its caller calls its callee directly
            state[s], new_id[s] = st, new_id[p]
        else:
            state[s] = OUTER if st in (ROOT, OUTER) else INNER
            new_id[s] = intern(new_id[p], f)
        kept[s] = 0 if (new_id[s] == 0 or fr.filename in own) else new_id[s]
        final[s] = 0 if (outside_is_idle and state[s] in (ROOT, OUTER)) else kept[s]

    greenlets = {t.id for t in snapshots.threads if t.kind == "greenlet"} if outside_is_idle else ()
    if greenlets:
        sample_stack = array("I", ((kept if tid in greenlets else final)[s] for s, tid in
                                   zip(snapshots.sample_stack, snapshots.sample_thread)))
    else:
        sample_stack = array("I", (final[s] for s in snapshots.sample_stack))
    new_frames, new_sf, new_sp, sample_stack = _compact(
        trie.frames, trie.stack_frame, trie.stack_parent, sample_stack)
    return Snapshots(
        frames=new_frames, stack_frame=new_sf, stack_parent=new_sp, threads=snapshots.threads,
        sample_thread=snapshots.sample_thread, sample_stack=sample_stack,
        sample_wall=snapshots.sample_wall, sample_cpu=snapshots.sample_cpu,
        sample_marks=snapshots.sample_marks, wall_overflow=snapshots.wall_overflow,
        cpu_overflow=snapshots.cpu_overflow, mark_sets=snapshots.mark_sets,
        custom_keys=snapshots.custom_keys, runs=snapshots.runs,
    )


def _compact(frames: list[Frame], stack_frame: array, stack_parent: array,
             sample_stack: array) -> tuple[list[Frame], array, array, array]:
    """Keep only the stacks (and frames) some sample uses, directly or as a caller."""
    used = bytearray(len(stack_frame))
    for s in set(sample_stack):
        while s and not used[s]:
            used[s] = 1
            s = stack_parent[s]
    stack_map = array("I", bytes(4 * len(stack_frame)))
    frame_map: dict[int, int] = {}
    out_frames: list[Frame] = []
    out_sf, out_sp = array("I", [0]), array("I", [0])
    for s in range(1, len(stack_frame)):  # parents come before children
        if used[s]:
            f = frame_map.get(stack_frame[s])
            if f is None:
                f = frame_map[stack_frame[s]] = len(out_frames)
                out_frames.append(frames[stack_frame[s]])
            stack_map[s] = len(out_sf)
            out_sf.append(f)
            out_sp.append(stack_map[stack_parent[s]])
    return out_frames, out_sf, out_sp, array("I", (stack_map[s] for s in sample_stack))


# ----------------------------------------------------------------------------------
# What was not seen: other threads
# ----------------------------------------------------------------------------------
def _thread_cpu(ident: int) -> Optional[float]:
    """A live thread's CPU seconds (``None`` when it cannot be read, e.g. it ended)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError, OverflowError):
        return None


class OtherThreads:
    """Counts the threads that used CPU while only some threads were sampled, so the
    report can say so ("3 other threads used up to 812ms, not sampled").

    Two kinds: threads alive when sampling starts whose CPU time grew by the end
    (read from their CPU clocks while they live), and ``threading`` threads started
    while it ran (seen by a :func:`threading.setprofile` hook that removes itself on
    the thread's first event).  The time is the report's to bound: the process CPU
    time no sample and no collector accounts for.
    """

    def __init__(self, tracked: Iterable[threading.Thread]) -> None:
        self._tracked = {t.ident for t in tracked}
        self._started: set[int] = set()
        self._before: dict[int, Optional[float]] = {}
        self._saved: Any = None

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        self._started.add(threading.get_ident())
        saved = self._saved  # (the program's own, e.g. another profiler's: it goes on)
        sys.setprofile(saved)  # one event per thread is all this needs
        if saved is not None:
            saved(frame, event, arg)

    def __enter__(self) -> "OtherThreads":
        self._before = {t.ident: _thread_cpu(t.ident) for t in threading.enumerate()
                        if t.ident is not None and t.ident not in self._tracked}
        self._saved = threading.getprofile()
        threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.getprofile() == self._hook:
            threading.setprofile(self._saved)  # (one the program set meanwhile stays)
        self.counted = self._count()

    counted = 0

    def _count(self) -> int:
        busy = set()
        for ident, before in self._before.items():
            after = _thread_cpu(ident)
            if before is None or after is None or after > before:
                busy.add(ident)
        return len(busy | (self._started - self._tracked))

    def extra(self) -> dict[str, Any]:
        """What the run's metadata records (read by the text report's header)."""
        return {"other_threads": self.counted} if self.counted else {}


def replace_snapshots(snapshots: Snapshots, **changes: Any) -> Snapshots:
    """A copy of ``snapshots`` with some fields replaced (``runs=``, ``threads=`` ...)."""
    fields = dict(
        frames=snapshots.frames, stack_frame=snapshots.stack_frame,
        stack_parent=snapshots.stack_parent, threads=snapshots.threads,
        sample_thread=snapshots.sample_thread, sample_stack=snapshots.sample_stack,
        sample_wall=snapshots.sample_wall, sample_cpu=snapshots.sample_cpu,
        sample_marks=snapshots.sample_marks, wall_overflow=snapshots.wall_overflow,
        cpu_overflow=snapshots.cpu_overflow, mark_sets=snapshots.mark_sets,
        custom_keys=snapshots.custom_keys, runs=snapshots.runs,
    )
    return Snapshots(**{**fields, **changes})


def _with_run_extra(snapshots: Snapshots, extra: dict[str, Any]) -> Snapshots:
    """The snapshots with ``extra`` added to every run's metadata."""
    return replace_snapshots(snapshots, runs=[dataclasses.replace(r, extra={**r.extra, **extra})
                                              for r in snapshots.runs])


# ----------------------------------------------------------------------------------
# The periodic renderer
# ----------------------------------------------------------------------------------
class _Periodic:
    """Renders the profile so far every few seconds, from a real OS thread.

    A real thread (not ``threading.Thread``) so that it runs beside CPU-bound code
    under gevent too, and so that it never joins the thread group being profiled.
    """

    def __init__(self, seconds: float, render: Renderer, sampler: Sampler, order: str,
                 trim: Callable[[Snapshots], Snapshots]) -> None:
        self.seconds, self.render, self.sampler, self.order = seconds, render, sampler, order
        self.trim = trim
        self._stop = realthreads.allocate_lock()
        self._stop.acquire()  # held until stop(): acquire(timeout) is the sleep
        self._done = realthreads.allocate_lock()
        self._done.acquire()
        realthreads.start_new_thread(self._main, ())

    def _main(self) -> None:
        try:
            while not self._stop.acquire(timeout=self.seconds):
                try:
                    prof = analyze_samples(self.trim(self.sampler.get_snapshots()))
                    call_renderer(self.render, prof, self.order)
                except Exception as e:  # never kill the program for a progress report
                    print(f"stackshot: the periodic renderer failed, and stops: "
                          f"{type(e).__name__}: {e}", file=sys.stderr)
                    return
        finally:
            self._done.release()

    def stop(self) -> None:
        self._stop.release()
        self._done.acquire(timeout=60)


# ----------------------------------------------------------------------------------
# The profiler
# ----------------------------------------------------------------------------------
class Profiler:
    """One profiling session: what ``with profile(...) as p:`` binds to ``p``.

    While the block runs, ``p.sampler`` is the live controller (pause it around code
    you do not want in the profile).  When the block ends -- normally or by an
    exception -- the sampler stops, ``p.snapshots`` holds what was collected,
    ``p.profile`` the analysed :class:`analyzer.Profile`, and the renderer has run.
    An exception from the block propagates after the profile is rendered.

    The keywords are :func:`profile_thunk`'s.  ``entries`` names the functions that
    call the profiled code (see :func:`trim_snapshots`): ``profile_thunk`` and the
    decorator pass theirs, so that their callers are cut from the profile; a block
    has none, so its callers stay.
    """

    def __init__(
        self,
        *,
        delay: float = 0.001,
        threads: bool = False,
        render: Optional[Renderer] = TEXT,
        periodic_renderer: Optional[tuple[float, Renderer]] = None,
        use_errortrace: Union[bool, str] = False,
        order: str = "topological",
        entries: Iterable[Callable[..., Any]] = (),
        memory: Optional[float] = None,
        subprocesses: bool = False,
    ) -> None:
        from sampler.controller import _check_delay

        self.delay = _check_delay(delay)
        self.memory = _check_memory(memory)
        self.threads = bool(threads)
        _check_renderer("render", render)
        self.render = render
        self.periodic_renderer = _check_periodic(periodic_renderer)
        self.use_errortrace = check_mode(use_errortrace)  # False, True or 'python'
        self.order = _check_order(order)
        self._entries = tuple(entries)
        self.sampler: Optional[Sampler] = None
        self.snapshots: Optional[Snapshots] = None
        self.profile: Optional["Profile"] = None
        self._group: Optional[ThreadGroup] = None
        self._periodic: Optional[_Periodic] = None
        self._others: Optional[OtherThreads] = None
        self._pid = 0
        self.subprocesses = bool(subprocesses)
        if self.subprocesses and self.memory is not None:
            raise ValueError("memory= profiles this process's allocations only; "
                             "it cannot be combined with subprocesses=True")
        self._counter: Optional[ChildCounter] = None
        self._children: Optional[ChildProfiles] = None

    def _options(self) -> dict[str, Any]:
        return dict(delay=self.delay, threads=self.threads, render=self.render,
                    periodic_renderer=self.periodic_renderer, use_errortrace=self.use_errortrace,
                    order=self.order, memory=self.memory, subprocesses=self.subprocesses)

    def _trim(self, snapshots: Snapshots) -> Snapshots:
        # a block has no entry of its own: in a notebook its profile starts at the cell
        return trim_snapshots(snapshots, self._entries or cell_entries())

    def __enter__(self) -> "Profiler":
        if self.sampler is not None:
            raise RuntimeError("this profile is already running; use a new profile(...) "
                               "for a nested or concurrent block")
        self.snapshots = self.profile = None
        group = ThreadGroup("stackshot profile") if self.threads and self.memory is None else None
        me = threading.current_thread()
        if self.memory is not None:  # allocations of every thread, not stacks over time
            from sampler.memprof import Recorder

            self.sampler = Recorder(self.memory)  # type: ignore[assignment]
        else:
            self.sampler = create_sampler([group, me] if group is not None else me, self.delay,
                                          use_errortrace=self.use_errortrace)
        self._pid = os.getpid()
        self._others = None
        if group is None and not self.use_errortrace and self.memory is None:
            self._others = OtherThreads([me]).__enter__()
        if self.periodic_renderer is not None:
            seconds, render = self.periodic_renderer
            self._periodic = _Periodic(seconds, render, self.sampler, self.order, self._trim)
        if group is not None:
            group.__enter__()
            self._group = group
        self._counter = ChildCounter().__enter__()
        if self.subprocesses:
            self._children = ChildProfiles(self.delay, self.threads).__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        sampler = self.sampler
        if sampler is None:
            return
        if os.getpid() != self._pid:
            # a process forked inside the block: the profile is the parent's to render
            self.sampler = None
            return
        others, self._others = self._others, None
        if others is not None:
            others.__exit__()
        counter, children = self._counter, self._children
        self._counter = self._children = None
        if counter is not None:
            counter.__exit__()
        if children is not None:
            children.__exit__()
        if self._group is not None:
            self._group.__exit__(exc_type, exc, tb)
            self._group = None
        if self._periodic is not None:
            self._periodic.stop()
            self._periodic = None
        sampler.stop()
        self.sampler = None
        self.snapshots = self._trim(sampler.get_snapshots())
        kids = children.collect(self._trim) if children is not None else []
        extra = {**(others.extra() if others is not None else {}),
                 **(counter.extra(profiled=len(kids)) if counter is not None else {})}
        if extra:
            self.snapshots = _with_run_extra(self.snapshots, extra)
        if kids:
            self.snapshots = merge(self.snapshots, *kids)
        self.profile = analyze_samples(self.snapshots)
        if exc is not None:
            print(f"stackshot: the profiled code raised {_one_line(exc)}; "
                  "the profile shows what ran until then", file=sys.stderr)
        if self.render is not None:
            call_renderer(self.render, self.profile, self.order)
        # returning None lets an exception from the block propagate

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        """Decorate ``fn``: each call is profiled (and rendered) on its own.

        A recursive call of a decorated function runs inside the outer call's profile
        rather than starting a profile of its own.  The last call's results are in
        ``fn.profiler.profile`` and ``fn.profiler.snapshots``.
        """
        if not callable(fn):
            raise TypeError(f"profile() decorates a function, not {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"profile() cannot decorate the coroutine function {fn.__qualname__}: "
                            "a call only creates the coroutine; use `with profile():` inside it")
        active = threading.local()
        options = self._options()

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            if getattr(active, "on", False):
                return fn(*args, **kwargs)
            active.on = True
            session = Profiler(**options, entries=(_run_thunk,))
            try:
                with session:
                    return _run_thunk(lambda: fn(*args, **kwargs))
            finally:
                active.on = False
                self.snapshots, self.profile = session.snapshots, session.profile

        wrapper.profiler = self  # type: ignore[attr-defined]
        return wrapper

    def __repr__(self) -> str:
        state = ("running" if self.sampler is not None
                 else "done" if self.profile is not None else "not started")
        return f"<Profiler {state}, delay {self.delay}s, threads={self.threads}>"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def profile(
    func: Optional[Callable[..., Any]] = None,
    /,
    *,
    delay: float = 0.001,
    threads: bool = False,
    render: Optional[Renderer] = TEXT,
    periodic_renderer: Optional[tuple[float, Renderer]] = None,
    use_errortrace: Union[bool, str] = False,
    order: str = "topological",
    memory: Optional[float] = None,
    subprocesses: bool = False,
) -> Union[Profiler, Callable[..., Any]]:
    """Profile a block (``with profile() as p:``) or every call of a function.

    ``with profile(...) as p:`` returns a :class:`Profiler`; after the block
    ``p.profile`` is the analysed profile and ``p.snapshots`` the raw snapshots.
    ``@profile`` and ``@profile(...)`` decorate a function.  The keywords mean what
    they mean for :func:`profile_thunk`; ``render=None`` only collects.
    """
    p = Profiler(delay=delay, threads=threads, render=render, periodic_renderer=periodic_renderer,
                 use_errortrace=use_errortrace, order=order, memory=memory, subprocesses=subprocesses)
    return p if func is None else p(func)


def profile_thunk(
    thunk: Callable[[], T],
    *,
    delay: float = 0.001,
    repeat: int = 1,
    threads: bool = False,
    render: Optional[Renderer] = TEXT,
    periodic_renderer: Optional[tuple[float, Renderer]] = None,
    use_errortrace: Union[bool, str] = False,
    order: str = "topological",
    memory: Optional[float] = None,
    subprocesses: bool = False,
) -> Optional[T]:
    """Run ``thunk()`` ``repeat`` times under a sampler, render the profile, return the
    last call's value (``None`` when ``repeat`` is 0).

    ``delay``: seconds between samples.  ``threads=True``: the thunk runs in a fresh
    :class:`~sampler.groups.ThreadGroup`, which is tracked with the calling thread, so
    the threads it starts are sampled too.  ``render``: a callable taking the profile
    (and the order, if it accepts one); ``None`` renders nothing.
    ``periodic_renderer=(seconds, renderer)`` renders the profile so far every
    ``seconds`` while the thunk runs.  ``order``: ``'topological'``, ``'self'`` or
    ``'total'``, passed to the renderer.  ``memory=RATE`` profiles allocations
    instead of time (:mod:`sampler.memprof`, every thread): each allocated word is
    sampled with probability ``RATE`` (``0 < RATE <= 1``; 1e-4 costs no visible time),
    and the profile is in estimated bytes allocated (``unit='B'``; its ``'wall'``
    view, bytes still live, is in ``p.snapshots``).  An exception from the thunk stops the
    repetitions, is reported on stderr, and is re-raised after the profile is
    rendered.  ``subprocesses=True``: the child processes the thunk starts that run
    Python (``os.fork``, ``multiprocessing``, ``subprocess``) are profiled too, and
    merged in, each child's threads named with its pid (see :mod:`stackshot.children`);
    without it the report says how many child processes ran unprofiled.  Every
    argument is checked before the thunk runs.
    """
    if not callable(thunk):
        raise TypeError(f"profile_thunk() needs a callable taking no arguments, "
                        f"not {type(thunk).__name__}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
        raise ValueError(f"repeat must be an integer >= 0, not {repeat!r}")
    session = Profiler(delay=delay, threads=threads, render=render,
                       periodic_renderer=periodic_renderer, use_errortrace=use_errortrace,
                       order=order, entries=(_run_thunk,), memory=memory, subprocesses=subprocesses)
    result: Optional[T] = None
    with session:
        for _ in range(repeat):
            result = _run_thunk(thunk)
    return result
