"""How much time each sample stands for: where the thread ran, the interval's end, or
Racket's midpoint rule.

A sampler sees a thread only at instants; the time between two consecutive samples
of a thread (an *interval*) has to be given to someone.  The rules:

``'midpoint'`` (Racket's)
    Each interval is split evenly between the two samples that bound it, so a middle
    sample gets ``(next - prev) / 2``, a thread's first sample ``next - cur`` and its
    last ``cur - prev`` (the two ends take their one interval whole, so the weights
    of a thread add up to its time from first to last sample *plus* half of its first
    and last intervals, as in Racket).
``'end'``
    Each interval is charged wholly to the sample that *ends* it: a sample gets
    ``cur - prev``, a thread's first sample ``0`` (no interval ends there), and the
    weights of a thread add up to exactly its time from first to last sample.

``'active'``
    As ``'end'``, except where the thread was idle right after the sample ending the
    interval (it used less than :data:`IDLE_FRACTION` of the next interval in CPU
    time): then the interval's CPU is charged to the sample that *started* it, the
    last place the thread was seen running. It guesses from CPU figures what the
    native engine knows: a thread that computes and then blocks spent that CPU
    before it blocked, not in the call it blocks in. The native engine asks the
    kernel whether a thread it samples is asleep, and files such a run as a sample
    of its own where the thread was running, so ``'end'`` is right on its samples;
    the guess cannot tell a thread that blocked from one that waits for a CPU on a
    busy machine, and then moves CPU where it does not belong (measured on the
    ``bursty`` workload under load). Under wall-clock weighting it is ``'end'``.

``'split'``
    Racket's even split, for the CPU the thread ran through: an interval from a
    sample where the thread was running to the next is split evenly between the
    two, and an interval that starts where the thread was waiting (a sample with no
    CPU since the one before, in another place than it: asleep, or found where it
    waits, or its first sample) goes wholly to the sample that ends it, as under
    ``'end'``; a sample with no CPU in the same place as the one before (the thread
    did not run: preempted as often as asleep) leaves things as they were. A
    collection's sample (``<gc>``) weighs exactly its own CPU, and the run it
    interrupted goes on around it. The split follows the OS thread across its
    greenlets: an interval in which the thread switched greenlets is halved between
    the greenlet it was in and the one found after it (a greenlet's marker where
    its thread ran elsewhere is passed over). Where the work changes between two samples (one
    function returns, the next is called), the change is as likely early as late,
    so half the interval is what each side is owed on average; ``'end'`` gives it
    all to the later side, and that leans wherever a function mostly starts after a
    wait and hands over to another one: a handler woken by a request that parses
    for 1 ms and then responds for 1 ms, sampled every millisecond, is charged a
    quarter of the handler's CPU for parsing under ``'end'`` (half under
    ``'split'``). The native engine's samples are where the thread really was, and
    it files a thread found asleep as waiting, so this is its snapshots' default;
    the Python engine's samples land late (see below), and an even split would move
    CPU onto the samples before them. Under wall-clock weighting it is ``'end'``.

Why not one rule: in CPython a thread inside a long C call (``sorted`` of a big list, a
pathological regex) holds the GIL, so the collector cannot run until the call
returns; the late sample shows where the thread is *after* the call, still in the
function that made it.  The midpoint rule gives half of that long interval to the
*previous* sample, which was somewhere else.  Measured (``benchmarks/RESULTS.md``,
workload ``gil_call``): 20--24 points of attribution error with ``'midpoint'``,
0.3--2.9 with ``'end'``; on every other workload the rules agree within noise.

Defaults (``interval=None``, "the input's natural rule", :func:`natural_interval`):
``'split'`` for ``Snapshots`` taken by the native engine alone, ``'end'`` for other
``Snapshots`` (the Python engine's, allocation samples, a merge that mixes engines),
``'midpoint'`` for Racket's raw shape (so Racket's own examples give Racket's
numbers).

Edge cases (:func:`sample_weights`, ``fromsnapshots.aggregate`` and ``rawshape``
handle them alike; the raw shape has no idle markers -- a raw sample without frames
adds its time, as in Racket):

* A thread seen once is dropped (Racket's rule): one instant is no interval.  Its
  sample counts in ``sample_number`` and its thread time is 0.
* Idle markers (snapshot samples with stack 0: a greenlet switched out, the
  profiler's own frames) bound intervals like any sample and get a weight, but they
  have no frames, so that weight is charged to nobody.  Under ``'end'`` the interval
  *ending* at an idle marker is the idle time, and the one after it goes to the next
  real sample; under ``'midpoint'`` half of each neighbouring interval is lost with
  the marker.
* A thread's first sample: under ``'end'`` it weighs 0 (its frames appear, and it
  counts in ``sample_number``, with zero time); under ``'midpoint'`` it takes its one
  interval whole.  (Snapshot deltas are 0 at a thread's first sample by format, so
  ``'end'`` can use the deltas as they are; the raw shape's ``'end'`` weights start
  with an explicit 0.)

Weights are integers: microsecond deltas for ``'end'``, *twice* the midpoint weight
for ``'midpoint'`` (so halves stay exact); :data:`SCALE` turns them into seconds.
"""

