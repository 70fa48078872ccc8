"""Collapsed stacks: the line format flamegraph.pl and inferno parse.

Their reader splits each line at its *last* space into a stack and an integer
count, and the stack at ``;`` into frames, outermost first; these tests read the
export back by exactly that rule.
"""

from __future__ import annotations

import re

import pytest

from analyzer.exports import ExportError, to_collapsed, write_collapsed
from export_builders import build, two_threads

LINE = re.compile(r"^(?P<stack>[^\n]+) (?P<count>\d+)$")


def parse(text: str) -> dict[tuple[str, ...], int]:
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        assert m, f"not a collapsed line: {line!r}"
        out[tuple(m["stack"].split(";"))] = int(m["count"])
    return out


def names(stack: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f.split(" (")[0] for f in stack)


def test_microseconds_of_cpu_per_stack_outermost_first():
    got = {names(k): v for k, v in parse(to_collapsed(two_threads())).items()}
    assert got == {("main", "work"): 10000, ("main", "work", "inner"): 10000,
                   ("main", "helper"): 20000, ("run", "serve"): 10000}


def test_frames_read_name_file_and_first_line():
    text = to_collapsed(build([("t", [("f", "/src/m.py", 3, 5)], 0, 0), ("t", [("f", "/src/m.py", 3, 5)], 1, 1)]))
    assert text == "f (/src/m.py:3) 1000000\n"  # the one interval, to the sample ending it


def test_sample_counts_and_thread_roots():
    got = parse(to_collapsed(two_threads(), value="samples", threads=True))
    assert {names(k): v for k, v in got.items()} == {
        ("thread MainThread", "main", "work"): 2, ("thread MainThread", "main", "work", "inner"): 1,
        ("thread MainThread", "main", "helper"): 2, ("thread worker", "run", "serve"): 2}


def test_wall_time():
    got = {names(k): v for k, v in parse(to_collapsed(two_threads(), value="wall")).items()}
    assert got[("run", "serve")] == 10000  # the idle sample's 10 ms are nobody's


def test_separators_inside_names_cannot_split_frames_or_lines():
    odd = ("a;b\nc", "dir;x/m.py", 1, 1)
    text = to_collapsed(build([("t", [odd, "g"], 0, 0), ("t", [odd, "g"], 1, 1)]))
    (stack, count), = parse(text).items()
    assert len(stack) == 2 and count == 1_000_000


def test_empty_profile_is_empty_text():
    assert to_collapsed(build([])) == ""


def test_bad_value_is_a_clear_error():
    with pytest.raises(ValueError, match="value must be one of"):
        to_collapsed(two_threads(), value="bytes")


def test_path_that_is_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ExportError) as err:
        write_collapsed(two_threads(), tmp_path)
    assert str(tmp_path) in str(err.value) and "Is a directory" in str(err.value)
    assert err.value.filename == str(tmp_path) and err.value.errno is not None
