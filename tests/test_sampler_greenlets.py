"""Greenlets and gevent, for real: the collector is an OS thread, a greenlet is
sampled only while it runs."""

import gc
import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from typing import Any

import greenlet
import pytest

from analyzer import sample_weights
from sampler import ALL_THREADS, create_sampler

from sampling_helpers import (native_missing, spin, spin_sampled, spin_until_sampled, switch_error_margin,
                              wait_until)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _no_greenlet_left_suspended():
    """Greenlets a test leaves suspended are killed when a collection finds them:
    collect before and after each test, so that never happens in a later test's
    sampler (seen on 3.13: a previous test's greenlet, unwinding, filed as a fourth
    greenlet of the three-greenlet test, 1 run in 4)."""
    gc.collect()
    yield
    gc.collect()


def test_a_tracked_greenlet_is_sampled_only_while_it_runs():
    # Deterministic on a loaded machine: no count of samples in a fixed time.  Each
    # turn of the tracked greenlet runs until the sampler has recorded 3 more samples
    # (at least 2 of them while it ran: one more may be the idle marker of the tick
    # that saw it switched out); the other greenlet's turns are never sampled.
    ctl = None
    rounds = 12

    def grow_by(n):
        goal = len(ctl.get_snapshots()) + n
        wait_until(lambda: spin(0.002) is not None and len(ctl.get_snapshots()) >= goal,
                   what=f"{goal} samples")

    def tracked_work():
        main.switch()  # started before the sampler: it knows where the greenlet lives
        for _ in range(rounds):
            grow_by(3)
            main.switch()

    def other_work():
        for _ in range(rounds):
            spin(0.004)
            main.switch()

    main = greenlet.getcurrent()
    tracked = greenlet.greenlet(tracked_work)
    other = greenlet.greenlet(other_work)
    tracked.switch()
    ctl = create_sampler(tracked, 0.0005)
    tracked.switch()
    # it ran and was sampled; now it is switched out: let the sampler tick (however
    # loaded the machine), so that it sees it switched out
    ticks = ctl.get_snapshots().runs[0].ticks
    wait_until(lambda: ctl.get_snapshots().runs[0].ticks > ticks + 2, what="ticks")
    while not tracked.dead:
        if not other.dead:
            other.switch()
        tracked.switch()
    ctl.stop()
    snaps = ctl.get_snapshots()
    assert sum(1 for s in snaps.sample_stack if s) >= 2 * rounds
    assert {t.kind for t in snaps.threads} == {"greenlet"}
    seen = set()
    for sid in snaps.sample_stack:
        names = [f.name for f in snaps.stack_frames(sid)]
        seen.update(names)
        assert "other_work" not in names
        if names:
            assert names[-1].endswith("tracked_work"), "a greenlet's stack ends at its own run"
    assert any(n.endswith("tracked_work") for n in seen)
    # while it was switched out, idle markers (stack 0) closed its intervals
    assert 0 in set(snaps.sample_stack)


def test_tracking_the_current_greenlet_from_inside_it():
    def body():
        ctl = create_sampler(greenlet.getcurrent(), 0.001)
        spin_until_sampled(ctl, 12)  # (not a fixed time: a loaded machine samples less)
        ctl.stop()
        return ctl.get_snapshots()

    snaps = greenlet.greenlet(body).switch()
    assert len(snaps) > 10
    assert any(f.name.endswith("body") for f in snaps.frames)


@pytest.mark.parametrize("beside_a_thread_sampler", [False, True])
def test_a_greenlet_tracked_before_it_starts_is_found_when_it_runs(beside_a_thread_sampler):
    """Never switched out, never found switched out. Beside a sampler of its whole
    thread, whose switch hook logs the switch into it: that switch comes before the
    greenlet's first sample, not between two of its samples. (Taken for one, it put
    an idle marker first, every time, on the native engine; a CI run on 3.12 found
    one without the second sampler, its hook's origin not found.)"""
    def never_yields():
        spin_until_sampled(ctl, 12)

    whole_thread = create_sampler(threading.current_thread(), 0.05) if beside_a_thread_sampler else None
    try:
        g = greenlet.greenlet(never_yields)
        ctl = create_sampler(g, 0.001)
        g.switch()
        ctl.stop()
    finally:
        if whole_thread is not None:
            whole_thread.stop()
    snaps = ctl.get_snapshots()
    assert len(snaps) > 10
    stacks = [[f.name for f in snaps.stack_frames(s)] for s in snaps.sample_stack]
    assert all(stack and stack[-1].endswith("never_yields") for stack in stacks), stacks[:3]


def _work_in_a_greenlet_between_sleeps(work, rounds: int) -> None:
    """``rounds`` times: switch to a greenlet that runs ``work`` and switches back,
    then sleep 2 ms (the greenlet is left suspended, for the autouse fixture)."""
    def worker_loop() -> None:
        while True:
            work()
            main.switch()

    main = greenlet.getcurrent()
    worker = greenlet.greenlet(worker_loop)
    for _ in range(rounds):
        worker.switch()
        time.sleep(0.002)


MOST = 0.6
"""The share of the thread's CPU the worker's 0.5 ms turns have at least, in the
tests below (each followed by a 2 ms sleep of the main greenlet). Not nearly all:
blocking and waking a thread costs CPU in the kernel, 100-150 us a sleep on the
AMD hosts CI ran on, where the worker had 77-80% in 3 runs of a full suite
(above 80% on the same host an hour before). A sampler that files the worker's
CPU at the sleep's line charges it 17-27% of the thread's CPU."""


def _timed_crunch(spent: list):
    """A function computing 0.5 ms of CPU a call, adding the CPU it used to ``spent[0]``
    (the truth the tests below compare with)."""
    def crunch() -> None:
        t0 = time.thread_time()
        end = t0 + 0.0005
        while time.thread_time() < end:
            pass
        spent[0] += time.thread_time() - t0
    return crunch


def _cpu_charged(snaps, keep=None) -> float:
    """CPU seconds charged to the samples with a stack (those whose frames, innermost
    first, ``keep`` accepts, if given)."""
    cpu = sample_weights(snaps, "cpu")
    return sum(w for w, sid in zip(cpu, snaps.sample_stack)
               if sid and (keep is None or keep(snaps.stack_frames(sid))))


def _cpu_charged_to(snaps, name: str) -> float:
    """CPU seconds charged to the samples whose innermost function is ``name``."""
    return _cpu_charged(snaps, lambda frames: frames[0].name.endswith(name))


@pytest.mark.engines("native")
@pytest.mark.parametrize("delay", [0.001, 0.005])
def test_cpu_used_by_a_greenlet_between_samples_goes_to_it_not_to_the_one_found_waiting(delay):
    """The main greenlet switches to a worker that computes for 0.5 ms and switches
    back, then sleeps 2 ms; sampled every 1 ms (or 5), most samples find the main
    greenlet asleep, with the worker's CPU used since the last one. That CPU went into the
    worker (its switch log says it ran in between), so it is filed at one of the
    worker's recent places, not at the line of the sleep: the sleep's line had 73-83%
    of the thread's CPU, `crunch` 17-27%, for a measured ~94%; now 97-98%. (The
    Python engine sees the thread only where it lets the GIL go: in the sleep.)"""
    spent = [0.0]
    crunch = _timed_crunch(spent)

    ctl = create_sampler(threading.current_thread(), delay)
    t0 = time.thread_time()
    # (at 5 ms, twice the rounds: ~300 ticks; with 150, one run in CI charged 78%)
    _work_in_a_greenlet_between_sleeps(crunch, 300 if delay < 0.003 else 600)
    total = time.thread_time() - t0
    ctl.stop()
    snaps = ctl.get_snapshots()
    charged = _cpu_charged_to(snaps, "crunch")
    assert spent[0] > MOST * total  # (the truth: most of the thread's CPU is the worker's)
    # (84-102% in runs here, 17-27% before: the draw among few places seen varies)
    assert charged > 0.7 * spent[0], f"crunch: {charged:.3f} s of {spent[0]:.3f} s"


