"""Instrumented stacks (``use_errortrace``): a shadow stack per thread, kept by
interpreter events, sampled instead of the interpreter's frames.

Racket's errortrace and MLton's Enter/Leave keep an exact stack by instrumenting
every function entry and exit.  Here the interpreter's own events do it:

* Python 3.12+: ``sys.monitoring`` -- ``PY_START``, ``PY_RESUME``, ``PY_THROW`` push the
  frame's code, ``PY_RETURN``, ``PY_YIELD``, ``PY_UNWIND`` pop it; with C functions,
  ``CALL`` of anything that is not a Python function pushes the callable and
  ``C_RETURN`` / ``C_RAISE`` pop it.  The profiler's tool id is used when free, else
  another free one (cProfile claims the profiler's).
* Before 3.12: a profile function (``sys.setprofile`` in the starting thread and
  ``threading.setprofile`` for threads started later): ``call`` / ``return``, and
  ``c_call`` / ``c_return`` / ``c_exception``.  Only one profile function can run
  per thread, so another profiler (cProfile) running makes this a clear error.
  With Python frames only, the native engine uses a frame-evaluation hook instead
  (PEP 523, :class:`NativeShadowStacks`), far cheaper on 3.11.

Each thread's stack is seeded from its live frames at its first event after
sampling starts (and again after a greenlet switch, which changes the whole stack:
see :meth:`ShadowStacks.unseed`), so it is exact from then on.  A pop names what it
pops (a code object, a callable): entries above it are dropped with it, and a pop
of something not on the stack is ignored, so one missed event cannot skew the rest.
A seed can come while a frame's own start event is still on its way: a greenlet
collected by the GC is killed in the middle of whatever allocated (a frame being
entered, its frame object being made for its event), and code that runs then (a
weakref callback) seeds the stack with the frame already in it.  So a start event
whose frame is the seeded top is not pushed again (:class:`_Stack`).

This module is the Python twin, whose callbacks are Python functions (2-2.6x on
call-heavy code, DESIGN.md); :mod:`sampler.native_engine` has the same callbacks in
C.  A stack holds at most :data:`MAX_DEPTH` entries; deeper pushes are counted
(``overflow``) and popped first.  The stacks are written by their own thread under
the GIL and copied whole by the collector under the GIL: a copy is never torn.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FunctionType, MethodType
from typing import Any, Optional

from . import realthreads
from .snapshot import Frame

MAX_DEPTH = 1024
"""Entries kept per stack; deeper ones are counted, not stored."""

C_FILE_PREFIX = "<C "
MODES = (True, "python")
_MONITORING = sys.version_info >= (3, 12)


def check_mode(use_errortrace: Any) -> Any:
    """``False``, ``True`` (Python and C functions) or ``'python'`` (Python frames only)."""
    if use_errortrace is False or use_errortrace is None:
        return False
    if use_errortrace is True or use_errortrace == "python":
        return use_errortrace
    raise ValueError(f"use_errortrace must be False, True (Python and C functions) or 'python' "
                     f"(Python frames only), not {use_errortrace!r}")


def c_frame(callable_: Any) -> Frame:
    """The frame a C function (builtin, method of an extension type, a type called)
    appears as: its qualified name, in ``<C module>``."""
    if callable_ is None:
        return Frame("<C function>", f"{C_FILE_PREFIX}?>", 0, None)
    name = getattr(callable_, "__qualname__", None)
    owner = getattr(callable_, "__self__", None)
    if not isinstance(name, str):
        name = type(callable_).__qualname__ + ".__call__"
    elif owner is not None and not isinstance(owner, type(sys)) and "." not in name:
        name = f"{type(owner).__qualname__}.{name}"
    module = getattr(callable_, "__module__", None)
    if not isinstance(module, str):
        module = getattr(owner, "__name__", None) if isinstance(owner, type(sys)) else None
        if not isinstance(module, str):
            module = type(owner).__module__ if owner is not None else "builtins"
    return Frame(name, f"{C_FILE_PREFIX}{module}>", 0, None)


def is_python_callable(callable_: Any) -> bool:
    """Whether calling it runs a Python frame directly (no C function of its own)."""
    return type(callable_) is FunctionType or (type(callable_) is MethodType
                                               and type(callable_.__func__) is FunctionType)


def free_tool_id() -> int:
    """The profiler's ``sys.monitoring`` tool id when free, else another free one."""
    mon = sys.monitoring
    for tool in (mon.PROFILER_ID, 3, 4, mon.OPTIMIZER_ID, mon.COVERAGE_ID, mon.DEBUGGER_ID):
        if mon.get_tool(tool) is None:
            return tool
    raise RuntimeError("use_errortrace needs a sys.monitoring tool id, and all six are taken")


