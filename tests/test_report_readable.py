"""The text report reads at a glance: a small app's report fits a screen, rows fit
100 columns, sources are shown as modules are known (``json/encoder.py:183``) and
never cut mid-word, names tell entries apart, the header gives the sampling period
and the engine, and the tree renderer draws call paths."""

from __future__ import annotations

import os
import re

from analyzer import analyze_samples, render_flat, render_text
from analyzer.renderers.common import hidden_nodes
from analyzer.renderers.naming import hidden_chains
from sampler.snapshot import Frame, RunInfo, Snapshots
from snapshot_builders import snapshots
from test_cli import SPIN, stackshot, write

APP = SPIN + """
import json, threading

def load():
    return json.dumps([{"k": i, "v": [i] * 5} for i in range(60000)])
def parse(text):
    return json.loads(text)
def score(rows):
    return spin(0.12)
def rank(rows):
    return spin(0.05)
def report(rows):
    return spin(0.03)
def tick():
    return sum(range(100))
def background():
    tick()
def analyse(rows):
    return score(rows) + rank(rows)
def main():
    threading.Thread(target=background).start()
    rows = parse(load())
    analyse(rows)
    report(rows)
main()
"""


def test_a_small_apps_default_report_fits_a_screen_and_100_columns(tmp_path):
    script = write(tmp_path / "app.py", APP)
    proc = stackshot(script)
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr
    lines = report.splitlines()
    # pass-through wrappers (json's) have no blocks; with the native engine the time
    # in garbage collections is a <gc> block of its own (2 lines), and before 3.12 a
    # list comprehension is a frame of its own (3): 47 to 54 lines seen
    assert len(lines) <= 56, report
    assert max(map(len, lines)) <= 100, report
    for name in ("load", "parse", "analyse", "score", "rank", "report", "spin", "loads"):
        assert re.search(rf"\b{re.escape(name)}\b", report), name  # every function is named
    assert re.search(r"main app\.py:\d+", report)  # relative to the script's directory
    assert "/lib/python" not in report and str(tmp_path) not in report
    full = stackshot("--hide-self", "0", "--hide-subs", "0", script).stderr
    assert re.search(r"json/(encoder|decoder)\.py:\d+", full), full
    assert "/lib/python" not in full


def test_a_chain_of_negligible_entries_is_hidden_where_racket_keeps_it():
    heavy = [("work", 0.0, 0.0, ["work", "main"])] + [
        ("work", t / 100, t / 100, ["work", "main"]) for t in range(1, 100)]
    chain = [("bg", t / 1000, t / 1000, ["wait_c", "wait_b", "start_a", "main"])
             for t in range(1, 4)]  # another thread: a few cheap samples
    p = analyze_samples(snapshots(heavy + chain))
    racket = {n.name for n in hidden_nodes(p, 0.01, 0.02)}
    ours = {n.name for n in hidden_chains(p, 0.01, 0.02)}
    assert not racket & {"start_a", "wait_b", "wait_c"}  # each is all of its neighbour's time
    assert {"start_a", "wait_b", "wait_c"} <= ours and "work" not in ours
    text = render_text(p)
    assert "start_a" not in text and "wait_c" not in text and "work" in text


def test_pass_through_entries_are_folded_into_the_rows_that_lead_through_them():
    # main -> parse -> loads -> decode (all of parse's and loads' time), main -> work
    samples = [("t", i / 100, i / 100, ["decode", "loads", "parse", "main"] if i % 2 else ["work", "main"])
               for i in range(100)]
    p = analyze_samples(snapshots(samples))
    text = render_text(p)
    blocks = [line.split()[-2] for line in text.splitlines() if line.startswith(" [")]
    assert sorted(blocks) == ["decode", "main", "work"]  # parse and loads: no block
    rows = [line.strip() for line in text.splitlines() if line.startswith("   ")]
    assert any(r.startswith("parse > loads > decode [") for r in rows)  # main's callee row
    assert any(r.startswith("main [1] > parse > loads ") for r in rows)  # decode's caller row
    assert "2 pass-through calls folded" in text
    every = render_text(p, hide_subs=0)  # every block back
    assert sorted(line.split()[-2] for line in every.splitlines() if line.startswith(" [")) == [
        "decode", "loads", "main", "parse", "work"]
    assert " > " not in every and "pass-through" not in every


