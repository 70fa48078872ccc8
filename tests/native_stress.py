"""Programs that try to break a sampler: run as ``python native_stress.py SCENARIO``.

Each scenario runs a sampler (the engine named by ``STACKSHOT_ENGINE``) over a program
doing something that changes stacks fast or frees what the collector may be reading:
threads starting and exiting at about 1 kHz, recursion oscillating thousands of frames
deep, generators and coroutines suspending and resuming (and resumed from C), exceptions unwinding, greenlet
switches, code made and freed, fork, signals, interpreter exit. It prints ``ok`` and a
figure, and exits 0; a crash, a hang or a wrong figure is a failure.
``tests/test_native_stress.py`` runs each one on each engine, and on the native engine
again with ``STRESS_REFUSE=process_vm_readv``: the process refuses itself that system
call first, as some seccomp profiles do, and the engine reads through /proc/self/mem.
``.ci/sanitize`` runs them all under AddressSanitizer.
"""

from __future__ import annotations

import _thread
import asyncio
import gc
import os
import signal
import sys
import threading
import time
import weakref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if os.environ.get("STRESS_REFUSE"):  # a seccomp profile's refusals, from the start
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import seccomp_helpers  # noqa: E402

    seccomp_helpers.refuse(*os.environ["STRESS_REFUSE"].split(","))

import greenlet  # noqa: E402

import sampler  # noqa: E402

DELAY = 0.0005
SECONDS = float(os.environ.get("STRESS_SECONDS", "1.0"))


def _until(seconds: float = SECONDS):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        yield


def _run_until_sampled(step, sampled, seconds: float = SECONDS, limit: float = 120.0) -> None:
    """Call ``step`` for ``seconds``, then on until ``sampled()`` says the samples a
    scenario checks were taken (at most ``limit`` seconds more): how soon they come
    depends on when the collector gets to run, and under valgrind (one thread at a
    time) or on a loaded machine it may get no turn for a long while."""
    for _ in _until(seconds):
        step()
    for _ in _until(limit):
        if sampled():
            return
        step()


def _check(snaps: sampler.Snapshots, at_least: int = 1) -> int:
    n = len(snaps)
    assert n >= at_least, f"only {n} samples"
    assert not snaps.runs[-1].errors, snaps.runs[-1].errors
    if os.environ.get("STRESS_REFUSE") and snaps.runs[-1].engine == "native":
        assert snaps.runs[-1].extra.get("read_via") == "/proc/self/mem", snaps.runs[-1].extra
    return n


def _sampled_loop(loop) -> tuple[sampler.Snapshots, int]:
    """``loop(stop)`` run in a thread of its own, sampled alone until there are 300
    samples; the snapshots and their number."""
    stop = threading.Event()
    t = threading.Thread(target=loop, args=(stop,))
    t.start()
    ctl = sampler.create_sampler(t, DELAY)
    _run_until_sampled(lambda: time.sleep(0.05), lambda: len(ctl.get_snapshots()) >= 300)
    stop.set()
    t.join()
    ctl.stop()
    snaps = ctl.get_snapshots()
    return snaps, _check(snaps, 300)


def _below(snaps: sampler.Snapshots, loop: str):
    """Each sample's function names, outermost first (a collection's ``<gc>`` on top
    left out: one runs where the code was, 3.12 at eval-breaker checks), and those
    below ``loop`` (None for a sample outside it: then each frame must be the
    thread's start or end, in threading)."""
    for sid in snaps.sample_stack:
        frames = snaps.stack_frames(sid)[::-1]  # outermost first
        names = [f.name.rsplit(".", 1)[-1] for f in frames]
        if names[-1:] == ["<gc>"]:
            names.pop()
        if loop in names:
            yield names, names[names.index(loop) + 1:]
        elif any(f.filename != threading.__file__ for f in frames):
            yield names, None


