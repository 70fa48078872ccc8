"""What every exporter needs: weighted samples, function-level stacks, safe writing.

The exporters never re-derive how much time a sample stands for: they all take it
from :func:`sample_weights`, which is the analyzer's per-sample weighting with the
analyzer's default rule for snapshots (each interval charged to the sample that ends
it, ``interval='end'``), so an exported file and ``analyze_samples`` agree on every
number.

Exports work at two granularities.  Flame graphs, speedscope, collapsed stacks and
pstats show *functions* (``name, filename, firstlineno``): two lines of one function
are one box.  pprof keeps the line as a location inside its function.  The
:class:`FunctionStacks` table re-interns the snapshot's line-level stack trie into a
function-level one, once, in time linear in the number of stacks.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from sampler.outputfile import write_atomically
from sampler.snapshot import Snapshots

PathLike = Union[str, "os.PathLike[str]"]
FunctionKey = tuple  # (name, filename, firstlineno)

CLOCKS = ("cpu", "wall")


class ExportError(OSError):
    """An export could not be written; the message names the path and the OS reason.

    ``errno``, ``strerror`` and ``filename`` are those of the underlying OS error.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _check_clock(clock: str) -> str:
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(map(repr, CLOCKS))}, not {clock!r}")
    return clock


def sample_weights(snapshots: Snapshots, clock: str = "cpu", *,
                   interval: Optional[str] = None) -> Sequence[float]:
    """Seconds of ``clock`` time each sample stands for (0 for a thread seen once).

    The one place exporters get weights from, and it is the analyzer's own function
    (:func:`analyzer.weights.sample_weights`) with the analyzer's default,
    ``interval=None``: ``'end'`` for snapshots (each interval charged to the sample
    that ends it; a thread's first sample weighs 0).  So exports and
    ``analyze_samples`` never disagree, with the same ``interval`` or both defaulted.
    Idle samples (stack 0) get their weight too; the exporters charge them to nobody.
    """
    from analyzer.weights import sample_weights as analyzer_weights

    return analyzer_weights(snapshots, _check_clock(clock), interval=interval)


def is_memory(snapshots: Snapshots) -> bool:
    """Whether ``snapshots`` are allocation samples (``sampler.memprof``): their
    weights are then bytes / 10**6 (a microsecond slot holds a byte), the ``cpu``
    clock bytes allocated and ``wall`` bytes still live (:mod:`analyzer.memory`)."""
    from analyzer.memory import is_memory as runs_are_memory

    return runs_are_memory(snapshots.runs)


@dataclass
class FunctionStacks:
    """The snapshot's stacks re-interned at function granularity.

    ``functions[f]`` is a function key ``(name, filename, firstlineno)``;
    node ``0`` is the empty stack, node ``n > 0`` is function ``node_func[n]`` called
    from node ``node_parent[n] < n``.  ``of_stack[s]`` maps a snapshot stack id to
    its node.
    """

    functions: list[FunctionKey] = field(default_factory=list)
    node_func: array = field(default_factory=lambda: array("I", [0]))
    node_parent: array = field(default_factory=lambda: array("I", [0]))
    of_stack: array = field(default_factory=lambda: array("I", [0]))

    @classmethod
    def build(cls, snapshots: Snapshots) -> "FunctionStacks":
        out = cls()
        fids: dict[FunctionKey, int] = {}
        frame_fid = []
        for fr in snapshots.frames:
            key = fr.function_key
            fid = fids.get(key)
            if fid is None:
                fid = fids[key] = len(out.functions)
                out.functions.append(key)
            frame_fid.append(fid)
        nodes: dict[tuple[int, int], int] = {}
        of_stack = array("I", [0]) * len(snapshots.stack_frame)
        sf, sp = snapshots.stack_frame, snapshots.stack_parent
        for s in range(1, len(sf)):
            key2 = (of_stack[sp[s]], frame_fid[sf[s]])
            node = nodes.get(key2)
            if node is None:
                node = nodes[key2] = len(out.node_func)
                out.node_parent.append(key2[0])
                out.node_func.append(key2[1])
            of_stack[s] = node
        out.of_stack = of_stack
        return out

    def path(self, node: int) -> list[int]:
        """Function ids of a node, outermost first."""
        out = []
        while node:
            out.append(self.node_func[node])
            node = self.node_parent[node]
        out.reverse()
        return out


@dataclass
class Totals:
    """Samples summed by (thread, function-level stack, mark set): count, cpu s, wall s."""

    stacks: FunctionStacks
    rows: dict[tuple[int, int, int], list[float]]


def weighted_rows(snapshots: Snapshots, clocks: Sequence[str] = CLOCKS) -> Totals:
    """Aggregate every sample that has frames (stack 0 marks an idle thread).

    Only the ``clocks`` asked for are weighted (the others stay 0): weighting is the
    costly pass, and most formats show one clock.
    """
    stacks = FunctionStacks.build(snapshots)
    n = len(snapshots)
    cpu = sample_weights(snapshots, "cpu") if "cpu" in clocks else [0.0] * n
    wall = sample_weights(snapshots, "wall") if "wall" in clocks else [0.0] * n
    marks = snapshots.sample_marks if snapshots.sample_marks is not None else [0] * n
    of_stack = stacks.of_stack
    rows: dict[tuple[int, int, int], list[float]] = {}
    get = rows.get
    for tid, sid, m, c, w in zip(snapshots.sample_thread, snapshots.sample_stack, marks, cpu, wall):
        if not sid:
            continue
        key = (tid, of_stack[sid], m)
        row = get(key)
        if row is None:
            rows[key] = [1, c, w]
        else:
            row[0] += 1
            row[1] += c
            row[2] += w
    return Totals(stacks, rows)


def check_snapshots(value: Any) -> Snapshots:
    if not isinstance(value, Snapshots):
        raise TypeError(f"exports take a sampler Snapshots value, not {type(value).__name__}")
    return value


def write_output(path: PathLike, data: Union[str, bytes]) -> Path:
    """Write ``data`` to ``path`` atomically; an OS failure becomes an :class:`ExportError`.

    The error names the path and the operating system's reason, because "could not
    export" alone leaves the user guessing between a typo and a permission problem.
    """
    p = Path(os.fspath(path))
    try:  # through a temporary file: a failure never leaves a truncated export behind
        write_atomically(p, data)  # lone surrogates (undecodable file names) as \udcXX
    except OSError as e:
        err = ExportError(f"cannot write export to {str(p)!r}: {e.strerror or e}")
        err.errno, err.strerror, err.filename = e.errno, e.strerror, str(p)
        raise err from e
    return p
