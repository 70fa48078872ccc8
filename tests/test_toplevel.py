"""profile_thunk, the profile context manager and decorator, and trim_snapshots.

The profiled code is real (CPU-bound loops, real threads); assertions are about what
a profile must contain, never about how long anything took.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from analyzer import Profile, analyze_samples
from sampler.gctime import gc_frame
from sampler.snapshot import Frame
from stackshot.toplevel import (
    TEXT, Profiler, _own_files, _run_thunk, call_renderer, profile, profile_thunk,
    trim_snapshots,
)
from run_helpers import REPO
from sampling_helpers import spin_until_sampled
from sampling_helpers import spin_sampled as spin  # profiled code the test reads must be sampled
from snapshot_builders import snapshots as build_snapshots

OWN_DIRS = (os.path.join(REPO, "sampler") + os.sep, os.path.join(REPO, "stackshot") + os.sep)


def worker_loop(cpu_seconds: float) -> int:
    """:func:`spin`'s work under another name: the profile must tell the worker
    thread's work from the main thread's, so it is its own function, not a call."""
    end = time.thread_time() + cpu_seconds
    s = 0
    while time.thread_time() < end:
        for i in range(2000):
            s += i
    return s


def spin_beside_a_worker() -> None:
    """Spin while a thread started here runs :func:`worker_loop`: what ``threads=``
    decides is whether that thread's work is in the profile too."""
    t = threading.Thread(target=worker_loop, args=(0.1,))
    t.start()
    spin(0.05)
    t.join()


def names(prof: Profile) -> set:
    return {n.id for n in prof.nodes}


