"""Finding the real consumers the export tests drive, or saying why a test cannot run.

On a developer's machine a missing consumer (Chromium, go, gprof2dot …) skips the
test with the reason and the command that installs it.  CI sets
``STACKSHOT_REQUIRE_CONSUMERS=1`` and installs them all, so there a missing one is a
failure: those tests must never silently skip in CI.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("STACKSHOT_REQUIRE_CONSUMERS") == "1":
        pytest.fail(f"{reason} -- required when STACKSHOT_REQUIRE_CONSUMERS=1", pytrace=False)
    pytest.skip(reason)


def need_module(name: str) -> ModuleType:
    """Import a test-only package, or skip/fail naming the pip package to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        unavailable(f"{name} is not installed (pip install {name})")


def need_program(name: str, apt_package: str) -> str:
    """The path of a program, or skip/fail naming the Debian package to install."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (apt-get install {apt_package})")
    return path
