"""The snapshot value: the one contract between ``sampler`` and ``analyzer``.

Racket calls its sampler's result "an internal detail".  Here it is a documented,
versioned value, because users merge runs, save them, and feed them to other tools.
It is immutable: ``get-snapshots`` hands out a frozen copy, so the collector can keep
writing while the user analyses what was returned.

Format version 1 (see ``scribblings/sampler.md`` for the user's view):

``frames``
    tuple of :class:`Frame` ``(name, filename, firstlineno, lineno)``; ``lineno`` is
    the line executing when sampled (``None`` when unknown).
``stacks``
    a trie rooted at the outermost frame, as two parallel arrays: stack ``0`` is the
    empty stack; stack ``i > 0`` is frame ``stack_frame[i]`` called from stack
    ``stack_parent[i]`` (always ``< i``).  Walking parents from a sample's stack gives
    its frames innermost first.  Shared callers are stored once.
``threads``
    tuple of :class:`ThreadInfo`, indexed by the small thread id samples carry.
``samples``
    columns (``array('I')``), oldest first: thread id, stack id, and the wall and CPU
    time since the previous sample *of the same thread*, in integer microseconds
    (``0`` for a thread's first sample, whose absolute times are in its ThreadInfo).
    Deltas are what the analyzer's weights need and keep a sample at 16 bytes.  A
    delta that does not fit 32 bits is stored as ``OVERFLOW`` with the exact value in
    ``wall_overflow`` / ``cpu_overflow`` (sample index -> microseconds).
``marks``
    ``mark_sets[0] == ()``; ``mark_sets[k]`` is a tuple, innermost extent first, of
    tuples holding one value per custom key (``None`` where the extent set another
    key).  ``sample_marks`` (present only when custom keys were asked for) gives each
    sample's mark set, so samples can be filtered or split by a mark's value.
``runs``
    tuple of :class:`RunInfo`, one per sampler run merged into this value.
"""

from __future__ import annotations

import itertools
import math
from array import array
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Sequence

FORMAT_VERSION = 1
OVERFLOW = 0xFFFFFFFF
"""Sentinel in a delta column: the exact delta is in the matching overflow dict."""


class Frame(NamedTuple):
    """One frame of a stack: a function and the line it was executing."""

    name: str
    filename: str
    firstlineno: int
    lineno: Optional[int]

    @property
    def function_key(self) -> tuple[str, str, int]:
        """What identifies the function, whatever line it was on."""
        return (self.name, self.filename, self.firstlineno)


class ThreadInfo(NamedTuple):
    """What is known of one sampled execution context (a thread or a greenlet)."""

    id: int
    name: str
    native_id: Optional[int]
    kind: str  # 'thread' or 'greenlet'
    run: int  # index into Snapshots.runs
    first_wall: float  # seconds since its run's start, at its first sample
    first_cpu: float  # the thread's CPU seconds at its first sample


@dataclass(frozen=True)
class RunInfo:
    """Metadata of one sampler run (DESIGN.md §2)."""

    pid: int = 0
    host: str = ""
    python: str = ""
    stackshot: str = ""
    start_epoch: float = 0.0  # time.time() when the run started
    duration: float = 0.0  # seconds from start to stop (or to this snapshot)
    sampling_wall: float = 0.0  # seconds spent not paused
    process_cpu: float = 0.0  # process CPU seconds while not paused (Racket's cpu time)
    requested_delay: float = 0.0  # the delay last asked for
    ticks: int = 0  # ticks taken
    late_ticks: int = 0  # ticks that ran more than half a delay after their deadline
    missed_ticks: int = 0  # deadlines skipped because a whole delay had passed
    torn_samples: int = 0  # samples dropped: the thread moved while its stack was read
    achieved_rate: float = 0.0  # ticks per second while not paused
    requested_rate: float = 0.0  # 1 / requested_delay (inf for a delay of 0)
    collector_cpu: float = 0.0  # the collector thread's own CPU seconds
    custom_keys: tuple = ()
    stopped: bool = False
    errors: tuple = ()  # exceptions raised inside the collector, as text
    engine: str = ""  # which engine took the samples: 'native' or 'python' ('' if unknown)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["custom_keys"] = list(self.custom_keys)
        d["errors"] = list(self.errors)
        for k in ("requested_rate", "achieved_rate"):
            if math.isinf(d[k]):
                d[k] = "inf"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunInfo":
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw["custom_keys"] = tuple(kw.get("custom_keys", ()))
        kw["errors"] = tuple(kw.get("errors", ()))
        for k in ("requested_rate", "achieved_rate"):
            if kw.get(k) == "inf":
                kw[k] = math.inf
        return cls(**kw)


