"""Instrumented stacks (use_errortrace): the shadow stack is exact at quiet points
(compared with the live frames) through calls, exceptions unwinding, generators,
coroutines and greenlet switches; C functions are frames of their own; start/stop
leave no hook behind; coexistence with sys.settrace and cProfile."""

import asyncio
import gc
import sys
import threading
import time
import weakref

import pytest

from sampler import create_sampler
from sampler.shadow import ShadowStacks
from sampler.snapshot import Frame


def _live_codes():
    f = sys._getframe(2)  # the caller of check()
    codes = []
    while f is not None:
        codes.append(f.f_code)
        f = f.f_back
    return codes[::-1]


def _names(entries):
    return [e.name if isinstance(e, Frame) else e if isinstance(e, int)
            else getattr(e, "co_qualname", e.co_name) for e in entries]


class Checker:
    """check() compares the shadow stack with the live frames of its caller."""

    def __init__(self, sampler):
        self.shadow = sampler._shadow
        self.ident = threading.get_ident()
        self.checked = 0
        self.c_seen = []

    def check(self):
        live = [id(c) for c in _live_codes()]
        entries = self.shadow.stack_of(threading.get_ident())
        assert entries is not None
        # the reader's own Python frames (pushed when it was called) are not the caller's
        own = {id(Checker.check.__code__), id(type(self.shadow).stack_of.__code__),
               id(ShadowStacks.stack_of.__code__)}
        py = [e if isinstance(e, int) else id(e) for e in entries if not isinstance(e, Frame)]
        c = [e.name for e in entries if isinstance(e, Frame)
             and e.name not in ("thread_states", "shadow_stack", "dict.get", "get")]
        while py and py[-1] in own:
            py.pop()
        assert py == live, (_names(entries), [c.co_qualname if hasattr(c, "co_qualname") else c.co_name
                                              for c in _live_codes()])
        self.c_seen.append(c)
        self.checked += 1


def _mode_sampler(mode):
    return create_sampler(threading.current_thread(), 0.005, use_errortrace=mode)


@pytest.mark.parametrize("mode", ["python", True])
def test_calls_and_exceptions_unwinding_keep_the_stack_exact(sampler_engine, mode):
    def inner(ck, n):
        ck.check()
        if n == 0:
            raise KeyError(n)
        inner(ck, n - 1)

    def outer(ck):
        for _ in range(3):
            try:
                inner(ck, 3)
            except KeyError:
                ck.check()
        ck.check()

    with _mode_sampler(mode) as sampler:
        ck = Checker(sampler)
        outer(ck)
        ck.check()
    assert ck.checked == 3 * 4 + 3 + 1 + 1


@pytest.mark.parametrize("mode", ["python", True])
def test_generators_and_throw_keep_the_stack_exact(sampler_engine, mode):
    def gen(ck, n):
        for i in range(n):
            ck.check()
            try:
                yield i
            except ValueError:
                ck.check()
                yield -1

    def delegate(ck):
        ck.check()
        yield from gen(ck, 3)
        ck.check()

    with _mode_sampler(mode) as sampler:
        ck = Checker(sampler)
        for _ in delegate(ck):
            ck.check()
        assert sorted(gen(ck, 2)) == [0, 1]  # resumed from a C function
        g = gen(ck, 5)
        next(g)
        assert g.throw(ValueError) == -1
        ck.check()
        g.close()
        ck.check()
    if mode is True:
        assert any("sorted" in names for names in ck.c_seen), ck.c_seen
    assert ck.checked == 14


@pytest.mark.parametrize("mode", ["python", True])
def test_coroutines_keep_the_stack_exact(sampler_engine, mode):
    async def leaf(ck, n):
        ck.check()
        await asyncio.sleep(0)
        ck.check()
        return n

    async def middle(ck):
        results = await asyncio.gather(leaf(ck, 1), leaf(ck, 2))
        ck.check()
        return sum(results)

    with _mode_sampler(mode) as sampler:
        ck = Checker(sampler)
        assert asyncio.run(middle(ck)) == 3
        ck.check()
    assert ck.checked == 6


