"""Run the examples of a page of the user docs (``scribblings/*.md``).

A page's ```python blocks are run in order, each in a fresh namespace and a fresh
interpreter (so a sampler left running by one cannot disturb the next).  Where the
paragraph after a block says what it prints (``prints `X` ``, several values
separated by commas meaning several lines), the output must be exactly that.

A page whose every example says so gets its tests from :func:`page_tests`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from run_helpers import REPO, repo_env
DOCS = os.path.join(REPO, "scribblings")

_BLOCK = re.compile(r"```python\n(.*?)```\n(?:\n((?:[^\n]+\n?)+))?", re.S)
_PRINTS = re.compile(r"^prints ((?:`[^`]*`(?:, | and |,? )?)+)")


@dataclass
class Example:
    page: str
    line: int
    code: str
    expected: Optional[list[str]]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def examples(page: str) -> list[Example]:
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    out = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        expected = None
        after = (m.group(2) or "").strip()
        p = _PRINTS.match(after)
        if p:
            expected = re.findall(r"`([^`]*)`", p.group(1))
        out.append(Example(page, line, m.group(1), expected))
    return out


def run(example: Example, cwd: str, timeout: float = 120) -> str:
    proc = subprocess.run([sys.executable, "-c", example.code], capture_output=True, text=True,
                          cwd=cwd, env=repo_env(), timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"example at {example.id} failed:\n{proc.stderr}")
    if example.expected is not None:
        assert proc.stdout.splitlines() == example.expected, (
            f"example at {example.id} printed {proc.stdout!r}, the page says {example.expected!r}")
    return proc.stdout


def page_tests(page: str, at_least: int) -> tuple[Callable[[], None], Callable[..., None]]:
    """The two tests of a page whose every example says what it prints.

    ``test_the_page_has_checked_examples``: the page has ``at_least`` examples (so a
    broken block pattern cannot pass by finding none) and each says what it prints;
    ``test_example``: each example, one test named ``page:line``, prints just that.
    A test module binds both to those names, which is how pytest finds them.
    """
    page_examples = examples(page)

    def test_the_page_has_checked_examples() -> None:
        assert len(page_examples) >= at_least
        assert all(e.expected for e in page_examples), [e.id for e in page_examples if not e.expected]

    @pytest.mark.parametrize("example", page_examples, ids=[e.id for e in page_examples])
    def test_example(example: Example, tmp_path) -> None:
        run(example, str(tmp_path))

    return test_the_page_has_checked_examples, test_example
