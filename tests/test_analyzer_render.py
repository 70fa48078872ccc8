"""The text and Graphviz renderers."""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess

import pytest

from analyzer import analyze_samples, render_dot, render_text
from analyzer.renderers.common import printable
from analyzer.renderers.flat import render_flat
from sampler.snapshot import Frame
from snapshot_builders import snapshots
from analyzer_helpers import random_rows

NODE_ROW = re.compile(r"^ \[(\d+)\] +([\d.,]+)\((\d+\.\d)%\) +([\d.,]+)\((\d+\.\d)%\) +(.+)$")
SUB_ROW = re.compile(r"^ {6,}(.+?) \[(\d+)\] +(\d+\.\d)%$")


def parse(text):
    """Blocks of (callers, node row, callees) from a text report."""
    table = text[text.index("Callee"):].split("\n", 2)[2]
    blocks = []
    for chunk in re.split(r"^-{10,}$|^={10,}$", table, flags=re.M):
        lines = [ln for ln in chunk.splitlines() if ln.strip()]
        if not lines:
            continue
        k = next(i for i, ln in enumerate(lines) if NODE_ROW.match(ln))
        node = NODE_ROW.match(lines[k]).groups()
        callers = [SUB_ROW.match(ln).groups() for ln in lines[:k]]
        callees = [SUB_ROW.match(ln).groups() for ln in lines[k + 1:]]
        blocks.append((callers, node, callees))
    return blocks


def sample_profile():
    rows = []
    t = 0.0
    for i in range(40):
        t += 0.01
        stack = ["leaf", "mid", "main"] if i % 4 else ["other", "main"]
        rows.append(("main", t, t, stack))
    return analyze_samples(snapshots(rows), interval="midpoint")  # Racket's numbers


def test_layout():
    p = sample_profile()
    text = render_text(p, hide_self=0, hide_subs=0)
    lines = text.splitlines()
    assert lines[0] == "Profiling results"
    assert re.search(r"Total cpu time observed: 400ms \(out of 390ms\)", text)
    assert "Number of samples taken: 40 (once every 10.0ms)" in text
    assert "Threads observed" not in text  # only one thread
    assert "Hiding" not in text
    blocks = parse(text)
    names = [b[1][5].split()[0] for b in blocks]
    assert names == ["main", "mid", "other", "leaf"]  # topological, layers by total
    callers, node, callees = blocks[0]
    assert node[:5] == ("1", "400", "100.0", "0", "0.0")
    assert node[5] == "main main.py:1"
    assert callers == []
    assert callees == [("mid", "2", "75.0"), ("other", "3", "25.0")]  # heaviest first
    callers, node, callees = blocks[3]
    assert callers == [("mid", "2", "100.0")] and callees == []


def test_callers_heaviest_next_to_the_node():
    rows = [("t", i * 0.01, i * 0.01, ["f", "a" if i % 3 else "b"]) for i in range(30)]
    blocks = parse(render_text(analyze_samples(snapshots(rows)), hide_self=0, hide_subs=0))
    f = next(b for b in blocks if b[1][5].startswith("f "))
    assert [c[0] for c in f[0]] == ["b", "a"]  # a (66.7%) is right above f


def test_threads_and_hidden_in_header():
    rows = [("main", i * 0.01, i * 0.01, ["big"]) for i in range(200)]
    rows += [("worker", 0.0, 0.0, ["tiny"]), ("worker", 0.001, 0.001, ["tiny"])]
    text = render_text(analyze_samples(snapshots(rows), interval="midpoint"))
    assert re.search(r"Threads observed: 2: main \(0\) 2,000ms, worker \(1\) 2\.0ms", text)
    assert "(Hiding functions with self<=1.0% and local<=2.0%: 1 of 2 hidden)" in text
    assert "tiny" not in text.split("Callee", 1)[1]


def test_order_self_and_total():
    p = sample_profile()
    by_self = [b[1][5].split()[0] for b in parse(render_text(p, order="self", hide_self=0, hide_subs=0))]
    assert by_self[:2] == ["leaf", "other"]
    by_total = [b[1][5].split()[0] for b in parse(render_text(p, order="total", hide_self=0, hide_subs=0))]
    assert by_total[0] == "main"
    # indices follow the displayed order, and references follow the indices
    blocks = parse(render_text(p, order="self", hide_self=0, hide_subs=0))
    index = {b[1][0]: b[1][5].split()[0] for b in blocks}
    for callers, _, callees in blocks:
        for name, idx, _pct in callers + callees:
            assert index[idx] == name


