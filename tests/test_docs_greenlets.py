"""Every example of scribblings/greenlets.md runs and prints what the page says."""

import pytest

from doc_examples import page_tests

pytest.importorskip("gevent")

test_the_page_has_checked_examples, test_example = page_tests("greenlets.md", at_least=2)
