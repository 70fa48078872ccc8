"""The ``stackshot`` command's conventions, driven as a user drives it: the real
command in a subprocess, its files opened by their real consumers (pstats,
Graphviz's ``dot``, ``go tool pprof``, ``python -m analyzer``), real forked children.

* ``-o FILE`` writes what FILE's name says; an unknown ending is refused, listing them.
* The profile never shares standard output with the program.
* The analyzer's filters work on ``stackshot`` too.
* A forked child never overwrites or prints over the parent's profile; the report
  says how many child processes ran unprofiled, and which threads were not sampled.
"""

from __future__ import annotations

import gzip
import json
import pstats
import subprocess
import sys

import pytest

from export_consumers import need_program
from sampler.snapshot import Snapshots
from test_cli import BUSY, SPIN, SPIN_SAMPLED, TIMEOUT, analyzer, env, run, stackshot, write
from test_export_pprof import go_pprof, top_rows


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    return write(tmp_path_factory.mktemp("conv") / "busy.py", BUSY)


def _open_pstats(path):
    stats = pstats.Stats(str(path))
    return {func[2] for func in stats.stats}


def _open_dot(path):
    dot = need_program("dot", "graphviz")
    svg = subprocess.run([dot, "-Tsvg", str(path)], capture_output=True, text=True,
                         timeout=TIMEOUT, check=True).stdout
    return {"heavy"} if ">heavy" in svg else set()


def _open_pprof(path):
    return {name for name in top_rows(go_pprof("-top", str(path), cwd=path.parent))}


def _open_speedscope(path):
    doc = json.loads(path.read_text())
    assert doc["$schema"].startswith("https://www.speedscope.app/")
    return {f["name"] for f in doc["shared"]["frames"]}


def _open_collapsed(path):
    return {part.split(" ")[0] for line in path.read_text().splitlines() for part in line.split(";")}


def _open_html(path):
    text = path.read_text()
    assert text.lstrip().lower().startswith("<!doctype html")
    return {"heavy"} if "heavy" in text else set()


def _open_text(path):
    text = path.read_text()
    assert text.startswith("Profiling results")
    return {"heavy"} if " heavy " in text or "heavy [" in text else set()


def _open_snapshots(path):
    proc = analyzer("--format", "flat", path)
    assert proc.returncode == 0, proc.stderr
    assert "heavy" in proc.stdout
    return {f.name for f in Snapshots.load(path).frames}


ENDINGS = [
    ("p.pstats", _open_pstats), ("p.prof", _open_pstats),
    ("p.html", _open_html), ("p.htm", _open_html),
    ("p.json", _open_speedscope), ("p.speedscope.json", _open_speedscope),
    ("p.pb.gz", _open_pprof), ("p.pprof", _open_pprof),
    ("p.collapsed", _open_collapsed), ("p.folded", _open_collapsed),
    ("p.collapsed.txt", _open_collapsed),
    ("p.dot", _open_dot), ("p.txt", _open_text), ("p.stackshot", _open_snapshots),
]


@pytest.mark.parametrize("name, consumer", ENDINGS, ids=[n for n, _ in ENDINGS])
def test_o_writes_what_the_file_name_says(tmp_path, busy, name, consumer):
    out = tmp_path / name
    proc = stackshot("-o", out, busy)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "busy ran []\n" and proc.stderr == ""  # -o alone prints nothing
    assert "heavy" in consumer(out)


def test_pprof_files_are_gzip_whatever_their_ending(tmp_path, busy):
    proc = stackshot("-o", tmp_path / "a.pprof", "-o", tmp_path / "b.pb.gz", busy)
    assert proc.returncode == 0, proc.stderr
    for name in ("a.pprof", "b.pb.gz"):
        assert gzip.decompress((tmp_path / name).read_bytes())


def test_an_unknown_ending_is_refused_with_the_list_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    script = write(tmp_path / "p.py", f"open({str(marker)!r}, 'w').close()\n")
    proc = stackshot("-o", tmp_path / "out.data", script)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    for ending in (".pstats", ".prof", ".html", ".json", ".speedscope.json", ".pb.gz", ".pprof",
                   ".collapsed", ".folded", ".dot", ".txt", ".stackshot"):
        assert ending in line
    assert not marker.exists() and not (tmp_path / "out.data").exists()


