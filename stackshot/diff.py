"""Compare two profiles: which functions gained or lost time between two runs.

``python -m stackshot.diff before.stackshot after.stackshot`` prints one row per
function present in either run, the largest change of self time first: self and
total milliseconds before and after, and the change.  A function is matched across
runs by its name and file (not its line, which an edit between the runs moves).
:func:`diff_profiles` gives the same rows to a program.

For pprof users, ``go tool pprof -diff_base before.pb.gz after.pb.gz`` does the same
with pprof files (see the quick start).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NamedTuple, Optional, Sequence

from sampler.snapshot import SnapshotError, Snapshots

from analyzer import Profile, analyze_samples
from analyzer.renderers.common import to_ms
from analyzer.renderers.naming import short_path

__all__ = ["Change", "diff_profiles", "render_diff", "main"]


class Change(NamedTuple):
    """One function's times in two runs, in milliseconds (0 where it did not appear)."""

    name: str
    file: str
    self_before: float
    self_after: float
    total_before: float
    total_after: float

    @property
    def self_change(self) -> float:
        return self.self_after - self.self_before

    @property
    def total_change(self) -> float:
        return self.total_after - self.total_before


def _times(profile: Profile) -> dict[tuple[str, str], tuple[float, float]]:
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for n in profile.nodes:
        key = (str(n.name), short_path(n.filename) if n.filename else "")
        s, t = out.get(key, (0.0, 0.0))
        # the same function at several lines (line granularity): its times add up
        out[key] = (s + to_ms(profile, n.self), t + to_ms(profile, n.total))
    return out


def diff_profiles(before: Profile, after: Profile) -> list[Change]:
    """Every function of either profile, the largest change of self time first."""
    if not isinstance(before, Profile) or not isinstance(after, Profile):
        raise TypeError("diff_profiles() takes two analyzer Profiles, not "
                        f"{type(before).__name__} and {type(after).__name__}")
    a, b = _times(before), _times(after)
    rows = []
    for key in sorted(set(a) | set(b)):
        (self_a, total_a), (self_b, total_b) = a.get(key, (0.0, 0.0)), b.get(key, (0.0, 0.0))
        rows.append(Change(*key, self_a, self_b, total_a, total_b))
    rows.sort(key=lambda c: (-abs(c.self_change), -abs(c.total_change), c.name))
    return rows


def render_diff(changes: Sequence[Change], limit: Optional[int] = 20) -> str:
    """The rows as a table (the first ``limit`` of them; ``None`` for all)."""
    shown = list(changes if limit is None else changes[:limit])
    lines = [f"{'Self before':>12} {'after':>9} {'change':>9}  {'Total before':>12} {'after':>9}"
             f"  Function"]
    for c in shown:
        where = f" ({c.file})" if c.file else ""
        lines.append(f"{c.self_before:>10.1f}ms {c.self_after:>7.1f}ms {c.self_change:>+7.1f}ms"
                     f"  {c.total_before:>10.1f}ms {c.total_after:>7.1f}ms  {c.name}{where}")
    if len(shown) < len(changes):
        lines.append(f"(and {len(changes) - len(shown)} more: --limit 0 shows all)")
    return "\n".join(lines) + "\n"


def _load(path: str) -> Profile:
    try:
        return analyze_samples(Snapshots.load(path))
    except OSError as e:
        raise SystemExit(f"stackshot.diff: cannot read {path}: {e.strerror or e}") from None
    except SnapshotError as e:
        raise SystemExit(f"stackshot.diff: {path}: {e}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stackshot.diff",
        description="Compare two saved runs (.stackshot files, from stackshot -o run.stackshot): "
                    "the functions whose time changed most first.")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--limit", type=int, default=20, metavar="N",
                        help="show the N largest changes (default 20; 0: all)")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error(f"--limit must be 0 or more, not {args.limit}")
    rows = diff_profiles(_load(os.fspath(args.before)), _load(os.fspath(args.after)))
    sys.stdout.write(render_diff(rows, args.limit or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
