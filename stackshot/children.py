"""Child processes: counting the ones that ran unprofiled, and ``--subprocesses``.

Without ``--subprocesses`` (``subprocesses=False`` in the API), :class:`ChildCounter`
counts the child processes the program starts, so that the report can say how many
ran unprofiled: audit events for ``os.fork``, ``subprocess``, ``os.posix_spawn`` and
``os.system``, and multiprocessing's ``spawn`` and ``forkserver`` launches, which
raise no audit event of their own.  One child is one count: a ``subprocess.Popen``
that starts its child through ``os.posix_spawn`` (where it can) raises both events.

With it, :class:`ChildProfiles` makes every child Python profile itself:

* a process forked from this one (``os.fork``, multiprocessing's ``fork`` start
  method, a forkserver's children) starts a sampler on the forking thread right after
  the fork (:func:`os.register_at_fork`);
* a new interpreter (multiprocessing's ``spawn`` and ``forkserver`` start methods, a
  Python program run through ``subprocess``) finds the directory of a small
  ``sitecustomize`` first on its ``PYTHONPATH``, and a setting in the environment
  (:data:`ENV`) that tells it where to leave its profile (:func:`bootstrap`), as
  coverage.py's ``COVERAGE_PROCESS_START`` does; the interpreter's own
  ``sitecustomize``, if any, still runs after it.

Each child leaves its snapshots in a folder the parent made when it ends (at exit,
through ``os._exit`` as multiprocessing's forked children do, or on ``SIGTERM`` as a
terminated pool's workers do); when the program ends the parent merges them into its
own profile, each child's threads named with its pid (``MainThread (pid 4242)``): one
profile, and a view per process in every renderer's thread list.

Not reached: a child started with an environment of its own (``env=`` without the
parent's ``PYTHONPATH``), ``python -I`` or ``-E``, another Python than this one, and
programs that are not Python; those are counted as unprofiled.  A child still
running when the parent writes its profile is not in it.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any, Callable, Optional

from sampler.controller import Sampler, create_sampler
from sampler.snapshot import SnapshotError, Snapshots
from sampler.tracking import ALL_THREADS

__all__ = ["ChildCounter", "ChildProfiles", "ENV", "BOOTSTRAP_DIR", "bootstrap"]

ENV = "STACKSHOT_SUBPROCESSES"
"""The environment variable that asks a new interpreter to profile itself: JSON,
``{"folder": ..., "delay": ..., "all_threads": ...}``."""

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
"""The directory put first on a child's ``PYTHONPATH``: it holds a ``sitecustomize``."""

_HELPERS = ("from multiprocessing.forkserver import main",
            "from multiprocessing.resource_tracker import main",
            "from multiprocessing.semaphore_tracker import main")
"""multiprocessing's own helper processes (``-c`` code): not the program's work."""


# ----------------------------------------------------------------------------------
# Counting the children started
# ----------------------------------------------------------------------------------
class _ChildEvents:
    """The audit events that start a child process, as properties of one object, so
    that the audit hook can be ``functools.partial(getattr, _ChildEvents())``: for
    every other event (``sys.setprofile``, ``open``, ``socket.connect``, one for each
    ``sys._getframe`` ...) the hook is a failed attribute lookup in C with the event's
    arguments as its default, and no Python code runs.

    Why it must not run Python code: on 3.10 and 3.11 ``sys.setprofile`` and
    ``sys.settrace`` raise their audit event while holding a flag shared by every
    thread, and a Python hook lets the interpreter switch threads there; another
    thread calling either function then got ``RuntimeError: Cannot install a profile
    function while another profile function is being installed`` (a gevent
    threadpool worker does so for each task while :class:`OtherThreads` is active:
    the profiled server's request died).  Only an event below runs its property,
    which cannot see the event's arguments."""

    __slots__ = ()


