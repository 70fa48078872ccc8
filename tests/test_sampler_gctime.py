"""Garbage collection time (sampler.gctime): every collection filed as a ``<gc>`` sample
of the stack that triggered it, its time taken out of the next regular sample, on
both engines, and the hook gone when sampling ends."""

import gc
import threading
import time

import pytest

from analyzer import analyze_samples, render_text
from analyzer.gcview import gc_times
from sampler import create_sampler
from sampler.gctime import GCWatch


class _Cell:
    def __init__(self) -> None:
        self.other = self


def _make_cycles() -> None:
    for _ in range(300):
        a, b = _Cell(), _Cell()
        a.other, b.other = b, a
        a.pad = [[] for _ in range(4)]


def _cycles_for(cpu_seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_seconds:
        _make_cycles()


def _ours(hook) -> bool:
    return getattr(hook, "__self__", None).__class__ is GCWatch


def test_collections_are_gc_samples_matching_the_callbacks_cpu_time(sampler_engine):
    measured = {"cpu": 0.0, "n": 0}
    opened = []

    me = threading.get_ident()

    def timing(phase, info):  # the truth: this thread's collections' CPU time, as a user measures it
        if threading.get_ident() != me:  # (the Python engine's collector collects too)
            return
        if phase == "start":
            opened.append(time.thread_time())
        elif opened:
            measured["cpu"] += time.thread_time() - opened.pop()
            measured["n"] += 1

    cpu0 = time.thread_time()
    sampler = create_sampler(threading.current_thread(), 0.002, gc_time=True)
    gc.callbacks.append(timing)
    try:
        _cycles_for(0.8)
    finally:
        gc.callbacks.remove(timing)
        sampler.stop()
    spent = time.thread_time() - cpu0
    snaps = sampler.get_snapshots()
    profile = analyze_samples(snaps, gc_frames="stack")
    times = gc_times(profile)
    assert measured["n"] > 50 and 0 in times
    # each collection is filed once, with the CPU time the callbacks saw (our hook's
    # own part and the timing callback's differ by a few microseconds a collection)
    total_gc = sum(times.values())
    slack = 10e-6 * measured["n"] + 0.005
    assert abs(total_gc - measured["cpu"]) <= 0.1 * measured["cpu"] + slack, (total_gc, measured)
    # no double count: the profile's time is at most the thread's CPU time
    assert profile.total_time <= spent + 0.005, (profile.total_time, spent)
    # filed under the stack that triggered it
    gc_nodes = [n for n in profile.nodes if n.id == "<gc>"]
    callers = {e.caller.id for n in gc_nodes for e in n.callers}
    assert callers & {"_make_cycles", "_Cell.__init__", "_make_cycles.<locals>.<listcomp>"}, callers
    extra = snaps.runs[0].extra
    assert extra["gc_collections"] >= measured["n"] - 1
    assert set(extra["gc_seconds"]) == {str(g) for g in times}
    assert "; GC " in render_text(profile) and "gen0" in render_text(profile)


def test_the_hook_is_installed_while_sampling_and_gone_after_stop(sampler_engine):
    assert not any(_ours(h) for h in gc.callbacks)
    with create_sampler(threading.current_thread(), 0.005, gc_time=True) as sampler:
        assert sum(_ours(h) for h in gc.callbacks) == 1
        sampler.pause()
        gc.collect()
        sampler.resume()
    assert not any(_ours(h) for h in gc.callbacks)
    with create_sampler(threading.current_thread(), 0.005, gc_time=False):
        assert not any(_ours(h) for h in gc.callbacks)
    with create_sampler(threading.current_thread(), 0.005) as sampler:  # the engine's default
        assert sum(_ours(h) for h in gc.callbacks) == (sampler.engine == "native")


@pytest.mark.engines("python")
def test_collections_while_paused_are_not_recorded():
    sampler = create_sampler(threading.current_thread(), 0.005, gc_time=True)
    try:
        sampler.pause()
        for _ in range(5):
            gc.collect()
        assert sampler._gc_watch.collections == 0
        sampler.resume()
        gc.collect()
        assert sampler._gc_watch.collections == 1
    finally:
        sampler.stop()


def test_gc_time_takes_a_bool(sampler_engine):
    with pytest.raises(TypeError, match="gc_time must be True or False"):
        create_sampler(threading.current_thread(), 0.01, gc_time="yes")
