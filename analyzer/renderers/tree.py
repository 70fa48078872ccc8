"""The call tree, in the shape of pyinstrument's console output.

Racket's report lists each function once, with its callers and callees; a tree
follows each call path from the outermost frame down instead, so the path to the
expensive work reads top to bottom::

    629ms 100.0%  <module>  stackshot/demo.py:1
    └─ 629ms 100.0%  main  stackshot/demo.py:116
       ├─ 370ms  58.8%  count_visitors  stackshot/demo.py:88

Paths need the stacks, which the analysed call graph no longer has: the tree is
drawn from the snapshots (a :class:`~sampler.snapshot.Snapshots` value, or a
profile analysed from them), weighted exactly as the exports are.
"""

from __future__ import annotations

from typing import IO, Any, Callable, Optional

from ..exports._common import check_snapshots, weighted_rows
from .common import check_fraction, format_ms
from .common import printable
from .naming import format_source

__all__ = ["render_tree"]

WIDTH = 100  # lines fit this many columns; the source is what gets shortened


def render_tree(
    snapshots: Any,
    file: Optional[IO[str]] = None,
    *,
    clock: str = "cpu",
    hide: float = 0.01,
) -> str:
    """The call tree of ``snapshots`` (or of the profile they were analysed into);
    returned, and written to ``file`` if given.

    ``clock``: ``'cpu'`` or ``'wall'``.  ``hide``: a call path taking at most this
    fraction of the total is left out (with its subtree); a line says how many.
    """
    source = getattr(snapshots, "source", None)
    if source is not None:  # an analysed profile: its snapshots
        clock = getattr(snapshots, "weight", clock)
        snapshots = source
    snapshots = check_snapshots(snapshots)
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', not {clock!r}")
    hide = check_fraction("hide", hide)
    text = _render(snapshots, clock, hide)
    if file is not None:
        file.write(text)
    return text


def _render(snapshots: Any, clock: str, hide: float) -> str:
    totals = weighted_rows(snapshots, (clock,))
    stacks = totals.stacks
    column = 1 if clock == "cpu" else 2
    n = len(stacks.node_func)
    total = [0.0] * n
    samples = 0
    for (_tid, node, _m), row in totals.rows.items():
        total[node] += row[column]
        samples += int(row[0])
    children: list[list[int]] = [[] for _ in range(n)]
    for node in range(n - 1, 0, -1):  # a parent's id is below its children's
        parent = stacks.node_parent[node]
        total[parent] += total[node]
        children[parent].append(node)
    grand = total[0]
    amount, what = _quantity(snapshots, clock)
    lines = [f"Call tree: {amount(grand)} {what} in {samples} samples"]
    if not grand:
        return lines[0] + "\n\n  (no samples)\n"
    lines.append(f"(paths with at most {hide * 100:.1f}% of the time are hidden)")
    lines.append("")
    hidden = 0

    def walk(node: int, lead: str, branch: str) -> None:
        nonlocal hidden
        name, filename, firstlineno = stacks.functions[stacks.node_func[node]]
        head = f"{lead}{branch}{amount(total[node])} {total[node] / grand * 100:5.1f}%  {printable(name)}  "
        room = max(WIDTH - len(head), 4)
        lines.append(head + printable(format_source(f"{filename}:{firstlineno}", room)))
        kids = sorted(children[node], key=lambda k: -total[k])
        shown = [k for k in kids if total[k] > hide * grand]
        hidden += len(kids) - len(shown)
        deeper = lead + ("   " if branch in ("└─ ", "") else "│  ")
        for i, k in enumerate(shown):
            walk(k, deeper, "└─ " if i == len(shown) - 1 else "├─ ")

    roots = sorted(children[0], key=lambda k: -total[k])
    top = [k for k in roots if total[k] > hide * grand]
    hidden += len(roots) - len(top)
    for k in top:
        walk(k, "", "")
    if hidden:
        lines.append("")
        lines.append(f"({hidden} call paths hidden; lower --hide-self to see them)")
    return "\n".join(lines) + "\n"


def _quantity(snapshots: Any, clock: str) -> tuple[Callable[[float], str], str]:
    """How to show a weight (seconds, or for allocation samples bytes / 10**6), and
    what the weights are."""
    from .. import memory

    if memory.is_memory(snapshots.runs):
        return (lambda s: memory.format_bytes(s * memory.BYTES_PER_SECOND_SLOT),
                f"{memory.view(clock)} (estimated)")
    return (lambda s: format_ms(s * 1e3)), f"of {clock} time observed"
