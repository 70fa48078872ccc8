"""Turning every profiler's output into the same two numbers per workload function.

Profilers disagree on shape (stacks with weights, or per-function tables with
caller/callee edges), on units (seconds, sample counts) and on what a "function" is
(cProfile and pyinstrument list C builtins, samplers only see Python frames).  To
compare them fairly, each profile is reduced to the functions *defined in the
workload files*:

``inclusive[f]``
    time with ``f`` anywhere on the stack (counted once per sample, so recursion is
    not double counted);
``self[f]``
    time with ``f`` as the innermost *workload* frame: time spent in library or C
    code is charged to the workload function that called it, which is what every
    profiler can agree on (a sampler never sees ``sorted`` as a frame, cProfile
    does).

Only shares are compared, never absolute amounts, so sample counts and seconds mix.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Optional, Sequence

from .workloads import is_workload_file

Frame = tuple  # (function name, filename)


def from_stacks(stacks: Iterable[tuple[Sequence[Frame], float]]) -> dict:
    """Reduce ``(frames innermost first, weight)`` pairs (see the module docstring)."""
    inclusive: dict[str, float] = defaultdict(float)
    self_: dict[str, float] = defaultdict(float)
    total = 0.0
    for frames, weight in stacks:
        total += weight
        names = [name for name, filename in frames if is_workload_file(filename)]
        if not names:
            continue
        self_[names[0]] += weight
        for name in set(names):
            inclusive[name] += weight
    return {"inclusive": dict(inclusive), "self": dict(self_), "total": total}


def from_table(entries: Iterable[dict]) -> dict:
    """Reduce a per-function table (cProfile's, yappi's).

    Each entry has ``name``, ``file``, ``self`` (own time), ``total`` (inclusive) and
    ``children``: ``[(child file, child inclusive time along this edge)]``.  A
    workload function's ``self`` absorbs the inclusive time of the non-workload
    functions it calls directly (its builtins and library calls).
    """
    inclusive: dict[str, float] = defaultdict(float)
    self_: dict[str, float] = defaultdict(float)
    total = 0.0
    for e in entries:
        total += e["self"]
        if not is_workload_file(e["file"]):
            continue
        inclusive[e["name"]] += e["total"]
        self_[e["name"]] += e["self"] + sum(t for f, t in e["children"] if not is_workload_file(f))
    return {"inclusive": dict(inclusive), "self": dict(self_), "total": total}


def parse_pyspy_raw(text: str) -> list[tuple[list[Frame], float]]:
    """Stacks of py-spy's ``--format raw`` output (collapsed stacks, outermost first).

    Each line is ``frame;frame;... count`` with frames spelled ``name (file)`` when
    recorded with ``--nolineno --full-filenames`` (``name (file:line)`` otherwise; the
    line is dropped).  A line without a count is skipped.
    """
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for item in stack.split(";"):
            name, sep, where = item.rpartition(" (")
            if not sep:
                frames.append((item.strip(), ""))
                continue
            filename = where.rstrip(")")
            head, colon, tail = filename.rpartition(":")
            if colon and tail.isdigit():
                filename = head
            frames.append((name, filename))
        frames.reverse()
        stacks.append((frames, float(count)))
    return stacks


def shares(amounts: Mapping[str, float], names: Optional[Sequence[str]] = None) -> Optional[dict]:
    """Each name's fraction of the sum over ``names`` (all keys when None); None if that sum is 0."""
    keys = list(amounts) if names is None else list(names)
    total = sum(amounts.get(k, 0.0) for k in keys)
    if total <= 0:
        return None
    return {k: amounts.get(k, 0.0) / total for k in keys}


def max_error_points(measured: Mapping[str, float], truth: Mapping[str, float]) -> float:
    """The largest absolute difference of share, in percentage points, over the parts."""
    return 100 * max(abs(measured.get(k, 0.0) - v) for k, v in truth.items())


