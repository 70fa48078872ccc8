"""The recorder: the collector's side of the snapshot store.

One writer, any number of readers, no lock between them.  The engine that owns the
recorder (the Python collector thread, or the native engine) is its only writer: it
interns stacks and appends samples.  Readers (``get-snapshots``, possibly from a
signal handler that interrupted the writer's own thread, or from any other thread)
never take a lock: every column is append-only and every append that another column
refers to happens before the append that refers to it (a frame before the stack node
naming it, a stack node before the sample naming it, the sample's other columns
before its thread column).  So :meth:`Recorder.snapshot` reads the length of the
referring column first and copies the referred ones after, and always gets a
consistent prefix, whatever ran in between.

Stacks are interned incrementally, one ``(parent stack, frame)`` pair at a time, so a
new stack costs memory for what is new in it (a recursion that changes depth adds
one node per new level, not a copy of the whole stack).  Frames are resolved to
:class:`~sampler.snapshot.Frame` values (qualified name, file, first line, line) the
first time a ``(code object, instruction offset)`` pair is seen, and the code object
itself is never kept: the lookup table from code objects to frame ids holds them only
weakly, and forgets a code object's entry when it is freed, so a program that keeps
generating code (``exec``, lambdas) keeps only the frames its profile names.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import weakref
from array import array
from types import CodeType, FrameType
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

from . import realthreads
from .clocks import clock_for, read_cpu
from .gctime import gc_frame
from .marks import frame_marks
from .snapshot import OVERFLOW, Frame, RunInfo, Snapshots, StackTrie, ThreadInfo
from .greenlets import GreenletRecord, greenlet_at, running_in, switch_log
from .tracking import Target, key_has_ended

_MAX_DELTA = OVERFLOW - 1
# Top frames rewritten (see _rewrite), by qualified name and, before 3.11, plain name.
_HOOK_NAMES = frozenset({"SwitchHook.__call__", "__call__"})
_HUB_NAMES = frozenset({"Hub.run", "run"})
_REWRITTEN = _HOOK_NAMES | _HUB_NAMES


def _stack_shape(stack: Sequence) -> tuple:
    """What tells most stacks of collections (``(code, offset)`` pairs, innermost
    first) apart cheaply: the depth and the innermost pair, its code by identity
    (alive as long as the stack is)."""
    if not stack:
        return (0, 0, 0)
    code, lasti = stack[0]
    return (len(stack), id(code), lasti)


MAX_COLLECTION_STACKS = 64
"""Collections' stacks :meth:`Recorder.collection_stack` keeps, at most."""

GREENLETS_KEY = "greenlets"
GREENLET_SPAWNS_KEY = "greenlet_spawns"
"""In a run's ``extra``: ``{context id: [[name, file, first line, line], ...]}``, the
stack (outermost first) that spawned each greenlet context's greenlet, where known."""
"""In a run's ``extra``: ``{context id: [greenlet id, parent's context id, thread's
context id]}`` for the contexts of greenlets met in tracked threads; context ids are
thread ids of that run (before any merge)."""
HUB_IDLE = Frame("<hub idle>", "<gevent>", 0, None)
"""The pseudo-frame of the time the gevent hub waits in its event loop: idle time,
never CPU of ``Hub.run`` (the loop's own CPU, polling and dispatching, is filed here)."""
_clock_gettime = getattr(time, "clock_gettime", None)
# Code whose frames can be suspended and resumed under another caller: a cached walk
# is only reused for a top frame that runs from its call to its return.
_RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR


class _Context:
    """Per thread/greenlet state between ticks, and its walk cache.

    The walk cache remembers the last sampled top frame (``top``: its offset, its
    stack id, and the stack id and marks below it) and the top's caller (``back``:
    the stack id and marks below it).  A frame of a plain function runs from its call
    to its return, and while it runs its callers are suspended in their calls: if the
    same frame object is still in the stack at the next tick, every frame below it
    and their offsets and marks are unchanged, so only the frames above it (and its
    own offset and marks) are read again.  Generator and coroutine frames, which are
    suspended and resumed under other callers, are never cached.  ``top`` and
    ``back`` keep those two frame objects alive until this context's next sample
    (one delay), or until the end of the first tick that does not sample this
    context (the recorder drops them then).
    """

    __slots__ = ("id", "wall_us", "cpu_us", "clock", "running", "kind", "ident",
                 "top", "top_lasti", "top_sid", "base_sid", "base_marks", "back",
                 "back_base_sid", "back_base_marks", "tick", "last_sid", "last_marks", "os_last")

    def __init__(self, cid: int, wall_us: int, cpu_us: int, clock: Optional[int],
                 kind: str, ident: Optional[int]) -> None:
        self.id = cid
        self.wall_us = wall_us
        self.cpu_us = cpu_us
        self.clock = clock  # the CPU clock id of the OS thread it runs in
        self.running = True
        self.kind = kind
        self.ident = ident
        self.top: Optional[FrameType] = None
        self.top_lasti = -2
        self.top_sid = 0
        self.base_sid = 0
        self.base_marks: tuple = ()
        self.back: Optional[FrameType] = None  # the top's caller, when a plain frame
        self.back_base_sid = 0
        self.back_base_marks: tuple = ()
        self.tick = -1
        self.last_sid = 0  # the stack and mark set of its last sample (see hub idle)
        self.last_marks = 0
        # of a thread: the context that took its OS thread's last sample (itself, or
        # the context of the greenlet that was running then)
        self.os_last: Optional["_Context"] = None


class _CodeFrames(dict):
    """Instruction offset -> frame id for one live code object (a dict, for speed).
    Dropped when the code object is freed (``ref``'s callback)."""

    __slots__ = ("ref",)


