"""Every example of scribblings/analyzer.md and renderers.md runs and prints what the page says.

Besides the ``prints `X` `` convention of :mod:`doc_examples`, a block followed by a
paragraph ``prints:`` and a ```text block must print exactly that text: that is how
the renderers' page shows whole reports.
"""

import os
import re

import pytest

from doc_examples import DOCS, Example, examples, run

PAGES = ("analyzer.md", "renderers.md")
_FULL = re.compile(r"```python\n(.*?)```\n\nprints:\n\n```text\n(.*?)```\n", re.S)


def full_output_examples(page):
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    return [(Example(page, text.count("\n", 0, m.start()) + 1, m.group(1), None), m.group(2))
            for m in _FULL.finditer(text)]


EXAMPLES = [e for page in PAGES for e in examples(page)]
FULL = {e.id: want for page in PAGES for e, want in full_output_examples(page)}


@pytest.mark.parametrize("page", PAGES)
def test_every_example_is_checked(page):
    mine = [e for e in EXAMPLES if e.page == page]
    assert len(mine) >= 3
    unchecked = [e.id for e in mine if not e.expected and e.id not in FULL]
    assert not unchecked, unchecked


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(example, tmp_path):
    out = run(example, str(tmp_path))
    if example.id in FULL:
        assert out == FULL[example.id], f"{example.id} printed:\n{out}"
