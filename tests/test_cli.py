"""``stackshot`` (as ``python -m sampler``) and ``python -m analyzer``, run for real in
subprocesses.

Every program profiled here is a real script written to ``tmp_path``; saved files
are read back by the real ``python -m analyzer``.  Assertions are about what the
output must contain (function names, exit statuses, messages), never about timing.
"""

from __future__ import annotations

import gzip
import json
import os
import pstats
import signal
import subprocess
import sys
import textwrap

import pytest

from analyzer.renderers.flat import render_flat
from analyzer import analyze_samples
from sampler.snapshot import RunInfo, Snapshots
from sampler.snapshot_file import MAGIC
from run_helpers import SPIN_SOURCE, repo_env
from snapshot_builders import snapshots as build_snapshots

TIMEOUT = 180  # only against hangs: a loaded two-core machine is slow, never this slow


def env() -> dict:
    e = repo_env()
    e.pop("PYTHONSAFEPATH", None)  # scripts import modules beside them, as users' do
    return e


def run(module: str, *args: str, cwd=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env(), timeout=TIMEOUT, **kw)


def stackshot(*args, cwd=None, **kw):
    return run("sampler", *args, cwd=cwd, **kw)


def analyzer(*args, cwd=None, **kw):
    return run("analyzer", *args, cwd=cwd, **kw)


def _saved_by(command, path, script):
    """Run ``script`` under ``command`` with ``-o path``; the path, once written."""
    proc = command("-o", path, script)
    assert proc.returncode == 0, proc.stderr
    return path


def write(path, text: str):
    path.write_text(textwrap.dedent(text))
    return path


def assert_one_line_error(proc, *fragments):
    """stackshot's own errors: one line on stderr, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


SPIN = SPIN_SOURCE
SPIN_SAMPLED = (f"import sys\nsys.path.append({os.path.dirname(os.path.abspath(__file__))!r})\n"
                "from sampling_helpers import spin_sampled as spin\n")
"""For a program whose ``spin`` the test needs to find in its profile: it spins its
CPU seconds, then on until the process's samplers took a few samples (a fixed 30 ms
of CPU got none when the 2 cores were busy with two test suites; a fixed 50 ms got
none in 100 ms of wall time in CI, alone on a virtual machine whose host takes its
cores away at times: steal time in /proc/stat). Appended to ``sys.path``: the
program's own first entry stays its folder."""


BUSY = SPIN + """
import sys
def heavy():
    return spin(0.1)
def light():
    return spin(0.01)
heavy(); light()
print("busy ran", sys.argv[1:])
"""


@pytest.fixture
def busy(tmp_path):
    """A script with two functions of different cost; prints its argv."""
    return write(tmp_path / "busy.py", BUSY)


# -- running programs ------------------------------------------------------------------

