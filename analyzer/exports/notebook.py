"""Notebook display: rich HTML for snapshots and profiles, text for terminal IPython,
and a live view that refreshes while a sampler runs.

The flame graph goes into a sandboxed ``<iframe srcdoc=…>`` (scripts allowed, same
origin not): the page's script and stylesheet cannot touch the notebook, several
outputs in one notebook never clash, and the whole page is one escaped attribute.
Above it, a summary and the heaviest functions are plain HTML, so viewers that run
no scripts (a notebook rendered on a website) still show what matters.

Nothing here imports IPython until a live view is made: the repr helpers return
strings that the ``_repr_html_`` / ``_repr_pretty_`` methods hand to IPython.
"""

from __future__ import annotations

import html
import threading
from typing import Any, Callable, Optional

from sampler.snapshot import Snapshots

from ._common import check_snapshots, is_memory, weighted_rows
from .flamegraph import summary_text, to_html

TOP = 10
"""How many functions the static summary lists."""


# A notebook cell is narrower than a browser window: the caller/callee table goes
# below the flame graph when both do not fit side by side, and a name breaks only
# where it must, never letter by letter in a squeezed column.
_CELL_CSS = """<style>
.ss-main { flex-wrap: wrap; }
.ss-graph { flex: 3 1 420px; }
.ss-side { flex: 2 1 22em; }
.ss-table td.ss-name { word-break: normal; overflow-wrap: anywhere; }
</style>
"""


def _in_cell(page: str) -> str:
    """The flame graph page, fitted to a notebook cell (see :data:`_CELL_CSS`)."""
    head_end = page.find("</head>")
    return page if head_end < 0 else page[:head_end] + _CELL_CSS + page[head_end:]


def _iframe(page: str, height: int) -> str:
    return (f'<iframe class="stackshot-frame" sandbox="allow-scripts" '
            f'style="width:100%;height:{height}px;border:1px solid #ddd" '
            f'srcdoc="{html.escape(page, quote=True)}"></iframe>')


