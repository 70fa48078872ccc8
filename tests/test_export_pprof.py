"""pprof export: decoded by a small independent protobuf reader, and by ``go tool pprof``.

The reader below knows only the wire format (varints and length-delimited fields),
not the exporter's code, so it checks the encoding from the outside; ``go tool
pprof`` (Debian's golang-go) is the real consumer.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess

import pytest

from analyzer.exports import ExportError, to_pprof, write_pprof
from analyzer.exports.pprof import _varint
from export_builders import build, two_threads
from export_consumers import need_program


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf: bytes) -> list[tuple[int, object]]:
    """``(field number, int or bytes)`` pairs of one message."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 2:
            size, pos = read_varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise AssertionError(f"unexpected wire type {wire} for field {number}")
        out.append((number, value))
    return out


def ints(value: object) -> list[int]:
    """A repeated integer field, packed (bytes) or not (int)."""
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        v, pos = read_varint(value, pos)
        out.append(v)
    return out


def decode(data: bytes) -> dict:
    msg = fields(gzip.decompress(data))
    strings = [v.decode() for n, v in msg if n == 6]
    functions = {}
    for n, v in msg:
        if n == 5:
            f = dict(fields(v))
            functions[f[1]] = (strings[f.get(2, 0)], strings[f.get(4, 0)], f.get(5, 0))
    locations = {}
    for n, v in msg:
        if n == 4:
            loc = fields(v)
            lid = dict(loc)[1]
            (line,) = [dict(fields(x)) for k, x in loc if k == 4]
            locations[lid] = (functions[line[1]][0], line.get(2, 0))
    samples = []
    for n, v in msg:
        if n == 2:
            s = fields(v)
            locs = [i for k, x in s if k == 1 for i in ints(x)]
            values = [i for k, x in s if k == 2 for i in ints(x)]
            labels = {}
            for k, x in s:
                if k == 3:
                    lab = dict(fields(x))
                    labels[strings[lab[1]]] = strings[lab.get(2, 0)]
            samples.append(([locations[i][0] for i in locs], values, labels))
    types = [tuple(strings[i] for i in (dict(fields(v)).get(1, 0), dict(fields(v)).get(2, 0)))
             for n, v in msg if n == 1]
    top = dict((n, v) for n, v in msg if n in (9, 10, 12, 14))
    return {"strings": strings, "types": types, "samples": samples, "functions": functions,
            "default": strings[top.get(14, 0)], "period": top.get(12, 0)}


def test_varint_encoding_matches_the_protobuf_spec():
    assert _varint(1) == b"\x01" and _varint(150) == b"\x96\x01" and _varint(300) == b"\xac\x02"
    assert _varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes


def test_profile_structure():
    p = decode(to_pprof(two_threads()))
    assert p["strings"][0] == ""
    assert p["types"] == [("samples", "count"), ("cpu", "nanoseconds"), ("wall", "nanoseconds")]
    assert p["default"] == "cpu" and p["period"] == 10_000_000
    got = {(tuple(s[0]), s[2]["thread"]): s[1] for s in p["samples"]}
    assert got == {
        (("work", "main"), "MainThread"): [2, 10_000_000, 10_000_000],  # leaf first
        (("inner", "work", "main"), "MainThread"): [1, 10_000_000, 10_000_000],
        (("helper", "main"), "MainThread"): [2, 20_000_000, 20_000_000],
        (("serve", "run"), "worker"): [2, 10_000_000, 10_000_000],
    }
    assert sorted(f[0] for f in p["functions"].values()) == ["helper", "inner", "main", "run", "serve", "work"]


def test_marks_become_labels():
    snaps = build([("t", ["f"], 0, 0, (("r1", None),)), ("t", ["f"], 1, 1, (("r2", "u"), ("r1", None)))],
                  custom_keys=("request", "user"))
    labels = [s[2] for s in decode(to_pprof(snaps))["samples"]]
    assert {"thread": "t", "thread_id": "0", "request": "r1"} in labels
    assert {"thread": "t", "thread_id": "0", "request": "r2", "user": "u"} in labels


def test_wall_default_and_empty_profile():
    assert decode(to_pprof(two_threads(), clock="wall"))["default"] == "wall"
    assert decode(to_pprof(build([])))["samples"] == []


def test_unwritable_path(tmp_path):
    with pytest.raises(ExportError, match=re.escape(str(tmp_path / "nope" / "x.pb.gz"))):
        write_pprof(two_threads(), tmp_path / "nope" / "x.pb.gz")


def go_pprof(*args: str, cwd) -> str:
    go = need_program("go", "golang-go")
    env = dict(os.environ, HOME=str(cwd), GOCACHE=str(cwd / "gocache"),
               PPROF_TMPDIR=str(cwd))
    proc = subprocess.run([go, "tool", "pprof", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def top_rows(text: str) -> dict[str, tuple[str, str]]:
    """``name -> (flat, cum)`` from ``pprof -top`` output."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\s*(\S+)\s+\S+%\s+\S+%\s+(\S+)\s+\S+%\s+(.+)$", line)
        if m:
            rows[m[3].strip()] = (m[1], m[2])
    return rows


def test_go_tool_pprof_top(tmp_path):
    path = write_pprof(two_threads(), tmp_path / "run.pb.gz")
    out = go_pprof("-top", str(path), cwd=tmp_path)
    assert "Type: cpu" in out and "Total samples = 50ms" in out
    rows = top_rows(out)
    assert rows["main"] == ("0", "40ms") and rows["work"] == ("10ms", "20ms")
    assert rows["helper"] == ("20ms", "20ms") and rows["serve"] == ("10ms", "10ms")
    wall = top_rows(go_pprof("-top", "-sample_index=wall", "-tagfocus=thread=worker", str(path), cwd=tmp_path))
    assert wall == {"serve": ("10ms", "10ms"), "run": ("0", "10ms")}


def test_go_tool_pprof_reads_lines_and_an_empty_profile(tmp_path):
    path = write_pprof(two_threads(), tmp_path / "run.pb.gz")
    lines = go_pprof("-top", "-lines", str(path), cwd=tmp_path)
    assert "app.py:641" in lines  # work, on the line being executed
    empty = write_pprof(build([]), tmp_path / "empty.pb.gz")
    assert "Total samples = 0" in go_pprof("-top", str(empty), cwd=tmp_path)
