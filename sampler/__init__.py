"""stackshot's sampler: collects stack snapshots of threads, thread groups and greenlets.

>>> import threading, sampler
>>> ctl = sampler.create_sampler(threading.main_thread(), 0.005)
>>> ctl('pause'); ctl('resume'); ctl('stop')
>>> snapshots = ctl('get-snapshots')

``sampler`` only collects; the :mod:`analyzer` package turns snapshots into
profiles.  The snapshot value (:mod:`sampler.snapshot`) is the contract between them.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .controller import MESSAGES, Sampler, SamplerError, create_sampler
from .groups import ThreadGroup
from .marks import current_marks, mark
from .notebook import load_ipython_extension
from .snapshot import FORMAT_VERSION, Frame, RunInfo, Sample, SnapshotError, Snapshots, ThreadInfo, merge
from .toplevel import Profiler, profile, profile_thunk
from .tracking import ALL_THREADS

__all__ = [
    "ALL_THREADS", "FORMAT_VERSION", "Frame", "MESSAGES", "Profiler", "RunInfo", "Sample", "Sampler",
    "SamplerError", "SnapshotError", "Snapshots", "ThreadGroup", "ThreadInfo", "create_sampler",
    "current_marks", "load_ipython_extension", "mark", "merge", "profile", "profile_thunk", "__version__",
]