from __future__ import annotations

from itertools import compress
from operator import add
from typing import Any, Iterator, Optional, Sequence

from sampler.gctime import is_gc_frame

INTERVALS = ("midpoint", "end", "active", "split")
NATURAL_INTERVAL = {"snapshots": "end", "native": "split", "raw": "midpoint"}
"""The rule ``interval=None`` stands for, by input: see the module docstring."""
CLOCKS = ("cpu", "wall")
SCALE = {"midpoint": 0.5e-6, "end": 1e-6, "active": 1e-6, "split": 0.5e-6}
"""Seconds per weight unit, for weights of snapshot deltas (integer microseconds;
half microseconds for the rules that halve intervals)."""
IDLE_FRACTION = 0.1
"""Below this share of CPU over the next interval, a thread counts as idle after a sample."""

_FEW_THREADS = 6  # up to this many, split columns with C-speed passes per thread


def resolve_interval(interval: Optional[str], *, raw: bool = False,
                     snapshots: Any = None) -> str:
    """The rule to use: ``interval`` itself, or for ``None`` the input's natural rule
    (:func:`natural_interval` of ``snapshots``, ``'end'`` for snapshots not given,
    ``'midpoint'`` for the raw shape, ``raw=True``).

    An unknown rule is a ``ValueError`` naming the valid ones.
    """
    if interval is None:
        if raw:
            return NATURAL_INTERVAL["raw"]
        return NATURAL_INTERVAL["snapshots"] if snapshots is None else natural_interval(snapshots)
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(map(repr, INTERVALS))}, "
                         f"not {interval!r}")
    return interval


def natural_interval(snapshots: Any) -> str:
    """The rule ``interval=None`` stands for on ``snapshots``: ``'split'`` when the
    native engine took every one of its runs' samples, else ``'end'`` (see the
    module docstring for why the engines differ)."""
    runs = getattr(snapshots, "runs", ())
    if runs and all(getattr(r, "engine", "") == "native" for r in runs):
        return NATURAL_INTERVAL["native"]
    return NATURAL_INTERVAL["snapshots"]


def clock_deltas(snapshots: Any, clock: str, interval: str) -> Sequence[int]:
    """The per-sample deltas that rule ``interval`` charges, as ``'end'`` would charge
    them: for ``'active'`` CPU, each interval that ends where its thread went idle is
    moved onto the sample before it; for ``'split'``, doubled, with half of each
    interval the thread ran through moved onto the sample before it (see the module
    docstring)."""
    if clock != "cpu":
        if interval == "split":
            return [2 * d for d in snapshots.wall_deltas()]
        return snapshots.wall_deltas()
    cpu = snapshots.cpu_deltas()
    if interval == "split":
        return _split_charges(snapshots, cpu)
    if interval != "active":
        return cpu
    wall = snapshots.wall_deltas()
    stacks = snapshots.sample_stack
    out = list(cpu)
    last: dict[int, int] = {}  # thread -> index of its previous sample
    before: dict[int, int] = {}  # thread -> index of the sample before that
    for i, t in enumerate(snapshots.sample_thread):
        j = last.get(t)
        if j is not None:
            h = before.get(t)
            # j ends an interval and i tells whether the thread was idle after j
            if (h is not None and stacks[j] and stacks[h] and out[j]
                    and cpu[i] < IDLE_FRACTION * wall[i]):
                out[h] += out[j]
                out[j] = 0
            before[t] = j
        last[t] = i
    return out


