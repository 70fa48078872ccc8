"""The layers point down only: ``stackshot`` uses ``sampler`` and ``analyzer``;
``sampler`` imports nothing of either, not even lazily.

Two checks, because each misses what the other sees: importing every sampler module
in a fresh interpreter catches an import hidden behind a helper, and reading the
source catches an import inside a function that importing alone never runs.
"""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys

from run_helpers import REPO, repo_env

SAMPLER = os.path.join(REPO, "sampler")
UPPER = ("analyzer", "stackshot")
# The two aliases that exist so that old command names keep working; each runs only
# when asked for the front end (`python -m sampler`, `%load_ext sampler`).
ALLOWED = {("__main__.py", "<module>"), ("__init__.py", "load_ipython_extension")}


def sampler_modules() -> list:
    return sorted("sampler." + m.name for m in pkgutil.iter_modules([SAMPLER]) if m.name != "__main__")


def test_importing_every_sampler_module_loads_neither_analyzer_nor_stackshot():
    modules = sampler_modules()
    assert "sampler.controller" in modules and "sampler.snapshot" in modules
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('analyzer', 'stackshot')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=repo_env(), timeout=120, check=True).stdout
    assert out.strip() == "[]"


def _imports(tree: ast.AST):
    """(module imported, enclosing function name or '<module>', line) for every import,
    including ``importlib.import_module('x')`` and ``__import__('x')`` with a literal."""
    def walk(node: ast.AST, where: str):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield a.name, where, child.lineno
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module, where, child.lineno
            elif (isinstance(child, ast.Call) and child.args
                  and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)
                  and ast.unparse(child.func) in ("importlib.import_module", "import_module",
                                                  "__import__")):
                yield child.args[0].value, where, child.lineno
            yield from walk(child, inner)
    yield from walk(tree, "<module>")


def test_no_sampler_source_imports_the_upper_layers():
    found = []
    for name in sorted(os.listdir(SAMPLER)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(SAMPLER, name), encoding="utf-8").read())
        for module, where, line in _imports(tree):
            if module.split(".")[0] in UPPER and (name, where) not in ALLOWED:
                found.append(f"sampler/{name}:{line} ({where}) imports {module}")
    assert found == []


def test_the_static_check_would_see_a_lazy_import():
    tree = ast.parse("def f():\n    from analyzer import x\n    importlib.import_module('stackshot.cli')\n")
    assert [(m, w) for m, w, _ in _imports(tree)] == [("analyzer", "f"), ("stackshot.cli", "f")]


def test_import_stackshot_gives_the_one_step_entry_points():
    code = ("import stackshot, sys; "
            "print(all(callable(getattr(stackshot, n)) for n in "
            "('profile_thunk', 'profile', 'load_ipython_extension')), 'analyzer' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=repo_env(), timeout=120, check=True).stdout
    assert out.split() == ["True", "True"]


def test_the_old_names_point_at_their_new_home():
    import sampler

    try:
        sampler.profile_thunk
    except AttributeError as e:
        assert "from stackshot import profile_thunk" in str(e)
    else:
        raise AssertionError("sampler.profile_thunk should have moved")
