"""The sampler's own figures (issue 2): slowdown, achieved rate, cost per snapshot,
bytes per sample.  Measured, never asserted: run it and read the numbers.

    python benchmarks/bench_sampler.py [--quick] [--json FILE]

Slowdown is the median, over alternating runs, of (time with sampler) / (time
without) for a CPU-bound function running at the bottom of a 50-deep stack.

The running cost is the same ratio measured inside one process: one sampler, made
once, is resumed and paused around blocks of the same work, many pairs, in
alternating order.  Between fresh processes, wall time differs by 1-4% with no
profiler at all (where the interpreter's memory lands, what else runs), more than
the 1% to resolve; within one process those differences cancel in each pair, and
what is left is what the sampler costs while it samples: its ticks, the feeder's
turns with the GIL.  It leaves out what a run pays once (starting the threads, the
first look at each code object) and the final drain at stop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sampler  # noqa: E402
from benchmarks.harness import cost_label  # noqa: E402
from sampler.clocks import read_cpu  # noqa: E402
from sampler.recorder import Recorder  # noqa: E402
from sampler.tracking import Tracker  # noqa: E402

DEPTH = 50
SETTLE = 0.02  # seconds between a resume (or not) and the block timed after it
BLOCK_SECONDS = 0.25
"""Seconds per block of a running cost: the native feeder's period between turns
while every thread is sampled (``sampler.native_engine.REFRESH_STATIC``), so that
each sampled block, whose samples are filed right after it, pays for one turn's
filing, as a program pays for one each period. (A turn costs more than its
samples: with one busy thread, 260-450 us a drain at 20-1 ms, of which 4 us a
sample. Blocks of
0.05 s paid five turns for the program's one: 5.1 ms a second of filing at 5 ms
for 2.7 with blocks of 0.25 s, 7.7 for 4.8 at 1 ms; the median pair 1.012x for
1.004x, 1.018x for 1.014x, same host, same hour.) The feeder's own turn, 0.25 s
after the resume, also falls in the block: a block pays about two turns' fixed cost,
~0.1% more than a program."""
CONTROL_EVERY = 3  # sampled pairs per control pair (both blocks paused), interleaved: paired_cost
RUNNING_COST_SETTINGS = {"quick": {"pairs": 20, "block_seconds": BLOCK_SECONDS},
                         "full": {"pairs": 60, "block_seconds": BLOCK_SECONDS}}
"""Pairs and block length of a running cost, here and in ``bench_running.py``."""


def _leaf(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def deep(n: int, iterations: int) -> int:
    """The workload: pure Python work at the bottom of an ``n``-deep stack."""
    if n <= 1:
        return _leaf(iterations)
    return deep(n - 1, iterations)


def timed_run(delay: float | None, iterations: int) -> tuple[float, dict]:
    ctl = None
    if delay is not None:
        ctl = sampler.create_sampler(threading.current_thread(), delay)
    start = time.perf_counter()
    deep(DEPTH, iterations)
    elapsed = time.perf_counter() - start
    info: dict = {}
    if ctl is not None:
        ctl.stop()
        run = ctl.get_snapshots().runs[0]
        info = {"achieved_rate": run.achieved_rate, "ticks": run.ticks,
                "collector_cpu_per_tick_us": run.collector_cpu / max(run.ticks, 1) * 1e6}
    return elapsed, info


def slowdown(delay: float, rounds: int, iterations: int) -> dict:
    ratios = []
    infos = []
    timed_run(None, iterations // 10)  # warm up
    for _ in range(rounds):
        base, _ = timed_run(None, iterations)
        with_sampler, info = timed_run(delay, iterations)
        ratios.append(with_sampler / base)
        infos.append(info)
    return {"delay": delay, "median_slowdown": statistics.median(ratios),
            "ratios": [round(r, 4) for r in ratios],
            "median_collector_cpu_per_tick_us": statistics.median(
                i["collector_cpu_per_tick_us"] for i in infos)}


class _Crew:
    """``threads`` threads that each run the deep workload when told, all at once
    (they take turns with the GIL), and wait between turns: the same threads for
    every block, so no block pays for threads starting (the sampler looks at each
    new thread once)."""

    def __init__(self, threads: int) -> None:
        self.iterations = 0
        self.go = threading.Barrier(threads + 1)
        self.done = threading.Barrier(threads + 1)
        self.workers = [threading.Thread(target=self._work, daemon=True) for _ in range(threads)]
        for w in self.workers:
            w.start()

    def _work(self) -> None:
        while True:
            self.go.wait()
            if self.iterations < 0:
                return
            deep(DEPTH, self.iterations)
            self.done.wait()

    def run(self, iterations: int) -> float:
        """Seconds for every thread to run ``iterations`` at the bottom of the stack."""
        self.iterations = iterations
        start = time.perf_counter()
        self.go.wait()
        self.done.wait()
        return time.perf_counter() - start

    def close(self) -> None:
        self.iterations = -1
        self.go.wait()
        for w in self.workers:
            w.join()


def _run_here(iterations: int) -> float:
    start = time.perf_counter()
    deep(DEPTH, iterations)
    return time.perf_counter() - start


def sized(block: Callable[[int], float], block_seconds: float, start: int) -> int:
    """The amount of work (``block``'s argument) that takes about ``block_seconds``."""
    amount = start
    while block(amount) < block_seconds / 4:
        amount *= 2
    return max(1, int(amount * block_seconds / block(amount)))


def paired_cost(block: Callable[[], float], delay: float, pairs: int, **options: Any) -> dict:
    """The sampler's cost while it samples, in this process (see the module
    docstring): one sampler of every thread (``ALL_THREADS``, ``options`` passed on)
    made once and paused, then ``pairs`` pairs of ``block()`` (which times itself),
    one sampled and one paused, in alternating order; the geometric mean of the
    pairs' ratios (sampled / paused) with two standard errors. A sampled block
    starts 20 ms after the resume: the cost of pausing and resuming is not the cost
    of sampling. (A paused sampler's greenlet switch hook still logs each switch:
    its cost, measured apart, is not in it.)

    The standard error is the pairs' spread (of their logs) over the square root of
    their number, the spread taken no smaller than that of the *control pairs*: one
    after every :data:`CONTROL_EVERY` pairs, both blocks paused, timed the same way
    (the machine's own noise in one ratio, with no sampler in it). A shared host's
    speed wanders from block to block: with no profiler at all, the ratio of two
    0.1 s blocks of ``function_bias`` 20 ms apart spread 14% (one standard deviation
    of the logs, AMD host), and 30 pairs whose spread happened to come out at half
    that were judged to twice the precision the machine has: ``gil_call`` at 1 ms
    read 1.061x ± 0.022, "falls short", where 200 pairs since read 1.017x ± 0.015.
    A sampler can add noise, not take the machine's away, so the larger spread is
    the one to trust (``harness.slowdown_estimate`` floors fresh-process runs the
    same way). Beside the mean: the median pair with its range of about 95%
    (:func:`median_range`). The host's noise comes in stretches, which put a few
    pairs far out and leave most close together: a process waking on the
    collector's schedule and spinning as long as its ticks, toggled the same way,
    read 0.989x ± 0.024 by the mean and 1.001x [0.997, 1.004] by the median.

    A sampled block's time includes the filing of its own samples: the native
    engine files what its C thread took on the feeder's turns with the GIL, every
    0.25 s or when its buffer is half full, and a block paused right after it
    can end before its turn comes (the turn then falls in the pause). So the
    samples taken before the block are filed first, untimed, and those of the
    block right after it, timed (:func:`_filer`). (Without it, a program making
    2,600 collections a second showed 1.002x at 5 ms while the feeder spent 31 ms
    a second of its time with the GIL filing them.) Blocks as long as the feeder's
    period (:data:`BLOCK_SECONDS`) pay for that drain about as often as a program
    does."""
    ctl = sampler.create_sampler(sampler.ALL_THREADS, delay, **options)
    ctl("pause")  # (pauses nest: each sampled block is a resume and a pause)
    filer = _filer(ctl)
    file_samples, feeder_cpu = filer or ((lambda: None), (lambda: 0.0))
    logs: list[float] = []
    controls: list[float] = []
    sampled_seconds = filing_seconds = 0.0
    try:
        for p in range(pairs):
            times = {}
            for sampled in ((False, True) if p % 2 == 0 else (True, False)):
                if sampled:
                    ctl("resume")
                time.sleep(SETTLE)
                if sampled:
                    file_samples()
                    fed = feeder_cpu()
                times[sampled] = block()
                if sampled:
                    start, cpu = time.perf_counter(), time.thread_time()
                    file_samples()
                    times[sampled] += time.perf_counter() - start
                    filing_seconds += time.thread_time() - cpu + feeder_cpu() - fed
                    sampled_seconds += times[sampled]
                    ctl("pause")
            logs.append(math.log(times[True] / times[False]))
            if p % CONTROL_EVERY == CONTROL_EVERY - 1:
                both = []
                for _ in range(2):  # (timed as a paused block of a pair is)
                    time.sleep(SETTLE)
                    both.append(block())
                # (the later block over the earlier one, then the reverse, as the
                # sampled pairs alternate their order: what the order alone does
                # spreads both alike)
                controls.append(math.log(both[1] / both[0]) * (1 if len(controls) % 2 == 0 else -1))
    finally:
        ctl.stop()
    run = ctl.get_snapshots().runs[0]
    mean = statistics.fmean(logs)
    spread = statistics.stdev(logs) if len(logs) > 1 else None
    control_spread = statistics.stdev(controls) if len(controls) > 1 else None
    se = two_se = None
    if spread is not None:
        se = max(spread, control_spread or 0.0) / len(logs) ** 0.5
        two_se = (math.exp(mean + 2 * se) - math.exp(mean - 2 * se)) / 2
    median, low, high = median_range([math.exp(x) for x in logs])
    return {"delay": delay, "pairs": pairs, "log_mean": mean, "se": se, "ratio": math.exp(mean),
            "two_se": two_se, "ratios": [round(math.exp(x), 4) for x in logs],
            "median": median, "median_range": [low, high],
            "spread": spread, "control_spread": control_spread,
            "control_ratios": [round(math.exp(x), 4) for x in controls],
            "collector_cpu_per_tick_us": run.collector_cpu / max(run.ticks, 1) * 1e6,
            # the native engine's filing: CPU with the GIL, per second of sampled blocks
            "filing_ms_per_s": filing_seconds / sampled_seconds * 1e3
            if sampled_seconds and filer is not None else None,
            "engine": getattr(run, "engine", "") or "python"}


def median_range(ratios: list[float]) -> tuple[float, float, float]:
    """The median of ``ratios`` and the order statistics around it that hold the
    true median about 95% of the time: the sign test's range, which assumes nothing
    of the noise's shape, only that pairs are independent, its ranks taken from the
    normal approximation (94-95% from 30 pairs on); as wide as the ratios themselves
    when they are too few to have one."""
    xs = sorted(ratios)
    n = len(xs)
    k = max(0, math.floor(n / 2 - 1.96 * math.sqrt(n) / 2))
    return statistics.median(xs), xs[k], xs[n - 1 - k]


def _filer(ctl: Any) -> Optional[tuple[Callable[[], None], Callable[[], float]]]:
    """What files the samples ``ctl``'s sampler has taken and not filed yet, now, in
    this thread (the native collector's drain), and the CPU seconds its feeder
    thread has used so far (0.0 where its clock cannot be read); ``None`` where
    samples are filed as they are taken (the Python engine). The feeder files with
    the GIL, so what it and the drains here use is taken from the program's time
    (the C thread's is not)."""
    collector = getattr(ctl, "_collector", None)
    flush = getattr(collector, "flush", None)
    if flush is None:
        return None

    def feeder_cpu() -> float:
        clock = getattr(collector, "_feeder_clock", None)
        cpu = read_cpu(clock) if clock is not None else None
        return cpu or 0.0

    return flush, feeder_cpu


def running_cost(delay: float, threads: int, pairs: int, block_seconds: float) -> dict:
    """:func:`paired_cost` of blocks of about ``block_seconds`` of the deep workload
    in ``threads`` threads (1: this one)."""
    crew = _Crew(threads) if threads > 1 else None
    block = crew.run if crew is not None else _run_here
    try:
        amount = sized(block, block_seconds, 20_000)
        cost = paired_cost(lambda: block(amount), delay, pairs)
    finally:
        if crew is not None:
            crew.close()
    return dict(cost, threads=threads, block_seconds=block_seconds)


def achieved_rate(delay: float, threads: int, seconds: float) -> dict:
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            deep(DEPTH, 20_000)

    workers = [threading.Thread(target=busy) for _ in range(threads)]
    for w in workers:
        w.start()
    ctl = sampler.create_sampler(workers, delay)
    time.sleep(seconds)
    ctl.stop()
    stop.set()
    for w in workers:
        w.join()
    run = ctl.get_snapshots().runs[0]
    return {"delay": delay, "threads": threads, "requested_rate": run.requested_rate,
            "achieved_rate": round(run.achieved_rate, 1),
            "achieved_over_requested": round(run.achieved_rate / run.requested_rate, 4),
            "late_ticks": run.late_ticks, "missed_ticks": run.missed_ticks, "ticks": run.ticks,
            "engine": getattr(run, "engine", "") or "python"}


def microseconds_per_snapshot(n: int) -> dict:
    """Cost of one tick's recording for one thread parked at a 50-deep stack."""
    ready, done = threading.Event(), threading.Event()

    def parked(k: int) -> None:
        if k <= 1:
            ready.set()
            done.wait()
            return
        parked(k - 1)

    t = threading.Thread(target=parked, args=(DEPTH,))
    t.start()
    ready.wait()
    recorder = Recorder((), time.perf_counter())
    tracker = Tracker([t])
    start = time.perf_counter()
    for _ in range(n):
        frames = sys._current_frames()
        recorder.record_tick(tracker.targets(frames), time.perf_counter())
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    return {"stack_depth": DEPTH + 2, "us_per_snapshot": elapsed / n * 1e6}


def bytes_per_sample(n: int) -> dict:
    """Memory of the sample columns of a recorder holding ``n`` samples."""
    recorder = Recorder((), time.perf_counter())
    ready, done = threading.Event(), threading.Event()

    def parked() -> None:
        ready.set()
        done.wait()

    t = threading.Thread(target=parked)
    t.start()
    ready.wait()
    tracker = Tracker([t])
    frames = sys._current_frames()
    targets = tracker.targets(frames)
    for i in range(n):
        recorder.record_tick(targets, i * 0.001)
    done.set()
    t.join()
    columns = [recorder.sample_thread, recorder.sample_stack, recorder.sample_wall, recorder.sample_cpu]
    used = sum(len(c) * c.itemsize for c in columns)
    allocated = sum(sys.getsizeof(c) for c in columns)
    snaps = recorder.snapshot(sampler.RunInfo())
    return {"samples": n, "bytes_per_sample": used / n, "allocated_bytes_per_sample": allocated / n,
            "snapshot_samples": len(snaps)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    rounds, iterations, seconds = (3, 400_000, 0.5) if args.quick else (11, 2_000_000, 2.0)
    running = RUNNING_COST_SETTINGS["quick" if args.quick else "full"]
    pairs, block = running["pairs"], running["block_seconds"]
    results = {
        "python": sys.version.split()[0],
        "slowdown": [slowdown(d, rounds, iterations) for d in (0.005, 0.001)],
        "running_cost": [running_cost(d, k, pairs, block) for d in (0.005, 0.001) for k in (1, 4)],
        "rate": [achieved_rate(d, k, seconds) for d in (0.001, 0.005, 0.05) for k in (1, 8)],
        "snapshot_cost": microseconds_per_snapshot(2_000 if args.quick else 20_000),
        "memory": bytes_per_sample(100_000 if args.quick else 1_000_000),
    }
    # the engine the runs used (STACKSHOT_ENGINE picks it; '' in RunInfo means python)
    results["engine"] = results["rate"][0]["engine"]
    for s in results["slowdown"]:
        print(f"slowdown at {s['delay'] * 1000:g} ms: {s['median_slowdown']:.4f}x "
              f"(runs {s['ratios']}; collector CPU {s['median_collector_cpu_per_tick_us']:.0f} us/tick)")
    for c in results["running_cost"]:
        print(f"running cost at {c['delay'] * 1000:g} ms, {cost_label(c)}: {c['ratio']:.4f}x "
              f"± {c['two_se'] or float('nan'):.4f} (2 SE, {c['pairs']} pairs)")
    for r in results["rate"]:
        print(f"rate at {r['delay'] * 1000:g} ms, {r['threads']} busy thread(s): "
              f"{r['achieved_rate']:.0f}/{r['requested_rate']:.0f} Hz = {r['achieved_over_requested']:.1%}"
              f" (late {r['late_ticks']}, missed {r['missed_ticks']} of {r['ticks']})")
    c = results["snapshot_cost"]
    print(f"one snapshot of a {c['stack_depth']}-deep stack: {c['us_per_snapshot']:.1f} us")
    m = results["memory"]
    print(f"{m['samples']} samples: {m['bytes_per_sample']:.1f} bytes/sample "
          f"({m['allocated_bytes_per_sample']:.1f} allocated)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
