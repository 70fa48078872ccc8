"""analyze_samples on sampler snapshots: weights, balance, options, marks, aggregation."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest

import analyzer
import analyzer.analyze as analyze_module
from analyzer import analyze_by_mark, analyze_samples, sample_weights
from sampler.gctime import gc_frame
from sampler.snapshot import Frame, RunInfo
from snapshot_builders import snapshots
from analyzer_helpers import assert_balanced, close, random_rows


def reference(rows, interval="midpoint", keep=lambda row: True):
    """Racket's analysis done naively, sample by sample, for comparison.

    ``rows`` as for ``snapshots()``; returns plain dicts keyed by function name.
    Weights come from the whole thread; then only rows that ``keep`` accepts count.
    """
    by_thread = defaultdict(list)
    for r in rows:
        by_thread[r[0]].append((r[1], r[3] if keep(r) else []))
    total = 0.0
    node_total, node_self = Counter(), Counter()
    edge_total, caller_t, callee_t = Counter(), Counter(), Counter()
    threads = {}
    for tid, seq in by_thread.items():
        times = [t for t, _ in seq]
        n = len(times)
        if n < 2:
            weights = [0.0] * n
        elif interval == "end":
            weights = [0.0] + [times[i] - times[i - 1] for i in range(1, n)]
        else:
            weights = ([times[1] - times[0]]
                       + [(times[i + 1] - times[i - 1]) / 2 for i in range(1, n - 1)]
                       + [times[-1] - times[-2]])
        threads[tid] = 0.0
        for (t, stack), w in zip(seq, weights):
            if not stack or n < 2:
                continue
            total += w
            threads[tid] += w
            counts = Counter(stack)
            for f in counts:
                node_total[f] += w
            node_self[stack[0]] += w
            pairs = [("*", stack[-1])] + [(stack[i + 1], stack[i]) for i in range(len(stack) - 1)] \
                + [(stack[0], "*")]
            for ler, lee in pairs:
                caller_t[ler, lee] += w / counts.get(lee, 1)
                callee_t[ler, lee] += w / counts.get(ler, 1)
            for e in set(pairs):
                edge_total[e] += w
    return dict(total=total, node_total=node_total, node_self=node_self, edge_total=edge_total,
                caller_t=caller_t, callee_t=callee_t, threads=threads)


def compare(p, ref):
    assert close(p.total_time, ref["total"])
    nodes = {n.id: n for n in p.nodes}
    for name, t in ref["node_total"].items():
        assert close(nodes[name].total, t), name
        assert close(nodes[name].self, ref["node_self"][name]), name
    edges = {(("*" if e.caller.is_root else e.caller.id), ("*" if e.callee.is_root else e.callee.id)): e
             for e in p.edges()}
    assert set(edges) == set(ref["edge_total"])
    for k, e in edges.items():
        assert close(e.total, ref["edge_total"][k]), k
        assert close(e.caller_time, ref["caller_t"][k]), k
        assert close(e.callee_time, ref["callee_t"][k]), k


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("interval", ["midpoint", "end"])
def test_matches_a_naive_per_sample_analysis(seed, interval):
    rows = random_rows(random.Random(seed), 400)
    p = analyze_samples(snapshots(rows), interval=interval)
    ref = reference(rows, interval)
    compare(p, ref)
    assert_balanced(p)
    for tid, t in ref["threads"].items():
        assert close(p.thread_times[tid], t)


MARKS = [[], [{"req": 1}], [{"req": 2}], [{"req": 3}, {"req": 1}], [{"req": None}]]


def innermost_req(row):
    for extent in (row[4] if len(row) > 4 else []):
        if extent.get("req") is not None:
            return extent["req"]
    return None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("interval", ["midpoint", "end"])
def test_marks_and_threads_match_the_naive_analysis(seed, interval):
    rng = random.Random(100 + seed)
    rows = [r + (rng.choice(MARKS),) for r in random_rows(rng, 500, n_threads=4)]
    s = snapshots(rows, custom_keys=["req"])
    filtered = analyze_samples(s, marks={"req": 1}, interval=interval)
    compare(filtered, reference(rows, interval, keep=lambda r: innermost_req(r) == 1))
    assert_balanced(filtered)
    some = analyze_samples(s, marks={"req": 2}, threads=[1, 3], interval=interval)
    compare(some, reference([r for r in rows if r[0] in (1, 3)], interval,
                            keep=lambda r: innermost_req(r) == 2))
    by = analyze_by_mark(s, "req", interval=interval)
    assert set(by) == {1, 2, 3}
    for value, p in by.items():
        compare(p, reference(rows, interval, keep=lambda r, v=value: innermost_req(r) == v))
        assert_balanced(p)
    whole = analyze_samples(s, interval=interval)
    unmarked = reference(rows, interval, keep=lambda r: innermost_req(r) is None)["total"]
    assert close(sum(p.total_time for p in by.values()) + unmarked, whole.total_time)


def test_design_example_two_samples_of_one_function():
    p = analyze_samples(snapshots([("main", 0.0, 0.0, ["A"]), ("main", 1.0, 1.0, ["A"])]),
                        interval="midpoint")  # Racket's rule, as in the design's example
    (a,) = p.nodes
    assert (p.total_time, a.total, a.self, p.sample_number) == (2.0, 2.0, 2.0, 2)
    assert [(e.caller.is_root, e.callee is a, e.total, e.caller_time) for e in a.callers] == \
        [(True, True, 2.0, 2.0)]
    assert [(e.callee.is_root, e.total, e.callee_time) for e in a.callees] == [(True, 2.0, 2.0)]
    assert p.root.total == 2.0 and p.unit == "s"


def test_node_ids_and_sources():
    f = Frame("Klass.method", "/src/mod.py", 10, 14)
    p = analyze_samples(snapshots([(1, 0.0, 0.0, [f]), (1, 0.5, 0.5, [f])]))
    (n,) = p.nodes
    assert (n.id, n.src) == ("Klass.method", "/src/mod.py:10")
    assert (n.filename, n.firstlineno, n.lineno) == ("/src/mod.py", 10, None)
    assert n.thread_ids == [0]


def test_recursion_is_not_double_counted():
    rows = [("t", i * 0.01, i * 0.01, ["fib", "fib", "fib", "main"]) for i in range(5)]
    p = analyze_samples(snapshots(rows))
    fib = p.find("fib")
    assert close(fib.total, p.total_time) and close(fib.self, p.total_time)
    self_edge = next(e for e in fib.callees if e.callee is fib)
    assert close(self_edge.total, p.total_time)
    assert close(self_edge.callee_time, 2 / 3 * p.total_time)
    assert_balanced(p)


def test_idle_samples_bound_intervals_but_add_no_time():
    rows = [("t", 0.0, 0.0, ["work"]), ("t", 0.010, 0.010, []), ("t", 0.030, 0.030, ["work"]),
            ("t", 0.040, 0.040, [])]
    p = analyze_samples(snapshots(rows), interval="midpoint")
    # weights: 10, 15, 15, 10 ms; the idle ones are not charged
    assert close(p.total_time, 0.025)
    assert close(p.find("work").total, 0.025)
    assert p.sample_number == 2
    assert close(p.thread_times[0], 0.025)


def test_interval_end_charges_the_sample_that_ends_the_gap():
    # a long GIL-holding call: the collector was late, and sees `after` first
    rows = [("t", 0.000, 0.0, ["before"]), ("t", 0.001, 0.001, ["before"]),
            ("t", 0.101, 0.101, ["after"]), ("t", 0.102, 0.102, ["after"])]
    mid = analyze_samples(snapshots(rows), interval="midpoint")
    end = analyze_samples(snapshots(rows), interval="end")
    assert close(mid.find("before").total, 0.0515)  # Racket gives half the gap away
    assert close(end.find("before").total, 0.001)
    assert close(end.find("after").total, 0.101)
    assert end.interval == "end"


@pytest.mark.parametrize("gc_frames", ["root", "stack", "hide"])
def test_split_halves_the_intervals_a_thread_ran_through(gc_frames):
    """'split': an interval between two samples where the thread was running is
    halved between them; one that starts where the thread waited (no CPU in the
    interval before, in a new place: asleep, or its first sample) or at an idle
    sample goes wholly to the sample that ends it; a sample without CPU in the same
    place as the one before (preempted) leaves the run as it was; a collection's
    sample weighs its own CPU, and the interval it fell in is halved with it counted
    in the half of the side that made it, whatever ``gc_frames`` does with it."""
    gc0 = gc_frame(0)
    # thread, cpu, wall, stack
    rows = [("t", 0.0000, 0.000, ["W", "main"]), ("t", 0.0000, 0.001, ["W", "main"]),
            ("t", 0.0006, 0.002, ["P", "main"]),  # woke: all 0.6 ms is P's
            ("t", 0.0006, 0.0025, ["P", "main"]),  # preempted in P: still running there
            ("t", 0.0009, 0.0026, [gc0, "P", "main"]),  # a collection: exactly 0.3 ms
            ("t", 0.0016, 0.003, ["R", "main"]),  # ran through: 0.5 ms each, P's with the GC
            ("t", 0.0020, 0.0034, ["R", "main"]),  # ran through: 0.2 ms each
            ("t", 0.0020, 0.004, ["W", "main"]),  # asleep
            ("t", 0.0025, 0.005, ["P", "main"]),  # woke: all 0.5 ms
            ("t", 0.0026, 0.0051, []),  # idle (a greenlet switched out): nobody's
            ("t", 0.0031, 0.006, ["R", "main"])]  # after an idle sample: all 0.5 ms
    s = snapshots(rows)
    assert sample_weights(s, interval="split") == pytest.approx(
        [0.0, 0.0, 0.0008, 0.0, 0.0003, 0.0007, 0.0002, 0.0, 0.0005, 0.0001, 0.0005])
    split = analyze_samples(s, interval="split", gc_frames=gc_frames)
    end = analyze_samples(s, interval="end", gc_frames=gc_frames)
    assert split.interval == "split"
    assert close(split.find("P").self, 0.0013) and close(split.find("R").self, 0.0014)
    assert close(end.find("P").self, 0.0011) and close(end.find("R").self, 0.0016)
    gc_total = 0.0 if gc_frames == "hide" else 0.0003
    assert close(split.total_time, 0.0027 + gc_total) and close(end.total_time, split.total_time)
    assert_balanced(split)
    # wall time is charged as under 'end'
    assert close(analyze_samples(s, weight="wall", interval="split").find("W").self,
                 analyze_samples(s, weight="wall", interval="end").find("W").self)


def test_split_counts_each_collection_in_the_half_of_the_side_that_made_it():
    """An interval where the work changes, with collections inside: each side is owed
    half of it, collections included, and a collection counts on the side whose
    stack it shares more functions with (outermost first), or half on each when it
    shares as many. Halving only what the collections left shorted the side making
    the garbage whenever the work changed within an interval."""
    gc0 = gc_frame(0)

    def weights(made_by):
        # 1.8 ms from the second sample (in G) to the last (in C), 0.6 ms of it
        # three collections
        rows = [("t", 0.0, 0.0, ["G", "main"]), ("t", 0.0002, 0.0002, ["G", "main"])]
        rows += [("t", 0.0002 + 0.0002 * k, 0.0002 + 0.0002 * k, [gc0] + made_by) for k in (1, 2, 3)]
        rows += [("t", 0.002, 0.002, ["C", "main"])]
        return sample_weights(snapshots(rows), interval="split")

    # G's half is 0.9 ms, 0.6 of it its collections: 0.3 ms outside them, C 0.9
    assert weights(["G", "main"]) == pytest.approx([0.0, 0.0002 + 0.0003, 0.0002, 0.0002, 0.0002, 0.0009])
    assert weights(["alloc", "G", "main"]) == weights(["G", "main"])  # (deeper in G)
    # made on C's side: C's half is 0.9 ms with them, so 0.3 ms outside; G 0.9
    assert weights(["C", "main"]) == pytest.approx([0.0, 0.0002 + 0.0009, 0.0002, 0.0002, 0.0002, 0.0003])
    # elsewhere (as much shared with both): only what they left is halved, 0.6 ms each
    assert weights(["X", "main"]) == pytest.approx([0.0, 0.0002 + 0.0006, 0.0002, 0.0002, 0.0002, 0.0006])
    # a side is never charged less than nothing (G: 0.55 ms owed, 1 ms collecting)
    rows = [("t", 0.0, 0.0, ["G", "main"]), ("t", 0.0001, 0.0001, ["G", "main"]),
            ("t", 0.0011, 0.0011, [gc0, "G", "main"]), ("t", 0.0012, 0.0012, ["C", "main"])]
    assert sample_weights(snapshots(rows), interval="split") == pytest.approx([0.0, 0.0001, 0.001, 0.0001])


def test_split_halves_intervals_across_the_greenlets_of_one_os_thread():
    """Greenlets of one OS thread: the thread's intervals are halved between its
    consecutive running samples whichever greenlet each is in, and a greenlet's
    marker where its thread ran elsewhere is passed over. (Split within each
    greenlet instead, the first sample of a greenlet's run took its interval whole
    and half of the next: a busy gevent server's hashing, which always starts after
    a switch, got 9-20 points too much.) A wait still ends the thread's run, and
    the threads of other OS threads are split apart."""
    from snapshot_builders import SnapshotsBuilder, frame

    builder = SnapshotsBuilder()
    hub, render, digest = ([frame(f) for f in reversed(fs)] for fs in
                           (["poll", "hub"], ["render", "handle"], ["digest", "handle"]))
    rows = [("g1", 0.000, 0.000, render), ("g1", 0.001, 0.001, render),
            ("g2", 0.001, 0.001, []),  # (the recorder's marker: g2's thread was in g1)
            ("g2", 0.002, 0.002, digest),  # a switch: 1 ms halved, 0.5 ms each
            ("g1", 0.002, 0.002, []), ("g1", 0.003, 0.003, render),  # and back: halved
            ("hub", 0.003, 0.003, []), ("hub", 0.003, 0.004, hub),  # waiting: ends the run
            ("g2", 0.003, 0.004, []), ("g2", 0.004, 0.005, digest),  # after a wait: all of it
            ("other", 0.0, 0.0, render), ("other", 0.001, 0.001, digest)]  # another OS thread
    for label, cpu, wall, frames in rows:
        builder.sample(label, cpu, wall, frames, name=label, kind="thread" if label == "other" else "greenlet",
                       native_id=2 if label == "other" else 1)
    s = builder.build(RunInfo(engine="native"))
    # (a marker keeps its own delta, the time its thread ran elsewhere: idle, it is
    # charged to nobody)
    assert sample_weights(s, interval="split") == pytest.approx(
        [0.0, 0.0015, 0.0, 0.001, 0.001, 0.0005, 0.0, 0.0, 0.001, 0.001, 0.0, 0.001])
    profile = analyze_samples(s, interval="split")
    assert close(profile.find("render").self, 0.002) and close(profile.find("digest").self, 0.003)


def test_split_counts_a_collection_for_the_greenlet_that_made_it_however_stacks_are_drawn():
    """Across a switch, a collection is on the side of the greenlet it was made in,
    and the same stack in another greenlet is another place: the charges depend on
    the samples, not on their stacks' frames. Drawn joined under their spawner
    (``spawn_tree``), a handler's stacks share the accept loop's frames, and
    compared by frames, a collection the accept loop made moved half to the
    handler (a gevent test's per-greenlet times changed under ``spawn_tree``)."""
    from snapshot_builders import SnapshotsBuilder, frame

    accept = [frame(f) for f in ("loop", "_do_read")]
    gc0 = gc_frame(0)

    def weights(handler_prefix, more=False):
        handle = [frame(f) for f in handler_prefix + ["run", "handle"]]
        rows = [("accept", 0.000, accept), ("accept", 0.001, accept),
                ("accept", 0.0012, accept + [gc0]),  # 0.2 ms collecting, in accept
                ("handler", 0.0012, []),  # (the marker: its thread was in accept)
                ("handler", 0.003, handle)]
        if more:  # another handler, in the same stack, found having used no CPU
            rows += [("handler 2", 0.003, []), ("handler 2", 0.003, handle),
                     ("handler", 0.003, []), ("handler", 0.004, handle)]
        builder = SnapshotsBuilder()
        for label, cpu, frames in rows:
            builder.sample(label, cpu, cpu, frames, name=label, kind="greenlet", native_id=1)
        return sample_weights(builder.build(RunInfo(engine="native")), interval="split")

    # 2 ms from accept's running sample to the handler's, 1 ms owed each: accept made
    # the 0.2 ms of collections, so 0.8 ms outside them
    plain = weights([])
    assert plain == pytest.approx([0.0, 0.001 + 0.0008, 0.0002, 0.0, 0.001])
    assert weights(["loop", "_do_read", "spawn"]) == plain  # joined under the accept loop
    # the thread moved to handler 2 without running, so it waited there: the
    # handler's next interval (1 ms) is all its own, not halved with its sample before
    assert weights([], more=True)[-4:] == pytest.approx([0.0, 0.0, 0.0, 0.001])


def test_the_native_engines_snapshots_are_split_and_the_others_end():
    """The natural rule follows the engine that took every run: 'split' where the
    native engine's samples say where each thread really was, 'end' for the Python
    engine's late samples, for allocation samples, and for a merge of the two."""
    from dataclasses import replace

    from analyzer.weights import natural_interval

    def taken_by(engine):
        s = snapshots([("t", 0.0, 0.0, ["A"]), ("t", 0.001, 0.001, ["A"])])
        s.runs = [replace(r, engine=engine) for r in s.runs]
        return s

    s, native, python = taken_by(""), taken_by("native"), taken_by("python")
    assert natural_interval(native) == "split" and analyze_samples(native).interval == "split"
    assert natural_interval(python) == "end" and analyze_samples(python).interval == "end"
    assert natural_interval(s) == "end"  # (an engine not recorded)
    assert analyze_samples([native, python]).interval == "end"
    assert analyze_samples([native, native]).interval == "split"


def test_cpu_spent_before_a_thread_blocks_goes_to_where_it_ran():
    """The ``bursty`` shape, sampled where the thread really is: 3 ms of work in A,
    then a sleep called from main. The interval that ends at the first sample in the
    sleep holds the tail of A's work (the thread was idle right after: no CPU in the
    next interval), so 'active' charges it to A; 'end' gives it to the sleep's caller
    (the native engine files such a run as a sample of its own, so 'end' is right
    on its samples: tests/test_engines.py).
    """
    # thread, cpu, wall, stack
    rows = [("t", 0.000, 0.000, ["A", "main"]), ("t", 0.001, 0.001, ["A", "main"]),
            ("t", 0.002, 0.002, ["A", "main"]),
            ("t", 0.0025, 0.003, ["main"]),  # asleep: A ran until 2.5 ms
            ("t", 0.0025, 0.004, ["main"]), ("t", 0.0025, 0.005, ["main"]),
            ("t", 0.0030, 0.006, ["A", "main"])]  # awake again, in A
    s = snapshots(rows)
    active = analyze_samples(s, interval="active")
    end = analyze_samples(s)
    assert active.interval == "active" and end.interval == "end"
    assert close(active.find("A").self, 0.0030) and close(active.find("main").self, 0.0)
    assert close(end.find("A").self, 0.0025) and close(end.find("main").self, 0.0005)
    assert close(active.total_time, end.total_time)
    assert_balanced(active)
    assert sample_weights(s, interval="active") == pytest.approx([0.0, 0.001, 0.0015, 0.0, 0.0, 0.0, 0.0005])
    # wall time is not moved: the sleep is where the thread spent it
    assert close(analyze_samples(s, weight="wall").find("main").self, 0.003)


def test_a_long_gil_holding_call_goes_to_the_sample_after_it_by_default():
    """The measured shape (benchmarks/RESULTS.md, workload ``gil_call``).

    The thread is sampled twice in A; then B calls a C function that holds the GIL
    for 100 ms, so the collector cannot run until it returns, and its late sample
    finds the thread in B, right after the call.  The long interval was B's.
    """
    from analyzer import json_to_profile, merge, profile_to_json
    from analyzer.exports import sample_weights as export_weights

    rows = [("t", 0.000, 0.000, ["A", "main"]), ("t", 0.001, 0.001, ["A", "main"]),
            ("t", 0.101, 0.101, ["B", "main"]),  # the sample after the long call in B
            ("t", 0.102, 0.102, ["B", "main"])]
    s = snapshots(rows)
    default = analyze_samples(s)
    end = analyze_samples(s, interval="end")
    mid = analyze_samples(s, interval="midpoint")
    # 'end' charges the long interval to B, the sample that ends it
    assert close(end.find("B").total, 0.101) and close(end.find("A").total, 0.001)
    assert close(end.total_time, 0.102) and end.interval == "end"
    # the midpoint rule splits it: half goes to A, which was elsewhere
    assert close(mid.find("A").total, 0.0515) and close(mid.find("B").total, 0.0515)
    assert mid.interval == "midpoint"
    # for snapshots the default is 'end', and the profile records it
    assert default.interval == "end"
    assert [(n.id, n.total, n.self) for n in default.nodes] == \
        [(n.id, n.total, n.self) for n in end.nodes]
    assert_balanced(default) and assert_balanced(mid)
    # per-sample weights, the analyzer's and the exporters', follow the same rule
    assert sample_weights(s) == pytest.approx([0.0, 0.001, 0.100, 0.001])
    assert export_weights(s) == pytest.approx([0.0, 0.001, 0.100, 0.001])
    assert export_weights(s, interval="midpoint") == pytest.approx([0.001, 0.0505, 0.0505, 0.001])
    assert analyze_by_mark(snapshots([r + ([{"k": 1}],) for r in rows], custom_keys=["k"]),
                           "k")[1].interval == "end"
    # the rule travels through JSON; merging keeps it, or says the rules were mixed
    back = json_to_profile(profile_to_json(default))
    assert back.interval == "end" and close(back.find("B").total, 0.101)
    assert merge(default, end).interval == "end"
    assert merge(default, mid).interval == "mixed"
    # Racket's raw shape keeps Racket's rule by default (ms, newest first)
    raw = (102, [(0, 102, ("B", None), ("main", None)), (0, 101, ("B", None), ("main", None)),
                 (0, 1, ("A", None), ("main", None)), (0, 0, ("A", None), ("main", None))])
    racket = analyze_samples(raw)
    assert racket.interval == "midpoint" and close(racket.find("A").total, 51.5)
    assert analyze_samples(raw, interval="end").find("B").total == 101


def test_interval_end_edge_cases_first_single_and_idle_samples():
    rows = [("t", 0.0, 0.0, ["work"]), ("t", 0.010, 0.010, []), ("t", 0.030, 0.030, ["work"]),
            ("t", 0.040, 0.040, []),
            ("lonely", 0.5, 0.5, ["once"]),
            ("u", 0.0, 0.0, ["first"]), ("u", 0.010, 0.010, ["second"])]
    p = analyze_samples(snapshots(rows))
    # t: 0 (its first sample), 10 ms ending at the idle marker (nobody's), 20 ms, 10 ms idle
    assert close(p.find("work").total, 0.020) and close(p.thread_times[0], 0.020)
    # a thread seen once is dropped, as under Racket's rule; its sample still counts
    assert p.thread_times[1] == 0 and "once" not in {n.id for n in p.nodes}
    # a thread's first sample ends no interval: its frames appear with zero time
    assert p.find("first").total == 0 and close(p.find("second").total, 0.010)
    assert p.sample_number == 2 + 1 + 2
    assert close(p.total_time, 0.030)
    assert sample_weights(snapshots(rows)) == pytest.approx(
        [0.0, 0.010, 0.020, 0.010, 0.0, 0.0, 0.010])
    assert_balanced(p)


def test_wall_weighting_sees_blocked_threads():
    rows = [("io", 0.0, 0.0, ["wait"]), ("io", 0.0001, 1.0, ["wait"]),
            ("cpu", 0.0, 0.0, ["spin"]), ("cpu", 1.0, 1.0, ["spin"])]
    cpu = analyze_samples(snapshots(rows), interval="midpoint")
    wall = analyze_samples(snapshots(rows), weight="wall", interval="midpoint")
    assert cpu.find("wait").total < 0.001 and close(cpu.find("spin").total, 2.0)
    assert close(wall.find("wait").total, 2.0) and wall.weight == "wall"


def test_line_granularity():
    rows = [("t", 0.0, 0.0, [("f", "m.py", 1, 2), ("main", "m.py", 10, 11)]),
            ("t", 0.1, 0.1, [("f", "m.py", 1, 3), ("main", "m.py", 10, 11)]),
            ("t", 0.2, 0.2, [("f", "m.py", 1, 3), ("main", "m.py", 10, 11)])]
    by_func = analyze_samples(snapshots(rows), interval="midpoint")
    by_line = analyze_samples(snapshots(rows), granularity="line", interval="midpoint")
    assert [n.src for n in by_func.nodes] == ["m.py:10", "m.py:1"]
    lines = {n.src: n for n in by_line.nodes}
    assert set(lines) == {"m.py:11", "m.py:2", "m.py:3"}
    assert close(lines["m.py:2"].total, 0.1) and close(lines["m.py:3"].total, 0.2)
    assert lines["m.py:3"].lineno == 3 and lines["m.py:3"].id == "f"
    assert_balanced(by_line)


def test_thread_subset_by_id_name_and_predicate():
    rows = random_rows(random.Random(7), 300, n_threads=3)
    s = snapshots(rows, thread_names={0: "main", 1: "worker", 2: "worker"})
    only0 = analyze_samples(s, threads=[0], interval="midpoint")
    assert set(only0.thread_times) == {0}
    ref = reference([r for r in rows if r[0] == 0])
    compare(only0, ref)
    workers = analyze_samples(s, threads="worker")
    assert set(workers.thread_times) == {1, 2}
    assert workers.thread_names == {1: "worker", 2: "worker"}
    pred = analyze_samples(s, threads=lambda t: t.id != 0)
    assert pred.thread_times == workers.thread_times


def test_mark_filter_keeps_whole_thread_weights():
    rows = [("t", 0.0, 0.0, ["handle", "serve"], [{"req": 1}]),
            ("t", 0.01, 0.01, ["handle", "serve"], [{"req": 1}]),
            ("t", 0.03, 0.03, ["parse", "handle", "serve"], [{"req": 2}]),
            ("t", 0.04, 0.04, ["serve"], [])]
    s = snapshots(rows, custom_keys=["req"])
    whole = analyze_samples(s, interval="midpoint")
    one = analyze_samples(s, marks={"req": 1}, interval="midpoint")
    two = analyze_samples(s, marks=lambda m: m.get("req") == 2, interval="midpoint")
    # weights 10, 15, 15, 10 ms: each filtered sample keeps its weight in the thread
    assert close(one.total_time, 0.025) and close(two.total_time, 0.015)
    assert close(whole.total_time, 0.05)
    assert one.sample_number == 2 and two.sample_number == 1
    assert "parse" not in {n.id for n in one.nodes}
    by = analyze_by_mark(s, "req", interval="midpoint")
    assert list(by) == [1, 2]
    assert close(by[1].total_time, 0.025) and close(by[2].total_time, 0.015)
    assert_balanced(by[1])


def test_mark_value_is_the_innermost_extent_carrying_the_key():
    rows = [("t", 0.0, 0.0, ["f"], [{"user": None, "req": 9}, {"user": "ann", "req": 1}]),
            ("t", 0.1, 0.1, ["f"], [{"user": "bob", "req": None}, {"user": None, "req": 2}])]
    s = snapshots(rows, custom_keys=["user", "req"])
    assert analyze_samples(s, marks={"req": 9}).sample_number == 1
    assert analyze_samples(s, marks={"req": 1}).sample_number == 0
    assert analyze_samples(s, marks={"user": "ann", "req": 9}).sample_number == 1
    assert analyze_samples(s, marks={"user": "bob"}).sample_number == 1
    nested = analyze_samples(s, marks=lambda m: 1 in m.all("req"))
    assert nested.sample_number == 1
    assert set(analyze_by_mark(s, "user")) == {"ann", "bob"}


def test_marks_on_unmarked_snapshots():
    s = snapshots([("t", 0.0, 0.0, ["f"]), ("t", 0.1, 0.1, ["f"])])
    with pytest.raises(ValueError, match="unknown mark key 'req'"):
        analyze_samples(s, marks={"req": 1})
    assert analyze_samples(s, marks=lambda m: not m).sample_number == 2
    assert analyze_samples(s, marks=lambda m: False).nodes == []


def test_list_of_snapshots_is_merged():
    a = snapshots([("t", 0.0, 0.0, ["f", "main"]), ("t", 0.1, 0.1, ["f", "main"])])
    b = snapshots([("t", 0.0, 0.0, ["g", "main"]), ("t", 0.3, 0.3, ["g", "main"])])
    p = analyze_samples([a, b], interval="midpoint")
    assert close(p.find("main").total, 0.8)
    assert p.find("f").thread_ids == [0] and p.find("g").thread_ids == [1]
    assert_balanced(p)
    assert analyze_samples([]).nodes == []


def test_overflowing_deltas_are_exact():
    rows = [("t", 0.0, 0.0, ["long"]), ("t", 5000.0, 5000.0, ["long"])]  # 5e9 us > 2**32
    p = analyze_samples(snapshots(rows), interval="midpoint")
    assert p.total_time == 10000.0


def test_sample_weights_agree_with_the_analysis():
    rows = random_rows(random.Random(3), 200)
    s = snapshots(rows)
    w = sample_weights(s)
    p = analyze_samples(s)
    busy = sum(x for x, sid in zip(w, s.sample_stack) if sid)
    assert close(busy, p.total_time)
    wall = sample_weights(s, "wall", interval="end")
    assert close(sum(wall), sum(s.wall_deltas()) / 1e6)  # 'end': each gap counted once


def test_cost_follows_distinct_stacks(monkeypatch):
    """Identical stacks are summed before Racket's per-stack accounting."""
    seen = []
    real = analyze_module.build_graph

    def spy(rows, infos, **kw):
        rows = list(rows)
        seen.append(len(rows))
        return real(rows, infos, **kw)

    monkeypatch.setattr(analyze_module, "build_graph", spy)
    stacks = [["a", "main"], ["b", "main"], ["c", "b", "main"]]
    rows = [(i % 2, i * 0.001, i * 0.001, stacks[i % 3]) for i in range(3000)]
    p = analyze_samples(snapshots(rows))
    assert seen == [3]
    assert p.sample_number == 3000


def test_repr_is_readable():
    p = analyze_samples(snapshots([("t", 0.0, 0.0, ["f"]), ("t", 0.5, 0.5, ["f"])]),
                        interval="midpoint")
    assert repr(p) == "<Profile cpu total=1s (out of 0.5s), 2 samples, 1 thread(s), 1 nodes>"
    assert repr(p.nodes[0]) == "<Node f f.py:1 total=1 self=1 callers=1 callees=1>"
    assert repr(p.nodes[0].callers[0]) == "<Edge * -> f total=1 caller_time=1 callee_time=1>"
    assert analyzer.Profile is type(p)
