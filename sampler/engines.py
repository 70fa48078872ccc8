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
Linux, with a C compiler at install time), else ``'python'``, with a warning saying
why. ``create_sampler(..., engine=...)`` or the environment variable
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


def native_available() -> bool:
    """Whether the native engine can run in this process."""
    return NATIVE_UNAVAILABLE is None


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
    if engine == "native" and explicit:
        raise RuntimeError(f"engine='native' is not available: {NATIVE_UNAVAILABLE}")
    if not _warned:
        _warned = True
        warnings.warn(f"stackshot uses its Python engine: {NATIVE_UNAVAILABLE}", RuntimeWarning, stacklevel=3)
    return "python"