class Sample(NamedTuple):
    """One decoded sample (see :meth:`Snapshots.samples`)."""

    index: int
    thread: int
    wall: float  # seconds since its run's start
    cpu: float  # the thread's CPU seconds
    stack: int
    marks: int  # index into mark_sets (0: none)


def _own(typecode: str, values: Any) -> array:
    """``values`` itself when it is already an ``array(typecode)``, else a new one."""
    if isinstance(values, array) and values.typecode == typecode:
        return values
    return array(typecode, values)


def _decoded(deltas: array, overflow: dict[int, int]) -> Sequence[int]:
    if not overflow:
        return deltas
    out = list(deltas)
    for i, v in overflow.items():
        out[i] = v
    return out


class Snapshots:
    """An immutable, mergeable record of sampled stacks.  See the module docstring."""

    __slots__ = (
        "frames", "stack_frame", "stack_parent", "threads", "sample_thread",
        "sample_stack", "sample_wall", "sample_cpu", "sample_marks", "wall_overflow",
        "cpu_overflow", "mark_sets", "custom_keys", "runs", "_stack_cache",
    )

    def __init__(
        self,
        *,
        frames: Sequence[Frame] = (),
        stack_frame: Sequence[int] = (0,),
        stack_parent: Sequence[int] = (0,),
        threads: Sequence[ThreadInfo] = (),
        sample_thread: Sequence[int] = (),
        sample_stack: Sequence[int] = (),
        sample_wall: Sequence[int] = (),
        sample_cpu: Sequence[int] = (),
        sample_marks: Optional[Sequence[int]] = None,
        wall_overflow: Optional[dict[int, int]] = None,
        cpu_overflow: Optional[dict[int, int]] = None,
        mark_sets: Sequence[tuple] = ((),),
        custom_keys: Sequence[Any] = (),
        runs: Sequence[RunInfo] = (),
    ) -> None:
        self._fill(array, frames, stack_frame, stack_parent, threads, sample_thread, sample_stack,
                   sample_wall, sample_cpu, sample_marks, wall_overflow, cpu_overflow, mark_sets,
                   custom_keys, runs)

    @classmethod
    def _adopt(cls, **kw: Any) -> "Snapshots":
        """A value that takes the ``array('I')`` columns it is given as its own, uncopied.

        For the file loader, whose freshly read columns nobody else holds: copying them
        would double the memory a big file costs.  Everything else is checked as usual.
        """
        self = cls.__new__(cls)
        names = ("frames", "stack_frame", "stack_parent", "threads", "sample_thread",
                 "sample_stack", "sample_wall", "sample_cpu", "sample_marks", "wall_overflow",
                 "cpu_overflow", "mark_sets", "custom_keys", "runs")
        defaults = {"stack_frame": array("I", [0]), "stack_parent": array("I", [0]),
                    "sample_marks": None, "mark_sets": ((),)}
        self._fill(_own, *(kw.get(n, defaults.get(n, ())) for n in names))
        return self

    def _fill(self, column: Any, frames: Any, stack_frame: Any, stack_parent: Any, threads: Any,
              sample_thread: Any, sample_stack: Any, sample_wall: Any, sample_cpu: Any,
              sample_marks: Any, wall_overflow: Any, cpu_overflow: Any, mark_sets: Any,
              custom_keys: Any, runs: Any) -> None:
        self.frames = tuple(Frame(*f) for f in frames)
        self.stack_frame = column("I", stack_frame)
        self.stack_parent = column("I", stack_parent)
        self.threads = tuple(ThreadInfo(*t) for t in threads)
        self.sample_thread = column("I", sample_thread)
        self.sample_stack = column("I", sample_stack)
        self.sample_wall = column("I", sample_wall)
        self.sample_cpu = column("I", sample_cpu)
        self.sample_marks = None if sample_marks is None else column("I", sample_marks)
        self.wall_overflow = dict(wall_overflow or {})
        self.cpu_overflow = dict(cpu_overflow or {})
        self.mark_sets = tuple(tuple(tuple(e) for e in ms) for ms in mark_sets)
        self.custom_keys = tuple(custom_keys)
        self.runs = tuple(runs)
        self._stack_cache: dict[int, tuple[int, ...]] = {}
        self.validate()

    # -- checking --------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`SnapshotError` unless every id points where it should.

        Run on construction, so a value built from a hostile file cannot make the
        analyzer index out of range or loop forever.
        """
        n_frames, n_stacks = len(self.frames), len(self.stack_frame)
        n = len(self.sample_thread)
        if n_stacks < 1 or len(self.stack_parent) != n_stacks:
            raise SnapshotError("stack arrays must have the same length, at least 1")
        for i in range(1, n_stacks):
            if self.stack_parent[i] >= i:
                raise SnapshotError(f"stack {i} has parent {self.stack_parent[i]}, not an earlier stack")
            if self.stack_frame[i] >= n_frames:
                raise SnapshotError(f"stack {i} names frame {self.stack_frame[i]}, but there are {n_frames}")
        cols = (self.sample_stack, self.sample_wall, self.sample_cpu)
        if any(len(c) != n for c in cols) or (
            self.sample_marks is not None and len(self.sample_marks) != n
        ):
            raise SnapshotError("sample columns differ in length")
        if n and max(self.sample_stack) >= n_stacks:
            raise SnapshotError("a sample names a stack that does not exist")
        if n and max(self.sample_thread) >= len(self.threads):
            raise SnapshotError("a sample names a thread that does not exist")
        if self.sample_marks is not None and n and max(self.sample_marks) >= len(self.mark_sets):
            raise SnapshotError("a sample names a mark set that does not exist")
        for i, t in enumerate(self.threads):
            if t.id != i:
                raise SnapshotError(f"thread {i} carries id {t.id}")
            if not 0 <= t.run < max(len(self.runs), 1):
                raise SnapshotError(f"thread {i} names run {t.run}, which does not exist")
        for name, ov, col in (("wall", self.wall_overflow, self.sample_wall),
                              ("cpu", self.cpu_overflow, self.sample_cpu)):
            for i, v in ov.items():
                if not (isinstance(i, int) and 0 <= i < n and col[i] == OVERFLOW
                        and isinstance(v, int) and v >= 0):
                    raise SnapshotError(f"bad {name} overflow entry at sample {i!r}")
        if not self.mark_sets or self.mark_sets[0] != ():
            raise SnapshotError("mark set 0 must be the empty set")
        n_keys = len(self.custom_keys)
        for k, ms in enumerate(self.mark_sets):
            for entry in ms:
                # one value per custom key: code that looks a key's value up by position
                # (filtering/splitting by a mark) must not index past the entry
                if len(entry) != n_keys:
                    raise SnapshotError(f"mark set {k} has an entry of {len(entry)} values, "
                                        f"but there are {n_keys} custom keys")

    # -- reading ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sample_thread)

    @property
    def sample_count(self) -> int:
        return len(self.sample_thread)

    def stack(self, stack_id: int) -> tuple[int, ...]:
        """Frame ids of a stack, innermost first (cached)."""
        cached = self._stack_cache.get(stack_id)
        if cached is not None:
            return cached
        out = []
        s = stack_id
        parent, frame = self.stack_parent, self.stack_frame
        while s:
            known = self._stack_cache.get(s)
            if known is not None:
                out.extend(known)
                break
            out.append(frame[s])
            s = parent[s]
        result = tuple(out)
        self._stack_cache[stack_id] = result
        return result

    def stack_frames(self, stack_id: int) -> tuple[Frame, ...]:
        """The :class:`Frame` values of a stack, innermost first."""
        frames = self.frames
        return tuple(frames[f] for f in self.stack(stack_id))

    def wall_deltas(self) -> Sequence[int]:
        """Per-sample wall microseconds since the same thread's previous sample."""
        return _decoded(self.sample_wall, self.wall_overflow)

    def cpu_deltas(self) -> Sequence[int]:
        """Per-sample CPU microseconds since the same thread's previous sample."""
        return _decoded(self.sample_cpu, self.cpu_overflow)

    def samples(self) -> Iterator[Sample]:
        """Every sample, oldest first, with absolute times decoded."""
        wall_d, cpu_d = self.wall_deltas(), self.cpu_deltas()
        marks = self.sample_marks
        wall_us: dict[int, int] = {}
        cpu_us: dict[int, int] = {}
        threads = self.threads
        for i, (tid, sid) in enumerate(zip(self.sample_thread, self.sample_stack)):
            w = wall_us[tid] = wall_us.get(tid, 0) + wall_d[i]
            c = cpu_us[tid] = cpu_us.get(tid, 0) + cpu_d[i]
            t = threads[tid]
            yield Sample(i, tid, t.first_wall + w / 1e6, t.first_cpu + c / 1e6, sid,
                         0 if marks is None else marks[i])

    def marks_of(self, index: int) -> tuple:
        """The mark set of sample ``index`` (innermost extent first)."""
        if self.sample_marks is None:
            return ()
        return self.mark_sets[self.sample_marks[index]]

    @property
    def cpu_time(self) -> float:
        """Process CPU seconds while sampling was not paused, summed over runs."""
        return sum(r.process_cpu for r in self.runs)

    # -- identity --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain-data form (lists, dicts, numbers, strings) of the whole value."""
        return {
            "version": FORMAT_VERSION,
            "frames": [list(f) for f in self.frames],
            "stack_frame": list(self.stack_frame),
            "stack_parent": list(self.stack_parent),
            "threads": [list(t) for t in self.threads],
            "sample_thread": list(self.sample_thread),
            "sample_stack": list(self.sample_stack),
            "sample_wall": list(self.sample_wall),
            "sample_cpu": list(self.sample_cpu),
            "sample_marks": None if self.sample_marks is None else list(self.sample_marks),
            "wall_overflow": {str(k): v for k, v in self.wall_overflow.items()},
            "cpu_overflow": {str(k): v for k, v in self.cpu_overflow.items()},
            "mark_sets": [[list(e) for e in ms] for ms in self.mark_sets],
            "custom_keys": list(self.custom_keys),
            "runs": [r.to_dict() for r in self.runs],
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshots):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"<Snapshots v{FORMAT_VERSION}: {len(self)} samples, {len(self.threads)} threads, "
                f"{len(self.stack_frame) - 1} stacks, {len(self.frames)} frames, {len(self.runs)} run(s)>")

    # -- files -----------------------------------------------------------------
    def save(self, path: Any) -> None:
        """Write to ``path`` in the safe binary format of :mod:`sampler.snapshot_file`."""
        from .snapshot_file import save

        save(self, path)

    @classmethod
    def load(cls, path: Any, *, limit: Optional[int] = None) -> "Snapshots":
        """Read a file written by :meth:`save`; a bad file raises :class:`SnapshotError`,
        and so does one that would take more than ``limit`` bytes of memory (default:
        :func:`sampler.snapshot_file.load_limit`)."""
        from .snapshot_file import load

        return load(path, limit=limit)


