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

from .model import UNITS, Edge, Node, Profile

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
            raise ProfileFormatError(f"not JSON: {e}") from None
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
    if extra.get("version", VERSION) > VERSION:
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
        nodes.append(Node(n.get("id"), n.get("src"), frame=_frame(frame) if frame else None,
                          thread_ids=list(n.get("thread_ids") or []),
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
                raise ProfileFormatError(f"{where}: {end} {k!r} is not a node position "
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
            raise ProfileFormatError(f"node {n.name!r} lists a caller twice")

    unit = extra.get("unit", "ms")  # Racket's profiles are in milliseconds
    if unit not in UNITS:
        raise ProfileFormatError(f"unknown unit {unit!r}")
    thread_times = {}
    for k, t in enumerate(_list(j, "thread_times")):
        thread_times[t["id"]] = _number(t, "time", f"thread_times[{k}]")
    names = {t["id"]: t["name"] for t in extra.get("thread_names", [])}
    sample_number = j.get("sample_number")
    if not isinstance(sample_number, int) or isinstance(sample_number, bool):
        raise ProfileFormatError(f"'sample_number' must be an integer, not {sample_number!r}")
    return Profile(_number(j, "total_time", "profile"), _number(j, "cpu_time", "profile"),
                   sample_number, thread_times, nodes[1:], nodes[0], thread_names=names,
                   weight=extra.get("weight", "cpu"),
                   granularity=extra.get("granularity", "function"),
                   interval=extra.get("interval", "midpoint"), unit=unit)


def _frame(f: Any) -> tuple:
    from sampler.snapshot import Frame

    if not isinstance(f, list) or len(f) != 4:
        raise ProfileFormatError(f"a node's frame is [name, filename, firstlineno, lineno], not {f!r:.80}")
    return Frame(*f)


def _list(obj: dict, key: str) -> list:
    v = obj.get(key)
    if not isinstance(v, list):
        raise ProfileFormatError(f"{key!r} must be a list, not {type(v).__name__}")
    return v


def _number(obj: dict, key: str, where: Any) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        where = f"node {where}" if isinstance(where, int) else where
        raise ProfileFormatError(f"{where}: {key!r} must be a finite number, not {v!r}")
    return v


def _num(x: Any) -> float:
    return float(x)


def _text(x: Any) -> Optional[str]:
    return None if x is None else (x if isinstance(x, str) else str(x))


def _plain(x: Any) -> Any:
    return x if isinstance(x, (int, str)) and not isinstance(x, bool) else str(x)


def _describe(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e)
