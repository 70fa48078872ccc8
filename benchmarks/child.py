"""One measurement in a fresh interpreter: one workload under one in-process profiler.

    python -m benchmarks.child SPEC_JSON OUT_JSON

``SPEC_JSON`` names the ``workload``, its calibrated ``params`` and the ``profiler``
(``none``, ``stackshot``, ``pyinstrument``, ``yappi``, ``cProfile``; py-spy runs
this same program with ``none`` from outside).  With ``"calibrate": seconds``
instead, it sizes the workload and writes the params.

A fresh process per measurement keeps one profiler's leftovers (hooks, threads,
memory, a lowered switch interval) from touching the next, and gives each run its
own peak RSS.  Only the workload's ``run`` is timed; setup, profiler start/stop and
analysis are not, and analysis is timed separately.
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any, Optional

from . import attribution
from .workloads import load


def _maxrss_kb() -> int:
    """This process's peak resident set size so far, in KiB.

    ``/proc/self/status`` ``VmHWM`` first: ``ru_maxrss`` is not this program's own
    figure on Linux, because exec keeps the larger of it and the RSS of the process
    that forked it (the harness, or py-spy), which would hide a small profiler's cost.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- in-process profilers ---------------------------------------------------------------
# Each adapter: start(), stop(), then finish() -> (profiles by variant, stats).  The
# profiles are attribution reductions (inclusive/self time of workload functions).

class NoProfiler:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def finish(self) -> tuple[dict, dict]:
        return {}, {}


class Stackshot:
    """stackshot's sampler on every thread, analysed with every interval rule.

    ``engine`` (``'native'`` or ``'python'``) is asked for twice: in the environment
    (``STACKSHOT_ENGINE``, set by the harness for the whole process) and as
    ``create_sampler(..., engine=)``; a sampler without that argument runs its only
    engine.  The engine the run *used* (``RunInfo.engine``, '' meaning 'python') is
    what the results record.
    """

    def __init__(self, delay: float, engine: Optional[str] = None) -> None:
        self.delay = delay
        self.engine = engine

    def start(self) -> None:
        import sampler

        self.t0 = time.perf_counter()
        if self.engine:
            try:  # GC time on whatever the engine (gc_heavy checks it)
                self.ctl = sampler.create_sampler(sampler.ALL_THREADS, self.delay, engine=self.engine,
                                                  gc_time=True)
                return
            except TypeError as e:
                if "gc_time" not in str(e):
                    raise
            try:
                self.ctl = sampler.create_sampler(sampler.ALL_THREADS, self.delay, engine=self.engine)
                return
            except TypeError as e:
                if "engine" not in str(e):
                    raise
        self.ctl = sampler.create_sampler(sampler.ALL_THREADS, self.delay)

    def tick_times(self) -> list[float]:
        """perf_counter times of the samples (every tracked thread's), sorted."""
        snaps = self.ctl.get_snapshots()
        start = getattr(self.ctl, "_start", self.t0)
        return sorted({round(start + s.wall, 6) for s in snaps.samples()})

    def stop(self) -> None:
        self.ctl.stop()

    def finish(self) -> tuple[dict, dict]:
        from analyzer import analyze_samples, sample_weights

        snaps = self.ctl.get_snapshots()
        run = snaps.runs[0]

        default_interval = inspect.signature(analyze_samples).parameters["interval"].default
        if default_interval is None:  # "the input's natural rule": the one these snapshots get
            try:
                from analyzer.weights import natural_interval
            except ImportError:  # before the rule depended on the engine
                from analyzer.weights import resolve_interval

                default_interval = resolve_interval(None)
            else:
                default_interval = natural_interval(snaps)
        # Analysis time: what a user pays to turn the snapshots into the call graph.
        # A failure here is recorded, not fatal: the attribution below only needs
        # sample_weights, and one broken call should not cost the whole measurement.
        analysis_error = None
        t0 = time.perf_counter()
        try:
            analyze_samples(snaps)
        except Exception as e:  # noqa: BLE001 - reported in the results
            analysis_error = f"{type(e).__name__}: {e}"
        analysis = time.perf_counter() - t0
        frames = [(f.name, f.filename) for f in snaps.frames]
        stacks = {sid: [frames[i] for i in snaps.stack(sid)] for sid in set(snaps.sample_stack)}
        profiles = {}
        try:  # every rule the analyzer offers ('active' came later than the first two)
            from analyzer.weights import INTERVALS as intervals
        except ImportError:
            intervals = ("midpoint", "end")
        for interval in intervals:
            weights = sample_weights(snaps, "cpu", interval=interval)
            profiles[interval] = attribution.from_stacks(
                (stacks[sid], w) for sid, w in zip(snaps.sample_stack, weights))
        n = len(snaps)
        columns = [snaps.sample_thread, snaps.sample_stack, snaps.sample_wall, snaps.sample_cpu]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.snap")
            snaps.save(path)
            file_bytes = os.path.getsize(path)
        stats = {
            "samples": n, "ticks": run.ticks, "late_ticks": run.late_ticks,
            "missed_ticks": run.missed_ticks, "achieved_rate": run.achieved_rate,
            "requested_rate": run.requested_rate,
            "rate_ratio": run.achieved_rate / run.requested_rate if run.requested_rate else None,
            "collector_cpu": run.collector_cpu,
            "collector_cpu_per_tick_us": run.collector_cpu / max(run.ticks, 1) * 1e6,
            "sampling_wall": run.sampling_wall,
            "column_bytes_per_sample": sum(len(c) * c.itemsize for c in columns) / max(n, 1),
            "file_bytes_per_sample": file_bytes / max(n, 1),
            "analysis_seconds": None if analysis_error else analysis,
            "analysis_error": analysis_error,
            "collector_cpu_share": run.collector_cpu / run.sampling_wall if run.sampling_wall else None,
            "errors": list(run.errors),
            "default_interval": default_interval,
            "engine": getattr(run, "engine", "") or "python",
            "engine_requested": self.engine,
            # the collections' time stackshot filed (sampler.gctime), checked against
            # the gc_heavy workload's own gc.callbacks timing
            "gc_seconds": sum((getattr(run, "extra", {}) or {}).get("gc_seconds", {}).values()),
        }
        return profiles, stats


