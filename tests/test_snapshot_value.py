"""The Snapshots value itself: checking, decoding, equality and merging.

Values are built with ``Snapshots(...)`` directly, so these tests depend on nothing but
``sampler/snapshot.py``.
"""

from __future__ import annotations

import math
import random
from array import array
from typing import Any

import pytest

from sampler.snapshot import (
    OVERFLOW, Frame, RunInfo, SnapshotError, Snapshots, ThreadInfo, merge,
)

F_MAIN = Frame("main", "app.py", 1, 10)
F_WORK = Frame("work", "app.py", 20, 25)
F_LEAF = Frame("leaf", "lib.py", 5, None)


def two_thread_value(**over: Any) -> Snapshots:
    """main -> work -> leaf and main -> work, on two threads, one delta overflowing."""
    kw: dict[str, Any] = dict(
        frames=[F_MAIN, F_WORK, F_LEAF],
        # stack 1: [main]; 2: [work, main]; 3: [leaf, work, main]
        stack_frame=[0, 0, 1, 2],
        stack_parent=[0, 0, 1, 2],
        threads=[ThreadInfo(0, "MainThread", 100, "thread", 0, 0.5, 0.25),
                 ThreadInfo(1, "worker", 101, "thread", 0, 0.75, 0.0)],
        sample_thread=[0, 1, 0, 1, 0],
        sample_stack=[3, 2, 2, 3, 1],
        sample_wall=[0, 0, 1000, OVERFLOW, 2000],
        sample_cpu=[0, 0, 900, 500, OVERFLOW],
        wall_overflow={3: 5_000_000_000},
        cpu_overflow={4: 1 << 33},
        runs=[RunInfo(pid=7, host="h", process_cpu=1.5)],
    )
    kw.update(over)
    return Snapshots(**kw)


# -- decoding ------------------------------------------------------------------------
def test_stack_walks_parents_innermost_first_and_caches():
    s = two_thread_value()
    assert s.stack(0) == ()
    assert s.stack(1) == (0,)
    assert s.stack(3) == (2, 1, 0)
    assert s.stack(3) is s.stack(3)
    assert s.stack_frames(3) == (F_LEAF, F_WORK, F_MAIN)
    assert s.stack(2) == (1, 0)  # uses the cached prefix path as well


def test_samples_decode_deltas_per_thread_with_overflow():
    s = two_thread_value()
    assert list(s.wall_deltas()) == [0, 0, 1000, 5_000_000_000, 2000]
    assert list(s.cpu_deltas()) == [0, 0, 900, 500, 1 << 33]
    got = list(s.samples())
    assert [x.index for x in got] == [0, 1, 2, 3, 4]
    assert [x.thread for x in got] == [0, 1, 0, 1, 0]
    assert [x.stack for x in got] == [3, 2, 2, 3, 1]
    # thread 0: first_wall 0.5, deltas 0, 1000us, 2000us
    assert [x.wall for x in got if x.thread == 0] == pytest.approx([0.5, 0.501, 0.503])
    assert [x.cpu for x in got if x.thread == 0] == pytest.approx(
        [0.25, 0.2509, 0.2509 + (1 << 33) / 1e6])
    # thread 1: first_wall 0.75, then the overflowing 5000 s delta
    assert [x.wall for x in got if x.thread == 1] == pytest.approx([0.75, 5000.75])
    assert all(x.marks == 0 for x in got)


def test_deltas_without_overflow_are_the_arrays_themselves():
    s = two_thread_value(sample_wall=[0, 0, 1, 2, 3], sample_cpu=[0, 0, 1, 2, 3],
                         wall_overflow={}, cpu_overflow={})
    assert s.wall_deltas() is s.sample_wall
    assert s.cpu_deltas() is s.sample_cpu


def test_marks_of_and_cpu_time():
    s = two_thread_value(custom_keys=["req"], mark_sets=[(), (("r1",),), (("r2",), ("r1",))],
                         sample_marks=[0, 1, 2, 1, 0],
                         runs=[RunInfo(process_cpu=1.5), RunInfo(process_cpu=2.0)])
    assert s.marks_of(0) == ()
    assert s.marks_of(2) == (("r2",), ("r1",))
    assert [x.marks for x in s.samples()] == [0, 1, 2, 1, 0]
    assert s.cpu_time == 3.5
    assert two_thread_value().marks_of(1) == ()


def test_len_repr_and_counts():
    s = two_thread_value()
    assert len(s) == s.sample_count == 5
    assert "5 samples" in repr(s) and "3 stacks" in repr(s)