@pytest.mark.parametrize("mode", ["python", True])
def test_greenlet_switches_keep_the_stack_exact(sampler_engine, mode):
    greenlet = pytest.importorskip("greenlet")

    def ping(ck, other_box, n):
        for _ in range(n):
            ck.check()
            other_box[0].switch()
            ck.check()

    def pong(ck, main, n):
        for _ in range(n):
            ck.check()
            main.switch()

    with _mode_sampler(mode) as sampler:
        ck = Checker(sampler)
        main = greenlet.getcurrent()
        box = [None]
        box[0] = greenlet.greenlet(lambda: pong(ck, main, 3))
        ping(ck, box, 3)
        ck.check()
    assert ck.checked == 3 * 3 + 1


@pytest.mark.parametrize("mode", ["python", True])
def test_a_greenlet_the_gc_kills_as_a_frame_starts_leaves_the_stack_exact(sampler_engine, mode):
    """A suspended greenlet whose last reference only the GC can free is killed
    (switched into, to raise GreenletExit) wherever a collection comes: here, as a frame starts (before 3.12 its
    call event makes its frame object, and a collection comes first). A weakref
    callback that runs then seeds the stack from the live frames, the starting one
    among them, before that frame's own call event: it must not be pushed twice (the
    CI failure: `ping` and `Checker.check` on the stack twice, from leftover greenlets
    of earlier tests)."""
    greenlet = pytest.importorskip("greenlet")
    called = []

    def suspended_in_a_cycle():
        main = greenlet.getcurrent()
        g = greenlet.greenlet(lambda: main.switch())
        g.switch()
        holder = [g]
        holder.append(holder)  # only the GC frees the last reference
        return weakref.ref(g, lambda _ref: called.append(1))

    with _mode_sampler(mode) as sampler:
        ck = Checker(sampler)

        def starts_as_the_gc_runs():
            ck.check()

        # The collection must come in this thread: one in the sampler's own thread
        # (it allocates as it ticks) finds the cycle too, and greenlet leaves a
        # greenlet of another thread to be killed there later (once in four full
        # runs on 3.10; 29 times in 300 with a thread allocating every 0.2 ms).
        # No other thread runs from the collection below to the one that kills:
        # it would have to wait a whole switch interval, made long, for the GIL,
        # and a wait begun before it was made long ends in the sleep. (Not between
        # the collection and the cycle: its allocations would fill the young
        # generation, and a collection as the cycle is made moves it to an older one.)
        thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
        sys.setswitchinterval(60)
        try:
            for _ in range(10):
                time.sleep(0.005)
                gc.collect()  # (so the cycle is young, freed by the next young collection)
                ref = suspended_in_a_cycle()
                gc.set_threshold(1)  # a collection at the next allocation
                try:
                    starts_as_the_gc_runs()
                finally:
                    gc.set_threshold(*thresholds)
                ck.check()
                assert ref() is None
        finally:
            sys.setswitchinterval(interval)
    assert len(called) == 10 and ck.checked == 20


def test_seeded_from_the_live_frames_when_started_deep(sampler_engine):
    def deep(n, ck_box):
        if n:
            return deep(n - 1, ck_box)
        sampler = _mode_sampler("python")
        try:
            ck = Checker(sampler)
            ck.check()
            return ck.checked
        finally:
            sampler.stop()

    assert deep(20, None) == 1


def test_a_frame_entered_before_start_leaves_the_stack_when_it_returns(sampler_engine):
    # the eval-frame hook never sees such a frame end: its caller's next call drops it
    box = []

    def starts_and_returns():
        box.append(_mode_sampler("python"))

    starts_and_returns()
    try:
        ck = Checker(box[0])
        ck.check()
    finally:
        box[0].stop()
    assert ck.checked == 1


