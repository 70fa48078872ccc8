"""``python -m sampler [options] script.py [args]``: see :mod:`sampler.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m sampler"))