class _Stack(list):
    """One thread's entries, outermost first, and the frames the bottom ones were
    seeded from (``id`` of each, while that entry is still the seeded one)."""

    __slots__ = ("seeded",)

    def __init__(self, entries: list, frame_ids: list) -> None:
        super().__init__(entries)
        self.seeded = frame_ids

    def starts_seeded(self, code: Any, frame: Any) -> bool:
        """Whether ``frame`` starting (running ``code``) is the seeded top already:
        seeded while its start event was on its way."""
        n = len(self)
        return 0 < n <= len(self.seeded) and self[-1] is code and self.seeded[n - 1] == id(frame)


class ShadowStacks:
    """The shadow stacks of every thread, kept by Python callbacks (the twin of the
    native engine's C callbacks).  ``c_functions``: C functions get entries too."""

    def __init__(self, c_functions: bool = True) -> None:
        self.c_functions = c_functions
        self.stacks: dict[int, list] = {}  # OS thread ident -> entries, outermost first
        self.excess: dict[int, int] = {}  # pushes beyond MAX_DEPTH not popped yet
        self.overflow = 0  # pushes that did not fit, in all
        self.tool: Optional[int] = None
        self.installed = False
        self._ident = realthreads.get_ident
        self._c_frames: dict[Any, Frame] = {}
        self._previous_gtrace: Any = None
        self._gtrace_installed = False

    # -- installing ------------------------------------------------------------------
    def install(self) -> None:
        self._ident = realthreads._original("_thread", "get_ident")
        self.installed = True  # before the hooks: their first events come at once
        try:
            if _MONITORING:
                self._install_monitoring()
            else:
                self._install_profile()
        except BaseException:
            self.installed = False
            raise
        self._install_greenlet_trace()

    def remove(self) -> None:
        """Undo :meth:`install` (idempotent): no tool id, profile function or greenlet
        tracer of ours is left behind."""
        if not self.installed:
            return
        self.installed = False
        if _MONITORING:
            mon = sys.monitoring
            tool = self.tool
            if tool is not None and mon.get_tool(tool) == "stackshot":
                mon.set_events(tool, 0)
                for event in self._events():
                    mon.register_callback(tool, event, None)
                mon.free_tool_id(tool)
            self.tool = None
        else:
            self._remove_profile()
        self._remove_greenlet_trace()
        self.stacks.clear()

    def _remove_profile(self) -> None:
        if sys.getprofile() == self._profile:
            sys.setprofile(None)
        if threading.getprofile() == self._profile:  # type: ignore[attr-defined]
            threading.setprofile(None)  # type: ignore[arg-type]

    def _events(self) -> list:
        E = sys.monitoring.events
        events = [E.PY_START, E.PY_RESUME, E.PY_THROW, E.PY_RETURN, E.PY_YIELD, E.PY_UNWIND]
        if self.c_functions:
            events += [E.CALL, E.C_RETURN, E.C_RAISE]
        return events

    def _install_monitoring(self) -> None:
        mon = sys.monitoring
        E = mon.events
        tool = free_tool_id()
        mon.use_tool_id(tool, "stackshot")
        self.tool = tool
        push, pop, call, c_return = self._callbacks()
        mask = 0
        for event in self._events():
            callback = {E.PY_START: push, E.PY_RESUME: push, E.PY_THROW: push, E.PY_RETURN: pop,
                        E.PY_YIELD: pop, E.PY_UNWIND: pop, E.CALL: call}.get(event, c_return)
            mon.register_callback(tool, event, callback)
            mask |= event
        mon.set_events(tool, mask)

    def _callbacks(self) -> tuple:
        """The monitoring callbacks: push (PY_START, PY_RESUME, PY_THROW), pop
        (PY_RETURN, PY_YIELD, PY_UNWIND), call (CALL), C return (C_RETURN, C_RAISE)."""
        return self._push_code, self._pop_code, self._push_call, self._pop_call

    def _install_profile(self) -> None:
        current = sys.getprofile()
        if current is not None and current != self._profile:
            raise RuntimeError(
                f"use_errortrace before Python 3.12 needs the thread's profile function, and "
                f"another profiler holds it ({current!r}): stop it first, or use Python 3.12+")
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def _install_greenlet_trace(self) -> None:
        greenlet = sys.modules.get("greenlet")
        if greenlet is None or not hasattr(greenlet, "settrace"):
            return
        self._previous_gtrace = greenlet.settrace(self._gtrace)
        self._gtrace_installed = True

    def _remove_greenlet_trace(self) -> None:
        if not self._gtrace_installed:
            return
        self._gtrace_installed = False
        greenlet = sys.modules.get("greenlet")
        if greenlet is not None and greenlet.gettrace() == self._gtrace:
            greenlet.settrace(self._previous_gtrace)
        # else another tracer chained ours: ours stays, passing events on, inactive

    def _gtrace(self, event: str, args: Any) -> None:
        if self.installed:
            self.unseed()
        previous = self._previous_gtrace
        if previous is not None:
            previous(event, args)

    # -- reading -----------------------------------------------------------------------
    def stack_of(self, ident: Optional[int]) -> Optional[tuple]:
        """The entries of thread ``ident``'s stack, outermost first (code objects and
        :class:`Frame` values for C functions); ``None`` when it is not seeded yet."""
        stack = self.stacks.get(ident)  # type: ignore[arg-type]
        return None if stack is None else tuple(stack)

    def unseed(self) -> None:
        """Forget the calling thread's stack: its next event seeds it again from the
        live frames (after a greenlet switch, when the whole stack changed)."""
        ident = self._ident()
        self.stacks.pop(ident, None)
        self.excess.pop(ident, None)

    # -- the callbacks -----------------------------------------------------------------
    def _seed(self, ident: int, frame: Any) -> list:
        codes, frames = [], []
        while frame is not None:
            codes.append(frame.f_code)
            frames.append(id(frame))
            frame = frame.f_back
        codes.reverse()
        frames.reverse()
        del codes[MAX_DEPTH:], frames[MAX_DEPTH:]
        stack = self.stacks[ident] = _Stack(codes, frames)
        return stack

    def _push(self, ident: int, stack: list, entry: Any) -> None:
        if len(stack) >= MAX_DEPTH:
            self.excess[ident] = self.excess.get(ident, 0) + 1
            self.overflow += 1
        else:
            stack.append(entry)

    def _pop(self, ident: int, stack: list, entry: Any) -> None:
        excess = self.excess.get(ident)
        if excess:
            self.excess[ident] = excess - 1
            return
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is entry:
                del stack[i:]
                if i < len(stack.seeded):  # (a seeded entry's frame has ended)
                    del stack.seeded[i:]
                return

    def _push_code(self, code: CodeType, offset: int, exc: Any = None) -> None:
        ident = self._ident()
        stack = self.stacks.get(ident)
        if stack is None:
            self._seed(ident, sys._getframe(1))  # holds the frame starting now
        elif not (stack and stack[-1] is code and stack.starts_seeded(code, sys._getframe(1))):
            self._push(ident, stack, code)

    def _pop_code(self, code: CodeType, offset: int, value: Any) -> None:
        ident = self._ident()
        stack = self.stacks.get(ident)
        if stack is None:
            stack = self._seed(ident, sys._getframe(1))  # still holds the frame ending
        self._pop(ident, stack, code)

    def _c_entry(self, callable_: Any) -> Frame:
        key = getattr(callable_, "__qualname__", None), type(callable_), getattr(callable_, "__module__", None)
        frame = self._c_frames.get(key)
        if frame is None:
            if len(self._c_frames) > 4096:
                self._c_frames.clear()
            frame = self._c_frames[key] = c_frame(callable_)
        return frame

    def _push_call(self, code: CodeType, offset: int, callable_: Any, arg0: Any) -> None:
        if is_python_callable(callable_):
            return
        ident = self._ident()
        stack = self.stacks.get(ident)
        if stack is None:
            stack = self._seed(ident, sys._getframe(1))
        self._push(ident, stack, self._c_entry(callable_))

    def _pop_call(self, code: CodeType, offset: int, callable_: Any, arg0: Any) -> None:
        if is_python_callable(callable_):
            return
        ident = self._ident()
        stack = self.stacks.get(ident)
        if stack is None:
            self._seed(ident, sys._getframe(1))
            return
        if stack and stack[-1] is self._c_entry(callable_):
            stack.pop()
        elif self.excess.get(ident):
            self.excess[ident] -= 1

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        """The profile function (before 3.12): the same pushes and pops."""
        if not self.installed:  # removed from another thread: leave this one too
            if sys.getprofile() == self._profile:
                sys.setprofile(None)
            return
        ident = self._ident()
        stack = self.stacks.get(ident)
        if stack is None:
            stack = self._seed(ident, frame)
            if event == "call":
                return
        if event == "call":
            code = frame.f_code
            if not (stack and stack[-1] is code and stack.starts_seeded(code, frame)):
                self._push(ident, stack, code)
        elif event == "return":
            self._pop(ident, stack, frame.f_code)
        elif not self.c_functions:
            return
        elif event == "c_call":
            self._push(ident, stack, self._c_entry(arg))
        elif stack and stack[-1] is self._c_entry(arg):  # c_return, c_exception
            stack.pop()
        elif self.excess.get(ident):
            self.excess[ident] -= 1


