"""``analyze_samples``: the front door from sampled stacks to a :class:`Profile`.

It checks options up front (so a typo is a one-line ``ValueError`` naming the valid
values, not a failure deep inside), recognises the input, and hands the work to
:mod:`analyzer.fromsnapshots` or :mod:`analyzer.rawshape` (summing identical stacks)
and :mod:`analyzer.graph` (Racket's accounting on distinct stacks).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional, Sequence, Union

from . import memory
from .fromsnapshots import aggregate, node_rows
from .gcview import check_gc, place_gc
from .graph import NodeInfo, StackRow, build_graph
from .markfilter import MISSING, MarkFilter, key_position, mark_set_filter, value_of
from .model import UNITS, Profile
from .rawshape import is_raw_shape, read_raw
from .weights import CLOCKS, INTERVALS, SCALE, clock_deltas, resolve_interval, sample_weights

__all__ = ["analyze_samples", "analyze_by_mark", "sample_weights", "WEIGHTS", "GRANULARITIES",
           "INTERVALS"]

WEIGHTS = CLOCKS
GRANULARITIES = ("function", "line")

ThreadSelection = Union[Iterable[Union[int, str]], Callable[[Any], bool], None]


def analyze_samples(
    samples: Any,
    *,
    weight: str = "cpu",
    granularity: str = "function",
    interval: Optional[str] = None,
    threads: ThreadSelection = None,
    marks: Optional[MarkFilter] = None,
    unit: Optional[str] = None,
    gc_frames: str = "root",
) -> Profile:
    """Turn sampled stacks into a call-graph :class:`Profile` (Racket's ``analyze-samples``).

    ``samples`` is a ``sampler`` :class:`~sampler.snapshot.Snapshots` value, a list of
    them (merged first: several runs, processes or machines), or Racket's raw shape
    ``(cpu_time, [(thread_id, thread_time, frame, ...), ...])``.

    ``weight``: ``'cpu'`` (each thread's CPU time, Racket's choice: a blocked thread
    costs nothing) or ``'wall'`` (where threads *wait* too).  ``granularity``:
    ``'function'`` or ``'line'`` (one node per line executed).  ``interval``: how
    the time between two samples of a thread is shared -- ``'end'`` (all of it to
    the sample that ends it), ``'midpoint'`` (Racket's rule: half to each),
    ``'split'`` (half to each where the thread ran through the interval, all to the
    sample that ends it where it woke in between) or ``'active'``.  The default,
    ``None``, is the input's natural rule: ``'split'`` for snapshots of the native
    engine, whose samples are where each thread really was; ``'end'`` for the
    Python engine's, because its samples land late (a long GIL-holding C call
    delays the next sample, which then shows the caller right after the call, and
    an even split would give half of that long interval to the sample before,
    which was elsewhere: workload ``gil_call``, 20-24 points of attribution error
    with ``'midpoint'``, 0.3-2.9 with ``'end'``); ``'midpoint'`` for the raw shape,
    so Racket's examples give Racket's numbers.
    ``Profile.interval`` records the rule used (:mod:`analyzer.weights` has the
    edge cases: single-sample threads, first samples, idle samples).
    ``threads``: ids, names, or a predicate on :class:`~sampler.snapshot.ThreadInfo`
    (on the id, for the raw shape).  ``marks``: keep only samples whose marks match,
    a ``{key: value}`` mapping or a predicate on :class:`~analyzer.markfilter.Marks`.
    ``unit``: the time unit of the raw shape's thread times (default Racket's
    ``'ms'``); snapshots are always in seconds.
    ``gc_frames``: where garbage collections go (:mod:`analyzer.gcview`): ``'root'``
    (the default: a ``<gc>`` node under the root, MLton's separate GC time),
    ``'stack'`` (under the stack that triggered them: who made the garbage) or
    ``'hide'`` (left out).
    """
    _check_options(weight, granularity, interval)
    check_gc(gc_frames)
    value = _recognise(samples)
    raw = isinstance(value, tuple)
    interval = resolve_interval(interval, raw=raw, snapshots=None if raw else value)
    if isinstance(value, tuple):  # the raw shape
        with _paused_gc():
            return _analyze_raw(value, weight=weight, granularity=granularity,
                                interval=interval, threads=threads, marks=marks, unit=unit)
    if unit not in (None, "s"):
        raise ValueError(f"unit= applies to the raw shape only; snapshot times are seconds, "
                         f"not {unit!r}")
    # (the weights come from the samples as taken: 'split' and 'active' look at which
    # samples are collections or idle, and 'hide' makes a collection's sample idle)
    deltas = clock_deltas(value, weight, interval)
    value = place_gc(value, gc_frames)
    wanted = _snapshot_threads(threads, value.threads)
    groups_of = None
    if marks is not None:
        keep = mark_set_filter(marks, value.mark_sets, value.custom_keys)
        groups_of = [None if k else MISSING for k in keep]
    with _paused_gc():
        groups = aggregate(value, clock=weight, interval=interval, threads=wanted,
                           group_of_mark_set=groups_of, deltas=deltas)
        profile = _snapshot_profile(value, groups.get(None), weight, granularity, interval)
    if threads is None and marks is None:
        profile.source = value
    return profile


def analyze_by_mark(
    samples: Any,
    key: Hashable,
    *,
    weight: str = "cpu",
    granularity: str = "function",
    interval: Optional[str] = None,
    threads: ThreadSelection = None,
) -> dict[Any, Profile]:
    """One profile per value of mark ``key`` (say, per request id), in one pass.

    A sample belongs to the value set by the innermost extent carrying ``key``;
    samples outside every extent of ``key`` are left out.  Each sample keeps the
    weight it has in the whole thread, so the profiles add up to the marked part of
    ``analyze_samples(samples)``.  Values must be hashable.  ``interval=None`` is
    the snapshots' natural rule, as in :func:`analyze_samples`.
    """
    _check_options(weight, granularity, interval)
    value = _recognise(samples)
    if isinstance(value, tuple):
        raise ValueError("analyze_by_mark() needs snapshots: the raw shape carries no marks")
    interval = resolve_interval(interval, snapshots=value)
    pos = key_position(key, value.custom_keys)
    group_of = []
    for ms in value.mark_sets:
        v = value_of(ms, pos)
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"mark {key!r} has an unhashable value {v!r:.60}; "
                            f"analyze_by_mark() needs hashable values") from None
        group_of.append(v)
    wanted = _snapshot_threads(threads, value.threads)
    with _paused_gc():
        groups = aggregate(value, clock=weight, interval=interval, threads=wanted,
                           group_of_mark_set=group_of)
        out = {v: _snapshot_profile(value, g, weight, granularity, interval)
               for v, g in groups.items() if g.sample_number}
    try:
        return dict(sorted(out.items()))
    except TypeError:
        return out


# -- helpers -------------------------------------------------------------------------

@contextmanager
def _paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while the graph is built.

    Building a profile allocates hundreds of thousands of small objects while
    million-element lists are alive; each allocation burst would trigger full
    collections that rescan those lists for nothing (measured: 15-20% of the
    analysis).  Nothing collectable is created meanwhile, and the previous state is
    restored even on error.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check_options(weight: str, granularity: str, interval: Optional[str]) -> None:
    for name, got, valid in (("weight", weight, WEIGHTS), ("granularity", granularity, GRANULARITIES)):
        if got not in valid:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}, not {got!r}")
    resolve_interval(interval)  # None or a known rule; which one is decided by the input


def _recognise(samples: Any) -> Any:
    """The input as a Snapshots value, or as a raw-shape tuple."""
    if _is_snapshots(samples):
        return samples
    if is_raw_shape(samples):
        return tuple(samples)
    if isinstance(samples, (list, tuple)) and all(_is_snapshots(s) for s in samples):
        from sampler.snapshot import Snapshots, merge

        return merge(*samples) if samples else Snapshots()
    if callable(samples) and callable(getattr(samples, "get_snapshots", None)):
        raise TypeError("analyze_samples() takes the snapshots, not the sampler's controller: "
                        "call ctl('get-snapshots') and analyse what it returns")
    raise TypeError(
        "analyze_samples() takes a Snapshots value, a list of them, or Racket's raw shape "
        f"(cpu_time, [(thread_id, thread_time, frame, ...), ...]); got {type(samples).__name__}")


def _is_snapshots(x: Any) -> bool:
    # duck-typed, so the analyzer does not import the sampler just to recognise its value
    return hasattr(x, "sample_stack") and hasattr(x, "stack_frame") and hasattr(x, "cpu_deltas")


def _snapshot_threads(threads: ThreadSelection, infos: Sequence[Any]) -> Optional[set]:
    if threads is None:
        return None
    if callable(threads):
        return {t.id for t in infos if threads(t)}
    if isinstance(threads, (int, str)):
        threads = [threads]
    chosen: set[int] = set()
    for x in threads:
        if isinstance(x, bool) or not isinstance(x, (int, str)):
            raise TypeError(f"threads= takes thread ids (int) or names (str), not {x!r}")
        if isinstance(x, int):
            if not 0 <= x < len(infos):
                raise ValueError(f"no thread {x}: the snapshots have thread ids 0..{len(infos) - 1}")
            chosen.add(x)
        else:
            named = {t.id for t in infos if t.name == x}
            if not named:
                names = ", ".join(sorted({repr(t.name) for t in infos})) or "none"
                raise ValueError(f"no thread named {x!r}; thread names: {names}")
            chosen |= named
    return chosen


def _snapshot_profile(snap: Any, group: Any, weight: str, granularity: str,
                      interval: str) -> Profile:
    scale = SCALE[interval]
    if group is None:
        rows: list[StackRow] = []
        infos: list[Optional[NodeInfo]] = [None]
        thread_times: dict = {}
        sample_number = 0
    else:
        rows, infos = node_rows(snap, group.rows, granularity)
        thread_times = dict(sorted(group.thread_times.items()))
        sample_number = group.sample_number
    names = {t.id: t.name for t in snap.threads if t.id in thread_times}
    unit, cpu_time = "s", snap.cpu_time
    if memory.is_memory(snap.runs):  # allocation samples: a microsecond slot holds a byte
        memory.check_interval(interval)
        unit, scale, cpu_time = memory.BYTES, 1.0, cpu_time * memory.BYTES_PER_SECOND_SLOT
    profile = _profile(rows, infos, scale=scale, thread_times=thread_times,
                       sample_number=sample_number, cpu_time=cpu_time, thread_names=names,
                       weight=weight, granularity=granularity, interval=interval, unit=unit)
    profile.runs = tuple(snap.runs)
    return profile


def _analyze_raw(value: tuple, *, weight: str, granularity: str, interval: str,
                 threads: ThreadSelection, marks: Any, unit: Optional[str]) -> Profile:
    if weight != "cpu":
        raise ValueError("the raw shape has one clock (Racket's thread time): weight='cpu' only")
    if granularity != "function":
        raise ValueError("the raw shape has no line numbers: granularity='function' only")
    if marks is not None:
        raise ValueError("the raw shape carries no marks: marks= needs snapshots")
    unit = "ms" if unit is None else unit
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(map(repr, UNITS))}, not {unit!r}")
    pred: Optional[Callable[[Any], bool]] = None
    if threads is not None:
        if callable(threads):
            pred = threads
        else:
            ids = {s[0] for s in value[1] if isinstance(s, (tuple, list)) and s}
            wanted = set([threads] if isinstance(threads, (int, str)) else threads)
            unknown = wanted - ids
            if unknown:
                raise ValueError(f"no thread {sorted(map(repr, unknown))[0]} in the samples; "
                                 f"thread ids: {', '.join(sorted(map(repr, ids)))}")
            pred = wanted.__contains__
    raw = read_raw(value, interval=interval, threads=pred)
    return _profile(raw.rows, raw.infos, scale=1, thread_times=raw.thread_times,
                    sample_number=raw.sample_number, cpu_time=raw.cpu_time, thread_names={},
                    weight=weight, granularity=granularity, interval=interval, unit=unit)


def _profile(rows: list[StackRow], infos: list[Optional[NodeInfo]], *, scale: float,
             thread_times: dict, sample_number: int, cpu_time: Any, thread_names: dict,
             weight: str, granularity: str, interval: str, unit: str) -> Profile:
    one = len(thread_times) == 1
    root, nodes = build_graph(rows, infos, scale=scale,
                              single_thread=next(iter(thread_times)) if one else None,
                              one_thread=one)
    total = sum(thread_times.values()) * scale
    root.total = total
    return Profile(total, cpu_time, sample_number,
                   {t: v * scale for t, v in thread_times.items()}, nodes, root,
                   thread_names=thread_names, weight=weight, granularity=granularity,
                   interval=interval, unit=unit)
