"""Running memprof programs in their own interpreter, and the statistics their tests use.

Every memprof test is a real program run by a fresh interpreter (the engine hooks the
allocators: a crash must not take pytest down). The program prints one JSON line last;
:func:`run_program` returns it decoded.

The bounds are derived from the sampling law: each allocated word is sampled with
probability ``rate`` independently, so the sampled words of ``W`` words are
``Binomial(W, rate)``. A bound of ``SIGMAS`` standard deviations fails a correct engine
with probability below 2e-9 (normal tail; the counts here are in the hundreds or more),
and a biased engine (off by a word per block, sampling blocks instead of words) falls
far outside it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

from run_helpers import repo_env

SIGMAS = 6.0

PRELUDE = textwrap.dedent("""
    import gc, json, sys, threading, _thread
    from sampler import memprof, _memprof

    def settle():
        '''Reach a safe point: a call, and backward jumps (eval-breaker checks).'''
        for _ in range(5):
            pass

    def kept_blocks(n, words):
        '''n bytes objects of exactly `words` words each, kept in a list.'''
        out = []
        for _ in range(n):
            out.append(bytes(8 * words - 33))
        return out
""")


def run_program(body: str, timeout: float = 120) -> dict:
    """Run PRELUDE + body in a fresh interpreter; the last line of its output is JSON."""
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=repo_env(), timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    result = json.loads(lines[-1])
    result["_stderr"] = proc.stderr
    return result


def binomial_bound(words: int, rate: float) -> tuple[float, float]:
    """The interval of SIGMAS standard deviations around the mean of Binomial(words, rate)."""
    mean = words * rate
    sd = math.sqrt(words * rate * (1 - rate))
    return mean - SIGMAS * sd, mean + SIGMAS * sd


def truncated_binomial_moments(n: int, p: float) -> tuple[float, float, float]:
    """Mean, variance and fourth central moment of Binomial(n, p) given at least one
    success: the law of ``n_samples`` for a sampled block of ``n`` words."""
    pmf = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]
    z = 1 - pmf[0]
    mean = sum(k * pmf[k] for k in range(1, n + 1)) / z
    var = sum((k - mean) ** 2 * pmf[k] for k in range(1, n + 1)) / z
    m4 = sum((k - mean) ** 4 * pmf[k] for k in range(1, n + 1)) / z
    return mean, var, m4
