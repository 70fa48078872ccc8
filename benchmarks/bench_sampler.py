"""The sampler's own figures (issue 2): slowdown, achieved rate, cost per snapshot,
bytes per sample.  Measured, never asserted: run it and read the numbers.

    python benchmarks/bench_sampler.py [--quick] [--json FILE]

Slowdown is the median, over alternating runs, of (time with sampler) / (time
without) for a CPU-bound function running at the bottom of a 50-deep stack.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sampler  # noqa: E402
from sampler.recorder import Recorder  # noqa: E402
from sampler.tracking import Tracker  # noqa: E402

DEPTH = 50


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
    results = {
        "python": sys.version.split()[0],
        "slowdown": [slowdown(d, rounds, iterations) for d in (0.005, 0.001)],
        "rate": [achieved_rate(d, k, seconds) for d in (0.001, 0.005, 0.05) for k in (1, 8)],
        "snapshot_cost": microseconds_per_snapshot(2_000 if args.quick else 20_000),
        "memory": bytes_per_sample(100_000 if args.quick else 1_000_000),
    }
    # the engine the runs used (STACKSHOT_ENGINE picks it; '' in RunInfo means python)
    results["engine"] = results["rate"][0]["engine"]
    for s in results["slowdown"]:
        print(f"slowdown at {s['delay'] * 1000:g} ms: {s['median_slowdown']:.4f}x "
              f"(runs {s['ratios']}; collector CPU {s['median_collector_cpu_per_tick_us']:.0f} us/tick)")
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
