"""GC time in a profile (analyzer.gcview): ``<gc>`` under its triggering stack, at the
root, or hidden, and MLton's header line, on hand-built snapshots."""

import pytest

from analyzer import analyze_samples, render_text
from analyzer.gcview import gc_times, place_gc
from sampler.gctime import gc_frame

from snapshot_builders import snapshots

GC0, GC2 = gc_frame(0), gc_frame(2)


def _snaps():
    # main -> work runs; two collections triggered in work (gen 0, 10 ms; gen 2, 30 ms)
    return snapshots([
        ("t", 0.0, 0.0, ["work", "main"]),
        ("t", 0.05, 0.05, ["work", "main"]),
        ("t", 0.06, 0.06, [GC0, "work", "main"]),
        ("t", 0.09, 0.09, [GC2, "work", "main"]),
        ("t", 0.15, 0.15, ["main"]),
    ])


def _node(profile, frame):
    return next(n for n in profile.nodes if n.frame[:2] == frame[:2] and n.frame[2] == frame[2])


def test_gc_stays_under_its_stack_and_counts_per_generation():
    profile = analyze_samples(_snaps(), gc_frames="stack")
    # one <gc> node at function granularity; no per-generation record in hand-built runs
    assert [n.id for n in profile.nodes].count("<gc>") == 1
    assert gc_times(profile) == pytest.approx({-1: 0.04})
    gc0 = _node(profile, GC0)
    assert [e.caller.id for e in gc0.callers] == ["work"]
    text = render_text(profile)
    assert "Total cpu time observed: 150ms (out of 150ms; GC 40.0ms)" in text
    assert "<gc>" in text
    # a node per generation at line granularity
    lines = analyze_samples(_snaps(), granularity="line", gc_frames="stack")
    assert gc_times(lines) == pytest.approx({0: 0.01, 2: 0.03})
    assert "; GC 40.0ms = gen0 10.0ms + gen2 30.0ms)" in render_text(lines)


def test_the_runs_record_splits_the_gc_node_by_generation():
    from dataclasses import replace

    from sampler.snapshot import Snapshots

    old = _snaps()
    snaps = Snapshots(frames=old.frames, stack_frame=old.stack_frame, stack_parent=old.stack_parent,
                      threads=old.threads, sample_thread=old.sample_thread,
                      sample_stack=old.sample_stack, sample_wall=old.sample_wall,
                      sample_cpu=old.sample_cpu,
                      runs=[replace(old.runs[0], extra={"gc_seconds": {"0": 1.0, "2": 3.0}})])
    assert gc_times(analyze_samples(snaps)) == pytest.approx({0: 0.01, 2: 0.03})


def test_gc_at_the_root_by_default_or_hidden():
    root = analyze_samples(_snaps())
    assert [e.caller.is_root for e in _node(root, GC2).callers] == [True]
    assert root.total_time == pytest.approx(0.15)
    assert _node(root, ("work", "work.py", 1)).total == pytest.approx(0.05)
    hidden = analyze_samples(_snaps(), gc_frames="hide")
    assert hidden.total_time == pytest.approx(0.11)
    assert gc_times(hidden) == {}
    assert "GC" not in render_text(hidden)


def test_place_gc_without_collections_is_the_same_value():
    snaps = snapshots([("t", 0.0, 0.0, ["main"]), ("t", 0.01, 0.01, ["main"])])
    assert place_gc(snaps, "root") is snaps


def test_gc_frames_is_checked():
    with pytest.raises(ValueError, match="gc_frames must be one of 'stack', 'root', 'hide'"):
        analyze_samples(_snaps(), gc_frames="top")
