"""Making this process refuse system calls, as a container's seccomp profile does.

Some container runtimes refuse ``process_vm_readv`` (the native engine's way of
reading its own memory without faulting on freed frames), and some also keep
``/proc/self/mem`` from it; Docker's default profile refuses ``perf_event_open``
(the switch hook's way of knowing the CPU clock without a system call). Tests of what the engine does then install the same
kind of filter in a child process: :func:`refuse` makes the named system calls fail
with ``EPERM`` in the calling thread and every thread it starts from then on (call
it before any other thread starts). The filter is for the running machine's
architecture only; elsewhere :func:`refuse` raises ``OSError`` and the test skips.
:func:`run_refusing` runs a test's code in such a child.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import platform
import struct
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

# (audit architecture, {system call: number}) per machine
_TABLES = {
    "x86_64": (0xC000003E, {"process_vm_readv": 310, "pread64": 17, "perf_event_open": 298}),
    "aarch64": (0xC00000B7, {"process_vm_readv": 270, "pread64": 67, "perf_event_open": 241}),
}
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_ABS_W, _JEQ_K, _RET_K = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def refuse(*names: str) -> None:
    """Make the system calls ``names`` fail with EPERM from now on, in this thread and
    the threads it starts; ``OSError`` where that cannot be done here."""
    table = _TABLES.get(platform.machine())
    if table is None:
        raise OSError(f"no system call table for {platform.machine()}")
    arch, numbers = table
    unknown = [n for n in names if n not in numbers]
    if unknown:
        raise ValueError(f"no number known for {', '.join(unknown)}")
    n = len(names)

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    # another architecture's calls pass; each named call jumps to the refusal
    program = [op(_LD_ABS_W, 0, 0, _ARCH), op(_JEQ_K, 0, n + 1, arch), op(_LD_ABS_W, 0, 0, _NR)]
    program += [op(_JEQ_K, n - j, 0, numbers[name]) for j, name in enumerate(names)]
    program += [op(_RET_K, 0, 0, _ALLOW), op(_RET_K, 0, 0, _ERRNO | errno.EPERM)]
    code = ctypes.create_string_buffer(b"".join(program))
    prog = _Program(len(program), ctypes.cast(code, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) refused")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) refused")


@functools.lru_cache(maxsize=None)
def can_refuse() -> bool:
    """Whether :func:`refuse` works here (tried in a child: a filter cannot be taken
    back)."""
    if platform.machine() not in _TABLES:
        return False
    code = f"import sys; sys.path.insert(0, {HERE!r})\n" \
           "import seccomp_helpers; seccomp_helpers.refuse('process_vm_readv')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


def run_refusing(refused: tuple, body: str) -> dict:
    """Run ``body`` (which prints one JSON line last) in a child whose system calls
    ``refused`` fail with EPERM from its start (this directory on its path); its JSON,
    with its ``stderr``. Skips where no filter can be made."""
    import pytest  # (here: the stress scripts import this module without pytest's machinery)

    from run_helpers import repo_env

    code = (f"import json, sys\nsys.path.insert(0, {HERE!r})\nimport seccomp_helpers\n"
            f"try:\n    seccomp_helpers.refuse(*{refused!r})\n"
            "except OSError as exc:\n    print(json.dumps({'skip': str(exc)}))\n    sys.exit(0)\n"
            + textwrap.dedent(body))
    env = {k: v for k, v in repo_env().items() if k != "STACKSHOT_ENGINE"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(f"no seccomp filter here: {out['skip']}")
    out["stderr"] = proc.stderr
    return out