def _split_charges(snapshots: Any, cpu: Sequence[int]) -> list[int]:
    """Twice what ``'split'`` charges each sample (integers: halves stay exact).

    One pass in sample order. Each OS thread has the sample where it was last seen
    running, in whichever of its contexts (itself, or one of its greenlets): a
    sample that ends an interval with CPU shares it with that one, then is the
    thread's running sample. A greenlet's marker where its thread ran elsewhere (no
    stack, in a thread that several contexts share) is passed over: the thread ran
    through the switch. (Split within each greenlet instead, the first sample of a
    greenlet's run took its interval whole and then half of the next, and the last
    gave its interval's other half away: a busy gevent server's hashing, which
    always starts after a switch, got 9-20 points too much.) One without CPU where
    the sample before it had another stack ends the run: the thread moved without
    running, so it is where it waits (the native engine files a thread found
    asleep as its run up to then, then the wait with no CPU). One without CPU in
    the stack of the sample before leaves the run as it is: the thread did not
    run in between, preempted on a busy machine as often as asleep (taken for a
    wait, a thread preempted in the middle of one function for a whole interval
    gave the interval after it wholly to the next one: the handler test's parser
    got 33-46% of the CPU for 50% beside two busy processes). The same stack in
    another greenlet is another place. Any other sample without a stack ends the
    run. A ``<gc>`` sample keeps its own delta and leaves the run as it is (a
    collection's CPU was taken out of the interval around it).

    The collections inside an interval count in its halves: each side is owed half
    of the interval with them, less the collections made on its side. Where the two
    sides are in different greenlets, a collection is on the side of the greenlet
    it was made in (in neither's: half each's). Within one greenlet, it is on the
    side whose stack shares more of its functions with the collection's, outermost
    first (a tie, or made in another greenlet: half each's). The charges so depend
    on the samples, not on how their stacks are drawn: joined under their spawners
    (``analyzer.greenlets.spawn_tree``), stacks of different greenlets share the
    spawner's frames, and compared across greenlets, a collection made by an accept
    loop moved half to the handler it switched to (a test's per-greenlet times
    changed under ``spawn_tree``, 3 runs in 16 on 3.10). Halving only what the
    collections left, code that makes garbage for 20 ms then computes for 20 ms,
    collections half of the first part's time, was charged 3 points too much for
    the garbage at 5 ms: where the work changed within an interval, the garbage's
    side of it had lost the collections' time.
    """
    stacks = snapshots.sample_stack
    frames = snapshots.frames
    gc_stacks = {sid for sid, fid in enumerate(snapshots.stack_frame)
                 if sid and is_gc_frame(frames[fid])}
    out = [2 * d for d in cpu]
    lane_of, shared = _lanes(snapshots)
    contexts = snapshots.sample_thread
    running: dict[Any, int] = {}  # OS thread -> the sample it was last seen running at
    last: dict[Any, tuple] = {}  # OS thread -> (context, stack) of its latest sample
    collected: dict[Any, list] = {}  # OS thread -> its collections since that sample
    functions: dict[int, tuple] = {}  # stack -> its functions (_collections_lean)
    for i, context in enumerate(contexts):
        sid = stacks[i]
        t = lane_of[context]
        if not sid and t in shared:
            continue  # (a greenlet's marker where its OS thread ran elsewhere)
        if sid in gc_stacks:
            if t in running:
                collected.setdefault(t, []).append(i)
            continue
        c = cpu[i]
        if not c or not sid:
            if last.get(t) != (context, sid) or not sid:
                running.pop(t, None)
                collected.pop(t, None)
            last[t] = (context, sid)
            continue
        last[t] = (context, sid)
        j = running.get(t)
        if j is not None:
            moved = c
            inside = collected.pop(t, None)
            if inside:
                lean = _collections_lean(snapshots, j, i, inside, cpu, functions)
                moved = min(max(c + lean, 0), 2 * c)
            out[i] -= moved
            out[j] += moved
        running[t] = i
    return out


def _lanes(snapshots: Any) -> tuple[list, set]:
    """Each context's OS thread (its run and native id; the context itself when the
    id is not known), and the OS threads that more than one context shares (a
    thread and its greenlets)."""
    lane_of = []
    seen: dict[Any, int] = {}
    for info in snapshots.threads:
        lane = (info.run, info.native_id) if info.native_id else ("context", info.id)
        lane_of.append(lane)
        seen[lane] = seen.get(lane, 0) + 1
    return lane_of, {lane for lane, n in seen.items() if n > 1}


def _collections_lean(snapshots: Any, before: int, after: int, inside: list[int],
                      cpu: Sequence[int], functions: dict[int, tuple]) -> int:
    """The CPU of the collections ``inside`` made on the side of sample ``after``, less
    those made on the side of sample ``before`` (see :func:`_split_charges`);
    ``functions`` caches :func:`_functions`."""
    def of(stack_id: int) -> tuple:
        known = functions.get(stack_id)
        if known is None:
            known = functions[stack_id] = _functions(snapshots, stack_id)
        return known

    contexts, stacks = snapshots.sample_thread, snapshots.sample_stack
    ours, theirs = contexts[before], contexts[after]
    lean = 0
    for k in inside:
        made_in = contexts[k]
        if ours != theirs:
            side = (made_in == theirs) - (made_in == ours)
        elif made_in != ours:
            side = 0
        else:
            made = of(snapshots.stack_parent[stacks[k]])
            side = _shared(made, of(stacks[after])) - _shared(made, of(stacks[before]))
        lean += cpu[k] if side > 0 else -cpu[k] if side < 0 else 0
    return lean


