"""The controller: every message of Racket's sampler, with real threads."""

import math
import threading
import time
from collections import Counter

import pytest

import sampler
from sampler import SamplerError, create_sampler

from sampling_helpers import Worker, function_names, names_seen, spin, wait_until


def hot_loop():
    spin(0.01)


def test_samples_a_running_thread_with_its_real_stack():
    with Worker(hot_loop) as w:
        with create_sampler(w.thread, 0.001) as ctl:
            # (the native engine may file more samples than ticks: a run that ended
            # in sleep is a sample of its own)
            wait_until(lambda: min(len(s := ctl.get_snapshots()), s.runs[0].ticks) >= 50,
                       what="50 samples")
        snaps = ctl("get-snapshots")
    assert ctl.stopped
    assert {t.name for t in snaps.threads} == {"worker"}
    # (most samples, not the last one: the worker spends a little of its time in its
    # loop's Event.is_set between two calls, where 1 sample in ~2,000 lands, and
    # CI once had the last one there)
    stacks = Counter(tuple(function_names(snaps, i)) for i in range(len(snaps)))
    names = stacks.most_common(1)[0][0]
    assert names[0] == "spin" and "hot_loop" in names and names[-1].endswith("_bootstrap"), stacks
    # frames carry real files and lines: hot_loop's frame points into this file
    frame = next(f for f in snaps.frames if f.name == "hot_loop")
    assert frame.filename == __file__
    assert frame.lineno == hot_loop.__code__.co_firstlineno + 1
    run = snaps.runs[0]
    assert run.ticks >= 50 and run.requested_delay == 0.001 and run.stopped
    assert run.collector_cpu > 0 and run.achieved_rate > 0 and run.requested_rate == 1000.0


def test_thread_cpu_time_follows_the_thread_not_the_clock():
    idle = threading.Event()
    sleeper = threading.Thread(target=idle.wait, name="sleeper")
    with Worker(hot_loop, name="busy") as w:
        sleeper.start()
        with create_sampler([w.thread, sleeper], 0.002) as ctl:
            wait_until(lambda: len(ctl.get_snapshots()) >= 60)
        idle.set()
        sleeper.join()
    snaps = ctl.get_snapshots()
    cpu_by_thread = {t.name: 0 for t in snaps.threads}
    wall_by_thread = dict(cpu_by_thread)
    deltas_cpu, deltas_wall = snaps.cpu_deltas(), snaps.wall_deltas()
    for i, tid in enumerate(snaps.sample_thread):
        cpu_by_thread[snaps.threads[tid].name] += deltas_cpu[i]
        wall_by_thread[snaps.threads[tid].name] += deltas_wall[i]
    assert wall_by_thread["sleeper"] > 0
    # a thread blocked on an Event uses (almost) no CPU while the busy one uses plenty
    assert cpu_by_thread["sleeper"] < cpu_by_thread["busy"] / 5


def test_pause_and_resume_nest_and_stop_collecting():
    with Worker(hot_loop) as w:
        ctl = create_sampler(w.thread, 0.001)
        wait_until(lambda: len(ctl.get_snapshots()) >= 5)
        ctl("pause")
        ctl("pause")
        assert ctl.paused
        time.sleep(0.05)
        n = len(ctl.get_snapshots())
        time.sleep(0.1)
        assert len(ctl.get_snapshots()) == n
        ctl("resume")
        time.sleep(0.1)
        assert len(ctl.get_snapshots()) == n, "one resume must not undo two pauses"
        ctl("resume")
        wait_until(lambda: len(ctl.get_snapshots()) > n + 5, what="sampling to restart")
        with pytest.raises(SamplerError, match="without a matching 'pause'"):
            ctl("resume")
        ctl("stop")


def test_process_cpu_time_counts_only_while_not_paused():
    with Worker(hot_loop) as w:
        ctl = create_sampler(w.thread, 0.005)
        spin(0.1)
        ctl.pause()
        before = ctl.get_snapshots().runs[0]
        spin(0.5)  # this thread and the worker burn CPU while paused
        during = ctl.get_snapshots().runs[0]
        ctl.resume()
        ctl.stop()
    assert during.process_cpu == pytest.approx(before.process_cpu, abs=0.02)
    assert during.sampling_wall == pytest.approx(before.sampling_wall, abs=0.02)
    assert ctl.get_snapshots().runs[0].duration >= during.sampling_wall + 0.4


