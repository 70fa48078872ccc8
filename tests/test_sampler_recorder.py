"""The recorder's entry points (shared by the Python and the native engine), and its
single-writer, lock-free reading, with a real writer thread."""

import threading
import time

import pytest

from sampler import Frame, RunInfo
from sampler.recorder import Recorder
from sampler.tracking import Target
from sampling_helpers import function_names, wait_until


def test_stacks_marks_and_samples_through_the_engine_entry_points():
    rec = Recorder(["request"], time.perf_counter())
    main = Frame("main", "app.py", 1, 3)
    handle = Frame("handle", "app.py", 10, 12)
    assert rec.stack_id([]) == 0
    outer = rec.stack_id([main])
    inner = rec.stack_id([main, handle])
    assert rec.stack_id([main, handle]) == inner and inner != outer
    assert rec.mark_set_id(()) == 0
    marks = ((("r1",),),)
    mid = rec.mark_set_id(marks[0])
    assert rec.mark_set_id(marks[0]) == mid != 0
    target = Target(("ident", 1, None), "worker", None, None, "thread")
    ctx = rec.context(target, None, 0)
    assert rec.context(target, None, 5) is ctx
    rec.append_sample(ctx, outer, 1000, 500)
    rec.append_sample(ctx, inner, 3000, 1500, mid)
    snaps = rec.snapshot(RunInfo())
    assert [snaps.stack_frames(s) for s in snaps.sample_stack] == [(main,), (handle, main)]
    assert list(snaps.wall_deltas()) == [1000, 2000] and list(snaps.cpu_deltas()) == [500, 1000]
    assert rec.custom_snapshots() == [(), marks[0]]
    assert [t.name for t in snaps.threads] == ["worker"]


