"""Racket's own analyzer examples, fed in Racket's raw shape, must give Racket's numbers.

The expected values are those of Racket's profile-test suite (analyze.rkt,
topsort.rkt and the ``get-times`` checks in utils.rkt), restated in Python.
"""

from __future__ import annotations

import pytest

from analyzer import analyze_samples
from analyzer.model import Edge, Node
from analyzer.topo import topological_layers
from analyzer.weights import time_weights

A, B, C = ("A", None), ("B", None), ("C", None)


def racket(cpu, *rows):
    """Racket's test helper: rows oldest first, frames outermost first -> the raw shape."""
    return (cpu, [(r[0], r[1], *reversed(r[2:])) for r in reversed(rows)])


def name(node):
    return "*" if node.is_root else node.id


def sexpr(profile):
    """Racket's profile->sexpr, as nested tuples."""
    def edges(node, attr, time):
        return [(name(e.caller), "->", name(e.callee), getattr(e, time), e.total)
                for e in getattr(node, attr)]

    def node_(n):
        return (name(n), n.total, n.self, edges(n, "callers", "caller_time"),
                edges(n, "callees", "callee_time"), n.thread_ids)

    return (profile.total_time, profile.sample_number, profile.cpu_time, profile.thread_times,
            [node_(n) for n in (profile.root, *profile.nodes)])


def test_two_samples_of_one_function():
    p = analyze_samples(racket(10, [0, 0, A], [0, 1, A]))
    assert sexpr(p) == (2, 2, 10, {0: 2}, [
        ("*", 2, 0, [("A", "->", "*", 2, 2)], [("*", "->", "A", 2, 2)], []),
        ("A", 2, 2, [("*", "->", "A", 2, 2)], [("A", "->", "*", 2, 2)], [0]),
    ])
    assert p.unit == "ms"  # the raw shape keeps Racket's unit


def test_different_caller_and_callee_times():
    p = analyze_samples(racket(10, [0, 0, A, B, A], [0, 1, A, B, A]))
    got = sexpr(p)
    assert got[:4] == (2, 2, 10, {0: 2})
    star, a, b = got[4]
    assert star == ("*", 2, 0, [("A", "->", "*", 2, 2)], [("*", "->", "A", 2, 2)], [])
    assert a[:3] == ("A", 2, 2)
    assert sorted(a[3]) == sorted([("B", "->", "A", 1, 2), ("*", "->", "A", 1, 2)])
    assert sorted(a[4]) == sorted([("A", "->", "B", 1, 2), ("A", "->", "*", 1, 2)])
    assert b == ("B", 2, 0, [("A", "->", "B", 2, 2)], [("B", "->", "A", 2, 2)], [0])


def test_recursion_through_two_callees():
    p = analyze_samples(racket(10, [0, 0, A, B, A], [0, 1, A, C, A], [0, 2, A, C, A],
                               [0, 3, A, C, A]))
    total, samples, cpu, tt, nodes = sexpr(p)
    assert (total, samples, cpu, tt) == (4, 4, 10, {0: 4})
    assert [n[0] for n in nodes] == ["*", "A", "C", "B"]
    star, a, c, b = nodes
    assert star == ("*", 4, 0, [("A", "->", "*", 4, 4)], [("*", "->", "A", 4, 4)], [])
    assert a == ("A", 4, 4,
                 [("*", "->", "A", 2, 4), ("C", "->", "A", 1.5, 3), ("B", "->", "A", 0.5, 1)],
                 [("A", "->", "*", 2, 4), ("A", "->", "C", 1.5, 3), ("A", "->", "B", 0.5, 1)],
                 [0])
    assert c == ("C", 3, 0, [("A", "->", "C", 3, 3)], [("C", "->", "A", 3, 3)], [0])
    assert b == ("B", 1, 0, [("A", "->", "B", 1, 1)], [("B", "->", "A", 1, 1)], [0])


@pytest.mark.parametrize("times, weights", [
    ([10, 20], [10, 10]),
    ([10, 20, 60], [10, 25, 40]),
    ([10, 20, 30, 40], [10, 10, 10, 10]),
    ([10, 20, 60, 80], [10, 25, 30, 20]),
])
def test_get_times(times, weights):
    assert time_weights(times, "midpoint") == weights


def test_get_times_drops_a_lone_sample():
    assert time_weights([], "midpoint") is None
    assert time_weights([10], "midpoint") is None


def test_lone_sample_thread_is_dropped_but_listed():
    p = analyze_samples((5, [(1, 7, A), (0, 1, B), (0, 0, B)]))
    assert p.thread_times == {0: 2, 1: 0}
    assert [n.id for n in p.nodes] == ["B"]
    assert p.sample_number == 3


