"""stackshot: a Racket-style statistical profiler for Python, in one step.

>>> import stackshot
>>> stackshot.profile_thunk(lambda: sum(range(10**6)))     # doctest: +SKIP
>>> with stackshot.profile() as p:                          # doctest: +SKIP
...     work()

This package is the front door; it stands above the two that do the work:
:mod:`sampler` collects stack snapshots (and knows nothing of how they are
analysed), :mod:`analyzer` turns snapshots into a caller/callee graph and renders
it.  Here live the one-step entry points (:func:`profile_thunk`, :func:`profile`),
the ``stackshot`` command (:mod:`stackshot.cli`), the notebook magics
(``%load_ext stackshot``, :mod:`stackshot.notebook`) and a demo program
(:mod:`stackshot.demo`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from sampler import ALL_THREADS, ThreadGroup, create_sampler, mark
from sampler.snapshot import Snapshots

from .notebook import load_ipython_extension, register_snapshot_display
from .toplevel import Profiler, profile, profile_thunk

register_snapshot_display()

__all__ = [
    "ALL_THREADS", "Profiler", "Snapshots", "ThreadGroup", "create_sampler",
    "load_ipython_extension", "mark", "profile", "profile_thunk", "__version__",
]
