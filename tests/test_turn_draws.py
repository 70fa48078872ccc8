"""The turns of greenlets between two samples, and their draws (``log_turns``,
``turn_length``, ``draw_turns``, ``draw_place``).

Beyond a few turns between two samples of a thread, the native engine files the CPU
of those in between in ``MERGED_TURNS`` runs of greenlets drawn in proportion to what
each used (``sampler/native_engine.py``). The merge and the draw are in C
(``sampler/_native/turnmerge.h``) with a Python twin (``sampler.greenlets``): both
are held here to the same answers, to each greenlet getting what it used on
average, and to one precise error on bad input. So is the draw of the place where a
turn no sample saw is filed (``draw_place``: C in the same file, its Python twin in
``sampler.greenlets``), and the reading of the turns between two samples from
a switch log (``log_turns``, ``turn_length``: C in the same file, their twins in
``sampler.greenlets``).
"""

from __future__ import annotations

import math
import random

import pytest

from sampler import greenlets as switches

from sampling_helpers import native_missing

TWINS = [pytest.param(switches.draw_turns_py, id="python"), pytest.param("c", id="c")]


def _native_twin(name: str):
    """The C one of ``name`` (skipped, or failed where it must be built, if absent)."""
    fn = getattr(switches, f"_native_{name}")
    if fn is None:
        native_missing(f"the C {name}")
    return fn


def _twin(which, name: str = "draw_turns"):
    """``which``, a Python twin, or, for ``"c"``, the C one of ``name``."""
    return _native_twin(name) if which == "c" else which


def _log(chance: random.Random, greenlets: int, entries: int, big: bool = False) -> list:
    """A switch log of ``entries`` switches among ``greenlets`` records: (wall ns,
    record, CPU ns), the clocks never going back."""
    records = [object() for _ in range(greenlets)]
    log, wall, cpu = [], 0, 0
    for _ in range(entries):
        wall += chance.randint(1, 50_000)
        cpu += chance.choice([0, chance.randint(0, 40_000), chance.randint(0, 10**9) if big else 7])
        log.append((wall, chance.choice(records), cpu))
    return log


def test_the_c_draw_and_its_python_twin_give_the_same_answers():
    """Random logs (turns of no CPU, one greenlet, hundreds of greenlets, clocks in
    the seconds), every stretch shape, 1 to 5 runs: the same lists, and never more
    CPU drawn than the turns used."""
    draw_c = _twin("c")
    chance = random.Random(9)
    for _ in range(3000):
        log = _log(chance, chance.choice([1, 2, 5, 40, 300]), chance.randint(1, 400), big=chance.random() < 0.3)
        i = chance.randint(1, len(log))
        j = chance.randint(i, len(log))
        keep, runs, point = chance.choice([0, 3, 8, 50]), chance.randint(1, 5), chance.random()
        c, py = draw_c(log, i, j, keep, runs, point), switches.draw_turns_py(log, i, j, keep, runs, point)
        assert c == py, (i, j, keep, runs, point)
        used = log[j - 1][2] - log[i][2] if j - i >= 2 else 0
        assert sum(turn[1] for turn in c) <= used and sum(turn[4] for turn in c) <= max(j - i - 1, 0)


@pytest.mark.parametrize("which", TWINS)
def test_each_greenlet_is_drawn_the_cpu_it_used_on_average(which):
    """Turns of 30 greenlets, some with 100 times the CPU of others: drawn in two
    runs, over 4,000 draws each greenlet's CPU drawn is within 3% of what it used,
    and one that used more than half of it is drawn every time."""
    draw = _twin(which)
    chance = random.Random(3)
    records = [object() for _ in range(30)]
    sizes = {rec: (100 if n < 3 else 1) * chance.randint(5, 10) for n, rec in enumerate(records)}
    log, cpu = [(0, records[0], 0)], 0
    for k in range(1, 301):
        rec = log[-1][1]
        cpu += sizes[rec] * 1000
        log.append((k * 1000, chance.choice(records), cpu))
    used = {rec: 0 for rec in records}
    for k in range(2, len(log)):
        used[log[k - 1][1]] += log[k][2] - log[k - 1][2]
    drawn = {rec: 0 for rec in records}
    rounds = 4000
    for _ in range(rounds):
        for rec, ns, turn_used, _last, _turns in draw(log, 1, len(log), 8, 2, chance.random()):
            drawn[rec] += ns
            assert turn_used == used[rec]
    for rec in records:
        if used[rec]:
            assert abs(drawn[rec] / rounds - used[rec]) < 0.03 * used[rec] + 0.002 * sum(used.values()), rec

    heavy = [object(), object()]  # the first used 0.9 of the turns' CPU
    log = [(0, heavy[0], 0), (1, heavy[0], 0), (2, heavy[1], 900), (3, heavy[0], 1000)]
    for _ in range(200):
        assert heavy[0] in [turn[0] for turn in draw(log, 1, 4, 0, 2, chance.random())]


