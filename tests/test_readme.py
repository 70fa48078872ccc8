"""The README keeps its promises: two commands first, and its example runs."""

import os
import re
import subprocess
import sys

from run_helpers import REPO, repo_env

README = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()


def test_readme_opens_with_exactly_two_commands():
    first = re.match(r"```console\n(.*?)```", README, re.S)
    assert first, "the README must open with a console block"
    commands = first.group(1).strip().splitlines()
    assert len(commands) == 2
    install_and_run, run_tests = commands
    assert "pip install" in install_and_run and "stackshot.demo" in install_and_run
    assert run_tests.endswith("-m pytest")
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    assert '"$venv/bin/python" -m pytest' in ci, "CI runs the README's test command"


def test_readme_python_example_runs(tmp_path):
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=repo_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Profiling results" in proc.stdout


def test_the_demo_the_first_command_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stackshot", "-m", "stackshot.demo"],
                          capture_output=True, text=True, cwd=tmp_path, env=repo_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("demo: ") and "Caller" not in proc.stdout
    assert "Caller" in proc.stderr and "fingerprint" in proc.stderr  # the report: stderr


def test_the_screenshot_is_the_demos_page_made_by_the_documented_command(tmp_path):
    from export_consumers import need_program

    block = re.search(r"made again by:\n\n```console\n(.*?)\n```", README, re.S)
    assert block, "the README must say how its screenshot is made"
    command = block.group(1)
    assert "-m stackshot.demo" in command and "--screenshot=scribblings/flamegraph.png" in command
    chromium = need_program("chromium", "chromium")
    command = command.replace("scribblings/flamegraph.png", str(tmp_path / "shot.png"))
    command = command.replace("stackshot -o", f"'{sys.executable}' -m stackshot -o", 1)
    command = command.replace("chromium --headless", f"'{chromium}' --headless --no-sandbox", 1)
    proc = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=tmp_path,
                          env=repo_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "demo" in (tmp_path / "demo.html").read_text()
    assert (tmp_path / "shot.png").read_bytes().startswith(b"\x89PNG")
