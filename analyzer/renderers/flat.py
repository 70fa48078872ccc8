"""The flat renderer: MLton ``mlprof``'s table, one row per function, by self time.

Racket's graph says who called whom; the flat table answers the first question a
profile is opened for -- where does the time go -- in as many lines as there are
functions worth reading::

    Flat profile: 157ms of cpu time observed in 273 samples, 7 functions

    function                                  self          total
    -------------------------------  -------------  -------------
    is_prime                          153ms  97.5%   153ms  97.5%
    twin_primes.<locals>.<listcomp>   2.6ms   1.7%  79.0ms  50.5%
    main                              0.0ms   0.0%   157ms 100.0%

Rows are sorted by self time (ties by total, then name).  ``show_line`` adds each
function's ``file:line``, as ``mlprof -show-line`` does.
"""

from __future__ import annotations

from typing import IO, Optional

from ..model import Profile
from .naming import display_names
from .common import (
    check_fraction, check_truncate_source, format_amount, format_percent, format_source, observed_amount,
    printable,
)


def render_flat(
    profile: Profile,
    file: Optional[IO[str]] = None,
    *,
    show_line: bool = False,
    truncate_source: Optional[int] = 50,
    hide_self: float = 0.0,
) -> str:
    """The flat table of ``profile``; returned, and also written to ``file`` if given.

    ``hide_self`` (a fraction, 0.01 is 1%) leaves out functions whose self time is at
    most that share of the total; the header says how many were left out.
    ``truncate_source`` keeps the end of long locations (``None`` keeps them whole).
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"render_flat() takes a Profile, not {type(profile).__name__}")
    hide_self = check_fraction("hide_self", hide_self)
    check_truncate_source(truncate_source)
    total = profile.total_time
    rows = sorted(profile.nodes, key=lambda n: (-n.self, -n.total, n.name))
    shown = [n for n in rows if not (hide_self and total and n.self / total <= hide_self)]

    lines = [f"Flat profile: {observed_amount(profile, total)} "
             f"in {profile.sample_number} samples, {len(profile.nodes)} functions"]
    if len(shown) < len(rows):
        lines.append(f"  ({len(rows) - len(shown)} with self <= {hide_self * 100:.1f}% not shown)")
    if not shown:
        lines.append("  (no samples)" if not rows else "  (every function is below the threshold)")
        text = "\n".join(lines) + "\n"
        if file is not None:
            file.write(text)
        return text

    def cell(t: float) -> str:
        return f"{format_amount(profile, t)} {format_percent(t, total):>6}"

    names = display_names(profile, shown)
    table = [(printable(names[n]), cell(n.self), cell(n.total),
              format_source(n.src, truncate_source) if show_line else "") for n in shown]
    name_w = max(len("function"), *(len(r[0]) for r in table))
    self_w = max(len("self"), *(len(r[1]) for r in table))
    total_w = max(len("total"), *(len(r[2]) for r in table))
    head = f"{'function':<{name_w}}  {'self':>{self_w}}  {'total':>{total_w}}"
    rule = f"{'-' * name_w}  {'-' * self_w}  {'-' * total_w}"
    if show_line:
        head += "  location"
        rule += "  " + "-" * max(len("location"), *(len(r[3]) for r in table))
    lines += ["", head, rule]
    for name, self_cell, total_cell, where in table:
        row = f"{name:<{name_w}}  {self_cell:>{self_w}}  {total_cell:>{total_w}}"
        lines.append(f"{row}  {where}" if show_line else row)
    text = "\n".join(lines) + "\n"
    if file is not None:
        file.write(text)
    return text
