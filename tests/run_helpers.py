"""Running this checkout's code in a fresh interpreter, and the busy work it profiles.

Tests that start ``python -m sampler``, a doc example or a benchmark in a subprocess
need the child to import *this* checkout's packages whatever its working directory:
:func:`repo_env`.  Tests that profile CPU work in-process and scripts written for a
subprocess burn it the same way: :func:`spin`, and its source :data:`SPIN_SOURCE`.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Mapping, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_env(base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with :data:`REPO` put first on ``PYTHONPATH``,
    keeping whatever the user's ``PYTHONPATH`` adds after it."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def spin(cpu_seconds: float) -> int:
    """Burn this much of the calling thread's CPU time in Python code.

    CPU time, not a loop count: enough work to be sampled however loaded the machine
    is, and no assertion ever depends on how long it took.
    """
    end = time.thread_time() + cpu_seconds
    s = 0
    while time.thread_time() < end:
        for i in range(2000):
            s += i
    return s


SPIN_SOURCE = "\nimport time\n" + inspect.getsource(spin)
"""The source of :func:`spin` (with its import), to start a script run in a subprocess."""


def busy_processes_on(core: int, count: int) -> list:
    """Start ``count`` processes that spin on ``core`` alone (kill them when done):
    work that shares one core with the code under test, so that it is preempted."""
    import subprocess
    import sys

    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
