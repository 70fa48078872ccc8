"""Put first on a child interpreter's ``PYTHONPATH`` by ``stackshot --subprocesses``
(see :mod:`stackshot.children`): the child profiles itself, then the interpreter's
own ``sitecustomize`` (if there is one) runs as it would have."""


def _run() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    # this directory leaves sys.path (the program must not see it), and the module
    # whose name this one took runs in its place
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
        if spec is not None and spec.loader is not None:
            real = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = real
            spec.loader.exec_module(real)
    except Exception:  # as site.py does: report, never stop the program
        import traceback

        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:", file=sys.stderr)
        traceback.print_exc()
    if os.environ.get("STACKSHOT_SUBPROCESSES"):
        try:
            from stackshot.children import bootstrap
        except ImportError:  # another Python, without stackshot: left unprofiled
            return
        bootstrap()


_run()
