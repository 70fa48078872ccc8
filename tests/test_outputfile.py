"""``sampler.outputfile``: every output file is replaced whole or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from sampler.outputfile import encode_text, write_atomically


def test_a_writer_that_fails_half_way_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def writer(f):
        f.write(b"half of the new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, writer)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_text_bytes_and_writers_replace_the_file_keeping_its_mode_and_symlink(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_atomically(link, "new \udcff")
    assert target.read_bytes() == b"new \\udcff" and link.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    write_atomically(str(target), b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    write_atomically(target, lambda f: f.write(b"written"))
    assert target.read_bytes() == b"written"
    assert sorted(os.listdir(tmp_path)) == ["link.txt", "out.txt"]


def test_a_directory_is_not_a_file_name(tmp_path):
    with pytest.raises(IsADirectoryError):
        write_atomically(str(tmp_path) + os.sep, "x")


def test_encode_text_writes_lone_surrogates_as_escapes():
    assert encode_text("é\ud800") == "é".encode() + b"\\ud800"