def _collecting(gc_watch: Any) -> Optional[int]:
    """The OS thread inside a collection now, if any (``gc_watch.opened``). Finalizers
    that run Python let the GIL go inside a collection; a tick then would find the
    thread in a finalizer, whose time is the collection's (it is filed with the
    collection, once that has ended and been timed): such a thread is not sampled
    (sampled, collections running 20 us finalizers put 93% of the CPU under them)."""
    opened = gc_watch.opened if gc_watch is not None else None
    return opened[0] if opened is not None else None


class Recorder:
    """Interned frames and stacks plus the sample columns of one sampler run."""

    def __init__(self, custom_keys: Sequence[Any], start: float) -> None:
        # Taken by a writer that is not alone (none in the Python engine, which
        # writes from its collector thread only); readers never need it.  Reentrant,
        # so that code interrupted by a signal handler cannot deadlock against it.
        self.lock = realthreads.allocate_rlock()
        self.custom_keys = tuple(custom_keys)
        self._key_index = {k: i for i, k in enumerate(self.custom_keys)}
        self.start = start  # perf_counter() at the start of the run
        # interning
        self._trie = StackTrie()
        self.stack_frame = self._trie.stack_frame
        self.stack_parent = self._trie.stack_parent
        self._codes: dict[int, _CodeFrames] = {}  # id(code) -> its frames, while it lives
        # id(stack) -> (stack, its stack id): collections' stacks interned since
        # forget_collection_stacks (see collection_stack)
        self._collection_stacks: dict[int, tuple[Sequence, int]] = {}
        self._gc_frame_ids: dict[int, int] = {}  # generation -> the <gc> frame's id
        self._mark_ids: dict[tuple, int] = {(): 0}
        self._mark_sets: list[tuple] = [()]
        # contexts and samples
        self._contexts: dict[Hashable, _Context] = {}
        self._walked: dict[_Context, None] = {}  # contexts holding a cached top frame
        self._tick = 0
        self.threads: list[ThreadInfo] = []
        self.sample_thread = array("I")
        self.sample_stack = array("I")
        self.sample_wall = array("I")
        self.sample_cpu = array("I")
        self.sample_marks: Optional[array] = array("I") if self.custom_keys else None
        self.wall_overflow: dict[int, int] = {}
        self.cpu_overflow: dict[int, int] = {}
        self.torn_samples = 0
        self.targets_stale = False  # set when the tracker's targets must be rebuilt
        # greenlet context id -> [greenlet id, parent's context id, thread's context id]
        self.greenlets: dict[int, list[int]] = {}
        # greenlet context id -> the frames that spawned it (GREENLET_SPAWNS_KEY)
        self.greenlet_spawns: dict[int, list[list]] = {}
        self._greenlet_cids: dict[tuple[int, int], int] = {}  # (thread cid, greenlet id) -> cid
        # generation -> CPU and wall microseconds of the collections filed
        self.gc_cpu: dict[int, int] = {}
        self.gc_wall: dict[int, int] = {}

    # -- interning (the entry points shared with the native engine) -----------------
    @property
    def key_index(self) -> dict:
        """Custom key -> its position in a mark vector."""
        return self._key_index

    def stack_id(self, frames: Sequence[Frame]) -> int:
        """Intern a stack of already-resolved frames, outermost first (0 if empty)."""
        return self.path_id([self.frame_id(frame) for frame in frames])

    def frame_id(self, frame: Frame) -> int:
        """Intern an already-resolved frame."""
        return self._trie.frame_id(Frame(*frame))

    def path_id(self, frame_ids: Sequence[int]) -> int:
        """Intern a stack of interned frames, outermost first (0 if empty)."""
        return self._trie.path_id(frame_ids)

    def mark_set_id(self, marks: tuple) -> int:
        """Intern a tuple of per-extent mark vectors, innermost first (0 for ``()``)."""
        mid = self._mark_ids.get(marks)
        if mid is None:
            mid = len(self._mark_sets)
            self._mark_sets.append(marks)
            self._mark_ids[marks] = mid
        return mid

    def _frame_id(self, code: CodeType, lasti: int) -> int:
        """The frame id of ``code`` at ``lasti``, resolved now if new (the slow path)."""
        entry = self._codes.get(id(code))
        if entry is None:
            entry = self._code_entry(code)
        fid = entry.get(lasti)
        if fid is None:
            line = _line_of(code, lasti)
            frame = Frame(getattr(code, "co_qualname", code.co_name), code.co_filename,
                          code.co_firstlineno, line)
            fid = entry[lasti] = self._trie.frame_id(frame)
        return fid

    def _code_entry(self, code: CodeType) -> _CodeFrames:
        codes = self._codes
        key = id(code)

        def forget(ref: Any, codes: dict = codes, key: int = key) -> None:
            # Runs while the code object is freed, before its id can be reused.
            entry = codes.get(key)
            if entry is not None and entry.ref is ref:
                del codes[key]

        entry = _CodeFrames()
        entry.ref = weakref.ref(code, forget)
        codes[key] = entry
        return entry

    def _child(self, parent: int, code: CodeType, lasti: int) -> int:
        entry = self._codes.get(id(code))
        fid = entry.get(lasti) if entry is not None else None
        if fid is None:
            fid = self._frame_id(code, lasti)
        return self._trie.stack_id(parent, fid)

    # -- contexts and samples ---------------------------------------------------------
    def context(self, target: Target, clock: Optional[int], wall_us: int,
                cpu_us: Optional[int] = None) -> _Context:
        """The context of ``target.key``, or a new one whose CPU clock is ``clock``
        (its CPU time now read from that clock, unless the caller gives ``cpu_us``:
        an engine that read it at the sample)."""
        ctx = self._contexts.get(target.key)
        if ctx is None:
            if cpu_us is None:
                cpu = read_cpu(clock)
                cpu_us = int(cpu * 1e6) if cpu is not None else 0
            cid = len(self.threads)
            self.threads.append(ThreadInfo(cid, target.name, target.native_id, target.kind, 0,
                                           wall_us / 1e6, cpu_us / 1e6))
            ctx = _Context(cid, wall_us, cpu_us, clock, target.kind, target.ident)
            self._contexts[target.key] = ctx
        return ctx

    def append_sample(self, ctx: _Context, stack_id: int, wall_us: int, cpu_us: int,
                      mark_set: int = 0, greenlet: Optional[GreenletRecord] = None,
                      switched: bool = False, collection: bool = False) -> None:
        """Append one sample of ``ctx`` (times absolute, in microseconds); a sample
        with a stack means the context is running (a greenlet's next idle marker
        closes that).

        ``switched``: the thread switched greenlets since its last sample (an engine
        that reads the switch hook's log says so); a context found again where it was
        at that sample then gets an idle marker of no time first (it did not run
        through the interval).

        ``greenlet``: the greenlet running in the thread of ``ctx`` (see
        :mod:`sampler.greenlets`).  A sample of a greenlet other than the thread's
        main one is filed under a context of that greenlet (kind ``'greenlet'``,
        named after it, the thread's native id), and the interval since the thread's
        last sample is charged to it: each context gets an idle marker where the
        thread last ran elsewhere, so the thread's time is split among its greenlets
        and nothing is counted twice.

        A stack where the gevent hub waits in its event loop is filed as
        ``<hub idle>`` (:data:`HUB_IDLE`), and the CPU the thread used since its last
        sample, which went into the code it ran before it gave way to the hub, is
        filed first as a sample of that code (as the native engine does for a thread
        found asleep).

        ``collection``: the sample is a collection's (:meth:`record_gc`): it is not
        where the context ran, so the run before a ``<hub idle>`` sample is never
        filed there (it went to the collection's ``<gc>`` frame, as GC time)."""
        self._place(ctx, stack_id, wall_us, cpu_us, mark_set, greenlet, switched, collection)

    def append_run(self, ctx: _Context, stack_id: int, began_us: int, began_cpu_us: int,
                   wall_us: int, cpu_us: int, mark_set: int = 0,
                   greenlet: Optional[GreenletRecord] = None) -> None:
        """A run of ``ctx`` (or of ``greenlet`` in its thread) at one place, from the
        clocks ``began_us``, ``began_cpu_us`` to ``wall_us``, ``cpu_us``: as two
        :meth:`append_sample` calls, the first with no CPU where the run begins (so
        that ``'split'`` gives the run wholly to this place, not half to the one the
        thread's sample before it showed), the second with the run's CPU where it
        ends. One call, as the second sample's context, stack and marks are the
        first's (the native engine files a greenlet's turns so, several between two
        samples)."""
        target, stack_id, mark_set = self._place(ctx, stack_id, began_us, began_cpu_us, mark_set,
                                                 greenlet, False, False)
        self._append(target, stack_id, wall_us, cpu_us, mark_set)

    def _place(self, ctx: _Context, stack_id: int, wall_us: int, cpu_us: int, mark_set: int,
               greenlet: Optional[GreenletRecord], switched: bool,
               collection: bool) -> tuple[_Context, int, int]:
        """:meth:`append_sample`; the context, stack and marks the sample was filed
        under."""
        last = ctx.os_last or ctx
        if stack_id and self._trie.frames[self.stack_frame[stack_id]].name in _REWRITTEN:
            stack_id, hub = self._rewrite(stack_id)
            if hub:
                if last.last_sid and last.last_sid != stack_id and cpu_us > last.cpu_us:
                    ran_until = min(wall_us, last.wall_us + (cpu_us - last.cpu_us))
                    self._append(last, last.last_sid, ran_until, cpu_us, last.last_marks)
                mark_set = 0
        target = ctx
        if greenlet is not None and not greenlet.is_main and ctx.kind == "thread":
            target = self._greenlet_context(ctx, greenlet, last, stack_id)
        if target is not last or (switched and stack_id):
            # the thread ran elsewhere since this context's last sample; or (the
            # engine's switch log says so) it switched away and back, with no sample
            # elsewhere: a marker of no time at its last sample says the interval was
            # not run through by this context (the 'split' rule passes such markers
            # over where the OS thread has other contexts, and halves the thread's
            # intervals across its greenlets; where it has none, it ends the run)
            self._append(target, 0, last.wall_us, last.cpu_us, 0)
        if not collection:
            target.last_sid, target.last_marks = stack_id, mark_set
        self._append(target, stack_id, wall_us, cpu_us, mark_set)
        if target is not ctx or ctx.os_last is not None:
            ctx.os_last = target
        return target, stack_id, mark_set

    def _greenlet_context(self, ctx: _Context, rec: GreenletRecord, last: _Context,
                          stack_id: int) -> _Context:
        """The context of greenlet ``rec`` in the thread of ``ctx``, made at the
        thread's last sample when new (see :meth:`_name_greenlet` for a greenlet
        that has no name)."""
        key = ("greenlet", ctx.id, rec)
        gctx = self._contexts.get(key)
        if gctx is None:
            cid = len(self.threads)
            thread = self.threads[ctx.id]
            self.threads.append(ThreadInfo(cid, rec.name, thread.native_id, "greenlet", 0,
                                           last.wall_us / 1e6, last.cpu_us / 1e6))
            gctx = _Context(cid, last.wall_us, last.cpu_us, ctx.clock, "greenlet", ctx.ident)
            self._contexts[key] = gctx
            parent = self._greenlet_cids.get((ctx.id, rec.parent), ctx.id)
            self.greenlets[cid] = [rec.id, parent, ctx.id]
            self._greenlet_cids[(ctx.id, rec.id)] = cid
            if rec.spawn:
                self.greenlet_spawns[cid] = [list(f) for f in rec.spawn]
        if not rec.named and stack_id:
            self._name_greenlet(rec, gctx, stack_id)
        elif self.threads[gctx.id].name is not rec.name:
            # named since its context was made (by the switch hook, at its next
            # switch: one greenlet of two kept its placeholder name, once in a
            # full run of the tests)
            self.threads[gctx.id] = self.threads[gctx.id]._replace(name=rec.name)
        return gctx

    def _name_greenlet(self, rec: GreenletRecord, gctx: _Context, stack_id: int) -> None:
        """Name a greenlet that has no name (one already started when the hook first
        saw it: greenlet drops its ``run`` as it starts) after the outermost function
        of one of its samples -- not after the switch hook's own frame: at its first
        switch the hook runs in it before its function starts, and a sample taken
        then has the hook's frame outermost (the hook itself skips it: see
        :func:`sampler.greenlets._learn_base`)."""
        outermost = stack_id
        while self.stack_parent[outermost]:
            outermost = self.stack_parent[outermost]
        frame = self._trie.frames[self.stack_frame[outermost]]
        if frame.name in _HOOK_NAMES and _is_file(frame, "sampler/greenlets.py"):
            return  # (named by a later sample)
        rec.name, rec.named = frame.name, True
        self.threads[gctx.id] = self.threads[gctx.id]._replace(name=frame.name)

    def _rewrite(self, stack_id: int) -> tuple[int, bool]:
        """``(stack to file, whether it is <hub idle>)`` for a sampled stack: the
        switch hook's own frame (caught at a greenlet switch) is dropped, its time is
        the switch's; the gevent hub in ``Hub.run`` (which only calls the event loop
        there) is ``<hub idle>``."""
        frames = self._trie.frames
        frame = frames[self.stack_frame[stack_id]]
        if frame.name in _HOOK_NAMES and _is_file(frame, "sampler/greenlets.py"):
            stack_id = self.stack_parent[stack_id]
            if not stack_id:
                return 0, False
            frame = frames[self.stack_frame[stack_id]]
        if frame.name in _HUB_NAMES and _is_file(frame, "gevent/hub.py"):
            return self._trie.stack_id(0, self._trie.frame_id(HUB_IDLE)), True
        return stack_id, False

    def _append(self, ctx: _Context, stack_id: int, wall_us: int, cpu_us: int,
                mark_set: int) -> None:
        if stack_id:
            ctx.running = True
        index = len(self.sample_thread)
        dw = wall_us - ctx.wall_us
        dc = cpu_us - ctx.cpu_us
        if dc < 0:  # a clock that went back (should not happen): never store a negative
            dc = 0
            cpu_us = ctx.cpu_us
        if dw < 0:
            dw = 0
            wall_us = ctx.wall_us
        ctx.wall_us = wall_us
        ctx.cpu_us = cpu_us
        if dw > _MAX_DELTA:
            self.wall_overflow[index] = dw
            dw = OVERFLOW
        if dc > _MAX_DELTA:
            self.cpu_overflow[index] = dc
            dc = OVERFLOW
        # Columns are appended in one order, the thread column last: a reader takes
        # its length as the number of complete samples.
        self.sample_stack.append(stack_id)
        self.sample_wall.append(dw)
        self.sample_cpu.append(dc)
        if self.sample_marks is not None:
            self.sample_marks.append(mark_set)
        self.sample_thread.append(ctx.id)

    # -- the Python engine's hot path -------------------------------------------------
    def record_tick(self, targets: list[tuple[Target, Optional[FrameType]]], now: float,
                    current_frames: Callable[[], dict] = sys._current_frames,
                    gc_watch: Any = None) -> None:
        """Append one sample per running target (called by the single writer), each
        at wall time ``now`` (the tick's ``perf_counter()``).

        ``gc_watch`` (a :class:`sampler.gctime.GCWatch`): its collections are filed
        (:meth:`record_gc`) after the targets' CPU clocks are read, before their
        samples.  Not before the reads: the GIL can change hands in between (the
        collector's thread is descheduled while it holds it, for tens of ms on a
        loaded machine), and a collection that ended there is in the CPU time the
        sample reads; filed at the next tick, its time would be capped by the CPU
        used since, most often nothing, or never filed at all after the last tick.

        The GIL can change hands anywhere in a tick, also within microseconds of
        the collector taking it (measured in the ``threads_churn`` stress program:
        about one tick in 800 found a thread moved on by its end, some of them ticks
        of under 100 us, where the old rule, that a holder keeps the GIL a switch
        interval, had them safe and unchecked), and a thread being walked may move
        on meanwhile.  A plain frame that returned keeps its callers (the walk reads
        a stack the thread has just left), but a generator's frame that yielded has
        none: its walk ends there (``['gen']``).  So after the walks every thread is
        looked at once more (``current_frames``, one call for all, under a
        microsecond): it must still be in the frame its walk started from (then
        every caller read was executing throughout, and stack and marks agree), and
        when that frame is a generator's or a coroutine's, which can yield and be
        resumed in between, its callers down to the first plain frame must be the
        ones the walk read (:func:`_links_hold`).  A thread that moved is walked
        again from where it is now, twice at most, and otherwise counted in
        ``torn_samples`` instead of being recorded.
        """
        self._tick += 1
        wall_us = int((now - self.start) * 1e6)
        walked = []
        kept = 0  # contexts sampled this tick that keep a cached top frame
        collecting = _collecting(gc_watch)
        for target, frame in targets:
            if collecting is not None and target.ident == collecting:
                continue
            found = self._tick_target(target, frame, wall_us)
            if found is None:
                continue
            ctx, cpu_us = found
            sid, marks, links = self._walk(ctx, frame)
            if ctx.top is not None or ctx.back is not None:
                kept += 1
            walked.append((target, ctx, cpu_us, frame, sid, marks, links))
        self._file_collections(gc_watch)  # every one that ended by now, the clocks read
        if kept != len(self._walked):
            self._drop_stale_walks()
        if walked:
            self._store_checked(walked, wall_us, current_frames)

    def _store_checked(self, walked: list, wall_us: int,
                       current_frames: Callable[[], dict]) -> None:
        """Store each walk whose thread is still where the walk found it (see
        :meth:`record_tick`); walk the others again, twice at most.

        Only a thread that still lives is walked again: the ident of one that ended
        can name a thread started since, whose stack was walked and filed as the
        ended thread's (``threads_churn``: a thread started with ``_thread``, its
        ``short`` outermost, filed under the ``threading`` thread whose ident it
        took, as a stack that did not start at ``Thread._bootstrap``)."""
        for attempt in range(3):
            fresh = current_frames()
            again = []
            for target, ctx, cpu_us, frame, sid, marks, links in walked:
                now_at = fresh.get(target.ident)
                if now_at is frame and (links is None or _links_hold(frame, links)):
                    self._store(ctx, sid, marks, wall_us, cpu_us, frame)
                    continue
                ctx.top = ctx.back = None  # the walk may have seen a stack being torn down
                # (a thread whose CPU clock no longer reads has ended: its ident
                # may name another thread by now; a live thread's ident is its own)
                if (target.kind == "thread" and now_at is not None and attempt < 2
                        and read_cpu(ctx.clock) is not None):
                    again.append((target, ctx, cpu_us, now_at) + self._walk(ctx, now_at))
                else:
                    self.torn_samples += 1
            del fresh
            if not again:
                return
            walked = again

    def _cpu_us(self, ctx: _Context, target: Target) -> Optional[int]:
        """The thread's CPU time now, or ``None`` when this target no longer names
        the thread in its place.

        A clock failing does not mean the thread exited: it is in this tick's frames,
        so it was running a moment ago.  (After a fork, the forking thread's
        ``Thread.native_id`` names the parent's thread.)  The clock is named again,
        and without one the CPU time stands still for this sample."""
        if ctx.clock is not None:
            try:
                return int(_clock_gettime(ctx.clock) * 1e6)
            except OSError:
                if isinstance(target.key, tuple):
                    # A raw thread (no Thread object) named by a native id that is
                    # gone: its ident now runs another raw thread.  That is another
                    # context, with its own target from the next tick on.
                    self.targets_stale = True
                    return None
        if target.ident is not None:
            # (A greenlet first seen switched out had no known thread to name.)
            ctx.clock = clock_for(target)
            cpu = read_cpu(ctx.clock)
            if cpu is not None:
                # Another clock (or the first): count from here, never a jump.
                ctx.cpu_us = int(cpu * 1e6)
        return ctx.cpu_us

    def _walk(self, ctx: _Context, frame: FrameType) -> tuple[int, tuple, Optional[tuple]]:
        """The stack id and the marks (innermost first) of the stack topped by
        ``frame``, and when ``frame`` is a generator's or a coroutine's, the links
        under it that the walk read, for the tick's check (:func:`_links_of`;
        ``None`` for a plain frame, whose identity is enough).  Handed back, never
        kept: they hold frames.

        Three cheap cases before a full walk: ``frame`` is the cached top (same or new
        offset); its caller is the cached top or the cached top's caller (a call made
        or a sibling call since: everything below that caller is unchanged); it is the
        cached top's caller (the top returned).  Call-heavy code lands in the middle
        case at almost every tick.
        """
        want_marks = self.sample_marks is not None
        ctx.tick = self._tick
        if frame is ctx.top:
            lasti = frame.f_lasti
            if lasti == ctx.top_lasti:
                sid = ctx.top_sid
            else:
                sid = ctx.top_sid = self._child(ctx.base_sid, frame.f_code, lasti)
                ctx.top_lasti = lasti
            if want_marks:
                return sid, self._marks_of(frame) + ctx.base_marks, None
            return sid, (), None
        code = frame.f_code
        resumable = code.co_flags & _RESUMABLE
        links = None
        back = frame.f_back
        if back is not None and (back is ctx.top or back is ctx.back):
            if back is ctx.top:
                below, below_marks = ctx.base_sid, ctx.base_marks
            else:
                below, below_marks = ctx.back_base_sid, ctx.back_base_marks
            lasti = back.f_lasti
            sid = self._child(below, back.f_code, lasti)
            base_marks = self._marks_of(back) + below_marks if want_marks else ()
            ctx.back, ctx.back_base_sid, ctx.back_base_marks = back, below, below_marks
            if resumable:
                links = ((back, lasti),)  # (a cached frame is a plain one)
        elif frame is ctx.back:
            sid, base_marks = ctx.back_base_sid, ctx.back_base_marks
            ctx.back = None  # its caller's own base is not known
        else:
            chain = []
            f: Optional[FrameType] = back
            while f is not None:
                chain.append(f)
                f = f.f_back
            sid = 0
            base_marks = ()
            below, below_marks = 0, ()
            # self._child inlined: this loop is the cost of a walk that misses
            codes = self._codes
            known = self._trie._stack_ids
            for f in reversed(chain):  # outermost first
                below, below_marks = sid, base_marks
                f_code = f.f_code
                lasti = f.f_lasti
                entry = codes.get(id(f_code))
                fid = entry.get(lasti) if entry is not None else None
                if fid is None:
                    fid = self._frame_id(f_code, lasti)
                sid = known.get((sid, fid)) or self._trie.stack_id(sid, fid)
                if want_marks:
                    own = self._marks_of(f)
                    if own:
                        base_marks = own + base_marks
            del f
            if resumable:
                links = _links_of(chain)
            del chain
            if back is not None and not back.f_code.co_flags & _RESUMABLE:
                ctx.back, ctx.back_base_sid, ctx.back_base_marks = back, below, below_marks
            else:
                ctx.back = None
        lasti = frame.f_lasti
        top_sid = self._child(sid, code, lasti)
        if resumable:
            ctx.top = None
        else:
            ctx.top, ctx.top_lasti, ctx.top_sid = frame, lasti, top_sid
            ctx.base_sid, ctx.base_marks = sid, base_marks
        if ctx.top is not None or ctx.back is not None:
            self._walked[ctx] = None
        if want_marks:
            return top_sid, self._marks_of(frame) + base_marks, links
        return top_sid, (), links

    def _marks_of(self, frame: FrameType) -> tuple:
        entries = frame_marks.get(frame)
        if not entries:
            return ()
        index = self._key_index
        n = len(self.custom_keys)
        out = []
        for key, value in reversed(entries):
            i = index.get(key)
            if i is not None:
                vector: list[Any] = [None] * n
                vector[i] = value
                out.append(tuple(vector))
        return tuple(out)

    def _drop_stale_walks(self) -> None:
        """Let go of the cached top frame of every context not sampled this tick."""
        tick = self._tick
        for ctx in list(self._walked):
            if ctx.tick != tick or (ctx.top is None and ctx.back is None):
                ctx.top = ctx.back = None
                del self._walked[ctx]

    def _store(self, ctx: _Context, sid: int, marks: tuple, wall_us: int, cpu_us: int,
               top: FrameType) -> None:
        ctx.running = True
        self.append_sample(ctx, sid, wall_us, cpu_us, self.mark_set_id(marks) if marks else 0,
                           running_in(ctx.ident, top) if ctx.kind == "thread" else None)

    def forget_dead(self, live_keys: set) -> None:
        """Drop per-context state of contexts that have ended, so that a long run
        seeing thousands of short threads keeps neither their objects nor their
        frames.  A context that is merely untracked for a while keeps its id."""
        for key in [k for k in self._contexts if k not in live_keys and key_has_ended(k)]:
            ctx = self._contexts.pop(key)
            ctx.top = ctx.back = None

    def repair(self) -> None:
        """Trim the columns to a common length after an interrupted append."""
        cols = [self.sample_thread, self.sample_stack, self.sample_wall, self.sample_cpu]
        if self.sample_marks is not None:
            cols.append(self.sample_marks)
        n = min(len(c) for c in cols)
        for c in cols:
            del c[n:]
        for ov in (self.wall_overflow, self.cpu_overflow):
            for i in [i for i in ov if i >= n]:
                del ov[i]
        n_stacks = min(len(self.stack_frame), len(self.stack_parent))
        del self.stack_frame[n_stacks:]
        del self.stack_parent[n_stacks:]
        for ctx in self._contexts.values():
            ctx.top = ctx.back = None  # a cached walk may name a stack that was just trimmed
        self._walked.clear()

    def _tick_target(self, target: Target, frame: Optional[FrameType],
                     wall_us: int) -> Optional[tuple["_Context", int]]:
        """A target's context and CPU clock at this tick, or ``None`` when it has no
        stack to record: a greenlet that is not running (its interval is closed, once)
        or a thread whose clock is gone."""
        ctx = self._contexts.get(target.key)
        if ctx is None:
            ctx = self.context(target, clock_for(target), wall_us)
        if frame is None:
            if ctx.running:
                self.append_sample(ctx, 0, wall_us, self._cpu_us(ctx, target))
                ctx.running = False
            return None
        cpu_us = self._cpu_us(ctx, target)
        return None if cpu_us is None else (ctx, cpu_us)

    # -- instrumented stacks (use_errortrace, see sampler.shadow) ---------------------
    def record_tick_shadow(self, targets: list[tuple[Target, Optional[FrameType]]], now: float,
                           shadow: Any, gc_watch: Any = None,
                           current_frames: Callable[[], dict] = sys._current_frames) -> None:
        """As :meth:`record_tick`, but each running target's stack is its thread's
        shadow stack (``shadow.stack_of(ident)``: code objects and C functions'
        frames, outermost first), copied whole under the GIL by this single writer.
        A thread with no shadow stack yet (no event since sampling started) is walked,
        and its walk checked as :meth:`record_tick` checks them.  Marks still come from
        the live frames.  ``gc_watch``'s collections are filed
        after each target's CPU clock is read, before its sample."""
        self._tick += 1
        wall_us = int((now - self.start) * 1e6)
        want_marks = self.sample_marks is not None
        collecting = _collecting(gc_watch)
        walked = []
        for target, frame in targets:
            if collecting is not None and target.ident == collecting:
                continue
            found = self._tick_target(target, frame, wall_us)
            self._file_collections(gc_watch)
            if found is None:
                continue
            ctx, cpu_us = found
            entries = shadow.stack_of(target.ident)
            if entries is None:
                walked.append((target, ctx, cpu_us, frame) + self._walk(ctx, frame))
                continue
            sid = self._shadow_stack_id(entries)
            marks = self._walk(ctx, frame)[1] if want_marks else ()
            self._store(ctx, sid, marks, wall_us, cpu_us, frame)
        self._file_collections(gc_watch)
        if walked:
            self._store_checked(walked, wall_us, current_frames)
        self._drop_stale_walks()

    def _shadow_stack_id(self, entries: tuple) -> int:
        """Intern a shadow stack: code objects (at their first line) and frames."""
        trie = self._trie
        codes = self._codes
        known = trie._stack_ids
        sid = 0
        for entry in entries:
            if type(entry) is CodeType:
                cf = codes.get(id(entry))
                fid = cf.get(-1) if cf is not None else None
                if fid is None:
                    fid = self._frame_id(entry, -1)
            else:
                fid = trie.frame_id(entry)
            sid = known.get((sid, fid)) or trie.stack_id(sid, fid)
        return sid

    # -- garbage collections (see sampler.gctime) -------------------------------------
    def thread_context(self, ident: int) -> Optional[_Context]:
        """The context of the tracked OS thread ``ident`` (``None``: not sampled yet)."""
        for ctx in list(self._contexts.values()):
            if ctx.kind == "thread" and ctx.ident == ident:
                return ctx
        return None

    def _file_collections(self, gc_watch: Any) -> None:
        """File the collections ``gc_watch`` saw end and this recorder has not filed
        (a tick calls it once it has read the CPU clocks, see :meth:`record_tick`)."""
        if gc_watch is not None and gc_watch.pending:
            self.record_gc(gc_watch.take())
            self.forget_collection_stacks()

    def record_gc(self, events: list, cpu_now_us: Optional[int] = None,
                  switch_logs: Optional[Mapping[int, list]] = None) -> None:
        """File collections (events of :class:`sampler.gctime.GCWatch`, oldest first),
        each before the next regular sample of its thread: a sample of the stack that
        triggered it plus a ``<gc>`` frame, weighing its durations, which are taken
        out of the interval of that next sample (the context's clocks move on by
        them), under the greenlet that ran into it where the thread's switches are
        followed.  A collection in a thread not sampled yet is not filed: its time
        falls before the thread's first sample, which no sample counts.

        A collection's CPU time is never more than the CPU its thread used since its
        last sample (less what earlier collections took of it): ``cpu_now_us`` is the
        thread's CPU clock at the sample the events are filed before (an engine that
        read it), else the thread's clock is read here.

        ``switch_logs``: copies of threads' switch logs the caller holds (an
        engine filing a drain: see :func:`sampler.greenlets.switch_log`), used
        where they reach back to the thread's first collection; else the log is
        copied from there on.

        The events given are those of one interval of each thread (between its last
        sample and the next), and the collections of an interval made at one place
        (thread, outermost frame, stack, generation) are filed as one sample with
        their summed durations: every rule weighs a ``<gc>`` sample by its own
        durations, and where in the interval they fall is not known anyway (they are
        filed one after the other from its start). (Filed one by one, the 2,600
        collections a second of a program that makes cyclic garbage cost the feeder
        31 ms a second with the GIL, a 3% slowdown at 5 ms and at 1 ms alike.)"""
        # The collections of each place, in order: [stack, wall, CPU, start of the
        # first], by thread, outermost frame, generation and the stack's shape (a stack
        # is compared, not hashed: a code object's hash is taken over its contents).
        places: dict[tuple, list] = {}
        earliest: dict[int, int] = {}  # each thread's first collection's start (us)
        for ident, stack, generation, end_us, wall_us, cpu_us, base in events:
            if type(stack) is not tuple:
                stack = tuple(stack)
            if end_us - wall_us < earliest.get(ident, end_us - wall_us + 1):
                earliest[ident] = end_us - wall_us
            bucket = places.setdefault((ident, base, generation) + _stack_shape(stack), [])
            for place in bucket:
                if place[0] == stack:  # (the same code objects: compared by identity first)
                    place[1] += wall_us
                    place[2] += cpu_us
                    break
            else:
                bucket.append([stack, wall_us, cpu_us, end_us - wall_us])
        if not places:
            return
        contexts: dict[int, Optional[_Context]] = {}  # each thread's, looked up once
        clocks: dict[int, Optional[int]] = {}  # each thread's clock, read once per call
        logs: dict[int, list] = {}  # each thread's greenlet switches
        trie = self._trie
        for (ident, base, generation, *_shape), bucket in places.items():
            ctx = contexts[ident] if ident in contexts else contexts.setdefault(ident, self.thread_context(ident))
            if ctx is None:
                continue
            if ident not in logs:
                logs[ident] = self._switches_from(ident, earliest[ident], switch_logs)
            for stack, wall_us, cpu_us, began_us in bucket:
                last = ctx.os_last or ctx  # (where the thread's clocks are: its greenlets)
                if cpu_now_us is not None:
                    limit = cpu_now_us
                else:
                    if ident not in clocks:
                        clocks[ident] = self._cpu_now(ctx)
                    limit = clocks[ident]
                if limit is not None:
                    cpu_us = min(cpu_us, max(0, limit - last.cpu_us))
                # the greenlet that ran into the collections (none runs Python during one)
                running = greenlet_at(logs[ident], int((self.start * 1e6 + began_us) * 1000),
                                      base) if logs[ident] else None
                fid = self._gc_frame_ids.get(generation)
                if fid is None:
                    fid = self._gc_frame_ids[generation] = trie.frame_id(gc_frame(generation))
                sid = trie.stack_id(self.collection_stack(stack), fid)
                self.gc_cpu[generation] = self.gc_cpu.get(generation, 0) + cpu_us
                self.gc_wall[generation] = self.gc_wall.get(generation, 0) + wall_us
                self.append_sample(ctx, sid, last.wall_us + wall_us, last.cpu_us + cpu_us, 0, running,
                                   collection=True)

    def _switches_from(self, ident: int, since_us: int, copies: Optional[Mapping[int, list]]) -> list:
        """Thread ``ident``'s greenlet switches from the one in force at ``since_us``
        (the recorder's clock) on: the caller's copy where it reaches back that far,
        else a copy of the log from there. (A copy of the whole log at each filing of
        collections, 16,384 switches once a chatty gevent server has run a while,
        was 7% of the native engine's filing of one, at 1 ms.)"""
        since_ns = int((self.start * 1e6 + since_us) * 1000)
        log = copies.get(ident) if copies is not None else None
        if log and log[0][0] <= since_ns:
            return log
        return switch_log(ident, since_ns)

    def collection_stack(self, stack: Sequence) -> int:
        """The stack that triggered a collection (its event's ``(code, offset)``
        pairs, innermost first), interned.

        A stack met again as the same object is not walked again: the GC hooks give
        the events of one ``take()`` with the same frames one tuple (a program
        making cyclic garbage triggers most of its collections at a few lines).
        Kept until :meth:`forget_collection_stacks`, which whoever files a take's
        events calls when done: a stack kept holds its code objects, which the
        recorder otherwise never keeps (at most ``MAX_COLLECTION_STACKS`` are)."""
        memo = self._collection_stacks
        hit = memo.get(id(stack))
        if hit is not None and hit[0] is stack:
            return hit[1]
        sid = 0
        for code, lasti in reversed(stack):
            sid = self._child(sid, code, lasti)
        if len(memo) >= MAX_COLLECTION_STACKS:
            memo.clear()
        memo[id(stack)] = (stack, sid)
        return sid

    def forget_collection_stacks(self) -> None:
        """Let go of the collections' stacks :meth:`collection_stack` keeps."""
        self._collection_stacks.clear()

    @staticmethod
    def _cpu_now(ctx: _Context) -> Optional[int]:
        """The CPU clock of the thread of ``ctx`` now (microseconds), if it can be read."""
        if ctx.clock is None or _clock_gettime is None:
            return None
        try:
            return int(_clock_gettime(ctx.clock) * 1e6)
        except OSError:
            return None

    # -- reading (any thread, any time, no lock) -----------------------------------------
    def snapshot(self, run: RunInfo) -> Snapshots:
        """A frozen, consistent copy.  Safe while the writer writes (see the module
        docstring for why the order of the reads below matters)."""
        if self.greenlets:
            run = dataclasses.replace(run, extra={**run.extra, GREENLETS_KEY: {
                str(cid): list(v) for cid, v in list(self.greenlets.items())}})
        if self.greenlet_spawns:
            run = dataclasses.replace(run, extra={**run.extra, GREENLET_SPAWNS_KEY: dict(
                (str(cid), v) for cid, v in list(self.greenlet_spawns.items()))})
        n = len(self.sample_thread)
        wall_overflow = self.wall_overflow.copy()
        cpu_overflow = self.cpu_overflow.copy()
        columns = (self.sample_stack[:n], self.sample_wall[:n], self.sample_cpu[:n],
                   None if self.sample_marks is None else self.sample_marks[:n],
                   self.sample_thread[:n])
        n_stacks = len(self.stack_parent)
        stack_parent = self.stack_parent[:n_stacks]
        stack_frame = self.stack_frame[:n_stacks]
        return Snapshots(
            frames=self._trie.frames[:],
            stack_frame=stack_frame,
            stack_parent=stack_parent,
            threads=self.threads[:],
            sample_thread=columns[4],
            sample_stack=columns[0],
            sample_wall=columns[1],
            sample_cpu=columns[2],
            sample_marks=columns[3],
            wall_overflow={i: v for i, v in wall_overflow.items() if i < n},
            cpu_overflow={i: v for i, v in cpu_overflow.items() if i < n},
            mark_sets=self._mark_sets[:],
            custom_keys=self.custom_keys,
            runs=[run],
        )

    def custom_snapshots(self) -> list[tuple]:
        """Racket's get-custom-snapshots: per sample, its mark vectors, oldest first."""
        n = len(self.sample_thread)
        if self.sample_marks is None:
            return [() for _ in range(n)]
        sets = self._mark_sets[:]
        return [sets[m] for m in self.sample_marks[:n]]