class Pyinstrument:
    """pyinstrument at a 1 ms interval, its default wall-clock timer, as users run it."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    def start(self) -> None:
        import pyinstrument

        self.profiler = pyinstrument.Profiler(interval=self.interval)
        self.profiler.start()

    def stop(self) -> None:
        self.session = self.profiler.stop()

    def finish(self) -> tuple[dict, dict]:
        s = self.session
        t0 = time.perf_counter()
        s.root_frame()
        analysis = time.perf_counter() - t0
        stacks = []
        for identifiers, seconds in s.frame_records:
            frames = []
            for ident in identifiers:
                name, _, rest = ident.partition("\x00")
                filename = rest.partition("\x00")[0]
                frames.append((name, filename))
            frames.reverse()
            stacks.append((frames, seconds))
        profiles = {"default": attribution.from_stacks(stacks)}
        return profiles, {"records": len(s.frame_records), "duration": s.duration,
                          "analysis_seconds": analysis}


class Yappi:
    """yappi on its CPU clock, every thread (greenlet contexts for the greenlet workload)."""

    def __init__(self, greenlets: bool) -> None:
        self.greenlets = greenlets

    def start(self) -> None:
        import yappi

        yappi.set_clock_type("cpu")
        if self.greenlets:
            yappi.set_context_backend("greenlet")
        yappi.start()

    def stop(self) -> None:
        import yappi

        yappi.stop()

    def finish(self) -> tuple[dict, dict]:
        import yappi

        t0 = time.perf_counter()
        stats = yappi.get_func_stats()
        analysis = time.perf_counter() - t0
        entries = [{"name": s.name, "file": s.module, "self": s.tsub, "total": s.ttot,
                    "children": [(c.module, c.ttot) for c in s.children]} for s in stats]
        return {"default": attribution.from_table(entries)}, {"functions": len(entries),
                                                              "analysis_seconds": analysis}


class CProfile:
    """The standard library's cProfile, enabled in the main thread as ``-m cProfile`` does."""

    def start(self) -> None:
        import cProfile

        self.profile = cProfile.Profile()
        self.profile.enable()

    def stop(self) -> None:
        self.profile.disable()

    def finish(self) -> tuple[dict, dict]:
        import pstats

        t0 = time.perf_counter()
        table = pstats.Stats(self.profile).stats
        analysis = time.perf_counter() - t0
        children: dict = defaultdict(list)
        for (file, _line, _name), (_cc, _nc, _tt, _ct, callers) in table.items():
            for caller, edge in callers.items():
                children[caller].append((file, edge[3]))
        entries = [{"name": name, "file": file, "self": tt, "total": ct,
                    "children": children.get((file, line, name), [])}
                   for (file, line, name), (_cc, _nc, tt, ct, _callers) in table.items()]
        return {"default": attribution.from_table(entries)}, {"functions": len(entries),
                                                              "analysis_seconds": analysis}


