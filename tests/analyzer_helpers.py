"""Helpers shared by the analyzer tests: Racket's invariants and random sample rows."""

from __future__ import annotations

import math


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def assert_balanced(p):
    """Racket's invariants: edges on each side of a node sum to its total."""
    for n in p.nodes:
        assert close(sum(e.caller_time for e in n.callers), n.total), n
        assert close(sum(e.callee_time for e in n.callees), n.total), n
    assert close(sum(e.caller_time for e in p.root.callers), p.total_time)
    assert close(sum(e.callee_time for e in p.root.callees), p.total_time)
    assert close(sum(n.self for n in p.nodes), p.total_time)
    assert close(sum(p.thread_times.values()), p.total_time)
    for n in (p.root, *p.nodes):
        assert [e.caller_time for e in n.callers] == sorted((e.caller_time for e in n.callers), reverse=True)
        assert [e.callee_time for e in n.callees] == sorted((e.callee_time for e in n.callees), reverse=True)
        for e in n.callers:
            assert e.callee is n and e in e.caller.callees
        for e in n.callees:
            assert e.caller is n and e in e.callee.callers


def random_rows(rng, n_samples, n_threads=3, n_funcs=8, depth=6, idle=0.1):
    clocks = {t: [0.0, 0.0] for t in range(n_threads)}
    rows = []
    for k in range(n_samples):
        t = k if k < n_threads else rng.randrange(n_threads)  # thread label == thread id
        clocks[t][0] += rng.choice([0.0, 0.001, 0.002, 0.0035])
        clocks[t][1] += 0.004
        if rng.random() < idle:
            stack = []
        else:
            stack = [f"f{rng.randrange(n_funcs)}" for _ in range(rng.randint(1, depth))]
        rows.append((t, round(clocks[t][0], 6), round(clocks[t][1], 6), stack))
    return rows
