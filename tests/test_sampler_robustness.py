"""The profiler must never break the program it watches: hostile situations, for real."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

import sampler
from sampler import ThreadGroup, create_sampler

from sampling_helpers import Worker, spin, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_hundreds_of_threads_created_and_exiting_while_sampled():
    group = ThreadGroup("churn")
    ctl = create_sampler([group, sampler.ALL_THREADS], 0)
    results = []

    def short_life(i):
        results.append(sum(range(i * 100)))

    with group:
        for wave in range(30):
            threads = [threading.Thread(target=short_life, args=(i,)) for i in range(20)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    ctl.stop()
    snaps = ctl.get_snapshots()
    assert len(results) == 600
    assert ctl.errors == []
    assert len(snaps) > 0 and snaps.runs[0].errors == ()
    assert group.threads() == []


def test_deep_recursion_of_ten_thousand_frames():
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    ready, done = threading.Event(), threading.Event()

    def deep(n):
        if n == 0:
            ready.set()
            done.wait()
            return 0
        return deep(n - 1) + 1

    old_stack = threading.stack_size(256 * 1024 * 1024)
    try:
        t = threading.Thread(target=deep, args=(10_000,))
        t.start()
    finally:
        threading.stack_size(old_stack)
    try:
        assert ready.wait(30)
        ctl = create_sampler(t, 0.001)
        wait_until(lambda: len(ctl.get_snapshots()) >= 5)
        ctl.stop()
    finally:
        done.set()
        t.join()
        sys.setrecursionlimit(limit)
    snaps = ctl.get_snapshots()
    depth = len(snaps.stack(snaps.sample_stack[-1]))
    assert depth > 10_000
    # stored as a trie: the 10,000 shared frames are stored once, not per sample
    assert len(snaps.stack_frame) < 10_100


def test_fork_while_sampling_child_reports_stopped_and_does_not_hang():
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform")
    code = """
        import os, sys, threading, time
        import sampler
        from tests.sampling_helpers import spin, spin_until_sampled
        ctl = sampler.create_sampler(threading.main_thread(), 0.0005)
        spin_until_sampled(ctl)  # the child checks it keeps what was taken before the fork
        pid = os.fork()
        if pid == 0:
            ok = ctl.stopped and len(ctl.get_snapshots()) > 0
            ctl.pause(); ctl.resume(); ctl.stop()
            snaps = ctl.get_snapshots()
            ok = ok and snaps.runs[0].extra.get("forked_child") is True
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        spin(0.05)
        assert not ctl.stopped
        ctl.stop()
        print("child", os.waitstatus_to_exitcode(status), "parent samples", len(ctl.get_snapshots()) > 0)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "child 0 parent samples True" in proc.stdout


def test_interpreter_exit_with_a_running_sampler_is_clean():
    code = """
        import threading, sampler
        from tests.sampling_helpers import spin
        worker = threading.Thread(target=spin, args=(0.3,), daemon=True)
        worker.start()
        a = sampler.create_sampler(sampler.ALL_THREADS, 0.0005)
        b = sampler.create_sampler(worker, 0.001)
        b.pause()
        spin(0.1)
        print("bye")
    """
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout == "bye\n"
    assert proc.stderr == ""


def test_several_samplers_at_once_each_see_their_own_threads():
    with Worker(lambda: spin(0.01), "one") as one, Worker(lambda: spin(0.01), "two") as two:
        samplers = [create_sampler(one.thread, 0.001), create_sampler(two.thread, 0.002),
                    create_sampler([one.thread, two.thread], 0.003)]
        wait_until(lambda: all(len(s.get_snapshots()) >= 20 for s in samplers))
        for s in samplers:
            s.stop()
    names = [{t.name for t in s.get_snapshots().threads} for s in samplers]
    assert names == [{"one"}, {"two"}, {"one", "two"}]


def test_an_exception_inside_the_collector_is_reported_not_raised(monkeypatch, sampler_engine):
    from sampler import tracking

    calls = {"n": 0}
    # where each engine's collector does its Python work every turn
    if sampler_engine == "native":
        from sampler.native_engine import NativeCollector as owner
        name = "_file"
    else:
        owner, name = tracking.Tracker, "targets"
    original = getattr(owner, name)

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("boom in the collector")
        return original(*args)

    monkeypatch.setattr(owner, name, flaky)
    with Worker(lambda: spin(0.01)) as w:
        ctl = create_sampler(w.thread, 0.001)
        wait_until(lambda: len(ctl.errors) >= 2 and len(ctl.get_snapshots()) >= 10)
        ctl.stop()
    assert "boom in the collector" in ctl.errors[0]
    assert "boom in the collector" in ctl.get_snapshots().runs[0].errors[0]
    assert ctl("get-errors") == ctl.errors


def test_pause_resume_stop_from_many_threads_at_once():
    with Worker(lambda: spin(0.01)) as w:
        ctl = create_sampler(w.thread, 0.001)
        barrier = threading.Barrier(8)
        failures = []

        def hammer():
            try:
                barrier.wait()
                for _ in range(200):
                    ctl.pause()
                    ctl.get_snapshots()
                    ctl.resume()
            except Exception as e:  # pragma: no cover - reported below
                failures.append(e)

        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == [] and not ctl.paused
        stoppers = [threading.Thread(target=ctl.stop) for _ in range(4)]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
    assert ctl.stopped and ctl.errors == []
    n = len(ctl.get_snapshots())
    assert len(ctl.get_snapshots()) == n