@pytest.mark.engines("native")
def test_python_frames_are_kept_by_the_eval_frame_hook_where_it_sees_every_call(sampler_engine):
    # 3.10-3.11: the cheap hook (no sys.monitoring tool, no profile function); on 3.12
    # calls through it count against the C recursion limit (~750 frames deep), and
    # 3.13's specialized __init__ calls skip it: there the events keep the stacks
    with _mode_sampler("python") as sampler:
        hooked = sampler._shadow.hooked
        tools = [sys.monitoring.get_tool(t) for t in range(6)] if sys.version_info >= (3, 12) else []
        profile = sys.getprofile()
    assert hooked == (sys.version_info < (3, 12))
    if hooked:
        assert "stackshot" not in tools and profile is None
    _no_hooks_left()


def test_the_hook_check_fails_when_a_call_is_not_seen():
    from sampler.shadow import _hook_sees_every_call

    assert not _hook_sees_every_call(lambda: None)  # no callee ever finds itself on top


@pytest.mark.engines("native")
def test_without_the_eval_frame_hook_the_events_keep_python_frames_exact(sampler_engine, monkeypatch):
    # what runs where the hook fails its check (or another frame evaluator is installed)
    from sampler.shadow import NativeShadowStacks

    monkeypatch.setattr(NativeShadowStacks, "_hook_verdict", False)

    def gen():
        ck.check()
        yield 1
        ck.check()

    with _mode_sampler("python") as sampler:
        assert not sampler._shadow.hooked
        ck = Checker(sampler)
        for _ in gen():
            ck.check()
        ck.check()
    assert ck.checked == 4
    _no_hooks_left()


def _checked_beside_cprofile(mode, check_sampler=lambda sampler: None) -> set:
    """Profile a call with cProfile while a ``mode`` sampler checks its shadow stack
    against the live frames once; the names of the functions pstats saw."""
    import cProfile
    import pstats

    def profiled():
        return sum(range(1000))

    prof = cProfile.Profile()
    prof.enable()
    try:
        with _mode_sampler(mode) as sampler:
            check_sampler(sampler)
            ck = Checker(sampler)
            profiled()
            ck.check()
    finally:
        prof.disable()
    assert ck.checked == 1
    return {k[2] for k in pstats.Stats(prof).stats}


@pytest.mark.engines("native")
@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the eval-frame hook is used before 3.12 only")
def test_the_eval_frame_hook_leaves_the_profile_function_to_cprofile(sampler_engine):
    assert "profiled" in _checked_beside_cprofile("python")
    _no_hooks_left()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 itself recurses in C on every call")
def test_a_recursion_deeper_than_the_c_stack_allows_runs_and_is_still_sampled(sampler_engine):
    # calls through the eval-frame hook recurse in C: near the end of a small thread
    # stack the hook leaves, and the collector walks the frames instead
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    depths = []

    def down(n):
        if n:
            return down(n - 1)
        depths.append(len(_live_codes()))
        return 0

    size = threading.stack_size(256 << 10)
    try:
        with _mode_sampler("python") as sampler:
            worker = threading.Thread(target=down, args=(30_000,))
            worker.start()
            worker.join()
            with_hook = getattr(sampler._shadow, "hooked", False)
            if with_hook:
                assert sampler._shadow._native.shadow_stats()["eval_hook_lost"] == 1
            down(10)
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(limit)
    assert depths[0] > 30_000 and len(depths) == 2
    _no_hooks_left()


def _no_hooks_left():
    from sampler import engines
    from sampler import greenlets as switches

    # (a sampler that failed to start here held the thread's greenlet switch hook
    # on for the rest of the process: every later greenlet was recorded by it)
    hook = switches._hooks.get(threading.get_ident())
    assert hook is None or hook.users == 0
    if engines.native_available():
        assert engines._native.shadow_stats()["eval_hook"] == 0
    if sys.version_info >= (3, 12):
        assert [t for t in range(6) if sys.monitoring.get_tool(t) == "stackshot"] == []
    else:
        assert sys.getprofile() is None and threading.getprofile() is None