class StackTrie:
    """The frames and the stack trie of a :class:`Snapshots` value being built.

    Everything that makes or rewrites a value (:func:`merge`, the sampler's trimming
    of its own frames, hand-built values in tests and benchmarks) interns frames and
    stacks the same way -- stack ``0`` empty, each new ``(parent, frame)`` pair a new
    stack after its parent -- so the same samples make the same value whichever code
    built it.  This is that one way; pass ``frames``, ``stack_frame`` and
    ``stack_parent`` to :class:`Snapshots`.
    """

    __slots__ = ("frames", "stack_frame", "stack_parent", "_frame_ids", "_stack_ids")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.stack_frame = array("I", [0])
        self.stack_parent = array("I", [0])
        self._frame_ids: dict[Any, int] = {}
        self._stack_ids: dict[tuple[int, int], int] = {}

    def frame_id(self, frame: Frame, key: Any = None) -> int:
        """The id of ``frame``, added to :attr:`frames` the first time it is seen.

        Frames are told apart by ``key``, the frame itself by default; a caller
        rewriting a value passes the old frame id, so that frames equal by value but
        stored twice stay two frames.
        """
        if key is None:
            key = frame
        fid = self._frame_ids.get(key)
        if fid is None:
            fid = self._frame_ids[key] = len(self.frames)
            self.frames.append(frame)
        return fid

    def stack_id(self, parent: int, frame_id: int) -> int:
        """The id of the stack that is ``frame_id`` called from stack ``parent``."""
        key = (parent, frame_id)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self.stack_frame)
            self.stack_frame.append(frame_id)
            self.stack_parent.append(parent)
        return sid

    def path_id(self, frame_ids: Iterable[int]) -> int:
        """The id of the stack of ``frame_ids``, outermost first (``0`` when empty)."""
        sid = 0
        for fid in frame_ids:
            sid = self.stack_id(sid, fid)
        return sid


