"""A flame graph a person can use: one self-contained HTML file (or notebook output).

The page holds the data, the stylesheet and the script, so it opens from disk, from
an e-mail attachment or in a notebook with no network access.  It shows:

* a flame graph (root at the bottom) or an icicle view (root on top), drawn as SVG;
  a click zooms on a frame (its ancestors stay as grey bars: click one to zoom out);
* hover details: function, ``file:line``, self and total time with their share, the
  threads that ran it;
* a search box (a regular expression, or literal text if it is not one) that paints
  matching frames and says what share of the time they cover;
* selectors for the thread, the measure (CPU time, wall time, sample count; for
  allocation samples from ``sampler.memprof``, bytes allocated and bytes still live,
  shown in KB / MB) and,
  when the run had custom keys, a mark value (one request id, say);
* Racket's caller/callee table beside the graph, from :func:`analyzer.analyze_samples`;
  clicking a frame finds its row, clicking a row paints its frames.

An empty profile renders an explicit "no samples" view.  Every name, path and mark
value travels as JSON with ``<``, ``>`` and ``&`` escaped and reaches the document only
as text, so a function called ``<script>`` shows as exactly that.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Optional

from sampler.snapshot import Snapshots

from . import _flamegraph_assets as assets
from ._common import PathLike, _check_clock, check_snapshots, is_memory, weighted_rows, write_output
from .tables import caller_callee_tables

MAX_THREAD_TABLES = 8
"""Per-thread caller/callee tables are precomputed up to this many threads."""
TABLE_BUDGET = 4_000_000
"""... and while samples x threads stays under this (each table is one analysis pass)."""

_JSON_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``</script>``, ``<!--`` or ``&`` survives."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).translate(_JSON_ESCAPES)


def _text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def flamegraph_data(snapshots: Snapshots, *, clock: str = "cpu", title: Optional[str] = None,
                    tables: bool = True) -> dict[str, Any]:
    """Everything the page's script needs, as plain data (see the module docstring)."""
    check_snapshots(snapshots)
    _check_clock(clock)
    totals = weighted_rows(snapshots)
    stacks = totals.stacks
    memory = is_memory(snapshots)  # weights are seconds, or bytes / 10**6: shown as bytes
    rows = [[tid, node, marks, int(c), round(cpu * 1e6) if memory else round(cpu, 9),
             round(wall * 1e6) if memory else round(wall, 9)]
            for (tid, node, marks), (c, cpu, wall) in sorted(totals.rows.items())]
    data: dict[str, Any] = {
        "title": title or default_title(snapshots),
        "clock": clock,
        "unit": "bytes" if memory else "seconds",
        "functions": [[str(n), str(f or ""), int(line or 0)] for n, f, line in stacks.functions],
        "parent": list(stacks.node_parent),
        "func": list(stacks.node_func),
        "threads": [[t.id, str(t.name), str(t.kind)] for t in snapshots.threads],
        "keys": [str(k) for k in snapshots.custom_keys],
        "markSets": [[[_text(v) for v in entry] for entry in ms] for ms in snapshots.mark_sets],
        "rows": rows,
    }
    if tables and rows:
        fids = {key: i for i, key in enumerate(stacks.functions)}
        threads = len(set(snapshots.sample_thread))
        per_thread = MAX_THREAD_TABLES if len(snapshots) * threads <= TABLE_BUDGET else 0
        data["tables"] = caller_callee_tables(snapshots, fids, max_threads=per_thread)
    return data


def default_title(snapshots: Snapshots) -> str:
    run = snapshots.runs[0] if snapshots.runs else None
    if run is not None and run.pid:
        return f"stackshot profile: pid {run.pid} on {run.host}"
    return "stackshot profile"


