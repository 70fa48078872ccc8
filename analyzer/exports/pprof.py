"""pprof: a gzipped ``perftools.profiles.Profile`` protocol buffer, encoded by hand.

Read by ``go tool pprof`` (``go tool pprof -top FILE``, or ``-http=:8080 FILE`` for its
web UI) and accepted by continuous-profiling servers (Pyroscope, Grafana).  The
encoder is the few dozen lines below rather than a protobuf dependency, since
stackshot's only runtime dependency is greenlet.

Mapping to the format: a ``Function`` per Python function, a ``Location`` per
(function, line) so pprof can show lines, and one ``Sample`` per distinct
(stack, thread, marks) with three values, ``samples/count``, ``cpu/nanoseconds``
and ``wall/nanoseconds`` (the analyzer's per-sample weights); for allocation samples
(``sampler.memprof``) Go's heap profile types instead: ``samples/count`` (sampled
blocks), ``alloc_space/bytes`` (estimated bytes allocated) and ``inuse_space/bytes``
(estimated bytes still live when the profile stopped).  Each sample carries
labels ``thread`` (name), ``thread_id`` (its small id, as text: pprof drops a
numeric label of 0) and, per custom key, the innermost
mark value (``go tool pprof -tagfocus=thread=worker``); a greenlet's samples also
carry ``greenlet`` (its name).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any, Iterable

from sampler.snapshot import Snapshots

from ._common import PathLike, _check_clock, check_snapshots, is_memory, sample_weights, write_output

# -- the protobuf wire format (only what profile.proto needs) --------------------


def _varint(n: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes, as protobuf says."""
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    """A varint field (wire type 0); zero is the default and is omitted."""
    return _varint(number << 3) + _varint(value) if value else b""


def _bytes_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): strings, messages, packed arrays."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _packed(number: int, values: Iterable[int]) -> bytes:
    payload = b"".join(_varint(v) for v in values)
    return _bytes_field(number, payload) if payload else b""


class _Strings:
    """The profile's string table: index 0 is the empty string, as the format requires."""

    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def _value_type(strings: _Strings, kind: str, unit: str) -> bytes:
    return _int_field(1, strings(kind)) + _int_field(2, strings(unit))


# -- the profile ----------------------------------------------------------------

_TIME_TYPES = [("samples", "count"), ("cpu", "nanoseconds"), ("wall", "nanoseconds")]
_MEMORY_TYPES = [("samples", "count"), ("alloc_space", "bytes"), ("inuse_space", "bytes")]
"""The sample types of an allocation profile: Go's heap profile names, so that
``go tool pprof -sample_index=inuse_space`` (or ``-inuse_space``) and Pyroscope know them."""


def _bytes_per_sample(runs: Any) -> int:
    from analyzer.memory import sampling_rates

    rates = sampling_rates(runs)
    word = struct.calcsize("P")
    return round(word / rates[0]) if rates and rates[0] > 0 else 0


def _mapping(s: _Strings, snapshots: Snapshots) -> bytes:
    """The one mapping every location points at: "the Python program".

    Its flags say functions, files and lines are already known, so pprof does not try
    to symbolize addresses (there are none) and names a main binary.
    """
    python = snapshots.runs[0].python if snapshots.runs and snapshots.runs[0].python else ""
    name = f"python {python}".strip()
    return (_int_field(1, 1) + _int_field(5, s(name))
            + _int_field(7, 1) + _int_field(8, 1) + _int_field(9, 1))


