"""Bad input: a sensible profile or a precise error raised at the API, never a crash inside."""

from __future__ import annotations

import traceback

import pytest

from analyzer import analyze_by_mark, analyze_samples, render_text, sample_weights
from sampler.snapshot import Snapshots
from snapshot_builders import snapshots


def one_thread():
    return snapshots([("t", 0.0, 0.0, ["f"]), ("t", 0.1, 0.1, ["f"])])


def test_empty_snapshots_give_an_empty_profile():
    p = analyze_samples(snapshots([]))
    assert (p.total_time, p.sample_number, p.nodes, p.thread_times) == (0, 0, [], {})
    assert p.root.callees == [] and "(no samples)" in render_text(p)
    assert analyze_by_mark(snapshots([], custom_keys=["k"]), "k") == {}


def test_empty_raw_shape():
    p = analyze_samples((0, []))
    assert p.nodes == [] and p.sample_number == 0 and "(no samples)" in render_text(p)


def test_thread_with_one_sample_is_dropped():
    p = analyze_samples(snapshots([("lonely", 0.5, 0.5, ["f"])]))
    assert p.nodes == [] and p.total_time == 0
    assert p.thread_times == {0: 0} and p.sample_number == 1
    assert sample_weights(snapshots([("lonely", 0.5, 0.5, ["f"])])) == [0.0]


def test_only_idle_samples():
    p = analyze_samples(snapshots([("t", 0.0, 0.0, []), ("t", 1.0, 1.0, [])]))
    assert p.nodes == [] and p.total_time == 0 and p.sample_number == 0


@pytest.mark.parametrize("kw, message", [
    ({"weight": "gpu"}, "weight must be one of 'cpu', 'wall', not 'gpu'"),
    ({"granularity": "file"}, "granularity must be one of 'function', 'line', not 'file'"),
    ({"interval": "start"}, "interval must be one of 'midpoint', 'end', 'active', 'split', not 'start'"),
    ({"threads": [9]}, r"no thread 9: the snapshots have thread ids 0\.\.0"),
    ({"threads": "nobody"}, "no thread named 'nobody'; thread names: 't'"),
    ({"marks": {"req": 1}}, "unknown mark key 'req'"),
    ({"unit": "ms"}, "unit= applies to the raw shape only"),
])
def test_unknown_option_values(kw, message):
    with pytest.raises(ValueError, match=message):
        analyze_samples(one_thread(), **kw)


@pytest.mark.parametrize("kw, message", [
    ({"weight": "wall"}, "weight='cpu' only"),
    ({"granularity": "line"}, "granularity='function' only"),
    ({"marks": {"k": 1}}, "marks= needs snapshots"),
    ({"unit": "hours"}, "unit must be one of 's', 'ms', 'us'"),
    ({"threads": [5]}, "no thread 5 in the samples"),
])
def test_options_the_raw_shape_cannot_honour(kw, message):
    with pytest.raises(ValueError, match=message):
        analyze_samples((1, [(0, 1, ("A", None)), (0, 0, ("A", None))]), **kw)


@pytest.mark.parametrize("value, exc, message", [
    ("profile.json", TypeError, "takes a Snapshots value, a list of them, or Racket's raw shape"),
    ([1, 2, 3], TypeError, "got list"),
    ((1, [("x",)]), TypeError, r"raw sample 0 must be \(thread_id, thread_time, frame, \.\.\.\)"),
    ((1, [(0, "noon", ("A", None))]), TypeError, "raw sample 0: thread time must be a real number"),
    ((1, [(0, 1, "A")]), TypeError, r"frame 0 of raw sample 0 must be a \(name, src\) pair"),
    ((1, [(0, 1, ("A", None)), (0, 0, (["A"], None))]), TypeError,
     "frame 0 of raw sample 1: name and src must be hashable"),
    ((1, [([0], 1)]), TypeError, "thread id must be hashable"),
])
def test_bad_input_is_a_clear_error(value, exc, message):
    with pytest.raises(exc, match=message) as info:
        analyze_samples(value)
    # raised by the analyzer's own checks, a couple of frames below the call
    assert len(traceback.extract_tb(info.tb)) <= 4


def test_analyze_by_mark_needs_snapshots_and_hashable_values():
    with pytest.raises(ValueError, match="needs snapshots"):
        analyze_by_mark((1, []), "k")
    base = snapshots([("t", 0.0, 0.0, ["f"], [{"k": 1}]), ("t", 0.1, 0.1, ["f"], [])],
                     custom_keys=["k"]).to_dict()
    base.pop("version")
    base["mark_sets"] = [[], [[[1, 2]]]]  # a value decoded from a file as a list
    base["runs"] = []
    base["wall_overflow"] = base["cpu_overflow"] = {}
    s = Snapshots(**base)
    with pytest.raises(TypeError, match="unhashable value"):
        analyze_by_mark(s, "k")


def test_bad_threads_and_marks_types():
    with pytest.raises(TypeError, match="threads= takes thread ids"):
        analyze_samples(one_thread(), threads=[1.5])
    with pytest.raises(TypeError, match="marks= takes a"):
        analyze_samples(one_thread(), marks=42)
    with pytest.raises(TypeError, match="render_text\\(\\) takes a Profile"):
        render_text(one_thread())


def test_a_controller_is_not_snapshots_and_the_message_says_what_to_call():
    import threading

    import pytest

    from analyzer import analyze_samples
    from sampler import create_sampler

    ctl = create_sampler(threading.current_thread(), 0.01)
    try:
        with pytest.raises(TypeError, match=r"call ctl\('get-snapshots'\)"):
            analyze_samples(ctl)
    finally:
        ctl("stop")