def test_the_report_never_mixes_into_the_programs_standard_output(tmp_path, busy):
    out = tmp_path / "prog.out"
    with open(out, "w") as f:  # `stackshot prog.py > prog.out`
        proc = subprocess.run([sys.executable, "-m", "sampler", str(busy)], stdout=f,
                              stderr=subprocess.PIPE, text=True, env=env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "busy ran []\n"
    assert proc.stderr.startswith("Profiling results") and "heavy" in proc.stderr


def test_a_program_that_closes_stdout_keeps_its_profile(tmp_path):
    data = tmp_path / "f.json"
    data.write_text(json.dumps({"k": list(range(20))}))
    saved = tmp_path / "jt.stackshot"
    # `python -m sampler -m json.tool f.json | head -1`: json.tool closes sys.stdout
    proc = subprocess.run(f"'{sys.executable}' -m sampler -o '{saved}' --format text "
                          f"-m json.tool '{data}' | head -1", shell=True, capture_output=True,
                          text=True, env=env(), timeout=TIMEOUT)
    assert proc.stdout == "{\n"
    assert "Profiling results" in proc.stderr and "Traceback" not in proc.stderr
    assert Snapshots.load(saved).runs[0].extra["program"] == "-m json.tool"


def test_the_analyzers_filters_work_on_stackshot(tmp_path, busy):
    kept = stackshot("--format", "flat", "--keep", "^heavy$", "--show-line", busy)
    assert kept.returncode == 0, kept.stderr
    rows = [line for line in kept.stderr.splitlines()[1:] if line.strip()]
    assert any(line.startswith("heavy") for line in rows)
    assert not any(line.startswith(("light", "spin")) for line in rows)
    assert "busy.py:" in kept.stderr  # --show-line
    dropped = stackshot("--drop", "heavy", "--thresh", "1", busy)
    assert dropped.returncode == 0, dropped.stderr
    assert "heavy" not in dropped.stderr and "light" in dropped.stderr


FORK_LATE = SPIN_SAMPLED + """
import os, sys, time
spin(0.1)
pid = os.fork()
if pid == 0:
    time.sleep(0.3)  # the child exits last, and leaves the program the ordinary way
    print("child done", flush=True)
    sys.exit(0)
spin(0.1)
print("parent done", flush=True)
"""


def test_a_forked_child_never_overwrites_or_prints_over_the_parents_profile(tmp_path):
    script = write(tmp_path / "fork_late.py", FORK_LATE)
    saved = tmp_path / "late.stackshot"
    # the child inherits the pipes: communicate() waits until it, too, has exited
    proc = stackshot("-o", saved, "--format", "text", script)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["child done", "parent done"]
    assert proc.stderr.count("Profiling results") == 1
    assert "-" not in proc.stderr.split("(out of ", 1)[1].split(")", 1)[0]
    assert "1 child process ran unprofiled" in proc.stderr
    snaps = Snapshots.load(saved)
    assert len(snaps) > 0 and snaps.runs[0].pid != 0
    assert "spin" in {f.name for f in snaps.frames}


def test_child_processes_are_counted_as_unprofiled(tmp_path):
    script = write(tmp_path / "kids.py", SPIN + """
import subprocess, sys
for _ in range(2):
    subprocess.run([sys.executable, "-c", "pass"], check=True)
spin(0.05)
""")
    proc = stackshot(script)
    assert proc.returncode == 0, proc.stderr
    assert "2 child processes ran unprofiled" in proc.stderr


THREADS = SPIN + """
import threading
ts = [threading.Thread(target=spin, args=(0.2,)) for _ in range(3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
spin(0.02)
"""


def test_the_header_says_which_threads_were_not_sampled(tmp_path):
    script = write(tmp_path / "threads.py", THREADS)
    proc = stackshot(script)
    assert proc.returncode == 0, proc.stderr
    assert "3 other threads used up to " in proc.stderr and "use --all-threads" in proc.stderr
    every = stackshot("--all-threads", script)
    assert every.returncode == 0, every.stderr
    assert "other thread" not in every.stderr


def test_python_m_analyzer_o_follows_the_same_rule(tmp_path, busy):
    saved = tmp_path / "run.stackshot"
    assert stackshot("-o", saved, busy).returncode == 0
    proc = analyzer("-o", tmp_path / "a.pstats", "-o", tmp_path / "a.folded", saved)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # -o alone prints nothing
    assert "heavy" in _open_pstats(tmp_path / "a.pstats")
    assert "heavy" in _open_collapsed(tmp_path / "a.folded")
    refused = analyzer("-o", tmp_path / "a.bin", saved)
    assert refused.returncode == 2 and ".pstats" in refused.stderr
    both = analyzer("-o", tmp_path / "b.dot", "--format", "flat", saved)
    assert both.returncode == 0 and both.stdout.startswith("Flat profile")
    assert "digraph" in (tmp_path / "b.dot").read_text()


KIDS = SPIN_SAMPLED + """
import multiprocessing, os, sys

def mp_child_work():
    spin(0.1)

def forked_work():
    spin(0.1)

if __name__ == "__main__":
    p = multiprocessing.get_context("fork").Process(target=mp_child_work)
    p.start()
    p.join()
    pid = os.fork()
    if pid == 0:
        forked_work()
        sys.exit(0)  # this child leaves through the program, as the parent will
    os.waitpid(pid, 0)
    spin(0.05)
    print("done")
"""


def test_subprocesses_profiles_forked_children_in_one_profile_with_a_view_per_process(tmp_path):
    script = write(tmp_path / "kids.py", KIDS)
    saved = tmp_path / "kids.stackshot"
    proc = stackshot("--subprocesses", "-o", saved, "--format", "flat", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n" and proc.stderr.count("Flat profile") == 1
    snaps = Snapshots.load(saved)
    assert len({r.pid for r in snaps.runs}) == 3
    names = [t.name for t in snaps.threads]
    assert names[0] == "MainThread" and sum("(pid " in n for n in names) == 2
    frames = {f.name for f in snaps.frames}
    assert {"mp_child_work", "forked_work"} <= frames
    assert "unprofiled" not in proc.stderr
    alone = stackshot("-o", tmp_path / "alone.stackshot", "--format", "text", script)
    assert alone.returncode == 0, alone.stderr
    assert "2 child processes ran unprofiled" in alone.stderr
    assert not {"mp_child_work", "forked_work"} & {
        f.name for f in Snapshots.load(tmp_path / "alone.stackshot").frames}


EVERY_KIND = SPIN_SAMPLED + """
import multiprocessing, os, subprocess, sys
import sampling_helpers
TESTS = os.path.dirname(sampling_helpers.__file__)  # (for the -c child, as for this program)

def spawned_work():
    spin(0.1)

def forkserved_work():
    spin(0.1)

CHILD = f"import sys\\nsys.path.append({TESTS!r})\\nfrom sampling_helpers import spin_sampled\\n" \\
        "def run_python_work():\\n    spin_sampled(0.1)\\nrun_python_work()\\n" \\
        "print(getattr(sys.modules.get('sitecustomize'), 'MINE', 'no own sitecustomize'))"

if __name__ == "__main__":
    for method, work in (("spawn", spawned_work), ("forkserver", forkserved_work)):
        p = multiprocessing.get_context(method).Process(target=work)
        p.start()
        p.join()
    subprocess.run([sys.executable, "-c", CHILD], check=True)
    subprocess.run(["true"], check=True)  # not Python: never profiled
    spin(0.05)
    print("done", flush=True)
"""


def test_subprocesses_reaches_new_interpreters_spawn_forkserver_and_subprocess(tmp_path):
    script = write(tmp_path / "every.py", EVERY_KIND)
    own = tmp_path / "own"  # the user's own sitecustomize still runs in the children
    own.mkdir()
    write(own / "sitecustomize.py", "MINE = 'own sitecustomize ran'\n")
    saved = tmp_path / "every.stackshot"
    environ = dict(env(), PYTHONPATH=env()["PYTHONPATH"] + ":" + str(own))
    proc = subprocess.run([sys.executable, "-m", "sampler", "--subprocesses", "-o", saved,
                           "--format", "text", script], capture_output=True, text=True,
                          env=environ, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "own sitecustomize ran\ndone\n"
    assert proc.stderr.count("Profiling results") == 1
    assert "1 child process ran unprofiled" in proc.stderr  # `true`
    snaps = Snapshots.load(saved)
    frames = {f.name for f in snaps.frames}
    assert {"spawned_work", "forkserved_work", "run_python_work"} <= frames
    pids = {r.pid for r in snaps.runs}
    assert len(pids) == 4  # the program and its three Python children; not the helpers
    child_threads = [t.name for t in snaps.threads if "(pid " in t.name]
    assert len(child_threads) == 3 and all(n.startswith("MainThread (pid ") for n in child_threads)
    assert "stackshot-children-" not in proc.stderr and "sitecustomize" not in frames


def test_without_subprocesses_every_kind_of_child_is_counted_once(tmp_path):
    script = write(tmp_path / "every.py", EVERY_KIND)
    saved = tmp_path / "every.stackshot"
    proc = stackshot("-o", saved, "--format", "text", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no own sitecustomize\ndone\n"
    assert "4 child processes ran unprofiled" in proc.stderr
    assert len({r.pid for r in Snapshots.load(saved).runs}) == 1


def test_the_child_counter_counts_each_way_of_starting_a_child_once():
    """Its audit hook sees each event's name, not its arguments: a Popen that starts
    its child through os.posix_spawn raises two events and is one child."""
    import os

    from stackshot.children import ChildCounter

    counts = []
    with ChildCounter() as counter:
        subprocess.run(["true"], check=True)
        subprocess.run(["/bin/true"], check=True, close_fds=False)  # (os.posix_spawn's way, 3.8+)
        counts.append(counter.count)
        os.waitpid(os.posix_spawn("/bin/true", ["true"], os.environ), 0)
        os.waitpid(os.posix_spawnp("true", ["true"], os.environ), 0)
        os.system("true")
        counts.append(counter.count)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        counts.append(counter.count)
    os.system("true")  # (no counter active)
    assert counts == [2, 5, 6] and counter.count == 6


API_KIDS = SPIN_SAMPLED + """
import multiprocessing, os, sys
from stackshot import profile, profile_thunk

def spawned_work():
    spin(0.1)

def program():
    p = multiprocessing.get_context("spawn").Process(target=spawned_work)
    p.start()
    p.join()
    pid = os.fork()
    if pid == 0:
        spin(0.1)
        os._exit(0)
    os.waitpid(pid, 0)
    return "value"

def views(s):
    \"\"\"Each thread of a child's run is named with its pid; the parent's are not.\"\"\"
    me = os.getpid()
    for t in s.threads:
        pid = s.runs[t.run].pid
        assert (f"(pid {pid})" in t.name) == (pid != me), (t.name, pid, me)
    return sum(1 for t in s.threads if s.runs[t.run].pid != me)

if __name__ == "__main__":
    with profile(subprocesses=True, render=None) as p:
        program()
    s = p.snapshots
    print(len({r.pid for r in s.runs}), s.runs[0].extra.get("child_processes", 0), views(s) >= 1)
    print(profile_thunk(program, subprocesses=True, render=None))
    with profile(render=None) as p:
        program()
    print(len({r.pid for r in p.snapshots.runs}), p.snapshots.runs[0].extra.get("child_processes", 0))
"""


def test_the_api_profiles_child_processes_too(tmp_path):
    script = write(tmp_path / "api_kids.py", API_KIDS)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["3 0 True", "value", "1 2"]


def test_engine_is_passed_only_when_given_and_a_refusal_is_one_line(tmp_path, busy):
    plain = stackshot(busy)
    assert plain.returncode == 0, plain.stderr  # no --engine: the sampler's own choice
    proc = stackshot("--engine", "python", busy)
    if proc.returncode == 0:  # a sampler that takes engine=
        assert "Profiling results" in proc.stderr
    else:  # one that does not (yet): told in one line, before the program runs
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.splitlines()
        assert line.startswith("stackshot: --engine python: ")


GROWS = SPIN + """
import sys
def grows(n):
    return spin(n)
def steady():
    return spin(0.05)
grows(float(sys.argv[1])); steady()
"""


def test_two_runs_compare_with_python_m_stackshot_diff(tmp_path):
    script = write(tmp_path / "grows.py", GROWS)
    before, after = tmp_path / "before.stackshot", tmp_path / "after.stackshot"
    assert stackshot("-o", before, script, "0.02").returncode == 0
    assert stackshot("-o", after, script, "0.3").returncode == 0
    proc = run("stackshot.diff", before, after)
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split()[:2] == ["Self", "before"]
    total_change = {row.split()[-2]: row.split()[5] for row in rows}  # name -> after total
    assert "grows" in total_change and "steady" in total_change
    first = rows[0].split()  # the largest change of self time: spin, which grows calls
    assert first[-2] == "spin" and first[2].startswith("+")
    missing = run("stackshot.diff", before, tmp_path / "nope.stackshot")
    assert missing.returncode == 1 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr


def test_diff_profiles_matches_functions_by_name_and_file():
    from analyzer import analyze_samples
    from snapshot_builders import snapshots
    from stackshot.diff import diff_profiles, render_diff

    a = analyze_samples(snapshots([("t", i / 10, i / 10, ["f", "main"]) for i in range(10)]))
    b = analyze_samples(snapshots([("t", i / 10, i / 10, ["g" if i % 2 else "f", "main"])
                                   for i in range(30)]))
    rows = {c.name: c for c in diff_profiles(a, b)}
    assert rows["g"].self_before == 0 and rows["g"].self_after > 0
    assert rows["main"].total_after > rows["main"].total_before
    assert "g" in render_diff(list(rows.values()))
    with pytest.raises(TypeError, match="two analyzer Profiles"):
        diff_profiles(a, None)