# -- equality ------------------------------------------------------------------------
def test_equality_is_by_content():
    a, b = two_thread_value(), two_thread_value()
    assert a == b and not (a != b)
    assert a != two_thread_value(sample_wall=[0, 0, 1001, OVERFLOW, 2000])
    assert a != two_thread_value(wall_overflow={3: 5_000_000_001})
    assert a != two_thread_value(runs=[RunInfo(pid=8)])
    assert a != two_thread_value(custom_keys=["k"], mark_sets=[(), (("v",),)],
                                 sample_marks=[0, 1, 0, 0, 0])
    assert a != two_thread_value(sample_marks=[0, 0, 0, 0, 0])  # marks column vs none
    assert (a == "not a value") is False


def test_snapshots_are_unhashable():
    with pytest.raises(TypeError):
        hash(two_thread_value())


def test_runinfo_dict_round_trip_keeps_inf_rates():
    r = RunInfo(pid=1, requested_rate=math.inf, achieved_rate=99.5, custom_keys=("a", 1),
                errors=("boom",), extra={"x": [1, 2]})
    d = r.to_dict()
    assert d["requested_rate"] == "inf" and d["custom_keys"] == ["a", 1]
    assert RunInfo.from_dict(d) == r
    assert RunInfo.from_dict({**d, "from_the_future": 1}) == r


# -- validate ------------------------------------------------------------------------
@pytest.mark.parametrize("over, message", [
    (dict(stack_frame=[], stack_parent=[]), "at least 1"),
    (dict(stack_parent=[0, 0, 1]), "same length"),
    (dict(stack_parent=[0, 0, 2, 2]), "stack 2 has parent 2"),
    (dict(stack_frame=[0, 0, 1, 3]), "stack 3 names frame 3"),
    (dict(sample_cpu=[0, 0, 900, 500]), "differ in length"),
    (dict(sample_marks=[0, 0]), "differ in length"),
    (dict(sample_stack=[3, 2, 2, 3, 4]), "stack that does not exist"),
    (dict(sample_thread=[0, 1, 0, 2, 0]), "thread that does not exist"),
    (dict(sample_marks=[0, 0, 0, 0, 1]), "mark set that does not exist"),
    (dict(threads=[ThreadInfo(1, "a", None, "thread", 0, 0.0, 0.0),
                   ThreadInfo(1, "b", None, "thread", 0, 0.0, 0.0)]), "thread 0 carries id 1"),
    (dict(threads=[ThreadInfo(0, "a", None, "thread", 1, 0.0, 0.0),
                   ThreadInfo(1, "b", None, "thread", 0, 0.0, 0.0)]), "names run 1"),
    (dict(wall_overflow={2: 5}), "bad wall overflow entry at sample 2"),
    (dict(wall_overflow={3: -1}), "bad wall overflow"),
    (dict(cpu_overflow={99: 5}), "bad cpu overflow entry at sample 99"),
    (dict(mark_sets=[((1,),)]), "mark set 0 must be the empty set"),
    (dict(mark_sets=[]), "mark set 0 must be the empty set"),
    (dict(custom_keys=["a", "b"], mark_sets=[(), (("x",),)]), "entry of 1 values, but there are 2"),
    (dict(mark_sets=[(), (("x",),)]), "entry of 1 values, but there are 0"),
])
def test_validate_refuses_inconsistent_values(over, message):
    with pytest.raises(SnapshotError, match=message):
        two_thread_value(**over)


def test_snapshot_error_is_a_value_error():
    assert issubclass(SnapshotError, ValueError)


def test_empty_value_is_valid():
    s = Snapshots()
    assert len(s) == 0 and list(s.samples()) == [] and s.stack(0) == ()
    assert s == Snapshots()


# -- merging -------------------------------------------------------------------------
def test_merge_deduplicates_frames_and_reinterns_stacks():
    a = two_thread_value()
    # the same functions, listed in another order, with [main] stored twice
    b = Snapshots(
        frames=[F_LEAF, F_MAIN, F_WORK, Frame("other", "x.py", 1, 1)],
        stack_frame=[0, 1, 2, 1, 3], stack_parent=[0, 0, 1, 0, 3],
        threads=[ThreadInfo(0, "MainThread", 200, "thread", 0, 0.0, 0.0)],
        sample_thread=[0, 0, 0, 0], sample_stack=[1, 3, 4, 2],
        sample_wall=[0, 10, 20, 30], sample_cpu=[0, 5, 5, 5],
        runs=[RunInfo(pid=8)],
    )
    m = merge(a, b)
    assert m.frames == (F_MAIN, F_WORK, F_LEAF, Frame("other", "x.py", 1, 1))
    # [main], [work, main], [leaf, work, main] from a; b adds only [other, main]
    assert len(m.stack_frame) == 5
    for part, base in ((a, 0), (b, len(a))):
        for j in range(len(part)):
            assert m.stack_frames(m.sample_stack[base + j]) == part.stack_frames(part.sample_stack[j])
    assert m.sample_stack[len(a) + 0] == m.sample_stack[len(a) + 1]  # b's two [main] stacks


