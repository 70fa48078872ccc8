"""Tracking what can never be sampled warns, once, on both engines: a thread that
has ended (at create_sampler or set-tracked!), a thread never started while it was
tracked (when the sampler stops or set-tracked! replaces it)."""

from __future__ import annotations

import threading
import warnings

from sampler import TrackingWarning, create_sampler


def _ended_thread(name: str) -> threading.Thread:
    t = threading.Thread(target=lambda: None, name=name)
    t.start()
    t.join()
    return t


def _caught(action):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [w for w in caught if issubclass(w.category, TrackingWarning)]


def test_an_ended_thread_warns_at_create_sampler_pointing_at_the_caller():
    done = _ended_thread("finished-worker")
    ctl = None

    def start():
        nonlocal ctl
        ctl = create_sampler([done, threading.current_thread()], 0.001)

    (w,) = _caught(start)
    assert "thread 'finished-worker' has already ended" in str(w.message)
    assert w.filename == __file__  # the user's line, not the sampler's
    assert _caught(lambda: ctl("stop")) == []  # once: not again at stop


def test_an_ended_thread_warns_at_set_tracked():
    ctl = create_sampler(threading.current_thread(), 0.001)
    try:
        (w,) = _caught(lambda: ctl("set-tracked!", [_ended_thread("gone")]))
        assert "thread 'gone' has already ended" in str(w.message)
    finally:
        ctl("stop")


def test_a_thread_never_started_warns_when_the_sampler_stops_once():
    never = threading.Thread(target=lambda: None, name="never-started")
    ctl = create_sampler(never, 0.001)
    (w,) = _caught(lambda: ctl("stop"))
    assert "thread 'never-started' was tracked but never started" in str(w.message)
    assert _caught(lambda: ctl("stop")) == []


def test_a_thread_never_started_warns_when_set_tracked_replaces_it():
    never = threading.Thread(target=lambda: None, name="replaced")
    ctl = create_sampler(never, 0.001)
    try:
        (w,) = _caught(lambda: ctl("set-tracked!", threading.current_thread()))
        assert "'replaced' was tracked but never started" in str(w.message)
    finally:
        assert _caught(lambda: ctl("stop")) == []


def test_a_thread_started_in_time_or_a_live_one_never_warns():
    later = threading.Thread(target=lambda: None)
    caught = _caught(lambda: _run(create_sampler([later, threading.current_thread()], 0.001), later))
    assert caught == []


def _run(ctl, thread):
    thread.start()
    thread.join()
    ctl("stop")
