"""Merging profiles and the JSON round trip."""

from __future__ import annotations

import json
import random

import pytest

from analyzer import (
    ProfileFormatError, analyze_samples, json_to_profile, merge, profile_to_json,
)
from snapshot_builders import snapshots
from analyzer_helpers import assert_balanced, close, random_rows


def edge_map(p):
    def name(n):
        return "*" if n.is_root else n.id
    return {(name(e.caller), name(e.callee)): e for e in p.edges()}


def test_merge_sums_everything_and_keeps_callee_edges():
    p1 = analyze_samples(snapshots([("t", 0.0, 0.0, ["a", "main"]), ("t", 0.1, 0.1, ["a", "main"])]),
                         interval="midpoint")
    p2 = analyze_samples(snapshots([("t", 0.0, 0.0, ["b", "main"]), ("t", 0.2, 0.2, ["b", "main"]),
                                    ("u", 0.0, 0.0, ["a", "main"]), ("u", 0.1, 0.1, ["a", "main"])]),
                         interval="midpoint")
    m = merge(p1, p2)
    assert close(m.total_time, p1.total_time + p2.total_time)
    assert close(m.cpu_time, p1.cpu_time + p2.cpu_time)
    assert m.sample_number == 6
    assert m.thread_times == {0: pytest.approx(0.6), 1: pytest.approx(0.2)}
    main = m.find("main")
    # Racket's merge loses main -> b, which exists only in the second profile
    assert {e.callee.id for e in main.callees} == {"a", "b"}
    assert close(main.total, 0.8) and m.find("a").thread_ids == [0, 1]
    edges = edge_map(m)
    assert close(edges["main", "a"].total, 0.4) and close(edges["main", "b"].callee_time, 0.4)
    assert_balanced(m)


def test_merge_equals_analysis_of_merged_snapshots():
    rng = random.Random(11)
    s1, s2 = snapshots(random_rows(rng, 300)), snapshots(random_rows(rng, 300))
    by_profiles = merge([analyze_samples(s1), analyze_samples(s2)])
    by_samples = analyze_samples([s1, s2])
    e1, e2 = edge_map(by_profiles), edge_map(by_samples)
    assert set(e1) == set(e2)
    for k in e1:
        assert close(e1[k].total, e2[k].total) and close(e1[k].caller_time, e2[k].caller_time)
        assert close(e1[k].callee_time, e2[k].callee_time)
    assert close(by_profiles.total_time, by_samples.total_time)
    assert {n.id: round(n.self, 9) for n in by_profiles} == {n.id: round(n.self, 9) for n in by_samples}
    assert_balanced(by_profiles)


def test_merge_refuses_to_mix_clocks():
    s = snapshots([("t", 0.0, 0.0, ["f"]), ("t", 0.1, 0.1, ["f"])])
    with pytest.raises(ValueError, match="different weight: 'cpu', 'wall'"):
        merge(analyze_samples(s), analyze_samples(s, weight="wall"))
    with pytest.raises(TypeError, match="not Snapshots"):
        merge(analyze_samples(s), s)
    empty = merge()
    assert empty.nodes == [] and empty.total_time == 0


def test_json_round_trip_is_lossless():
    rows = random_rows(random.Random(5), 300)
    rows.append((0, 99.0, 99.0, [("weird \"name\"\n", "C:\\path\\x.py", 3, 4)]))
    p = analyze_samples(snapshots(rows, thread_names={0: "main", 1: "w1", 2: "w2"}),
                        granularity="line", interval="end")
    j = profile_to_json(p)
    text = json.dumps(j)
    q = json_to_profile(text)
    assert profile_to_json(q) == j
    assert [(n.id, n.src, n.frame, n.total, n.self, n.thread_ids) for n in q.nodes] == \
        [(n.id, n.src, n.frame, n.total, n.self, n.thread_ids) for n in p.nodes]
    assert (q.weight, q.granularity, q.interval, q.unit) == ("cpu", "line", "end", "s")
    assert q.thread_names == p.thread_names and q.thread_times == p.thread_times
    assert_balanced(q)
    # edges are shared objects again: one per call, seen from both ends
    for n in q.nodes:
        for e in n.callees:
            assert e in e.callee.callers


def test_json_has_racket_layout():
    p = analyze_samples((10, [(0, 1, ("A", None)), (0, 0, ("A", None))]))
    j = profile_to_json(p)
    assert {"total_time", "cpu_time", "sample_number", "thread_times", "nodes"} <= set(j)
    assert j["thread_times"] == [{"id": 0, "time": 2.0}]
    root, a = j["nodes"]
    assert (root["id"], root["src"], a["id"], a["src"]) == (None, None, "A", None)
    assert a["callers"] == [{"total": 2.0, "caller": 0, "caller_time": 2.0, "callee": 1,
                             "callee_time": 2.0}]


def test_reads_racket_json_without_our_extras():
    racket = {
        "total_time": 4.0, "cpu_time": 10.0, "sample_number": 4,
        "thread_times": [{"id": 0, "time": 4.0}],
        "nodes": [
            {"id": None, "src": None, "thread_ids": [], "total": 4.0, "self": 0.0,
             "callers": [{"total": 4.0, "caller": 1, "caller_time": 4.0, "callee": 0, "callee_time": 4.0}],
             "callees": [{"total": 4.0, "caller": 0, "caller_time": 4.0, "callee": 1, "callee_time": 4.0}]},
            {"id": "A", "src": "/x.rkt:3:0", "thread_ids": [0], "total": 4.0, "self": 4.0,
             "callers": [{"total": 4.0, "caller": 0, "caller_time": 4.0, "callee": 1, "callee_time": 4.0}],
             # a callee edge present only on the callee's side, as Racket's merge writes
             "callees": []},
        ],
    }
    p = json_to_profile(racket)
    assert p.unit == "ms" and p.find("A").src == "/x.rkt:3:0"
    (a,) = p.nodes
    assert [e.callee.is_root for e in a.callees] == [True]  # repaired from the other side
    assert_balanced(p)


@pytest.mark.parametrize("bad, message", [
    ("{", "not JSON"),
    ([], "a profile is a JSON object"),
    ({"nodes": []}, "at least the root"),
    ({"total_time": 1, "cpu_time": 1, "sample_number": 1, "thread_times": [],
      "nodes": [{"total": 0, "self": 0, "callers": [], "callees": [
          {"total": 1, "caller": 0, "caller_time": 1, "callee": 7, "callee_time": 1}]}]},
     "callee 7 is not a node position"),
    ({"total_time": "x", "cpu_time": 1, "sample_number": 1, "thread_times": [],
      "nodes": [{"total": 0, "self": 0, "callers": [], "callees": []}]},
     "'total_time' must be a finite number"),
    ({"total_time": 1, "cpu_time": 1, "sample_number": 1, "thread_times": [{"time": 1}],
      "nodes": [{"total": 0, "self": 0, "callers": [], "callees": []}]},
     "missing field 'id'"),
    ({"stackshot": {"version": 99}, "nodes": [{}]}, "version 99 is newer"),
])
def test_bad_json_is_a_clear_error(bad, message):
    with pytest.raises(ProfileFormatError, match=message):
        json_to_profile(bad if isinstance(bad, str) else json.dumps(bad))