def threads_churn() -> str:
    """Threads start and exit about every millisecond, tracked through a group and
    ALL_THREADS; each lives a moment, does a little work and waits half a
    millisecond. Every other one is started with ``_thread`` (announcing nothing),
    so that the native collector reads the newest thread state while threads come
    and go (sampler/_native/threadwatch.h). (The wait is what lets the Python
    engine see a member at all: it samples only where the GIL is let go, and a
    thread that computes for 150 us from its start to its exit never lets it go in
    between: 0 samples of the group in 5 s of churn, 120 s in CI.)"""
    group = sampler.ThreadGroup("churn")
    everyone = sampler.create_sampler(sampler.ALL_THREADS, DELAY)
    members = sampler.create_sampler(group, DELAY)
    started = 0

    def short() -> None:
        sum(i * i for i in range(2000))
        time.sleep(0.0005)

    def start_one() -> None:
        nonlocal started
        started += 1
        if started % 2:
            _thread.start_new_thread(short, ())
        else:
            t = threading.Thread(target=short)
            t.start()
            if started % 8 == 0:
                t.join()
        time.sleep(0.001)

    with group:  # (the members may all be gone whenever the collector gets a turn)
        _run_until_sampled(start_one, lambda: all(
            len(s.get_snapshots()) > 0 for s in (everyone, members)))
    everyone.stop()
    members.stop()
    _check(everyone.get_snapshots())
    _check(_stacks_start_at_bootstrap(members.get_snapshots()))
    return f"{started} threads"


def _stacks_start_at_bootstrap(snaps: sampler.Snapshots) -> sampler.Snapshots:
    """Every stack of a thread started by ``threading`` has ``Thread._bootstrap``
    outermost. A walk that read a frame as its thread ended followed dead frames
    through a free list, the stack of an ended thread in reverse (CI, 3.10:
    ['release', 'run', 'run_and_announce', 'run', 'serve', 'handle', ...]).
    Except a WeakSet's callback, run with no other frame as the thread ends and its
    thread object dies (threading keeps its threads in one)."""
    bad = {}
    for tid, sid in zip(snaps.sample_thread, snaps.sample_stack):
        frames = snaps.stack_frames(sid) if sid else ()
        names = [f.name.rpartition(".")[2] for f in frames]
        if (names and names[0] != "<gc>" and names[-1] != "_bootstrap"
                and not (len(frames) == 1 and frames[0].filename.endswith("_weakrefset.py"))):
            bad.setdefault(sid, (names, set()))[1].add(snaps.threads[tid][:4])
    # (with the threads they were filed under: their names and ids say whether a
    # thread not of the group, got a member's ident after it ended, was read as it)
    assert not bad, f"{len(bad)} stacks not started at _bootstrap: {list(bad.values())[:3]}"
    return snaps


def deep_oscillation() -> str:
    """Recursion between 1,000 and 6,000 frames deep, changing depth all the time
    (data-stack chunks are allocated and freed under the collector)."""
    sys.setrecursionlimit(20_000)
    done = []

    def down(n: int) -> int:
        if n == 0:
            return sum(range(200))
        return down(n - 1) + 1

    stop = threading.Event()

    def worker() -> None:
        depth, step = 1000, 700
        while not stop.is_set():
            down(depth)
            depth += step
            if not 1000 <= depth <= 6000:
                step = -step
                depth += 2 * step
        done.append(True)

    def deepest_seen(snaps: sampler.Snapshots) -> int:
        return max((len(snaps.stack(s)) for s in set(snaps.sample_stack)), default=0)

    threading.stack_size(256 * 1024 * 1024)
    t = threading.Thread(target=worker)
    t.start()
    threading.stack_size(0)
    ctl = sampler.create_sampler(t, DELAY)
    # At least SECONDS of oscillation, and on until a sample deeper than 1,000 frames
    # was taken: how soon one is depends on when the collector gets to run (the Python
    # engine only where the worker yields the GIL), so a loaded machine takes longer.
    _run_until_sampled(lambda: time.sleep(0.05), lambda: deepest_seen(ctl.get_snapshots()) > 1000)
    stop.set()
    t.join()
    ctl.stop()
    snaps = ctl.get_snapshots()
    deepest = deepest_seen(snaps)
    assert done and deepest > 1000, deepest
    return f"{_check(snaps)} samples, deepest {deepest}"


def generators_and_coroutines() -> str:
    """Generators, generator pipelines and asyncio tasks suspend and resume."""
    ctl = sampler.create_sampler(threading.current_thread(), DELAY)

    def numbers():
        i = 0
        while True:
            yield i
            i += 1

    def squares(source):
        for x in source:
            yield x * x

    async def ping(n: int) -> int:
        total = 0
        for i in range(n):
            await asyncio.sleep(0)
            total += i
        return total

    async def many() -> None:
        for _ in _until(SECONDS / 2):
            await asyncio.gather(*(ping(50) for _ in range(20)))

    pipeline = squares(numbers())
    for _ in _until(SECONDS / 2):
        for _ in range(1000):
            next(pipeline)
    asyncio.run(many())
    ctl.stop()
    return f"{_check(ctl.get_snapshots())} samples"