def _child_event(name: str) -> property:
    """The property the audit hook finds for the child-starting event ``name``."""

    def started(self: _ChildEvents) -> None:
        active = ChildCounter._active
        if active is None or os.getpid() != active.pid:
            return
        if name.startswith("os.posix_spawn"):
            try:
                caller = sys._getframe(1).f_globals.get("__name__")
            except ValueError:  # (called from C with no Python frame under it)
                caller = None
            if caller == "subprocess":
                return  # a Popen, counted at its own event, starts its child this way
        active.count += 1

    return property(started)


class ChildCounter:
    """Counts the child processes the program starts while a run is active.

    An audit hook and the multiprocessing hooks cannot be removed: they count only
    while a counter is active, and only in the process that activated it (a forked
    child's own children are not the parent's to count)."""

    EVENTS = frozenset({"os.fork", "os.forkpty", "subprocess.Popen", "os.posix_spawn",
                        "os.posix_spawnp", "os.system"})
    _active: Optional["ChildCounter"] = None
    _hooked = False

    def __init__(self) -> None:
        self.count = 0
        self.pid = os.getpid()

    @classmethod
    def note_launch(cls) -> None:
        """A multiprocessing ``spawn`` or ``forkserver`` child was started."""
        active = cls._active
        if active is not None and os.getpid() == active.pid:
            active.count += 1

    def __enter__(self) -> "ChildCounter":
        if not ChildCounter._hooked:
            sys.addaudithook(functools.partial(getattr, _ChildEvents()))
            _watch_multiprocessing()
            ChildCounter._hooked = True
        self.pid = os.getpid()
        ChildCounter._active = self
        return self

    def __exit__(self, *exc: object) -> None:
        if ChildCounter._active is self:
            ChildCounter._active = None

    def extra(self, profiled: int = 0) -> dict[str, Any]:
        """What the run's metadata records: the children that left no profile."""
        unprofiled = max(0, self.count - profiled)
        return {"child_processes": unprofiled} if unprofiled else {}


for _event in ChildCounter.EVENTS:
    setattr(_ChildEvents, _event, _child_event(_event))


_LAUNCHERS = ("multiprocessing.popen_spawn_posix", "multiprocessing.popen_forkserver")