def test_truncate_source_keeps_the_end_and_never_cuts_a_word():
    f = Frame("f", "/very/long/" + "x" * 80 + "/module.py", 7, 8)
    p = analyze_samples(snapshots([("t", 0.0, 0.0, [f]), ("t", 0.1, 0.1, [f])]))
    row = parse(render_text(p))[0][1][5]
    src = row.split(" ", 1)[1]
    # whole leading directories go, never part of one
    assert src == ".../module.py:7"
    full = parse(render_text(p, truncate_source=None))[0][1][5]
    assert full.endswith("x" * 80 + "/module.py:7")


def test_long_names_never_touch_the_numbers():
    long_name = "Some.extremely_long_qualified_name_" + "z" * 90
    rows = [("t", i * 0.01, i * 0.01, [long_name, "main"] if i % 2 else ["short", "main"])
            for i in range(30)]
    text = render_text(analyze_samples(snapshots(rows)), hide_self=0, hide_subs=0)
    sub_rows = [ln for ln in text.splitlines() if ln.endswith("%") and "[" in ln and not NODE_ROW.match(ln)]
    assert sub_rows
    for ln in sub_rows:
        m = SUB_ROW.match(ln)
        assert m, ln
        assert re.search(r"\] {2,}\d", ln), ln  # at least two spaces before the percentage
    short = [ln for ln in sub_rows if long_name not in ln]
    assert len({len(ln) for ln in short}) == 1  # short rows keep one aligned column


def test_no_dangling_references_whatever_the_thresholds():
    rng = random.Random(2)
    p = analyze_samples(snapshots(random_rows(rng, 2000, n_funcs=40, depth=8)))
    for hide_self in (0, 0.005, 0.01, 0.05, 0.2, 1):
        for hide_subs in (0, 0.01, 0.02, 0.1, 0.5, 1):
            text = render_text(p, hide_self=hide_self, hide_subs=hide_subs)
            if "every function is hidden" in text:
                continue
            blocks = parse(text)
            names = {b[1][0]: b[1][5].split()[0] for b in blocks}
            for callers, _, callees in blocks:
                for name, idx, _ in callers + callees:
                    assert names.get(idx) == name


def test_writes_to_a_file_and_returns_the_same_text():
    p = sample_profile()
    buf = io.StringIO()
    assert render_text(p, buf) == buf.getvalue()
    buf = io.StringIO()
    assert render_dot(p, buf) == buf.getvalue()


def test_empty_profile_says_no_samples():
    p = analyze_samples(snapshots([]))
    text = render_text(p)
    assert "Number of samples taken: 0\n" in text and "(no samples)" in text
    assert "digraph" in render_dot(p)


def test_frames_without_source():
    p = analyze_samples((3, [(0, 2, ("gc", None)), (0, 1, (None, "x.rkt:3")), (0, 0, ("gc", None))]))
    text = render_text(p, hide_self=0, hide_subs=0)
    assert "gc (unknown source)" in text and "??? x.rkt:3" in text
    f = Frame("builtin", "", 0, None)
    q = analyze_samples(snapshots([("t", 0.0, 0.0, [f]), ("t", 0.1, 0.1, [f])]))
    assert q.nodes[0].src is None and "builtin (unknown source)" in render_text(q)


@pytest.mark.parametrize("kw, message", [
    ({"order": "alphabetical"}, "order must be one of 'topological', 'self', 'total'"),
    ({"hide_self": 5}, "hide_self must be a fraction between 0 and 1"),
    ({"hide_subs": -0.1}, "hide_subs must be a fraction"),
    ({"truncate_source": 2}, "truncate_source must be an integer of at least 4"),
])
def test_bad_render_options(kw, message):
    with pytest.raises(ValueError, match=message):
        render_text(sample_profile(), **kw)


def test_dot_structure():
    p = sample_profile()
    text = render_dot(p, hide_self=0, hide_subs=0)
    assert text.startswith('digraph "Profile" {') and text.rstrip().endswith("}")
    boxes = dict(re.findall(r'^  (n\d+) \[label="([^"]*)"', text, flags=re.M))
    assert sorted(b.split("\\n")[0] for b in boxes.values()) == ["leaf", "main", "mid", "other"]
    fills = {boxes[k].split("\\n")[0]: float(s) for k, s in
             re.findall(r'^  (n\d+) \[.*fillcolor="0\.000 ([\d.]+) 1\.000"', text, flags=re.M)}
    assert fills["leaf"] == 1.0 and fills["main"] == 0.0 and fills["other"] == pytest.approx(1 / 3, abs=1e-3)
    arrows = re.findall(r"^  (n\d+) -> (n\d+)", text, flags=re.M)
    named = {(boxes[a].split("\\n")[0], boxes[b].split("\\n")[0]) for a, b in arrows}
    assert named == {("main", "mid"), ("main", "other"), ("mid", "leaf")}


