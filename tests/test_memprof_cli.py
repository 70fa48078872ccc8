"""Allocation profiles from the command line (``python -m sampler --memory RATE``), the
``profile(memory=RATE)`` front end, and every renderer and export saying bytes.

The CLI runs for real in a subprocess on a real script; what it writes is read back
by the real consumers (``Snapshots.load`` and the analyzer, ``pstats``, ``go tool
pprof``).  Accuracy bounds come from the sampling law (``memprof_helpers``): each
allocated word is sampled with probability RATE, so they cannot flake (below 2e-9 per
bound) nor pass a biased engine.
"""

from __future__ import annotations

import json
import os
import pstats
import re
import subprocess
import sys
import textwrap

import pytest

import analyzer
from analyzer.exports import render
from analyzer.jsonform import json_to_profile, profile_to_json
from memprof_helpers import binomial_bound
from run_helpers import repo_env
from sampler.snapshot import Snapshots

pytest.importorskip("sampler._memprof", reason="the memprof engine is not built here")

RATE = 1e-3
N = 50_000
SMALL_WORDS, BIG_WORDS = 64, 640  # big allocates ten times small's bytes
HOLD_WORDS, HOLD_N = 256, 4_000
WORD = 8

# Each loop allocates nothing but its bytes objects (8 * words - 33 bytes: 33 bytes of
# header, so exactly `words` words); itertools.repeat yields no new ints.
ALLOCATORS = f"""
import itertools

def small():
    for _ in itertools.repeat(None, {N}):
        bytes({WORD * SMALL_WORDS - 33})

def big():
    for _ in itertools.repeat(None, {N}):
        bytes({WORD * BIG_WORDS - 33})
"""
PROGRAM = ALLOCATORS + f"""
def hold():
    return [bytes({WORD * HOLD_WORDS - 33}) for _ in itertools.repeat(None, {HOLD_N})]

small()
big()
kept = hold()
print("program ran")
"""


