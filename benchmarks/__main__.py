"""``python -m benchmarks``: see :mod:`benchmarks.harness`."""

from .harness import main

main()
