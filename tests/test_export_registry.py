"""The one registry of export formats that the command lines and the library share."""

from __future__ import annotations

import pytest

from analyzer.exports import FORMATS, ExportError, export, get_format, render
from export_builders import build, two_threads

NAMES = ["speedscope", "collapsed", "pstats", "pprof", "html"]


def test_every_format_is_registered():
    assert sorted(FORMATS) == sorted(NAMES)
    for name, fmt in FORMATS.items():
        assert fmt.name == name and fmt.extension.startswith(".") and fmt.description


@pytest.mark.parametrize("name", NAMES)
def test_render_and_export_agree(name, tmp_path):
    fmt = get_format(name)
    snaps = two_threads()
    content = render(snaps, name)
    assert isinstance(content, bytes if fmt.binary else str)
    path = export(snaps, name, tmp_path / f"out{fmt.extension}")
    written = path.read_bytes()
    assert written == (content if fmt.binary else content.encode("utf-8"))


@pytest.mark.parametrize("name", NAMES)
def test_every_format_exports_an_empty_profile(name, tmp_path):
    assert export(build([]), name, tmp_path / f"empty{get_format(name).extension}").exists()


@pytest.mark.parametrize("name", NAMES)
def test_every_format_reports_an_unwritable_path(name, tmp_path):
    bad = tmp_path / "missing-dir" / "out"
    with pytest.raises(ExportError) as err:
        export(two_threads(), name, bad)
    assert str(bad) in str(err.value) and "No such file or directory" in str(err.value)
    assert isinstance(err.value, OSError)


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown export format 'svg'; known formats: collapsed, html, pprof, pstats, speedscope"):
        get_format("svg")


def test_exporters_refuse_other_values():
    with pytest.raises(TypeError, match="Snapshots value, not dict"):
        render({}, "collapsed")


@pytest.mark.parametrize("name", NAMES)
def test_undecodable_file_names_do_not_break_an_export(name, tmp_path):
    odd = ("f", "/srv/caf\udce9.py", 1, 2)  # how Python spells a non-UTF-8 byte of a path
    snaps = build([("t", [odd], 0, 0), ("t", [odd], 1, 1)])
    assert export(snaps, name, tmp_path / f"odd{get_format(name).extension}").stat().st_size > 0