def summary_text(snapshots: Snapshots, clock: str = "cpu") -> str:
    """One line about the run: samples, threads, time observed, sampling rate."""
    n = len(snapshots)
    if not n:
        return "No samples were recorded."
    totals = weighted_rows(snapshots, (clock,))
    column = 1 if clock == "cpu" else 2
    observed = sum(r[column] for r in totals.rows.values())
    parts = [f"{n} samples", f"{len(snapshots.threads)} thread{'s' if len(snapshots.threads) != 1 else ''}",
             f"{observed * 1e3:.1f} ms {clock} time observed"]
    if is_memory(snapshots):
        from analyzer.memory import format_bytes, view

        parts[-1] = f"{format_bytes(observed * 1e6)} {view(clock)} observed (estimated)"
        if snapshots.cpu_time:
            parts[-1] += f", out of {format_bytes(snapshots.cpu_time * 1e6)} allocated"
        return ", ".join(parts)
    if snapshots.cpu_time:
        parts[-1] += f" (out of {snapshots.cpu_time * 1e3:.1f} ms process CPU)"
    rates = [r.achieved_rate for r in snapshots.runs if r.achieved_rate]
    if rates:
        parts.append(f"sampled at {sum(rates) / len(rates):.0f} Hz")
    return ", ".join(parts)


def html_fragment(snapshots: Snapshots, *, clock: str = "cpu", title: Optional[str] = None,
                  tables: bool = True) -> str:
    """The flame graph as a ``<div>`` with its own script, for embedding in a page."""
    data = flamegraph_data(snapshots, clock=clock, title=title, tables=tables)
    esc = html.escape
    has_rows = bool(data["rows"])
    measures = (("cpu", "bytes allocated"), ("wall", "bytes still live"), ("samples", "samples")) \
        if data["unit"] == "bytes" else (("cpu", "CPU time"), ("wall", "wall time"), ("samples", "samples"))
    metric_options = "".join(
        f'<option value="{v}"{" selected" if v == clock else ""}>{label}</option>'
        for v, label in measures)
    return f"""<div class="ss-root">
<h1>{esc(data["title"])}</h1>
<div class="ss-summary">{esc(summary_text(snapshots, clock))}</div>
<div class="ss-controls">
 <label>thread <select class="ss-thread"><option value="all">all threads</option></select></label>
 <label>measure <select class="ss-metric">{metric_options}</select></label>
 <label>mark <select class="ss-mark"><option value="">any</option></select></label>
 <label>view <select class="ss-view"><option value="flame">flame graph</option><option value="icicle">icicle</option></select></label>
 <input type="search" class="ss-search" placeholder="search (regex)" aria-label="search">
 <button type="button" class="ss-reset">Reset</button>
</div>
<div class="ss-status"></div>
<div class="ss-main">
 <div class="ss-graph">
  <div class="ss-empty"{'' if not has_rows else ' style="display:none"'}>No samples: the profile is empty.</div>
  <svg class="ss-flame" xmlns="http://www.w3.org/2000/svg" height="0" role="img" aria-label="flame graph"></svg>
 </div>
 <div class="ss-side"><h2>Callers and callees</h2><div class="ss-side-body"></div></div>
</div>
<div class="ss-tip" role="tooltip"></div>
<script type="application/json" class="ss-data">{_script_json(data)}</script>
<script>{assets.JS}</script>
</div>"""


def to_html(snapshots: Snapshots, *, clock: str = "cpu", title: Optional[str] = None,
            tables: bool = True) -> str:
    """A complete, self-contained HTML page showing ``snapshots`` as a flame graph."""
    check_snapshots(snapshots)
    page_title = html.escape(title or default_title(snapshots))
    body = html_fragment(snapshots, clock=clock, title=title, tables=tables)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>{page_title}</title>
<style>{assets.CSS}
body {{ margin: 12px; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def write_html(snapshots: Snapshots, path: PathLike, *, clock: str = "cpu",
               title: Optional[str] = None, tables: bool = True) -> Path:
    """Write :func:`to_html` to ``path``; open it with any browser."""
    return write_output(path, to_html(snapshots, clock=clock, title=title, tables=tables))
