"""Greenlets in a profile: which there were, the time of each, one profile each.

The sampler files the samples of a tracked thread under a context per greenlet that
ran in it (a :class:`~sampler.snapshot.ThreadInfo` of kind ``'greenlet'``, named
after the greenlet, with its thread's native id), the thread's main greenlet staying
the thread itself; so every view that shows threads shows greenlets too, and a
thread's time is the sum of its contexts'.  Each run's ``extra['greenlets']`` adds
what a context cannot say: the greenlet's small id, its parent's context and its
thread's context.  It is read defensively here: a file may hold anything there.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .analyze import ThreadSelection, _recognise, analyze_samples
from .model import Profile

__all__ = ["GreenletInfo", "greenlets_of", "analyze_by_greenlet", "greenlet_times"]

EXTRA_KEY = "greenlets"  # sampler.recorder.GREENLETS_KEY (the analyzer imports no sampler)


class GreenletInfo(NamedTuple):
    """One greenlet context of a snapshots value (ids are its thread ids)."""

    id: int  # its context's thread id in the snapshots
    name: str
    greenlet: Optional[int]  # the sampler's small greenlet id (None: not recorded)
    parent: Optional[int]  # the context of the greenlet that spawned it, or its thread
    thread: Optional[int]  # the context of the OS thread it ran in


def greenlets_of(samples: Any) -> dict[int, GreenletInfo]:
    """The greenlet contexts of a snapshots value (or a list of them), by id."""
    value = _recognise(samples)
    if isinstance(value, tuple):
        raise ValueError("greenlets_of() needs snapshots: the raw shape has no greenlets")
    # Thread ids as the recorder numbered them: per run, in order (merge keeps it).
    local: dict[tuple[int, int], int] = {}
    own_number: dict[int, int] = {}
    counts: dict[int, int] = {}
    for t in value.threads:
        n = own_number[t.id] = counts.get(t.run, 0)
        local[(t.run, n)] = t.id
        counts[t.run] = n + 1
    out: dict[int, GreenletInfo] = {}
    for t in value.threads:
        if t.kind != "greenlet":
            continue
        extra = value.runs[t.run].extra if t.run < len(value.runs) else {}
        table = extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
        row = table.get(str(own_number[t.id])) if isinstance(table, dict) else None
        if isinstance(row, list) and len(row) == 3 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in row):
            out[t.id] = GreenletInfo(t.id, t.name, row[0], local.get((t.run, row[1])),
                                     local.get((t.run, row[2])))
        else:
            out[t.id] = GreenletInfo(t.id, t.name, None, None, None)
    return out


def analyze_by_greenlet(samples: Any, *, weight: str = "cpu", granularity: str = "function",
                        interval: Optional[str] = None,
                        threads: ThreadSelection = None) -> dict[str, Profile]:
    """One profile per context that has samples -- each greenlet, and each thread for
    its main greenlet -- keyed by name (``name #id`` where names repeat), in the
    order they were first seen.  ``threads`` limits the contexts as in
    :func:`~analyzer.analyze_samples`.  Each sample keeps its weight, so the profiles
    add up to ``analyze_samples(samples)``."""
    value = _recognise(samples)
    if isinstance(value, tuple):
        raise ValueError("analyze_by_greenlet() needs snapshots: the raw shape has no greenlets")
    whole = analyze_samples(value, weight=weight, granularity=granularity, interval=interval,
                            threads=threads)
    infos = value.threads
    seen = [tid for tid in whole.thread_times]
    names = [infos[tid].name for tid in seen]
    out: dict[str, Profile] = {}
    for tid, name in zip(seen, names):
        key = name if names.count(name) == 1 else f"{name} #{tid}"
        out[key] = analyze_samples(value, weight=weight, granularity=granularity,
                                   interval=interval, threads=[tid])
    return out


def greenlet_times(samples: Any, *, weight: str = "cpu", interval: Optional[str] = None
                   ) -> dict[str, float]:
    """Seconds per context (greenlets, and threads for their main greenlets), by
    the names :func:`analyze_by_greenlet` uses."""
    return {name: p.total_time for name, p in
            analyze_by_greenlet(samples, weight=weight, interval=interval).items()}