def _functions(snapshots: Any, stack_id: int) -> tuple:
    """The functions of a stack (name, file, first line), outermost first."""
    frames = snapshots.frames
    return tuple(frames[f][:3] for f in reversed(snapshots.stack(stack_id)))


def _shared(a: tuple, b: tuple) -> int:
    """How many outermost functions two stacks share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def interval_weights(deltas: Sequence[int], interval: str) -> Optional[list]:
    """Per-sample weights of one thread from its deltas (time since its previous sample).

    ``None`` when the thread has fewer than two samples: one instant is no interval.
    """
    n = len(deltas)
    if n < 2:
        return None
    if interval != "midpoint":  # 'active' deltas come already moved (clock_deltas)
        return list(deltas)
    out = [2 * deltas[1]]
    out.extend(map(add, deltas[1:n - 1], deltas[2:]))
    out.append(2 * deltas[n - 1])
    return out


def time_weights(times: Sequence[Any], interval: str) -> Optional[list]:
    """Per-sample weights of one thread from absolute times, oldest first (raw shape).

    Floats, whatever the input's number type, as Racket's JSON has them.
    """
    n = len(times)
    if n < 2:
        return None
    if interval != "midpoint":  # no wall times, no CPU figures: 'active' and 'split' are 'end'
        return [0.0] + [float(times[i] - times[i - 1]) for i in range(1, n)]
    out = [float(times[1] - times[0])]
    out.extend((times[i + 1] - times[i - 1]) / 2 for i in range(1, n - 1))
    out.append(float(times[n - 1] - times[n - 2]))
    return out


def split_by_thread(thread_col: Sequence[int], columns: Sequence[Sequence[Any]],
                    wanted: Optional[set] = None) -> Iterator[tuple[int, list[Sequence[Any]]]]:
    """Yield ``(thread id, [column restricted to that thread, ...])`` for each thread.

    Order within a thread is kept.  With one thread the columns are passed through
    untouched; with a few, each is filtered by C-level ``compress`` passes; with many,
    sample indices are bucketed once.  ``wanted`` limits the threads yielded.
    """
    present = set(thread_col)
    if wanted is not None:
        chosen = sorted(present & wanted)
    else:
        chosen = sorted(present)
    if len(present) == 1 and chosen:
        yield chosen[0], list(columns)
        return
    if len(chosen) <= _FEW_THREADS:
        for t in chosen:
            sel = bytes(map(t.__eq__, thread_col))
            yield t, [list(compress(c, sel)) for c in columns]
        return
    buckets: dict[int, list[int]] = {t: [] for t in chosen}
    for i, t in enumerate(thread_col):
        b = buckets.get(t)
        if b is not None:
            b.append(i)
    for t in chosen:
        idx = buckets[t]
        yield t, [[c[i] for i in idx] for c in columns]


def sample_weights(snapshots: Any, clock: str = "cpu", *,
                   interval: Optional[str] = None) -> list[float]:
    """Seconds of ``clock`` time each sample of ``snapshots`` stands for.

    The same rule :func:`analyzer.analyze_samples` uses, for tools that need per-sample
    numbers (exporters), and the same default: ``interval=None`` is the snapshots'
    natural rule (:func:`natural_interval`: ``'split'`` for the native engine's,
    ``'end'`` for others; see the module docstring for why).

    Edge cases, as in the analysis:

    * a thread seen once: its sample gets ``0.0`` (Racket drops such threads);
    * a thread's first sample: ``0.0`` under ``'end'`` (no interval ends there),
      its one interval whole under ``'midpoint'``; its last sample: its own interval
      under both rules (whole under ``'midpoint'``, as Racket's "last: cur - prev");
    * idle samples (stack 0) bound intervals and get their weight like any sample
      (the interval ending at them under ``'end'``, half of each neighbour under
      ``'midpoint'``); callers decide whether idle time counts -- the analysis and
      the exporters charge it to nobody.

    Under ``'end'`` a thread's weights sum to its clock time from its first to its
    last sample.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(map(repr, CLOCKS))}, not {clock!r}")
    interval = resolve_interval(interval, snapshots=snapshots)
    deltas = clock_deltas(snapshots, clock, interval)
    n = len(deltas)
    scale = SCALE[interval]
    out = [0.0] * n
    index = range(n)
    for _tid, (idx, d) in split_by_thread(snapshots.sample_thread, [index, deltas]):
        w = interval_weights(d, interval)
        if w is not None:
            for i, x in zip(idx, w):
                out[i] = x * scale
    return out