def exceptions_unwinding() -> str:
    """Exceptions raised 200 frames down unwind through every frame."""
    ctl = sampler.create_sampler(threading.current_thread(), DELAY)

    def fail(n: int) -> None:
        if n == 0:
            raise ValueError("down here")
        try:
            fail(n - 1)
        finally:
            pass

    caught = 0
    for _ in _until():
        try:
            fail(200)
        except ValueError:
            caught += 1
    ctl.stop()
    return f"{_check(ctl.get_snapshots())} samples, {caught} unwound"



def instrumented_stacks(mode: object = True) -> str:
    """use_errortrace=True: the interpreter's events keep a shadow stack per thread,
    which the collector copies while threads start and end, recurse past the shadow
    stack's depth bound, raise through frames, run generators and call C functions."""
    sys.setrecursionlimit(20_000)
    ctl = sampler.create_sampler(sampler.ALL_THREADS, DELAY, use_errortrace=mode)

    def down(n: int) -> int:
        if n == 0:
            return len(sorted(range(300), key=lambda i: -i))
        return down(n - 1) + 1

    def fail(n: int) -> None:
        if n == 0:
            raise ValueError("down here")
        fail(n - 1)

    def work() -> None:
        for depth in (10, 1500, 50):
            down(depth)
        try:
            fail(100)
        except ValueError:
            pass
        sum(i for i in range(2000))

    started = 0
    for _ in _until():
        t = threading.Thread(target=work)
        t.start()
        work()
        t.join()
        started += 1
    ctl.stop()
    return f"{_check(ctl.get_snapshots())} samples, {started} threads"

def instrumented_python_frames() -> str:
    """use_errortrace='python': the same, kept by the eval-frame hook on 3.10-3.11."""
    return instrumented_stacks("python")


def greenlet_switches() -> str:
    """Two greenlets and the main one switch thousands of times; all are tracked."""
    main = greenlet.getcurrent()

    def bounce() -> None:
        while True:
            sum(range(100))
            main.switch()

    a, b = greenlet.greenlet(bounce), greenlet.greenlet(bounce)
    ctl = sampler.create_sampler([threading.current_thread(), a, b], DELAY)
    switches = 0

    def kinds_seen() -> set:
        snaps = ctl.get_snapshots()
        return {snaps.threads[t].kind for t in snaps.sample_thread}

    # at least SECONDS, and on until both kinds were sampled (under valgrind, which
    # runs one thread at a time, the collector may get no turn in SECONDS)
    def hundred_switches() -> None:
        nonlocal switches
        for _ in range(100):
            (a if switches % 2 == 0 else b).switch()
            switches += 1

    _run_until_sampled(hundred_switches, lambda: kinds_seen() == {"thread", "greenlet"})
    ctl.stop()
    snaps = ctl.get_snapshots()
    kinds = {snaps.threads[t].kind for t in snaps.sample_thread}
    assert kinds == {"thread", "greenlet"}, kinds
    return f"{_check(snaps)} samples, {switches} switches"


def code_churn() -> str:
    """Functions made with exec run once and are dropped: their code objects are
    freed while the collector may hold their addresses. None is kept alive."""
    ctl = sampler.create_sampler(threading.current_thread(), DELAY)
    refs = []
    made = 0

    def make_and_run() -> None:
        nonlocal made
        namespace: dict = {}
        exec(f"def made_{made}(n):\n    return sum(i * {made} for i in range(n))\n", namespace)
        fn = namespace[f"made_{made}"]
        fn(3000)
        refs.append(weakref.ref(fn.__code__))
        del fn, namespace
        made += 1

    def made_sampled() -> bool:
        return any(f.name.startswith("made_") for f in ctl.get_snapshots().frames)

    _run_until_sampled(make_and_run, made_sampled)
    snaps = ctl.get_snapshots()  # files every sample taken so far
    ctl.stop()
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= 1, f"{alive} of {made} code objects kept alive"
    names = {f.name for f in snaps.frames}
    assert any(n.startswith("made_") for n in names), sorted(names)[:20]
    return f"{_check(snaps)} samples, {made} functions made, {alive} alive"