def test_a_wrapper_with_a_stray_self_sample_is_folded_all_the_same():
    # dumps -> encode: 48 of dumps' 49 samples (98% short of hide_subs' 98%), its one
    # self sample far below hide_self of the total (CI: a run whose dumps and encode
    # each took one such sample reported two more blocks than the run before)
    samples = [("t", i / 1000, i / 1000, ["encode", "dumps", "main"]) for i in range(48)]
    samples += [("t", 0.048, 0.048, ["dumps", "main"])]
    samples += [("t", i / 1000, i / 1000, ["work", "main"]) for i in range(49, 400)]
    text = render_text(analyze_samples(snapshots(samples)))
    blocks = [line.split()[-2] for line in text.splitlines() if line.startswith(" [")]
    assert sorted(blocks) == ["encode", "main", "work"], text
    assert any(r.strip().startswith("dumps > encode [") for r in text.splitlines()), text
    # a wrapper with self time of its own above hide_self keeps its block
    heavy = samples + [("t", 0.4 + i / 1000, 0.4 + i / 1000, ["dumps", "main"]) for i in range(10)]
    text = render_text(analyze_samples(snapshots(heavy)))
    assert "dumps" in [line.split()[-2] for line in text.splitlines() if line.startswith(" [")], text


def test_a_long_chain_of_pass_through_entries_is_shortened_in_the_middle():
    chain = [f"wrapper_number_{i}" for i in range(12)]
    p = analyze_samples(snapshots([("t", i / 10, i / 10, ["leaf", *chain, "main"]) for i in range(10)]))
    lines = render_text(p).splitlines()
    assert max(map(len, lines)) <= 100
    (row,) = [line.strip() for line in lines if line.strip().startswith("wrapper_number_11 > ")]
    assert " > ... > " in row and "leaf [" in row


def test_names_tell_entries_apart_in_flat_tables_and_at_line_granularity():
    a, b = Frame("<module>", "/x/a.py", 1, 3), Frame("<module>", "/x/b.py", 1, 4)
    main12, main14 = Frame("main", "/x/a.py", 10, 12), Frame("main", "/x/a.py", 10, 14)
    snaps = snapshots([("t", i / 10, i / 10, [main12 if i % 2 else main14, a if i < 5 else b])
                       for i in range(10)])
    flat = render_flat(analyze_samples(snaps), hide_self=0)
    assert "<module> (a.py)" in flat and "<module> (b.py)" in flat
    by_line = render_text(analyze_samples(snaps, granularity="line"), hide_self=0, hide_subs=0)
    assert "main:12" in by_line and "main:14" in by_line


def test_a_source_is_shortened_by_whole_directories_only():
    deep = Frame("f", "/srv/" + "/".join(f"level{i}" for i in range(12)) + "/module.py", 7, 8)
    text = render_text(analyze_samples(snapshots([("t", 0.0, 0.0, [deep]), ("t", 0.1, 0.1, [deep])])))
    (row,) = [line for line in text.splitlines() if line.startswith(" [1]")]
    src = row.split(" f ", 1)[1]
    assert src.startswith(".../level") and src.endswith("/module.py:7")
    assert all(re.fullmatch(r"level\d+", part) for part in src.split("/")[1:-1])


def _with_run(snaps: Snapshots, **run) -> Snapshots:
    return Snapshots(**{k: getattr(snaps, k) for k in (
        "frames", "stack_frame", "stack_parent", "threads", "sample_thread", "sample_stack",
        "sample_wall", "sample_cpu")}, runs=[RunInfo(process_cpu=1.0, **run)])


def test_the_header_gives_the_sampling_period_asked_and_achieved_and_the_engine():
    snaps = _with_run(snapshots([("t", i / 100, i / 100, ["f"]) for i in range(50)]),
                      requested_delay=0.001, ticks=500, sampling_wall=1.0, engine="native")
    text = render_text(analyze_samples(snaps))
    assert "Number of samples taken: 50 (once every 2.0ms; asked for 1.0ms)" in text
    assert "  Engine: native" in text
    unknown = render_text(analyze_samples(_with_run(snapshots([("t", 0, 0, ["f"]), ("t", 1, 1, ["f"])]))))
    assert "Engine" not in unknown


def test_render_text_accepts_a_path(tmp_path):
    p = analyze_samples(snapshots([("t", 0.0, 0.0, ["f"]), ("t", 0.1, 0.1, ["f"])]))
    out = tmp_path / "out.txt"
    text = render_text(p, str(out))
    assert out.read_text(encoding="utf-8") == text
    render_text(p, out)  # an os.PathLike too
    assert out.read_text(encoding="utf-8") == text


def test_the_tree_renderer_draws_call_paths(tmp_path):
    script = write(tmp_path / "app.py", APP)
    proc = stackshot("--format", "tree", script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("Call tree: ")
    assert max(map(len, lines)) <= 100
    row = {re.split(r"\s{2}", line.split("% ", 1)[1].strip())[0]: line for line in lines
           if "% " in line}
    indent = {name: len(line) - len(line.lstrip(" │├└─")) for name, line in row.items()}
    assert indent["main"] < indent["analyse"] < indent["score"]  # a path, top to bottom
    assert "└─" in proc.stderr and "score" in row and os.path.basename(str(script)) in row["main"]
