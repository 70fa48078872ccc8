"""What the renderers share: names, sources, percentages and Racket's hiding rule."""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from ..model import UNITS, Node, Profile

ORDERS = ("topological", "self", "total")


def check_fraction(name: str, value: Any) -> float:
    """A threshold such as ``hide_self``: a fraction of the total time, 0 to 1."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a fraction between 0 and 1 (0.01 is 1%), not {value!r}")
    return float(value)


def check_truncate_source(value: Any) -> Optional[int]:
    """``truncate_source`` is a whole number of characters (at least 4) or ``None``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 4):
        raise ValueError(f"truncate_source must be an integer of at least 4, or None, "
                         f"not {value!r}")
    return value


def check_choice(name: str, value: Any, valid: Iterable[str]) -> str:
    """``value`` if it is one of ``valid``; else a ``ValueError`` listing them."""
    choices = tuple(valid)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")
    return str(value)


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0 and C1 controls (ESC, BEL, CR, ...), line and paragraph separators, the bidi
overrides that reorder what a terminal shows, and lone surrogates (which no output
encoding can hold)."""


def printable(text: Any) -> str:
    """``text`` with every character that could act on a terminal shown as an escape.

    Function, file and thread names come from the profiled program -- or from a file
    someone sent: written raw, ``ESC ]0;...`` retitles the terminal and ``ESC [2J``
    clears it.  Each such character becomes ``\\xNN`` or ``\\uNNNN``, so the name
    is still recognisable and nothing reaches the terminal but text.
    """
    return _UNPRINTABLE.sub(_escape, str(text))


def _escape(m: "re.Match[str]") -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def format_source(src: Any, limit: Optional[int]) -> str:
    """``src`` as text: relative to its ``sys.path`` entry, shortened by whole leading
    directories when longer than ``limit`` (see :mod:`.naming`); control characters
    are escaped (:func:`printable`)."""
    from .naming import format_source as short

    return printable(short(src, limit))


def format_percent(part: float, whole: float) -> str:
    """Racket's ``format-percent``: one decimal, and 0.0% when the whole is zero."""
    return f"{(part / whole if whole else 0.0) * 100:.1f}%"


def to_ms(profile: Profile, t: float) -> float:
    """A time of ``profile`` in milliseconds, whatever its unit."""
    return t * UNITS[profile.unit] * 1000.0


def format_ms(ms: float) -> str:
    """Milliseconds for people: whole above 100 ms, with a decimal below."""
    if abs(ms) >= 100:
        return f"{ms:,.0f}ms"
    return f"{ms:.1f}ms"


def format_amount(profile: Profile, t: float) -> str:
    """A number of ``profile`` for people, in its own quantity: ``12.5ms``, or
    ``4.56 MB`` for an allocation profile (whose numbers are bytes)."""
    if profile.quantity == "bytes":
        from ..memory import format_bytes

        return format_bytes(t)
    return format_ms(to_ms(profile, t))


def observed(profile: Profile) -> str:
    """What ``profile``'s numbers are, for a header: ``cpu time``, ``wall time``,
    ``bytes allocated`` or ``bytes live`` (at the end of the run)."""
    if profile.quantity == "bytes":
        from ..memory import view

        return f"bytes {view(profile.weight)}"
    return "wall time" if profile.weight == "wall" else "cpu time"


def observed_amount(profile: Profile, t: float) -> str:
    """``t`` and what it is, for a one-line summary: ``12.5ms of cpu time observed``,
    or ``4.56 MB allocated (estimated)`` for an allocation profile."""
    if profile.quantity == "bytes":
        from ..memory import view

        return f"{format_amount(profile, t)} {view(profile.weight)} (estimated)"
    return f"{format_amount(profile, t)} of {observed(profile)} observed"


def hidden_nodes(profile: Profile, hide_self: float, hide_subs: float) -> set[Node]:
    """Racket's ``get-hidden``: the nodes negligible in *every* listing.

    A node is hidden when its self time is at most ``hide_self`` of the total, and in
    every other node's caller and callee list it appears with a local share of at most
    ``hide_subs``.  A visible node's row for a hidden node is thus negligible too; the
    renderers drop such rows, so no row ever names a node that has no entry.
    """
    if hide_self <= 0 and hide_subs <= 0:
        return set()
    total = profile.total_time
    if not total:
        return set(profile.nodes)
    hidden = set()
    for n in profile.nodes:
        if n.self / total > hide_self:
            continue
        if any(e.caller_time > hide_subs * e.callee.total for e in n.callees if not e.callee.is_root):
            continue
        if any(e.callee_time > hide_subs * e.caller.total for e in n.callers if not e.caller.is_root):
            continue
        hidden.add(n)
    return hidden


def ordered_nodes(profile: Profile, order: str) -> list[Node]:
    """``profile.nodes`` in the requested order (``'topological'`` keeps the analyzer's)."""
    nodes = list(profile.nodes)
    if order == "self":
        nodes.sort(key=lambda n: -n.self)
    elif order == "total":
        nodes.sort(key=lambda n: -n.total)
    return nodes
