"""``python -m analyzer FILE [FILE ...]``: see :mod:`analyzer.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m analyzer"))
