"""Choosing an engine, and what only the native engine promises: samples fall where
each thread really is, even while it holds the GIL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

import sampler
from analyzer import analyze_samples
from sampler import engines

EXPECT_NO_NATIVE = os.environ.get("STACKSHOT_EXPECT_NO_NATIVE") == "1"


def test_the_snapshots_say_which_engine_took_them(sampler_engine):
    ctl = sampler.create_sampler(threading.current_thread(), 0.001)
    sum(i * i for i in range(200_000))
    ctl.stop()
    assert ctl.engine == sampler_engine
    assert ctl.get_snapshots().runs[0].engine == sampler_engine


def test_an_explicit_engine_beats_the_environment(sampler_engine, monkeypatch):
    monkeypatch.setenv("STACKSHOT_ENGINE", "native" if sampler_engine == "python" else "python")
    ctl = sampler.create_sampler(threading.current_thread(), 0.001, engine=sampler_engine)
    ctl.stop()
    assert ctl.get_snapshots().runs[0].engine == sampler_engine


@pytest.mark.engines("python")
@pytest.mark.parametrize("bad", ["fast", "", 3, "NATIVE"])
def test_a_bad_engine_is_refused_before_any_thread_starts(bad, monkeypatch):
    before = threading.active_count()
    with pytest.raises((ValueError, TypeError), match="engine must be one of 'native', 'python'"):
        sampler.create_sampler(threading.current_thread(), 0.001, engine=bad)
    monkeypatch.setenv("STACKSHOT_ENGINE", str(bad) or "none")
    with pytest.raises(ValueError, match="STACKSHOT_ENGINE must be one of"):
        sampler.create_sampler(threading.current_thread(), 0.001)
    assert threading.active_count() == before


@pytest.mark.skipif(not EXPECT_NO_NATIVE, reason="runs where the package was installed without the extension")
def test_without_the_extension_the_python_engine_runs_and_says_why(monkeypatch):
    assert not engines.native_available()
    monkeypatch.delenv("STACKSHOT_ENGINE", raising=False)
    code = ("import threading, warnings, sampler\n"
            "warnings.simplefilter('always')\n"
            "ctl = sampler.create_sampler(threading.current_thread(), 0.001)\n"
            "ctl.stop(); print(ctl.get_snapshots().runs[0].engine)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "STACKSHOT_ENGINE"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "python"
    assert "stackshot uses its Python engine: the C extension sampler._native is not built" in proc.stderr
    with pytest.raises(RuntimeError, match="engine='native' is not available"):
        sampler.create_sampler(threading.current_thread(), 0.001, engine="native")


@pytest.mark.skipif(EXPECT_NO_NATIVE, reason="the extension is not built here")
def test_the_default_is_the_native_engine_where_it_is_built(monkeypatch):
    monkeypatch.delenv("STACKSHOT_ENGINE", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert engines.choose(None) == "native"


def _crunch(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _bursts(n: int) -> float:
    """Work for ~3 ms, then sleep 8 ms, n times; returns the CPU spent in _crunch."""
    spent = 0.0
    for _ in range(n):
        t0 = time.thread_time()
        _crunch(0.003)
        spent += time.thread_time() - t0
        time.sleep(0.008)
    return spent


@pytest.mark.engines("native")
def test_work_that_alternates_with_sleep_is_charged_to_the_work():
    """The shape that fooled the GIL-taking engine (issue 9): 3 ms of work, 8 ms of
    sleep. The truth, measured with thread_time around the work, is that nearly all of
    the thread's CPU is in _crunch; the native engine sees it there."""
    ctl = sampler.create_sampler(threading.current_thread(), 0.001)
    t0 = time.thread_time()
    truth = _bursts(60)
    total = time.thread_time() - t0
    ctl.stop()
    profile = analyze_samples(ctl.get_snapshots())
    crunch = profile.find("_crunch")
    share = crunch.total / profile.total_time
    assert truth / total > 0.95  # the workload is what it claims to be
    assert share > 0.85, f"_crunch got {share:.1%} of the CPU, the truth is {truth / total:.1%}"


@pytest.mark.engines("native")
def test_a_thread_holding_the_gil_is_seen_where_it_is():
    """A thread in pure-Python work never releases the GIL for the collector; another
    thread waits in a lock. Samples of the worker show its own functions, not the
    points where it let go of the GIL."""
    stop = threading.Event()
    inside = []

    def inner_loop() -> int:
        x = 0
        for i in range(20_000):
            x += i * i
        return x

    def worker() -> None:
        while not stop.is_set():
            inner_loop()
        inside.append(True)

    t = threading.Thread(target=worker)
    t.start()
    ctl = sampler.create_sampler(t, 0.001)
    time.sleep(0.3)
    ctl.stop()
    stop.set()
    t.join()
    snaps = ctl.get_snapshots()
    tops = [snaps.stack_frames(s)[0].name.rpartition(".")[2] for s in snaps.sample_stack if s]
    assert tops and tops.count("inner_loop") / len(tops) > 0.8, tops[:20]
