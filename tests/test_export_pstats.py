"""pstats export, read by the real consumers: ``pstats.Stats`` and gprof2dot (+ dot)."""

from __future__ import annotations

import io
import pstats
import subprocess
import sys

import pytest

from analyzer.exports import ExportError, write_pstats
from analyzer.exports.pstats_export import pstats_dict
from export_builders import build, two_threads
from export_consumers import need_module, need_program


def by_name(stats: pstats.Stats) -> dict[str, tuple]:
    return {func[2]: value for func, value in stats.stats.items()}


def test_pstats_loads_it_with_self_and_cumulative_times(tmp_path):
    path = write_pstats(two_threads(), tmp_path / "run.pstats")
    stats = pstats.Stats(str(path))
    got = by_name(stats)
    cc, nc, tt, ct, callers = got["work"]
    assert (cc, nc) == (3, 3) and tt == pytest.approx(0.01) and ct == pytest.approx(0.02)
    assert [c[2] for c in callers] == ["main"]
    assert got["main"][2:4] == pytest.approx((0.0, 0.04)) and got["main"][4] == {}
    assert stats.total_tt == pytest.approx(0.05)  # sum of self times = time observed
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("cumulative").print_stats()
    report = out.getvalue()
    assert "app.py:340(main)" in report and "0.040" in report
    out2 = io.StringIO()
    pstats.Stats(str(path), stream=out2).print_callers("inner")
    assert "work" in out2.getvalue()


def test_recursion_is_counted_once_per_sample():
    snaps = build([("t", ["f", "f", "f"], 0, 0), ("t", ["f", "f", "f"], 1, 1)])
    ((key, (cc, nc, tt, ct, callers)),) = pstats_dict(snaps).items()
    assert key[2] == "f" and (cc, nc) == (2, 2)
    assert tt == pytest.approx(1.0) and ct == pytest.approx(1.0)
    (caller_value,) = callers.values()  # f called by f
    assert caller_value[2:] == pytest.approx((1.0, 1.0))


def test_wall_clock(tmp_path):
    got = by_name(pstats.Stats(str(write_pstats(two_threads(), tmp_path / "w", clock="wall"))))
    assert got["serve"][3] == pytest.approx(0.01)  # 0 and 10 ms; the idle sample's 10 ms are not serve


def test_empty_profile_loads_and_says_no_samples(tmp_path):
    path = write_pstats(build([]), tmp_path / "empty.pstats")
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    assert list(stats.stats) == [("~", 0, "<no samples>")] and stats.total_tt == 0
    stats.print_stats()
    assert "{no samples}" in out.getvalue()  # how pstats prints a "~" entry
    need_module("gprof2dot")
    subprocess.run([sys.executable, "-m", "gprof2dot", "-f", "pstats", str(path)],
                       check=True, capture_output=True)


def test_unwritable_path(tmp_path):
    with pytest.raises(ExportError, match="cannot write export to .*missing.*No such file"):
        write_pstats(two_threads(), tmp_path / "missing" / "x.pstats")


def test_gprof2dot_draws_the_call_graph(tmp_path):
    need_module("gprof2dot")
    path = write_pstats(two_threads(), tmp_path / "run.pstats")
    dot_file = tmp_path / "run.dot"
    subprocess.run([sys.executable, "-m", "gprof2dot", "-f", "pstats", str(path), "-o", str(dot_file)],
                   check=True, capture_output=True, text=True)
    graph = dot_file.read_text()
    assert graph.startswith("digraph")
    for name in ("main", "work", "inner", "helper", "run", "serve"):
        assert f":{name}\\n" in graph
    assert "80.00%" in graph  # main: 40 of 50 ms
    dot = need_program("dot", "graphviz")
    svg = subprocess.run([dot, "-Tsvg", str(dot_file)], check=True, capture_output=True, text=True).stdout
    assert "<svg" in svg and "work" in svg
