"""stackshot's sampler: collects stack snapshots of threads, thread groups and greenlets.

>>> import threading, sampler
>>> ctl = sampler.create_sampler(threading.main_thread(), 0.005)
>>> ctl('pause'); ctl('resume'); ctl('stop')
>>> snapshots = ctl('get-snapshots')

``sampler`` only collects and imports nothing of the :mod:`analyzer`, which turns
snapshots into profiles; the snapshot value (:mod:`sampler.snapshot`) is the
contract between them.  The one-step front end (``profile_thunk``, ``profile``, the
``stackshot`` command, the notebook magics) is the :mod:`stackshot` package, above both.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import Any

from .controller import MESSAGES, Sampler, SamplerError, create_sampler
from .groups import GreenletGroup, ThreadGroup
from .marks import current_marks, mark
from .snapshot import FORMAT_VERSION, Frame, RunInfo, Sample, SnapshotError, Snapshots, ThreadInfo, merge
from .tracking import ALL_THREADS, TrackingWarning

__all__ = [
    "ALL_THREADS", "FORMAT_VERSION", "Frame", "GreenletGroup", "MESSAGES", "RunInfo", "Sample", "Sampler",
    "SamplerError", "SnapshotError", "Snapshots", "ThreadGroup", "ThreadInfo", "create_sampler",
    "current_marks", "load_ipython_extension", "mark", "merge", "__version__",
    "TrackingWarning",
]

_MOVED = frozenset({"profile", "profile_thunk", "Profiler"})


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext sampler``: an alias of ``%load_ext stackshot``.

    The magics display profiles, which is the analyzer's work, so they live in
    :mod:`stackshot.notebook`; this name stays so that notebooks written for
    ``%load_ext sampler`` keep working.  It is the one function of the package that
    reaches up to ``stackshot`` (besides ``python -m sampler``), and only when IPython
    calls it: importing ``sampler`` never loads the analyzer.
    """
    from stackshot.notebook import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    """Point code written for the old layout at the new home of the one-step API."""
    if name in _MOVED:
        raise AttributeError(f"sampler.{name} moved to the stackshot package: "
                             f"use `from stackshot import {name}`")
    raise AttributeError(f"module 'sampler' has no attribute {name!r}")