def sampler(*args, cwd) -> subprocess.CompletedProcess:
    env = repo_env()
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, "-m", "sampler", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One profiled run of PROGRAM, written in every format the CLI names by ending."""
    from analyzer.cli import FILE_ENDINGS

    where = tmp_path_factory.mktemp("memcli")
    script = where / "allocs.py"
    script.write_text(PROGRAM)
    outputs = {ending: where / f"run{ending}" for ending, _fmt in FILE_ENDINGS}
    args = ["--memory", RATE]
    for path in outputs.values():
        args += ["-o", path]
    proc = sampler(*args, script, cwd=where)
    assert proc.returncode == 0, proc.stderr
    assert "program ran" in proc.stdout
    return where, outputs


def by_function(profile) -> dict:
    return {n.id: n.total for n in profile.nodes}


def test_ten_times_the_bytes_is_ten_times_the_estimate_through_the_cli(run):
    _, outputs = run
    snapshots = Snapshots.load(outputs[".stackshot"])
    profile = analyzer.analyze_samples(snapshots)
    assert profile.unit == "B" and profile.quantity == "bytes"
    got = by_function(profile)
    per_word = WORD / RATE  # bytes each sampled word stands for
    lo_s, hi_s = binomial_bound(SMALL_WORDS * N, RATE)
    lo_b, hi_b = binomial_bound(BIG_WORDS * N, RATE)
    assert lo_s * per_word <= got["small"] <= hi_s * per_word
    assert lo_b * per_word <= got["big"] <= hi_b * per_word
    # so the ratio is within these bounds, which hold 10 and exclude 8 and 12
    ratio = got["big"] / got["small"]
    assert lo_b / hi_s <= ratio <= hi_b / lo_s
    assert 8 < lo_b / hi_s < 10 < hi_b / lo_s < 12
    # the live view: small's and big's blocks were freed at once, hold's are kept
    live = by_function(analyzer.analyze_samples(snapshots, weight="wall"))
    assert live.get("small", 0) == 0 and live.get("big", 0) == 0
    lo_h, hi_h = binomial_bound(HOLD_WORDS * HOLD_N, RATE)
    assert lo_h * per_word <= live["<module>"] and live["hold"] <= hi_h * per_word * 1.05


def test_every_file_format_says_bytes(run):
    _, outputs = run
    profile = analyzer.analyze_samples(Snapshots.load(outputs[".stackshot"]))
    got = by_function(profile)
    # pstats: tottime/cumtime are bytes
    for ending in (".pstats", ".prof"):
        stats = pstats.Stats(str(outputs[ending])).stats
        cum = {name: ct for (_f, _l, name), (_cc, _nc, _tt, ct, _callers) in stats.items()}
        assert cum["big"] == pytest.approx(got["big"], rel=1e-9)
    # speedscope: unit bytes, whole-byte weights adding up to the profile's
    for ending in (".speedscope.json", ".json"):
        doc = json.loads(outputs[ending].read_text())
        assert {p["unit"] for p in doc["profiles"]} == {"bytes"}
        assert all("bytes allocated" in p["name"] for p in doc["profiles"])
        assert sum(sum(p["weights"]) for p in doc["profiles"]) == pytest.approx(profile.total_time)
    # collapsed stacks: integer bytes
    for ending in (".collapsed.txt", ".collapsed", ".folded"):
        lines = outputs[ending].read_text().splitlines()
        big = sum(int(line.rsplit(" ", 1)[1]) for line in lines if re.search(r";big \(", line))
        assert big == round(got["big"])
    # the flame graph page: bytes in its data and its measure selector
    for ending in (".html", ".htm"):
        page = outputs[ending].read_text()
        assert '"unit":"bytes"' in page and "bytes still live" in page and "allocated" in page
    # graphviz and the text report: byte units, no milliseconds
    dot = outputs[".dot"].read_text()
    assert re.search(r"total \d[\d.,]* [KMG]?B \(", dot) and "ms (" not in dot
    text = outputs[".txt"].read_text()
    assert "Total bytes allocated (estimated)" in text and "MB(pct)" in text
    assert "ms" not in text.replace("Engine: memprof", "")
    # pprof: the proto is read back below by go tool pprof
    assert outputs[".pb.gz"].read_bytes()[:2] == b"\x1f\x8b"


def test_go_tool_pprof_reads_alloc_space_and_inuse_space(run):
    from test_export_pprof import go_pprof, top_rows

    where, outputs = run
    for ending in (".pb.gz", ".pprof"):
        path = str(outputs[ending])
        alloc = go_pprof("-top", "-unit=B", path, cwd=where)
        assert "Type: alloc_space" in alloc
        rows = top_rows(alloc)
        assert {"small", "big", "hold"} <= set(rows)
        inuse = go_pprof("-top", "-unit=B", "-sample_index=inuse_space", path, cwd=where)
        assert "Type: inuse_space" in inuse
        rows = top_rows(inuse)
        assert "hold" in rows and "small" not in rows and "big" not in rows
    profile = analyzer.analyze_samples(Snapshots.load(outputs[".stackshot"]))
    flat_big = top_rows(go_pprof("-top", "-unit=B", str(outputs[".pb.gz"]), cwd=where))["big"][0]
    assert float(flat_big.rstrip("B")) == pytest.approx(by_function(profile)["big"], rel=1e-9)


def test_the_flat_table_is_bytes_by_function(run):
    where, outputs = run
    proc = sampler("--memory", RATE, "--flat", where / "allocs.py", cwd=where)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert re.match(r"Flat profile: [\d.]+ MB allocated \(estimated\) in \d+ samples", lines[0])
    rows = [line.split() for line in lines if line.split()[:1] in (["big"], ["small"])]
    assert [r[0] for r in rows] == ["big", "small"]  # heaviest first
    assert rows[0][2] == "MB" and rows[1][2] == "MB"


@pytest.mark.parametrize("rate", ["x", "0", "2", "-1e-3", "nan", "inf"])
def test_a_bad_rate_is_one_line_and_the_program_does_not_run(tmp_path, rate):
    script = tmp_path / "p.py"
    script.write_text("print('program ran')\n")
    proc = sampler(f"--memory={rate}", script, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stackshot: --memory: "), proc.stderr


def test_options_of_the_stack_sampler_do_not_combine_with_memory(tmp_path):
    script = tmp_path / "p.py"
    script.write_text("print('program ran')\n")
    proc = sampler("--memory", "1e-3", "--engine", "python", script, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("stackshot: --memory samples allocations, not stacks over time: "
                                   "--engine does not apply to it")


def test_without_the_engine_memory_is_one_line_not_a_slow_fallback(tmp_path):
    script = tmp_path / "p.py"
    script.write_text("print('program ran')\n")
    code = ("import sys; sys.modules['sampler._memprof'] = None\n"  # as if it were not built
            "from stackshot.cli import main\n"
            f"sys.exit(main(['--memory', '1e-3', {str(script)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=repo_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("stackshot: --memory: sampler.memprof needs the C extension")


def test_profile_memory_in_the_api():
    code = ALLOCATORS + textwrap.dedent(f"""
        import json
        from stackshot import profile, profile_thunk

        with profile(memory={RATE}, render=None) as p:
            small()
            big()
        got = {{n.id: n.total for n in p.profile.nodes}}
        thunk = []
        profile_thunk(big, memory={RATE}, render=lambda prof: thunk.append(prof))
        errors = []
        for bad in (0, 1.5, "1e-3", True):
            try:
                profile(memory=bad)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        print(json.dumps({{"unit": p.profile.unit, "got": got, "thunk_unit": thunk[0].unit,
                          "thunk_big": {{n.id: n.total for n in thunk[0].nodes}}["big"],
                          "errors": errors}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=repo_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["unit"] == out["thunk_unit"] == "B"
    per_word = WORD / RATE
    lo_s, hi_s = binomial_bound(SMALL_WORDS * N, RATE)
    lo_b, hi_b = binomial_bound(BIG_WORDS * N, RATE)
    assert lo_s * per_word <= out["got"]["small"] <= hi_s * per_word
    assert lo_b * per_word <= out["got"]["big"] <= hi_b * per_word
    assert lo_b * per_word <= out["thunk_big"] <= hi_b * per_word
    assert len(out["errors"]) == 4 and all("memory" in e for e in out["errors"])


def test_a_bytes_profile_round_trips_and_does_not_mix_with_time(run):
    _, outputs = run
    snapshots = Snapshots.load(outputs[".stackshot"])
    profile = analyzer.analyze_samples(snapshots)
    back = json_to_profile(json.dumps(profile_to_json(profile)))
    assert back.unit == "B" and back.quantity == "bytes"
    assert by_function(back) == by_function(profile)
    assert "Total bytes allocated" in analyzer.render_text(back)
    timed = analyzer.analyze_samples((1.0, [(0, 1.0, ("f", "x.py"))]), unit="s")
    with pytest.raises(ValueError, match="different unit"):
        analyzer.merge(profile, timed)
    with pytest.raises(ValueError, match="interval='end' only"):
        analyzer.analyze_samples(snapshots, interval="midpoint")
    from snapshot_builders import snapshots as build
    from sampler.snapshot import merge

    timed_snapshots = build([("main", 0.0, 0.0, ["f"]), ("main", 0.1, 0.1, ["f"])])
    with pytest.raises(ValueError, match="mix allocation samples"):
        analyzer.analyze_samples(merge(snapshots, timed_snapshots))


def test_the_analyzer_command_reads_bytes_and_never_sums_them_with_time(run, tmp_path):
    from snapshot_builders import snapshots as build

    where, outputs = run
    timed = tmp_path / "time.stackshot"
    build([("main", 0.0, 0.0, ["f"]), ("main", 0.1, 0.1, ["f"])]).save(str(timed))
    env = repo_env()
    proc = subprocess.run([sys.executable, "-m", "analyzer", str(outputs[".stackshot"]),
                           "--weight", "wall", "--flat"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"Flat profile: [\d.]+ [KM]B still live \(estimated\)", proc.stdout)
    top = proc.stdout.splitlines()[4].split()[0]  # hold, or on 3.10 and 3.11 its comprehension
    assert top.startswith("hold") or top == "<listcomp>", proc.stdout
    proc = subprocess.run([sys.executable, "-m", "analyzer", str(outputs[".stackshot"]), str(timed)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a profile of 'time'" in lines[0] and "'allocations'" in lines[0]


def test_the_notebook_views_say_bytes(run):
    from analyzer.exports.notebook import profile_html, snapshots_html

    _, outputs = run
    snapshots = Snapshots.load(outputs[".stackshot"])
    profile = analyzer.analyze_samples(snapshots)
    assert "bytes allocated" in profile_html(profile) and " MB" in profile_html(profile)
    bare = json_to_profile(profile_to_json(profile))  # no snapshots: the call graph's own view
    page = profile_html(bare)
    assert "bytes allocated observed" in page and " MB" in page and " ms" not in page
    assert "heaviest functions by self bytes" in snapshots_html(snapshots)


def test_a_periodic_renderer_reads_the_allocations_while_they_are_sampled():
    """The renderer's thread builds snapshots from the log while the block allocates,
    and its own allocations are sampled too: their callbacks, run where the log is
    being read, must not deadlock on it."""
    code = textwrap.dedent("""
        import json
        from stackshot import profile

        seen, keep = [], []
        with profile(memory=1e-2, render=None,
                     periodic_renderer=(0.01, lambda prof: seen.append(prof.unit))) as p:
            while len(seen) < 3:
                keep.append(bytes(1000))
                if len(keep) > 100_000:
                    keep.clear()
        print(json.dumps({"seen": sorted(set(seen)), "unit": p.profile.unit}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=repo_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"seen": ["B"], "unit": "B"}


def test_the_flame_graph_page_shows_bytes_in_a_browser(run, tmp_path):
    from export_browser import Browser, find_chromium
    from export_consumers import need_program
    from test_export_html import box_named, open_page

    _, outputs = run
    exe = find_chromium() or need_program("chromium", "chromium")
    with Browser(exe, profile_dir=str(tmp_path / "chromium-profile")) as browser:
        open_page(browser, outputs[".html"])
        assert browser.problems() == []
        target = box_named(browser, "big")
        browser.mouse("mouseMoved", target["x"] + target["w"] / 2, target["y"] + target["h"] / 2)
        tip = browser.eval("document.querySelector('.ss-tip').innerText")
        assert "big" in tip and re.search(r"total\s+[\d.]+ MB", tip), tip
        assert not re.search(r"\d (ms|s|\u00b5s)\b", tip), tip
        cells = browser.eval("Array.from(document.querySelectorAll('.ss-table td.ss-num'))"
                             ".map(function (td) { return td.textContent; })")
        assert cells and any(re.search(r"\d MB", c) for c in cells)
        assert not any(re.search(r"\d (ms|s)\b", c) for c in cells)
        # the live view: big's blocks were all freed, so it has no box left
        browser.eval("(function(){var m=document.querySelector('.ss-metric');m.value='wall';"
                     "m.dispatchEvent(new Event('change'));})()")
        labels = {b["label"] for b in browser.eval(
            "Array.from(document.querySelectorAll('svg.ss-flame g.ss-box'))"
            ".map(function (g) { return {label: g.getAttribute('data-fn')}; })")}
        assert not any(label.startswith("big") for label in labels)
        assert any(label.startswith("hold") or label == "<listcomp>" for label in labels)
        assert browser.problems() == []


def test_profile_memory_refuses_subprocesses():
    from stackshot import profile

    with pytest.raises(ValueError, match="cannot be combined with subprocesses=True"):
        profile(memory=1e-4, subprocesses=True)