def test_snapshots_taken_while_the_writer_writes_are_always_consistent():
    # One writer appending stacks and samples as fast as it can, readers snapshotting
    # meanwhile without any lock: every snapshot must validate (Snapshots checks every
    # id on construction) and hold a prefix of what was written.
    rec = Recorder(["k"], time.perf_counter())
    target = Target(("ident", 2, None), "w", None, None, "thread")
    done = threading.Event()

    def writer():
        ctx = rec.context(target, None, 0)
        i = 0
        while not done.is_set() and i < 200_000:
            i += 1
            sid = rec.stack_id([Frame(f"f{j}", "x.py", j, j) for j in range(i % 7 + 1)] +
                               [Frame(f"leaf{i % 97}", "x.py", 1, 1)])
            mid = rec.mark_set_id(((i % 5,),)) if i % 3 else 0
            rec.append_sample(ctx, sid, i * 10 if i % 1000 else i * 10 + 2**33, i, mid)

    t = threading.Thread(target=writer)
    t.start()
    sizes = []
    try:
        for _ in range(200):
            snaps = rec.snapshot(RunInfo())
            sizes.append(len(snaps))
            for i in range(0, len(snaps), max(1, len(snaps) // 50)):
                snaps.stack_frames(snaps.sample_stack[i])
                snaps.marks_of(i)
    finally:
        done.set()
        t.join()
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]


def test_a_greenlet_named_after_its_first_samples_gets_its_name():
    # greenlet drops a greenlet's ``run`` as it starts, so one first met running has
    # no name; a sample with only the switch hook's frame cannot name it either, and
    # the hook names it at its next switch, after its context was made: the context
    # must take that name (it kept its placeholder, 'greenlet-<address>').
    greenlet = pytest.importorskip("greenlet")
    from sampler.greenlets import GreenletRecord

    g = greenlet.greenlet(lambda: None)
    g.switch()  # started (and ended): no ``run`` any more
    record = GreenletRecord(g)
    assert not record.named and record.name.startswith("greenlet-")
    rec = Recorder([], time.perf_counter())
    ctx = rec.context(Target(("ident", 1, None), "worker", None, None, "thread"), None, 0)
    hook = rec.stack_id([Frame("__call__", "sampler/greenlets.py", 1, 2)])
    rec.append_sample(ctx, hook, 1000, 500, greenlet=record)
    assert rec.snapshot(RunInfo()).threads[-1].name == record.name
    record.name, record.named = "heavy", True  # as greenlets._learn_base does
    work = rec.stack_id([Frame("heavy", "app.py", 5, 6)])
    rec.append_sample(ctx, work, 2000, 1500, greenlet=record)
    assert [t.name for t in rec.snapshot(RunInfo()).threads] == ["worker", "heavy"]


def test_a_context_switched_away_and_back_between_two_samples_is_not_split_across():
    """The native engine reads the switch hook's log and says when the thread switched
    greenlets since its last sample. A context found again where the thread's last
    sample was then gets an idle marker of no time first: under 'split' the interval
    it did not run through goes wholly to the sample after, not half to the one
    before (a gevent handler got half of the others' work between two of its
    samples). Without a switch, the interval is halved."""
    from analyzer import sample_weights

    rec = Recorder([], time.perf_counter())
    ctx = rec.context(Target(("ident", 1, None), "worker", None, None, "thread"), None, 0, 0)
    work = rec.stack_id([Frame("work", "app.py", 5, 6)])
    rec.append_sample(ctx, work, 0, 0)
    rec.append_sample(ctx, work, 1000, 1000)
    rec.append_sample(ctx, work, 2000, 2000)  # ran through: halved
    rec.append_sample(ctx, work, 3000, 3000, switched=True)  # away and back: all its own
    snaps = rec.snapshot(RunInfo(engine="native"))
    assert [bool(s) for s in snaps.sample_stack] == [True, True, True, False, True]
    assert sample_weights(snaps) == pytest.approx([0.0, 0.0015, 0.0005, 0.0, 0.001])


def test_a_run_is_filed_as_its_two_samples_and_wholly_its_own_under_split():
    """``append_run`` (the native engine files a greenlet's turn with it) is the two
    ``append_sample`` calls it stands for, a sample of no CPU where the run begins
    and one with its CPU where it ends, under the thread and under its greenlet's
    context (made at the run's start, with its idle marker); under 'split' the run's
    CPU goes wholly to its place."""
    greenlet = pytest.importorskip("greenlet")
    from analyzer import sample_weights
    from sampler.greenlets import GreenletRecord

    g = greenlet.greenlet(lambda: None)
    worker = GreenletRecord(g)
    worker.name, worker.named = "worker", True

    def filed(as_run: bool):
        rec = Recorder([], time.perf_counter())
        ctx = rec.context(Target(("ident", 1, None), "main", None, 1, "thread"), None, 0, 0)
        main = rec.stack_id([Frame("main", "app.py", 1, 2)])
        work = rec.stack_id([Frame("work", "app.py", 5, 6)])
        rec.append_sample(ctx, main, 0, 0)
        rec.append_sample(ctx, main, 1000, 1000)
        if as_run:
            rec.append_run(ctx, work, 1000, 1000, 1900, 1800, greenlet=worker)
        else:
            rec.append_sample(ctx, work, 1000, 1000, greenlet=worker)
            rec.append_sample(ctx, work, 1900, 1800, greenlet=worker)
        rec.append_sample(ctx, main, 3000, 2600)
        return rec.snapshot(RunInfo(engine="native"))

    run, pair = filed(True), filed(False)
    columns = ("sample_thread", "sample_stack", "sample_wall", "sample_cpu")
    assert [list(getattr(run, c)) for c in columns] == [list(getattr(pair, c)) for c in columns]
    assert [t.name for t in run.threads] == [t.name for t in pair.threads] == ["main", "worker"]
    weights = sample_weights(run)
    work_cpu = sum(w for w, sid in zip(weights, run.sample_stack)
                   if sid and run.frames[run.stack_frame[sid]].name == "work")
    assert work_cpu == pytest.approx(0.0008)


def _allocating() -> None:
    pass


def test_the_run_before_the_gevent_hub_idles_is_filed_where_it_ran_not_at_a_collection():
    """A greenlet found in the hub's event loop gave way there after running: that
    run is filed first, at the stack of the context's last sample. A collection
    filed in between is no place the thread ran on from: the run goes to the stack
    it ran in, not to the collection's ``<gc>`` frame as GC time."""
    from sampler.gctime import is_gc_frame

    rec = Recorder([], time.perf_counter())
    ctx = rec.context(Target(("ident", 1, None), "worker", None, 1, "thread"), None, 0, 0)
    work = rec.stack_id([Frame("work", "app.py", 5, 6)])
    hub = rec.stack_id([Frame("Hub.run", "/site/gevent/hub.py", 600, 610)])
    rec.append_sample(ctx, work, 0, 0)
    rec.append_sample(ctx, work, 1000, 1000)
    # (thread, stack innermost first, generation, end, wall, CPU, outermost frame)
    rec.record_gc([(1, [(_allocating.__code__, 0)], 0, 1200, 100, 100, 0)], cpu_now_us=3000)
    rec.append_sample(ctx, hub, 3000, 3000)  # ran until 2900 (the CPU clock), then idled
    snaps = rec.snapshot(RunInfo(engine="native"))
    names = [[f.name for f in snaps.stack_frames(s)] for s in snaps.sample_stack]
    assert names[:2] == [["work"], ["work"]]
    assert is_gc_frame(snaps.stack_frames(snaps.sample_stack[2])[0])
    assert names[3:] == [["work"], ["<hub idle>"]]
    assert list(snaps.cpu_deltas()) == [0, 1000, 100, 1900, 0]


def _caller_a() -> None:
    pass


def _caller_b() -> None:
    pass


def test_the_collections_of_one_interval_are_filed_once_per_place_with_their_summed_durations():
    """Collections between two samples of a thread made at one place (thread,
    outermost frame, stack, generation) are one ``<gc>`` sample with their summed
    wall and CPU time, filed in the order the places were first met; a stack of the
    same depth and innermost frame under another caller, or another generation, is
    another place; the CPU filed is capped, in all, at what the thread used since its
    last sample, and the next sample gets the rest."""
    from sampler.gctime import is_gc_frame

    rec = Recorder([], time.perf_counter())
    ctx = rec.context(Target(("ident", 1, None), "worker", None, 1, "thread"), None, 0, 0)
    work = rec.stack_id([Frame("work", "app.py", 5, 6)])
    rec.append_sample(ctx, work, 0, 0)
    top = (_allocating.__code__, 2)
    under_a = (top, (_caller_a.__code__, 4))
    under_b = (top, (_caller_b.__code__, 4))
    # (thread, stack innermost first, generation, end, wall, CPU, outermost frame);
    # each event's stack is a tuple of its own, as the hook makes them
    rec.record_gc([(1, tuple(under_a), 0, 100, 50, 40, 0),
                   (1, tuple(under_b), 0, 200, 60, 50, 0),
                   (1, tuple(under_a), 0, 300, 70, 60, 0),
                   (1, tuple(under_a), 1, 400, 80, 70, 0),
                   (1, list(under_a), 0, 500, 90, 80, 0)], cpu_now_us=1000)
    rec.append_sample(ctx, work, 1000, 1000)
    snaps = rec.snapshot(RunInfo(engine="native"))
    gc_samples = [i for i, s in enumerate(snaps.sample_stack) if s and is_gc_frame(snaps.stack_frames(s)[0])]
    assert gc_samples == [1, 2, 3]
    callers = [snaps.stack_frames(snaps.sample_stack[i])[2].name for i in gc_samples]
    assert callers == ["_caller_a", "_caller_b", "_caller_a"]
    assert [snaps.stack_frames(snaps.sample_stack[i])[0][3] for i in gc_samples] == [0, 0, 1]  # (generation)
    assert list(snaps.cpu_deltas()) == [0, 180, 50, 70, 1000 - 300]
    assert list(snaps.wall_deltas()) == [0, 210, 60, 80, 1000 - 350]
    assert rec.gc_cpu == {0: 230, 1: 70} and rec.gc_wall == {0: 270, 1: 80}


def test_collections_filed_together_never_take_more_cpu_than_the_thread_used():
    rec = Recorder([], time.perf_counter())
    ctx = rec.context(Target(("ident", 1, None), "worker", None, 1, "thread"), None, 0, 0)
    work = rec.stack_id([Frame("work", "app.py", 5, 6)])
    rec.append_sample(ctx, work, 0, 0)
    stack = ((_allocating.__code__, 2),)
    rec.record_gc([(1, stack, 0, 100, 90, 90, 0), (1, stack, 0, 200, 90, 90, 0),
                   (1, ((_caller_a.__code__, 2),), 0, 300, 90, 90, 0)], cpu_now_us=200)
    rec.append_sample(ctx, work, 1000, 200)
    snaps = rec.snapshot(RunInfo(engine="native"))
    assert list(snaps.cpu_deltas()) == [0, 180, 20, 0]


def _stack_now(ident: int) -> list[str]:
    """The names on a thread's stack now, outermost first."""
    import sys

    names = []
    f = sys._current_frames().get(ident)
    while f is not None:
        names.append(f.f_code.co_name)
        f = f.f_back
    return names[::-1]


def _recorded_stacks(rec: Recorder) -> list[list[str]]:
    """The names of each sample's frames, outermost first."""
    snaps = rec.snapshot(RunInfo())
    return [[n.rpartition(".")[2] for n in function_names(snaps, i)][::-1] for i in range(len(snaps))]


@pytest.mark.engines("python")
def test_a_generator_read_on_top_that_yields_and_resumes_within_the_tick_is_walked_again():
    """A generator's frame is resumed under any caller; while it is suspended its
    link to a caller is cleared.  A tick that read it on top, then let the GIL go
    while it yielded, walked it alone (``['gen']``); by the tick's last look it was
    running again, the same frame on top: that look must also find the callers the
    walk read.  Here the walk reads the generator suspended, and the last look
    (``current_frames``) first lets the thread resume it from another function."""
    from sampler.tracking import thread_target

    ready, go_on, done = threading.Event(), threading.Event(), threading.Event()
    blocked = threading.Lock()
    blocked.acquire()
    gens = {}

    def gen():
        while True:
            yield
            blocked.acquire()  # a C call from the generator: its frame is on top
            blocked.release()

    def resume(g) -> None:
        next(g)

    def body() -> None:
        g = gen()
        next(g)  # suspended at its first yield
        gens["g"] = g
        ready.set()
        go_on.wait()
        resume(g)
        done.wait()

    t = threading.Thread(target=body)
    t.start()
    try:
        ready.wait()
        read = gens["g"].gi_frame  # on top at the tick's read; suspended at its walk
        looks = []

        def current_frames() -> dict:
            import sys

            if not looks:  # the GIL goes to the thread: it resumes the generator
                go_on.set()
                wait_until(lambda: sys._current_frames().get(t.ident) is read, what="the generator resumed")
            looks.append(None)
            return sys._current_frames()

        rec = Recorder([], time.perf_counter())
        rec.record_tick([(thread_target(t, t.ident), read)], time.perf_counter(),
                        current_frames=current_frames)
        assert _recorded_stacks(rec) == [_stack_now(t.ident)]
        assert _recorded_stacks(rec)[0][-3:] == ["body", "resume", "gen"]
        assert len(looks) == 2 and rec.torn_samples == 0  # walked again, then checked
    finally:
        go_on.set()
        blocked.release()
        done.set()
        t.join()


@pytest.mark.engines("python")
def test_a_thread_that_ended_while_its_tick_let_the_gil_go_is_not_filed_as_the_next_with_its_ident():
    """A thread that moved while its tick let the GIL go is walked again from where
    its ident is now; one that ended meanwhile can have left its ident to a thread
    started since (glibc reuses an ended thread's stack, and with it its ident),
    and that thread's stack was filed as the ended one's (CI, ``threads_churn``
    stress program: a ``_thread`` thread's ``['short']`` under a ``threading``
    thread, not started at ``Thread._bootstrap``).  Here a tick is handed the top
    frame of a thread that has ended since, its ident now another thread's: that
    thread must not be filed under it (the sample is dropped, counted torn)."""
    import _thread

    from sampler.clocks import read_cpu, thread_clock_id
    from sampler.tracking import thread_target

    entered, go_on = threading.Event(), threading.Event()
    frames = {}

    def short() -> None:
        frames["short"] = __import__("sys")._getframe()
        entered.set()
        go_on.wait()

    ended = threading.Thread(target=short)
    ended.start()
    entered.wait()
    target = thread_target(ended, ended.ident)
    read = frames.pop("short")
    clock = thread_clock_id(ended.native_id, ended.ident)
    go_on.set()
    ended.join()
    wait_until(lambda: read_cpu(clock) is None, what="its OS thread to end")

    release = threading.Lock()
    release.acquire()
    started = []

    def newcomer() -> None:
        started.append(_thread.get_ident())
        if started[-1] == ended.ident:
            release.acquire()  # keep the ident until the tick is done
            release.release()

    try:
        for _ in range(50):
            count = len(started)
            _thread.start_new_thread(newcomer, ())
            wait_until(lambda: len(started) > count, what="the new thread")
            if started[-1] == ended.ident:
                break
        else:
            pytest.skip("no new thread got the ended thread's ident (not glibc?)")
        wait_until(lambda: "newcomer" in _stack_now(ended.ident), what="the newcomer in its call")
        rec = Recorder([], time.perf_counter() - 2.0)
        rec.record_tick([(target, read)], time.perf_counter() - 1.0)  # a tick that took 1 s
        assert _recorded_stacks(rec) == [] and rec.torn_samples == 1
    finally:
        release.release()
