"""What sampler.memprof costs on allocation-heavy code, beside tracemalloc.

    python -m benchmarks.bench_memprof [--runs 7] [--size 1.0]

Each configuration runs the workload ``--runs`` times, interleaved with the others
(so a slow spell of the machine hits them all), in this one process, timed by the
thread's CPU clock (the engine adds no thread: all its cost is on this one; other
processes' load then shifts the numbers less than it shifts wall time). Printed per
configuration (a Markdown table): the median time over the median of the runs without
a profiler, and that ratio's spread (its min and max over the runs). "memprof" is the
null tracker; "tracker" a leak hunter's tracker (a Python callback per sample and per
freed sampled block). The first row gives the spread
of the runs without a profiler: a ratio inside it is no measurable cost. Last, the
memory one tracked block costs (the engine's record and table slot, measured by
tracking many blocks and reading the process's resident memory; the value a tracker
keeps is the tracker's own).

The workload allocates as Python programs do: small objects (ints, tuples, short
strings), dicts and lists that grow, and some large buffers; most die young, some
survive a while.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc

from sampler import memprof


def workload(size: float) -> int:
    """Allocation-heavy work: about 4 million allocations at size 1.0."""
    kept: list = []
    total = 0
    for i in range(int(200_000 * size)):
        t = (i, str(i), [i, i + 1])
        d = {"a": t, "b": i * 2.5}
        total += len(d) + len(t[1])
        if i % 10 == 0:
            kept.append(t)
        if i % 1000 == 0:
            kept.append(bytearray(10_000))
        if len(kept) > 5000:
            kept = kept[2500:]
    return total


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_block_bytes(n: int = 60_000) -> float:
    """Resident bytes per tracked block: rate 1.0, a tracker keeping a shared value."""
    keep = object()
    tracker = memprof.Tracker(alloc_minor=lambda a: keep, alloc_major=lambda a: keep, promote=lambda v: v)
    blocks = [bytes(100) for _ in range(n)]  # allocated before: the list itself is not measured
    del blocks
    gc.collect()
    before = _rss_bytes()
    profile = memprof.start(1.0, tracker=tracker)
    blocks = [bytes(100) for _ in range(n)]
    memprof.stop()
    gc.collect()
    held = profile.stats()["records"]
    after = _rss_bytes()
    del blocks
    memprof.discard(profile)
    # the blocks themselves (bytes(100) is 133 bytes in a 144-byte pymalloc slot) and the
    # list are the program's; what remains is the engine's
    program = n * 144 + n * 8
    return (after - before - program) / max(held, 1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--size", type=float, default=1.0)
    args = ap.parse_args(argv)

    def none() -> None:
        workload(args.size)

    def profiled(rate: float, make_tracker=lambda: memprof.null_tracker):
        def run() -> None:
            profile = memprof.start(rate, tracker=make_tracker())
            try:
                workload(args.size)
            finally:
                memprof.stop()
                memprof.discard(profile)
        return run

    def leak_hunter() -> memprof.Tracker:
        """A leak hunter's tracker: a Python callback per sample and per free."""
        live: dict = {}

        def alloc(a: memprof.Allocation):
            where = a.callstack[0] if a.callstack else None
            live[where] = live.get(where, 0) + a.n_samples
            return where, a.n_samples

        def free(v) -> None:
            live[v[0]] -= v[1]
        return memprof.Tracker(alloc, alloc, lambda v: v, free, free)

    def with_tracemalloc() -> None:
        tracemalloc.start()
        try:
            workload(args.size)
        finally:
            tracemalloc.stop()

    configs = {"none": none, "memprof 1e-4": profiled(1e-4), "memprof 1e-3": profiled(1e-3),
               "memprof 1e-2": profiled(1e-2), "tracker 1e-4": profiled(1e-4, leak_hunter),
               "tracker 1e-3": profiled(1e-3, leak_hunter), "tracemalloc": with_tracemalloc}
    times: dict[str, list[float]] = {name: [] for name in configs}
    workload(args.size / 10)  # warm up
    for _ in range(args.runs):
        for name, run in configs.items():
            gc.collect()
            t0 = time.thread_time()
            run()
            times[name].append(time.thread_time() - t0)
    base = statistics.median(times["none"])
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, workload {base * 1000:.0f} ms of CPU")
    print("| profiler | median time ratio | runs |\n|---|---|---|")
    for name, ts in times.items():
        ratios = [t / base for t in ts]
        print(f"| {name:14s} | {statistics.median(ratios):5.2f}x | {min(ratios):.2f}-{max(ratios):.2f} |")
    from sampler import _memprof
    print(f"memory per tracked block: {_memprof.RECORD_BYTES} bytes of record (+ malloc's own "
          f"header) and a slot of the fixed {_memprof.TABLE_BYTES >> 20} MiB pointer table; "
          f"resident memory grew by {per_block_bytes():.0f} bytes per block (engine side, noisy)")


if __name__ == "__main__":
    main()
