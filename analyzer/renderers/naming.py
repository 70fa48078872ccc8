"""How the renderers name things for people: short sources, names that tell entries
apart, and a hiding rule that also drops chains of negligible entries.

* A source is shown relative to the ``sys.path`` entry (or the standard library or
  site-packages directory) it was imported from -- ``json/encoder.py:432`` rather
  than ``/usr/lib/python3.11/json/encoder.py:432`` -- since that is the name a
  Python programmer knows a module by.  When it must still be shortened, whole
  leading directories go, never part of a word.
* Two entries with the same name are told apart by their file (``<module>
  (app.py)``); at line granularity each entry is a line (``main:12``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any, Iterable, Optional

from ..model import Node, Profile


def _roots() -> list[str]:
    """Directories sources are shown relative to, longest first."""
    found = set()
    for entry in [*sys.path, *sysconfig.get_paths().values(), os.getcwd()]:
        if entry and os.path.isabs(entry) and os.path.isdir(entry):
            found.add(os.path.normpath(entry))
    return sorted(found, key=len, reverse=True)


def _package_root(filename: str) -> Optional[str]:
    """The directory above the outermost package holding ``filename`` (the sys.path
    entry it is imported from, however that entry was made: an editable install's
    finder adds none), or ``None`` when the file is no package's or is not here."""
    folder = os.path.dirname(filename)
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        return None
    while os.path.isfile(os.path.join(os.path.dirname(folder), "__init__.py")):
        folder = os.path.dirname(folder)
    return os.path.dirname(folder)


def short_path(filename: str, roots: Optional[list[str]] = None) -> str:
    """``filename`` relative to the directory it is imported from: the one above its
    outermost package, else the longest root that holds it (unchanged if none does)."""
    if not os.path.isabs(filename):
        return filename
    package_root = _package_root(filename)
    if package_root:
        return os.path.relpath(filename, package_root)
    for root in _roots() if roots is None else roots:
        prefix = root.rstrip(os.sep) + os.sep
        if filename.startswith(prefix) and len(filename) > len(prefix):
            return filename[len(prefix):]
    return filename


def format_source(src: Any, limit: Optional[int]) -> str:
    """``src`` (``file:line``) as a reader wants it: relative to its ``sys.path`` entry,
    and within ``limit`` characters by dropping whole leading directories (``.../``);
    a last component longer than the limit is kept whole rather than cut mid-word."""
    if src is None:
        return "(unknown source)"
    text = str(src)
    path, sep, line = text.rpartition(":")
    if not sep or not line.isdigit():
        path, line = text, ""
    where = short_path(path) + (f":{line}" if line else "")
    if limit is None or len(where) <= limit:
        return where
    parts = where.split(os.sep)
    for k in range(1, len(parts)):
        shorter = "..." + os.sep + os.sep.join(parts[k:])
        if len(shorter) <= limit:
            return shorter
    return parts[-1]


def display_names(profile: Profile, nodes: Iterable[Node]) -> dict[Node, str]:
    """A name for each node that tells it apart from the others shown.

    At line granularity the line is part of the name (``main:12``).  Names still
    shared by several nodes get their file (``<module> (app.py)``), then, if that is
    not enough, the function's first line (``f (a.py:3)``).
    """
    nodes = list(nodes)
    base = {}
    for n in nodes:
        name = n.name
        if profile.granularity == "line" and n.lineno is not None:
            name = f"{name}:{n.lineno}"
        base[n] = name
    out = dict(base)
    clash: dict[str, list[Node]] = {}
    for n, name in base.items():
        clash.setdefault(name, []).append(n)
    for name, same in clash.items():
        if len(same) < 2:
            continue
        files = [os.path.basename(n.filename or "") for n in same]
        tell = files if len(set(files)) == len(files) else [
            f"{f}:{n.firstlineno}" for f, n in zip(files, same)]
        for n, where in zip(same, tell):
            out[n] = f"{name} ({where})" if where else name
    return out


def hidden_chains(profile: Profile, hide_self: float, hide_subs: float) -> set[Node]:
    """Racket's hiding rule, extended to chains of negligible entries.

    Racket hides a node when its self time is negligible (``hide_self``) and it is
    negligible (``hide_subs``) in each of its callers' and callees' listings.  A chain
    of small functions (``Thread.start`` → ``Event.wait`` → ``Condition.wait``) then
    keeps itself alive: each is all of its neighbour's time.  Here a node is hidden
    when its self time is negligible and no shown entry lists it with more than
    ``hide_subs`` of that entry's time: the largest such set, found by starting from
    every node of negligible self time and bringing back into view each one a shown
    entry lists with a share that matters, until none is left.  So a row never names a hidden entry unless
    that row is negligible, as in Racket, and a chain that leads to no real work goes.
    """
    if hide_self <= 0 and hide_subs <= 0:
        return set()
    total = profile.total_time
    if not total:
        return set(profile.nodes)
    hidden = {n for n in profile.nodes if n.self / total <= hide_self}

    def listed(n: Node) -> list[Node]:
        """The neighbours ``n``'s own block lists with more than ``hide_subs`` of its
        time: if ``n`` is shown, those rows must name shown entries."""
        whole = hide_subs * n.total
        return ([e.callee for e in n.callees if not e.callee.is_root and e.callee_time > whole]
                + [e.caller for e in n.callers if not e.caller.is_root and e.caller_time > whole])

    shown = [n for n in profile.nodes if n not in hidden]
    while shown:
        for m in listed(shown.pop()):
            if m in hidden:
                hidden.discard(m)
                shown.append(m)
    return hidden


def emit(text: str, file: Any) -> str:
    """Write a renderer's ``text`` to ``file`` -- an open text stream, or a path (``str``
    or ``os.PathLike``), written as UTF-8 -- when one is given; return the text."""
    if file is None:
        return text
    if isinstance(file, (str, os.PathLike)):
        with open(file, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        file.write(text)
    return text
