"""How fast the analyzer is on large inputs.  Prints figures; asserts nothing.

    python benchmarks/bench_analyzer.py [--samples 1000000] [--stacks 5000] [--depth 30]

1. ``analyze_samples`` on N samples spread over ~S distinct stacks of depth D (the
   issue's target: 1M samples, 5k stacks, depth 30, well under 1 s), with one
   thread and with several, with options, and on a pessimistic graph whose frames
   are drawn at random (about one distinct call edge per frame).
2. ``render_text`` of a profile with 10k nodes, everything shown and with the
   default hiding (target: under 0.5 s), on a realistic and a pessimistic graph.

Inputs are built directly as ``Snapshots`` arrays, as the collector would store
them, so building them is not what gets timed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analyzer import analyze_samples, profile_to_json, render_dot, render_text  # noqa: E402
from sampler.snapshot import Frame, RunInfo, Snapshots, StackTrie, ThreadInfo  # noqa: E402


def call_paths(rng: random.Random, n_stacks: int, depth: int, n_funcs: int,
               fanout: int, random_frames: bool, start_anywhere: bool = False) -> list[list[int]]:
    """``n_stacks`` distinct call paths (outermost first) of ``depth`` functions.

    By default each path is a random walk on a fixed call graph in which every
    function calls ``fanout`` others (mostly "deeper" ones, sometimes itself or an
    earlier one: recursion and cycles), which is how real programs' stacks overlap.
    ``random_frames`` draws every frame at random instead: a pessimistic graph with
    about one distinct edge per frame.  ``start_anywhere`` starts walks at any
    function (many entry points: every function gets sampled).
    """
    callees = []
    for f in range(n_funcs):
        out = []
        for _ in range(fanout):
            if rng.random() < 0.1:
                out.append(rng.randrange(max(f, 1)))  # back edge: recursion / cycle
            else:
                out.append(min(n_funcs - 1, f + 1 + int(rng.expovariate(1 / 40))))
        callees.append(out)
    paths: set[tuple[int, ...]] = set()
    tries = 0
    while len(paths) < n_stacks and tries < 50 * n_stacks:
        tries += 1
        if random_frames:
            path = tuple(rng.randrange(n_funcs) for _ in range(depth))
        else:
            f = rng.randrange(n_funcs) if start_anywhere else 0
            walk = [f]
            while len(walk) < depth:
                f = rng.choice(callees[f])
                walk.append(f)
            path = tuple(walk)
        paths.add(path)
    return [list(p) for p in sorted(paths)]


def synthetic(n_samples: int, n_stacks: int, depth: int, n_funcs: int, n_threads: int = 1,
              seed: int = 1, marks: bool = False, fanout: int = 4,
              random_frames: bool = False, start_anywhere: bool = False) -> Snapshots:
    """Snapshots of ``n_samples`` over ``n_stacks`` distinct stacks of ``depth`` frames."""
    rng = random.Random(seed)
    frames = [Frame(f"mod{i % 50}.func_{i}", f"/app/mod{i % 50}.py", 10 * i, 10 * i + 3)
              for i in range(n_funcs)]
    trie = StackTrie()  # stacks only: a path's numbers are already ids into ``frames``
    leaves = [trie.path_id(path)
              for path in call_paths(rng, n_stacks, depth, n_funcs, fanout, random_frames, start_anywhere)]
    weights = [rng.paretovariate(1.2) for _ in leaves]  # a few hot stacks, a long tail
    sample_stack = array("I", rng.choices(leaves, weights=weights, k=n_samples))
    sample_thread = array("I", (rng.randrange(n_threads) for _ in range(n_samples))) \
        if n_threads > 1 else array("I", bytes(4 * n_samples))
    sample_cpu = array("I", (rng.randrange(900, 1100) for _ in range(n_samples)))
    sample_wall = array("I", (rng.randrange(1000, 1200) for _ in range(n_samples)))
    seen = set()
    for i, t in enumerate(sample_thread):  # each thread's first delta is 0
        if t not in seen:
            seen.add(t)
            sample_cpu[i] = sample_wall[i] = 0
            if len(seen) == n_threads:
                break
    threads = [ThreadInfo(t, f"thread-{t}", 100 + t, "thread", 0, 0.0, 0.0) for t in range(n_threads)]
    kw = {}
    if marks:
        kw = dict(custom_keys=["request"],
                  mark_sets=[()] + [((r,),) for r in range(100)],
                  sample_marks=array("I", (rng.randrange(101) for _ in range(n_samples))))
    return Snapshots(frames=frames, stack_frame=trie.stack_frame, stack_parent=trie.stack_parent,
                     threads=threads, sample_thread=sample_thread, sample_stack=sample_stack,
                     sample_cpu=sample_cpu, sample_wall=sample_wall,
                     runs=[RunInfo(process_cpu=n_samples / 1000)], **kw)


def best_of(repeat: int, fn):
    """Best wall and CPU seconds of ``repeat`` runs (CPU time is steadier on a busy machine)."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--stacks", type=int, default=5000)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--funcs", type=int, default=2000)
    ap.add_argument("--render-nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]} on {os.uname().machine}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}; best of {args.repeat}, wall and CPU seconds")

    print(f"\n1. analyze_samples: {args.samples:,} samples over ~{args.stacks:,} distinct stacks "
          f"of depth {args.depth}, {args.funcs:,} functions")
    cases = (
        ("1 thread", dict(n_threads=1), {}),
        ("4 threads", dict(n_threads=4), {}),
        ("4 threads, weight='wall', interval='midpoint'", dict(n_threads=4),
         {"weight": "wall", "interval": "midpoint"}),  # the default is 'end'; time the other
        ("4 threads, marks={'request': 7}", dict(n_threads=4, marks=True), {"marks": {"request": 7}}),
        ("1 thread, granularity='line'", dict(n_threads=1), {"granularity": "line"}),
        ("1 thread, random frames (pessimistic)", dict(n_threads=1, random_frames=True), {}),
    )
    for label, shape, options in cases:
        snap = synthetic(args.samples, args.stacks, args.depth, args.funcs, **shape)
        distinct = len(set(snap.sample_stack))
        wall, cpu, prof = best_of(args.repeat, lambda: analyze_samples(snap, **options))
        edges = sum(len(n.callees) for n in prof.nodes)
        print(f"   {label:<46} {wall:6.3f} s  {cpu:6.3f} s cpu   ({distinct:,} stacks, "
              f"{len(prof.nodes):,} nodes, {edges:,} edges)")

    n = args.render_nodes
    print(f"\n2. rendering a profile of ~{n:,} nodes")
    for label, shape in (("call-graph walks", {}), ("random frames (pessimistic)", {"random_frames": True})):
        snap = synthetic(200_000, 4 * n, 8, n, 1, seed=2, start_anywhere=True, **shape)
        prof = analyze_samples(snap)
        print(f"   {label}: {len(prof.nodes):,} nodes, {sum(len(x.callees) for x in prof.nodes):,} edges")
        for what, fn in (
            ("render_text, everything shown", lambda: render_text(prof, hide_self=0, hide_subs=0)),
            ("render_text, default hiding", lambda: render_text(prof)),
            ("render_text, order='self'", lambda: render_text(prof, order="self", hide_self=0, hide_subs=0)),
            ("render_dot, everything shown", lambda: render_dot(prof, hide_self=0, hide_subs=0)),
            ("profile_to_json", lambda: profile_to_json(prof)),
        ):
            wall, cpu, out = best_of(args.repeat, fn)
            size = f"({len(out.splitlines()):,} lines)" if isinstance(out, str) else ""
            print(f"     {what:<44} {wall:6.3f} s  {cpu:6.3f} s cpu   {size}")


if __name__ == "__main__":
    main()