def test_merge_keeps_threads_and_runs_per_part():
    a, b = two_thread_value(), two_thread_value(runs=[RunInfo(pid=9), RunInfo(pid=10)])
    b = Snapshots(**{**_kwargs(b), "threads": [b.threads[0], b.threads[1]._replace(run=1)]})
    m = merge(a, b)
    assert [r.pid for r in m.runs] == [7, 9, 10]
    assert [(t.id, t.name, t.run) for t in m.threads] == [
        (0, "MainThread", 0), (1, "worker", 0), (2, "MainThread", 1), (3, "worker", 2)]
    assert list(m.sample_thread) == [0, 1, 0, 1, 0, 2, 3, 2, 3, 2]
    assert m.wall_overflow == {3: 5_000_000_000, 8: 5_000_000_000}
    assert m.cpu_overflow == {4: 1 << 33, 9: 1 << 33}
    assert m.cpu_time == 1.5 + 0.0 + 0.0
    # per-thread absolute times survive: each part's threads decode as before
    before = [(x.wall, x.cpu) for x in a.samples()] + [(x.wall, x.cpu) for x in b.samples()]
    assert [(x.wall, x.cpu) for x in m.samples()] == before


def test_merge_gives_a_part_without_runs_a_default_run():
    bare = two_thread_value(runs=[])
    m = merge(two_thread_value(), bare)
    assert m.runs == (RunInfo(pid=7, host="h", process_cpu=1.5), RunInfo())
    assert [t.run for t in m.threads] == [0, 0, 1, 1]


def test_merge_unions_custom_keys_and_remaps_mark_values_by_key():
    a = two_thread_value(custom_keys=["req", "user"],
                         mark_sets=[(), (("r1", "ann"),), (("r2", None), ("r1", "ann"))],
                         sample_marks=[0, 1, 2, 1, 0])
    b = two_thread_value(custom_keys=["tenant", "req"],
                         mark_sets=[(), (("t9", "r1"),)], sample_marks=[1, 1, 0, 0, 1])
    c = two_thread_value()  # no marks at all
    m = merge(a, b, c)
    assert m.custom_keys == ("req", "user", "tenant")
    assert len(m.sample_marks) == 15
    keys = m.custom_keys
    for part, base in ((a, 0), (b, 5), (c, 10)):
        for j in range(len(part)):
            want = [{k: v for k, v in zip(part.custom_keys, e)} for e in part.marks_of(j)]
            got = [{k: v for k, v in zip(keys, e) if k in part.custom_keys}
                   for e in m.marks_of(base + j)]
            assert got == want
            # keys the part did not have are None
            for e in m.marks_of(base + j):
                assert all(v is None for k, v in zip(keys, e) if k not in part.custom_keys)
    assert list(m.sample_marks[10:]) == [0] * 5


def test_merge_without_any_marks_has_no_marks_column():
    m = merge(two_thread_value(), two_thread_value())
    assert m.sample_marks is None and m.mark_sets == ((),)


def test_merge_of_a_canonical_value_is_itself_and_accepts_a_list():
    a = two_thread_value(custom_keys=["k"], mark_sets=[(), ((1,),)], sample_marks=[0, 1, 1, 0, 1])
    assert merge(a) == a
    assert merge([a, a]) == merge(a, a)
    assert len(merge(a, a)) == 10


def test_merge_refuses_other_things():
    with pytest.raises(TypeError, match="not dict"):
        merge(two_thread_value(), {})


def test_merge_of_nothing_is_empty():
    assert len(merge()) == 0


# -- property-style: random values, fixed seed -----------------------------------------
def _kwargs(s: Snapshots) -> dict[str, Any]:
    return dict(frames=s.frames, stack_frame=s.stack_frame, stack_parent=s.stack_parent,
                threads=s.threads, sample_thread=s.sample_thread, sample_stack=s.sample_stack,
                sample_wall=s.sample_wall, sample_cpu=s.sample_cpu, sample_marks=s.sample_marks,
                wall_overflow=s.wall_overflow, cpu_overflow=s.cpu_overflow,
                mark_sets=s.mark_sets, custom_keys=s.custom_keys, runs=s.runs)