def tvd_points(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """Total variation distance between two share maps, in points (0 = same, 100 = disjoint)."""
    keys = set(p) | set(q)
    return 50 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def pooled(runs: Iterable[Mapping[str, float]]) -> dict:
    """Sum several runs' amounts (to make one reference distribution out of them)."""
    out: dict[str, float] = defaultdict(float)
    for r in runs:
        for k, v in r.items():
            out[k] += v
    return dict(out)


def share_bias(profiled: Sequence[Mapping[str, float]], truth: Sequence[Mapping[str, float]],
               parts: Sequence[str], paired: bool = False) -> Optional[dict]:
    """How far a profiler's shares sit from the truth's, part by part, in points, with
    the standard error of that difference: the profiler's bias, told from noise.

    One run's error mixes the bias with sampling noise (a 5 ms profile of a 1 s run
    has 200 samples: a share of one half is off by 3.5 points, one standard
    deviation, with no bias at all) and with the truth's own drift between runs. The
    mean over runs keeps the bias and shrinks the noise by the square root of the
    runs; the standard error says by how much. ``truth``: the no-profiler runs'
    shares (independent of the profiled runs), or, with ``paired``, each profiled
    run's own clocks (one per profiled run, in the same order: the difference is
    taken run by run, so the truth's drift between runs drops out).

    Returns ``{"points": largest |difference|, "part": its part, "parts": {part:
    [difference, standard error or None]}, "dof": the standard errors' degrees of
    freedom}``, or None without runs on both sides. (Unpaired, the fewer runs' side
    sets the degrees of freedom: the conservative end of Welch's.)"""
    if not profiled or not truth or (paired and len(profiled) != len(truth)):
        return None
    out: dict = {"parts": {}, "dof": (len(profiled) if paired else min(len(profiled), len(truth))) - 1}
    for k in parts:
        x = [100 * s.get(k, 0.0) for s in profiled]
        y = [100 * s.get(k, 0.0) for s in truth]
        if paired:
            diffs = [a - b for a, b in zip(x, y)]
            d = sum(diffs) / len(diffs)
            se = (_variance(diffs) / len(diffs)) ** 0.5 if len(diffs) > 1 else None
        else:
            d = sum(x) / len(x) - sum(y) / len(y)
            se = ((_variance(x) / len(x) + _variance(y) / len(y)) ** 0.5
                  if len(x) > 1 and len(y) > 1 else None)
        out["parts"][k] = [d, se]
    worst = max(out["parts"], key=lambda k: abs(out["parts"][k][0]))
    out["points"], out["part"] = abs(out["parts"][worst][0]), worst
    return out


# Student's t, 97.5th percentile, by degrees of freedom (beyond the table: 2, the
# normal's two standard errors that every verdict used before)
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
         12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def reach(dof: Optional[int]) -> float:
    """How many standard errors a bias's 95% range spans when its standard error comes
    from runs with ``dof`` degrees of freedom (their number less one): Student's t,
    never under 2. A spread taken from 3 runs is itself a guess (one time in ten it
    comes out under a third of the true one), and two standard errors of it claimed
    a precision the runs do not have: two quick runs in a row had a check "fall
    short" on 3 runs of 0.4 s that 8 runs of 2 s put within the target (native 1 ms
    ``handoff``, 4.0 ± 0.5 against 1.2 ± 1.3; native 5 ms ``gevent_server``, 7.0 ±
    4.4 against 0.7 ± 0.6). With 3 runs the range is 4.3 standard errors."""
    if not dof or dof < 1 or dof > max(_T975):
        return 2.0
    return _T975[max(d for d in _T975 if d <= dof)]  # (between entries: the one below, wider)


def bias_text(bias: dict) -> str:
    """``1.2 ± 0.8 (`part`)``: a :func:`share_bias` with its 95% range
    (:func:`reach`), its part named (no standard error: the figure alone)."""
    se = bias["parts"][bias["part"]][1]
    return (f"{bias['points']:.1f}" + (f" ± {reach(bias.get('dof')) * se:.1f}" if se is not None else "")
            + f" (`{bias['part']}`)")


def within_limit(bias: Optional[dict], limit: float, z: Optional[float] = None) -> Optional[bool]:
    """Whether ``bias`` (:func:`share_bias`) is within ``limit`` points beyond its noise:
    True when every part's difference is, even ``z`` standard errors out; False when
    some part's is beyond it, even ``z`` standard errors in; None when noise leaves it
    open (or a standard error is unknown). ``z``: by default the bias's 95% range
    for the number of runs it comes from (:func:`reach`)."""
    if bias is None:
        return None
    if z is None:
        z = reach(bias.get("dof"))
    verdicts = [within(abs(d), se, limit, z) for d, se in bias["parts"].values()]
    if False in verdicts:
        return False
    return True if all(verdicts) else None


def within(estimate: float, se: Optional[float], limit: float, z: float = 2.0) -> Optional[bool]:
    """Whether a figure measured as ``estimate``, with standard error ``se``, is at most
    ``limit``: True when even ``estimate + z se`` is, False when even ``estimate - z se``
    is over it, None when the limit lies between the two (noise leaves it open) or
    ``se`` is unknown.  Every noise-aware verdict of the benchmark has this shape."""
    if se is None:
        return None
    if estimate + z * se <= limit:
        return True
    if estimate - z * se > limit:
        return False
    return None


def _variance(xs: Sequence[float]) -> float:
    mean = sum(xs) / len(xs)
    return sum((v - mean) ** 2 for v in xs) / (len(xs) - 1)