@pytest.mark.parametrize("mode", ["python", True])
def test_start_and_stop_leave_no_hook(sampler_engine, mode):
    _no_hooks_left()
    with _mode_sampler(mode) as sampler:
        if getattr(sampler._shadow, "hooked", False):
            assert sampler._shadow._native.shadow_stats()["eval_hook"] == 1
        elif sys.version_info >= (3, 12):
            assert "stackshot" in [sys.monitoring.get_tool(t) for t in range(6)]
    _no_hooks_left()
    extra = sampler.get_snapshots().runs[0].extra
    assert extra["use_errortrace"] == mode and extra["shadow_overflow"] == 0


def test_coexists_with_settrace(sampler_engine):
    seen = []

    def tracer(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)
        return None

    def traced():
        return 1

    sys.settrace(tracer)
    try:
        with _mode_sampler(True) as sampler:
            ck = Checker(sampler)
            traced()
            ck.check()
    finally:
        sys.settrace(None)
    assert "traced" in seen and ck.checked == 1
    _no_hooks_left()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="one profile function per thread before 3.12")
def test_coexists_with_cprofile(sampler_engine):
    def not_the_profilers_tool(sampler) -> None:
        assert sampler._shadow.tool != sys.monitoring.PROFILER_ID

    assert "profiled" in _checked_beside_cprofile(True, not_the_profilers_tool)
    assert sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is None
    _no_hooks_left()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="before 3.12 only")
def test_another_profile_function_is_a_clear_error_before_312(sampler_engine):
    def other(frame, event, arg):
        pass

    sys.setprofile(other)
    try:
        with pytest.raises(RuntimeError, match="another profiler holds"):
            _mode_sampler(True)
    finally:
        sys.setprofile(None)
    _no_hooks_left()


def test_use_errortrace_is_checked(sampler_engine):
    with pytest.raises(ValueError, match="use_errortrace must be False, True"):
        create_sampler(threading.current_thread(), 0.01, use_errortrace="c")


@pytest.mark.engines("native")
def test_one_native_errortrace_sampler_at_a_time(sampler_engine):
    from sampler.shadow import native_shadow_available

    if not native_shadow_available():
        pytest.skip("the native shadow stacks are not built here")
    with _mode_sampler(True):
        with pytest.raises(RuntimeError, match="another sampler with use_errortrace runs"):
            _mode_sampler("python")
    _no_hooks_left()
    with _mode_sampler("python") as sampler:  # the first one's end let it go
        ck = Checker(sampler)
        ck.check()
    assert not any(getattr(h, "__self__", None).__class__.__name__ == "GCWatch" or type(h).__name__ == "GCHook"
                   for h in __import__("gc").callbacks)


@pytest.mark.parametrize("mode", ["python", True])
def test_deeper_than_the_bound_is_counted_and_the_stack_stays_exact(sampler_engine, mode):
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3000))

    def down(n):
        if n:
            return down(n - 1)
        return 0

    try:
        with _mode_sampler(mode) as sampler:
            ck = Checker(sampler)
            down(1200)  # past the 1024 entries a stack keeps
            ck.check()  # the pops of the uncounted entries left it exact
    finally:
        sys.setrecursionlimit(limit)
    assert sampler.get_snapshots().runs[0].extra["shadow_overflow"] > 0


def test_the_samples_are_taken_from_the_shadow_stack_with_c_functions(sampler_engine):
    # End to end through the collector: samples exist, carry no errors, and a long C
    # call (sorted with a Python key) shows as a frame of its own.
    import time

    data = list(range(20_000, 0, -1))
    ctl = create_sampler(threading.current_thread(), 0.0005, use_errortrace=True)
    seen = set()
    end = time.perf_counter() + 60
    while time.perf_counter() < end:
        sorted(data, key=lambda v: v % 1000)
        snaps = ctl.get_snapshots()
        seen = {f.name for f in snaps.frames}
        if any("sorted" in name for name in seen) and len(snaps) >= 20:
            break
    ctl.stop()
    snaps = ctl.get_snapshots()
    assert not snaps.runs[-1].errors, snaps.runs[-1].errors[:1]
    assert len(snaps) >= 20
    assert any("sorted" in name for name in {f.name for f in snaps.frames}), seen