def _links_of(chain: list) -> tuple:
    """The links a walk read under a generator's or a coroutine's frame (``chain``:
    its callers, innermost first): each caller and its instruction offset down to
    the first plain frame, or to the chain's end (a caller of ``None``)."""
    links = []
    for f in chain:
        links.append((f, f.f_lasti))
        if not f.f_code.co_flags & _RESUMABLE:
            return tuple(links)
    links.append((None, -1))
    return tuple(links)


def _links_hold(top: FrameType, links: tuple) -> bool:
    """Whether ``top``'s callers are still the ones its walk read (``links``, see
    :func:`_links_of`), called with ``top`` running now.  A generator yields and is
    resumed again under any caller; a walk that read it while it was suspended found
    no caller (its link is cleared at a yield) and ended there.  The first plain
    frame, once found running again where it was, has been in its call all along, so
    everything under it is as the walk read it."""
    f = top
    for caller, lasti in links:
        if f.f_back is not caller:
            return False
        if caller is None:
            return True
        if caller.f_lasti != lasti:
            return False
        f = caller
    return True


def _is_file(frame: Frame, tail: str) -> bool:
    return frame.filename.replace("\\", "/").endswith(tail)


def _line_of(code: CodeType, lasti: int) -> Optional[int]:
    if lasti < 0:
        return code.co_firstlineno
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return None
