"""``python -m stackshot [options] script.py [args]``: see :mod:`stackshot.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m stackshot"))
