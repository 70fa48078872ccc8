"""Writing an output file so that a failure never destroys what was there.

Every file stackshot writes -- a saved snapshot (``-o``, :meth:`Snapshots.save`), a
rendered profile (``--render-to``), an export -- goes through :func:`write_atomically`:
the bytes go to a fresh temporary file in the same directory, which is flushed to disk
and renamed over the target only once it is complete.  ``open(path, 'wb')`` instead
truncates the old file first, so a render that then failed (a bad value, a full disk,
Ctrl-C) left a 0-byte file where a good profile had been.

Text is encoded by :func:`encode_text`: UTF-8, with what UTF-8 cannot hold (the lone
surrogates Python uses for undecodable bytes in file names) written as visible
``\\udcff`` escapes rather than failing with ``UnicodeEncodeError``.

This module lives in ``sampler`` (which imports nothing of ``analyzer``) so that both
packages share it.
"""

from __future__ import annotations

import os
import secrets
from typing import IO, Callable, Optional, Union

__all__ = ["write_atomically", "encode_text"]

Data = Union[str, bytes, Callable[[IO[bytes]], None]]


def encode_text(text: str) -> bytes:
    """``text`` as UTF-8; lone surrogates become ``\\udcXX`` escapes instead of errors."""
    return text.encode("utf-8", "backslashreplace")


def write_atomically(path: Union[str, "os.PathLike[str]"], data: Data) -> None:
    """Replace ``path`` with ``data`` (bytes, text, or a function writing to a binary file).

    The temporary file is created with mode ``0o666`` so the process umask applies, as
    it would to ``open(path, 'wb')``; an existing target's mode is kept, and a symlink
    keeps pointing where it did (the file it points to is replaced).  On any failure,
    including ``KeyboardInterrupt``, the temporary file is removed and ``path`` is left
    as it was; the exception propagates.
    """
    target = os.fsdecode(os.fspath(path))
    if os.path.islink(target):
        target = os.path.realpath(target)
    directory, base = os.path.split(target)
    if not base:
        raise IsADirectoryError(21, "Is a directory", target)
    try:
        mode: Optional[int] = os.stat(target).st_mode & 0o7777
    except OSError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory or ".", f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 48 random bits
        raise FileExistsError(17, "could not create a temporary file beside it", target)
    try:
        with os.fdopen(fd, "wb") as raw:
            if isinstance(data, str):
                raw.write(encode_text(data))
            elif isinstance(data, (bytes, bytearray, memoryview)):
                raw.write(data)
            else:
                data(raw)
            raw.flush()
            os.fsync(raw.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
