"""Exports: stackshot snapshots in the formats other people's tools read.

One registry, :data:`FORMATS`, maps a format name to its exporter, so the command
lines (``python -m sampler --format …``, ``python -m analyzer --format …``) and the
library find formats in one place and list the same ones.

>>> from analyzer.exports import export
>>> export(snapshots, "speedscope", "run.speedscope.json")   # doctest: +SKIP

Every exporter takes a :class:`sampler.snapshot.Snapshots` value and keyword options,
and has two forms: ``to_X(snapshots, **options)`` returns the file's content (``str``
or ``bytes``), ``write_X(snapshots, path, **options)`` writes it and returns the path.
A path that cannot be written raises :class:`ExportError`, naming the path and the
operating system's reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

from sampler.snapshot import Snapshots

from ._common import ExportError, PathLike, sample_weights
from .collapsed import to_collapsed, write_collapsed
from .flamegraph import to_html, write_html
from .pprof import to_pprof, write_pprof
from .pstats_export import to_pstats, write_pstats
from .speedscope import to_speedscope, write_speedscope


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its name, what it produces, and its two functions."""

    name: str
    extension: str  # the conventional file name ending, with its dot
    binary: bool  # True when ``render`` returns bytes
    description: str  # one line, and how to open the file
    render: Callable[..., Union[str, bytes]]
    write: Callable[..., Path]


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("speedscope", ".speedscope.json", False,
                     "speedscope JSON, one profile per thread: speedscope FILE",
                     to_speedscope, write_speedscope),
        ExportFormat("collapsed", ".collapsed.txt", False,
                     "collapsed stacks (a;b;c N): flamegraph.pl FILE > flame.svg",
                     to_collapsed, write_collapsed),
        ExportFormat("pstats", ".pstats", True,
                     "cProfile's marshal format: python -m pstats FILE, snakeviz FILE",
                     to_pstats, write_pstats),
        ExportFormat("pprof", ".pb.gz", True,
                     "gzipped pprof profile.proto: go tool pprof -http=: FILE",
                     to_pprof, write_pprof),
        ExportFormat("html", ".html", False,
                     "self-contained flame graph page: open FILE in a browser",
                     to_html, write_html),
    )
}


def get_format(name: str) -> ExportFormat:
    """The format called ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(f"unknown export format {name!r}; known formats: {known}") from None


def render(snapshots: Snapshots, format: str, **options: Any) -> Union[str, bytes]:
    """The content of ``snapshots`` exported as ``format``."""
    return get_format(format).render(snapshots, **options)


def export(snapshots: Snapshots, format: str, path: PathLike, **options: Any) -> Path:
    """Write ``snapshots`` to ``path`` as ``format``; returns the path written."""
    return get_format(format).write(snapshots, path, **options)


__all__ = [
    "FORMATS", "ExportFormat", "ExportError", "get_format", "render", "export", "sample_weights",
    "to_speedscope", "write_speedscope", "to_collapsed", "write_collapsed",
    "to_pstats", "write_pstats", "to_pprof", "write_pprof", "to_html", "write_html",
]
