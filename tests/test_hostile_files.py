"""The files of the attack on stackshot (issue 10), fed to ``python -m analyzer`` for real.

``tests/data/repro/`` holds the eight small files that made the analyzer end in a
traceback, print ``nan``, or send terminal escapes: each must now end in the one-line
error of a file that cannot be used, or render with every control character shown as
an escape.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import repo_env

REPRO = Path(__file__).parent / "data" / "repro"
TIMEOUT = 180  # only against hangs
FORMATS = ["text", "flat", "dot", "json", "collapsed", "html", "pprof", "pstats", "speedscope"]

REFUSED = {
    "deep_extra.stackshot": "corrupt header: nested more than 64 levels deep",
    "huge_overflow.stackshot": "corrupt header: cpu_overflow holds [3, 1000",
    "huge_rate.stackshot": "corrupt header: runs[0].achieved_rate is 9999",
    "long_error_message.stackshot": "corrupt header: threads[0] is not [id, name",
    "nan_delay.stackshot": "corrupt header: runs[0].requested_delay is nan, not a finite number",
    "nan_process_cpu.stackshot": "corrupt header: runs[0].process_cpu is nan, not a finite number",
}
RENDERED = ["surrogate_name.stackshot", "terminal_escapes.stackshot"]
_RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def analyzer(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True,
                          env=repo_env(), timeout=TIMEOUT, **kw)


def test_every_file_of_the_attack_is_covered():
    assert sorted(os.listdir(REPRO)) == sorted([*REFUSED, *RENDERED])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_hostile_file_ends_in_the_one_line_error(name):
    proc = analyzer(str(REPRO / name))
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, err
    assert proc.stdout == b""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"analyzer: {REPRO / name}: {REFUSED[name]}"), err
    assert len(err) < 300


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", RENDERED)
def test_a_file_with_odd_names_renders_safely_in_every_format(name, fmt, tmp_path):
    out = tmp_path / "out"
    proc = analyzer("--format", fmt, "--render-to", str(out), str(REPRO / name))
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode("utf-8", "replace")
    data = out.read_bytes()
    if fmt not in ("pprof", "pstats"):  # binary formats
        data.decode("utf-8")  # valid UTF-8, lone surrogates written as escapes
    if fmt in ("text", "flat"):
        assert not _RAW_CONTROL.search(data), data[:2000]


@pytest.mark.parametrize("args", [[], ["--flat", "--show-line"]])
@pytest.mark.parametrize("name", RENDERED)
def test_what_reaches_a_terminal_carries_no_escape_sequence(name, args):
    proc = analyzer(*args, str(REPRO / name))
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode("utf-8", "replace")
    assert not _RAW_CONTROL.search(proc.stdout)
    assert rb"\x1b]0;PWNED\x07\x1b[2J" in proc.stdout or rb"\ud800" in proc.stdout


# -- issue 10, item 11: a failed render never destroys the file it was to replace -----------
def _limit_file_size() -> None:  # in the child: writes past 1 KB fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


@pytest.mark.parametrize("module, option, last", [
    ("analyzer", "--render-to", [str(REPRO / "terminal_escapes.stackshot")]), ("sampler", "-o", ["-c", "pass"])])
def test_render_to_a_file_that_cannot_be_completed_keeps_the_old_one(module, option, last, tmp_path):
    good = tmp_path / "profile.html"
    good.write_text("the profile from yesterday")
    args = ["--format", "html", option, str(good), *last] if module == "analyzer" else [option, str(good), *last]
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=repo_env(), timeout=TIMEOUT, preexec_fn=_limit_file_size)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot write {good}: File too large" in proc.stderr and "Traceback" not in proc.stderr
    assert good.read_text() == "the profile from yesterday"
    assert sorted(os.listdir(tmp_path)) == ["profile.html"]  # no temporary file left


def test_sampler_output_that_cannot_be_completed_keeps_the_old_file(tmp_path):
    saved = tmp_path / "run.stackshot"
    shutil.copy(REPRO / "terminal_escapes.stackshot", saved)
    before = saved.read_bytes()
    program = ("fs = []\n"  # 300 distinct functions: a header far over 1 KB compressed
               "for i in range(300):\n"
               "    exec(f'def f{i}(g): return g()', globals()); fs.append(globals()[f'f{i}'])\n"
               "def chain(k): return fs[k](lambda: chain(k + 1)) if k < 300 else sum(range(10**6))\n"
               "for _ in range(20): chain(0)\n")
    proc = subprocess.run([sys.executable, "-m", "sampler", "-o", str(saved), "-c", program],
                          capture_output=True, text=True, env=repo_env(), timeout=TIMEOUT,
                          preexec_fn=_limit_file_size)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot write {saved}: File too large" in proc.stderr and "Traceback" not in proc.stderr
    assert saved.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["run.stackshot"]


@pytest.mark.parametrize("fmt", ["collapsed", "speedscope", "json", "text"])
def test_an_export_printed_to_a_terminal_shows_escapes_instead_of_sending_them(fmt):
    """Machine formats keep names exact in files and pipes, but not on a terminal."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "analyzer", "--format", fmt,
                                 str(REPRO / "terminal_escapes.stackshot")], stdout=slave,
                                stderr=subprocess.DEVNULL, env=repo_env())
        os.close(slave)  # read while it writes: a terminal holds only a few KB
        shown = b""
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the child's end is closed and everything was read
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        os.close(master)
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert b"PWNED" in shown