def test_a_script_sees_its_argv_name_and_path_and_sets_the_exit_status(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub / "helper_mod.py", "VALUE = 'found beside the script'\n")
    script = write(sub / "prog.py", SPIN_SAMPLED + """
import sys, json
import helper_mod
spin(0.05)
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
                  "file": __file__, "helper": helper_mod.VALUE}))
sys.exit(int(sys.argv[1]))
""")
    proc = stackshot("--hide-self", "0", script, "7", "--delay", "x", cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    assert rest == ""  # the program's output alone: the report goes to stderr
    rest = proc.stderr
    seen = json.loads(first)
    assert seen == {"argv": [str(script), "7", "--delay", "x"], "name": "__main__",
                    "path0": str(sub), "file": str(script), "helper": "found beside the script"}
    assert rest.startswith("Profiling results")
    assert "spin" in rest and "<module>" in rest
    assert "stackshot/cli.py" not in rest and "runpy" not in rest


def test_double_dash_ends_stackshots_options(tmp_path):
    script = write(tmp_path / "--odd.py", "import sys\nprint(sys.argv[1:])\n")
    proc = stackshot("--format", "flat", "--", script.name, "--format", "x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("['--format', 'x']\n")


def test_a_module_runs_as_main_with_its_argv(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    write(pkg / "__init__.py", "")
    write(pkg / "tool.py", SPIN_SAMPLED + """
import sys
spin(0.03)
print(__name__, sys.argv[0].endswith("tool.py"), sys.argv[1:])
""")
    proc = stackshot("--format", "flat", "-m", "pkg.tool", "-x", "--y", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "__main__ True ['-x', '--y']\n"
    assert "spin" in proc.stderr


def test_a_package_runs_its_main_module(tmp_path):
    pkg = tmp_path / "app"
    pkg.mkdir()
    write(pkg / "__init__.py", "")
    write(pkg / "__main__.py", "print('app main', __name__)\n")
    proc = stackshot("-m", "app", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("app main __main__\n")


def test_code_from_the_command_line(tmp_path):
    proc = stackshot("--format", "flat", "-c",
                     SPIN_SAMPLED + "import sys\nspin(0.03)\nprint(sys.argv, __name__)", "a", "b",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("['-c', 'a', 'b'] __main__\n")
    assert "spin" in proc.stderr


def test_a_script_that_exits_non_zero_still_writes_its_profile(tmp_path):
    script = write(tmp_path / "fails.py", SPIN_SAMPLED + """
import sys
spin(0.05)
sys.exit(3)
""")
    proc = stackshot("-o", tmp_path / "run.stackshot", "--format", "flat", script)
    assert proc.returncode == 3
    assert "spin" in proc.stderr
    saved = Snapshots.load(tmp_path / "run.stackshot")
    assert {f.name for f in saved.frames} >= {"spin", "<module>"}
    assert saved.runs[0].extra["exit_status"] == 3
    assert saved.runs[0].extra["program"] == "script fails.py"


def test_sys_exit_with_a_message_prints_it_and_exits_1(tmp_path):
    script = write(tmp_path / "msg.py", "import sys\nsys.exit('giving up')\n")
    proc = stackshot(script)
    assert proc.returncode == 1
    assert proc.stderr.startswith("giving up\nProfiling results\n")


def test_a_script_that_raises_shows_its_own_traceback_and_its_profile(tmp_path):
    script = write(tmp_path / "raises.py", SPIN_SAMPLED + """
def inner():
    raise ValueError("bad input 42")
def outer():
    spin(0.05)
    inner()
outer()
""")
    proc = stackshot("-o", tmp_path / "r.stackshot", "--format", "text", script)
    assert proc.returncode == 1
    err, report = proc.stderr.split("Profiling results", 1)
    assert err.startswith("Traceback (most recent call last):\n")
    for where in ("in <module>", "in outer", "in inner"):
        assert f'File "{script}", line ' in err and where in err
    assert err.rstrip().endswith("ValueError: bad input 42")
    for ours in ("sampler", "runpy", "analyzer", "stackshot"):
        assert ours not in err, err
    assert proc.stdout == "" and "spin" in report
    assert "outer" in {f.name for f in Snapshots.load(tmp_path / "r.stackshot").frames}


def test_a_syntax_error_is_reported_like_python_does(tmp_path):
    script = write(tmp_path / "broken.py", "def (:\n")
    proc = stackshot(script)
    assert proc.returncode == 1
    assert "SyntaxError" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_a_package_that_fails_on_import_shows_its_traceback(tmp_path):
    pkg = tmp_path / "badpkg"
    pkg.mkdir()
    write(pkg / "__init__.py", "raise RuntimeError('init failed')\n")
    write(pkg / "tool.py", "print('never')\n")
    proc = stackshot("-m", "badpkg.tool", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):\n")
    assert proc.stderr.rstrip().endswith("RuntimeError: init failed")
    assert "importlib" not in proc.stderr and "sampler" not in proc.stderr


def test_threads_are_sampled_with_all_threads(tmp_path):
    script = write(tmp_path / "threads.py", SPIN_SAMPLED + """
import threading
def worker(n):
    return spin(n)
def boss():
    return spin(0.05)
ts = [threading.Thread(target=worker, args=(0.1,)) for _ in range(2)]
for t in ts:
    t.start()
boss()
print("done")
""")
    every = stackshot("--all-threads", "--format", "flat", script)
    assert every.returncode == 0, every.stderr
    assert "worker" in every.stderr and "boss" in every.stderr
    main_only = stackshot("--format", "flat", script)
    assert main_only.returncode == 0, main_only.stderr
    assert "boss" in main_only.stderr and "worker" not in main_only.stderr


def test_the_program_s_non_daemon_threads_are_waited_for_and_profiled(tmp_path):
    script = write(tmp_path / "late.py", SPIN_SAMPLED + """
import threading
said = threading.Event()
def background():
    said.wait()
    spin(0.1)
    print("background finished", flush=True)
threading.Thread(target=background).start()
print("main returns", flush=True)
said.set()
""")
    proc = stackshot("--all-threads", "--format", "flat", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main returns\nbackground finished\n"
    assert proc.stderr.startswith("Flat profile") and "background" in proc.stderr


def test_ctrl_c_stops_the_program_and_still_writes_the_profile(tmp_path):
    script = write(tmp_path / "forever.py", SPIN_SAMPLED + """
import sys
def serve_forever():
    spin(0.05)
    print("serving", flush=True)
    while True:
        spin(0.001)
serve_forever()
""")
    saved = tmp_path / "interrupted.stackshot"
    # A test run started in the background by a non-interactive shell has SIGINT
    # ignored, and a child inherits that: Python then installs no handler and Ctrl-C
    # does nothing (this hung twice). The user's terminal delivers it: so must we.
    # faulthandler: if it ever hangs, SIGABRT makes it print every thread's stack.
    proc = subprocess.Popen([sys.executable, "-m", "sampler", "-o", str(saved), "--format",
                             "flat", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(env(), PYTHONFAULTHANDLER="1"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline() == "serving\n"
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"hung after SIGINT; its threads:\n{err}")
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "KeyboardInterrupt" in err and "interrupted; the profile covers" in err
    assert "serve_forever" in err and "spin" in err and out == ""  # "serving" was read above
    snaps = Snapshots.load(saved)
    assert snaps.runs[0].extra["interrupted"] is True
    assert "serve_forever" in {f.name for f in snaps.frames}


def test_repeat_runs_the_program_again_even_after_sys_exit_0(tmp_path):
    log = tmp_path / "runs.log"
    script = write(tmp_path / "again.py", f"""
import sys
with open({str(log)!r}, "a") as f:
    f.write("run\\n")
sys.exit(0)
""")
    proc = stackshot("--repeat", "3", script)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == "run\n" * 3


# -- output ----------------------------------------------------------------------------

def test_exports_from_the_registry_are_formats(tmp_path, busy):
    collapsed = stackshot("-o", tmp_path / "busy.folded", busy)
    assert collapsed.returncode == 0, collapsed.stderr
    assert collapsed.stdout == "busy ran []\n" and collapsed.stderr == ""
    lines = (tmp_path / "busy.folded").read_text().splitlines()
    stacks = [line.rsplit(" ", 1)[0] for line in lines]
    assert any(st.startswith("<module>") and ";heavy " in st and ";spin " in st for st in stacks)

    out = tmp_path / "busy.pstats"
    proc = stackshot("-o", out, busy)
    assert proc.returncode == 0, proc.stderr
    stats = pstats.Stats(str(out))
    assert any(func[2] == "heavy" for func in stats.stats)


def test_json_and_dot(tmp_path, busy):
    proc = stackshot("-o", tmp_path / "p.txt", "-o", tmp_path / "p.dot", busy)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "busy ran []\n"
    assert (tmp_path / "p.txt").read_text().startswith("Profiling results")
    dot = (tmp_path / "p.dot").read_text()
    assert "digraph" in dot and "heavy" in dot


def test_wall_weight_shows_waiting_and_line_granularity_splits_lines(tmp_path):
    script = write(tmp_path / "waits.py", SPIN + """
import time
def nap():
    time.sleep(0.2)
nap()
spin(0.03)
""")
    wall = stackshot("--weight", "wall", "-o", tmp_path / "wall.json", "--format", "json", script)
    assert wall.returncode != 0 and "is a file for another program" in wall.stderr
    wall = stackshot("--weight", "wall", "-o", tmp_path / "wall.json", script)
    assert wall.returncode == 0, wall.stderr
    assert json.loads((tmp_path / "wall.json").read_text())["profiles"]  # speedscope
    wall = analyzer("--weight", "wall", "--format", "json",
                    _saved_by(stackshot, tmp_path / "wall.stackshot", script))
    doc = json.loads(wall.stdout)
    assert doc["stackshot"]["weight"] == "wall"
    assert next(n for n in doc["nodes"] if n["id"] == "nap")["total"] > 0
    lines = analyzer("--granularity", "line", "--format", "json", tmp_path / "wall.stackshot")
    assert lines.returncode == 0, lines.stderr
    doc = json.loads(lines.stdout)
    assert doc["stackshot"]["granularity"] == "line"
    spin_lines = {n["src"] for n in doc["nodes"] if n["id"] == "spin"}
    assert spin_lines and all(src.startswith(str(script) + ":") for src in spin_lines)


@pytest.mark.parametrize("fmt, ending", [("pprof", ".pb.gz"), ("dot", ".dot"), ("json", "")])
def test_a_machine_format_is_refused_as_a_report_before_the_program_runs(tmp_path, fmt, ending):
    marker = tmp_path / "ran"
    script = write(tmp_path / "p.py", f"open({str(marker)!r}, 'w').close()\n")
    proc = stackshot("--format", fmt, script)
    assert proc.returncode == 2
    assert_one_line_error(proc, f"--format {fmt} is a file for another program", "-o FILE",
                          f"-o profile{ending})")
    assert not marker.exists()


# -- bad command lines -----------------------------------------------------------------

def test_a_missing_script_is_one_line_and_status_2(tmp_path):
    proc = stackshot(tmp_path / "nope.py")
    assert proc.returncode == 2
    assert_one_line_error(proc, "stackshot: can't open file", "nope.py", "No such file")


def test_a_directory_or_zip_runs_its_main_or_says_it_has_none(tmp_path):
    import zipfile

    app = tmp_path / "app"
    app.mkdir()
    write(app / "__main__.py", "import sys\nprint('app', __name__, sys.argv[1:])\n")
    proc = stackshot("--format", "flat", app, "x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("app __main__ ['x']\n")
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.write(app / "__main__.py", "__main__.py")
    proc = stackshot("--format", "flat", tmp_path / "app.zip")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("app __main__ []\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = stackshot(empty)
    assert proc.returncode == 1
    assert_one_line_error(proc, "can't find '__main__' module in", "empty")


def test_a_missing_module_is_one_line_and_status_1(tmp_path):
    proc = stackshot("-m", "no_such_module_here", cwd=tmp_path)
    assert proc.returncode == 1
    assert_one_line_error(proc, "No module named no_such_module_here")


@pytest.mark.parametrize("args, text", [
    ([], "no program given"),
    (["--delay", "-1", "x.py"], "--delay"),
    (["--repeat", "0", "x.py"], "--repeat"),
    (["--format", "nope", "x.py"], "--format"),
    (["-m"], "-m"),
    (["--hide-self", "200", "x.py"], "between 0 and 100"),
])
def test_bad_command_lines_exit_2(tmp_path, args, text):
    proc = stackshot(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert text in proc.stderr


def test_an_unwritable_output_is_refused_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    script = write(tmp_path / "p.py", f"open({str(marker)!r}, 'w').close()\n")
    proc = stackshot("-o", tmp_path / "no" / "such" / "dir.stackshot", script)
    assert proc.returncode == 2
    assert_one_line_error(proc, "-o", "no such directory")
    assert not marker.exists()


def test_use_errortrace_either_works_or_says_why_in_one_line(tmp_path, busy):
    proc = stackshot("--use-errortrace", "--format", "flat", busy)
    if proc.returncode == 0:
        assert "heavy" in proc.stderr
    else:
        assert proc.returncode == 2
        assert_one_line_error(proc, "--use-errortrace")


def test_the_console_script_entry_point(tmp_path, busy):
    # what pip generates for `stackshot = stackshot.cli:main`
    wrapper = write(tmp_path / "stackshot", """
import re, sys
from stackshot.cli import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
""")
    proc = subprocess.run([sys.executable, str(wrapper), "--format", "flat", str(busy)],
                          capture_output=True, text=True, env=env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "busy ran []\n"
    assert "heavy" in proc.stderr and "stackshot" not in proc.stderr.split("Flat", 1)[1]
    usage = subprocess.run([sys.executable, str(wrapper), "--help"], capture_output=True,
                           text=True, env=env(), timeout=TIMEOUT)
    assert usage.stdout.startswith("usage: stackshot [options]")


# -- python -m analyzer ----------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    """Two saved runs of busy.py and one of another program (made once: read only)."""
    tmp_path = tmp_path_factory.mktemp("saved")
    busy = write(tmp_path / "busy.py", BUSY)
    paths = []
    for name in ("a.stackshot", "b.stackshot"):
        proc = stackshot("-o", tmp_path / name, busy)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "busy ran []\n"  # -o alone prints nothing more
        paths.append(tmp_path / name)
    other = write(tmp_path / "other.py", SPIN + "spin(0.05)\n")
    proc = stackshot("-o", tmp_path / "other.stackshot", other)
    assert proc.returncode == 0, proc.stderr
    return paths + [tmp_path / "other.stackshot"]


def samples_in(*paths) -> int:
    proc = analyzer("--format", "json", *paths)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["sample_number"]


def test_a_saved_run_renders_as_text_flat_and_exports(saved_runs, tmp_path):
    a = saved_runs[0]
    text = analyzer(a)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("Profiling results") and "heavy" in text.stdout
    flat = analyzer("--flat", "--show-line", a)
    assert flat.returncode == 0
    rows = flat.stdout.splitlines()
    assert rows[0].startswith("Flat profile:")
    assert "busy.py:" in flat.stdout  # --show-line
    sp = analyzer("--format", "speedscope", a)
    assert sp.returncode == 0 and json.loads(sp.stdout)["$schema"].startswith("https://www.speedscope")
    pprof = tmp_path / "a.pb.gz"
    assert analyzer("--format", "pprof", "--render-to", pprof, a).returncode == 0
    assert gzip.decompress(pprof.read_bytes())


def test_several_runs_are_summed(saved_runs):
    a, b, _ = saved_runs
    assert samples_in(a, b) == samples_in(a) + samples_in(b)
    assert samples_in(a, a) == 2 * samples_in(a)


def test_runs_of_different_programs_are_refused(saved_runs):
    a, _, other = saved_runs
    proc = analyzer(a, other)
    assert proc.returncode == 1
    assert_one_line_error(proc, "other.stackshot", "script other.py", "script busy.py", "--tolerant")


def test_tolerant_warns_and_skips(saved_runs, tmp_path):
    a, _, other = saved_runs
    junk = tmp_path / "junk.stackshot"
    junk.write_text("not a profile\n")
    proc = analyzer("--tolerant", "--format", "json", a, other, junk)
    assert proc.returncode == 0, proc.stderr
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith("analyzer: warning: skipping") for w in warnings)
    assert "other.stackshot" in warnings[0] and "junk.stackshot" in warnings[1]
    assert json.loads(proc.stdout)["sample_number"] == samples_in(a)


def test_tolerant_with_nothing_left_is_an_error(tmp_path):
    junk = tmp_path / "junk.stackshot"
    junk.write_bytes(b"\x00" * 10)
    proc = analyzer("--tolerant", junk)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == "analyzer: no file left to analyse"


def _saved(tmp_path, name: str, python: str = "cpython 3.11.7", program: str = "script p.py"):
    snaps = build_snapshots([("main", 0.0, 0.0, ["f"]), ("main", 0.01, 0.01, ["f"])])
    run = RunInfo(python=python, extra={"program": program})
    snaps = Snapshots(**{k: getattr(snaps, k) for k in (
        "frames", "stack_frame", "stack_parent", "threads", "sample_thread", "sample_stack",
        "sample_wall", "sample_cpu")}, runs=[run])
    snaps.save(tmp_path / name)
    return tmp_path / name


def test_runs_on_different_python_versions_are_refused(tmp_path):
    a = _saved(tmp_path, "a.stackshot", python="cpython 3.11.7")
    b = _saved(tmp_path, "b.stackshot", python="cpython 3.11.2")
    c = _saved(tmp_path, "c.stackshot", python="cpython 3.12.1")
    assert analyzer(a, b).returncode == 0
    proc = analyzer(a, c)
    assert proc.returncode == 1
    assert_one_line_error(proc, "cpython 3.12", "cpython 3.11")


@pytest.mark.parametrize("content, text", [
    (b"just some text\n", "not a stackshot snapshot file"),
    (b"", "it is empty"),
    (gzip.compress(MAGIC + b"version 99\nheader 2\n{}"), "written by format version 99"),
])
def test_files_that_are_not_ours_or_too_new_are_one_line_errors(tmp_path, content, text):
    bad = tmp_path / "bad.stackshot"
    bad.write_bytes(content)
    proc = analyzer(bad)
    assert proc.returncode == 1
    assert_one_line_error(proc, "analyzer:", "bad.stackshot", text)


def test_a_truncated_file_is_a_one_line_error(saved_runs, tmp_path):
    data = saved_runs[0].read_bytes()
    cut = tmp_path / "cut.stackshot"
    cut.write_bytes(data[: len(data) // 2])
    proc = analyzer(cut)
    assert proc.returncode == 1
    assert_one_line_error(proc, "cut.stackshot", "truncated")


def test_a_missing_file_is_a_one_line_error(tmp_path):
    proc = analyzer(tmp_path / "gone.stackshot")
    assert proc.returncode == 1
    assert_one_line_error(proc, "gone.stackshot", "No such file")


@pytest.fixture
def known(tmp_path):
    """A saved file whose profile is known: main 100%, heavy about 70%, light about 30%
    (70/30 of 100 ms with Racket's midpoint rule, 60/30 of 90 ms with ``'end'``)."""
    rows = [(k / 10, ["heavy" if k < 7 else "light", "main"]) for k in range(10)]
    snaps = build_snapshots([("t", t, t, stack) for t, stack in rows])
    snaps.save(tmp_path / "known.stackshot")
    return tmp_path / "known.stackshot"


def flat_names(proc) -> list:
    assert proc.returncode == 0, proc.stderr
    body = proc.stdout.split("\n\n", 1)[1].splitlines()[2:]
    return [row.split()[0] for row in body]


def test_flat_rows_are_sorted_by_self_time(known):
    assert flat_names(analyzer("--flat", known)) == ["heavy", "light", "main"]


def test_keep_drop_and_thresh_select_functions(known):
    assert flat_names(analyzer("--flat", "--keep", "^h", "--keep", "main", known)) == ["heavy", "main"]
    assert flat_names(analyzer("--flat", "--drop", "ea", known)) == ["light", "main"]
    assert flat_names(analyzer("--flat", "--thresh", "50", known)) == ["heavy", "main"]
    assert flat_names(analyzer("--flat", "--thresh", "100%", known)) == ["main"]
    text = analyzer("--keep", "heavy|main", "--hide-self", "0", known)
    assert "heavy" in text.stdout and "light" not in text.stdout
    doc = json.loads(analyzer("--format", "json", "--drop", "light", known).stdout)
    assert {n["id"] for n in doc["nodes"][1:]} == {"heavy", "main"}


def test_selection_does_not_apply_to_exports(known):
    proc = analyzer("--format", "collapsed", "--keep", "x", known)
    assert proc.returncode == 2
    assert_one_line_error(proc, "--keep shapes the analysed profile", "collapsed")


def test_bad_regex_and_conflicting_formats(known):
    proc = analyzer("--keep", "(", known)
    assert proc.returncode == 2 and "bad regular expression" in proc.stderr
    proc = analyzer("--flat", "--format", "dot", known)
    assert proc.returncode == 2
    assert_one_line_error(proc, "--flat and --format dot")


# -- the flat renderer -----------------------------------------------------------------

def test_render_flat_columns_and_threshold():
    # Racket's raw shape: newest sample first, thread times in ms; each sample weighs 10 ms
    prof = analyze_samples((0, [(0, 30, ("b", "x.py:5"), ("m", "x.py:9")),
                                (0, 20, ("b", "x.py:5"), ("m", "x.py:9")),
                                (0, 10, ("a", "x.py:1"), ("m", "x.py:9")),
                                (0, 0, ("a", "x.py:1"), ("m", "x.py:9"))]))
    text = render_flat(prof, show_line=True)
    lines = text.splitlines()
    assert lines[0] == "Flat profile: 40.0ms of cpu time observed in 4 samples, 3 functions"
    assert lines[2].split() == ["function", "self", "total", "location"]
    assert [r.split()[0] for r in lines[4:]] == ["a", "b", "m"]
    assert lines[-1].split()[-1] == "x.py:9"
    hidden = render_flat(prof, hide_self=0.4)
    assert "(1 with self <= 40.0% not shown)" in hidden
    with pytest.raises(ValueError, match="hide_self"):
        render_flat(prof, hide_self=5)