class Recorder:
    """A renderer that keeps what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, profile, order):
        self.calls.append((profile, order))


# -- profile_thunk -------------------------------------------------------------------

def test_returns_the_thunks_value_and_renders_its_profile():
    r = Recorder()
    assert profile_thunk(lambda: (spin(0.05), "value")[1], render=r, order="self") == "value"
    (prof, order), = r.calls
    assert isinstance(prof, Profile) and order == "self"
    assert "spin" in names(prof)
    assert prof.sample_number > 0


def test_the_profile_holds_no_frame_of_the_profiler():
    r = Recorder()
    profile_thunk(lambda: spin(0.05), render=r)
    prof = r.calls[0][0]
    own = [n for n in prof.nodes if n.src and n.src.startswith(OWN_DIRS)]
    assert own == []
    # the thunk is the root: nothing of the caller (this test, pytest) is above it.
    # (A collection that ran inside the thunk is a root of its own, '<gc>', by
    # default: analyze_samples(gc_frames='root'); the allocations of the polling in
    # spin() trigger one now and then.)
    roots = {e.callee.id for e in prof.root.callees} - {"<gc>"}
    assert roots and all(r.endswith("<lambda>") for r in roots), roots


def test_repeat_runs_the_thunk_n_times_and_returns_the_last_value():
    calls = []

    def thunk():
        calls.append(1)
        spin(0.001)
        return len(calls)

    assert profile_thunk(thunk, repeat=3, render=None) == 3
    assert len(calls) == 3
    calls.clear()
    assert profile_thunk(thunk, repeat=0, render=None) is None
    assert calls == []


def test_threads_true_samples_the_threads_the_thunk_starts():
    r = Recorder()
    profile_thunk(spin_beside_a_worker, threads=True, render=r)
    prof = r.calls[0][0]
    assert {"worker_loop", "spin"} <= names(prof)
    assert len(prof.thread_times) == 2
    # the thread group's hook around Thread.start / run is spliced out
    assert not any("run_announced" in str(n.id) or "install_start_hook" in str(n.id)
                   for n in prof.nodes)


def test_threads_false_samples_the_calling_thread_only():
    r = Recorder()
    profile_thunk(spin_beside_a_worker, threads=False, render=r)
    prof = r.calls[0][0]
    assert "worker_loop" not in names(prof)
    assert len(prof.thread_times) == 1


def test_an_exception_is_reraised_after_the_profile_is_rendered(capsys):
    r = Recorder()

    def thunk():
        spin(0.03)
        raise KeyError("lost")

    with pytest.raises(KeyError, match="lost"):
        profile_thunk(thunk, render=r)
    assert len(r.calls) == 1 and "spin" in names(r.calls[0][0])
    err = capsys.readouterr().err
    assert "raised KeyError: 'lost'" in err


def test_an_exception_stops_the_repetitions():
    calls = []

    def thunk():
        calls.append(1)
        raise ValueError

    with pytest.raises(ValueError):
        profile_thunk(thunk, repeat=5, render=None)
    assert len(calls) == 1


def test_the_periodic_renderer_sees_the_profile_so_far():
    seen: list = []
    done = threading.Event()

    def periodic(prof, order):
        seen.append((prof, order))
        if len(seen) >= 2:
            done.set()

    def thunk():
        deadline = time.monotonic() + 120  # only a guard against hanging
        while not done.is_set() and time.monotonic() < deadline:
            spin(0.002)
        return "finished"

    final = Recorder()
    assert profile_thunk(thunk, periodic_renderer=(0.05, periodic), render=final,
                         order="total") == "finished"
    assert done.is_set()
    assert all(isinstance(p, Profile) and o == "total" for p, o in seen)
    count = len(seen)
    time.sleep(0.2)
    assert len(seen) == count, "the periodic renderer must stop with the thunk"
    assert final.calls[0][0].sample_number >= seen[0][0].sample_number


def test_a_failing_periodic_renderer_is_reported_and_the_thunk_goes_on(capsys):
    failed = threading.Event()

    def periodic(prof):
        failed.set()
        raise RuntimeError("cannot draw")

    def thunk():
        deadline = time.monotonic() + 120
        while not failed.is_set() and time.monotonic() < deadline:
            spin(0.002)
        spin(0.01)  # the thunk outlives its periodic renderer
        return 7

    assert profile_thunk(thunk, periodic_renderer=(0.02, periodic), render=None) == 7
    assert "periodic renderer failed, and stops: RuntimeError: cannot draw" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, error, text", [
    ({"delay": -1}, ValueError, "delay"),
    ({"delay": "fast"}, TypeError, "delay"),
    ({"repeat": -1}, ValueError, "repeat"),
    ({"repeat": 1.5}, ValueError, "repeat"),
    ({"order": "random"}, ValueError, "order must be one of"),
    ({"render": "text"}, TypeError, "render must be a callable"),
    ({"periodic_renderer": 5}, TypeError, "pair"),
    ({"periodic_renderer": (0, print)}, ValueError, "seconds"),
    ({"periodic_renderer": (1, "x")}, TypeError, "callable"),
])
def test_arguments_are_checked_before_the_thunk_runs(kwargs, error, text):
    ran = []
    with pytest.raises(error, match=text):
        profile_thunk(lambda: ran.append(1), **kwargs)
    assert ran == []


def test_the_thunk_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        profile_thunk(42)


def test_the_default_renderer_prints_racket_text(capsys):
    assert repr(TEXT) == "<text renderer>"
    profile_thunk(lambda: spin(0.05))
    out = capsys.readouterr().out
    assert out.startswith("Profiling results")
    assert "Caller" in out and "spin" in out


# -- renderers -----------------------------------------------------------------------

def test_renderers_get_the_order_if_they_accept_it(capsys):
    prof = analyze_samples((0, []))
    got = []
    call_renderer(lambda p: got.append(("one", p)), prof, "self")
    call_renderer(lambda p, o: got.append(("two", o)), prof, "self")
    call_renderer(lambda p, *, order: got.append(("kw", order)), prof, "total")
    call_renderer(lambda p, file=None, *, order="x": got.append(("kw2", order)), prof, "total")
    assert got == [("one", prof), ("two", "self"), ("kw", "total"), ("kw2", "total")]


def test_a_renderer_returning_text_has_it_printed(capsys):
    from analyzer import render_dot

    prof = analyze_samples((0, []))
    call_renderer(lambda p: "hello\n", prof, "topological")
    call_renderer(render_dot, prof, "topological")  # returns its output, takes no order
    out = capsys.readouterr().out
    assert out.startswith("hello\ndigraph")


# -- the context manager -------------------------------------------------------------

def test_with_profile_leaves_the_profile_in_p():
    with profile(render=None) as p:
        assert isinstance(p, Profiler) and p.sampler is not None and p.profile is None
        spin_until_sampled(p.sampler)
    assert p.sampler is None
    assert isinstance(p.profile, Profile)
    assert "spin" in names(p.profile)
    assert len(p.snapshots) > 0
    # the block's caller (this test) is kept: the block is not a thunk
    assert "test_with_profile_leaves_the_profile_in_p" in names(p.profile)


def test_with_profile_renders_then_lets_the_exception_through(capsys):
    r = Recorder()
    with pytest.raises(ZeroDivisionError):
        with profile(render=r, order="total") as p:
            spin(0.03)
            1 / 0
    assert r.calls and r.calls[0][1] == "total"
    assert p.profile is r.calls[0][0]
    assert "raised ZeroDivisionError" in capsys.readouterr().err


def test_with_profile_threads_tracks_threads_started_in_the_block():
    with profile(threads=True, render=None) as p:
        t = threading.Thread(target=worker_loop, args=(0.1,))
        t.start()
        t.join()
    assert "worker_loop" in names(p.profile)


def test_a_profile_object_cannot_be_entered_twice_at_once():
    p = profile(render=None)
    with p:
        with pytest.raises(RuntimeError, match="already running"):
            with p:
                pass
    with p:  # but it can be used again afterwards
        spin(0.001)


# -- the decorator ---------------------------------------------------------------------

def test_decorator_profiles_each_call():
    @profile(render=None)
    def work(n):
        """Doc."""
        spin(n)
        return n * 2

    assert work(0.03) == 0.06
    assert work.__name__ == "work" and work.__doc__ == "Doc."
    first = work.profiler.profile
    assert "spin" in names(first)
    assert any(n.split(".")[-1] == "work" for n in names(first))  # qualified on 3.11+
    work(0.001)
    assert work.profiler.profile is not first


def test_bare_decorator_renders_with_the_default(capsys):
    @profile
    def work():
        return spin(0.03)

    work()
    assert capsys.readouterr().out.startswith("Profiling results")


def test_recursive_calls_stay_in_one_profile():
    renders = Recorder()

    @profile(render=renders)
    def fact(n):
        spin(0.002)
        return 1 if n <= 1 else n * fact(n - 1)

    assert fact(5) == 120
    assert len(renders.calls) == 1


def test_decorating_a_coroutine_function_is_refused():
    async def coro():
        pass

    with pytest.raises(TypeError, match="coroutine"):
        profile(coro)


# -- trim_snapshots ------------------------------------------------------------------

def _frame_of(fn, name):
    code = fn.__code__
    return Frame(name, code.co_filename, code.co_firstlineno, None)


def test_trim_cuts_outside_the_entry_and_splices_the_profilers_frames():
    own = next(iter(_own_files()))
    entry = _frame_of(_run_thunk, "_run_thunk")
    enter = _frame_of(Profiler.__enter__, "Profiler.__enter__")  # names qualified or not
    hook = Frame("hook", own, 10, None)
    stdlib = Frame("WeakSet.add", "_weakrefset.py", 85, 86)
    exit_ = _frame_of(Profiler.__exit__, "Profiler.__exit__")
    join = _frame_of(threading.Thread.join, "Thread.join")
    caller, user, inner = Frame("caller", "u.py", 1, 2), Frame("user", "u.py", 5, 6), Frame("inner", "u.py", 9, 9)
    snaps = build_snapshots([
        ("main", 0.0, 0.0, [user, entry, caller]),          # innermost first
        ("main", 0.1, 0.1, [inner, hook, user, entry, caller]),
        ("main", 0.2, 0.2, [hook, caller]),                 # the profiler's own code
        ("main", 0.3, 0.3, [stdlib, hook, enter, caller]),  # the profiler at work
        # ... and inside the entry (a block in a notebook cell, whose entry is the
        # cell's runner): a collection as the stop joins the collector thread
        ("main", 0.4, 0.4, [gc_frame(0), join, hook, exit_, user, entry, caller]),
        ("other", 0.0, 0.0, [inner, hook, user]),           # no entry: spliced only
        ("other", 0.1, 0.1, [user]),
    ])
    trimmed = trim_snapshots(snaps, [_run_thunk])
    stacks = [trimmed.stack_frames(s) for s in trimmed.sample_stack]
    assert [[f.name for f in st] for st in stacks] == [
        ["user"], ["inner", "user"], [], [], [], ["inner", "user"], ["user"]]
    assert {f.name for f in trimmed.frames} == {"user", "inner"}
    assert trimmed.sample_count == snaps.sample_count
    assert list(trimmed.sample_cpu) == list(snaps.sample_cpu)
    assert trimmed.runs == snaps.runs




# -- processes and threads the profile does not see ------------------------------------

def test_a_child_forked_inside_the_block_never_renders_the_parents_profile(tmp_path):
    from run_helpers import SPIN_SOURCE, repo_env

    script = tmp_path / "forks.py"
    script.write_text(SPIN_SOURCE + """