@pytest.mark.parametrize("which", TWINS)
def test_a_stretch_without_turns_in_between_draws_nothing(which):
    """No turn between the first and the last (``j - i < 2``), or turns of no CPU:
    nothing drawn, and the entry past the log's end is never read (the C one read it
    once, and failed on what it found there)."""
    draw = _twin(which)
    rec = object()
    log = [(0, rec, 5), (1, rec, 7), (2, rec, 9)]
    for i, j in [(1, 1), (1, 2), (2, 3), (3, 3)]:
        assert draw(log, i, j, 0, 2, 0.5) == []
    assert draw([(0, rec, 5), (1, rec, 5), (2, rec, 5)], 1, 3, 0, 2, 0.5) == []
    assert draw(log, 1, 3, 0, 2, 0.5) == [[rec, 2, 2, 2, 1]]


@pytest.mark.parametrize("which", TWINS)
@pytest.mark.parametrize("args, message", [
    ((0, 2, 8, 2, 0.5), "need 1 <= i <= j <= len(log) (3), got i=0, j=2"),
    ((2, 1, 8, 2, 0.5), "need 1 <= i <= j <= len(log) (3), got i=2, j=1"),
    ((1, 4, 8, 2, 0.5), "need 1 <= i <= j <= len(log) (3), got i=1, j=4"),
    ((1, 3, -1, 2, 0.5), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got -1, 2 and 0.5"),
    ((1, 3, 8, 0, 0.5), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got 8, 0 and 0.5"),
    ((1, 3, 8, 2, 1.0), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got 8, 2 and 1.0"),
    ((1, 3, 8, 2, float("nan")), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got 8, 2 and nan"),
])
def test_bad_arguments_get_one_precise_error(which, args, message):
    draw = _twin(which)
    rec = object()
    with pytest.raises(ValueError) as caught:
        draw([(0, rec, 5), (1, rec, 7), (2, rec, 9)], *args)
    assert str(caught.value) == f"draw_turns: {message}"


def test_a_log_entry_that_is_not_a_switch_is_refused_not_read():
    """(The C one reads the log without the Python twin's checks of each item.)"""
    draw_c = _twin("c")
    rec = object()
    not_a_switch = "draw_turns: log entry 2 is not a (wall, record, cpu) tuple"
    for entry, message in [(None, not_a_switch), ((1, rec), not_a_switch),
                           ((1, rec, "x"), "draw_turns: log entry 2's CPU clock is not an integer")]:
        with pytest.raises(TypeError) as caught:
            draw_c([(0, rec, 5), (1, rec, 7), entry, (3, rec, 11)], 1, 4, 8, 2, 0.5)
        assert str(caught.value) == message


@pytest.mark.parametrize("which", TWINS)
def test_turns_of_few_greenlets_are_each_given_all_they_used(which):
    """At most ``keep`` greenlets between: nothing is drawn, each gets its own CPU
    (turns of no CPU, none), whatever the point."""
    draw = _twin(which)
    a, b, c = object(), object(), object()
    log = [(0, a, 0), (1, b, 10), (2, a, 25), (3, c, 45), (4, b, 45), (5, a, 80), (6, c, 81)]
    for point in (0.0, 0.3, 0.99):
        assert draw(log, 1, 7, 3, 2, point) == [[b, 50, 50, 5, 2], [a, 21, 21, 6, 2]]
    # (beyond keep: drawn, two runs of 35.5 ns; b's 50 of 71 holds both points)
    assert draw(log, 1, 7, 1, 2, 0.3) == [[b, 71, 50, 5, 2]]


LIKE = math.log(1.5)  # (the native engine's LIKE_TURN: turns within half again are alike)
PLACE_TWINS = [pytest.param(switches.draw_place_py, id="python"), pytest.param("c", id="c")]


def _places(chance: random.Random, n: int) -> list:
    """``n`` places seen running, each (stack, base, marks, record, log of its turn's
    CPU in us), as the native engine keeps them."""
    return [(k, 1000 + k, 0, None, math.log(chance.choice([1, 10, 14, 20, 30, 300, 5000]))) for k in range(n)]


def test_the_c_place_draw_and_its_python_twin_give_the_same_answers():
    """Random places, turn lengths and points (0, just under 1, and between): the
    same place, by identity."""
    draw_c = _native_twin("draw_place")
    chance = random.Random(5)
    for _ in range(5000):
        places = _places(chance, chance.randint(1, 12))
        used = chance.choice([0, 1, 9, 12, 15, 25, 400, 10**6])
        point = chance.choice([0.0, 1 - 2**-53, chance.random()])
        c = draw_c(places, used, LIKE, point)
        assert c is switches.draw_place_py(places, used, LIKE, point), (places, used, point)


@pytest.mark.parametrize("which", PLACE_TWINS)
def test_a_place_is_drawn_among_those_of_turns_like_the_one_filed(which):
    """Places of turns of 10, 14 and 300 us: a turn of 12 us draws among the first
    two alike (each half of the points), one of 250 the third only; a turn of no
    known length (0), among all three."""
    draw = _twin(which, "draw_place")
    places = [("short", 0, 0, None, math.log(10)), ("also short", 0, 0, None, math.log(14)),
              ("long", 0, 0, None, math.log(300))]
    like = LIKE
    points = [k / 100 for k in range(100)]
    assert [draw(places, 12, like, p)[0] for p in points] == ["short"] * 50 + ["also short"] * 50
    assert {draw(places, 250, like, p)[0] for p in points} == {"long"}
    assert [draw(places, 0, like, p)[0] for p in points] == ["short"] * 34 + ["also short"] * 33 + ["long"] * 33


@pytest.mark.parametrize("which", PLACE_TWINS)
@pytest.mark.parametrize("args, message", [
    (([], 5, 0.4, 0.5), "need places, like >= 0 and 0 <= point < 1, got 0 places, 0.4 and 0.5"),
    ((None, 5, 0.4, 1.0), "need places, like >= 0 and 0 <= point < 1, got 1 places, 0.4 and 1.0"),
    ((None, 5, -0.1, 0.5), "need places, like >= 0 and 0 <= point < 1, got 1 places, -0.1 and 0.5"),
    ((None, 5, 0.4, float("nan")), "need places, like >= 0 and 0 <= point < 1, got 1 places, 0.4 and nan"),
])
def test_a_bad_place_draw_gets_one_precise_error(which, args, message):
    draw = _twin(which, "draw_place")
    places, *rest = args
    with pytest.raises(ValueError) as caught:
        draw([(0, 0, 0, None, 1.0)] if places is None else places, *rest)
    assert str(caught.value) == f"draw_place: {message}"


def _clocked_log(chance: random.Random, greenlets: int, entries: int) -> list:
    """A switch log with wall clocks as perf_counter_ns() gives them (hours of
    uptime, below 2**53) and CPU clocks that never go back, some turns of no CPU."""
    log = _log(chance, greenlets, entries)
    start = chance.randint(10**12, 10**15)
    return [(start + wall, rec, cpu) for wall, rec, cpu in log]


def test_the_c_turns_and_their_python_twin_give_the_same_answers():
    """Random logs and pairs of CPU clocks (before the log, inside, past its end, a
    turn's own clock), few and many turns between, merged or not: the same turns,
    records by identity; and the same turn lengths at each clock."""
    log_c, length_c = _native_twin("log_turns"), _native_twin("turn_length")
    chance = random.Random(11)
    for _ in range(4000):
        log = _clocked_log(chance, chance.choice([1, 2, 5, 40]), chance.randint(1, 120))
        cpus = [entry[2] for entry in log]
        def clock():
            return chance.choice([-5, 0, chance.choice(cpus), chance.choice(cpus) + chance.randint(-999, 999),
                                  cpus[-1] + chance.randint(0, 99_999)])
        since, until = sorted((clock(), clock()))
        origin_us = log[0][0] / 1000 - chance.choice([0, 123.25, 5e6])
        keep, runs, point = chance.choice([0, 1, 3, 8]), chance.randint(1, 4), chance.random()
        c = log_c(log, since, until, origin_us, keep, runs, point)
        py = switches.log_turns_py(log, since, until, origin_us, keep, runs, point)
        assert c == py and all(a[0] is b[0] for a, b in zip(c, py)), (since, until, keep, runs, point)
        assert length_c(log, until) == switches.turn_length_py(log, until)


@pytest.mark.parametrize("which", ["python", "c"])
def test_the_turns_between_two_samples_are_read_from_the_log(which):
    """Three greenlets taking turns: each turn's CPU between the two clocks, where it
    ended (us from the origin), and turns of no CPU left out but for the last; beyond
    ``keep``, the turns in between one per greenlet, in the order they last ended;
    none where the log does not reach back or shows no switch."""
    log_turns = switches.log_turns_py if which == "python" else _native_twin("log_turns")
    turn_length = switches.turn_length_py if which == "python" else _native_twin("turn_length")
    a, b, c = object(), object(), object()
    us = 1000
    log = [(1000 * us, a, 0), (1010 * us, b, 10 * us), (1020 * us, a, 20 * us), (1021 * us, c, 20 * us),
           (1030 * us, b, 29 * us), (1040 * us, a, 39 * us)]
    # from 5 us into a's first turn to 35 us, inside the last one of b
    assert log_turns(log, 5 * us, 35 * us, 900.0, 8, 2, 0.5) == [
        (a, 5, 110, 5), (b, 10, 120, 10), (c, 9, 130, 9), (b, 6, 0, 6)]
    # beyond keep: the 19 us of the turns between (b 10, a none, c 9) drawn in two
    # runs of 9.5 at 4.75 and 14.25 us (b's and c's), each with its one turn's CPU
    assert log_turns(log, 5 * us, 35 * us, 900.0, 1, 2, 0.5) == [
        (a, 5, 110, 5), (b, 9, 120, 10), (c, 9, 130, 9), (b, 6, 0, 6)]
    # in one run, at 1.9 us: b's
    assert log_turns(log, 5 * us, 35 * us, 900.0, 0, 1, 0.1) == [(a, 5, 110, 5), (b, 19, 120, 10), (b, 6, 0, 6)]
    assert log_turns(log, 45 * us, 50 * us, 900.0, 8, 2, 0.5) == []  # (past the log's end)
    assert log_turns(log, 30 * us, 35 * us, 900.0, 8, 2, 0.5) == []  # (no switch in between)
    assert log_turns([], 0, 5, 0.0, 8, 2, 0.5) == [] == log_turns([(0, a)], 0, 5, 0.0, 8, 2, 0.5)
    assert [turn_length(log, t * us) for t in (-1, 5, 20, 25, 39, 50)] == [0, 10, 9, 9, 0, 11]


def test_bad_turn_reads_get_one_precise_error():
    """Bad arguments, and a log entry that is not a switch (the C one reads the log
    without the twin's checks of each item)."""
    log_c, length_c = _native_twin("log_turns"), _native_twin("turn_length")
    rec = object()
    for args, message in [((8, 0, 0.5), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got 8, 0 and 0.5"),
                          ((-1, 2, 0.5), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got -1, 2 and 0.5"),
                          ((8, 2, 1.0), "need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got 8, 2 and 1.0")]:
        for log_turns in (log_c, switches.log_turns_py):
            with pytest.raises(ValueError) as caught:
                log_turns([(0, rec, 5)], 0, 9, 0.0, *args)
            assert str(caught.value) == f"log_turns: {message}"
    good = [(0, rec, 5), (1, rec, 7), (2, rec, 9), (3, rec, 11)]
    for k, entry, error, message in [
            (2, None, TypeError, "log entry 2 is not a (wall, record, cpu) tuple"),
            (2, (2, rec), TypeError, "log entry 2 is not a (wall, record, cpu) tuple"),
            (2, (2, rec, "x"), TypeError, "log entry 2's CPU clock is not an integer"),
            (1, ("x", rec, 7), TypeError, "log entry 1's wall clock is not an integer"),
            (1, (10**400, rec, 7), OverflowError, "int too large to convert to float")]:
        log = good[:k] + [entry] + good[k + 1:]
        with pytest.raises(error) as caught:
            log_c(log, 6, 10, 0.0, 8, 2, 0.5)
        assert str(caught.value) in (f"log_turns: {message}", message)
    with pytest.raises(TypeError) as caught:
        length_c(good[:1] + [(1, rec, None)] + good[2:], 8)
    assert str(caught.value) == "turn_length: log entry 1's CPU clock is not an integer"


def test_a_place_that_is_not_one_is_refused_not_read():
    """(The C one reads the turn length without calling Python: a number or nothing.)"""
    draw_c = _native_twin("draw_place")
    good = (0, 0, 0, None, 1.0)
    for bad, message in [((0, 0, 0), "place 1 is not a tuple of 5 or more items"),
                         ((0, 0, 0, None, "2.0"), "place 1's turn length is not a number")]:
        with pytest.raises(TypeError) as caught:
            draw_c([good, bad], 7, LIKE, 0.5)
        assert str(caught.value) == f"draw_place: {message}"
    assert draw_c([good, (1, 0, 0, None, 3)], 7, LIKE, 0.5)[0] == 1  # (an int will do)
