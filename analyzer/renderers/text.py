"""The text renderer, in the layout of Racket's ``profile/render-text``.

A header (time observed "out of" the process CPU time, the number of samples and
how often they came, the threads, what was hidden), then one block per node::

                                         caller [3]            12.5%   <- callers,
                                         caller [1]            87.5%      heaviest last
     [2]  40.0(50.0%)  10.0(12.5%)  node src/file.py:12                <- the node
                                         callee [4]            75.0%   <- callees,
                                         callee [5]            25.0%      heaviest first

A caller row's Local% is the share of this node's time spent when called from that
caller; a callee row's, the share of this node's time spent in that callee.  Rows
for the ``*`` root (a thread's entry, a sample's innermost end) are not listed: the
root has no entry of its own.

A *pass-through* entry -- one caller, one callee that gets all but a negligible
share of its time, negligible self time (a wrapper: ``loads`` calling
``JSONDecoder.decode`` calling ``raw_decode``) -- gets no block of its own: its
block would only repeat its neighbours'.  The rows that lead through it name it
(``parse > loads > JSONDecoder.decode [7]``), so every function still appears.
"""

from __future__ import annotations

import os
from typing import IO, Any, Optional, Union

from ..gcview import gc_times
from ..model import Profile
from .naming import display_names, emit, hidden_chains
from .common import (
    ORDERS, check_choice, check_fraction, check_truncate_source, format_ms, format_percent, format_source,
    ordered_nodes, printable, to_ms, format_amount, observed,
)

_THREADS_LISTED = 8  # the header names this many threads, heaviest first
WIDTH = 100  # rows fit this many columns (a long name alone may push past it)


