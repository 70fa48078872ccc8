import os
import sys

import pytest

# doc_examples.page_tests defines test functions: their asserts should explain a failure
pytest.register_assert_rewrite("doc_examples")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