def _count_launches(module: Any) -> None:
    """Wrap a multiprocessing ``Popen._launch`` (one call, one child) to count it."""
    popen = getattr(module, "Popen", None)
    launch = getattr(popen, "_launch", None)
    if launch is None or getattr(launch, "_stackshot_counted", False):
        return

    @functools.wraps(launch)
    def _launch(self: Any, process_obj: Any) -> Any:
        ChildCounter.note_launch()
        return launch(self, process_obj)

    _launch._stackshot_counted = True  # type: ignore[attr-defined]
    popen._launch = _launch


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_count_launches` on multiprocessing's launcher modules as they are
    imported (the program imports them, if ever, after stackshot has started)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _LAUNCHERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                _count_launches(module)

            def __getattr__(self, name: str) -> Any:  # get_source, get_code ...: the real one's
                return getattr(loader, name)

        spec.loader = _Loader()
        return spec


def _watch_multiprocessing() -> None:
    for name in _LAUNCHERS:
        if name in sys.modules:
            _count_launches(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport())


# ----------------------------------------------------------------------------------
# --subprocesses: children profile themselves
# ----------------------------------------------------------------------------------
_active: Optional["ChildProfiles"] = None
_hooked = False
_in_child: Optional["_ChildRun"] = None


def _after_fork_in_child() -> None:
    global _in_child
    config = _active.config if _active is not None else (
        _in_child.config if _in_child is not None else None)
    if config is None:
        return
    if _in_child is not None:
        _in_child.forget()  # the parent's sampler thread did not survive the fork
    _in_child = _ChildRun(config)


def _hook_forks() -> None:
    global _hooked
    if not _hooked:  # a fork hook cannot be removed: it acts only while a session is on
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _hooked = True


class _ChildRun:
    """A child's own sampler, saved once, however the child ends."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        me = threading.current_thread()
        # CPython 3.11 keeps the parent's native thread id on the forking thread after a
        # fork; the sampler reads that thread's CPU clock from it, and a stale one reads
        # as a dead thread (nothing would be sampled).  Refresh it as 3.12+ does.
        if getattr(me, "native_id", None) != threading.get_native_id() and hasattr(me, "_set_native_id"):
            me._set_native_id()
        self.sampler: Optional[Sampler] = create_sampler(
            ALL_THREADS if config.get("all_threads") else me, float(config["delay"]))
        self._wrap_exits()

    def forget(self) -> None:
        self.sampler = None

    def _wrap_exits(self) -> None:
        real_exit = getattr(os._exit, "_stackshot_real", os._exit)

        def _exit(status: int) -> None:
            self.save()
            real_exit(status)

        _exit._stackshot_real = real_exit  # type: ignore[attr-defined]
        os._exit = _exit  # only in this child: the parent's os._exit is untouched
        atexit.register(self.save)
        try:  # a terminated pool worker saves too, unless the program has its own handler
            if (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
                signal.signal(signal.SIGTERM, self._terminated)
        except (ValueError, OSError):
            pass

    def _terminated(self, signum: int, frame: Any) -> None:
        self.save()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def save(self) -> None:
        """Stop this child's sampler and leave its snapshots for the parent (written
        under a temporary name, then renamed: the parent never reads half a file)."""
        sampler, self.sampler = self.sampler, None
        if sampler is None:
            return
        folder = self.config["folder"]
        name = os.path.join(folder, f"{os.getpid()}.stackshot")
        try:
            sampler.stop()
            sampler.get_snapshots().save(name + ".part")
            os.replace(name + ".part", name)
        except Exception:  # a child's profile is a bonus: never fail its exit over it
            pass


def bootstrap() -> None:
    """Called by the ``sitecustomize`` of :data:`BOOTSTRAP_DIR` in a new interpreter
    whose environment has :data:`ENV`: profile this process, and the ones it forks."""
    global _in_child
    if _in_child is not None:
        return
    try:
        config = json.loads(os.environ[ENV])
        if not (isinstance(config, dict) and os.path.isdir(config["folder"])):
            return
        float(config["delay"])
    except (KeyError, ValueError, TypeError):
        return
    _hook_forks()
    code = " ".join(getattr(sys, "orig_argv", ()))
    if any(helper in code for helper in _HELPERS):  # a forkserver's children are profiled
        _in_child = _Helper(config)
        return
    _in_child = _ChildRun(config)


class _Helper:
    """multiprocessing's forkserver or resource tracker: not sampled, but what it forks is."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def forget(self) -> None:
        pass


class ChildProfiles:
    """One ``--subprocesses`` session (a context manager around the program's run)."""

    def __init__(self, delay: float, all_threads: bool = False) -> None:
        self.folder = tempfile.mkdtemp(prefix="stackshot-children-")
        self.config = {"folder": self.folder, "delay": delay, "all_threads": bool(all_threads)}
        self._saved_env: dict[str, Optional[str]] = {}
        self.collected = 0

    def __enter__(self) -> "ChildProfiles":
        global _active
        _hook_forks()
        _active = self
        path = os.environ.get("PYTHONPATH")
        self._saved_env = {ENV: os.environ.get(ENV), "PYTHONPATH": path}
        os.environ[ENV] = json.dumps(self.config)
        os.environ["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + path if path else "")
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if _active is self:
            _active = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def collect(self, trim: Callable[[Snapshots], Snapshots]) -> list[Snapshots]:
        """The children's snapshots, trimmed by ``trim`` (each thread named with its
        process id); the folder is removed."""
        from .toplevel import replace_snapshots

        out = []
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.endswith(".stackshot"))
        except OSError:
            names = []
        for name in names:
            try:
                snaps = trim(Snapshots.load(os.path.join(self.folder, name)))
            except (OSError, SnapshotError):
                continue
            pid = name.split(".")[0]
            threads = [t._replace(name=f"{t.name} (pid {pid})") for t in snaps.threads]
            out.append(replace_snapshots(snaps, threads=threads))
        shutil.rmtree(self.folder, ignore_errors=True)
        self.collected = len(out)
        return out