def to_pprof_proto(snapshots: Snapshots, *, clock: str = "cpu") -> bytes:
    """The uncompressed ``Profile`` message; :func:`to_pprof` gzips it for files."""
    check_snapshots(snapshots)
    _check_clock(clock)
    s = _Strings()
    out = bytearray()
    memory = is_memory(snapshots)
    types = _MEMORY_TYPES if memory else _TIME_TYPES
    to_unit = 1e6 if memory else 1e9  # weights are seconds, or bytes / 10**6
    for kind, unit in types:
        out += _bytes_field(1, _value_type(s, kind, unit))

    cpu = sample_weights(snapshots, "cpu")
    wall = sample_weights(snapshots, "wall")
    marks = snapshots.sample_marks
    agg: dict[tuple[int, int, int], list[float]] = {}
    for i, (tid, sid) in enumerate(zip(snapshots.sample_thread, snapshots.sample_stack)):
        if sid == 0:
            continue
        group = (sid, tid, 0 if marks is None else marks[i])
        row = agg.get(group)
        if row is None:
            agg[group] = [1, cpu[i], wall[i]]
        else:
            row[0] += 1
            row[1] += cpu[i]
            row[2] += wall[i]

    keys = snapshots.custom_keys
    used_frames: set[int] = set()
    for (sid, tid, mset), (count, c, w) in agg.items():
        frames = snapshots.stack(sid)  # innermost first: pprof's order too
        used_frames.update(frames)
        body = _packed(1, (f + 1 for f in frames))
        body += _packed(2, (int(count), round(c * to_unit), round(w * to_unit)))
        info = snapshots.threads[tid]
        labels = [_int_field(1, s("thread")) + _int_field(2, s(info.name)),
                  _int_field(1, s("thread_id")) + _int_field(2, s(str(tid)))]
        if info.kind == "greenlet":  # (-tagfocus=greenlet=NAME keeps greenlets only)
            labels.append(_int_field(1, s("greenlet")) + _int_field(2, s(info.name)))
        for k, mark_key in enumerate(keys):
            for entry in snapshots.mark_sets[mset]:  # innermost extent first
                if entry[k] is not None:
                    labels.append(_int_field(1, s(str(mark_key))) + _int_field(2, s(str(entry[k]))))
                    break
        for lab in labels:
            body += _bytes_field(3, lab)
        out += _bytes_field(2, body)

    function_ids: dict[Any, int] = {}
    functions = bytearray()
    locations = bytearray()
    for f in sorted(used_frames):
        frame = snapshots.frames[f]
        key = frame.function_key
        fid = function_ids.get(key)
        if fid is None:
            fid = function_ids[key] = len(function_ids) + 1
            name = s(frame.name)
            functions += _bytes_field(5, _int_field(1, fid) + _int_field(2, name) + _int_field(3, name)
                                      + _int_field(4, s(frame.filename))
                                      + _int_field(5, int(frame.firstlineno or 0)))
        line = _int_field(1, fid) + _int_field(2, int(frame.lineno or frame.firstlineno or 0))
        locations += _bytes_field(4, _int_field(1, f + 1) + _int_field(2, 1) + _bytes_field(4, line))
    out += _bytes_field(3, _mapping(s, snapshots)) + locations + functions

    runs = snapshots.runs
    comment = [s("stackshot sampled profile"),
               s(f"{len(snapshots)} samples, {len(snapshots.threads)} threads, {len(runs)} run(s)")]
    period_ns = round(runs[0].requested_delay * 1e9) if runs else 0
    period_type = ("cpu", "nanoseconds")
    if memory:  # the mean bytes between two sampled words: WORD_SIZE / rate
        period_type, period_ns = ("space", "bytes"), _bytes_per_sample(runs)
    start_ns = round(min(r.start_epoch for r in runs) * 1e9) if runs else 0
    duration_ns = round(sum(r.duration for r in runs) * 1e9) if runs else 0
    tail = _int_field(9, start_ns) + _int_field(10, duration_ns)
    tail += _bytes_field(11, _value_type(s, *period_type)) + _int_field(12, period_ns)
    tail += _packed(13, comment) + _int_field(14, s(types[1 if clock == "cpu" else 2][0]))
    for text in s.table:  # the string table goes last: everything above has added to it
        out += _bytes_field(6, text.encode("utf-8", "replace"))  # protobuf strings are UTF-8
    return bytes(out + tail)


def to_pprof(snapshots: Snapshots, *, clock: str = "cpu") -> bytes:
    """Gzipped profile.proto bytes; ``clock`` picks pprof's default sample type."""
    return gzip.compress(to_pprof_proto(snapshots, clock=clock), mtime=0)


def write_pprof(snapshots: Snapshots, path: PathLike, *, clock: str = "cpu") -> Path:
    """Write :func:`to_pprof` to ``path`` (conventionally ``*.pb.gz``)."""
    return write_output(path, to_pprof(snapshots, clock=clock))