def weird_profile():
    names = ['quote"d', "back\\slash", "new\nline", "brace{}<>|", "ünïcødé", "tab\tx"]
    rows = [("t", i * 0.01, i * 0.01, [Frame(names[i % len(names)], 'C:\\dir\\"f".py', 1, 2), "main"])
            for i in range(60)]
    rows.append(("t", 1.0, 1.0, ["main"]))
    return analyze_samples(snapshots(rows))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("make", [sample_profile, weird_profile,
                                  lambda: analyze_samples(snapshots([]))])
def test_real_dot_accepts_the_output(make):
    src = render_dot(make(), hide_self=0, hide_subs=0)
    done = subprocess.run(["dot", "-Tsvg"], input=src.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert b"<svg" in done.stdout and not done.stderr.strip()


def test_weird_names_are_escaped():
    src = render_dot(weird_profile(), hide_self=0, hide_subs=0)
    assert 'quote\\"d' in src and "back\\\\slash" in src and "new\\nline" in src
    assert "\t" not in src


def test_many_threads_are_summarised_heaviest_first():
    rows = []
    for t in range(12):
        rows += [(f"t{t}", 0.0, 0.0, ["f"]), (f"t{t}", 0.001 * (t + 1), 0.01, ["f"])]
    text = render_text(analyze_samples(snapshots(rows), interval="midpoint"))
    line = next(ln for ln in text.splitlines() if "Threads observed" in ln)
    assert line.startswith("  Threads observed: 12: t11 (11) 24.0ms, t10 (10) 22.0ms")
    assert line.endswith("and 4 more")


# -- issue 10, item 10: names that would act on a terminal ---------------------------------
_ATTACK = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202egnp.exe\r"
_RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def attack_profile():
    rows = [(_ATTACK, i * 0.01, i * 0.01, [Frame(_ATTACK, f"/tmp/{_ATTACK}.py", 1, 2), "main"])
            for i in range(30)]
    rows += [("t2", i * 0.01, i * 0.01, ["other"]) for i in range(20)]
    return analyze_samples(snapshots(rows))


@pytest.mark.parametrize("render", [
    lambda p: render_text(p, hide_self=0, hide_subs=0),
    lambda p: render_text(p, hide_self=0, hide_subs=0, truncate_source=None, order="self"),
    lambda p: render_flat(p, show_line=True, truncate_source=None),
])
def test_control_characters_in_names_are_shown_not_sent(render):
    out = render(attack_profile())
    assert not _RAW_CONTROL.search(out), repr(_RAW_CONTROL.search(out))
    shown = r"\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202egnp.exe\x0d"
    assert out.count(shown) >= 2  # the function, and its file (or the thread name)


def test_the_text_header_escapes_thread_names():
    header = render_text(attack_profile()).split("=" * 10)[0]
    line = next(ln for ln in header.splitlines() if "Threads observed" in ln)
    assert r"\x1b]0;PWNED\x07" in line and "\x1b" not in line


def test_printable_keeps_ordinary_text_and_escapes_lone_surrogates():
    assert printable("ünïcødé ✓ <lambda> a.py:3") == "ünïcødé ✓ <lambda> a.py:3"
    assert printable("/tmp/\udcff.py") == r"/tmp/\udcff.py"


# -- issue 10, item 14: a name Graphviz would refuse ---------------------------------------
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_real_dot_accepts_names_and_sources_over_16_kb():
    huge = "f" * 20_000 + "_end"
    rows = [("t", i * 0.01, i * 0.01, [Frame(huge, "/" + "d" * 30_000 + "/x.py", 1, 2), "main"])
            for i in range(10)]
    src = render_dot(analyze_samples(snapshots(rows)), hide_self=0, hide_subs=0,
                     truncate_source=None)
    assert "characters cut" in src and "_end" in src  # cut visibly, the end kept
    done = subprocess.run(["dot", "-Tsvg"], input=src.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[:500]
