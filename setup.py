"""Build script: the pure-Python packages plus stackshot's optional C extensions.

The extensions let the sampler read other threads' frames without the GIL (and,
later, hook the allocators). They are compiled by the machine's own compiler when
the package is installed (``pip install -e .`` or ``pip install .``). Where one cannot
be built (no compiler, no Python headers, an unsupported interpreter), installation
still succeeds, a warning says why, and stackshot runs its pure-Python engine.
Setting ``STACKSHOT_NO_EXTENSION=1`` skips the extensions on purpose (to test that path).
Nothing is ever downloaded.
"""

import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The C extensions, one entry each: (module name, files); .c files are compiled,
# .h files are dependencies (a change rebuilds the module).
EXTENSIONS = [
    ("sampler._native", ["sampler/_native/engine.c", "sampler/_native/pyframes.h",
                         "sampler/_native/saferead.h", "sampler/_native/markstacks.h",
                         "sampler/_native/shadowstacks.h", "sampler/_native/threadrecords.h",
                         "sampler/_native/gchook.h", "sampler/_native/gilholder.h",
                         "sampler/_native/threadwatch.h", "sampler/_native/switching.h",
                         "sampler/_native/switchhook.h", "sampler/_native/switchclock.h",
                         "sampler/_native/nsclock.h", "sampler/_native/turnmerge.h",
                         "sampler/_native/codewatch.h"]),
    ("sampler._memprof", ["sampler/_memprof/memprof.c", "sampler/_native/pyframes.h",
                          "sampler/_native/saferead.h"]),
]


def _supported() -> str:
    """Why the extensions cannot be built here, or '' when they can be tried."""
    if os.environ.get("STACKSHOT_NO_EXTENSION") == "1":
        return "STACKSHOT_NO_EXTENSION=1 is set"
    if platform.python_implementation() != "CPython":
        return f"{platform.python_implementation()} is not CPython"
    if not (3, 10) <= sys.version_info[:2] <= (3, 13):
        return f"CPython {sys.version_info[0]}.{sys.version_info[1]} is not one of 3.10-3.13"
    if not sys.platform.startswith("linux"):
        return f"the native engine supports Linux only, not {sys.platform}"
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return "a free-threaded build (the native engine needs the GIL build's layout)"
    return ""


class OptionalBuildExt(build_ext):
    """Build each extension if possible; never fail the installation over one."""

    def run(self) -> None:
        reason = _supported()
        if reason:
            self._warn(f"not building the C extensions: {reason}")
            return
        try:
            super().run()
        except Exception as exc:  # the compiler itself is missing, say
            self._warn(f"the C extensions could not be built ({exc})")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(f"{ext.name} could not be built ({exc})")

    @staticmethod
    def _warn(message: str) -> None:
        sys.stderr.write(f"WARNING: stackshot: {message}; the pure-Python engine will be used.\n")


setup(
    ext_modules=[
        Extension(name, sources=[f for f in files if f.endswith(".c")],
                  depends=[f for f in files if f.endswith(".h")],
                  extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-missing-field-initializers"])
        for name, files in EXTENSIONS
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
