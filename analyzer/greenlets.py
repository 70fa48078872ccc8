"""Greenlets in a profile: which there were, the time of each, one profile each.

The sampler files the samples of a tracked thread under a context per greenlet that
ran in it (a :class:`~sampler.snapshot.ThreadInfo` of kind ``'greenlet'``, named
after the greenlet, with its thread's native id), the thread's main greenlet staying
the thread itself; so every view that shows threads shows greenlets too, and a
thread's time is the sum of its contexts'.  Each run's ``extra['greenlets']`` adds
what a context cannot say: the greenlet's small id, its parent's context and its
thread's context.  It is read defensively here: a file may hold anything there.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .analyze import ThreadSelection, _recognise, analyze_samples
from .model import Profile
from sampler.snapshot import Frame, Snapshots, StackTrie

__all__ = ["GreenletInfo", "greenlets_of", "analyze_by_greenlet", "greenlet_times", "spawn_tree"]

EXTRA_KEY = "greenlets"  # sampler.recorder.GREENLETS_KEY (the analyzer imports no sampler)
SPAWNS_KEY = "greenlet_spawns"  # sampler.recorder.GREENLET_SPAWNS_KEY


class GreenletInfo(NamedTuple):
    """One greenlet context of a snapshots value (ids are its thread ids)."""

    id: int  # its context's thread id in the snapshots
    name: str
    greenlet: Optional[int]  # the sampler's small greenlet id (None: not recorded)
    parent: Optional[int]  # the context of the greenlet that spawned it, or its thread
    thread: Optional[int]  # the context of the OS thread it ran in


def greenlets_of(samples: Any) -> dict[int, GreenletInfo]:
    """The greenlet contexts of a snapshots value (or a list of them), by id."""
    value = _recognise(samples)
    if isinstance(value, tuple):
        raise ValueError("greenlets_of() needs snapshots: the raw shape has no greenlets")
    # Thread ids as the recorder numbered them: per run, in order (merge keeps it).
    local: dict[tuple[int, int], int] = {}
    own_number: dict[int, int] = {}
    counts: dict[int, int] = {}
    for t in value.threads:
        n = own_number[t.id] = counts.get(t.run, 0)
        local[(t.run, n)] = t.id
        counts[t.run] = n + 1
    out: dict[int, GreenletInfo] = {}
    for t in value.threads:
        if t.kind != "greenlet":
            continue
        extra = value.runs[t.run].extra if t.run < len(value.runs) else {}
        table = extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
        row = table.get(str(own_number[t.id])) if isinstance(table, dict) else None
        if isinstance(row, list) and len(row) == 3 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in row):
            out[t.id] = GreenletInfo(t.id, t.name, row[0], local.get((t.run, row[1])),
                                     local.get((t.run, row[2])))
        else:
            out[t.id] = GreenletInfo(t.id, t.name, None, None, None)
    return out


def analyze_by_greenlet(samples: Any, *, weight: str = "cpu", granularity: str = "function",
                        interval: Optional[str] = None,
                        threads: ThreadSelection = None) -> dict[str, Profile]:
    """One profile per context that has samples -- each greenlet, and each thread for
    its main greenlet -- keyed by name (``name #id`` where names repeat), in the
    order they were first seen.  ``threads`` limits the contexts as in
    :func:`~analyzer.analyze_samples`.  Each sample keeps its weight, so the profiles
    add up to ``analyze_samples(samples)``."""
    value = _recognise(samples)
    if isinstance(value, tuple):
        raise ValueError("analyze_by_greenlet() needs snapshots: the raw shape has no greenlets")
    whole = analyze_samples(value, weight=weight, granularity=granularity, interval=interval,
                            threads=threads)
    infos = value.threads
    seen = [tid for tid in whole.thread_times]
    names = [infos[tid].name for tid in seen]
    out: dict[str, Profile] = {}
    for tid, name in zip(seen, names):
        key = name if names.count(name) == 1 else f"{name} #{tid}"
        out[key] = analyze_samples(value, weight=weight, granularity=granularity,
                                   interval=interval, threads=[tid])
    return out


def greenlet_times(samples: Any, *, weight: str = "cpu", interval: Optional[str] = None
                   ) -> dict[str, float]:
    """Seconds per context (greenlets, and threads for their main greenlets), by
    the names :func:`analyze_by_greenlet` uses."""
    return {name: p.total_time for name, p in
            analyze_by_greenlet(samples, weight=weight, interval=interval).items()}


def _spawn_frames(extra: Any, own_number: int) -> tuple:
    """The spawning stack recorded for a context (outermost first), or ``()``."""
    table = extra.get(SPAWNS_KEY) if isinstance(extra, dict) else None
    rows = table.get(str(own_number)) if isinstance(table, dict) else None
    if not isinstance(rows, list):
        return ()
    out = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                and isinstance(row[1], str) and isinstance(row[2], int)
                and (row[3] is None or isinstance(row[3], int))):
            return ()  # a hostile or damaged table: no spawn stack rather than a wrong one
        out.append(Frame(*row))
    return tuple(out)


def spawn_tree(samples: Any) -> Snapshots:
    """The snapshots with each greenlet's stacks joined under the frames that spawned
    it: a greenlet's samples start with the stack of the greenlet that spawned it at
    that moment (itself joined under its own spawner, and so on up to a thread's main
    greenlet), so a server's handlers show under the accept loop that spawned them.

    The spawning stack is gevent's ``spawning_stack`` (gevent keeps its innermost
    ``Greenlet.spawning_stack_limit`` frames, 10 by default), or, for a plain
    greenlet, the stack of its parent when it first switched to it.  A greenlet with
    no recorded spawning stack keeps its own stacks.  Threads, times and marks are
    unchanged; analyse the result as any snapshots
    (``analyze_samples(spawn_tree(snaps))``)."""
    value = _recognise(samples)
    if isinstance(value, tuple):
        raise ValueError("spawn_tree() needs snapshots: the raw shape has no greenlets")
    infos = greenlets_of(value)
    own_number: dict[int, int] = {}
    counts: dict[int, int] = {}
    for t in value.threads:
        own_number[t.id] = counts.get(t.run, 0)
        counts[t.run] = own_number[t.id] + 1
    # each greenlet context's prefix: its spawner's prefix, then its spawning stack
    prefixes: dict[int, tuple] = {}

    def prefix(cid: int, seen: frozenset = frozenset()) -> tuple:
        if cid in prefixes:
            return prefixes[cid]
        info = infos.get(cid)
        if info is None or cid in seen:
            return ()
        t = value.threads[cid]
        extra = value.runs[t.run].extra if t.run < len(value.runs) else {}
        own = _spawn_frames(extra, own_number[cid])
        above = prefix(info.parent, seen | {cid}) if own and info.parent is not None else ()
        prefixes[cid] = above + own
        return prefixes[cid]

    trie = StackTrie()
    frames = value.frames
    joined: dict[tuple[int, int], int] = {}
    sample_stack = []
    for tid, sid in zip(value.sample_thread, value.sample_stack):
        head = prefix(tid) if sid and tid in infos else ()
        key = (tid if head else -1, sid)
        new = joined.get(key)
        if new is None:
            new = trie.path_id(trie.frame_id(f) for f in head)
            for fid in reversed(value.stack(sid)):
                new = trie.stack_id(new, trie.frame_id(frames[fid]))
            joined[key] = new
        sample_stack.append(new)
    return Snapshots(
        frames=trie.frames, stack_frame=trie.stack_frame, stack_parent=trie.stack_parent,
        threads=value.threads, sample_thread=value.sample_thread, sample_stack=sample_stack,
        sample_wall=value.sample_wall, sample_cpu=value.sample_cpu,
        sample_marks=value.sample_marks, wall_overflow=value.wall_overflow,
        cpu_overflow=value.cpu_overflow, mark_sets=value.mark_sets,
        custom_keys=value.custom_keys, runs=value.runs)
