"""The attack on stackshot (issue 10) kept as a test: seeded mutations of snapshot files
and JSON profiles, fed to every consumer.

A mutated snapshot file must either be refused by :func:`sampler.snapshot_file.load`
with a one-line :class:`SnapshotError`, or be analysed, rendered (text, flat, dot,
JSON and back) and exported (every format of the registry, the notebook views)
without any exception.  A mutated JSON profile must either be refused by
:func:`json_to_profile` with a one-line :class:`ProfileFormatError`, or render and
round-trip.  The seeds are fixed, so a failure names a case that fails every time.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import random
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from analyzer import (
    ProfileFormatError, analyze_samples, json_to_profile, profile_to_json, render_dot, render_text,
)
from analyzer.exports import FORMATS
from analyzer.exports.notebook import profile_html, snapshots_html
from analyzer.renderers.flat import render_flat
from sampler.outputfile import encode_text
from sampler.snapshot import FORMAT_VERSION, OVERFLOW, Frame, RunInfo, SnapshotError, Snapshots, ThreadInfo
from sampler.snapshot_file import MAGIC, load, save

REPRO = Path(__file__).parent / "data" / "repro"
CHUNKS = 8  # each chunk its own seed, so a failure is reproduced by running one of them
SNAPSHOT_CASES = 120  # per chunk: 960 mutated snapshot files
PROFILE_CASES = 250  # per chunk: 2,000 mutated JSON profiles


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = [
    math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 10**30, -(10**30), 2**63, -(2**63) - 1,
    10**3999, -1, 0, 1, 1.5, True, None, "", "\ud800", "\udcff.py", "\x1b]0;PWNED\x07\x1b[2J",
    "\u202e", "x" * 300, [], {}, [1, 2], {"a": 1}, _deep(80), "inf", "nan",
]


def _slots(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place of a JSON tree, as a path of keys/indices from the root."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _slots(v, path + (k,))
    elif isinstance(value, list) and len(value) < 64:
        for i, v in enumerate(value):
            out += _slots(v, path + (i,))
    elif isinstance(value, list):  # long lists: a few places are enough
        for i in (0, 1, len(value) // 2, len(value) - 1):
            out += _slots(value[i], path + (i,))
    return out


def _at(tree: Any, path: tuple) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def mutate(tree: Any, rng: random.Random) -> Any:
    """``tree`` with one to three places replaced, deleted, duplicated or retyped."""
    tree = copy.deepcopy(tree)
    for _ in range(rng.randint(1, 3)):
        slots = _slots(tree)[1:] or [()]
        if rng.random() < 0.85:  # mostly the scalars: where NaN and huge numbers do harm
            slots = [p for p in slots if not isinstance(_at(tree, p), (list, dict))] or slots
        path = rng.choice(slots)
        if not path:
            return rng.choice(HOSTILE)
        *up, last = path
        parent = tree
        for k in up:
            parent = parent[k]
        op = rng.random()
        old = parent[last]
        if op < 0.45 and isinstance(old, (int, float, str)) and not isinstance(old, bool):
            # of the same JSON type: what a type-checking loader lets through
            kind = str if isinstance(old, str) else (int, float)
            parent[last] = rng.choice([v for v in HOSTILE if isinstance(v, kind)
                                       and not isinstance(v, bool)])
        elif op < 0.7:
            parent[last] = copy.deepcopy(rng.choice(HOSTILE))
        elif op < 0.8:
            del parent[last]
        elif op < 0.9 and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        elif isinstance(parent[last], (int, float)) and not isinstance(parent[last], bool):
            parent[last] = parent[last] * rng.choice([-1, 2**40, 1e300])
        else:
            parent[last] = {"0": parent[last]} if isinstance(parent[last], list) else [parent[last]]
    return tree


# -- snapshot files ---------------------------------------------------------------------------
def _synthetic() -> Snapshots:
    """A value with what the recorded one lacks: overflow entries, two runs, a greenlet."""
    wall = [0, 5, OVERFLOW, 7, 0, OVERFLOW]
    return Snapshots(
        frames=[Frame("main", "app.py", 1, 3), Frame("work", "app.py", 10, None)],
        stack_frame=[0, 0, 1], stack_parent=[0, 0, 1],
        threads=[ThreadInfo(0, "MainThread", 12, "thread", 0, 0.0, 0.1),
                 ThreadInfo(1, "g", None, "greenlet", 1, 0.5, 0.0)],
        sample_thread=[0, 0, 0, 1, 1, 1], sample_stack=[1, 2, 2, 1, 0, 2],
        sample_wall=wall, sample_cpu=[0, 3, 4, 0, 2, 9], wall_overflow={2: 1 << 33, 5: 1 << 40},
        sample_marks=[0, 1, 1, 0, 1, 0], mark_sets=[(), (("r1",),)], custom_keys=["req"],
        runs=[RunInfo(pid=1, requested_delay=0.001, requested_rate=1000.0, achieved_rate=950.0,
                      process_cpu=0.5, duration=1.0, start_epoch=1.7e9),
              RunInfo(pid=2, requested_rate=math.inf)])


def _parts(data: bytes) -> tuple[dict, bytes]:
    content = gzip.decompress(data)
    lines = content.split(b"\n", 3)
    n = int(lines[2].split()[1])
    return json.loads(lines[3][:n]), lines[3][n:]


def _file(header: Any, body: bytes) -> bytes:
    hb = json.dumps(header, ensure_ascii=True, allow_nan=True).encode()
    return gzip.compress(MAGIC + b"version %d\n" % FORMAT_VERSION + b"header %d\n" % len(hb)
                         + hb + body, mtime=0)


def _bases() -> list[tuple[dict, bytes]]:
    import io

    buf = io.BytesIO()
    save(_synthetic(), buf)
    return [_parts((REPRO / "terminal_escapes.stackshot").read_bytes()), _parts(buf.getvalue())]


def _mutated_file(bases: list, rng: random.Random) -> bytes:
    header, body = rng.choice(bases)
    if rng.random() < 0.8:
        header = mutate(header, rng)
    if rng.random() < 0.3:  # the sections too: ids out of range, cycles, huge deltas
        body = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(body))
            body[i] = rng.choice([0, 1, 0x7F, 0xFF, rng.randrange(256)])
        body = bytes(body)
    return _file(header, body)


def consume_snapshots(s: Snapshots) -> None:
    """Everything a user can do with a loaded value; any exception is a bug."""
    for weight in ("cpu", "wall"):
        for granularity in ("function", "line"):
            p = analyze_samples(s, weight=weight, granularity=granularity)
            consume_profile(p)
    for fmt in FORMATS.values():
        out = fmt.render(s)
        if isinstance(out, str):
            encode_text(out)
    snapshots_html(s)


_RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\ud800-\udfff]")


def consume_profile(p: Any) -> None:
    for text in (render_text(p, hide_self=0, hide_subs=0, order="self"), render_text(p),
                 render_flat(p, show_line=True)):
        assert not _RAW_CONTROL.search(text), "a terminal report sends a control character"
    encode_text(render_dot(p, hide_self=0, hide_subs=0))
    data = json.dumps(profile_to_json(p), allow_nan=False)  # stackshot reads what it writes
    json_to_profile(data)
    profile_html(p)


@pytest.fixture(scope="module")
def bases():
    return _bases()


def _through_the_door(chunk: int, cases: Any, read: Callable[[Any], Any], error: type,
                      consume: Callable[[Any], None]) -> None:
    """Each case must be refused by ``read`` with a one-line ``error``, or be read and
    survive ``consume``; both outcomes must occur, so the mutations test both sides."""
    refused = used = 0
    for case, raw in enumerate(cases):
        try:
            value = read(raw)
        except error as e:
            assert "\n" not in str(e) and len(str(e)) < 300, (case, str(e)[:500])
            refused += 1
            continue
        try:
            consume(value)
        except Exception as e:  # pragma: no cover - the failure report
            raise AssertionError(f"chunk {chunk} case {case}: {type(e).__name__}: {e}"[:2000]) from e
        used += 1
    assert refused and used


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_mutated_snapshot_files_are_refused_in_one_line_or_fully_usable(chunk, bases):
    import io

    rng = random.Random(f"snapshot-{chunk}")
    files = (_mutated_file(bases, rng) for _ in range(SNAPSHOT_CASES))
    _through_the_door(chunk, files, lambda data: load(io.BytesIO(data)), SnapshotError,
                      consume_snapshots)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_mutated_json_profiles_are_refused_in_one_line_or_fully_usable(chunk, bases):
    import io

    rng = random.Random(f"profile-{chunk}")
    header, body = bases[chunk % len(bases)]
    s = load(io.BytesIO(_file(header, body)))
    originals = [profile_to_json(analyze_samples(s)),
                 profile_to_json(analyze_samples(s, weight="wall", granularity="line"))]
    texts = (json.dumps(mutate(rng.choice(originals), rng), allow_nan=True)
             for _ in range(PROFILE_CASES))
    _through_the_door(chunk, texts, json_to_profile, ProfileFormatError, consume_profile)


def test_the_mutator_reaches_every_kind_of_hostile_value():
    rng = random.Random(0)
    seen: set[str] = set()
    tree = {"a": [1, 2.5, "x"], "b": {"c": None}}
    for _ in range(300):
        seen.add(json.dumps(mutate(tree, rng), allow_nan=True)[:40])
    text = " ".join(seen)
    assert all(token in text for token in ("NaN", "Infinity", "\\ud800", "\\u001b", "[[[["))


# -- the command line, for real ---------------------------------------------------------------
CLI_CASES = 30
_CLI_OPTIONS = [[], ["--weight", "wall"], ["--granularity", "line"], ["--thresh", "1"],
                ["--order", "self", "--hide-self", "0"], ["--flat", "--show-line"]]


def test_python_m_analyzer_on_mutated_files_exits_cleanly(bases, tmp_path):
    """What the attack ran: ``python -m analyzer`` on mutants (162 of 1,642 ended in a
    traceback).  Exit 0 with nothing on stderr, or exit 1 with one line."""
    import subprocess
    import sys

    from run_helpers import repo_env

    rng = random.Random("cli")
    formats = ["text", "flat", "dot", "json", *FORMATS]
    for case in range(CLI_CASES):
        path = tmp_path / f"mutant{case}.stackshot"
        header, body = rng.choice(bases)
        header = dict(header)  # one part mutated: where hostile values reach the consumers
        part = rng.choice(["runs", "threads", "frames"])
        header[part] = mutate(header[part], rng)
        path.write_bytes(_file(header, body))
        fmt = rng.choice(formats if case % 2 else ["text", "flat"])  # terminal reports: half
        options = [] if fmt in FORMATS else rng.choice(_CLI_OPTIONS)
        if "--flat" in options:
            fmt = "flat"
        args = ["--format", fmt, *options, "--render-to", str(tmp_path / "out"), str(path)]
        done = subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True,
                              env=repo_env(), timeout=180)
        err = done.stderr.decode("utf-8", "replace")
        where = f"case {case}: analyzer {' '.join(args[:-1])}: {err[-1500:]}"
        assert "Traceback" not in err, where
        assert (done.returncode, err) == (0, "") or (
            done.returncode == 1 and len(err.strip().splitlines()) == 1), where
        if done.returncode == 0 and fmt in ("text", "flat"):  # what a terminal would get
            out = (tmp_path / "out").read_text("utf-8")
            assert not _RAW_CONTROL.search(out), f"case {case}: a control character in {fmt}"
