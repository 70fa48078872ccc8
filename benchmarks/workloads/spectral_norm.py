"""The spectral-norm kernel's shape: a tiny function called from nested loops.

``sn_eval_a(i, j)`` is one line of arithmetic, called n² times per product by
``sn_times_u`` and ``sn_times_transposed_u``, which ``sn_times_ata`` chains.  Where
a GIL-taking collector's samples land here is decided by the eval breaker (function
entries, loop back-edges), not by where time goes: DESIGN.md measured a ~37-point
TVD from an external sampler on code like this.  No part is timed (timing a call of
a few hundred nanoseconds would change it): the workload is judged against py-spy
at 1000 Hz, which reads the stacks from outside, beside py-spy's own TVD at the row's
rate (py-spy-200's for 5 ms, py-spy-1000's run to run for 1 ms).
"""

from __future__ import annotations

from typing import Any

from . import seconds_per_unit

NAME = "spectral_norm"
DESCRIPTION = "spectral-norm shaped: a one-line sn_eval_a called n² times from loops"
PARTS: tuple = ()
SINGLE_THREAD = True
N = 60


def sn_eval_a(i: int, j: int) -> float:
    return 1.0 / ((i + j) * (i + j + 1) // 2 + i + 1)


def sn_times_u(u: list) -> list:
    # explicit loops, no comprehensions: profilers name a comprehension's frame differently
    # (`<genexpr>` or `sn_times_u.<locals>.<genexpr>`), which would count as disagreement
    out = []
    for i in range(len(u)):
        s = 0.0
        for j, u_j in enumerate(u):
            s += sn_eval_a(i, j) * u_j
        out.append(s)
    return out


def sn_times_transposed_u(u: list) -> list:
    n = len(u)
    out = []
    for i in range(n):
        s = 0.0
        for j in range(n):
            s += sn_eval_a(j, i) * u[j]
        out.append(s)
    return out


def sn_times_ata(u: list) -> list:
    return sn_times_transposed_u(sn_times_u(u))


def sn_norm(reps: int, n: int) -> float:
    u = [1.0] * n
    v = u
    for _ in range(reps):
        v = sn_times_ata(u)
        u = sn_times_ata(v)
    vbv = vv = 0.0
    for a, b in zip(u, v):
        vbv += a * b
        vv += b * b
    return (vbv / vv) ** 0.5


def calibrate(seconds: float) -> dict:
    per_rep = seconds_per_unit(lambda reps: sn_norm(reps, N), 3)
    return {"reps": max(1, round(seconds / per_rep)), "n": N}


def setup(params: dict) -> Any:
    return params


def run(state: Any) -> dict:
    sn_norm(state["reps"], state["n"])
    return {}