def _height(snapshots: Snapshots) -> int:
    """Tall enough for the deepest stack, within what fits a notebook cell."""
    deepest = max((len(snapshots.stack(s)) for s in set(snapshots.sample_stack)), default=0)
    return max(440, min(900, 220 + 18 * (deepest + 2)))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _top_table(rows: list[tuple[str, str, float, float]], total: float, unit: str,
               fmt: Callable[[float], str] = _ms) -> str:
    esc = html.escape
    body = "".join(
        f"<tr><td>{esc(name)}</td><td>{esc(src)}</td>"
        f"<td style='text-align:right'>{esc(fmt(s))}</td>"
        f"<td style='text-align:right'>{100 * s / total if total else 0:.1f}%</td>"
        f"<td style='text-align:right'>{esc(fmt(t))}</td></tr>"
        for name, src, s, t in rows)
    return ("<table class='stackshot-top'><thead><tr><th>function</th><th>where</th>"
            f"<th>self ({esc(unit)})</th><th>self %</th><th>total</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _snapshot_top(snapshots: Snapshots, clock: str) -> tuple[list, float]:
    totals = weighted_rows(snapshots, (clock,))
    column = 1 if clock == "cpu" else 2
    self_t: dict[int, float] = {}
    total_t: dict[int, float] = {}
    grand = 0.0
    for (_tid, node, _m), row in totals.rows.items():
        w = row[column]
        grand += w
        path = totals.stacks.path(node)
        self_t[path[-1]] = self_t.get(path[-1], 0.0) + w
        for f in set(path):
            total_t[f] = total_t.get(f, 0.0) + w
    fns = totals.stacks.functions
    heavy = sorted(self_t, key=lambda f: -self_t[f])[:TOP]
    return [(fns[f][0], f"{fns[f][1]}:{fns[f][2]}", self_t[f], total_t[f]) for f in heavy], grand


def snapshots_html(snapshots: Snapshots, *, clock: str = "cpu", title: Optional[str] = None) -> str:
    """What ``Snapshots._repr_html_`` shows: summary, heaviest functions, flame graph."""
    check_snapshots(snapshots)
    esc = html.escape
    summary = f"<p class='stackshot-summary'><b>stackshot</b>: {esc(summary_text(snapshots, clock))}</p>"
    if not len(snapshots) or not any(snapshots.sample_stack):
        return f"<div class='stackshot'>{summary}<p><i>No samples to draw.</i></p></div>"
    top, grand = _snapshot_top(snapshots, clock)
    fmt, what = _ms, "time"
    if is_memory(snapshots):  # weights are bytes / 10**6
        from analyzer.memory import format_bytes

        fmt, what = (lambda s: format_bytes(s * 1e6)), "bytes"
    return (f"<div class='stackshot'>{summary}"
            f"<details><summary>heaviest functions by self {what}</summary>"
            f"{_top_table(top, grand, clock, fmt)}</details>"
            f"{_iframe(_in_cell(to_html(snapshots, clock=clock, title=title)), _height(snapshots))}</div>")


def profile_html(profile: Any) -> str:
    """What ``Profile._repr_html_`` shows.

    With the snapshots it was analysed from (``profile.source``), the flame graph
    page; otherwise the summary and heaviest functions from the call graph itself.
    """
    source = getattr(profile, "source", None)
    clock = getattr(profile, "weight", "cpu")
    if isinstance(source, Snapshots):
        return snapshots_html(source, clock=clock if clock in ("cpu", "wall") else "cpu")
    esc = html.escape
    nodes = sorted(profile.nodes, key=lambda n: -n.self)[:TOP]
    rows = [(n.name, "" if n.src is None else str(n.src), n.self, n.total) for n in nodes]
    from analyzer.renderers.common import format_amount, observed

    def fmt(t: float) -> str:
        return format_amount(profile, t)

    head = (f"<p class='stackshot-summary'><b>stackshot profile</b>: {profile.sample_number} samples, "
            f"{esc(fmt(profile.total_time))} {esc(observed(profile))} observed "
            f"(out of {esc(fmt(profile.cpu_time))}), {len(profile.nodes)} functions</p>")
    if not profile.nodes:
        return f"<div class='stackshot'>{head}<p><i>No samples.</i></p></div>"
    return f"<div class='stackshot'>{head}{_top_table(rows, profile.total_time, str(clock), fmt)}</div>"


def profile_pretty(profile: Any, p: Any, cycle: bool) -> None:
    """``_repr_pretty_`` body for a Profile: Racket's text report."""
    if cycle:
        p.text(repr(profile))
        return
    from analyzer.renderers import render_text

    p.text(render_text(profile).rstrip("\n"))


def snapshots_pretty(snapshots: Snapshots, p: Any, cycle: bool) -> None:
    """``_repr_pretty_`` body for Snapshots: its repr, then the analysed text report."""
    if cycle or not len(snapshots):
        p.text(repr(snapshots))
        return
    from analyzer import analyze_samples
    from analyzer.renderers import render_text

    p.text(repr(snapshots) + "\n" + render_text(analyze_samples(snapshots)).rstrip("\n"))


class LiveView:
    """A notebook display that redraws from a running sampler every ``every`` seconds.

    The notebook counterpart of Racket's periodic renderer: ``source`` is a sampler
    controller (or any function returning :class:`Snapshots`).  :meth:`stop` (or leaving
    a ``with`` block) draws a last time and ends the refresh thread; the sampler itself
    is left as it is.
    """

    def __init__(self, source: Any, every: float = 2.0, *, clock: str = "cpu",
                 title: str = "stackshot live view") -> None:
        from IPython.display import HTML, display

        if not every > 0:
            raise ValueError(f"every must be a positive number of seconds, not {every!r}")
        self._get: Callable[[], Snapshots] = (
            source.get_snapshots if hasattr(source, "get_snapshots") else source)
        self._html = HTML
        self.every = float(every)
        self.clock = clock
        self.title = title
        self.refreshes = 0
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.handle = display(HTML(self._render()), display_id=True)
        self._thread = threading.Thread(target=self._loop, name="stackshot-live-view", daemon=True)
        self._thread.start()

    def _render(self) -> str:
        snaps = self._get()
        return snapshots_html(snaps, clock=self.clock, title=self.title)

    def refresh(self) -> None:
        """Redraw now from the latest snapshots."""
        with self._lock:
            self.handle.update(self._html(self._render()))
            self.refreshes += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.refresh()
            except BaseException as e:  # keep the error for the user; never kill the kernel
                self.error = e
                return

    def stop(self) -> None:
        """Stop refreshing, after one last redraw."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.refresh()

    def __enter__(self) -> "LiveView":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