@pytest.mark.engines("native")
def test_cpu_of_a_greenlet_that_ended_before_its_samples_were_filed_goes_to_it(monkeypatch):
    """As above, but the samples are filed after the worker has ended (no feeder
    turn during the run: the filing comes with the stop). The switch log says the
    worker ran between the samples, so its CPU still goes to its places, under its
    own name: counting only the greenlets alive at filing time, the workers of the
    benchmark's 0.4 s runs lost their CPU to the line of the main greenlet's nap
    (18-28% of the thread's CPU for 3%)."""
    from sampler import native_engine

    monkeypatch.setattr(native_engine, "REFRESH_STATIC", 30.0)  # (the run is 0.5 s)
    filed = []  # samples filed by each drain
    file = native_engine.NativeCollector._file

    def counted(self, samples, codes):
        filed.append(len(samples))
        return file(self, samples, codes)

    monkeypatch.setattr(native_engine.NativeCollector, "_file", counted)
    spent = [0.0]
    crunch = _timed_crunch(spent)

    def worker_loop(rounds: int) -> None:
        for _ in range(rounds):
            crunch()
            main.switch()

    main = greenlet.getcurrent()
    ctl = create_sampler(threading.current_thread(), 0.001)
    t0 = time.thread_time()
    worker = greenlet.greenlet(worker_loop)
    worker.switch(200)
    for _ in range(200):
        time.sleep(0.002)
        worker.switch()  # (the last one ends it)
    total = time.thread_time() - t0
    assert worker.dead
    del worker
    gc.collect()
    filed_during_the_run = sum(filed)
    ctl.stop()
    snaps = ctl.get_snapshots()
    assert filed_during_the_run < 0.1 * sum(filed)  # (filed after the worker ended)
    charged = _cpu_charged_to(snaps, "crunch")
    assert spent[0] > MOST * total
    assert charged > 0.7 * spent[0], f"crunch: {charged:.3f} s of {spent[0]:.3f} s"


def _cpu_under(snaps, name: str) -> float:
    """CPU seconds charged to the samples with a function ``name`` on their stack."""
    return _cpu_charged(snaps, lambda frames: any(f.name.endswith(name) for f in frames))


