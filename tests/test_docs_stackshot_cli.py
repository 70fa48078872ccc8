"""Every example of scribblings/stackshot.md and scribblings/cli.md runs as the page says.

```python blocks run as ``tests/doc_examples.py`` runs them: each in a fresh
interpreter, and a "prints `...`" paragraph after a block is checked exactly.

```console blocks are shell sessions.  Each ``$ command`` line runs in bash, in one
working directory per page (so a file one example saves, the next can read), with
``stackshot`` and ``python`` first on ``PATH``.  A ```python block introduced by a
line ending in "`NAME.py`:" is saved there as NAME.py first.  Every command must
exit 0 (examples that show a failure end in ``; echo "exit status $?"``).

The output a page shows is a real run's, so times and counts differ from run to
run; it is checked where it cannot vary: a shown line without digits (other than
rules of ``-`` and ``=`` and ``...`` elisions) must be a line of the real output,
spaces aside, and an ``exit status N`` line must be printed exactly.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass

import pytest

from doc_examples import DOCS, examples, run
from run_helpers import repo_env

PAGES = ("stackshot.md", "cli.md")
TIMEOUT = 300  # per command, only against hangs

_CONSOLE = re.compile(r"```console\n(.*?)```", re.S)
_SAVED = re.compile(r"`([\w.-]+\.py)`:[ \t]*\n\n```python\n(.*?)```", re.S)


@dataclass
class Command:
    page: str
    line: int
    command: str
    shown: list

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def console_commands(page: str) -> list:
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    out = []
    for m in _CONSOLE.finditer(text):
        first = text.count("\n", 0, m.start()) + 2
        for k, line in enumerate(m.group(1).splitlines()):
            if line.startswith("$ "):
                out.append(Command(page, first + k, line[2:], []))
            elif out and out[-1].line >= first:
                out[-1].shown.append(line)
            else:
                raise AssertionError(f"{page}:{first + k}: output before any command")
    return out


def saved_files(page: str) -> dict:
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    return {name: body for name, body in _SAVED.findall(text)}


def checked(line: str) -> bool:
    """Whether a shown output line must appear as it is (see the module docstring)."""
    s = line.strip()
    if line.startswith("exit status "):
        return True
    return bool(s) and not re.search(r"\d", s) and "..." not in s and not re.fullmatch(r"[-=\s]+", s)


def squeeze(line: str) -> str:
    return " ".join(line.split())


def make_bin(folder) -> str:
    """A directory with ``python`` (this interpreter) and ``stackshot`` on it.

    The real console script is used when the package is installed beside this
    interpreter; otherwise an equivalent of what pip generates for
    ``stackshot = stackshot.cli:main``.
    """
    os.makedirs(folder, exist_ok=True)
    scripts = {"python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'}
    installed = shutil.which("stackshot", path=os.path.dirname(sys.executable))
    if installed:
        scripts["stackshot"] = f'#!/bin/sh\nexec "{installed}" "$@"\n'
    else:
        scripts["stackshot"] = (f"#!{sys.executable}\nimport sys\nfrom stackshot.cli import main\n"
                                "sys.exit(main())\n")
    for name, body in scripts.items():
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return folder


PYTHON_EXAMPLES = [e for page in PAGES for e in examples(page)]


@pytest.mark.parametrize("example", PYTHON_EXAMPLES, ids=[e.id for e in PYTHON_EXAMPLES])
def test_python_example(example, tmp_path):
    run(example, str(tmp_path))


def test_most_python_examples_say_what_they_print():
    unchecked = [e.id for e in PYTHON_EXAMPLES if not e.expected]
    # the pages' first profile_thunk example prints a whole profile, and cli.md's
    # primes.py is a program; every other example states its output
    assert len(unchecked) <= 2, unchecked


@pytest.mark.parametrize("page", PAGES)
def test_console_examples(page, tmp_path):
    commands = console_commands(page)
    if page == "cli.md":
        assert len(commands) >= 10
    work = tmp_path / "work"
    work.mkdir()
    for name, body in saved_files(page).items():
        (work / name).write_text(body)
    env = repo_env()
    env["PATH"] = make_bin(str(tmp_path / "bin")) + os.pathsep + env.get("PATH", "")
    for cmd in commands:
        proc = subprocess.run(["bash", "-c", cmd.command], cwd=work, env=env, text=True,
                              capture_output=True, timeout=TIMEOUT)
        assert proc.returncode == 0, f"{cmd.id}: `{cmd.command}` exited {proc.returncode}:\n{proc.stderr}"
        real = {squeeze(line) for line in (proc.stdout + proc.stderr).splitlines()}
        for line in cmd.shown:
            if checked(line):
                assert squeeze(line) in real, (
                    f"{cmd.id}: `{cmd.command}` did not print {line.strip()!r}; it printed:\n"
                    f"{proc.stdout}{proc.stderr}")
        if "Traceback" in proc.stderr and "Traceback" not in "\n".join(cmd.shown):
            raise AssertionError(f"{cmd.id}: `{cmd.command}` printed a traceback:\n{proc.stderr}")
