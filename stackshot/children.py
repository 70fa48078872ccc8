"""``stackshot --subprocesses``: forked child processes profile themselves.

A process forked while the program runs (``os.fork``, multiprocessing's ``fork``
start method) starts a sampler of its own on the forking thread, right after the
fork (:func:`os.register_at_fork`).  When it ends -- through ``os._exit``, as
multiprocessing's children do, or by leaving the program like the parent would --
it saves its snapshots in a folder the parent made; when the program ends, the
parent merges every child's run into its own profile, each child's threads named
with its pid (``MainThread (pid 4242)``): one profile, and a view per process in
the thread list of every renderer.

Not covered: children started by ``spawn`` or ``forkserver`` and Python programs
run through ``subprocess`` are new interpreters, which this hook does not reach;
they are counted as unprofiled.  A child still running when the parent writes its
profile is not in it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any, Callable, Optional

from sampler.controller import Sampler, create_sampler
from sampler.snapshot import SnapshotError, Snapshots

from .toplevel import replace_snapshots

__all__ = ["ChildProfiles"]

_active: Optional["ChildProfiles"] = None
_hooked = False


def _after_fork_in_child() -> None:
    if _active is not None:
        _active._start_in_child()


class ChildProfiles:
    """One ``--subprocesses`` session (a context manager around the program's run)."""

    def __init__(self, delay: float, trim: Callable[[Snapshots], Snapshots]) -> None:
        self.delay, self.trim = delay, trim
        self.folder = tempfile.mkdtemp(prefix="stackshot-children-")
        self.sampler: Optional[Sampler] = None
        self._real_exit: Optional[Callable[[int], Any]] = None

    def __enter__(self) -> "ChildProfiles":
        global _active, _hooked
        if not _hooked:  # a fork hook cannot be removed: it acts only while a session is on
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _hooked = True
        _active = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if _active is self:
            _active = None

    # -- in a child -------------------------------------------------------------
    def _start_in_child(self) -> None:
        """Sample the forking thread (the only one a forked child has), and save on
        ``os._exit``, which skips every other way out of the process."""
        me = threading.current_thread()
        # CPython 3.11 keeps the parent's native thread id on the forking thread after a
        # fork; the sampler reads that thread's CPU clock from it, and a stale one reads
        # as a dead thread (nothing would be sampled).  Refresh it as 3.12+ does.
        if getattr(me, "native_id", None) != threading.get_native_id() and hasattr(me, "_set_native_id"):
            me._set_native_id()
        self.sampler = create_sampler(me, self.delay)
        real_exit = self._real_exit or os._exit
        self._real_exit = real_exit

        def _exit(status: int) -> None:
            self.save_child()
            real_exit(status)

        os._exit = _exit  # only in this child: the parent's os._exit is untouched

    def save_child(self) -> None:
        """Stop this child's sampler and leave its snapshots for the parent."""
        sampler, self.sampler = self.sampler, None
        if sampler is None:
            return
        try:
            sampler.stop()
            snapshots = self.trim(sampler.get_snapshots())
            snapshots.save(os.path.join(self.folder, f"{os.getpid()}.stackshot"))
        except Exception:  # a child's profile is a bonus: never fail its exit over it
            pass

    # -- in the parent ----------------------------------------------------------
    def collect(self) -> list[Snapshots]:
        """The children's snapshots (each thread named with its process id); the
        folder is removed."""
        out = []
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            names = []
        for name in names:
            try:
                snaps = Snapshots.load(os.path.join(self.folder, name))
            except (OSError, SnapshotError):
                continue
            pid = name.split(".")[0]
            threads = [t._replace(name=f"{t.name} (pid {pid})") for t in snaps.threads]
            out.append(replace_snapshots(snaps, threads=threads))
        shutil.rmtree(self.folder, ignore_errors=True)
        return out