def make_profiler(spec: dict) -> Any:
    kind = spec["profiler"]
    if kind == "none":
        return NoProfiler()
    if kind == "stackshot":
        return Stackshot(spec["delay"], spec.get("engine"))
    if kind == "pyinstrument":
        return Pyinstrument(spec.get("interval", 0.001))
    if kind == "yappi":
        return Yappi(greenlets=spec["workload"] in ("greenlets", "gevent_server", "gevent_chatty", "greenlet_naps"))
    if kind == "cProfile":
        return CProfile()
    raise ValueError(f"unknown in-process profiler {kind!r}")


def measure(spec: dict) -> dict:
    workload = load(spec["workload"])
    if "calibrate" in spec:
        return {"params": workload.calibrate(spec["calibrate"])}
    state = workload.setup(spec["params"])
    profiler = make_profiler(spec)
    rss_before = _maxrss_kb()
    profiler.start()
    cpu0 = _process_cpu()
    t0 = time.perf_counter()
    parts = workload.run(state)
    elapsed = time.perf_counter() - t0
    cpu = _process_cpu() - cpu0
    profiler.stop()
    rss_run = _maxrss_kb()
    profiles, stats = profiler.finish()
    workload_stats = workload.report(state) if hasattr(workload, "report") else {}
    intervals = workload_stats.pop("gap_intervals", None)
    if intervals is not None and hasattr(profiler, "tick_times"):
        workload_stats.update(match_gaps(intervals, profiler.tick_times(), t0, t0 + elapsed))
    return {
        "elapsed": elapsed,
        "process_cpu": cpu,
        "parts_seconds": parts,
        "maxrss_kb_setup": rss_before,
        "maxrss_kb_run": rss_run,
        "maxrss_kb_end": _maxrss_kb(),
        "profiles": profiles,
        "stats": stats,
        "threads_left": threading.active_count(),
        "workload_stats": workload_stats,
        "python": sys.version.split()[0],
    }


PREEMPTION_NS = 2_000_000
"""Pauses longer than this are the OS running another process (a 4 ms time slice is
typical on these machines), not a sample: left out of the per-tick figure."""


def match_gaps(intervals: list, ticks: list[float], start: float, end: float) -> dict:
    """The program's pauses that contain one of the sampler's ticks (DESIGN.md, "the gap
    the program sees"): how many of the ticks inside the timed run hit a pause, and the
    time those pauses took, per tick (pauses over :data:`PREEMPTION_NS` left out).

    The same figures for the ticks moved by half their spacing (``gap_chance_*``) are
    the control: how often a moment unrelated to any tick falls in a pause (the OS
    running something else on a loaded machine), to read the figures against.
    """
    inside = [t for t in ticks if start <= t <= end]
    spacing = sorted(b - a for a, b in zip(inside, inside[1:]))
    half = spacing[len(spacing) // 2] / 2 if spacing else 0.0
    out = {"gap_ticks": len(inside)}
    for prefix, shift in (("gap_", 0.0), ("gap_chance_", half)):
        hit, lost, lengths = _pauses_at([round((t + shift) * 1e9) for t in inside], intervals)
        n = max(len(inside), 1)
        lengths.sort()
        out.update({prefix + "ticks_hit": hit / n, prefix + "lost_us_per_tick": lost / 1e3 / n,
                    prefix + "matched_median_us": lengths[len(lengths) // 2] / 1e3 if lengths else None})
    return out


def _pauses_at(ns: list[int], intervals: list) -> tuple[int, int, list]:
    """How many of the (sorted) times ``ns`` fall in a pause, the pauses' total and lengths."""
    import bisect

    slack = 2_000  # the tick's own time stamp is taken a little before or after the hold
    hit, lost, lengths = 0, 0, []
    for a, b in intervals:
        lo = bisect.bisect_left(ns, a - slack)
        hi = bisect.bisect_right(ns, b + slack)
        if hi > lo and b - a <= PREEMPTION_NS:
            hit += hi - lo
            lost += b - a
            lengths.append(b - a)
    return hit, lost, lengths


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    result = measure(spec)
    with open(argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
