"""speedscope export: checked against the file format speedscope publishes.

The schema below is written from speedscope's file-format specification (the
TypeScript ``FileFormat`` namespace and the JSON schema generated from it): a file
has ``$schema``, ``shared.frames`` and ``profiles``; a sampled profile has a name,
a unit from a fixed list, start and end values, ``samples`` (lists of frame
indices) and as many ``weights``.  What a JSON schema cannot say (indices in range,
equal lengths, end >= start) is checked in :func:`check_semantics`.
"""

from __future__ import annotations

import json

import pytest

from analyzer.exports import ExportError, to_speedscope, write_speedscope
from analyzer.exports.speedscope import SCHEMA_URL
from export_builders import build, two_threads
from export_consumers import need_module


NUMBER = {"type": "number"}
UNITS = ["none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"]
SPEEDSCOPE_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": SCHEMA_URL},
        "name": {"type": "string"},
        "exporter": {"type": "string"},
        "activeProfileIndex": {"type": ["number", "null"]},
        "shared": {
            "type": "object",
            "required": ["frames"],
            "properties": {"frames": {"type": "array", "items": {"$ref": "#/definitions/frame"}}},
        },
        "profiles": {"type": "array", "items": {"oneOf": [
            {"$ref": "#/definitions/sampled"}, {"$ref": "#/definitions/evented"}]}},
    },
    "definitions": {
        "frame": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "file": {"type": "string"},
                           "line": NUMBER, "col": {"type": ["number", "null"]}},
        },
        "sampled": {
            "type": "object",
            "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {
                "type": {"const": "sampled"},
                "name": {"type": "string"},
                "unit": {"enum": UNITS},
                "startValue": NUMBER,
                "endValue": NUMBER,
                "samples": {"type": "array", "items": {"type": "array", "items": NUMBER}},
                "weights": {"type": "array", "items": NUMBER},
            },
        },
        "evented": {
            "type": "object",
            "required": ["type", "name", "unit", "startValue", "endValue", "events"],
            "properties": {"type": {"const": "evented"}},
        },
    },
}


def check_semantics(doc: dict) -> None:
    n_frames = len(doc["shared"]["frames"])
    for p in doc["profiles"]:
        assert len(p["samples"]) == len(p["weights"]), "speedscope rejects unequal lengths"
        assert p["endValue"] >= p["startValue"]
        for stack in p["samples"]:
            assert all(isinstance(i, int) and 0 <= i < n_frames for i in stack)
    if doc.get("activeProfileIndex") is not None and doc["profiles"]:
        assert 0 <= doc["activeProfileIndex"] < len(doc["profiles"])


def load_valid(text: str) -> dict:
    doc = json.loads(text)
    need_module("jsonschema").validate(doc, SPEEDSCOPE_SCHEMA)
    check_semantics(doc)
    return doc


def test_one_sampled_profile_per_thread_with_the_analyzers_weights():
    doc = load_valid(to_speedscope(two_threads()))
    names = [f["name"] for f in doc["shared"]["frames"]]
    main, worker = doc["profiles"]
    assert main["name"].startswith("MainThread") and worker["name"].startswith("worker")
    stacks = [[names[i] for i in s] for s in main["samples"]]
    assert stacks == [["main", "work"], ["main", "work"], ["main", "work", "inner"],
                      ["main", "helper"], ["main", "helper"]]  # time order, outermost first
    assert main["weights"] == pytest.approx([0.0] + [0.01] * 4)  # 'end': the first sample ends no interval
    assert main["unit"] == "seconds" and main["endValue"] == pytest.approx(0.04)
    # the worker's idle sample (no frames) is left out; its first sample weighs 0
    assert [[names[i] for i in s] for s in worker["samples"]] == [["run", "serve"]] * 2
    assert worker["weights"] == pytest.approx([0.0, 0.01])
    assert doc["activeProfileIndex"] == 0  # the heaviest thread opens first


def test_wall_clock_weights():
    doc = load_valid(to_speedscope(two_threads(), clock="wall"))
    assert doc["profiles"][1]["weights"] == pytest.approx([0.0, 0.01])


def test_frames_are_functions_with_file_and_first_line():
    snaps = build([("t", [("f", "/src/m.py", 3, 5)], 0, 0), ("t", [("f", "/src/m.py", 3, 9)], 0.1, 0.1)])
    doc = load_valid(to_speedscope(snaps))
    assert doc["shared"]["frames"] == [{"name": "f", "file": "/src/m.py", "line": 3}]
    assert doc["profiles"][0]["samples"] == [[0], [0]]  # two lines, one function


def test_empty_snapshots_give_a_valid_file_with_no_profiles():
    doc = load_valid(to_speedscope(build([])))
    assert doc["profiles"] == [] and doc["shared"]["frames"] == []


def test_hostile_names_survive_as_data(tmp_path):
    evil = '</script><script>alert("x")</script>'
    snaps = build([("t", [(evil, "a\"b.py", 1, 1)], 0, 0), ("t", [(evil, "a\"b.py", 1, 1)], 1, 1)])
    path = write_speedscope(snaps, tmp_path / "p.speedscope.json")
    doc = load_valid(path.read_text(encoding="utf-8"))
    assert doc["shared"]["frames"][0]["name"] == evil


def test_unknown_clock_is_a_clear_error():
    with pytest.raises(ValueError, match="clock must be one of 'cpu', 'wall'"):
        to_speedscope(two_threads(), clock="gpu")


def test_unwritable_path_names_path_and_reason(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "p.json"
    with pytest.raises(ExportError) as err:
        write_speedscope(two_threads(), target)
    assert str(target) in str(err.value) and "No such file or directory" in str(err.value)