class SnapshotError(ValueError):
    """A snapshot value or file is malformed (corrupt, truncated, hostile or too new)."""


def merge(*parts: Snapshots) -> Snapshots:
    """Combine several runs (from other processes or machines too) into one value.

    Frames are deduplicated by value, stacks re-interned, each run keeps its own
    threads, and the samples of each part follow those of the part before.
    """
    if len(parts) == 1 and isinstance(parts[0], (list, tuple)):
        parts = tuple(parts[0])
    for p in parts:
        if not isinstance(p, Snapshots):
            raise TypeError(f"merge() takes Snapshots values, not {type(p).__name__}")
    trie = StackTrie()
    mark_ids: dict[tuple, int] = {(): 0}
    mark_sets: list[tuple] = [()]
    keys: list[Any] = []
    for p in parts:
        for k in p.custom_keys:
            if k not in keys:
                keys.append(k)
    threads: list[ThreadInfo] = []
    runs: list[RunInfo] = []
    cols = {name: array("I") for name in ("thread", "stack", "wall", "cpu", "marks")}
    wall_ov: dict[int, int] = {}
    cpu_ov: dict[int, int] = {}
    any_marks = any(p.sample_marks is not None for p in parts)
    for p in parts:
        fmap = [trie.frame_id(f) for f in p.frames]
        smap = array("I", [0]) * len(p.stack_frame)
        for i in range(1, len(p.stack_frame)):
            smap[i] = trie.stack_id(smap[p.stack_parent[i]], fmap[p.stack_frame[i]])
        key_pos = [keys.index(k) for k in p.custom_keys]
        mmap = []
        for ms in p.mark_sets:
            remapped = []
            for entry in ms:
                vals = [None] * len(keys)
                for pos, v in zip(key_pos, entry):
                    vals[pos] = v
                remapped.append(tuple(vals))
            t = tuple(remapped)
            if t not in mark_ids:
                mark_ids[t] = len(mark_sets)
                mark_sets.append(t)
            mmap.append(mark_ids[t])
        run_base, thread_base, sample_base = len(runs), len(threads), len(cols["thread"])
        runs.extend(p.runs or (RunInfo(),))
        for t in p.threads:
            threads.append(t._replace(id=t.id + thread_base, run=t.run + run_base))
        cols["thread"].extend(t + thread_base for t in p.sample_thread)
        cols["stack"].extend(smap[s] for s in p.sample_stack)
        cols["wall"].extend(p.sample_wall)
        cols["cpu"].extend(p.sample_cpu)
        if any_marks:
            if p.sample_marks is None:
                cols["marks"].extend(itertools.repeat(0, len(p)))
            else:
                cols["marks"].extend(mmap[m] for m in p.sample_marks)
        wall_ov.update((i + sample_base, v) for i, v in p.wall_overflow.items())
        cpu_ov.update((i + sample_base, v) for i, v in p.cpu_overflow.items())
    return Snapshots(
        frames=trie.frames, stack_frame=trie.stack_frame, stack_parent=trie.stack_parent,
        threads=threads, sample_thread=cols["thread"], sample_stack=cols["stack"],
        sample_wall=cols["wall"], sample_cpu=cols["cpu"],
        sample_marks=cols["marks"] if any_marks else None,
        wall_overflow=wall_ov, cpu_overflow=cpu_ov, mark_sets=mark_sets, custom_keys=keys,
        runs=runs,
    )