def fork_while_sampling() -> str:
    """Fork while sampling; the child samples itself; neither hangs or crashes."""
    ctl = sampler.create_sampler(threading.current_thread(), DELAY)
    sum(i * i for i in range(200_000))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = sampler.create_sampler(threading.current_thread(), DELAY)
            for _ in _until(0.3):
                sum(i * i for i in range(10_000))
            child.stop()
            code = 0 if len(child.get_snapshots()) > 0 else 3
        finally:
            os._exit(code)
    for _ in _until(0.3):
        sum(i * i for i in range(10_000))
    _, status = os.waitpid(pid, 0)
    ctl.stop()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return f"{_check(ctl.get_snapshots())} samples in the parent, child ok"


def signals() -> str:
    """A signal handler reads the profile while the program runs (SIGUSR1 at 200 Hz
    from another thread); the program's sleeps and reads see no EINTR."""
    ctl = sampler.create_sampler(threading.current_thread(), DELAY)
    seen = []
    signal.signal(signal.SIGUSR1, lambda *a: seen.append(len(ctl("get-snapshots"))))
    stop = threading.Event()

    def sender() -> None:
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.005)

    t = threading.Thread(target=sender)
    t.start()
    r, w = os.pipe()
    try:
        for _ in _until():
            sum(i * i for i in range(5000))
            time.sleep(0.001)
            os.write(w, b"x")
            assert os.read(r, 1) == b"x"
    finally:
        stop.set()
        t.join()
    ctl.stop()
    assert seen, "the handler never ran"
    return f"{_check(ctl.get_snapshots())} samples, {len(seen)} signals handled"


def exit_while_sampling() -> str:
    """The interpreter exits with samplers running (never stopped): no hang, no crash."""
    sampler.create_sampler(sampler.ALL_THREADS, DELAY)
    sampler.create_sampler(threading.current_thread(), 0.0)
    for _ in range(4):
        threading.Thread(target=lambda: sum(range(10**6)), daemon=True).start()
    sum(i * i for i in range(300_000))
    return "exiting"


def _wide_call(n: int) -> int:
    a = b = c = d = e = f = g = h = 0  # frames of many sizes: a frame read from
    return _mid_call(n) + a + b + c + d + e + f + g + h  # the wrong moment shows


def _mid_call(n: int) -> int:
    a = b = 0
    return _deep_call(n) + a + b


def _deep_call(n: int) -> int:
    a = b = c = d = e = f = g = h = i = j = k = m = 0
    return _leaf_sum(n) + a + b + c + d + e + f + g + h + i + j + k + m


def _narrow_call(n: int) -> int:
    return _other_call(n)


def _other_call(n: int) -> int:
    a = b = c = d = e = 0
    return _leaf_sum(n) + a + b + c + d + e


