"""Every example of scribblings/exports.md runs and prints what the page says."""

from doc_examples import page_tests

test_the_page_has_checked_examples, test_example = page_tests("exports.md", at_least=8)
