"""The Graphviz renderer: the call graph as a ``digraph`` for ``dot``.

One box per visible node, labelled with its name, source, total and self time; its
fill is saturated in proportion to its self time (relative to the heaviest self
time shown), so hot spots stand out at a glance, as in Racket's graphviz renderer.
One arrow per call between visible nodes, labelled with the time the caller spent
in that callee and drawn thicker for heavier calls.  Hiding follows the text
renderer's rule, so both show the same nodes.
"""

from __future__ import annotations

import re
from typing import IO, Optional

from ..model import Profile
from .naming import hidden_chains
from .common import (
    check_fraction, check_truncate_source, format_amount, format_percent, format_source,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1 controls: shown as spaces
_MAX_LINE = 2000
"""Longest name or source line of a box.  Graphviz refuses a file with a string over
16 KB ("syntax error ... string too long"); a longer name is cut visibly (kept: its
start and end, and how many characters were left out)."""


def render_dot(
    profile: Profile,
    file: Optional[IO[str]] = None,
    *,
    hide_self: float = 0.01,
    hide_subs: float = 0.02,
    truncate_source: Optional[int] = 50,
    title: str = "Profile",
) -> str:
    """The Graphviz source of ``profile``; returned, and also written to ``file`` if given.

    Render it with ``dot -Tsvg profile.dot -o profile.svg``.  ``hide_self`` and
    ``hide_subs`` are the text renderer's thresholds (fractions), ``truncate_source``
    limits the source shown in each box.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"render_dot() takes a Profile, not {type(profile).__name__}")
    hide_self = check_fraction("hide_self", hide_self)
    hide_subs = check_fraction("hide_subs", hide_subs)
    check_truncate_source(truncate_source)
    hidden = hidden_chains(profile, hide_self, hide_subs)
    shown = [n for n in profile.nodes if n not in hidden]
    ids = {n: f"n{i}" for i, n in enumerate(shown, 1)}
    total = profile.total_time
    max_self = max((n.self for n in shown), default=0) or 1

    lines = [f"digraph {_quote(title)} {{",
             '  graph [fontname="Helvetica"];',
             '  node [shape=box, style=filled, fontname="Helvetica", fontsize=11];',
             '  edge [fontname="Helvetica", fontsize=9];']
    if not shown:
        why = "no samples" if not profile.nodes else "every node is hidden"
        lines.append(f'  empty [label={_quote(why)}, style=dashed];')
    for n in shown:
        label = "\n".join((
            _clip(n.name),
            _clip(format_source(n.src, truncate_source)),
            f"total {format_amount(profile, n.total)} ({format_percent(n.total, total)})",
            f"self {format_amount(profile, n.self)} ({format_percent(n.self, total)})",
        ))
        saturation = max(0.0, min(1.0, n.self / max_self))
        lines.append(f"  {ids[n]} [label={_quote(label)}, "
                     f'fillcolor="0.000 {saturation:.3f} 1.000"];')
    for n in shown:
        for e in n.callees:
            callee = e.callee
            if callee not in ids:
                continue
            width = 1 + 4 * (e.total / total if total else 0)
            lines.append(f"  {ids[n]} -> {ids[callee]} "
                         f"[label={_quote(format_amount(profile, e.callee_time))}, "
                         f"penwidth={width:.2f}];")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    if file is not None:
        file.write(text)
    return text


def _clip(text: str) -> str:
    """``text``, or its start and end around a note of how much was cut (:data:`_MAX_LINE`)."""
    if len(text) <= _MAX_LINE:
        return text
    keep = _MAX_LINE // 2 - 20
    return f"{text[:keep]} ... ({len(text) - 2 * keep} characters cut) ... {text[-keep:]}"


def _quote(text: str) -> str:
    """A Graphviz quoted string whose label shows ``text`` literally (lines kept)."""
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r\n", "\n")
    parts = text.split("\n")
    return '"' + "\\n".join(_CONTROL.sub(" ", p) for p in parts) + '"'
