"""Notebook display, run for real: a notebook executed by nbclient on an IPython kernel,
and the inline flame graph drawn inside its sandboxed iframe by Chromium."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from analyzer.exports.notebook import profile_html, profile_pretty, snapshots_html, snapshots_pretty
from export_browser import Browser, find_chromium
from export_builders import build, demo_app, two_threads
from export_consumers import need_module, need_program

REPO = Path(__file__).resolve().parent.parent


# -- the repr helpers, directly -------------------------------------------------------

def test_snapshots_html_has_summary_top_functions_and_a_sandboxed_flame_graph():
    out = snapshots_html(two_threads())
    assert "8 samples, 2 threads" in out
    assert re.search(r"<td>work</td><td>app.py:640</td><td style='text-align:right'>10.0 ms</td>", out)
    assert '<iframe class="stackshot-frame" sandbox="allow-scripts"' in out
    assert "allow-same-origin" not in out


def test_snapshots_html_escapes_everything_once_more_for_the_attribute():
    evil = "<script>alert(1)</script>"
    out = snapshots_html(build([("t", [(evil, "x.py", 1, 1)], 0, 0), ("t", [(evil, "x.py", 1, 1)], 1, 1)]))
    assert evil not in out and "<script" not in out.split("srcdoc=")[0]
    srcdoc = re.search(r'srcdoc="([^"]*)"', out)[1]
    assert "<script" not in srcdoc and html.unescape(srcdoc).count("<script") == 2


def test_empty_snapshots_say_no_samples():
    assert "No samples" in snapshots_html(build([]))


class Printer:
    def __init__(self) -> None:
        self.out = ""

    def text(self, s: str) -> None:
        self.out += s


def test_pretty_reprs_give_racket_text_report():
    from analyzer import analyze_samples

    p = Printer()
    profile_pretty(analyze_samples(two_threads()), p, False)
    assert "work" in p.out and "helper" in p.out
    p2 = Printer()
    snapshots_pretty(two_threads(), p2, False)
    assert p2.out.startswith("<Snapshots v1: 8 samples") and "work" in p2.out


def test_profile_html_without_and_with_its_source():
    from analyzer import Profile, analyze_samples

    profile = analyze_samples(two_threads())
    has_source = "source" in Profile.__slots__
    if has_source:
        profile.source = None  # as for a profile filtered by thread or mark
    plain = profile_html(profile)
    assert "<td>work</td>" in plain and "iframe" not in plain
    if has_source:
        profile.source = two_threads()
        assert "iframe" in profile_html(profile)


def test_magic_output_format_follows_the_one_rule_of_every_front_end(tmp_path):
    need_module("IPython")
    from IPython.core.error import UsageError

    from analyzer.cli import FILE_ENDINGS, format_for_path
    from stackshot.notebook import _output_options

    for ending, fmt in FILE_ENDINGS:
        path = tmp_path / ("a" + ending)
        assert _output_options(str(path), None, "cpu").format == fmt == format_for_path(path)
    assert _output_options(str(tmp_path / "a.bin"), "pprof", "cpu").format == "pprof"
    with pytest.raises(UsageError, match="cannot tell what to write to .*a.bin"):
        _output_options(str(tmp_path / "a.bin"), None, "cpu")
    with pytest.raises(UsageError, match="unknown format 'svg'"):
        _output_options(str(tmp_path / "a.svg"), "svg", "cpu")


# -- a real notebook -------------------------------------------------------------------

def cells() -> list[tuple[str, list[str]]]:
    fib = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    # fib(n) again until every running sampler took 5 more samples: on a loaded machine
    # the kernel can run a fixed amount of work between two ticks (seen in CI: 0
    # samples in 54 ms of fib(25)); the polling itself is the sampler's code, idle
    again = ("def again(n):\n    from sampler.controller import _live\n"
             "    running = lambda: [s for s in list(_live) if not s._collector.stopped]\n"
             "    before = {s: len(s.get_snapshots()) for s in running()}\n"
             "    fib(n)\n"
             "    while any(len(s.get_snapshots()) < before.get(s, 0) + 5 for s in running()):\n"
             "        fib(n)\n")
    return [
        (f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{fib}{again}", []),
        ("%load_ext stackshot.notebook", []),
        ("%%sample -d 0.001 -v snaps -k request\nimport sampler\n"
         "with sampler.mark('request', 'r<1>'):\n    again(24)", []),
        ("%sample -f text again(25)", []),
        ("%sample -f none -o out.speedscope.json fib(20)", []),
        ("from IPython.display import HTML\nfrom analyzer import analyze_samples\n"
         "from analyzer.exports.notebook import profile_html\nHTML(profile_html(analyze_samples(snaps)))", []),
        ("import threading, sampler\nfrom analyzer.exports.notebook import LiveView\n"
         "ctl = sampler.create_sampler(threading.current_thread(), 0.001)\n"
         "live = LiveView(ctl, every=0.05, title='live <view>')\n"
         "for _ in range(100000):\n    if live.refreshes >= 3:\n        break\n    fib(15)\n"
         "live.stop(); ctl('stop')\nprint('refreshed', live.refreshes >= 3, live.error)", []),
        ("%sample -w gpu 1", ["raises-exception"]),
        # what the %%sample cell's run recorded, for a failure to explain itself (CI
        # once had its 11 samples charged 0.0 ms of CPU, on 3.12, not seen since)
        ("print('run', snaps.runs[0].to_dict())\nprint('threads', [tuple(t) for t in snaps.threads])\n"
         "print('cpu', list(snaps.sample_cpu), 'wall', list(snaps.sample_wall))", []),
    ]


def run_notebook(tmp_path: Path):
    nbformat = need_module("nbformat")
    nbclient = need_module("nbclient")
    need_module("ipykernel")
    nb = nbformat.v4.new_notebook()
    for source, tags in cells():
        cell = nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(nb, str(tmp_path / "executed.ipynb"))
    return nb


def html_of(cell) -> list[str]:
    return [o["data"]["text/html"] for o in cell.outputs if "data" in o and "text/html" in o["data"]]


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    path = tmp_path_factory.mktemp("notebook")
    return run_notebook(path), path


def test_cell_magic_shows_flame_graph_inline(notebook):
    nb, _ = notebook
    (out,) = html_of(nb.cells[2])
    assert "stackshot" in out and "samples" in out and "srcdoc=" in out
    assert "fib" in out and "r<1>" not in out, text_of(nb.cells[-1])  # the mark value travels escaped


def test_line_magic_prints_text_report(notebook):
    nb, _ = notebook
    text = text_of(nb.cells[3])
    assert "fib" in text and "%" in text


def test_line_magic_writes_an_export(notebook):
    nb, path = notebook
    assert "wrote" in text_of(nb.cells[4]) and (path / "out.speedscope.json").stat().st_size > 0


def test_profile_display(notebook):
    nb, _ = notebook
    (out,) = html_of(nb.cells[5])
    assert "<td>fib</td>" in out, text_of(nb.cells[-1])


def test_live_view_refreshes_and_draws_last_state(notebook):
    nb, _ = notebook
    assert "refreshed True None" in text_of(nb.cells[6])
    (out,) = html_of(nb.cells[6])  # one display, updated in place
    assert "live &amp;lt;view&amp;gt;" in out  # title escaped for the page, then for srcdoc
    assert re.search(r"\d+ samples", out)


def test_bad_option_is_a_usage_error(notebook):
    nb, _ = notebook
    # IPython reports a UsageError as one line on stderr, not as a traceback
    assert "UsageError: -w must be one of cpu, wall, not 'gpu'" in text_of(nb.cells[7])


# -- the inline flame graph works inside its sandbox --------------------------------------

def test_inline_flame_graph_draws_inside_the_sandboxed_iframe(tmp_path):
    exe = find_chromium() or need_program("chromium", "chromium")
    page = tmp_path / "cell.html"
    page.write_text(f"<!DOCTYPE html><html><body>{snapshots_html(demo_app())}</body></html>", encoding="utf-8")
    with Browser(exe, profile_dir=str(tmp_path / "profile")) as b:
        b.open(page)
        boxes = b.eval_in_child_frame(
            "document.querySelector('.ss-root') && document.querySelector('.ss-root').getAttribute('data-ready') === '1'"
            " ? document.querySelectorAll('svg.ss-flame g.ss-box').length : -1")
        assert boxes > 10
        b.screenshot(tmp_path / "notebook-cell.png")
        assert b.problems() == []


# -- the extension's names and the reprs it registers ---------------------------------

@pytest.mark.parametrize("extension", ["stackshot", "sampler"])
def test_load_ext_and_rich_reprs(tmp_path, extension):
    need_module("IPython")
    from IPython.lib.pretty import pretty

    from analyzer import analyze_samples

    assert "work" in pretty(analyze_samples(two_threads()))
    assert pretty(two_threads()).startswith("<Snapshots v1")  # the sampler alone: its repr
    nbformat = need_module("nbformat")
    nbclient = need_module("nbclient")
    nb = nbformat.v4.new_notebook()
    for source in (f"import sys\nsys.path.insert(0, {str(REPO)!r})",
                   f"%load_ext {extension}",
                   "%sample -f none -v s sum(i * i for i in range(3_000_000))",
                   "s",
                   "from analyzer import analyze_samples\nanalyze_samples(s)"):
        nb.cells.append(nbformat.v4.new_code_cell(source))
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells[3:]:
        (out,) = html_of(cell)
        assert "stackshot" in out and "samples" in out
    plain = nb.cells[3].outputs[0]["data"]["text/plain"]
    assert plain.startswith("<Snapshots v1") and "Caller" in plain  # the registered pretty repr


# -- the cell, not the kernel ------------------------------------------------------------

def test_every_notebook_front_end_profiles_the_cell_not_the_kernel(tmp_path):
    """``%%sample``, ``%sample``, ``with profile():`` and ``profile_thunk`` on a real
    kernel: every frame of the profile is the notebook's own code."""
    import json

    nbformat = need_module("nbformat")
    nbclient = need_module("nbclient")
    need_module("ipykernel")
    fib = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    # half a second of CPU in fib, whatever the machine's load (a fixed fib(23) once
    # got no sample at all in CI); no call into the sampler, whose frames would not be
    # the cell's
    again = ("import time\ndef again(n):\n    end = time.thread_time() + 0.5\n"
             "    while time.thread_time() < end:\n        fib(n)\n")
    sources = [
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{fib}{again}",
        "%load_ext stackshot",
        "%%sample -f none -v cell\nx = again(20)",
        "%sample -f none -v line x = again(20)",
        "import stackshot\nwith stackshot.profile(render=None) as p:\n    again(20)\nblock = p.snapshots",
        "got = []\nstackshot.profile_thunk(lambda: again(20), render=got.append)\n"
        "thunk = got[0].source",
        # (a collection in the cell's thread is a <gc> frame, its time: no kernel code)
        "import json\nfrom sampler.gctime import is_gc_frame\n"
        "print(json.dumps({k: sorted({f.filename for f in v.frames if not is_gc_frame(f)}) "
        "for k, v in dict(cell=cell, line=line, block=block, thunk=thunk).items()}))",
        "%%sample -d -1\nfib(5)",
        "%sample -l 0 fib(5)",
    ]
    nb = nbformat.v4.new_notebook()
    for source in sources:
        cell = nbformat.v4.new_code_cell(source)
        if source.startswith("%%sample -d -1") or source.startswith("%sample -l 0"):
            cell.metadata["tags"] = ["raises-exception"]
        nb.cells.append(cell)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    files = json.loads(text_of(nb.cells[6]))
    for kind, names in files.items():
        assert names, kind
        for name in names:  # the cells' own files; no kernel, library or stackshot code
            assert "ipykernel" in name or name.startswith("<ipython-input"), (kind, name)
            assert not any(lib in name for lib in ("site-packages", "/lib/python", "stackshot/")), \
                (kind, name)
    for cell, option in ((nb.cells[7], "-d"), (nb.cells[8], "-l")):
        shown = json.dumps(cell.outputs)
        assert "UsageError" in shown and f"{option} takes a finite number" in shown, shown
        assert "Traceback" not in shown and "ValueError" not in shown, shown