import os, stackshot
with stackshot.profile():
    spin(0.05)
    pid = os.fork()
    if pid == 0:
        spin(0.02)
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=repo_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Profiling results") == 1 and "spin" in proc.stdout


def test_the_header_says_other_threads_ran_unsampled():
    r = Recorder()

    def code():
        t = threading.Thread(target=spin, args=(0.1,))
        t.start()
        t.join()
        spin(0.02)

    profile_thunk(code, render=r)
    from analyzer import render_text

    import re

    found = re.search(r"(\d+) other threads? used up to ", render_text(r.calls[0][0]))
    assert found and int(found[1]) >= 1  # the thread started (and any other that ran)
    r.calls.clear()
    profile_thunk(code, render=r, threads=True)  # sampled: nothing to say
    assert "other thread" not in render_text(r.calls[0][0])


def test_threads_installing_profile_functions_keep_working_while_profiled():
    """On 3.10-3.11 ``sys.setprofile`` raises its audit event holding a flag that every
    thread shares; stackshot's audit hook, a Python function, let another thread run
    there, and that thread's own ``sys.setprofile`` raised ``RuntimeError`` (a gevent
    threadpool worker's did for each task: the profiled server lost a request)."""
    finished, stop = [], threading.Event()

    def install_and_remove() -> None:
        while not stop.is_set():
            sys.setprofile(lambda *event: None)
            sys.setprofile(None)
        finished.append(threading.get_ident())  # (not reached when a thread's start or loop raised)

    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch wherever the interpreter lets them)
    try:
        with profile(render=None):
            threads = [threading.Thread(target=install_and_remove) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.3)
            stop.set()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(saved)
    assert len(finished) == len(threads)