def _leaf_sum(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


CHAINS = (("_wide_call", "_mid_call", "_deep_call", "_leaf_sum"), ("_narrow_call", "_other_call", "_leaf_sum"),
          ("is_set",))


def two_call_chains() -> str:
    """A thread alternates between two call chains whose frames differ in size, so
    its stack changes under every walk: every sample must be a stack the program
    had (one chain's prefix under the loop, or a collection run there: seen once
    in a CI run on 3.12, in _deep_call), never the top of one chain on the other's
    callers or a frame with no code (a walk mixing two moments: on 3.11 and 3.12
    under load, 1 sample in 30 before the native walk checked itself)."""

    def alternate(stop: threading.Event) -> None:
        while not stop.is_set():
            _wide_call(30)
            _narrow_call(30)
            _wide_call(3)
            _narrow_call(3)

    snaps, n = _sampled_loop(alternate)
    bad = _off_chains(snaps, "alternate", CHAINS)
    assert not bad, f"{len(bad)} of {n} samples are no stack the program had: {bad[:3]}"
    return f"{n} samples"


def _prefix_of_one(names: list, chains) -> bool:
    """Whether ``names`` is the start of one of ``chains``."""
    return any(names == list(chain[:len(names)]) for chain in chains)


def _off_chains(snaps: sampler.Snapshots, loop: str, chains) -> list:
    """The samples (function names) whose frames below ``loop`` are no prefix of one
    of ``chains``, or that are outside it."""
    return [names for names, below in _below(snaps, loop) if below is None or not _prefix_of_one(below, chains)]


def _at_most_one_mixed_read(bad: list, n: int) -> None:
    """The generator scenarios' threads push a frame at one address every microsecond
    or so, and a read that lets the thread run can catch one being pushed in each of
    its reads (sampler/_native/engine.c, unbegun_top_was_pushed): after the checks,
    1 run in 300-600 of generators_made_by_generators (about 2,000 samples a run) had
    one sample that was no stack the program had (3.13; none in 600 runs on 3.11 and
    3.12). Two or more in a run is a check that does not work: 11 runs of 16 on 3.13
    before the top frame was read again."""
    assert len(bad) <= 1, f"{len(bad)} of {n} samples are no stack the program had: {bad[:3]}"


def _gen_join() -> str:
    return " ".join(str(i) for i in range(40))


def _inner_gen():
    for i in range(20):
        yield i


def _outer_gen():
    yield from _inner_gen()


def _gen_delegate() -> int:
    total = 0
    for i in _outer_gen():
        total += i
    return total


GENERATOR_CHAINS = (("_gen_join", "<genexpr>"), ("_gen_delegate", "_outer_gen", "_inner_gen"), ("is_set",))
GENERATORS = ("<genexpr>", "_outer_gen", "_inner_gen")


def generators_run_from_c() -> str:
    """A thread alternates between a generator expression that str.join resumes from
    C and a generator that delegates to another (yield from), so that walks find
    generators suspended since the top was read, or their frames gone: such a walk
    keeps the stack of its moment from the data stack's last frame on, the
    generators above it left out (3.11+). Every sample below the loop must be a
    prefix of one chain, or a whole generator chain (from its outermost generator)
    on a prefix of the other: the read's lag at the top (scribblings/sampler.md),
    which can put generators that have just ended on the frame their caller's
    address holds now (up to 1 sample in 300 here on 3.11, 1 in 20 on 3.13, as many
    before walks left any frames out). Never a generator left out below another:
    _inner_gen only right above _outer_gen."""

    def run_generators(stop: threading.Event) -> None:
        while not stop.is_set():
            _gen_join()
            _gen_delegate()

    snaps, n = _sampled_loop(run_generators)
    bad, lagged = [], 0
    for names, below in _below(snaps, "run_generators"):
        if below is None:
            bad.append(names)
            continue
        calls = below[:]
        while calls and calls[-1] in GENERATORS:
            calls.pop()
        generators = below[len(calls):]  # (on top: whole from the outermost one, or none)
        if (generators not in ([], ["<genexpr>"], ["_outer_gen"], ["_outer_gen", "_inner_gen"])
                or not _prefix_of_one(calls, GENERATOR_CHAINS)):
            bad.append(names)
        elif not _prefix_of_one(below, GENERATOR_CHAINS):
            lagged += 1  # (the lag at the top)
    _at_most_one_mixed_read(bad, n)
    left_out = snaps.runs[-1].extra.get("tops_left_out")
    return (f"{n} samples, {lagged} with generators that had ended on top"
            + (f", {left_out} without their generators" if left_out is not None else ""))


def _made_first():
    yield from _made_second()


def _made_second():
    yield 1


def generators_made_by_generators() -> str:
    """A thread makes a generator, over and over, whose first resumption makes another:
    the frame that made the first is popped where the second's is pushed next, from
    the first generator. A walk that read the top while the first's was the thread's
    and its bytes while the second's was being pushed mixed the second's code with
    the first's caller: ['make_generators', '_made_second'] (3.13: 7-25 samples in
    9,700; 3.11 and 3.12: 0-4), a stack the thread never had. Every sample below the
    loop must be a prefix of one chain (but one: _at_most_one_mixed_read)."""

    def make_generators(stop: threading.Event) -> None:
        while not stop.is_set():
            for _ in range(100):
                for _ in _made_first():
                    pass

    snaps, n = _sampled_loop(make_generators)
    _at_most_one_mixed_read(_off_chains(snaps, "make_generators", (("_made_first", "_made_second"), ("is_set",))), n)
    return f"{n} samples"


SCENARIOS = {f.__name__: f for f in (
    threads_churn, deep_oscillation, generators_and_coroutines, exceptions_unwinding,
    instrumented_stacks, instrumented_python_frames, greenlet_switches, code_churn, fork_while_sampling, signals,
    two_call_chains, generators_run_from_c, generators_made_by_generators, exit_while_sampling)}


if __name__ == "__main__":
    names = list(SCENARIOS) if sys.argv[1:] == ["all"] else sys.argv[1:]
    for name in names:
        print(name, "ok", SCENARIOS[name](), flush=True)
