"""Build ``Snapshots`` values by hand for the export tests.

A test says what was sampled in the terms a reader thinks in — which thread, which
functions outermost first, the thread's CPU and wall clock at that moment — and
:func:`build` hands them to :class:`snapshot_builders.SnapshotsBuilder`, the
interning and per-thread delta encoding the real collector does, so the exporters
are tested on exactly the value they will receive (and on the encoding the
analyzer's tests use).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from sampler.snapshot import Frame, RunInfo, Snapshots
from snapshot_builders import SnapshotsBuilder

FrameSpec = Union[str, Frame, tuple]


def frame(spec: FrameSpec, filename: str = "app.py") -> Frame:
    """``'name'`` → a frame of ``app.py`` whose first line is stable per name."""
    if isinstance(spec, Frame):
        return spec
    if isinstance(spec, tuple):
        return Frame(*spec)
    first = 10 * (sum(map(ord, spec)) % 97 + 1)
    return Frame(spec, filename, first, first + 1)


def build(
    samples: Sequence[tuple],
    *,
    custom_keys: Sequence[Any] = (),
    run: Optional[RunInfo] = None,
    thread_kinds: Optional[dict[str, str]] = None,
) -> Snapshots:
    """Snapshots from ``(thread_name, [outer, …, inner], cpu_s, wall_s[, marks])`` rows.

    Rows are in sampling order; ``cpu_s`` and ``wall_s`` are the thread's clocks in
    seconds at the sample.  An empty stack is an idle sample.  ``marks`` is the
    sample's mark set: a tuple, innermost extent first, of one-value-per-key tuples.
    """
    builder = SnapshotsBuilder(custom_keys)
    for row in samples:
        name, stack, cpu, wall = row[:4]
        builder.sample(name, cpu, wall, [frame(spec) for spec in stack],
                       tuple(row[4]) if len(row) > 4 else (),
                       name=name, kind=(thread_kinds or {}).get(name, "thread"))
    return builder.build(run or RunInfo(pid=4242, host="testhost", python="3.x",
                                        start_epoch=1_700_000_000.0, duration=1.0,
                                        requested_delay=0.01, ticks=len(samples)))


def steady(thread: str, stack: Sequence[FrameSpec], n: int, *, start: float = 0.0,
           step: float = 0.01) -> list[tuple]:
    """``n`` samples of one stack, ``step`` seconds of CPU and wall apart."""
    return [(thread, list(stack), start + k * step, start + k * step) for k in range(n)]


def two_threads() -> Snapshots:
    """The shared example, with the analyzer's default weights for snapshots worked out
    by hand (``interval='end'``: each interval goes to the sample that ends it).

    MainThread: 5 samples 10 ms of CPU apart; the first weighs 0 (no interval ends
    there), each other 10 ms: ``main;work`` 10 ms over 2 samples, ``main;work;inner``
    10 ms, ``main;helper`` 20 ms.  worker: CPU 0, 0, 10 ms: the first sample weighs 0,
    the idle one (no frames) 0, the last 10 ms, so ``run;serve`` gets 10 ms over 2
    samples (wall: 0, 10 ms charged to nobody, 10 ms).  50 ms of CPU in all.
    """
    rows = [
        ("MainThread", ["main", "work"], 0.00, 0.00),
        ("worker", ["run", "serve"], 0.00, 0.00),
        ("MainThread", ["main", "work"], 0.01, 0.01),
        ("worker", [], 0.00, 0.01),
        ("MainThread", ["main", "work", "inner"], 0.02, 0.02),
        ("worker", ["run", "serve"], 0.01, 0.02),
        ("MainThread", ["main", "helper"], 0.03, 0.03),
        ("MainThread", ["main", "helper"], 0.04, 0.04),
    ]
    return build(rows)


def demo_app(seed: int = 7) -> Snapshots:
    """A deterministic, realistic-looking web-server profile (for screenshots and docs).

    Three threads: ``MainThread`` serving requests (marked with ``request`` ids), a
    ``db-pool`` thread running queries, and an ``idle-poller`` that mostly sleeps.
    """
    import random

    rnd = random.Random(seed)
    app, lib = "shop/app.py", "shop/lib/templates.py"
    main = [("main", app, 1, 2), ("serve_forever", app, 40, 44)]
    handlers = {
        "checkout": [
            ([("handle_checkout", app, 80, 82), ("validate_cart", app, 120, 121)], 3),
            ([("handle_checkout", app, 80, 85), ("price_items", app, 140, 143), ("apply_discounts", app, 160, 162)], 4),
            ([("handle_checkout", app, 80, 88), ("render", lib, 10, 12), ("compile_template", lib, 30, 33)], 2),
            ([("handle_checkout", app, 80, 88), ("render", lib, 10, 14), ("escape_html", lib, 60, 61)], 3),
        ],
        "search": [
            ([("handle_search", app, 200, 202), ("tokenize", app, 240, 241)], 2),
            ([("handle_search", app, 200, 204), ("rank_results", app, 260, 262), ("score", app, 280, 281)], 6),
            ([("handle_search", app, 200, 206), ("render", lib, 10, 14), ("escape_html", lib, 60, 61)], 2),
        ],
    }
    rows: list[tuple] = []
    clocks = {"MainThread": 0.0, "db-pool": 0.0, "idle-poller": 0.0}
    wall = 0.0
    for req in range(40):
        kind = "checkout" if req % 3 else "search"
        marks = ((f"req-{req:03d}",),)  # one extent setting the one key
        for stack, weight in handlers[kind]:
            for _ in range(weight + rnd.randrange(2)):
                wall += 0.004
                clocks["MainThread"] += 0.004
                rows.append(("MainThread", main + stack, clocks["MainThread"], wall, marks))
        if req % 2:
            for _ in range(2 + rnd.randrange(3)):
                wall += 0.001
                clocks["db-pool"] += 0.003
                rows.append(("db-pool", [("worker_loop", "shop/db.py", 10, 14), ("run_query", "shop/db.py", 50, 52),
                                         ("fetch_rows", "shop/db.py", 90, 93)], clocks["db-pool"], wall, ()))
        if req % 8 == 0:
            clocks["idle-poller"] += 0.0005
            rows.append(("idle-poller", [("poll", "shop/poller.py", 5, 9), ("sleep_until", "shop/poller.py", 30, 31)],
                         clocks["idle-poller"], wall, ()))
    return build(rows, custom_keys=("request",), run=RunInfo(
        pid=31337, host="demo", python="cpython 3.12", start_epoch=1_700_000_000.0, duration=wall,
        sampling_wall=wall, process_cpu=sum(clocks.values()) * 1.05, requested_delay=0.004,
        ticks=len(rows), achieved_rate=250.0, requested_rate=250.0))