def native_shadow_available() -> bool:
    """Whether the native engine has its C callbacks (:class:`NativeShadowStacks`) here."""
    from . import engines

    return engines.native_available() and hasattr(engines._native, "shadow_start")


class NativeShadowStacks(ShadowStacks):
    """The same stacks kept by C callbacks (``sampler/_native/shadowstacks.h``), in C
    memory, which the native collector reads without the GIL (a sequence counter
    per stack tells it to read again when the owner was writing).

    :meth:`stack_of` gives, outermost first, code objects' *addresses* (ints: an
    address on a shadow stack is never turned back into an object) and C
    functions' frames."""

    def __init__(self, c_functions: bool = True) -> None:
        super().__init__(c_functions)
        from . import _native

        self._native = _native

    _running: list = []  # the one instance whose session runs (the C state is the module's)
    _hook_verdict: Optional[bool] = None  # whether the eval-frame hook sees every call here
    hooked = False  # the eval-frame hook keeps this session's stacks (no events)

    def install(self) -> None:
        if NativeShadowStacks._running:
            raise RuntimeError("another sampler with use_errortrace runs on the native engine: "
                               "stop it first (the C shadow stacks are one per process)")
        hook = self._hook_possible()
        self._native.shadow_start(self.c_functions, c_frame, not hook)  # no profile function with the hook
        NativeShadowStacks._running.append(self)
        try:
            if hook and self._install_hook():
                self.installed = True
                self._install_greenlet_trace()
            else:
                super().install()
        except BaseException:
            self._end_session()
            raise

    def _hook_possible(self) -> bool:
        return (not self.c_functions and hasattr(self._native, "shadow_hook")
                and NativeShadowStacks._hook_verdict is not False)

    def _install_hook(self) -> bool:
        """Python frames only (``'python'``): keep the stacks by the eval-frame hook
        (``shadowstacks.h``), far cheaper than events, where it is built (3.10-3.11), no
        other frame evaluator is installed, and it passed :func:`_hook_sees_every_call`."""
        n = self._native
        if n.shadow_hook(True) and NativeShadowStacks._hook_verdict is None:
            NativeShadowStacks._hook_verdict = _hook_sees_every_call(n.shadow_top)
            if not NativeShadowStacks._hook_verdict:
                n.shadow_hook(False)
        if not n.shadow_stats()["eval_hook"]:  # start over with events, on a fresh session
            n.shadow_stop()
            n.shadow_start(self.c_functions, c_frame)
            return False
        self.hooked = True
        return True

    def _end_session(self) -> None:
        if self in NativeShadowStacks._running:
            NativeShadowStacks._running.remove(self)
            if self.hooked:
                self._native.shadow_hook(False)
                self.hooked = False
            self._native.shadow_stop()

    def remove(self) -> None:
        if self.installed:
            self._end_session()
        super().remove()

    def _callbacks(self) -> tuple:
        n = self._native
        return n.shadow_push, n.shadow_pop, n.shadow_call, n.shadow_c_return

    def _install_profile(self) -> None:
        # the C profile function went into every thread state (shadow_start); threads
        # started later put it in place at their first event
        if threading.getprofile() is not None:  # type: ignore[attr-defined]
            raise RuntimeError("use_errortrace before Python 3.12 needs threading.setprofile, which "
                               "another profiler holds: stop it first, or use Python 3.12+")
        threading.setprofile(self._native.shadow_profile_bootstrap)

    def _remove_profile(self) -> None:
        if threading.getprofile() is self._native.shadow_profile_bootstrap:  # type: ignore[attr-defined]
            threading.setprofile(None)  # type: ignore[arg-type]

    def unseed(self) -> None:
        self._native.shadow_unseed()

    def stack_of(self, ident: Optional[int]) -> Optional[tuple]:
        state = self._native.thread_states().get(ident)
        if state is None:
            return None
        entries = self._native.shadow_stack(state[0])
        return None if entries is None else tuple(entries)

    @property
    def overflow(self) -> int:  # type: ignore[override]
        return self._native.shadow_stats()["overflow"]

    @overflow.setter
    def overflow(self, value: int) -> None:
        pass