@pytest.mark.parametrize("width", [700, 1280])  # a narrow notebook, a wide one
def test_the_inline_flame_graph_fits_its_frame_and_names_never_wrap_letter_by_letter(tmp_path, width):
    import json
    import time

    exe = find_chromium() or need_program("chromium", "chromium")
    page = tmp_path / "cell.html"
    page.write_text(f"<!DOCTYPE html><html><body style='margin:0'>{snapshots_html(demo_app())}"
                    "</body></html>", encoding="utf-8")
    with Browser(exe, profile_dir=str(tmp_path / "profile"), width=width) as b:
        b.open(page)
        ready = ("document.querySelector('.ss-root') && "
                 "document.querySelector('.ss-root').getAttribute('data-ready') === '1'")
        for _ in range(600):  # only against hangs
            if b.eval_in_child_frame(ready):
                break
            time.sleep(0.1)
        got = json.loads(b.eval_in_child_frame("""JSON.stringify((function () {
          var svg = document.querySelector('svg.ss-flame').getBoundingClientRect();
          var cells = Array.from(document.querySelectorAll('.ss-table td.ss-name'));
          return {w: document.documentElement.clientWidth, h: document.documentElement.clientHeight,
                  right: svg.right, bottom: svg.bottom,
                  names: cells.map(function (td) {
                    var probe = document.createElement('span');
                    probe.textContent = 'x';
                    td.appendChild(probe);
                    var line = probe.getBoundingClientRect().height;
                    td.removeChild(probe);
                    return [td.textContent, td.getBoundingClientRect().height / line]; })};
        })())"""))
        assert b.problems() == []
    assert 0 < got["right"] <= got["w"] and 0 < got["bottom"] <= got["h"], got
    assert got["names"], "the caller/callee table is there"
    for name, lines in got["names"]:
        if len(name) <= 30:
            assert lines < 2.5, (name, lines, got["w"])  # one line (two at most), not a column of letters


