"""Allocation profiles: snapshots whose samples weigh bytes, not time.

``sampler.memprof.to_snapshots`` turns sampled allocations into ordinary
:class:`~sampler.snapshot.Snapshots`: one sample per sampled block, its estimated
bytes stored where a time sample keeps its microseconds, and a run whose
``RunInfo.engine`` is ``"memprof"``.  The two delta columns are two *views*: the CPU
column holds the bytes each block allocated, the wall column the bytes of it still
live at the end.  So ``weight='cpu'`` (the default) is the profile of bytes
allocated, ``weight='wall'`` the profile of bytes still live.

This module is the one place that recognises such snapshots and says how to read
them: the analyzer turns them into a profile whose ``unit`` is ``'B'`` (numbers are
bytes), and every renderer and export asks here what to call its numbers.
"""

from __future__ import annotations

from typing import Any, Sequence

from .model import BYTE_UNITS

ENGINE = "memprof"
"""``RunInfo.engine`` of the runs ``sampler.memprof`` records."""

BYTES = BYTE_UNITS[0]
"""A profile's ``unit`` when its numbers are bytes."""

BYTES_PER_SECOND_SLOT = 1e6
"""Bytes per "second" of a memory snapshot's weights (its microsecond slot holds a byte)."""

VIEWS = {"cpu": "allocated", "wall": "still live"}
"""What each weight (delta column) of a memory snapshot measures."""


def is_memory_run(run: Any) -> bool:
    """Whether a :class:`~sampler.snapshot.RunInfo` was recorded by ``sampler.memprof``."""
    return getattr(run, "engine", "") == ENGINE


def is_memory(runs: Sequence[Any]) -> bool:
    """Whether ``runs`` (a Snapshots value's, or a Profile's) are allocation samples.

    Raises ``ValueError`` when time runs and allocation runs are mixed: a sum of
    seconds and bytes means nothing.
    """
    kinds = {is_memory_run(r) for r in runs}
    if len(kinds) > 1:
        raise ValueError("these snapshots mix allocation samples (sampler.memprof) with time "
                         "samples: analyse them separately")
    return kinds == {True}


def check_interval(interval: str) -> None:
    """An allocation sample weighs its own bytes: only the ``'end'`` rule charges each
    sample its own delta (``'midpoint'`` and ``'active'`` move weight between samples)."""
    if interval != "end":
        raise ValueError(f"allocation samples weigh their own bytes: interval='end' only, "
                         f"not {interval!r}")


def view(weight: str) -> str:
    """``'allocated'`` or ``'still live'``: what a memory profile of ``weight`` measures."""
    return VIEWS.get(weight, weight)


def sampling_rates(runs: Sequence[Any]) -> list[float]:
    """The sampling rates of the memprof runs (probability that a word is sampled)."""
    out = []
    for r in runs:
        extra = getattr(r, "extra", None)
        info = extra.get("memprof") if isinstance(extra, dict) else None
        if isinstance(info, dict) and isinstance(info.get("sampling_rate"), (int, float)):
            out.append(float(info["sampling_rate"]))
    return sorted(set(out))


_STEPS = ((1e9, "GB"), (1e6, "MB"), (1e3, "KB"))


def byte_unit(n: float) -> tuple[float, str]:
    """The unit to show ``n`` bytes in: ``(bytes per unit, name)``; decimal (1 KB = 1000 B)."""
    for size, name in _STEPS:
        if abs(n) >= size:
            return size, name
    return 1.0, "B"


def format_bytes(n: float) -> str:
    """Bytes for people, three significant digits: ``512 B``, ``12.3 KB``, ``4.56 MB``, ``1.23 GB``."""
    size, name = byte_unit(n)
    if size == 1.0:
        return f"{n:,.0f} B"
    v = n / size
    return f"{v:,.0f} {name}" if abs(v) >= 100 else f"{v:.1f} {name}" if abs(v) >= 10 else f"{v:.2f} {name}"
