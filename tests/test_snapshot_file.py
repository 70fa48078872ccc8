"""Saving and loading snapshots: round trips, and every kind of bad file.

A bad file must give a one-line :class:`SnapshotError`, never another exception, a
large allocation or a hang.  Values are built with ``Snapshots(...)`` directly.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import pickle
import random
import re
import stat
import threading
import time
import tracemalloc
from array import array
from typing import Any, Optional

import pytest

import sampler.snapshot_file as sf
from sampler.snapshot import (
    FORMAT_VERSION, OVERFLOW, Frame, RunInfo, SnapshotError, Snapshots, ThreadInfo, merge,
)
from sampler.snapshot_file import MAGIC, load, save


# -- building values ---------------------------------------------------------------------
def rich_value(n: int = 40, seed: int = 1) -> Snapshots:
    """A value using every part of the format: marks, overflow, two runs, odd strings."""
    rng = random.Random(seed)
    frames = [Frame("main", "app.py", 1, 3), Frame("work", "app.py", 10, None),
              Frame("λ-ünïcode", "/tmp/\udcff-undecodable.py", 1, 1), Frame("leaf", "lib.py", 5, 6)]
    keys = ["request", 7, ("tuple", "key")]
    mark_sets = [(), (("r1", None, None),),
                 (("r2", 1, (1, (2, "x"))), ("r1", None, None)),
                 ((None, 2.5, True),), ((False, -0.0, math.inf),)]
    runs = [RunInfo(pid=1, host="alpha", python="3.11", stackshot="0.1", start_epoch=1.7e9,
                    duration=2.5, sampling_wall=2.0, process_cpu=1.25, requested_delay=0.001,
                    ticks=100, late_ticks=3, missed_ticks=1, achieved_rate=950.5,
                    requested_rate=1000.0, collector_cpu=0.01, custom_keys=tuple(keys),
                    stopped=True, errors=("ValueError: x",), extra={"argv": ["a", "b"], "n": None}),
            RunInfo(pid=2, requested_rate=math.inf, requested_delay=0.0)]
    threads = [ThreadInfo(0, "MainThread", 1234, "thread", 0, 0.0, 0.1),
               ThreadInfo(1, "worker ✓", None, "greenlet", 1, 0.5, 0.0)]
    wall = [rng.choice([0, 5, 1000, OVERFLOW]) for _ in range(n)]
    cpu = [rng.choice([0, 3, OVERFLOW]) for _ in range(n)]
    return Snapshots(
        frames=frames, stack_frame=[0, 0, 1, 2, 3, 3], stack_parent=[0, 0, 1, 2, 2, 1],
        threads=threads,
        sample_thread=[rng.randrange(2) for _ in range(n)],
        sample_stack=[rng.randrange(6) for _ in range(n)],
        sample_wall=wall, sample_cpu=cpu,
        sample_marks=[rng.randrange(len(mark_sets)) for _ in range(n)],
        wall_overflow={i: (1 << 32) + i for i, v in enumerate(wall) if v == OVERFLOW},
        cpu_overflow={i: (1 << 40) + i for i, v in enumerate(cpu) if v == OVERFLOW},
        mark_sets=mark_sets, custom_keys=keys, runs=runs,
    )


def random_value(rng: random.Random) -> Snapshots:
    """A valid value of random shape and content (mark values of every kind allowed)."""
    scalars = [None, True, False, 0, -1, 2**63, 1.5, -0.0, math.inf, "", "x", "é\u2028", "\udc80"]

    def mark_value(depth: int = 0) -> Any:
        if depth < 2 and rng.random() < 0.2:
            return tuple(mark_value(depth + 1) for _ in range(rng.randrange(3)))
        return rng.choice(scalars)

    frames = [Frame(rng.choice(["f", "g", "<lambda>", "ω"]), rng.choice(["a.py", "b/c.py"]),
                    rng.randrange(0, 10**6), rng.choice([None, 0, 1, 99999]))
              for _ in range(rng.randrange(0, 8))]
    n_stacks = 1 + (rng.randrange(0, 20) if frames else 0)
    runs = [RunInfo(pid=rng.randrange(1 << 22), host=rng.choice(["", "h1"]),
                    achieved_rate=rng.choice([0.0, 12.5, math.inf]),
                    extra=rng.choice([{}, {"k": [1, "2", None, {"d": 1.5}]}]))
            for _ in range(rng.randrange(0, 3))]
    threads = [ThreadInfo(i, f"t{i}", rng.choice([None, rng.randrange(1 << 30)]),
                          rng.choice(["thread", "greenlet"]), rng.randrange(max(len(runs), 1)),
                          rng.random() * 100, rng.choice([0, rng.random()]))
               for i in range(rng.randrange(0, 4))]
    keys: list[Any] = []
    while len(keys) < rng.randrange(0, 4):
        k = rng.choice(["req", "user", 3, ("t", 1), None, 2.5])
        if k not in keys:
            keys.append(k)
    mark_sets: list[tuple] = [()]
    for _ in range(rng.randrange(0, 5) if keys else 0):
        ms = tuple(tuple(mark_value() for _ in keys) for _ in range(rng.randrange(1, 3)))
        if ms not in mark_sets:
            mark_sets.append(ms)
    n = rng.randrange(0, 60) if threads else 0
    wall = [rng.choice([0, 1, 999, OVERFLOW - 1, OVERFLOW]) for _ in range(n)]
    cpu = [rng.choice([0, 7, OVERFLOW]) for _ in range(n)]
    return Snapshots(
        frames=frames,
        stack_frame=[0] + [rng.randrange(len(frames)) for _ in range(1, n_stacks)],
        stack_parent=[0] + [rng.randrange(i) for i in range(1, n_stacks)],
        threads=threads,
        sample_thread=[rng.randrange(len(threads)) for _ in range(n)],
        sample_stack=[rng.randrange(n_stacks) for _ in range(n)],
        sample_wall=wall, sample_cpu=cpu,
        sample_marks=[rng.randrange(len(mark_sets)) for _ in range(n)] if keys else None,
        wall_overflow={i: rng.randrange(1 << 32, 1 << 50) for i, v in enumerate(wall)
                       if v == OVERFLOW and rng.random() < 0.9},
        cpu_overflow={i: rng.randrange(1 << 32, 1 << 50) for i, v in enumerate(cpu) if v == OVERFLOW},
        mark_sets=mark_sets, custom_keys=keys, runs=runs,
    )


def to_bytes(s: Snapshots) -> bytes:
    buf = io.BytesIO()
    save(s, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Snapshots:
    return load(io.BytesIO(data))


def assert_same(a: Snapshots, b: Snapshots) -> None:
    assert a == b
    assert list(a.samples()) == list(b.samples())
    assert [a.marks_of(i) for i in range(len(a))] == [b.marks_of(i) for i in range(len(b))]


# -- hand-crafted files -------------------------------------------------------------------
def valid_header(s: Snapshots) -> dict[str, Any]:
    """The header save() writes for ``s``, as a dict to tamper with."""
    content = gzip.decompress(to_bytes(s))
    lines = content.split(b"\n", 3)
    return json.loads(lines[3][: int(lines[2].split()[1])])


def sections_of(s: Snapshots) -> bytes:
    return b"".join(getattr(s, n).tobytes() for n in sf.ARRAY_SECTIONS
                    if getattr(s, n) is not None)


def craft(header: Any = None, body: bytes = b"", *, version: int = FORMAT_VERSION,
          header_len: Optional[int] = None, magic: bytes = MAGIC) -> bytes:
    """A gzip file with our framing around whatever header and body a test wants."""
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hb) if header_len is None else header_len
    return gzip.compress(magic + b"version %d\n" % version + b"header %d\n" % n + hb + body)


def small_value() -> Snapshots:
    return Snapshots(frames=[Frame("f", "a.py", 1, 2)], stack_frame=[0, 0], stack_parent=[0, 0],
                     threads=[ThreadInfo(0, "main", 1, "thread", 0, 0.0, 0.0)],
                     sample_thread=[0, 0, 0], sample_stack=[1, 1, 0], sample_wall=[0, 1, 2],
                     sample_cpu=[0, 1, 2], runs=[RunInfo(pid=3)])


def load_error(data: bytes) -> str:
    """Load ``data`` expecting a SnapshotError; return its message (checked one-line)."""
    with pytest.raises(SnapshotError) as info:
        from_bytes(data)
    msg = str(info.value)
    assert "\n" not in msg and msg
    return msg


# -- round trips --------------------------------------------------------------------------
def test_round_trip_rich_value_through_every_kind_of_path(tmp_path):
    s = rich_value()
    for p in (str(tmp_path / "a.stackshot"), tmp_path / "b.stackshot",
              os.fsencode(tmp_path / "c.stackshot")):
        save(s, p)
        assert_same(load(p), s)
    with open(tmp_path / "d.stackshot", "wb") as f:
        save(s, f)
        assert not f.closed
    with open(tmp_path / "d.stackshot", "rb") as f:
        assert_same(load(f), s)
        assert not f.closed


def test_methods_on_the_value_delegate(tmp_path):
    s = rich_value()
    s.save(tmp_path / "x")
    assert_same(Snapshots.load(tmp_path / "x"), s)


def test_round_trip_keeps_marks_overflow_and_run_metadata():
    s = rich_value(200)
    t = from_bytes(to_bytes(s))
    assert t.custom_keys == ("request", 7, ("tuple", "key"))
    assert t.mark_sets == s.mark_sets
    assert t.marks_of(list(s.sample_marks).index(2)) == (("r2", 1, (1, (2, "x"))), ("r1", None, None))
    assert t.wall_overflow == s.wall_overflow and t.wall_overflow
    assert t.cpu_overflow == s.cpu_overflow and t.cpu_overflow
    assert t.runs == s.runs
    assert t.runs[1].requested_rate == math.inf
    assert t.runs[0].custom_keys == ("request", 7, ("tuple", "key"))
    assert t.frames[2].filename == "/tmp/\udcff-undecodable.py"
    assert math.copysign(1, t.mark_sets[4][0][1]) == -1  # -0.0 stays negative


def test_round_trip_after_merge_of_several_runs():
    a, b, c = rich_value(30, 1), small_value(), rich_value(10, 2)
    m = merge(a, b, c)
    t = from_bytes(to_bytes(m))
    assert_same(t, m)
    assert len(t.runs) == 5 and len(t.threads) == 5
    assert merge(from_bytes(to_bytes(a)), from_bytes(to_bytes(b)), c) == m  # loaded values merge


def test_value_without_marks_round_trips_without_a_marks_section():
    s = small_value()
    t = from_bytes(to_bytes(s))
    assert t.sample_marks is None
    assert_same(t, s)
    assert [sec["name"] for sec in valid_header(s)["sections"]] == list(sf.ARRAY_SECTIONS[:-1])


def test_empty_value_round_trips():
    assert_same(from_bytes(to_bytes(Snapshots())), Snapshots())


def test_lists_come_back_as_tuples_in_marks_and_lists_in_run_extra():
    """Documented: mark values and keys are made hashable again; run extra stays JSON."""
    s = Snapshots(custom_keys=[["list", "key"]], mark_sets=[(), (([1, [2]],),)],
                  runs=[RunInfo(extra={"t": (1, 2)})])
    t = from_bytes(to_bytes(s))
    assert t.custom_keys == (("list", "key"),)
    assert t.mark_sets[1] == (((1, (2,)),),)
    hash(t.mark_sets)  # usable as a dict key, as the recorder and merge need
    assert t.runs[0].extra == {"t": [1, 2]}


def test_saving_is_deterministic():
    assert to_bytes(rich_value()) == to_bytes(rich_value())


def test_file_layout_is_as_documented():
    s = rich_value()
    content = gzip.decompress(to_bytes(s))
    magic, version, header_line, rest = content.split(b"\n", 3)
    assert magic + b"\n" == MAGIC and version == b"version 1"
    n = int(header_line.split()[1])
    header = json.loads(rest[:n])
    assert rest[n:] == sections_of(s)  # raw little-endian uint32 columns, in header order
    assert [(x["name"], x["typecode"], x["length"]) for x in header["sections"]] == [
        (name, "I", len(getattr(s, name))) for name in sf.ARRAY_SECTIONS]


def test_random_values_round_trip():
    rng = random.Random(0x5747)
    for _ in range(300):
        s = random_value(rng)
        t = from_bytes(to_bytes(s))
        assert_same(t, s)
        assert from_bytes(to_bytes(t)) == t


def test_random_merged_values_round_trip():
    rng = random.Random(99)
    for _ in range(60):
        m = merge(*(random_value(rng) for _ in range(rng.randrange(1, 4))))
        assert_same(from_bytes(to_bytes(m)), m)


def test_big_endian_hosts_swap_bytes(monkeypatch):
    """Simulate a big-endian host: its file must be what a little-endian host reads."""
    s = rich_value()
    native = to_bytes(s)
    monkeypatch.setattr(sf, "_BIG_ENDIAN", True)
    swapped = to_bytes(s)
    assert_same(from_bytes(swapped), s)  # the swapping host reads its own file
    n = len(gzip.decompress(native)) - len(sections_of(s))
    body = gzip.decompress(swapped)[n:]
    col = array("I", body)
    col.byteswap()
    assert col.tobytes() == sections_of(s)  # what it wrote is the swap of its arrays
    assert native != swapped


def test_one_million_samples(tmp_path):
    """1M samples save and load; size and time are printed (run with -s), not asserted."""
    n = 1_000_000
    rng = random.Random(3)
    frames = [Frame(f"f{i}", f"mod{i % 50}.py", i, i + 1) for i in range(2000)]
    n_stacks = 3000
    stack_frame = [0] + [rng.randrange(len(frames)) for _ in range(1, n_stacks)]
    stack_parent = [0] + [rng.randrange(max(0, i - 50), i) for i in range(1, n_stacks)]
    threads = [ThreadInfo(i, f"t{i}", 100 + i, "thread", 0, 0.0, 0.0) for i in range(8)]
    thread_col = array("I", bytes(4 * n))
    for i in range(n):
        thread_col[i] = i & 7
    stack_col = array("I", (rng.randrange(n_stacks) for _ in range(n)))
    wall = array("I", (1000 + rng.randrange(-50, 400) for _ in range(n)))
    cpu = array("I", (max(0, 1000 + rng.randrange(-300, 100)) for _ in range(n)))
    marks = array("I", (rng.randrange(20) for _ in range(n)))
    wall[12345] = OVERFLOW
    s = Snapshots(frames=frames, stack_frame=stack_frame, stack_parent=stack_parent,
                  threads=threads, sample_thread=thread_col, sample_stack=stack_col,
                  sample_wall=wall, sample_cpu=cpu, sample_marks=marks,
                  wall_overflow={12345: 1 << 35}, custom_keys=["req"],
                  mark_sets=[()] + [((f"r{i}",),) for i in range(19)],
                  runs=[RunInfo(pid=1)])
    path = tmp_path / "big.stackshot"
    t0 = time.perf_counter()
    save(s, path)
    t1 = time.perf_counter()
    t = load(path)
    t2 = time.perf_counter()
    size = path.stat().st_size
    print(f"\n1M samples: {size} bytes ({size / n:.2f} B/sample), "
          f"save {t1 - t0:.2f} s, load {t2 - t1:.2f} s")
    assert t.sample_stack == s.sample_stack and t.sample_marks == s.sample_marks
    assert t.sample_wall == s.sample_wall and t.wall_overflow == s.wall_overflow
    assert t == s


# -- save refuses what it cannot write ----------------------------------------------------
class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


@pytest.mark.parametrize("over, where", [
    (dict(custom_keys=["k"], mark_sets=[(), ((Opaque(),),)]), r"mark_sets\[1\]\[0\]\[0\]: Opaque"),
    (dict(custom_keys=["k"], mark_sets=[(), ((b"bytes",),)]), r"mark_sets\[1\]\[0\]\[0\]: bytes"),
    (dict(custom_keys=["k"], mark_sets=[(), (({"a": 1},),)]), r"mark_sets\[1\]\[0\]\[0\]: dict"),
    (dict(custom_keys=["k"], mark_sets=[(), (((1, {2}),),)]), r"mark_sets\[1\]\[0\]\[0\]\[1\]: set"),
    (dict(custom_keys=[frozenset()]), r"custom_keys\[0\]: frozenset"),
    (dict(runs=[RunInfo(extra={"lock": threading.Lock()})]), r"runs\[0\]\.extra\['lock'\]: lock"),
    (dict(runs=[RunInfo(extra={1: "int key"})]), r"runs\[0\]\.extra: dict key 1 is a int"),
    (dict(runs=[RunInfo(custom_keys=(Opaque(),))]), r"runs\[0\]\.custom_keys\[0\]: Opaque"),
    (dict(runs=["not a run"]), r"runs\[0\] is a str, not a RunInfo"),
    (dict(runs=[RunInfo(pid="12")]), r"runs\[0\]\.pid"),
    (dict(frames=[Frame(1, "a.py", 1, 1)]), r"frames\[0\]"),
    (dict(frames=[Frame("f", "a.py", True, 1)]), r"frames\[0\]"),
    (dict(custom_keys=["k"], mark_sets=[(), ((10**5000,),)]), r"too large"),
])
def test_save_refuses_unrepresentable_values_before_writing(tmp_path, over, where):
    s = Snapshots(**over)
    target = tmp_path / "prof.stackshot"
    target.write_bytes(b"the previous good file")
    with pytest.raises(TypeError, match=where):
        save(s, target)
    assert target.read_bytes() == b"the previous good file"
    assert os.listdir(tmp_path) == ["prof.stackshot"]  # no temporary file left behind
    buf = io.BytesIO()
    with pytest.raises(TypeError):
        save(s, buf)
    assert buf.getvalue() == b""


def test_save_refuses_self_containing_values():
    extra: dict[str, Any] = {}
    extra["me"] = extra
    with pytest.raises(TypeError, match="contains itself"):
        to_bytes(Snapshots(runs=[RunInfo(extra=extra)]))
    nested: Any = "x"
    for _ in range(300):
        nested = (nested,)
    with pytest.raises(TypeError, match="nested too deeply"):
        to_bytes(Snapshots(custom_keys=[nested]))


def test_save_refuses_a_value_that_was_tampered_with_after_construction():
    s = small_value()
    s.sample_stack[0] = 99  # arrays are mutable; save checks again
    with pytest.raises(SnapshotError, match="stack that does not exist"):
        to_bytes(s)


def test_save_error_mid_write_leaves_no_half_file(tmp_path, monkeypatch):
    target = tmp_path / "p.stackshot"
    save(small_value(), target)
    good = target.read_bytes()

    def boom(*a: Any, **k: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(sf, "_write_stream", boom)
    with pytest.raises(OSError, match="disk full"):
        save(rich_value(), target)
    assert target.read_bytes() == good
    assert os.listdir(tmp_path) == ["p.stackshot"]


def test_save_argument_errors(tmp_path):
    with pytest.raises(TypeError, match="needs a Snapshots value"):
        save({"not": "snapshots"}, tmp_path / "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path or a binary file object"):
        save(small_value(), 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="binary file object"):
        save(small_value(), io.StringIO())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compresslevel"):
        save(small_value(), tmp_path / "x", compresslevel=12)
    with pytest.raises(IsADirectoryError):
        save(small_value(), str(tmp_path) + os.sep)
    with pytest.raises(TypeError, match="binary file object"):
        load(io.StringIO("text"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path or a binary file object"):
        load(3.5)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing")


def test_save_keeps_an_existing_files_mode_and_follows_symlinks(tmp_path):
    target = tmp_path / "p.stackshot"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    link = tmp_path / "link"
    link.symlink_to(target)
    save(small_value(), link)
    assert link.is_symlink()
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert load(target) == small_value()


def test_new_file_gets_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        save(small_value(), tmp_path / "new")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o644


def test_compresslevels_all_load():
    s = rich_value()
    for level in (0, 1, 9):
        buf = io.BytesIO()
        save(s, buf, compresslevel=level)
        assert from_bytes(buf.getvalue()) == s


# -- bad files: not ours, newer ---------------------------------------------------------
@pytest.mark.parametrize("data", [
    b"", b"hello world\n", b"\x1f", pickle.dumps({"a": 1}), bytes(range(256)),
    gzip.compress(b""), gzip.compress(b"some other gzip content\n" * 10),
    gzip.compress(b"STACKSHOT SNAPSHOX\nversion 1\n"),
])
def test_not_ours(data):
    assert "not a stackshot snapshot file" in load_error(data)


def test_pickle_file_is_not_executed(tmp_path):
    class Evil:
        def __reduce__(self):  # would create a file if unpickled
            return (open, (str(tmp_path / "pwned"), "w"))

    assert "not a stackshot snapshot file" in load_error(pickle.dumps(Evil()))
    assert "not a stackshot snapshot file" in load_error(gzip.compress(pickle.dumps(Evil())))
    assert not (tmp_path / "pwned").exists()


def test_newer_version_is_refused_by_name():
    msg = load_error(craft({}, version=7))
    assert msg == "written by format version 7; this stackshot reads up to 1"


def test_version_zero_and_bad_version_lines():
    assert "format version 0 does not exist" in load_error(craft({}, version=0))
    assert "bad version line" in load_error(gzip.compress(MAGIC + b"version one\n"))
    assert "bad version line" in load_error(gzip.compress(MAGIC + b"v" * 100 + b"\n"))
    assert "bad version line" in load_error(gzip.compress(MAGIC + b"version -1\n"))


def test_message_names_the_file(tmp_path):
    p = tmp_path / "junk.stackshot"
    p.write_bytes(b"junk")
    with pytest.raises(SnapshotError, match=r"junk\.stackshot: not a stackshot snapshot file"):
        load(p)


# -- bad files: truncated -----------------------------------------------------------------
def test_truncated_at_every_offset_of_the_file():
    data = to_bytes(rich_value(60))
    for cut in range(len(data)):
        msg = load_error(data[:cut])
        assert any(w in msg for w in ("truncated", "not a stackshot", "corrupt")), (cut, msg)
    assert from_bytes(data) == rich_value(60)


def test_truncated_content_at_every_offset_says_truncated():
    """Cut the uncompressed content (a well-formed gzip of a short stream)."""
    content = gzip.decompress(to_bytes(rich_value(60)))
    for cut in range(1, len(content)):
        msg = load_error(gzip.compress(content[:cut]))
        assert msg.startswith("truncated: "), (cut, msg)


def test_truncated_section_message():
    s = small_value()
    h = valid_header(s)
    body = sections_of(s)
    # stack_frame, stack_parent (8 bytes each), sample_thread, sample_stack (12 each) ...
    msg = load_error(craft(h, body[: 8 + 8 + 12 + 5]))
    assert msg == "truncated: section sample_stack needs 12 bytes, 5 remain"
    for sec in h["sections"][2:]:
        sec["length"] = 1_000_000
    msg = load_error(craft(h, body))
    assert msg == "truncated: section sample_thread needs 4000000 bytes, 48 remain"
    h["sections"][3]["length"] = 5  # inconsistent declarations are refused before reading
    assert "sample_stack (5), sample_wall (1000000)" in load_error(craft(h, body))


def test_truncated_header():
    msg = load_error(craft(b'{"frames": []}', header_len=5000))
    assert msg == "truncated: the header needs 5000 bytes, 14 remain"


# -- bad files: corrupt -------------------------------------------------------------------
def test_flipped_bytes_of_the_compressed_file():
    s = rich_value(60)
    data = to_bytes(s)
    rng = random.Random(5)
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= rng.randrange(1, 256)
        try:
            t = from_bytes(bytes(bad))
        except SnapshotError as e:
            assert "\n" not in str(e)
        else:  # gzip header fields nobody checks (mtime, xfl, os) or the final deflate
            assert t == s  # byte's padding bits: the CRC-checked content is unchanged


def test_flipped_bytes_of_the_content_never_escape_as_other_errors():
    """With a valid gzip CRC, a flipped content byte is either refused or gives some
    other valid value (a changed time delta cannot be detected), never a crash."""
    content = gzip.decompress(to_bytes(rich_value(60)))
    rng = random.Random(11)
    refused = 0
    for pos in range(len(content)):
        bad = bytearray(content)
        bad[pos] ^= 1 << rng.randrange(8)
        try:
            t = from_bytes(gzip.compress(bytes(bad)))
        except SnapshotError as e:
            assert "\n" not in str(e)
            refused += 1
        else:
            t.validate()
            list(t.samples())
    assert refused > 0


def test_trailing_data_is_refused():
    s = small_value()
    content = gzip.decompress(to_bytes(s))
    assert "unexpected data after the last section" in load_error(gzip.compress(content + b"\0"))
    assert "unexpected bytes after the compressed stream" in load_error(to_bytes(s) + b"garbage!")


def test_bad_checksum():
    data = bytearray(to_bytes(small_value()))
    data[-8] ^= 0xFF  # the CRC32 in the gzip trailer
    assert "corrupt: gzip check failed" in load_error(bytes(data))


# -- bad files: hostile headers -----------------------------------------------------------
def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def _tamper(**changes: Any) -> str:
    s = rich_value(10)
    h = valid_header(s)
    for key, value in changes.items():
        if value is KeyError:
            del h[key]
        else:
            h[key] = value
    return load_error(craft(h, sections_of(s)))


@pytest.mark.parametrize("changes, message", [
    (dict(frames=KeyError), "corrupt header: missing 'frames'"),
    (dict(frames={"0": 1}), "'frames' is not a list"),
    (dict(frames=[[1, "a.py", 1, 1]] * 4), r"frames\[0\] is not \[name, filename"),
    (dict(frames=[["f", "a.py", 1]] * 4), r"frames\[0\]"),
    (dict(frames=[["f", "a.py", 1.5, 1]] * 4), r"frames\[0\]"),
    (dict(frames=[["f", "a.py", True, 1]] * 4), r"frames\[0\]"),
    (dict(threads=[[0, "t", None, "thread", "0", 0.0, 0.0]]), r"threads\[0\] is not"),
    (dict(threads=[[0, "t", None, "thread", 0, None, 0.0]]), r"threads\[0\] is not"),
    (dict(runs=[{"pid": "1"}]), r"runs\[0\]\.pid is '1', not a 64-bit integer"),
    # issue 10, item 9: values json accepts but the consumers cannot handle
    (dict(runs=[{"process_cpu": math.nan}]), r"runs\[0\]\.process_cpu is nan, not a finite number"),
    (dict(runs=[{"requested_delay": -math.inf}]), r"runs\[0\]\.requested_delay is -inf"),
    (dict(runs=[{"achieved_rate": 10**400}]), r"runs\[0\]\.achieved_rate is 9*1000+\.\.\., not a finite"),
    (dict(runs=[{"duration": 1e300}]), r"runs\[0\]\.duration is 1e\+300"),
    (dict(runs=[{"ticks": 2**63}]), r"runs\[0\]\.ticks is \d+, not a 64-bit integer"),
    (dict(runs=[{"extra": {"x": _nested(70)}}]),
     "nested more than 64 levels deep"),
    (dict(threads=[[0, "t", None, "thread", 0, math.nan, 0.0]]), r"threads\[0\] is not"),
    (dict(threads=[[0, "t", None, "thread", 0, 0.0, math.inf]]), r"threads\[0\] is not"),
    (dict(threads=[[10**3999, "t", None, "thread", 0, 0.0, 0.0]]), r"^corrupt header: threads\[0\] is not .{,60}$"),
    (dict(threads=[[0, "t", -2**63 - 1, "thread", 0, 0.0, 0.0]]), r"threads\[0\] is not"),
    (dict(frames=[["f", "a.py", 2**64, 1]] * 4), r"frames\[0\]"),
    (dict(cpu_overflow=[[3, 10**40]]), r"cpu_overflow holds \[3, 1000.*64-bit integers"),
    (dict(runs=[{"achieved_rate": "fast"}]), r"runs\[0\]\.achieved_rate"),
    (dict(runs=[{"stopped": 1}]), r"runs\[0\]\.stopped"),
    (dict(runs=[{"extra": []}]), r"runs\[0\]\.extra"),
    (dict(runs=[{"custom_keys": [{"a": 1}]}]), r"runs\[0\]\.custom_keys\[0\] holds a JSON object"),
    (dict(runs=["run"]), r"runs\[0\] is not an object"),
    (dict(custom_keys="abc"), "'custom_keys' is not a list"),
    (dict(custom_keys=[{"k": 1}, 1, 2]), r"custom_keys\[0\] holds a JSON object"),
    (dict(mark_sets=[[], 5]), r"mark_sets\[1\] is not a list"),
    (dict(mark_sets=[[], [5]]), r"mark_sets\[1\]\[0\] is not a list"),
    (dict(mark_sets=[[], [[[{"x": 1}], 1, 2]]]), r"mark_sets\[1\]\[0\] holds a JSON object"),
    (dict(mark_sets=[[], [["a"]], [], [], []]), "inconsistent: mark set 1 has an entry of 1 values"),
    (dict(mark_sets=[[["a", 1, 2]], [], [], [], []]), "inconsistent: mark set 0 must be the empty set"),
    (dict(wall_overflow=[[1]]), "wall_overflow holds"),
    (dict(wall_overflow=[["1", 5]]), "wall_overflow holds"),
    (dict(wall_overflow=[[3, 5], [3, 6]]), "names sample 3 twice"),
    (dict(wall_overflow=[[10**9, 5]]), "inconsistent: bad wall overflow entry"),
    (dict(cpu_overflow=[[0, -5]]), "inconsistent: bad cpu overflow entry"),
    (dict(sections={}), "'sections' is not a list"),
    (dict(sections=[]), "missing section"),
    (dict(sections=[1]), "has no name"),
])
def test_hostile_headers(changes, message):
    assert re.search(message, _tamper(**changes))


def test_hostile_sections():
    s = small_value()
    body = sections_of(s)

    def with_sections(mutate) -> str:
        h = valid_header(s)
        mutate(h["sections"])
        return load_error(craft(h, body))

    assert "unknown section 'evil'" in with_sections(lambda x: x.append({"name": "evil", "typecode": "I", "length": 0}))
    assert "listed twice" in with_sections(lambda x: x.append(dict(x[0])))
    assert "typecode 'd'" in with_sections(lambda x: x[0].update(typecode="d"))
    assert "impossible length -1" in with_sections(lambda x: x[0].update(length=-1))
    assert "impossible length '2'" in with_sections(lambda x: x[0].update(length="2"))
    assert "impossible length" in with_sections(lambda x: x[0].update(length=1 << 40))
    assert "missing section(s) sample_cpu" in with_sections(lambda x: x.pop(5))


def test_ids_out_of_range_are_refused():
    s = small_value()
    h = valid_header(s)

    def with_column(name: str, values: list[int]) -> str:
        t = {n: getattr(s, n) for n in sf.ARRAY_SECTIONS if getattr(s, n) is not None}
        t[name] = array("I", values)
        hh = json.loads(json.dumps(h))
        for sec in hh["sections"]:
            sec["length"] = len(t[sec["name"]])
        return load_error(craft(hh, b"".join(t[n].tobytes() for n in t)))

    assert "stack that does not exist" in with_column("sample_stack", [1, 1, 7])
    assert "thread that does not exist" in with_column("sample_thread", [0, 0, 5])
    assert "sample_wall (2), sample_cpu (3) differ in length" in with_column("sample_wall", [0, 1])
    assert "names frame 4" in with_column("stack_frame", [0, 4])
    # a cycle in the trie would make stack() loop forever: it is refused
    assert "has parent 1, not an earlier stack" in with_column("stack_parent", [0, 1])
    assert "at least the empty stack" in with_column("stack_frame", [])
    assert "stack_frame (3), stack_parent (2) differ" in with_column("stack_frame", [0, 0, 0])


def test_header_json_problems():
    assert "header is not valid JSON" in load_error(craft(b"{not json"))
    assert "header is not valid JSON" in load_error(craft(b"\xff\xfe{}"))
    assert "corrupt header: not a JSON object" in load_error(craft([1, 2]))
    assert "header is not valid JSON" in load_error(craft(b"[" * 100_000 + b"]" * 100_000))
    assert "header is not valid JSON" in load_error(craft(b'{"frames": [' + b"9" * 100_000 + b"]}"))
    assert "bad header line" in load_error(gzip.compress(MAGIC + b"version 1\nheader x\n"))
    assert "bad header line" in load_error(gzip.compress(MAGIC + b"version 1\nheader 1" + b"0" * 40))
    msg = load_error(craft(b"{}", header_len=10**12))
    assert "header declares 1000000000000 bytes, more than the limit" in msg


def test_huge_declared_lengths_do_not_allocate():
    """A file of a few hundred bytes that declares 16 GiB of samples fails fast and small."""
    s = small_value()
    h = valid_header(s)
    for sec in h["sections"]:
        if sec["name"].startswith("sample_"):  # consistent lengths: only the bytes are missing
            sec["length"] = (1 << 32) - 1
    data = craft(h, sections_of(s))
    hostile_header = craft(b"{}", header_len=(1 << 30) - 1)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        msg = load_error(data)
        msg2 = load_error(hostile_header)
        with pytest.raises(SnapshotError) as raised:  # past the limit: only real bytes cost
            load(io.BytesIO(data), limit=1 << 40)
        with pytest.raises(SnapshotError) as raised2:
            load(io.BytesIO(hostile_header), limit=1 << 40)
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert msg.startswith("too large to load: the header and 68,719,476,736 bytes of sections")
    assert msg2.startswith("too large to load: a header of 1073741823 bytes")
    assert "STACKSHOT_LOAD_LIMIT_MB=<MB> or load(..., limit=<bytes>)" in msg
    assert str(raised.value).startswith("truncated: section sample_thread needs 17179869180 bytes")
    assert str(raised2.value).startswith("truncated: the header needs 1073741823 bytes, 2 remain")
    assert peak < 64 << 20, peak
    assert elapsed < 30  # generous: only guards against a hang


def test_errors_are_snapshot_errors_and_value_errors():
    with pytest.raises(ValueError):
        from_bytes(b"nope")
