"""CPU-bound pure Python at the bottom (and in the middle) of a 50-deep stack.

Three mutually recursive functions build the stack, each doing a little work of its
own on the way down, and three different leaves do most of the work.  Nothing here
is timed part by part, on purpose: this is the workload without a known truth,
where each profiler is compared with py-spy at 1000 Hz (total variation distance of
self time by function).
"""

from __future__ import annotations

from typing import Any, Callable

from . import seconds_per_unit

NAME = "deep"
DESCRIPTION = "pure Python, 50-deep mutual recursion, three kinds of leaf"
PARTS: tuple = ()
SINGLE_THREAD = True
DEPTH = 50


def deep_leaf_arith(k: int) -> int:
    total = 0
    for i in range(k):
        total += (i * i) % 7
    return total


def deep_leaf_text(k: int) -> int:
    parts = []
    for i in range(k // 4):
        parts.append(str(i))
    return len(",".join(parts).upper())


def deep_leaf_dict(k: int) -> int:
    d: dict = {}
    for i in range(k // 2):
        d[i & 1023] = d.get(i & 1023, 0) + i
    return len(d)


def _level_work(n: int) -> int:
    s = 0
    for i in range(20):
        s += i ^ n
    return s


def deep_a(n: int, leaf: Callable[[int], int], k: int) -> int:
    if n <= 0:
        return leaf(k)
    return _level_work(n) + deep_b(n - 1, leaf, k)


def deep_b(n: int, leaf: Callable[[int], int], k: int) -> int:
    if n <= 0:
        return leaf(k)
    s = 0
    for i in range(30):
        s += i * n
    return s + deep_c(n - 1, leaf, k)


def deep_c(n: int, leaf: Callable[[int], int], k: int) -> int:
    if n <= 0:
        return leaf(k)
    return deep_a(n - 1, leaf, k)


def deep_main(reps: int, k: int) -> int:
    total = 0
    for _ in range(reps):
        for leaf in (deep_leaf_arith, deep_leaf_text, deep_leaf_dict):
            total += deep_a(DEPTH, leaf, k)
    return total


def calibrate(seconds: float) -> dict:
    k = 20_000
    per_rep = seconds_per_unit(lambda reps: deep_main(reps, k), 10)
    return {"reps": max(1, round(seconds / per_rep)), "k": k}


def setup(params: dict) -> Any:
    return params


def run(state: Any) -> dict:
    deep_main(state["reps"], state["k"])
    return {}
