"""The native engine names each sampled frame after the code object that was at its
address when the stack was read, even where code objects are freed and others made
in their memory (code made with exec, modules reloaded after an edit)."""
from __future__ import annotations

import gc
import sys
import threading
import time
import types

import pytest

import sampler

pytestmark = pytest.mark.engines("native")

_BODY = """
def {name}(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
"""


def _made(source: str, name: str) -> types.FunctionType:
    """A function made with exec, the only reference to it returned (taken out of
    its globals: a function in its own globals is a cycle, freed by a collection)."""
    namespace: dict = {"time": time}
    exec(compile(source, "made.py", "exec"), namespace)
    return namespace.pop(name)


def _callers_of(snaps, names: set) -> list[tuple[str, str]]:
    """(function, its caller) of each sample whose innermost frame is one of names."""
    pairs = []
    for sid in snaps.sample_stack:
        frames = snaps.stack_frames(sid) if sid else ()
        if len(frames) >= 2 and frames[0].name.rpartition(".")[2] in names:
            pairs.append((frames[0].name, frames[1].name))
    return pairs


def test_a_function_made_where_a_freed_one_was_is_named_for_itself():
    """Two functions made with exec take turns: each runs 30 ms and is dropped, and
    the next is made in its memory (the allocator hands the block straight back).
    The collector remembers what it read at each address; before it heard of code
    objects' ends it read each address again every 10 ms only, and 70 of 382 samples
    on 3.10 (104 of 437 on 3.11) were named after the other function. Hearing of
    them, one sample in a run still was, in 6 runs of 40 on 3.10 and about 1 in 25
    on 3.13: a function freed while its stack was read, its successor looked up in
    its place (now read again: codewatch.h), and callers read at an earlier moment
    than the frames above them by a copy held up for milliseconds, of the very
    sizes (now read again: callers_still_there in engine.c); 0 in 100 and 0 in 40
    since."""
    addresses = []

    def run_alpha() -> None:
        work = _made(_BODY.format(name="alpha"), "alpha")
        addresses.append(id(work.__code__))
        work(0.03)

    def run_omega() -> None:
        work = _made(_BODY.format(name="omega"), "omega")
        addresses.append(id(work.__code__))
        work(0.03)

    ctl = sampler.create_sampler(threading.current_thread(), 0.001)
    for _ in range(15):
        run_alpha()
        run_omega()
    ctl.stop()
    reused = sum(a == b for a, b in zip(addresses, addresses[1:]))
    if reused < 5:
        pytest.skip(f"the allocator put only {reused} of 29 functions where the one before was")
    pairs = _callers_of(ctl.get_snapshots(), {"alpha", "omega"})
    wrong = [p for p in pairs if p[1].rpartition(".")[2] != "run_" + p[0]]
    assert len(pairs) > 100, pairs
    assert wrong == [], f"{len(wrong)} of {len(pairs)} samples named after the other function"
    assert ctl.get_snapshots().runs[0].extra["code_watch"] is True
    forgotten = ctl._collector._engine.stats()["codes_forgotten"]
    assert forgotten >= reused, (forgotten, reused)


V1 = """
def hot(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        x = 1
"""
V2 = """
def hot(seconds):
    end = time.thread_time() + seconds



    while time.thread_time() < end:
        x = 1
"""


def test_an_edited_function_reloaded_gets_the_lines_it_has_now():
    """A module reloaded after an edit that moved its function's loop three lines
    down: the new code object has the old one's name, file and first line, and on
    3.11-3.13 the old one's memory. Its samples were filed at the old lines (and the
    names Python had for that address and fingerprint were never sent again)."""
    def run_first() -> None:
        _made(V1, "hot")(0.15)

    def run_second() -> None:
        _made(V2, "hot")(0.15)

    ctl = sampler.create_sampler(threading.current_thread(), 0.001)
    run_first()
    gc.collect()
    run_second()
    ctl.stop()
    snaps = ctl.get_snapshots()
    lines: dict = {"run_first": set(), "run_second": set()}
    for sid in snaps.sample_stack:
        frames = snaps.stack_frames(sid) if sid else ()
        if len(frames) >= 2 and frames[0].filename == "made.py":
            lines[frames[1].name.rpartition(".")[2]].add(frames[0].lineno)
    assert lines["run_first"] and lines["run_first"] <= {3, 4, 5}, lines
    assert lines["run_second"] and lines["run_second"] <= {3, 7, 8}, lines


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 has no qualified names to tell the two apart")
def test_a_code_object_that_agrees_in_every_fingerprinted_field_is_still_told_apart():
    """Two code objects made from one (``replace``, keeping its name, file, first
    line, arguments and line table objects), the second where the first was: the
    collector's fingerprint is the same, and only hearing of the first one's end
    tells it to send the second one's names. Python then has two copies for one
    address and fingerprint, and must drop the frames it made from the first (in its
    three caches) or the second is filed under the first one's name."""
    template = _made(_BODY.format(name="spin"), "spin")
    addresses = []

    def run(qualname: str) -> None:
        work = types.FunctionType(template.__code__.replace(co_qualname=qualname), template.__globals__)
        addresses.append(id(work.__code__))
        work(0.1)

    def run_first() -> None:
        run("first")

    def run_second() -> None:
        run("second")

    ctl = sampler.create_sampler(threading.current_thread(), 0.001)
    for _ in range(3):
        run_first()
        run_second()
    ctl.stop()
    if not any(a == b for a, b in zip(addresses, addresses[1:])):
        pytest.skip("the allocator never put one code object where the one before was")
    snaps = ctl.get_snapshots()
    pairs = []
    for sid in snaps.sample_stack:
        frames = snaps.stack_frames(sid) if sid else ()
        if len(frames) >= 3 and frames[0].name in ("first", "second"):
            pairs.append((frames[0].name, frames[2].name.rpartition(".")[2]))
    assert {p[0] for p in pairs} == {"first", "second"}, pairs
    wrong = [p for p in pairs if p[1] != "run_" + p[0]]
    assert wrong == [], f"{len(wrong)} of {len(pairs)} samples named after the other code object"