def _sampled_rounds(delay: float, workers: list, spent: Any, left: list, more: Any, nap: float = 0.0) -> tuple:
    """Sample this thread every ``delay`` while the main greenlet gives each worker
    (``(greenlet, key)``) a turn, round after round while ``more(rounds done, CPU
    seconds so far)``, napping ``nap`` after each round; ``spent[key]`` gets each
    turn's switch back (from ``left[0]``, the CPU clock as the worker began its
    switch out). The snapshots and the thread's CPU seconds in the rounds; the
    workers are ended.

    The garbage collector is kept out while the sampler runs: a collection that the
    hook's log entry sets off at a worker's switch out runs after the switch, in the
    main greenlet (on 3.12 and later at its next eval-breaker check, once the switch
    has returned), so the profiler rightly charges it there, where these truths give
    it to the worker. Late in the full suite, with a large heap, collections put 7
    points of a worker's share elsewhere in CI (3.12); a 2 ms burn in
    ``gc.callbacks`` at each collection does the same at will."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        ctl = create_sampler(threading.current_thread(), delay)
        t0 = time.thread_time()
        done = 0
        while more(done, time.thread_time() - t0):
            for worker, key in workers:
                worker.switch()
                spent[key] += time.thread_time() - left[0]
            done += 1
            if nap:
                time.sleep(nap)
        total = time.thread_time() - t0
        ctl.stop()
    finally:
        if collecting:
            gc.enable()
    for worker, _ in workers:
        worker.throw(greenlet.GreenletExit)
    return ctl.get_snapshots(), total


def _shares_of_two_workers(delay: float, rounds: int) -> dict:
    """Sample (every ``delay``) ``rounds`` rounds of a main greenlet napping 2 ms
    between turns of two workers of 0.3 and 0.6 ms of CPU: for each worker, its
    share of the thread's CPU as charged and as measured (``time.thread_time``).

    A worker's turn is timed from its first line after it is switched to until the
    main greenlet runs again: its ``main.switch()`` is its own (a switch is the
    switcher's: see ``scribblings/greenlets.md``); no collection runs meanwhile
    (:func:`_sampled_rounds`)."""
    spent = {"light_turns": 0.0, "heavy_turns": 0.0}
    left = [0.0]  # the CPU clock as the worker running last began its switch out

    def turns(name: str, seconds: float) -> None:
        main = greenlet.getcurrent().parent
        while True:
            t0 = time.thread_time()
            end = t0 + seconds
            while time.thread_time() < end:
                pass
            left[0] = time.thread_time()
            spent[name] += left[0] - t0
            main.switch()

    def light_turns() -> None:
        turns("light_turns", 0.0003)

    def heavy_turns() -> None:
        turns("heavy_turns", 0.0006)

    workers = [(greenlet.greenlet(light_turns), "light_turns"), (greenlet.greenlet(heavy_turns), "heavy_turns")]
    snaps, total = _sampled_rounds(delay, workers, spent, left, lambda done, _cpu: done < rounds, nap=0.002)
    charged_total = _cpu_charged(snaps)
    return {name: (_cpu_under(snaps, name) / charged_total, truth / total) for name, truth in spent.items()}


@pytest.mark.engines("native")
@pytest.mark.parametrize("delay", [0.001, 0.005])
def test_each_greenlet_gets_the_cpu_its_turns_used_however_the_ticks_fall(delay):
    """The main greenlet naps 2 ms, then lets two workers take a turn each, 0.3 and
    0.6 ms of CPU: one round every ~3 ms, so the ticks can lock onto the rounds and
    never find the first worker running (seen in the benchmark's greenlet_naps: it
    got 5-23% of the thread's CPU for 32%). The switch hook logs the thread's CPU
    clock at every switch, so each greenlet's CPU between two samples is known and
    charged to it, at its own places (a worker no sample found running: at its
    outermost function). Each worker's share of the thread's CPU is within 3 points
    of the truth, its turns timed with ``time.thread_time``."""
    for name, (charged, share) in _shares_of_two_workers(delay, 200).items():
        assert abs(charged - share) < 0.03, f"{name}: {charged:.1%} of the thread's CPU for {share:.1%}"


@pytest.mark.engines("native")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_its_greenlets_cpu_from_switch_logs_of_its_own():
    """A child forked while a sampler runs in a thread that switches greenlets
    inherits the thread's switch log, full of the parent's CPU clock readings; the
    child's thread has a clock of its own, from zero. The logs start over in the
    child, so a sampler started there charges each greenlet its turns' CPU (with the
    parent's log kept, the light worker got 20% of the CPU for 32%)."""
    code = """
        import json, os, sys, threading, time
        sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], "tests"))
        import test_sampler_greenlets as t
        from sampler import create_sampler

        outer = create_sampler(threading.current_thread(), 0.005)
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        t._shares_of_two_workers(0.001, 300)  # (the parent's switches, logged)
        pid = os.fork()
        if pid == 0:
            print(json.dumps(t._shares_of_two_workers(0.001, 150)), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        outer.stop()
        sys.exit(os.waitstatus_to_exitcode(status))
    """
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shares = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (charged, share) in shares.items():
        assert abs(charged - share) < 0.03, f"{name}: {charged:.1%} of the thread's CPU for {share:.1%}"


@pytest.mark.engines("native")
def test_a_tracer_chained_by_the_switch_hook_is_charged_to_the_greenlet_it_runs_in():
    """A greenlet tracer installed before the sampler (gevent's monitor, another
    profiler) is chained by the switch hook, and runs after it, in the greenlet
    switched to: samples find its frames above the hook's, on that greenlet's
    stack. The hook logs the switch before calling it, so its CPU is that
    greenlet's; and a stack with the program's code above the hook is a place like
    any other, not the sampler's own. A tracer spending 0.4 ms at each switch into
    a worker, beside the worker's 0.4 ms and the main greenlet's 0.4 ms a round:
    the main greenlet's part and the worker's greenlet (tracer and worker part
    together) each within 3 points of their shares of the thread's CPU; within the
    worker, the tracer, which begins each of its turns, is charged 5-7 points too
    much and the worker's part as much too little (5 runs on 3.10-3.13; bound 10).
    (With every stack holding the hook's frame taken for the sampler's, the tracer
    got 3% for 33%, the rest going to the worker's part.)"""
    spent = {"slow_tracer": 0.0, "worker_part": 0.0, "main_part": 0.0}

    def spin(name: str) -> None:
        t0 = time.thread_time()
        _burn_cpu(0.0004)
        spent[name] += time.thread_time() - t0

    def slow_tracer(event: str, args: Any) -> None:
        if event == "switch" and args[1] is worker:
            spin("slow_tracer")

    def worker_part() -> None:
        spin("worker_part")

    def main_part() -> None:
        spin("main_part")

    def work() -> None:
        main = greenlet.getcurrent().parent
        while True:
            worker_part()
            main.switch()

    worker = greenlet.greenlet(work)
    previous = greenlet.settrace(slow_tracer)
    try:
        ctl = create_sampler(threading.current_thread(), 0.001)
        t0 = time.thread_time()
        for _ in range(400):
            worker.switch()
            main_part()
        total = time.thread_time() - t0
        ctl.stop()
    finally:
        greenlet.settrace(previous)
    worker.throw(greenlet.GreenletExit)
    snaps = ctl.get_snapshots()
    charged = _cpu_charged(snaps)
    shares = {name: (_cpu_under(snaps, name) / charged, truth / total) for name, truth in spent.items()}
    shares["worker's greenlet"] = tuple(a + b for a, b in zip(shares["slow_tracer"], shares["worker_part"]))
    for name, (charged_share, share) in shares.items():
        bound = 0.10 if name in ("slow_tracer", "worker_part") else 0.03
        assert abs(charged_share - share) < bound, f"{name}: {charged_share:.1%} of the thread's CPU for {share:.1%}"


@pytest.mark.engines("native")
def test_many_greenlets_turns_between_two_samples_are_filed_in_bounded_samples():
    """Forty greenlets take turns of 0.1 ms between samples 5 ms apart: each
    interval holds about fifty turns. Their CPU is filed in MERGED_TURNS runs of
    greenlets drawn in proportion to what each used, so the samples filed stay
    within a bound per tick, and the thread's CPU is all charged, once."""
    from sampler.native_engine import MERGED_TURNS

    def turns() -> None:
        main = greenlet.getcurrent().parent
        while True:
            end = time.thread_time() + 0.0001
            while time.thread_time() < end:
                pass
            main.switch()

    workers = [greenlet.greenlet(turns) for _ in range(40)]
    ctl = create_sampler(threading.current_thread(), 0.005)
    t0, wall0 = time.thread_time(), time.perf_counter()
    while time.thread_time() - t0 < 0.3:
        for worker in workers:
            worker.switch()
    total = time.thread_time() - t0
    ctl.stop()
    wall = time.perf_counter() - wall0  # (ticks come by wall time: more of them on a loaded machine)
    snaps = ctl.get_snapshots()
    for worker in workers:
        worker.throw(greenlet.GreenletExit)
    charged = _cpu_charged(snaps)
    assert 0.9 * total < charged < 1.05 * total, (charged, total)
    # (at most 2 samples with a stack a run, MERGED_TURNS + 2 runs, and the sample
    # itself with its start, a tick: 2 * 4 + 2; with eight runs, as before, 22)
    samples = sum(1 for sid in snaps.sample_stack if sid)
    assert samples < (2 * (MERGED_TURNS + 2) + 2) * (wall / 0.005 + 20), (samples, wall, total)


def _worker_named(name: str, body: Any) -> Any:
    """``body`` (a function of no arguments) under a name of its own: its frames
    tell its greenlet's samples apart."""
    code = body.__code__.replace(co_name=name, co_qualname=name) if sys.version_info >= (3, 11) \
        else body.__code__.replace(co_name=name)
    return types.FunctionType(code, body.__globals__, name, None, body.__closure__)


@pytest.mark.engines("native")
def test_greenlets_of_turns_of_every_size_between_two_samples_each_get_their_share():
    """Twelve greenlets take turns of 20, 40, ... 240 us, one after the other,
    between samples 5 ms apart: some 35 turns of all twelve an interval, more than
    MAX_TURNS greenlets. Their CPU is drawn to greenlets in proportion to what each
    used, so each gets its share of the thread's CPU (its turns timed with
    ``time.thread_time``) on average: the total variation distance between the
    shares charged and the measured ones is within 7 points in 4 s of CPU. (Before,
    one run for each of the eight that used the most and the rest with the sample:
    the four smallest 1.0-4.0 points short each, 11.0-11.2 points in all in runs
    of 2 s.) The draw is the noise: the CPU of the ~30 turns of a tick goes in two
    runs to two greenlets, 800 draws in 2 s, so each share spreads as a binomial's
    (0.4-1.3 points, one standard deviation): in 2 s, 2.1-6.7 in 12 runs on an
    AMD host and once 8.7 in CI (3.11); in 4 s, 2.4-4.0 in 8 runs."""
    spent = [0.0] * 12
    left = [0.0]

    def worker(k: int) -> Any:
        def body() -> None:
            main = greenlet.getcurrent().parent
            while True:
                t0 = time.thread_time()
                end = t0 + 20e-6 * (k + 1)
                while time.thread_time() < end:
                    pass
                left[0] = time.thread_time()
                spent[k] += left[0] - t0
                main.switch()
        return _worker_named(f"sized_turns_{k}", body)

    workers = [(greenlet.greenlet(worker(k)), k) for k in range(12)]
    snaps, total = _sampled_rounds(0.005, workers, spent, left, lambda _done, cpu: cpu < 4.0)
    charged = _cpu_charged(snaps)
    errors = [_cpu_under(snaps, f"sized_turns_{k}") / charged - spent[k] / total for k in range(12)]
    assert sum(map(abs, errors)) / 2 < 0.07, " ".join(f"{e:+.1%}" for e in errors)


def _burn_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def long_turn() -> None:
    _burn_cpu(0.0010)


def short_turn() -> None:
    _burn_cpu(0.0004)


@pytest.mark.engines("native")
def test_a_greenlets_turns_merged_between_two_samples_go_to_all_of_its_places():
    """A worker's turns alternate between a long part (1 ms) and a short one
    (0.4 ms), six other greenlets take turns of 20 us in between, and samples come
    every 5 ms: each interval holds some fifty turns, and the worker's are merged
    into one (MAX_TURNS). Merged, they are no turn's length: drawn among the
    worker's places seen in turns as long as their sum, they all went to the long
    part (the short one got 2.5-3.1% of the two for 28.6%); drawn among all of
    the worker's places, the short part was 10.2 points short to 5.0 over in runs
    of 1 s of CPU (33 runs on 3.10-3.13, one of them in CI: 3 short on average).
    That spread is the sampling's: the worker is found about 140 times a second,
    and its merged turns go where those samples fall, so the run is 2 s (half the
    variance: 6.0 short to 0.2 over in 16 runs on 3.10-3.13) and the bound is 15
    points, which the old rule misses by 11."""
    spent = {"long_turn": 0.0, "short_turn": 0.0}

    def worker() -> None:
        main = greenlet.getcurrent().parent
        while True:
            for part in (long_turn, short_turn):
                t0 = time.thread_time()
                part()
                spent[part.__name__] += time.thread_time() - t0
                main.switch()

    def filler() -> None:
        main = greenlet.getcurrent().parent
        while True:
            _burn_cpu(0.00002)
            main.switch()

    turns = [greenlet.greenlet(worker)] + [greenlet.greenlet(filler) for _ in range(6)]
    ctl = create_sampler(threading.current_thread(), 0.005)
    t0 = time.thread_time()
    while time.thread_time() - t0 < 2.0:
        for g in turns:
            g.switch()
    ctl.stop()
    snaps = ctl.get_snapshots()
    for g in turns:
        g.throw(greenlet.GreenletExit)
    long_cpu, short_cpu = (_cpu_charged(snaps, lambda frames, name=name: any(f.name == name for f in frames))
                           for name in ("long_turn", "short_turn"))
    truth = spent["short_turn"] / sum(spent.values())
    share = short_cpu / (long_cpu + short_cpu)
    assert abs(share - truth) < 0.15, (share, truth, long_cpu, short_cpu)

@pytest.mark.engines("native")
def test_a_thread_that_switches_greenlets_has_every_read_filed():
    """The native engine files a stretch of reads that find a thread at one stack as
    the stretch's last read alone (SAME). In a thread that switches greenlets the
    same stack at two ticks can be one greenlet's, waiting again, with others run in
    between: each read keeps the switches of its own interval, so from its first
    switch on, a thread gets every read filed. Two threads run the same loop (0.5 ms
    of work, a 2 ms sleep), one of them switching to a greenlet for the work: reads
    of the plain one are kept back, of the other none."""
    from sampler.native_engine import SAME

    def crunch() -> None:
        end = time.thread_time() + 0.0005
        while time.thread_time() < end:
            pass

    def plain() -> None:
        for _ in range(150):
            crunch()
            time.sleep(0.002)

    def switching() -> None:
        _work_in_a_greenlet_between_sleeps(crunch, 150)

    ctl = create_sampler(ALL_THREADS, 0.001)
    collector = ctl._collector
    flags_of: dict = {"plain": [], "switching": []}
    names: dict = {}
    file = collector._file

    def watching_file(samples, codes):
        for sample in samples:
            slot = collector._slots.get(sample[0])
            if slot is not None and slot.ident in names:
                flags_of[names[slot.ident]].append(sample[1])
        file(samples, codes)

    collector._file = watching_file
    threads = [threading.Thread(target=run, name=run.__name__) for run in (plain, switching)]
    for t in threads:
        t.start()
        names[t.ident] = t.name
    for t in threads:
        t.join()
    ctl.stop()
    same = {name: sum(1 for f in flags if f & SAME) for name, flags in flags_of.items()}
    assert len(flags_of["switching"]) > 100, flags_of
    assert same["plain"] > 10 and same["switching"] == 0, same


@pytest.mark.engines("native")
def test_greenlets_that_switch_all_the_time_are_read_whole():
    """Two greenlets of one thread hand over to each other every few microseconds,
    so that many reads fall in a switch. On 3.12+ greenlet rewrites the frame links
    of a greenlet as it switches so as to skip the C-stack shims (it "exposes" its
    frames), and the outermost frame is then left with no caller: the walk refused
    such a stack as torn and read the thread again, 64% of the walks on 3.12 and 47%
    on 3.13 here (45-60% of the benchmark's gevent_chatty, 16 client greenlets of a
    gevent server on loopback, whose handler's parsing got 6 points too many on
    3.12); 1% since on 3.12, 12% on 3.13. Every sample in a greenlet is one of the
    loop's stacks."""
    stop = threading.Event()

    def work() -> int:
        return sum(i * i for i in range(30))

    def side(peer: int) -> None:
        while not stop.is_set():
            work()
            pair[peer].switch()

    def ping() -> None:
        side(1)

    def pong() -> None:
        side(0)

    pair: list = []

    def run() -> None:
        pair.extend([greenlet.greenlet(ping), greenlet.greenlet(pong)])
        pair[0].switch()

    t = threading.Thread(target=run)
    t.start()
    try:
        ctl = create_sampler(t, 0.001)
        engine = ctl._collector._engine
        # (looked at every 0.1 s: a look takes the GIL from the loop)
        until = time.monotonic() + 30
        while engine.stats()["walks"] < 600 and time.monotonic() < until:
            time.sleep(0.1)
        stats = engine.stats()
        ctl.stop()
    finally:
        stop.set()
        t.join()
    assert stats["walks"] >= 300, stats
    snaps = ctl.get_snapshots()
    bad = []
    for sid in set(snaps.sample_stack):
        names = [f.name.rsplit(".", 1)[-1] for f in reversed(snaps.stack_frames(sid))] if sid else []
        if "side" in names and (names[:2] not in (["ping", "side"], ["pong", "side"])
                                or names[2:] not in ([], ["work"], ["work", "<genexpr>"], ["is_set"])):
            bad.append(names)
    assert not bad, bad[:3]
    if sys.version_info[:2] == (3, 12):  # (elsewhere other tears remain: 3.10 and 3.13
        # read again 30-45% of these walks beside a busy process, 0-12% without one)
        assert stats["torn_reads"] < 0.3 * stats["walks"], stats


def test_the_switch_log_copied_from_a_time_on_is_the_whole_logs_tail_from_there():
    """``switch_log(ident, since_ns)``, the native engine's copy at each drain: from
    the second latest entry logged by ``since_ns`` on (the one in force then, and
    the one before), however many came since (the first attempt copies 256); the
    whole log when it does not reach back that far."""
    from sampler.greenlets import switch_log

    def ping():
        while True:
            main.switch()

    main = greenlet.getcurrent()
    ctl = create_sampler(threading.current_thread(), 0.005)
    try:
        g = greenlet.greenlet(ping)
        for _ in range(300):
            g.switch()
        whole = switch_log(threading.get_ident())
        assert len(whole) > 600
        for k in (5, 100, len(whole) - 300, len(whole) - 20):  # (300 and 20 entries after)
            since = whole[k][0]
            assert switch_log(threading.get_ident(), since) == whole[k - 1:]
            assert switch_log(threading.get_ident(), since + 0.5) == whole[k - 1:]
        assert switch_log(threading.get_ident(), whole[0][0] - 1) == whole
        assert switch_log(threading.get_ident(), whole[-1][0] + 10**9) == whole[-2:]
        g.throw(greenlet.GreenletExit)
    finally:
        ctl.stop()
    assert switch_log(threading.get_ident(), 0) == []  # (no hook in use)


def test_the_switch_log_is_copied_whole_while_its_thread_switches_in_the_copy():
    """A copy of the newest entries makes iterator objects, whose making can run a
    collection, and a collection can run Python that switches greenlets (here a
    ``gc`` callback; in the native engine, the log's thread given the GIL by the
    feeder's callback or finalizer): the log changes under the copy, which must be
    made again, never fail. (It failed with "deque mutated during iteration", and
    the feeder with it, in a stress run of greenlets switching on 3.10 and 3.12.)
    Whatever the copy meets, it is the log's tail as it was at some moment: each
    entry logged later than the one before it, the last switch in it."""
    from sampler.greenlets import switch_log

    def ping():
        while True:
            main.switch()

    main = greenlet.getcurrent()
    g = greenlet.greenlet(ping)
    switched_in_collections = []

    def switch_in_collection(phase, info):
        # (only in this thread: a collection another one runs, the Python engine's
        # collector's, cannot switch this thread's greenlets)
        if phase == "start" and threading.get_ident() == ident:
            switched_in_collections.append(1)
            g.switch()

    ident = threading.get_ident()

    ctl = create_sampler(threading.current_thread(), 0.005)
    thresholds = gc.get_threshold()
    try:
        for _ in range(300):
            g.switch()
        since = switch_log(threading.get_ident())[-200][0]
        gc.callbacks.append(switch_in_collection)
        gc.set_threshold(1)  # (a collection at nearly every object made)
        try:
            copies = [switch_log(threading.get_ident(), since) for _ in range(50)]
        finally:
            gc.set_threshold(*thresholds)
            gc.callbacks.remove(switch_in_collection)
        g.throw(greenlet.GreenletExit)
    finally:
        ctl.stop()
    assert len(switched_in_collections) > 50, len(switched_in_collections)
    for copy in copies:
        assert len(copy) >= 200 and copy[1][0] <= since
        assert all(a[0] <= b[0] for a, b in zip(copy, copy[1:]))


@pytest.mark.engines("native")
def test_a_stack_read_next_to_a_switch_is_filed_under_the_greenlet_it_shows():
    """The native engine files samples after the fact and names a sample's greenlet
    by the thread's switch log and the time of the sample. Next to a switch the two
    can disagree, and if the greenlet the stack shows has finished by the time the
    samples are filed, its frames' address names no live greenlet: the sample went
    to the greenlet logged at its time (a server's handler under the hub or a
    client, seen in about 1 run in 100 of the spawn-tree test). Replayed from a real
    log at the two instants where they disagree:

    * the hook logs a switch from inside it, after the switch: a stack can show the
      resumed greenlet's frames (the hook's own on top) just before the entry;
    * the engine's thread reads its clock after the stack, and can lose its core in
      between (6 ms seen under load): switches logged after the read come first."""
    from sampler.greenlets import record_of, switch_log

    def work():
        main.switch()  # switched out: the hook learns where its frames start

    main = greenlet.getcurrent()
    ctl = create_sampler(threading.current_thread(), 0.001)
    collector = ctl._collector
    g = greenlet.greenlet(work)
    g.switch()
    time.sleep(0.01)  # (between the two entries: room for a sample's time)
    g.switch()  # resumed, then finished
    assert g.dead
    rec = record_of(g)
    log = switch_log(threading.get_ident())
    resumed = max(i for i, (_, r, _) in enumerate(log) if r is rec)
    assert resumed > 0 and log[resumed - 1][1] is not rec and rec.base
    ctl.stop()
    slot = next(s for s in collector._slots.values() if s.ident == threading.get_ident())
    collector._switch_logs = {slot.ident: log}
    def at(t_ns):  # the engine's time of a sample at perf_counter_ns() t_ns
        return int(t_ns / 1000 - collector.recorder.start * 1e6)

    before = log[resumed - 1][1]
    since = at(log[resumed - 1][0]) + 1  # the thread's last sample: after the entry before
    # 1 us before the hook logged the switch to g, a stack that starts in g's frames
    assert collector._greenlet_at(slot, rec.base, at(log[resumed][0] - 1000), since) is rec
    # and a stack of the greenlet logged before is still that one's
    assert collector._greenlet_at(slot, before.base, at(log[resumed][0] - 1000), since) is before
    # g's frames read before its end, the clock read after the switch that followed
    assert resumed + 1 < len(log) and log[resumed + 1][1] is not rec
    late = at(log[resumed + 1][0] + 1000)
    assert collector._greenlet_at(slot, rec.base, late, since) is rec
    # ... but not when the thread's last sample came after g's switch: not g's then
    assert collector._greenlet_at(slot, rec.base, late, at(log[resumed + 1][0]) + 1) \
        is log[resumed + 1][1]


@pytest.mark.engines("python")
def test_a_thread_caught_inside_the_switch_hook_is_running_the_greenlet_switched_to():
    """The Python engine asks the hook which greenlet runs when it samples a thread;
    caught inside the hook (its frame on top), the switch is made but not yet told.
    Caught there for real: a greenlet started before the sampler is resumed, the hook
    meets it for the first time and tells the listeners of new greenlets, from inside
    it, before it records the switch."""
    from sampler import greenlets as switches

    def work():
        main.switch()

    main = greenlet.getcurrent()
    g = greenlet.greenlet(work)
    left = switches._hooks.get(threading.get_ident())
    assert left is None or not left.users, "an earlier sampler holds this thread's switch hook"
    g.switch()  # started before the sampler: the hook has no record of it yet
    seen = []

    def listener(new):
        hook_frame = sys._getframe(2)  # listener <- record_of <- the hook
        assert hook_frame.f_code is switches.HOOK_CODE
        hook = switches._hooks[threading.get_ident()]
        seen.append((new, hook.current, switches.running_in(threading.get_ident(), hook_frame)))

    ctl = create_sampler(threading.current_thread(), 0.001)
    switches.new_greenlet_listeners.add(listener)
    try:
        g.switch()
    finally:
        switches.new_greenlet_listeners.discard(listener)
        ctl.stop()
    assert any(x[0] is g for x in seen), (seen, g)
    new, current, running = next(x for x in seen if x[0] is g)
    assert current is switches.record_of(main)  # not told yet
    assert running is switches.record_of(g)


def test_a_collection_in_a_greenlet_is_filed_under_that_greenlet():
    """A garbage collection is filed as a sample of the stack that triggered it (the
    gc hook's, not the sampler's) under the greenlet that ran into it: in a server,
    under the handler, not the thread (a spawn tree would show it out of place)."""
    import gc

    from sampler import gctime

    if not gctime.native_gc_hook():
        pytest.skip("GC time is on by default only where its C hook is built")
    main = greenlet.getcurrent()

    def collecting():
        while True:
            gc.collect(0)  # the collection's stack is this greenlet's
            main.switch()

    g = greenlet.greenlet(collecting)
    ctl = create_sampler(threading.current_thread(), 0.001)
    spin_until_sampled(ctl, 3)  # (a collection before a thread's first sample is not filed)
    for _ in range(20):
        g.switch()
        spin(0.001)
    # each is filed before its thread's next sample: let the last one come
    spin_until_sampled(ctl, len(ctl.get_snapshots()) + 3)
    ctl.stop()
    snaps = ctl.get_snapshots()
    filed = [(snaps.threads[tid], [f.name for f in snaps.stack_frames(sid)])
             for tid, sid in zip(snaps.sample_thread, snaps.sample_stack)
             if sid and snaps.stack_frames(sid)[0].name == "<gc>"]
    in_g = [t for t, names in filed if any(n.endswith("collecting") for n in names)]
    # (the collections of one interval made at one place are one sample: fewer
    # samples than collections, 19 for 20 once)
    assert in_g and snaps.runs[0].extra["gc_collections"] >= 20, filed
    assert all(t.kind == "greenlet" and t.name.endswith("collecting") for t in in_g), \
        [(t.kind, t.name) for t in in_g]


@pytest.mark.engines("native")  # (frame addresses name greenlets for the native engine only)
def test_the_main_greenlet_of_an_ended_thread_names_no_frames():
    """greenlet keeps an ended thread's main greenlet, which still says it is not
    dead, while the memory of the thread's frames goes to new frames: the first frame
    of a greenlet started later was taken for that main greenlet's outermost one, and
    none of that greenlet's samples was filed (CI, 2 runs in 8).  Where the extension
    is not built no address is learned, and there is nothing to test."""
    from sampler import greenlets as switches

    box = []

    def body():
        hook = switches.attach()  # (learns the thread's main greenlet's outermost frame)
        box.append((greenlet.getcurrent(), switches.record_of(greenlet.getcurrent())))
        switches.release(hook)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    main_of_thread, rec = box[0]
    assert rec.base
    # (greenlet says it is not dead until it gets round to cleaning up after the
    # thread; either way it names no frames)
    assert switches.at_base(rec.base) is None, main_of_thread


def test_a_dead_or_never_started_greenlet_is_simply_not_sampled():
    dead = greenlet.greenlet(lambda: None)
    dead.switch()
    never = greenlet.greenlet(lambda: None)
    ctl = create_sampler([dead, never], 0.001)
    spin(0.05)
    ctl.stop()
    assert len(ctl.get_snapshots()) == 0 and ctl.errors == []


def test_under_gevent_monkey_patching_the_collector_is_a_real_thread():
    pytest.importorskip("gevent")
    code = """
        from gevent import monkey; monkey.patch_all()
        import gevent, threading, time, sampler
        from tests.sampling_helpers import spin

        def cpu_greenlet():
            # never yields: only a real OS thread can sample it.  Until 60 samples
            # (bounded), not for a fixed time: a loaded machine gives fewer per second.
            end = time.monotonic() + 60
            while len(ctl.get_snapshots()) < 60 and time.monotonic() < end:
                spin(0.01)

        ctl = sampler.create_sampler(sampler.ALL_THREADS, 0.002)
        g = gevent.spawn(cpu_greenlet)
        g2 = gevent.spawn(lambda: [gevent.sleep(0.01) for _ in range(5)])
        gevent.joinall([g, g2])
        ctl.stop()
        snaps = ctl.get_snapshots()
        names = set()
        for sid in set(snaps.sample_stack):
            names.update(f.name for f in snaps.stack_frames(sid))
        assert "cpu_greenlet" in names, names
        assert len(snaps) >= 50, len(snaps)
        assert not ctl.errors, ctl.errors
        print("ok", len(snaps))
    """
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def test_under_gevent_a_tracked_greenlet_is_sampled():
    pytest.importorskip("gevent")
    code = """
        from gevent import monkey; monkey.patch_all()
        import gevent, sampler
        from tests.sampling_helpers import spin

        def handler(n):
            for _ in range(n):
                spin(0.01)
                gevent.sleep(0)

        watched = gevent.spawn(handler, 15)
        other = gevent.spawn(handler, 15)
        gevent.sleep(0)  # both start and yield once
        ctl = sampler.create_sampler(watched, 0.001)
        gevent.joinall([watched, other])
        ctl.stop()
        snaps = ctl.get_snapshots()
        assert len(snaps) > 20, len(snaps)
        assert len(snaps.threads) == 1 and snaps.threads[0].kind == "greenlet"
        print("ok")
    """
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr


def test_each_greenlet_of_a_tracked_thread_gets_its_own_share_of_its_cpu():
    # Three greenlets switching among each other with CPU slices of 1:2:3, under a
    # sampler of their thread: each sample is filed under the greenlet running then.
    # Only the intervals that straddle a switch can be misattributed: the run goes
    # on until the bound on that error (sampling_helpers.switch_error_margin, from
    # the intervals seen) is at most 1.5 points of a share, or for 16 rounds (2 s of
    # CPU); shares must be within 2 points, or within that bound where a starved
    # collector (long intervals) left it wider.
    from analyzer.greenlets import greenlet_times, greenlets_of

    truth = {"slice_1": 0.0, "slice_2": 0.0, "slice_3": 0.0}

    def worker(name, cpu):
        while True:
            start = time.thread_time()
            spin(cpu)
            truth[name] += time.thread_time() - start
            main.switch()

    def slice_1():
        worker("slice_1", 0.02)

    def slice_2():
        worker("slice_2", 0.04)

    def slice_3():
        worker("slice_3", 0.06)

    main = greenlet.getcurrent()
    workers = [greenlet.greenlet(f) for f in (slice_1, slice_2, slice_3)]
    ctl = create_sampler(threading.current_thread(), 0.0005)
    rounds = 0
    while True:
        for g in workers:
            g.switch()
        rounds += 1
        if rounds % 4 == 0:  # (reading the snapshots costs the main greenlet CPU)
            snaps = ctl.get_snapshots()
            deltas = [d / 1e6 for d, s in zip(snaps.cpu_deltas(), snaps.sample_stack) if s]
            # each greenlet gains or loses at both ends of each of its turns
            margin = switch_error_margin(deltas, 2 * rounds) / sum(truth.values())
            if margin <= 0.015 or rounds >= 16:
                break
    ctl.stop()
    snaps = ctl.get_snapshots()
    assert not ctl.errors
    info = greenlets_of(snaps)
    # named after the function each runs (a started greenlet has lost its ``run``)
    assert sorted(g.name.rpartition(".")[2] for g in info.values()) == sorted(truth), _contexts_seen(snaps)
    assert {g.thread for g in info.values()} == {0}
    assert all(g.parent == 0 for g in info.values())  # spawned by the main greenlet
    times = {name.rpartition(".")[2]: t for name, t in greenlet_times(snaps).items()}
    measured, total_truth = sum(times[name] for name in truth), sum(truth.values())
    for name, true in truth.items():
        share, true_share = times[name] / measured, true / total_truth
        assert abs(share - true_share) <= max(0.02, margin), (name, share, true_share, margin, times, truth)


def _contexts_seen(snaps) -> dict:
    """What each context of ``snaps`` was filed with, to tell a misfiled sample from
    a misnamed greenlet: its name, record, how many samples, and the outermost and
    innermost functions of its stacks (with how many samples each; ``<gc>``
    innermost: a collection's sample, filed by the switch log's time)."""
    from collections import Counter

    from analyzer.greenlets import greenlets_of

    info = greenlets_of(snaps)
    seen: dict = {}
    for tid, sid in zip(snaps.sample_thread, snaps.sample_stack):
        if sid:
            frames = snaps.stack_frames(sid)  # (innermost first)
            seen.setdefault(tid, Counter())[(frames[-1].name, frames[0].name)] += 1
    return {t.id: (t.name, info.get(t.id), dict(seen.get(t.id, {}))) for t in snaps.threads}


def _switching_greenlets_snapshots():
    """Snapshots of a thread whose two greenlets switch back and forth."""
    def ping():
        while True:
            spin(0.003)
            main.switch()

    main = greenlet.getcurrent()
    pinger = greenlet.greenlet(ping)
    ctl = create_sampler(threading.current_thread(), 0.001)
    while len({t.kind for t in ctl.get_snapshots().threads}) < 2:
        pinger.switch()
        spin(0.003)
    ctl.stop()
    return ctl.get_snapshots()


def test_the_greenlet_table_survives_a_file_and_a_hostile_one_is_refused(tmp_path):
    from analyzer.greenlets import greenlets_of
    from sampler import SnapshotError, Snapshots
    from sampler.snapshot import RunInfo

    snaps = _switching_greenlets_snapshots()
    before = greenlets_of(snaps)
    assert [g.name.rpartition(".")[2] for g in before.values()] == ["ping"]
    assert all(g.greenlet and g.thread == 0 and g.parent == 0 for g in before.values())
    snaps.save(tmp_path / "ok.stackshot")
    assert greenlets_of(Snapshots.load(tmp_path / "ok.stackshot")) == before
    # a file from before greenlet tables: contexts known, ids not
    old = Snapshots(frames=snaps.frames, stack_frame=snaps.stack_frame, stack_parent=snaps.stack_parent,
                    threads=snaps.threads, sample_thread=snaps.sample_thread,
                    sample_stack=snaps.sample_stack, sample_wall=snaps.sample_wall,
                    sample_cpu=snaps.sample_cpu, runs=[RunInfo()])
    assert [(g.name, g.greenlet, g.parent) for g in greenlets_of(old).values()] == [
        (g.name, None, None) for g in before.values()]
    content = gzip.decompress((tmp_path / "ok.stackshot").read_bytes())
    magic, version, header_line, rest = content.split(b"\n", 3)
    n = int(header_line.split()[1])
    for bad, message in ((["x"], "is ['x'], not an object"),
                         ({"1": [1, 2]}, "[1] is [1, 2], not [greenlet id, parent, thread]"),
                         ({"a": [1, 2, 3]}, "has the key 'a', not a thread id"),
                         ({"1": [1, -2, 3]}, "not [greenlet id, parent, thread]")):
        header = json.loads(rest[:n])
        header["runs"][0]["extra"]["greenlets"] = bad
        hb = json.dumps(header).encode()
        (tmp_path / "bad.stackshot").write_bytes(gzip.compress(
            b"\n".join([magic, version, b"header %d" % len(hb)]) + b"\n" + hb + rest[n:]))
        with pytest.raises(SnapshotError) as info:
            Snapshots.load(tmp_path / "bad.stackshot")
        assert "runs[0].extra.greenlets" in str(info.value) and message in str(info.value), info.value
        assert "\n" not in str(info.value)


def test_a_greenlet_group_tracks_what_its_members_spawn_later_and_nothing_else():
    from sampler import GreenletGroup

    group = GreenletGroup("jobs")
    main = greenlet.getcurrent()
    ctl = None

    def child():
        spin_until_sampled(ctl, len(ctl.get_snapshots()) + 5)

    def job():
        main.switch()  # first run inside the block; spawns later, outside it
        greenlet.greenlet(child).switch()

    def outsider():
        spin(0.02)

    with group:
        jobs = [greenlet.greenlet(job) for _ in range(2)]
        for j in jobs:
            j.switch()
    assert set(group.greenlets()) == set(jobs)
    ctl = create_sampler(group, 0.001)
    greenlet.greenlet(outsider).switch()  # spawned by a non-member, after the block
    for j in jobs:
        j.switch()
    ctl.stop()
    group.close()
    snaps = ctl.get_snapshots()
    assert not ctl.errors
    names = set()
    for sid in snaps.sample_stack:
        names.update(f.name.rpartition(".")[2] for f in snaps.stack_frames(sid))
    assert "child" in names and "outsider" not in names, names
    assert {t.kind for t in snaps.threads} == {"greenlet"}
    with pytest.raises(TypeError, match="GreenletGroup.add takes a greenlet"):
        group.add(threading.current_thread())


def test_a_greenlet_that_reuses_an_ended_ones_frames_gets_none_of_its_samples(sampler_engine):
    """A greenlet started after another ended gets the ended one's frame memory, so
    its outermost frame has the same address.  The first sample of the new greenlet
    finds it asleep, and the CPU used since the last sample is filed where the thread
    last ran.  That place was in the ended greenlet, not the new one: none of it goes
    under the new one (CI, 3.13: an untracked greenlet's frames filed under a tracked
    one, seen in 15 to 19 runs in 20 on 3.11 and 3.13 before)."""
    from sampler import GreenletGroup
    from sampler.greenlets import _frame_address

    group = GreenletGroup("jobs")
    main = greenlet.getcurrent()
    bases = {}

    def outermost_address() -> int:
        frame = sys._getframe(1)
        while frame.f_back is not None:
            frame = frame.f_back
        return (_frame_address or id)(frame)

    def child():
        bases["child"] = outermost_address()
        time.sleep(0.03)  # found asleep, after the CPU the thread used in `outsider`
        spin_sampled(0.01)

    def job():
        main.switch()
        greenlet.greenlet(child).switch()

    def outsider():
        bases["outsider"] = outermost_address()
        if sampler_engine == "native":
            spin_sampled(0.01)  # read by the C thread, though not filed: untracked
        else:
            spin(0.01)  # (the Python engine reads tracked greenlets only)

    for _ in range(3):
        with group:
            member = greenlet.greenlet(job)
            member.switch()
        ctl = create_sampler(group, 0.001)
        greenlet.greenlet(outsider).switch()  # untracked: spawned outside the block
        member.switch()
        ctl.stop()
        snaps = ctl.get_snapshots()
        assert not ctl.errors
        names = {f.name.rpartition(".")[2] for sid in snaps.sample_stack for f in snaps.stack_frames(sid)}
        assert "child" in names and "outsider" not in names, sorted(names)
        if bases["child"] == bases["outsider"]:
            break
    group.close()
    if bases["child"] != bases["outsider"]:
        pytest.skip("no greenlet here reused an ended one's frame memory in 3 tries (3.10 frames are objects)")


def test_no_code_of_the_sampler_runs_when_a_greenlet_dies():
    """A greenlet can die inside the interpreter's pending calls (greenlet frees a
    finished thread's greenlets from the main thread's), and on 3.11 Python code run
    there, with a profile function set while another thread adds a pending call, loops
    forever (2 runs in 150 of the use_errortrace stress hung in the switch hook's
    record callback). So the sampler keeps no Python callback on a greenlet: neither
    its record nor a group's membership runs any code when it dies."""
    import sampler as sampler_package
    from sampler import GreenletGroup
    from sampler import greenlets as switches

    group = GreenletGroup("jobs")
    main = greenlet.getcurrent()
    with group:
        g = greenlet.greenlet(lambda: main.switch())
        g.switch()  # started: the hook made its record, and it joined the group
    assert switches.record_of(g) and g in set(group.greenlets())
    package = os.path.dirname(sampler_package.__file__)
    ran = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            ran.append(frame.f_code.co_qualname if hasattr(frame.f_code, "co_qualname") else frame.f_code.co_name)

    g.throw(greenlet.GreenletExit)  # finished (the hook runs for this switch)
    sys.setprofile(profile)
    try:
        del g
        gc.collect()
    finally:
        sys.setprofile(None)
        group.close()
    assert ran == [], ran
    assert group.greenlets() == []


def test_the_records_of_finished_greenlets_do_not_pile_up(monkeypatch):
    """With no callback on a greenlet, a finished one's record (and its spawn stack)
    stays until the records are pruned, which a new record does once the records
    have doubled since the last prune: a server's thousands of short handlers must
    not keep one each."""
    from sampler import GreenletGroup
    from sampler import greenlets as switches

    group = GreenletGroup("many")  # (its switch hook makes a record for each greenlet)
    try:
        with group:
            done = [greenlet.greenlet(lambda: None) for _ in range(600)]
            for g in done:
                g.switch()  # each one finished, all alive at once: 600 records
        dead = {id(g) for g in done}
        assert dead <= set(switches._records)
        del done, g
        gc.collect()
        monkeypatch.setattr(switches, "_prune_at", len(switches._records))  # due now
        with group:
            fresh = greenlet.greenlet(lambda: None)
            fresh.switch()  # a new record: the prune runs first
        assert not any(rec.ref() is None for rec in switches._records.values())
        assert switches._prune_at == max(switches._PRUNE_AT, 2 * (len(switches._records) - 1))
    finally:
        group.close()


def test_greenlets_of_a_thread_started_after_the_sampler_get_their_own_shares():
    # The switch hook is per thread: a thread started while a sampler runs gets it
    # as it starts (greenlets.follow_new_threads).  Two greenlets with CPU slices of
    # 1:3 switch in a worker thread, run until the misattribution bound (from the
    # intervals seen) is at most 1.5 points or for 24 rounds; shares within 2
    # points, or that bound where a starved collector left it wider.
    from analyzer.greenlets import greenlet_times, greenlets_of
    from sampler import ALL_THREADS

    truth = {"light": 0.0, "heavy": 0.0}
    out = {}

    def worker(name, cpu, main):
        while True:
            start = time.thread_time()
            spin(cpu)
            truth[name] += time.thread_time() - start
            main.switch()

    def light(main):
        worker("light", 0.01, main)

    def heavy(main):
        worker("heavy", 0.03, main)

    def body():
        main = greenlet.getcurrent()
        workers = [greenlet.greenlet(f) for f in (light, heavy)]
        rounds = 0
        while True:
            for g in workers:
                g.switch(main) if rounds == 0 else g.switch()
            rounds += 1
            if rounds % 4 == 0:
                snaps = ctl.get_snapshots()
                mine = {t.id for t in snaps.threads if t.native_id == threading.get_native_id()}
                deltas = [d / 1e6 for d, s, t in zip(snaps.cpu_deltas(), snaps.sample_stack,
                                                     snaps.sample_thread) if s and t in mine]
                out["margin"] = switch_error_margin(deltas, 2 * rounds) / sum(truth.values())
                if out["margin"] <= 0.015 or rounds >= 24:
                    return

    ctl = create_sampler(ALL_THREADS, 0.0005)
    thread = threading.Thread(target=body, name="greenlet-worker")
    thread.start()
    thread.join(120)
    ctl.stop()
    snaps = ctl.get_snapshots()
    assert not ctl.errors
    info = greenlets_of(snaps)
    ours = {g.name.rpartition(".")[2]: g for g in info.values()
            if snaps.threads[g.thread].name == "greenlet-worker"}
    assert sorted(ours) == ["heavy", "light"], info
    times = {name.rpartition(".")[2]: t for name, t in greenlet_times(snaps).items()}
    measured, total = times["light"] + times["heavy"], sum(truth.values())
    margin = out["margin"]
    for name, true in truth.items():
        share, true_share = times[name] / measured, true / total
        assert abs(share - true_share) <= max(0.02, margin), (name, share, true_share, margin, times)


def _hook_run(hook_class) -> dict:
    """Drive a fresh switch hook of ``hook_class`` through switches of every kind
    (a greenlet's first run, known ones back and forth, a throw, a greenlet made
    and first switched to by another, its end) with a tracer chained, and say what
    it did: the greenlets logged in order, each entry's clocks, the events the
    tracer got, the running greenlet after, what was learnt of each greenlet."""
    from sampler import greenlets as switches

    events = []

    def tracer(event, args):
        events.append((event, args[0], args[1]))

    main = greenlet.getcurrent()

    def worker():
        for _ in range(3):
            main.switch()
        try:
            main.switch()
        except ValueError:
            pass
        helper.switch()

    def helping():
        main.switch()

    named, helper = greenlet.greenlet(worker), greenlet.greenlet(helping)
    hook = hook_class(tracer)
    hook.users = 1
    hook.current = switches.record_of(main)
    previous = greenlet.settrace(hook)
    try:
        before = (time.perf_counter_ns(), time.thread_time_ns())
        for _ in range(4):
            named.switch()
        named.throw(ValueError)  # (caught; then it switches to the helper, never seen)
        named.switch()
        after = (time.perf_counter_ns(), time.thread_time_ns())
    finally:
        greenlet.settrace(previous)
    log = list(hook.log)
    # (the C hook's CPU clock is estimated between reschedulings: a virtual machine's
    # host that stops the CPU meanwhile makes it ahead of the real one, for at most
    # the 1 ms between two readings: sampler/_native/switchclock.h)
    ahead = 1_000_000 if hook_class is not switches.SwitchHook else 0
    for wall, _, cpu in log:
        assert before[0] <= wall <= after[0] and before[1] <= cpu <= after[1] + ahead
    assert [entry[0] for entry in log] == sorted(entry[0] for entry in log)
    recs = {g: switches.record_of(g) for g in (main, named, helper)}
    name = {id(rec): g for g, rec in recs.items()}
    return {"logged": [name.get(id(entry[1])) for entry in log], "slow": getattr(hook, "slow_calls", None),
            "events": events, "current": name.get(id(hook.current)), "switched": hook.switched,
            "learnt": {g: (bool(rec.base), rec.named, rec.name) for g, rec in recs.items()},
            "greenlets": (main, named, helper)}


@pytest.mark.engines("native")  # (either engine's hook is the one made explicitly here)
def test_the_c_switch_hook_does_what_its_python_twin_does():
    """The switch hook's common case runs in C where the extension is built
    (sampler/_native/switchhook.h), every other case in the Python hook it shares
    with its twin. Both, driven through the same switches, log the same greenlets
    with clocks read at the switch, chain the same events to the tracer before them
    and learn the same of each greenlet; the C one does it in C for all but the
    switches that teach it something."""
    from sampler import greenlets as switches

    if switches.NativeSwitchHook is None:
        native_missing("the C switch hook")
    runs = {cls: _hook_run(cls) for cls in (switches.SwitchHook, switches.NativeSwitchHook)}
    python, native = runs[switches.SwitchHook], runs[switches.NativeSwitchHook]
    slow = native.pop("slow")
    del python["slow"]
    for run in runs.values():  # (each run's greenlets as roles, to compare the runs)
        main, named, helper = run.pop("greenlets")
        role = {main: "main", named: "worker", helper: "helper", None: None}
        run["logged"] = [role[g] for g in run["logged"]]
        run["events"] = [(e, role.get(a, a), role.get(b, b)) for e, a, b in run["events"]]
        run["current"] = role[run["current"]]
        run["learnt"] = {role[g]: v for g, v in run["learnt"].items()}
    assert native == python
    # (the throw resumes the worker, which switches to the helper, which gives way to
    # the main greenlet; the last switch resumes the worker, which ends: to its parent)
    assert python["logged"] == ["worker", "main"] * 4 + ["worker", "helper", "main", "worker", "main"], \
        python["logged"]
    assert python["current"] == "main" and python["switched"]
    assert [e for e, _, _ in python["events"]].count("throw") == 1
    assert all(base for base, _, _ in python["learnt"].values()) or switches._frame_address is None
    # the Python hook ran only at the switches that taught it something (the thread's
    # first switch, each greenlet's first run, the first switch away from it), the
    # rest in C
    assert 0 < slow <= 5, slow


def _back_to_main() -> None:
    greenlet.getcurrent().parent.switch()


@pytest.mark.engines("native")
def test_the_c_switch_hook_logs_a_greenlet_made_where_an_ended_one_was_as_itself():
    """The C hook keeps the whole records of the greenlets it switched to lately, by
    address, and takes one without a lookup while the record's weak reference still
    names the greenlet switched to. A greenlet that ends and is freed, and another
    made in its memory (the allocator hands the block straight back), must still be
    logged as itself from its first switch, with its own record. (Here a
    greenlet's memory goes to the one made two later: the record made between them
    takes the other block.)"""
    from sampler import greenlets as switches

    if switches.NativeSwitchHook is None:
        native_missing("the C switch hook")
    main = greenlet.getcurrent()
    hook = switches.NativeSwitchHook(None)
    hook.users = 1
    hook.current = switches.record_of(main)
    expected, addresses = [], []
    previous = greenlet.settrace(hook)
    try:
        for _ in range(60):
            g = greenlet.greenlet(_back_to_main)
            g.switch()  # (its first run: the Python hook learns its record)
            g.switch()  # (it is known now: the C hook's common case; then it ends)
            addresses.append(id(g))
            expected.append(switches.record_of(g))
            del g
    finally:
        greenlet.settrace(previous)
    reused = len(addresses) - len(set(addresses))
    if reused < 10:
        pytest.skip(f"the allocator put only {reused} of 60 greenlets where an ended one was")
    main_rec = switches.record_of(main)
    logged = [entry[1] for entry in hook.log if entry[1] is not main_rec]
    assert len(logged) == 2 * len(expected)
    wrong = [(rec.name, want.name) for rec, want in zip(logged, [r for r in expected for _ in (0, 1)])
             if rec is not want]
    assert wrong == [], f"{len(wrong)} of {len(logged)} switches logged as another greenlet: {wrong[:4]}"
    assert hook.slow_calls <= 2 * len(expected) + 2, hook.slow_calls


def _handler_first_turn() -> None:
    spin(0.003)


def _handler_last_turn() -> None:
    spin(0.02)  # (read at 1 ms however loaded the machine)


def _between_turns() -> None:
    spin(0.002)


def _client_turn() -> None:
    spin(0.004)


@pytest.mark.engines("native")
def test_a_stack_read_before_a_switch_and_timed_after_it_is_filed_under_the_greenlet_read(monkeypatch):
    """The engine's thread reads a stack, then its clock; where it loses its core in
    between, greenlets switched to after the read run before the sample's time, and
    their turns are filed before it (from the switch log). The greenlet of the stack
    is the one in force while it was read, from the read's own start on: looked up
    from the thread's last filing, which those turns move on, a server handler's
    stack read as it switched away was filed under the client that ran after it, the
    handler having ended (the spawn-tree test failed so in CI on 3.10; up to 18 of
    17,000 handler samples in 10 s of its server). Made to
    happen here: the handler's last stack read is timed in the client's turn, after
    the main greenlet's."""
    from sampler import native_engine
    from sampler.greenlets import record_of, switch_log

    monkeypatch.setattr(native_engine, "REFRESH_STATIC", 30.0)  # (all filed at the stop)
    file = native_engine.NativeCollector._file
    me = threading.get_ident()
    moved = []

    def timed_late(self, samples, codes):
        log = switch_log(me)
        hrec, crec = record_of(handler), record_of(client)
        last = max(i for i, entry in enumerate(log) if entry[1] is hrec)
        ended_ns = log[last + 1][0]
        client_ns, client_cpu_ns = next(entry[0::2] for entry in log if entry[1] is crec)
        mine = [k for k, s in enumerate(samples) if self._slots[s[0]].ident == me]
        read, read_base = None, 0  # (the last read of the handler's last turn)
        for k in mine:
            if samples[k][6] is not None:  # (else no stack, or SAME: the one before read again)
                read_base = samples[k][5]
            if (read_base == hrec.base and log[last][0] < samples[k][3] < ended_ns
                    and (samples[k][6] is not None or samples[k][1] & native_engine.SAME)):
                read = k
        if read is None:  # (asserted below)
            return file(self, samples, codes)
        late_ns = client_ns + 100_000
        number, flags, read_ns, wall_ns, cpu_ns, base, raw, marks = samples[read]
        samples[read] = (number, flags, read_ns, late_ns, client_cpu_ns + 100_000, base, raw, marks)
        moved.append(samples[read])
        dropped = {k for k in mine if wall_ns < samples[k][3] <= late_ns and k != read}
        return file(self, [s for k, s in enumerate(samples) if k not in dropped], codes)

    monkeypatch.setattr(native_engine.NativeCollector, "_file", timed_late)

    def handle() -> None:
        _handler_first_turn()
        main.switch()
        _handler_last_turn()

    def serve() -> None:
        _client_turn()

    main = greenlet.getcurrent()
    ctl = create_sampler(threading.current_thread(), 0.001)
    handler, client = greenlet.greenlet(handle), greenlet.greenlet(serve)
    _between_turns()  # (places of the main greenlet's, where its turns are filed)
    handler.switch()
    _between_turns()
    handler.switch()  # its last turn, then it ends
    _between_turns()
    client.switch()
    assert handler.dead and client.dead
    ctl.stop()
    assert moved, "no sample of the handler's last turn to time late"
    snaps = ctl.get_snapshots()

    def filed_under(run: str) -> set:  # (the contexts of the stacks of greenlet ``run``)
        return {snaps.sample_thread[i] for i, sid in enumerate(snaps.sample_stack)
                if sid and snaps.stack_frames(sid)[-1].name.rsplit(".", 1)[-1] == run}

    handler_ids, client_ids = filed_under("handle"), filed_under("serve")
    assert len(handler_ids) == len(client_ids) == 1 and handler_ids != client_ids, \
        [snaps.threads[i] for i in handler_ids | client_ids]
