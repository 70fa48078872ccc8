"""Every example of scribblings/exports.md runs and prints what the page says."""

import pytest

from doc_examples import examples, run

EXAMPLES = examples("exports.md")


def test_the_page_has_checked_examples():
    assert len(EXAMPLES) >= 8
    assert all(e.expected for e in EXAMPLES), [e.id for e in EXAMPLES if not e.expected]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(example, tmp_path):
    run(example, str(tmp_path))