def test_a_programs_own_thread_profile_function_still_sees_threads_started_while_profiled():
    """The report counts threads started while only some are sampled with a
    threading.setprofile hook of its own, which hands each thread on to the program's."""
    seen = []

    def programs_hook(frame, event, arg):
        seen.append((threading.get_ident(), event, frame.f_code.co_name))

    def work() -> None:
        spin(0.01)

    threading.setprofile(programs_hook)
    try:
        with profile(render=None) as p:
            t = threading.Thread(target=work)
            t.start()
            t.join()
    finally:
        threading.setprofile(None)
    mine = [(event, name) for ident, event, name in seen if ident == t.ident]
    assert ("call", "work") in mine and ("return", "work") in mine
    assert p.snapshots.runs[0].extra.get("other_threads", 0) >= 1


def test_a_thread_profile_function_the_program_sets_while_profiled_stays_set():
    def programs_hook(frame, event, arg):
        pass

    try:
        with profile(render=None):
            threading.setprofile(programs_hook)
        assert threading.getprofile() is programs_hook
    finally:
        threading.setprofile(None)


def test_use_errortrace_python_mode_reaches_the_sampler():
    # 'python' (Python frames only) is a mode of its own, not just "true"
    assert Profiler(use_errortrace="python", render=None).use_errortrace == "python"
    with pytest.raises(ValueError, match="use_errortrace must be"):
        Profiler(use_errortrace="c", render=None)
