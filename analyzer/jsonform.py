"""A profile as JSON and back: Racket's ``profile->json`` / ``json->profile`` format.

The layout is Racket's, so tools written for Racket's JSON read ours:
``total_time``, ``cpu_time``, ``sample_number``, ``thread_times`` (a list of
``{"id", "time"}``), ``nodes`` (the root first), each node with ``id``, ``src``,
``thread_ids``, ``total``, ``self`` and ``callers`` / ``callees`` lists of edges
``{"total", "caller", "caller_time", "callee", "callee_time"}`` whose ends are
positions in ``nodes``.  What Racket's format lacks rides in extra keys its reader
ignores: ``frame`` per node and a ``stackshot`` object (format version, weight,
granularity, interval, unit, thread names).

Round trip is lossless for snapshot-based profiles (ids and srcs are strings, times
floats).  Raw-shape names or sources that are not strings are written as text.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional, Union

from .model import BYTE_UNITS, UNITS, Edge, Node, Profile
from .analyze import GRANULARITIES
from .weights import CLOCKS, INTERVALS

FORMAT = "stackshot-profile"
VERSION = 1


class ProfileFormatError(ValueError):
    """A JSON profile is malformed; the message says where."""


def profile_to_json(profile: Profile) -> dict[str, Any]:
    """Plain data (dicts, lists, strings, numbers) for ``json.dumps``."""
    nodes = [profile.root, *profile.nodes]
    position = {n: i for i, n in enumerate(nodes)}

    def edge(e: Edge) -> dict[str, Any]:
        return {"total": _num(e.total), "caller": position[e.caller],
                "caller_time": _num(e.caller_time), "callee": position[e.callee],
                "callee_time": _num(e.callee_time)}

    return {
        "total_time": _num(profile.total_time),
        "cpu_time": _num(profile.cpu_time),
        "sample_number": profile.sample_number,
        "thread_times": [{"id": _plain(t), "time": _num(v)} for t, v in profile.thread_times.items()],
        "nodes": [
            {"id": _text(n.id), "src": _text(n.src), "thread_ids": [_plain(t) for t in n.thread_ids],
             "total": _num(n.total), "self": _num(n.self),
             "callers": [edge(e) for e in n.callers], "callees": [edge(e) for e in n.callees],
             "frame": None if n.frame is None else list(n.frame)}
            for n in nodes
        ],
        "stackshot": {
            "format": FORMAT, "version": VERSION, "weight": profile.weight,
            "granularity": profile.granularity, "interval": profile.interval,
            "unit": profile.unit,
            "thread_names": [{"id": _plain(t), "name": str(v)} for t, v in profile.thread_names.items()],
        },
    }


def json_to_profile(data: Union[dict[str, Any], str, bytes]) -> Profile:
    """The :class:`Profile` of :func:`profile_to_json`'s output, or of Racket's.

    Accepts the decoded value or JSON text.  A malformed value raises
    :class:`ProfileFormatError` saying which field is wrong.
    """
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError as e:
            raise ProfileFormatError(f"not JSON: {_one_line(e)}") from None
        except RecursionError:
            raise ProfileFormatError("not JSON this reader accepts: nested too deeply") from None
    try:
        return _read(data)
    except (KeyError, TypeError, IndexError, ValueError) as e:
        if isinstance(e, ProfileFormatError):
            raise
        raise ProfileFormatError(f"bad profile JSON: {_describe(e)}") from None


def _read(j: Any) -> Profile:
    if not isinstance(j, dict):
        raise ProfileFormatError(f"a profile is a JSON object, not {type(j).__name__}")
    extra = j.get("stackshot") or {}
    if not isinstance(extra, dict):
        raise ProfileFormatError(f"'stackshot' must be an object, not {type(extra).__name__}")
    version = extra.get("version", VERSION)
    if not _is_int(version):
        raise ProfileFormatError(f"'stackshot.version' must be an integer, not {_short(version)}")
    if version > VERSION:
        raise ProfileFormatError(f"profile format version {extra['version']} is newer than "
                                 f"this stackshot reads ({VERSION})")
    raw_nodes = _list(j, "nodes")
    if not raw_nodes:
        raise ProfileFormatError("'nodes' must hold at least the root node")
    nodes: list[Node] = []
    for i, n in enumerate(raw_nodes):
        if not isinstance(n, dict):
            raise ProfileFormatError(f"node {i} is not an object")
        frame = n.get("frame")
        nodes.append(Node(_str_or_none(n, "id", i), _str_or_none(n, "src", i),
                          frame=_frame(frame) if frame else None,
                          thread_ids=[_thread_id(t, f"node {i}'s thread_ids") for t in
                                      _list(n, "thread_ids", default=[])],
                          total=_number(n, "total", i), self_time=_number(n, "self", i),
                          is_root=(i == 0)))
    count = len(nodes)
    edges: dict[tuple[int, int], Edge] = {}

    def edge(e: Any, where: str) -> tuple[Edge, bool]:
        if not isinstance(e, dict):
            raise ProfileFormatError(f"{where} is not an object")
        ends = []
        for end in ("caller", "callee"):
            k = e.get(end)
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < count:
                raise ProfileFormatError(f"{where}: {end} {_short(k)} is not a node position "
                                         f"(0..{count - 1})")
            ends.append(k)
        key = (ends[0], ends[1])
        got = edges.get(key)
        if got is not None:
            return got, False
        got = edges[key] = Edge(_number(e, "total", where), nodes[ends[0]],
                                _number(e, "caller_time", where), nodes[ends[1]],
                                _number(e, "callee_time", where))
        return got, True

    for i, n in enumerate(raw_nodes):
        for k, e in enumerate(_list(n, "callees")):
            got, new = edge(e, f"node {i} callee {k}")
            if new:
                got.caller.callees.append(got)
    for i, n in enumerate(raw_nodes):
        for k, e in enumerate(_list(n, "callers")):
            got, new = edge(e, f"node {i} caller {k}")
            if new:  # only in a callers list (Racket's merge can write that): keep both ends
                got.caller.callees.append(got)
            got.callee.callers.append(got)
    for n in nodes:  # the edges lists were written sorted; a stable sort keeps that order
        n.callers.sort(key=lambda e: e.caller_time, reverse=True)
        n.callees.sort(key=lambda e: e.callee_time, reverse=True)
        if len({id(e) for e in n.callers}) != len(n.callers):
            raise ProfileFormatError(f"node {_short(n.name)} lists a caller twice")

    unit = extra.get("unit", "ms")  # Racket's profiles are in milliseconds
    if unit not in UNITS and unit not in BYTE_UNITS:
        raise ProfileFormatError(f"unknown unit {_short(unit)}")
    thread_times = {}
    for k, t in enumerate(_list(j, "thread_times")):
        where = f"thread_times[{k}]"
        if not isinstance(t, dict):
            raise ProfileFormatError(f"{where} is not an object")
        thread_times[_thread_id(t["id"], where)] = _number(t, "time", where)
    names = {}
    for k, t in enumerate(_list(extra, "thread_names", default=[])):
        where = f"thread_names[{k}]"
        if not (isinstance(t, dict) and isinstance(t.get("name"), str)):
            raise ProfileFormatError(f"{where} is not an object with a string name")
        names[_thread_id(t["id"], where)] = t["name"]
    sample_number = j.get("sample_number")
    if not _is_int(sample_number) or sample_number < 0:
        raise ProfileFormatError(f"'sample_number' must be a whole number, not {_short(sample_number)}")
    choices = {}
    for key, default, valid in (("weight", "cpu", CLOCKS), ("granularity", "function", GRANULARITIES),
                                ("interval", "midpoint", INTERVALS)):
        choices[key] = extra.get(key, default)
        if choices[key] not in valid:
            raise ProfileFormatError(f"'stackshot.{key}' must be one of {', '.join(valid)}, "
                                     f"not {_short(choices[key])}")
    return Profile(_number(j, "total_time", "profile"), _number(j, "cpu_time", "profile"),
                   sample_number, thread_times, nodes[1:], nodes[0], thread_names=names,
                   unit=unit, **choices)


def _frame(f: Any) -> tuple:
    from sampler.snapshot import Frame

    if not (isinstance(f, list) and len(f) == 4 and isinstance(f[0], str) and isinstance(f[1], str)
            and _is_int(f[2]) and (f[3] is None or _is_int(f[3]))):
        raise ProfileFormatError(f"a node's frame is [name, filename, firstlineno, lineno], "
                                 f"not {_short(f)}")
    return Frame(*f)


def _list(obj: dict, key: str, default: Optional[list] = None) -> list:
    v = obj.get(key, default)
    if not isinstance(v, list):
        raise ProfileFormatError(f"{key!r} must be a list, not {type(v).__name__}")
    return v


_INT64 = 1 << 63


def _is_int(v: Any) -> bool:
    """An integer within int64: what every consumer of a profile can handle."""
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64


def _number(obj: dict, key: str, where: Any) -> float:
    v = obj.get(key)
    if not (_is_int(v) or (isinstance(v, float) and math.isfinite(v))):
        where = f"node {where}" if isinstance(where, int) else where
        raise ProfileFormatError(f"{where}: {key!r} must be a finite number, not {_short(v)}")
    return v


def _str_or_none(obj: dict, key: str, i: int) -> Optional[str]:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise ProfileFormatError(f"node {i}: {key!r} must be a string or null, not {_short(v)}")
    return v


def _thread_id(v: Any, where: str) -> Any:
    """A thread id as written: an integer or a string (raw-shape ids are written as text)."""
    if not (_is_int(v) or isinstance(v, str)):
        raise ProfileFormatError(f"{where}: a thread id is an integer or a string, not {_short(v)}")
    return v


def _short(v: Any) -> str:
    """A value for a one-line message: its type for containers, its repr cut short."""
    if isinstance(v, (list, dict)):
        return f"a JSON {'array' if isinstance(v, list) else 'object'}"
    if isinstance(v, int) and not isinstance(v, bool) and not _is_int(v):
        return f"an integer of {len(str(abs(v)))} digits" if v.bit_length() < 13_000 else "a huge integer"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _num(x: Any) -> float:
    return float(x)


def _text(x: Any) -> Optional[str]:
    return None if x is None else (x if isinstance(x, str) else str(x))


def _plain(x: Any) -> Any:
    return x if isinstance(x, (int, str)) and not isinstance(x, bool) else str(x)


def _describe(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing field {_short(e.args[0])}"
    return str(e)
