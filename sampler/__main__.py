"""``python -m sampler [options] script.py [args]``: an alias of the ``stackshot``
command (:mod:`stackshot.cli`).

The one place in the ``sampler`` package that reaches up to ``stackshot``: running
this module is a request for the whole front end.  ``import sampler`` never gets
here, so the sampler stays free of the analyzer.
"""

import sys

if __name__ == "__main__":
    from stackshot.cli import main

    sys.exit(main(prog="python -m sampler"))