def render_text(
    profile: Profile,
    file: Union[None, str, "os.PathLike[str]", IO[str]] = None,
    *,
    order: str = "topological",
    truncate_source: Optional[int] = 50,
    hide_self: float = 0.01,
    hide_subs: float = 0.02,
) -> str:
    """Racket's text report of ``profile``; returned, and also written to ``file`` if
    given (an open text stream, or a path to write).

    ``order``: ``'topological'`` (callers before callees, as analysed), ``'self'`` or
    ``'total'`` (heaviest first).  ``truncate_source``: keep at most this many
    characters of a source location (its end), ``None`` for all.  ``hide_self`` /
    ``hide_subs``: fractions (0.01 is 1%); a node is hidden only when its self time is
    at most ``hide_self`` of the total *and* it is at most ``hide_subs`` of every
    caller's and callee's time, so what is left never refers to a hidden node.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"render_text() takes a Profile, not {type(profile).__name__}")
    check_choice("order", order, ORDERS)
    hide_self = check_fraction("hide_self", hide_self)
    hide_subs = check_fraction("hide_subs", hide_subs)
    check_truncate_source(truncate_source)
    return emit(_render(profile, order, truncate_source, hide_self, hide_subs), file)


def _render(profile: Profile, order: str, truncate: Optional[int], hide_self: float,
            hide_subs: float) -> str:
    out: list[str] = []
    hidden = hidden_chains(profile, hide_self, hide_subs)
    links = pass_through(profile, hide_self, hide_subs) - hidden
    shown = [n for n in ordered_nodes(profile, order) if n not in hidden and n not in links]
    out.extend(_header(profile, len(hidden), hide_self, hide_subs, len(links)))
    if not profile.sample_number and not profile.nodes:
        out.append("")
        out.append("  (no samples)")
        return "\n".join(out) + "\n"
    if not shown:
        out.append("")
        out.append("  (every function is hidden: lower hide_self / hide_subs to see them)")
        return "\n".join(out) + "\n"

    index = {n: i for i, n in enumerate(shown, 1)}
    names = display_names(profile, [*shown, *links])
    labels = {n: f"{printable(names[n])} [{i}]" for n, i in index.items()}  # hidden nodes, root: absent
    rows_of = _LinkRows(links, names, labels, WIDTH)
    total = profile.total_time
    ms, digits, unit_name = _table_unit(profile)

    def timing(t: float) -> str:
        return f"{t * ms:,.{digits}f}({format_percent(t, total)})"

    rows = [(f"[{index[n]}]", timing(n.total), timing(n.self)) for n in shown]
    idx_w = max(3, *(len(r[0]) for r in rows))
    tot_w = max(len("Total"), *(len(r[1]) for r in rows))
    self_w = max(len("Self"), *(len(r[2]) for r in rows))
    lead = 1 + idx_w + 1 + tot_w + 2 + self_w + 2  # where the name column starts
    sub_indent = " " * (lead + 2)
    # wide enough for every label up to the cap; a longer one pushes only its own
    # percentage right, still two spaces clear of it
    pct_w = 7  # "100.0%" and a space
    # (at least the header's width: huge times can leave no room within WIDTH)
    name_w = max(len("Name+src"), min(WIDTH - (lead + 2 + 2 + pct_w),
                                      max(len("Name+src"), *map(len, labels.values()),
                                          *rows_of.widths(shown))))
    rows_of.room = name_w
    width = max(lead + 2 + name_w + 2 + pct_w, 60)

    out.append("")
    out.append("=" * width)
    out.append(sub_indent + "Caller")
    out.append(f" {'Idx':<{idx_w}} {'Total':>{tot_w}}  {'Self':>{self_w}}  "
               f"{'Name+src':<{name_w + 4}}" + f"{'Local%':>{pct_w}}")
    unit = f"{unit_name}(pct)"
    out.append(f" {'':<{idx_w}} {unit:>{tot_w}}  {unit:>{self_w}}    Callee")
    out.append("=" * width)
    rule = "-" * width
    for k, (n, (idx, tot, slf)) in enumerate(zip(shown, rows)):
        if k:
            out.append(rule)
        whole = n.total or 1.0  # a node with no time has no time on any edge either
        for e in reversed(n.callers):  # heaviest last: right above the node
            label = rows_of.caller(e.caller)
            if label is not None:
                out.append(f"{sub_indent}{label:<{name_w}}  {e.caller_time / whole * 100:>6.1f}%")
        # the source gets what is left of the row (all of it with truncate_source=None)
        room = max(WIDTH - lead - len(names[n]) - 1, 4)
        limit = None if truncate is None else min(truncate, room)
        out.append(f" {idx:<{idx_w}} {tot:>{tot_w}}  {slf:>{self_w}}  "
                   f"{printable(names[n])} {format_source(n.src, limit)}")
        for e in n.callees:  # heaviest first: right below the node
            label = rows_of.callee(e.callee)
            if label is not None:
                out.append(f"{sub_indent}{label:<{name_w}}  {e.callee_time / whole * 100:>6.1f}%")
    out.append("=" * width)
    return "\n".join(out) + "\n"


def _header(profile: Profile, n_hidden: int, hide_self: float, hide_subs: float,
            n_links: int = 0) -> list[str]:
    total_ms = to_ms(profile, profile.total_time) if profile.quantity == "time" else 0.0
    cpu_ms = to_ms(profile, profile.cpu_time) if profile.quantity == "time" else 0.0
    lines = ["Profiling results", "-----------------"]
    if profile.quantity == "bytes":
        lines.extend(_bytes_header(profile))
    elif profile.weight == "wall":
        lines.append(f"  Total wall time observed: {format_ms(total_ms)} "
                     f"(out of {format_ms(cpu_ms)} process cpu time{gc_note(profile)})")
    else:
        lines.append(f"  Total cpu time observed: {format_ms(total_ms)} (out of {format_ms(cpu_ms)}"
                     f"{gc_note(profile)})")
    n = profile.sample_number
    if profile.quantity == "time":
        lines.append(f"  Number of samples taken: {n}{_period(profile, total_ms)}")
    engines = sorted({r.engine for r in profile.runs if getattr(r, "engine", "")})
    if engines:
        lines.append(f"  Engine: {printable(', '.join(engines))}")
    threads = profile.thread_times
    if len(threads) > 1:
        parts = []
        heaviest = sorted(threads.items(), key=lambda tv: -tv[1])
        for t, v in heaviest[:_THREADS_LISTED]:
            name = profile.thread_names.get(t)
            who = f"{printable(name)} ({printable(t)})" if name else printable(t)
            parts.append(f"{who} {format_amount(profile, v)}")
        if len(threads) > _THREADS_LISTED:
            parts.append(f"and {len(threads) - _THREADS_LISTED} more")
        lines.append(f"  Threads observed: {len(threads)}: " + ", ".join(parts))
    lines.extend(unseen_lines(profile))
    if n_hidden:
        lines.append(f"  (Hiding functions with self<={hide_self * 100:.1f}% and "
                     f"local<={hide_subs * 100:.1f}%: {n_hidden} of {len(profile.nodes)} hidden)")
    if n_links:
        lines.append(f"  ({n_links} pass-through {'call' if n_links == 1 else 'calls'} folded into "
                     "the rows through them, a > b [i]; hide-subs 0 shows them)")
    return lines


def pass_through(profile: Profile, hide_self: float, hide_subs: float) -> set:
    """The nodes whose block would only repeat their neighbours': one caller (not the
    root: a thread's entry keeps its block), one callee, and what the callee does not
    get of its time negligible: at most ``hide_subs`` of the node's time or at most
    ``hide_self`` of the total (the bound of a self time the report hides anyway; a
    wrapper's one stray self sample must not give it a block of its own in one run
    and not in the next), and self time at most ``hide_self`` of the total.  None
    with ``hide_subs`` 0, which shows every block."""
    if hide_subs <= 0 or not profile.total_time:
        return set()
    negligible_self = hide_self * profile.total_time
    out = set()
    for n in profile.nodes:
        callers = n.callers
        callees = [e for e in n.callees if not e.callee.is_root]
        if (len(callers) == 1 and not callers[0].caller.is_root and callers[0].caller is not n
                and len(callees) == 1 and callees[0].callee is not n
                and n.total - callees[0].callee_time <= max(hide_subs * n.total, negligible_self)
                and n.self <= negligible_self):
            out.add(n)
    return out


class _LinkRows:
    """The labels of caller and callee rows, through pass-through nodes: a row that
    leads to a link names the chain up to the next shown entry
    (``parse > loads > raw_decode [7]``), shortened in the middle to fit."""

    def __init__(self, links: set, names: dict, labels: dict, width: int) -> None:
        self.links, self.names, self.labels = links, names, labels
        self.room = width

    def _chain(self, node: Any, step: Any) -> tuple[list[str], Any]:
        names, seen = [], set()
        while node in self.links and node not in seen:
            seen.add(node)
            names.append(printable(self.names[node]))
            node = step(node)
        return names, node

    def callee(self, node: Any) -> Optional[str]:
        names, end = self._chain(node, lambda n: next(e.callee for e in n.callees if not e.callee.is_root))
        label = self.labels.get(end)
        return None if label is None else self._fit(names + [label])

    def caller(self, node: Any) -> Optional[str]:
        names, end = self._chain(node, lambda n: n.callers[0].caller)
        label = self.labels.get(end)
        return None if label is None else self._fit([label] + names[::-1])

    def _fit(self, parts: list[str]) -> str:
        text = " > ".join(parts)
        if len(text) <= self.room or len(parts) <= 2:
            return text
        for keep in range(len(parts) - 2, 0, -1):  # drop from the middle, keep both ends
            head, tail = parts[:(keep + 1) // 2], parts[len(parts) - keep // 2 - 1:]
            text = " > ".join(head + ["..."] + tail)
            if len(text) <= self.room:
                return text
        return " > ".join([parts[0], "...", parts[-1]])

    def widths(self, shown: list) -> list[int]:
        """How wide the rows through links of the shown entries would be, unshortened."""
        out = []
        for n in shown:
            out += [len(x) for x in (self.callee(e.callee) for e in n.callees) if x]
            out += [len(x) for x in (self.caller(e.caller) for e in n.callers) if x]
        return out


def _period(profile: Profile, total_ms: float) -> str:
    """" (once every …)": the sampling period achieved, and the one asked for, from the
    sampler runs; without them (Racket's raw shape, hand-built snapshots) the mean
    time a sample observed, which is what Racket prints."""
    runs = profile.runs
    ticks = sum(getattr(r, "ticks", 0) for r in runs)
    if ticks:
        achieved = 1000.0 * sum(r.sampling_wall for r in runs) / ticks
        asked = sorted({r.requested_delay for r in runs})
        wanted = ", ".join(format_ms(1000.0 * d) for d in asked)
        return f" (once every {format_ms(achieved)}; asked for {wanted})"
    n = profile.sample_number
    return f" (once every {format_ms(total_ms / n)})" if n else ""


def gc_note(profile: Profile) -> str:
    """MLton's separate GC time, for the header's first line when collections were
    filed: "; GC 63ms = gen0 11 + gen1 15 + gen2 37" (milliseconds)."""
    times = gc_times(profile)
    if not times:
        return ""
    ms = to_ms(profile, 1.0)
    gens = " + ".join(f"gen{g} {format_ms(t * ms)}" for g, t in sorted(times.items()) if g >= 0)
    return f"; GC {format_ms(sum(times.values()) * ms)}" + (f" = {gens}" if gens else "")


def unseen_lines(profile: Profile) -> list[str]:
    """What the samples could not see, from what the front end recorded in the runs:
    other threads' CPU time and child processes that ran unprofiled."""
    lines = []
    extra = [r.extra for r in profile.runs if isinstance(getattr(r, "extra", None), dict)]
    others = sum(int(e.get("other_threads", 0)) for e in extra)
    if others and profile.weight == "cpu" and profile.quantity == "time":
        collector = sum(getattr(r, "collector_cpu", 0.0) for r in profile.runs)
        unseen = to_ms(profile, profile.cpu_time - profile.total_time) - 1000.0 * collector
        if unseen > 0:
            threads = "thread" if others == 1 else "threads"
            lines.append(f"  {others} other {threads} used up to {format_ms(unseen)}, "
                         "not sampled: use --all-threads (threads=True in the API)")
    children = sum(int(e.get("child_processes", 0)) for e in extra)
    if children:
        procs = "process" if children == 1 else "processes"
        lines.append(f"  {children} child {procs} ran unprofiled")
    return lines


def _digits(total_ms: float) -> int:
    """Decimals for the whole table: whole milliseconds like Racket, unless that hides all."""
    if total_ms >= 100:
        return 0
    return 1 if total_ms >= 1 else 3



def _table_unit(profile: Profile) -> tuple[float, int, str]:
    """The table's numbers: (multiplier, decimals, unit name).  Milliseconds, as
    Racket's; for an allocation profile the byte unit its total reads best in."""
    if profile.quantity == "bytes":
        from ..memory import byte_unit

        size, name = byte_unit(profile.total_time)
        return 1.0 / size, 0 if size == 1.0 or profile.total_time >= 100 * size else 1, name
    return to_ms(profile, 1.0), _digits(to_ms(profile, profile.total_time)), "ms"


def _bytes_header(profile: Profile) -> list[str]:
    """The header of an allocation profile: bytes observed, out of the run's estimated
    allocation, and how the blocks were sampled."""
    from ..memory import sampling_rates

    rates = ", ".join(f"{r:g}" for r in sampling_rates(profile.runs))
    how = f"; each word sampled with probability {rates}" if rates else ""
    return [f"  Total {observed(profile)} (estimated): {format_amount(profile, profile.total_time)} "
            f"(out of {format_amount(profile, profile.cpu_time)} allocated while sampling)",
            f"  Number of samples taken: {profile.sample_number} (sampled blocks{how})"]