def test_a_sample_while_the_shell_compiles_the_cell_is_idle_not_kernel_frames():
    """What a loaded machine makes likely: the sampler ticks while IPython transforms
    and compiles the cell, before the user's code runs.  Such a sample is the
    profiler's overhead; the others start at the cell's ``<module>``."""
    need_module("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.magic import Magics

    from sampler.snapshot import Frame
    from snapshot_builders import snapshots as build_snapshots
    from stackshot.notebook import _magics_class, trim_cell

    class Shell:  # what trim_cell asks of a shell: its class's run_cell methods
        run_cell = InteractiveShell.run_cell

    def frame_of(fn, name=None):
        code = getattr(fn, "__code__", fn)
        return Frame(name or code.co_name, code.co_filename, code.co_firstlineno, code.co_firstlineno)

    magic = vars(_magics_class())["sample"]
    kernel = [Frame("dispatch_shell", "/k/ipykernel/kernelbase.py", 1, 2),
              frame_of(InteractiveShell.run_code), Frame("<module>", "/tmp/ipykernel_1/1.py", 1, 1),
              Frame("run_cell_magic", "/k/IPython/core/interactiveshell.py", 1, 2), frame_of(magic),
              frame_of(InteractiveShell.run_cell)]
    compiling = kernel + [Frame("transform_cell", "/k/IPython/core/inputtransformer2.py", 1, 2)]
    running = kernel + [frame_of(InteractiveShell.run_code), Frame("<module>", "/tmp/ipykernel_1/2.py", 1, 1),
                        Frame("fib", "/tmp/ipykernel_1/0.py", 1, 2)]
    rows = [("t", i / 100, i / 100, list(reversed(compiling if i == 1 else running))) for i in range(5)]
    trimmed = trim_cell(build_snapshots(rows), magic.__code__, Shell())
    stacks = [[f.name for f in trimmed.stack_frames(s)] for s in trimmed.sample_stack]
    assert stacks[1] == []  # idle: the compilation is not the user's code
    assert all(st == ["fib", "<module>"] for k, st in enumerate(stacks) if k != 1), stacks
    assert issubclass(_magics_class(), Magics)
