"""Every example of scribblings/memprof.md runs and prints what the page says."""

import pytest

from doc_examples import page_tests

pytest.importorskip("sampler._memprof", reason="the memprof engine is not built here")

test_the_page_has_checked_examples, test_example = page_tests("memprof.md", at_least=2)