def _hook_sees_every_call(top: Any) -> bool:
    """Whether the eval-frame hook sees every kind of Python call (plain, with defaults,
    methods, ``__init__``, properties, ``__getitem__``, generators) once the interpreter
    has specialized them: each callee finds its own code on top of its thread's stack
    (``top()``), and so does its caller after it returned.  A CPython whose specialized
    calls skip the hook (3.13.0's ``__init__``) would leave the stacks wrong."""
    ok = []

    class Probe:
        def __init__(self, x: int) -> None:
            self.x = x
            ok.append(top() == id(sys._getframe().f_code))

        def method(self) -> int:
            ok.append(top() == id(sys._getframe().f_code))
            return self.x

        @property
        def prop(self) -> int:
            ok.append(top() == id(sys._getframe().f_code))
            return self.x

        def __getitem__(self, i: int) -> int:
            ok.append(top() == id(sys._getframe().f_code))
            return i

    def leaf(x: int, y: int = 1) -> int:
        ok.append(top() == id(sys._getframe().f_code))
        return x + y

    def gen(n: int) -> Any:
        for i in range(n):
            ok.append(top() == id(sys._getframe().f_code))
            yield i

    def run() -> None:
        here = id(sys._getframe().f_code)
        for i in range(300):
            p = Probe(i)
            leaf(i)
            leaf(i, 2)
            p.method()
            p.prop  # noqa: B018
            p[i]  # noqa: B018
            for _ in gen(2):
                ok.append(top() == here)
            ok.append(top() == here)

    run()
    return len(ok) == 300 * 11 and all(ok)


def shadow_engine(chosen: str, requested: Optional[str]) -> str:
    """The engine that samples instrumented stacks: the native one only where its C
    callbacks are built; else the Python one (an error if the native one was asked
    for by name)."""
    if chosen == "native" and not native_shadow_available():
        if requested == "native":
            raise ValueError("use_errortrace with engine='native' needs the C callbacks of "
                             "sampler._native, which are not built here; use engine='python'")
        return "python"
    return chosen


def make_shadow(mode: Any, engine: str) -> Any:
    """The shadow stacks for ``mode`` (``True`` or ``'python'``) on ``engine``."""
    if engine == "native":
        return NativeShadowStacks(c_functions=mode is True)
    return ShadowStacks(c_functions=mode is True)
