"""Collapsed stacks: one line per distinct stack, ``outer;middle;inner VALUE``.

The input of Brendan Gregg's ``flamegraph.pl``, of inferno, and what py-spy writes
with ``--format raw``.  The value is an integer, as those tools expect: by default
microseconds of weighted time (``value='cpu'`` or ``'wall'``), or the number of
samples (``value='samples'``).  For allocation samples (``sampler.memprof``) the
weights are whole bytes instead: ``value='cpu'`` bytes allocated, ``'wall'`` bytes still
live (a microsecond slot holds a byte, so the numbers need no conversion).  A frame
reads ``name (file:firstline)``.

The format has no escaping, so characters that would split a line or a stack are
replaced: ``;`` by ``:``, line breaks and tabs by spaces.  Stacks are written in a
stable order (sorted), so two exports of one profile compare equal.
"""

from __future__ import annotations

from pathlib import Path

from sampler.snapshot import Snapshots

from ._common import PathLike, check_snapshots, weighted_rows, write_output

VALUES = ("cpu", "wall", "samples")
_UNSAFE = str.maketrans({";": ":", "\n": " ", "\r": " ", "\t": " "})


def frame_label(name: str, filename: str, firstlineno: int) -> str:
    """How one function reads in a collapsed line (separators replaced)."""
    label = f"{name} ({filename}:{firstlineno})" if filename else name
    return label.translate(_UNSAFE)


def to_collapsed(snapshots: Snapshots, *, value: str = "cpu", threads: bool = False) -> str:
    """The collapsed-stack text of ``snapshots``.

    ``threads=True`` adds each thread as the outermost frame (``thread NAME (id)``), like
    py-spy's ``--threads``, so a flame graph splits by thread first.
    """
    check_snapshots(snapshots)
    if value not in VALUES:
        raise ValueError(f"value must be one of {', '.join(map(repr, VALUES))}, not {value!r}")
    column = VALUES.index(value) + 1 if value != "samples" else 0
    totals = weighted_rows(snapshots, (value,) if value != "samples" else ())
    stacks = totals.stacks
    labels = [frame_label(*f) for f in stacks.functions]
    sums: dict[str, float] = {}
    for (tid, node, _marks), row in totals.rows.items():
        parts = [labels[f] for f in stacks.path(node)]
        if threads:
            info = snapshots.threads[tid]
            parts.insert(0, f"thread {info.name} ({tid})".translate(_UNSAFE))
        line = ";".join(parts)
        sums[line] = sums.get(line, 0) + row[column]
    lines = []
    for line in sorted(sums):
        n = round(sums[line]) if value == "samples" else round(sums[line] * 1e6)
        if n > 0:
            lines.append(f"{line} {n}\n")
    return "".join(lines)


def write_collapsed(snapshots: Snapshots, path: PathLike, *, value: str = "cpu",
                    threads: bool = False) -> Path:
    """Write :func:`to_collapsed` to ``path``."""
    return write_output(path, to_collapsed(snapshots, value=value, threads=threads))