def test_stop_is_idempotent_and_final():
    with Worker(hot_loop) as w:
        ctl = create_sampler(w.thread, 0.001)
        wait_until(lambda: len(ctl.get_snapshots()) >= 3)
        ctl("stop")
        ctl("stop")
        n = len(ctl.get_snapshots())
        time.sleep(0.05)
        assert len(ctl.get_snapshots()) == n
        ctl("pause")
        ctl("resume")
        time.sleep(0.05)
        assert len(ctl.get_snapshots()) == n, "nothing restarts a stopped sampler"
    assert ctl.get_snapshots() == ctl.get_snapshots()


def test_set_tracked_switches_threads_and_number_sets_delay():
    def in_a():
        spin(0.01)

    def in_b():
        spin(0.01)

    with Worker(in_a, "a") as a, Worker(in_b, "b") as b:
        ctl = create_sampler(a.thread, 0.002)
        wait_until(lambda: len(ctl.get_snapshots()) >= 5)
        ctl("set-tracked!", [b.thread])
        n = len(ctl.get_snapshots())
        wait_until(lambda: len(ctl.get_snapshots()) >= n + 5)
        ctl("set-tracked!", 0.004)
        assert ctl.delay == 0.004
        ctl("set-delay!", 0.003)
        assert ctl.delay == 0.003
        ctl("stop")
    snaps = ctl.get_snapshots()
    names = [snaps.threads[t].name for t in snaps.sample_thread]
    first_b = names.index("b")
    assert set(names[:first_b]) == {"a"}
    assert "a" not in names[first_b + 2:], "after set-tracked! only b is sampled"
    assert snaps.runs[0].requested_delay == 0.003


def test_get_snapshots_is_consistent_while_the_collector_writes():
    with Worker(hot_loop) as w:
        ctl = create_sampler(w.thread, 0)
        wait_until(lambda: len(ctl.get_snapshots()) > 0)
        values = []
        for _ in range(30):
            values.append(ctl.get_snapshots())  # validate() runs in the constructor
            time.sleep(0.002)
        ctl.stop()
    lengths = [len(v) for v in values]
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0]
    # an earlier value is a prefix of a later one
    a, b = values[5], values[-1]
    assert [b.stack_frames(s) for s in b.sample_stack[: len(a)]] == [
        a.stack_frames(s) for s in a.sample_stack
    ]


@pytest.mark.parametrize(
    "message, arg, error, text",
    [
        ("frobnicate", None, ValueError, "valid messages: pause, resume, stop"),
        ("set-delay!", -1, ValueError, ">= 0"),
        ("set-delay!", "fast", TypeError, "real number"),
        ("set-delay!", math.nan, ValueError, "finite"),
        ("set-tracked!", "main", TypeError, "cannot track 'main'"),
        ("set-tracked!", [threading.main_thread(), [42]], TypeError, r"at to_track\[1\]\[0\]"),
    ],
)
def test_bad_messages_and_arguments_name_the_culprit(message, arg, error, text):
    with create_sampler([], 0.01) as ctl:
        with pytest.raises(error, match=text):
            if arg is None:
                ctl(message)
            else:
                ctl(message, arg)
        assert not ctl.errors


def test_argument_count_is_checked():
    with create_sampler([], 0.01) as ctl:
        with pytest.raises(TypeError, match="needs an argument"):
            ctl("set-delay!")
        with pytest.raises(TypeError, match="takes no argument"):
            ctl("pause", 1)
        with pytest.raises(TypeError, match="a sampler message is a string"):
            ctl(42)
        with pytest.raises(ValueError, match="unknown sampler message"):
            ctl("get-snapshot")


@pytest.mark.parametrize(
    "args, error, text",
    [
        ((object(), 0.01), TypeError, "cannot track <object"),
        (([threading.main_thread(), "x"], 0.01), TypeError, r"to_track\[1\]"),
        (([], -0.5), ValueError, ">= 0"),
        (([], "1ms"), TypeError, "real number"),
        (([], True), TypeError, "bool"),
        (([], 0.01, "key"), TypeError, "custom_keys must be a list"),
        (([], 0.01, [["unhashable"]]), TypeError, r"custom_keys\[0\] must be hashable"),
    ],
)
def test_create_sampler_validates_before_starting_a_thread(args, error, text):
    before = threading.active_count()
    import sys

    frames_before = set(sys._current_frames())
    with pytest.raises(error, match=text):
        create_sampler(*args)
    assert set(sys._current_frames()) <= frames_before
    assert threading.active_count() == before


