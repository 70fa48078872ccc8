"""Choosing the engine that takes the samples.

Two engines sit behind one interface (the collector interface of
:class:`sampler.collector.Collector`):

``'native'``
    a C collector thread (:mod:`sampler.native_engine`) that reads frames without
    the GIL: samples fall where each thread really is, busy threads cannot starve it,
    and the program is never stopped to be looked at.
``'python'``
    the collector thread of :mod:`sampler.collector`, which takes the GIL and reads
    ``sys._current_frames()``: it runs everywhere, but sees a running thread only where
    that thread lets go of the GIL.

The default is ``'native'`` where the extension was built (CPython 3.10-3.13 on
Linux, with a C compiler at install time) and the process may read its own memory
through the kernel (``process_vm_readv``, else ``/proc/self/mem``: a seccomp profile
can refuse both, and the collector then could read no frame), else ``'python'``,
with a warning saying why. ``create_sampler(..., engine=...)`` or the environment variable
``STACKSHOT_ENGINE`` choose explicitly.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

ENGINES = ("native", "python")
ENV_VAR = "STACKSHOT_ENGINE"

try:
    from . import _native  # noqa: F401

    if not hasattr(_native, "Engine"):  # the C sources' folder, imported as a namespace
        raise ImportError("only the folder of its C sources is there")
    NATIVE_UNAVAILABLE: Optional[str] = None
except ImportError as exc:  # not built here: say why when it matters
    _native = None  # type: ignore[assignment]
    NATIVE_UNAVAILABLE = (
        f"the C extension sampler._native is not built ({exc}); reinstall with a C compiler "
        "and the Python headers (pip install -e .) on CPython 3.10-3.13 on Linux"
    )

_warned = False
_reads: list[tuple[Optional[str], str]] = []  # the probe's answer, asked once per process


def read_via() -> Optional[str]:
    """How the native engine reads this process's memory here: ``'process_vm_readv'``,
    ``'/proc/self/mem'`` (where the system call is refused), or ``None`` (neither
    works, or the extension is not built)."""
    if _native is None:
        return None
    if not _reads:
        _reads.append(_native.read_probe())
    return _reads[0][0]


def native_unavailable() -> Optional[str]:
    """Why the native engine cannot run in this process, or ``None`` if it can."""
    if NATIVE_UNAVAILABLE is not None:
        return NATIVE_UNAVAILABLE
    if read_via() is None:
        return (f"this process may not read its own memory through the kernel ({_reads[0][1]}), "
                "which is how the collector reads frames without crashing on freed ones "
                "(refused by a seccomp profile, or /proc is not mounted)")
    return None


def native_available() -> bool:
    """Whether the native engine can run in this process."""
    return native_unavailable() is None


def choose(engine: Optional[str]) -> str:
    """The engine to use for ``engine`` (None: the environment's choice or the default).

    Asking for ``'native'`` where it is not built is an error; the default falls
    back to ``'python'`` with one warning per process.
    """
    global _warned
    explicit = engine is not None
    if engine is None:
        engine = os.environ.get(ENV_VAR) or None
    if engine is not None and (not isinstance(engine, str) or engine not in ENGINES):
        source = "engine" if explicit else ENV_VAR
        raise ValueError(f"{source} must be one of {', '.join(map(repr, ENGINES))}, not {engine!r}")
    if engine == "python":
        return engine
    if native_available():
        return "native"
    why = native_unavailable()
    if engine == "native" and explicit:
        raise RuntimeError(f"engine='native' is not available: {why}")
    if not _warned:
        _warned = True
        warnings.warn(f"stackshot uses its Python engine: {why}", RuntimeWarning, stacklevel=3)
    return "python"