def random_value(rng: random.Random) -> Snapshots:
    """A valid value with random shape: duplicate frames, overflow, optional marks."""
    names = ["f", "g", "h", "λ", "<module>"]
    frames = [Frame(rng.choice(names), rng.choice(["a.py", "b.py"]), rng.randrange(1, 5),
                    rng.choice([None, 1, 2, 3])) for _ in range(rng.randrange(0, 6))]
    n_stacks = 1 + (rng.randrange(0, 12) if frames else 0)
    stack_frame = [0] + [rng.randrange(len(frames)) for _ in range(1, n_stacks)]
    stack_parent = [0] + [rng.randrange(i) for i in range(1, n_stacks)]
    runs = [RunInfo(pid=rng.randrange(100)) for _ in range(rng.randrange(0, 3))]
    threads = [ThreadInfo(i, f"t{i}", rng.choice([None, i]), "thread",
                          rng.randrange(max(len(runs), 1)), rng.random(), rng.random())
               for i in range(rng.randrange(1, 4))]
    keys = rng.sample(["req", "user", 3, ("t", 1)], rng.randrange(0, 3))
    mark_sets: list[tuple] = [()]
    for _ in range(rng.randrange(0, 4) if keys else 0):
        mark_sets.append(tuple(tuple(rng.choice([None, 1, "x", 2.5, True]) for _ in keys)
                               for _ in range(rng.randrange(1, 3))))
    n = rng.randrange(0, 30)
    wall = [rng.choice([0, 1, 1000, OVERFLOW]) for _ in range(n)]
    cpu = [rng.choice([0, 7, OVERFLOW]) for _ in range(n)]
    return Snapshots(
        frames=frames, stack_frame=stack_frame, stack_parent=stack_parent, threads=threads,
        sample_thread=[rng.randrange(len(threads)) for _ in range(n)],
        sample_stack=[rng.randrange(n_stacks) for _ in range(n)],
        sample_wall=wall, sample_cpu=cpu,
        sample_marks=[rng.randrange(len(mark_sets)) for _ in range(n)] if keys else None,
        wall_overflow={i: (1 << 32) + rng.randrange(10**6) for i, v in enumerate(wall) if v == OVERFLOW},
        cpu_overflow={i: (1 << 32) + rng.randrange(10**6) for i, v in enumerate(cpu) if v == OVERFLOW},
        mark_sets=mark_sets, custom_keys=keys, runs=runs,
    )


def test_random_merges_preserve_every_sample():
    rng = random.Random(20240611)
    for _ in range(150):
        parts = [random_value(rng) for _ in range(rng.randrange(1, 4))]
        m = merge(*parts)
        assert len(m) == sum(len(p) for p in parts)
        assert len(set(m.frames)) == len(m.frames)  # frames deduplicated
        pairs = list(zip(m.stack_frame[1:], m.stack_parent[1:]))
        assert len(set(pairs)) == len(pairs)  # stacks interned
        decoded = [x for p in parts for x in p.samples()]
        base_thread = 0
        i = 0
        for p in parts:
            for j in range(len(p)):
                assert m.stack_frames(m.sample_stack[i]) == p.stack_frames(p.sample_stack[j])
                assert m.sample_thread[i] == p.sample_thread[j] + base_thread
                mk = dict(zip(m.custom_keys, zip(*m.marks_of(i)))) if m.marks_of(i) else {}
                pk = dict(zip(p.custom_keys, zip(*p.marks_of(j)))) if p.marks_of(j) else {}
                assert {k: v for k, v in mk.items() if k in pk} == pk
                i += 1
            base_thread += len(p.threads)
        got = list(m.samples())
        assert [(x.wall, x.cpu) for x in got] == [(x.wall, x.cpu) for x in decoded]
        assert list(m.wall_deltas()) == [d for p in parts for d in p.wall_deltas()]


def test_random_merge_is_associative():
    rng = random.Random(7)
    for _ in range(100):
        a, b, c = (random_value(rng) for _ in range(3))
        assert merge(merge(a, b), c) == merge(a, b, c) == merge(a, merge(b, c))


def test_arrays_are_copied_on_construction():
    col = array("I", [0, 0, 1000, OVERFLOW, 2000])
    s = two_thread_value(sample_wall=col)
    col[0] = 99
    assert s.sample_wall[0] == 0