def test_use_errortrace_is_checked_and_accepted():
    with pytest.raises(ValueError, match="use_errortrace must be"):
        create_sampler([], 0.01, use_errortrace="yes")
    for mode in (True, "python"):
        ctl = create_sampler([], 0.01, use_errortrace=mode)
        assert ctl.use_errortrace == mode
        ctl.stop()


@pytest.mark.engines("python")  # the native engine never waits for the GIL
def test_lowers_the_switch_interval_only_while_sampling():
    import sys

    original = sys.getswitchinterval()
    with Worker(hot_loop) as w:
        ctl = create_sampler(w.thread, 0.001)
        assert sys.getswitchinterval() < 0.001
        ctl.pause()
        assert sys.getswitchinterval() == original
        ctl.resume()
        assert sys.getswitchinterval() < 0.001
        ctl.stop()
    assert sys.getswitchinterval() == original
    slow = create_sampler([], 0.05)
    assert sys.getswitchinterval() == original
    slow.stop()


def test_all_threads_tracks_present_and_future_threads_but_not_samplers():
    with create_sampler(sampler.ALL_THREADS, 0.002) as ctl:
        other = create_sampler([], 0.01)
        with Worker(hot_loop, "late-comer"):
            wait_until(lambda: "late-comer" in {t.name for t in ctl.get_snapshots().threads})
        other.stop()
    snaps = ctl.get_snapshots()
    names = {t.name for t in snaps.threads}
    assert "MainThread" in names and "late-comer" in names
    assert "_loop" not in names_seen(snaps), "a collector never samples itself or another"


def test_methods_and_repr():
    ctl = create_sampler([], 0.01)
    assert "sampling" in repr(ctl)
    ctl.pause()
    assert "paused" in repr(ctl)
    ctl.stop()
    assert "stopped" in repr(ctl)
    assert ctl("get-custom-snapshots") == [] and ctl("get-errors") == []


# Issue 10, item 12: delays that passed the check but killed the collector after one
# sample (seen only through get-errors), and 2**2000, which raised a raw OverflowError.
_BAD_DELAYS = [1e10, 1e300, 2**1000, 2**2000, 5e-324, 86400.5, math.inf]


@pytest.mark.parametrize("delay", _BAD_DELAYS, ids=repr)
def test_delays_the_collector_cannot_keep_are_refused_by_create_sampler(delay):
    with pytest.raises(ValueError, match=r"one day|too short") as info:
        create_sampler([], delay)
    assert len(str(info.value)) < 200 and "\n" not in str(info.value)


@pytest.mark.parametrize("delay", _BAD_DELAYS, ids=repr)
def test_set_delay_refuses_them_and_the_collector_keeps_sampling(delay):
    with Worker(hot_loop) as w, create_sampler(w.thread, 0.002) as ctl:
        with pytest.raises(ValueError, match=r"one day|too short"):
            ctl("set-delay!", delay)
        with pytest.raises(ValueError, match=r"one day|too short"):
            ctl("set-tracked!", delay)
        before = len(ctl.get_snapshots())
        wait_until(lambda: len(ctl.get_snapshots()) > before + 3)
        assert ctl.delay == 0.002 and ctl("get-errors") == []


@pytest.mark.parametrize("delay", [0, 1e-6, 86400])
def test_the_bounds_themselves_are_accepted_and_work(delay):
    with Worker(hot_loop) as w, create_sampler(w.thread, 0.002) as ctl:
        ctl("set-delay!", delay)
        if delay < 1:
            before = len(ctl.get_snapshots())
            wait_until(lambda: len(ctl.get_snapshots()) > before + 3)
        ctl.stop()
        assert ctl("get-errors") == []


@pytest.mark.engines("python")  # the native engine never changes the switch interval
def test_a_switch_interval_the_program_sets_while_sampling_is_kept():
    import sys

    original = sys.getswitchinterval()
    try:
        ctl = create_sampler([], 0.001)
        assert sys.getswitchinterval() < 0.001
        sys.setswitchinterval(0.02)  # the program's own choice, made while we hold ours
        ctl.pause()
        assert sys.getswitchinterval() == pytest.approx(0.02)
        ctl.resume()  # lowered again for sampling, and 0.02 is what comes back
        assert sys.getswitchinterval() < 0.001
        ctl.stop()
        assert sys.getswitchinterval() == pytest.approx(0.02)
    finally:
        sys.setswitchinterval(original)