# -- topological sort (topsort.rkt) -------------------------------------------------

def arrow_times(tok):
    """``->`` is 1->1, ``N->`` is N->N, ``a->b``: callee time a, caller time b."""
    left, _, right = tok.partition("->")
    return int(right or left or 1), int(left or 1)  # (caller_time, callee_time)


def sort_graph(*chains):
    nodes: dict[str, Node] = {}

    def node(n):
        if n not in nodes:
            nodes[n] = Node.make_root() if n == "*" else Node(n, None)
        return nodes[n]

    node("*")
    seen = set()
    for chain in chains:
        toks = chain.split()
        for i in range(0, len(toks) - 2, 2):
            src, arrow, dst = toks[i], toks[i + 1], toks[i + 2]
            assert (src, dst) not in seen, f"{src}->{dst} twice"
            seen.add((src, dst))
            caller_time, callee_time = arrow_times(arrow)
            e = Edge(0, node(src), caller_time, node(dst), callee_time)
            node(src).callees.append(e)
            node(dst).callers.append(e)
    others = [n for k, n in nodes.items() if k != "*"]
    layers = topological_layers(nodes["*"], others)
    assert sorted(n.id for layer in layers for n in layer) == sorted(n.id for n in others)
    return [{n.id for n in layer} for layer in layers]


def test_topsort_root_alone():
    assert topological_layers(Node.make_root(), []) == []


@pytest.mark.parametrize("chains, valid", [
    (["* -> A"], [["A"]]),
    (["* -> A -> B -> *"], [["A", "B"]]),
    (["* -> A -> *", "* -> B -> *", "A -> A"], [["A B"]]),
    (["* -> A -> B -> A"], [["A", "B"], ["B", "A"]]),
    (["* 2->1 A 1->2 B 2->1 A 1->2 *"], [["A", "B"], ["B", "A"]]),
    (["* -> A 2-> B -> A"], [["A", "B"]]),
    (["* -> A 2-> B 3-> A"], [["B", "A"]]),
    (["* -> A -> B -> C", "* -> C"], [["A", "B", "C"]]),
    (["* -> A -> B -> C -> *", "* -> C"], [["A", "B", "C"]]),
    (["* -> X -> A -> B -> C", "X -> C"], [["X", "A", "B", "C"]]),
    (["* -> A -> B -> C -> *", "* -> C 3-> B -> *"], [["A C", "B"]]),
    (["* -> A -> B -> A", "* -> C"], [["A C", "B"], ["B C", "A"]]),
    (["* -> A -> B -> *", "* -> B -> A -> *"], [["A", "B"], ["B", "A"]]),
    (["* -> A", "* -> B", "B -> B"], [["A B"]]),
    (["* -> A", "* -> B -> C", "* -> C -> B"], [["A B", "C"], ["A C", "B"]]),
    (["* -> A -> B -> C -> D -> *", "* -> X -> D"], [["X A", "B", "C", "D"]]),
])
def test_topsort(chains, valid):
    """Each valid answer is a list of levels, a level being space-separated names."""
    got = sort_graph(*chains)
    assert got in [[set(level.split()) for level in v] for v in valid], got


def test_topsort_several_chains():
    got = sort_graph("* -> A1 -> A2 -> A3 -> A4 -> A5", "* -> B1 -> B2 -> B3", "* -> C1",
                     "* -> D1 -> D2 -> D3 -> D4")
    assert got == [{"A1", "B1", "C1", "D1"}, {"A2", "B2", "D2"}, {"A3", "B3", "D3"},
                   {"A4", "D4"}, {"A5"}]


def test_topsort_layers_sorted_by_total():
    root = Node.make_root()
    light, heavy = Node("light", None, total=1), Node("heavy", None, total=5)
    for n in (light, heavy):
        e = Edge(1, root, 1, n, 1)
        root.callees.append(e)
        n.callers.append(e)
    assert topological_layers(root, [light, heavy]) == [[heavy, light]]


def test_topsort_is_near_linear_on_a_long_cycle():
    # a ring of 20k nodes with no source or sink: every step needs the best-ratio
    # choice; the old quadratic scan would do 2e8 ratio computations here.
    root = Node.make_root()
    ring = [Node(f"f{i}", None, total=1) for i in range(20000)]
    for i, n in enumerate(ring):
        m = ring[(i + 1) % len(ring)]
        e = Edge(1, n, 1 + i % 3, m, 1 + i % 5)
        n.callees.append(e)
        m.callers.append(e)
    layers = topological_layers(root, ring)
    assert sum(map(len, layers)) == len(ring)
