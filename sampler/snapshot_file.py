"""Saving and loading :class:`~sampler.snapshot.Snapshots` in a safe, compact file.

Why this format
---------------
A profile file is something people mail each other, so loading one must never run
code (no pickle, no ``eval``), and a damaged or hostile file must fail with a short,
clear :class:`~sampler.snapshot.SnapshotError` rather than a traceback from deep
inside ``zlib`` or ``json``, a huge allocation, or a hang.  A run of a million
samples must also save and load in well under a second or two, so the bulky sample
columns are written as raw ``uint32`` bytes, not as JSON numbers.

Layout (format version 1)
-------------------------
The file is one gzip stream (written with ``mtime=0`` and no file name, so the same
value always gives the same bytes) whose uncompressed content is::

    STACKSHOT SNAPSHOT\\n          magic line: a file that is not ours is refused at once
    version 1\\n                   the format version, checked before anything else
    header <N>\\n                  byte length of the JSON header that follows
    <N bytes of JSON>             UTF-8 (in practice ASCII) object, see below
    <section bytes> ...           each section listed in the header, in that order

The JSON header holds ``frames``, ``threads``, ``runs``, ``mark_sets``,
``custom_keys``, ``wall_overflow`` and ``cpu_overflow`` (as ``[index, value]``
pairs), and ``sections``: a list of ``{"name", "typecode", "length"}`` objects, one per
``array('I')`` column of the value (``stack_frame``, ``stack_parent``,
``sample_thread``, ``sample_stack``, ``sample_wall``, ``sample_cpu`` and, when the
value has marks, ``sample_marks``).  Typecode ``"I"`` means unsigned 32-bit
little-endian integers; a section is ``4 * length`` bytes.  Unknown header keys are
ignored (room for additions that do not need a new version); unknown sections are
refused.

What survives a round trip
--------------------------
Everything in a :class:`Snapshots` value, exactly, when its mark values and custom
keys are JSON-representable: ``str``, ``int``, ``float`` (including ``inf`` and
``nan``), ``bool``, ``None``, and lists or tuples of these.  Lists and tuples come
back as **tuples** there, so that mark sets stay hashable (the recorder and
:func:`~sampler.snapshot.merge` use them as dict keys); a mark value that was a list
therefore compares unequal after loading.  In a run's ``extra`` dict any JSON value is
allowed (dicts need ``str`` keys), and tuples there come back as **lists**.  Anything
else (an object, ``bytes``, a set, a dict as a mark value, a dict with non-string
keys) makes :func:`save` raise :class:`TypeError` naming where it is, before anything
is written.  (``nan`` is kept, but a value holding it never compares equal, to itself
or to its reloaded copy.)

Safety of :func:`load`
----------------------
The magic line and version are checked before the header is parsed; the header is
parsed by ``json`` (with a cap on integer literal length) and then every field is
type-checked here, and the ids by :meth:`Snapshots.validate`.  Declared lengths are
capped and cross-checked before any section is read, and sections are read in bounded
chunks, so memory grows only with bytes that are really in the file.  (Like any
compressed format, a file may still legitimately expand ~1000-fold: a 6 MB file can
hold the 20 MB of a million samples, and a hostile one could hold gigabytes.)
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import os
import re
import sys
import zlib
from array import array
from typing import IO, Any, Callable, NoReturn, Optional, Union

from .outputfile import write_atomically
from .snapshot import FORMAT_VERSION, Frame, RunInfo, SnapshotError, Snapshots, ThreadInfo

__all__ = ["save", "load", "load_limit", "MAGIC", "DEFAULT_COMPRESSLEVEL", "DEFAULT_LOAD_LIMIT",
           "LOAD_LIMIT_ENV"]

MAGIC = b"STACKSHOT SNAPSHOT\n"
"""First line of the uncompressed stream: how a file is recognised as ours."""

DEFAULT_COMPRESSLEVEL = 3
"""zlib level used by :func:`save`.  Measured on 20 MB of synthetic 1M-sample columns:
level 1 gives 7.3 MB in 0.3 s, level 3 6.7 MB in 0.5 s, level 6 6.4 MB in 3 s and
level 9 6.0 MB in 29 s (zlib's lazy matching, from level 4 up, is slow on this data)."""

ARRAY_SECTIONS = (
    "stack_frame", "stack_parent", "sample_thread", "sample_stack", "sample_wall",
    "sample_cpu", "sample_marks",
)
"""The ``array('I')`` attributes of :class:`Snapshots` that are stored as sections."""
_OPTIONAL_SECTIONS = frozenset({"sample_marks"})

_ITEMSIZE = 4  # typecode "I" in the file is always 4 bytes, little-endian
_MAX_HEADER_BYTES = 1 << 30  # far above any real header; refuses absurd declarations

DEFAULT_LOAD_LIMIT = 1 << 30
"""What :func:`load` may allocate for one file, in bytes (1 GiB), unless told otherwise.

A compressed file can expand ~1000-fold, and a JSON header of ``[],[],...`` becomes
~20 times its size in Python objects: before this limit a 117 KB file took 3.2 GB
and a 1 MB file 1.1 GB.  The cost of a file is known before it is paid -- the header's
parsed size is estimated from its length and its count of JSON values, the sections'
from their declared lengths (4 bytes an entry) -- and a file costing more is refused
with a one-line :class:`SnapshotError` that says how to raise the limit: pass
``limit=`` to :func:`load`, or set the environment variable ``STACKSHOT_LOAD_LIMIT_MB``
(which ``python -m analyzer`` and notebooks honour too).  A million samples cost
about 20 MB, so the default admits some fifty million."""
LOAD_LIMIT_ENV = "STACKSHOT_LOAD_LIMIT_MB"
_CONTAINER_COST = 160  # bytes a parsed JSON array/object may cost, parsed and then converted
_VALUE_COST = 100  # bytes a parsed JSON value (after a ',' or ':') may cost, likewise
_MAX_SECTION_LENGTH = (1 << 32) - 1  # ids are 32-bit, so no column can usefully be longer
_CHUNK = 1 << 22  # bounded reads: memory grows only as bytes actually arrive
_MAX_INT_DIGITS = 4000  # longest int literal load accepts: below CPython's limit (4300)
_MAX_INT_BITS = 12_000  # longest int save accepts: about 3600 digits, safely under that

_BIG_ENDIAN = sys.byteorder == "big"
"""Whether arrays must be byte-swapped to and from the file's little-endian order.
A module attribute (read at call time) so tests can exercise the swapping path."""

PathOrFile = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]", IO[bytes]]


# ----------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------
def save(snapshots: Snapshots, path: PathOrFile, *,
         compresslevel: int = DEFAULT_COMPRESSLEVEL) -> None:
    """Write ``snapshots`` to ``path`` (a str/bytes/PathLike, or a binary file object).

    The whole header is built and checked first, so a value that cannot be saved
    (a mark value that is not JSON-representable, say) raises :class:`TypeError`
    before any byte is written.  A path is written through a temporary file in the
    same directory, flushed to disk and renamed over ``path``: a crash or error never
    leaves a half-written file where a good one was.  A file object is written from
    its current position and left open.
    """
    if not isinstance(snapshots, Snapshots):
        raise TypeError(f"save() needs a Snapshots value, not {type(snapshots).__name__}")
    if not (isinstance(compresslevel, int) and 0 <= compresslevel <= 9):
        raise ValueError(f"compresslevel must be an int from 0 to 9, not {compresslevel!r}")
    if not _is_path(path):
        if not hasattr(path, "write"):
            raise TypeError(f"save() needs a path or a binary file object, not {type(path).__name__}")
        if isinstance(path, io.TextIOBase):
            raise TypeError("save() needs a binary file object (opened with 'wb'), not a text file")
    snapshots.validate()  # never write a file that load() would refuse
    header_bytes = _encode_header(snapshots)
    if _is_path(path):
        target = os.fsdecode(os.fspath(path))  # type: ignore[arg-type]
        _save_atomically(snapshots, header_bytes, target, compresslevel)
    else:
        _write_stream(snapshots, header_bytes, path, compresslevel)  # type: ignore[arg-type]


def _is_path(path: object) -> bool:
    return isinstance(path, (str, bytes, os.PathLike))


def _save_atomically(snapshots: Snapshots, header_bytes: bytes, path: str,
                     compresslevel: int) -> None:
    """Write through a temporary file beside ``path``, renamed over it when complete
    (:func:`sampler.outputfile.write_atomically`)."""
    if not os.path.basename(path):
        raise IsADirectoryError(f"save() needs a file name, not the directory {path!r}")
    write_atomically(path, lambda raw: _write_stream(snapshots, header_bytes, raw, compresslevel))


def _write_stream(snapshots: Snapshots, header_bytes: bytes, raw: IO[bytes],
                  compresslevel: int) -> None:
    """Write the gzip stream: magic, version, header, then each array section."""
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                       compresslevel=compresslevel) as gz:
        gz.write(MAGIC)
        gz.write(b"version %d\n" % FORMAT_VERSION)
        gz.write(b"header %d\n" % len(header_bytes))
        gz.write(header_bytes)
        for name in ARRAY_SECTIONS:
            col = getattr(snapshots, name)
            if col is None:
                continue
            if _BIG_ENDIAN:
                col = array("I", col)
                col.byteswap()
            gz.write(col)


def _encode_header(s: Snapshots) -> bytes:
    """The JSON header of ``s``, checked so that :func:`load` will accept it.

    Values are first checked for JSON-representability (a :class:`TypeError` naming the
    offending place), then the encoded header is parsed back with the very checks
    :func:`load` applies, so a value that is JSON but of the wrong shape (a frame name
    that is not a str, say) is also refused here rather than producing a file that
    cannot be read.
    """
    sections = [
        {"name": name, "typecode": "I", "length": len(getattr(s, name))}
        for name in ARRAY_SECTIONS if getattr(s, name) is not None
    ]
    header: dict[str, Any] = {
        "frames": [list(f) for f in s.frames],
        "threads": [list(t) for t in s.threads],
        "runs": [_run_to_json(r, i) for i, r in enumerate(s.runs)],
        "mark_sets": [[list(e) for e in ms] for ms in s.mark_sets],
        "custom_keys": list(s.custom_keys),
        "wall_overflow": sorted([i, v] for i, v in s.wall_overflow.items()),
        "cpu_overflow": sorted([i, v] for i, v in s.cpu_overflow.items()),
        "sections": sections,
    }
    _check_json(header["frames"], "frames", hashable_only=False)
    _check_json(header["threads"], "threads", hashable_only=False)
    _check_json(header["mark_sets"], "mark_sets", hashable_only=True)
    _check_json(header["custom_keys"], "custom_keys", hashable_only=True)
    _check_json(header["wall_overflow"], "wall_overflow", hashable_only=False)
    _check_json(header["cpu_overflow"], "cpu_overflow", hashable_only=False)
    text = json.dumps(header, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    encoded = text.encode("ascii")

    def refuse(msg: str) -> NoReturn:
        raise TypeError(f"cannot save this value: {msg}")

    _parse_header(json.loads(text), refuse)  # the loader's own checks
    return encoded


def _run_to_json(run: Any, i: int) -> dict[str, Any]:
    """``run.to_dict()``, after checking its raw fields (``to_dict`` deep-copies them,
    which would fail with an unhelpful message on, say, a lock in ``extra``)."""
    where = f"runs[{i}]"
    if not isinstance(run, RunInfo):
        raise TypeError(f"{where} is a {type(run).__name__}, not a RunInfo")
    for f in dataclasses.fields(run):
        _check_json(getattr(run, f.name), f"{where}.{f.name}",
                    hashable_only=f.name == "custom_keys")
    return run.to_dict()


def _check_json(value: Any, where: str, *, hashable_only: bool) -> None:
    """Raise :class:`TypeError` naming ``where`` unless ``value`` survives JSON.

    ``hashable_only`` (mark values, custom keys) also refuses dicts, which would come
    back as unhashable values.  ``json.dumps`` alone would accept some things that do
    not come back (dict keys that are ints become strings) and its messages do not say
    where the culprit is, hence this walk.
    """
    on_path: set[int] = set()

    def walk(v: Any, at: str, depth: int) -> None:
        if v is None or isinstance(v, (str, bool, float)):
            return
        if isinstance(v, int):
            if v.bit_length() > _MAX_INT_BITS:
                raise TypeError(f"{at}: an int of {v.bit_length()} bits is too large to save")
            return
        if depth > 200:
            raise TypeError(f"{at}: nested too deeply to save")
        if isinstance(v, (list, tuple)):
            if id(v) in on_path:
                raise TypeError(f"{at}: contains itself, cannot be saved")
            on_path.add(id(v))
            for k, item in enumerate(v):
                walk(item, f"{at}[{k}]", depth + 1)
            on_path.discard(id(v))
            return
        if isinstance(v, dict) and not hashable_only:
            if id(v) in on_path:
                raise TypeError(f"{at}: contains itself, cannot be saved")
            on_path.add(id(v))
            for k, item in v.items():
                if not isinstance(k, str):
                    raise TypeError(f"{at}: dict key {k!r} is a {type(k).__name__}; "
                                    f"only str keys can be saved")
                walk(item, f"{at}[{k!r}]", depth + 1)
            on_path.discard(id(v))
            return
        allowed = ("str, int, float, bool, None, list or tuple" if hashable_only
                   else "str, int, float, bool, None, list, tuple or dict with str keys")
        raise TypeError(f"{at}: {type(v).__name__} value {_short_repr(v)} cannot be saved "
                        f"(allowed: {allowed})")

    walk(value, where, 0)


def _short_repr(v: Any) -> str:
    try:
        r = repr(v)
    except Exception:  # a broken __repr__ must not hide the real message
        r = f"<{type(v).__name__} object>"
    r = r.replace("\n", " ")
    return r if len(r) <= 60 else r[:57] + "..."


# ----------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------
def load(path: PathOrFile, *, limit: Optional[int] = None) -> Snapshots:
    """Read a file written by :func:`save` and return the :class:`Snapshots` value.

    ``path`` is a str/bytes/PathLike or a binary file object (read to its end and left
    open).  A file that is not ours, newer than this code, truncated, corrupt or
    hostile raises :class:`SnapshotError` with a one-line message saying what is wrong;
    an unreadable path raises the usual :class:`OSError`.  ``limit`` bounds the bytes
    loading may allocate (default: :func:`load_limit`); a file needing more is refused.
    """
    budget = load_limit() if limit is None else limit
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"limit must be a positive number of bytes, not {budget!r}")
    if _is_path(path):
        p = os.fspath(path)
        with open(p, "rb") as f:
            return _load_stream(f, os.fsdecode(p), budget)
    if hasattr(path, "read"):
        if isinstance(path, io.TextIOBase):
            raise TypeError("load() needs a binary file object (opened with 'rb'), not a text file")
        name = getattr(path, "name", None)
        return _load_stream(path, name if isinstance(name, str) else None, budget)  # type: ignore[arg-type]
    raise TypeError(f"load() needs a path or a binary file object, not {type(path).__name__}")


class _Reader:
    """Bounded, exception-wrapping reads from the decompressed stream.

    Every failure of the compression layer becomes a :class:`SnapshotError`, and no
    read asks for more than :data:`_CHUNK` bytes at a time, so a declared length is
    only ever paid for with bytes that really exist.
    """

    def __init__(self, raw: IO[bytes], fail: Callable[[str], NoReturn]) -> None:
        self._gz = gzip.GzipFile(filename="", fileobj=raw, mode="rb")
        self.fail = fail
        self._started = False  # whether any decompressed byte has come out yet

    def _guard(self, fn: Callable[[int], bytes], n: int) -> bytes:
        try:
            data = fn(n)
        except gzip.BadGzipFile as e:
            text = _one_line(e)
            if not self._started:
                self.fail(f"not a stackshot snapshot file (not gzip data: {text})")
            if text.startswith("Not a gzipped file"):
                self.fail("corrupt: unexpected bytes after the compressed stream")
            self.fail(f"corrupt: gzip check failed ({text})")
        except EOFError:
            self.fail("truncated: the compressed stream ends early")
        except zlib.error as e:
            self.fail(f"corrupt: compressed data is damaged ({_one_line(e)})")
        self._started = self._started or bool(data)
        return data

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the stream)."""
        return self._guard(self._gz.read, n)

    def read_exact(self, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes, or a 'truncated' error naming ``what``."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            part = self.read(min(n - got, _CHUNK))
            if not part:
                self.fail(f"truncated: {what} needs {n} bytes, {got} remain")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def read_into(self, arr: array, nbytes: int, what: str) -> None:
        """Append ``nbytes`` bytes to ``arr`` chunk by chunk (no up-front allocation)."""
        got = 0
        tail = b""  # bytes of an item split across two reads
        while got < nbytes:
            part = self.read(min(nbytes - got, _CHUNK))
            if not part:
                self.fail(f"truncated: {what} needs {nbytes} bytes, {got} remain")
            got += len(part)
            data = tail + part if tail else part
            cut = len(data) - len(data) % _ITEMSIZE
            arr.frombytes(memoryview(data)[:cut])
            tail = data[cut:]

    def read_line(self, limit: int, what: str) -> bytes:
        """One ``\\n``-terminated line of at most ``limit`` bytes."""
        line = self._guard(self._gz.readline, limit)
        if not line.endswith(b"\n"):
            if len(line) < limit:
                self.fail(f"truncated: the file ends inside the {what}")
            self.fail(f"corrupt: bad {what} {_short_repr(line)}")
        return line

    def at_end(self) -> bool:
        """Whether the stream ends here; reading to the end also checks the gzip CRC."""
        return not self.read(1)


_VERSION_LINE = re.compile(rb"version (\d{1,9})\n\Z")
_HEADER_LINE = re.compile(rb"header (\d{1,19})\n\Z")


def load_limit() -> int:
    """The bytes :func:`load` may allocate by default: ``STACKSHOT_LOAD_LIMIT_MB``
    megabytes (MiB) when that is set to a positive number, else :data:`DEFAULT_LOAD_LIMIT`.
    A setting that is not a positive number is an error, not silently ignored."""
    text = os.environ.get(LOAD_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_LOAD_LIMIT
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and 0 < mb <= 1 << 40):
        raise SnapshotError(f"{LOAD_LIMIT_ENV}={text!r:.40} is not a positive number of megabytes")
    return max(1, int(mb * (1 << 20)))


def _over_limit(what: str, cost: int, limit: int) -> str:
    return (f"too large to load: {what} would take about {_megabytes(cost)} of memory, more "
            f"than the load limit of {_megabytes(limit)} (raise it with "
            f"{LOAD_LIMIT_ENV}=<MB> or load(..., limit=<bytes>))")


def _megabytes(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MB" if n < (1 << 30) * 10 else f"{n / (1 << 30):,.0f} GB"


def _header_cost(header: bytes) -> int:
    """An upper estimate of the bytes parsing ``header`` allocates: the bytes, their
    decoded text, and per JSON container and value the objects ``json`` builds and
    :func:`_parse_header` converts (counted with ``bytes.count``, at C speed)."""
    containers = header.count(b"[") + header.count(b"{")
    values = header.count(b",") + header.count(b":")
    return 3 * len(header) + _CONTAINER_COST * containers + _VALUE_COST * values


def _load_stream(raw: IO[bytes], name: Optional[str], limit: int = DEFAULT_LOAD_LIMIT) -> Snapshots:
    """Read and check the stream step by step; every failure is a one-line SnapshotError
    prefixed with the file's name when it has one.  Nothing is allocated past ``limit``
    bytes: each part's cost is checked before it is read or parsed."""
    prefix = f"{name}: " if name else ""

    def fail(msg: str) -> NoReturn:
        raise SnapshotError(prefix + msg) from None

    r = _Reader(raw, fail)
    head = r.read(len(MAGIC))
    while len(head) < len(MAGIC) and head == MAGIC[:len(head)]:
        more = r.read(len(MAGIC) - len(head))
        if not more:
            break
        head += more
    if head != MAGIC:
        if head and head == MAGIC[:len(head)]:
            fail("truncated: the file ends inside the magic line")
        fail("not a stackshot snapshot file" + ("" if head else " (it is empty)"))

    m = _VERSION_LINE.match(r.read_line(20, "version line"))
    if not m:
        fail("corrupt: bad version line")
    version = int(m.group(1))
    if version > FORMAT_VERSION:
        fail(f"written by format version {version}; this stackshot reads up to {FORMAT_VERSION}")
    if version < 1:
        fail(f"corrupt: format version {version} does not exist")

    m = _HEADER_LINE.match(r.read_line(32, "header line"))
    if not m:
        fail("corrupt: bad header line")
    header_len = int(m.group(1))
    if header_len > _MAX_HEADER_BYTES:
        fail(f"corrupt: header declares {header_len} bytes, more than the limit of {_MAX_HEADER_BYTES}")
    if 3 * header_len > limit:
        fail(_over_limit(f"a header of {header_len} bytes", 3 * header_len, limit))
    header_bytes = r.read_exact(header_len, "the header")
    header_cost = _header_cost(header_bytes)
    if header_cost > limit:
        fail(_over_limit(f"the header ({header_len} bytes of JSON)", header_cost, limit))
    try:
        doc = json.loads(header_bytes.decode("utf-8"), parse_int=_parse_int)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        fail(f"corrupt: header is not valid JSON ({_one_line(e)})")
    try:
        parsed = _parse_header(doc, lambda msg: fail(f"corrupt header: {msg}"))
    except RecursionError:
        fail("corrupt header: nested too deeply")

    declared = sum(length for _, length in parsed["sections"]) * _ITEMSIZE
    if header_cost + declared > limit:
        fail(_over_limit(f"the header and {declared:,} bytes of sections it declares",
                         header_cost + declared, limit))
    columns: dict[str, array] = {}
    for sec_name, length in parsed["sections"]:
        arr = array("I")
        r.read_into(arr, length * _ITEMSIZE, f"section {sec_name}")
        if _BIG_ENDIAN:
            arr.byteswap()
        columns[sec_name] = arr
    if not r.at_end():
        fail("corrupt: unexpected data after the last section")

    try:
        return Snapshots._adopt(  # the columns just read are the value's own: no copy
            frames=parsed["frames"], threads=parsed["threads"], runs=parsed["runs"],
            mark_sets=parsed["mark_sets"], custom_keys=parsed["custom_keys"],
            wall_overflow=parsed["wall_overflow"], cpu_overflow=parsed["cpu_overflow"],
            sample_marks=columns.get("sample_marks"),
            **{k: v for k, v in columns.items() if k != "sample_marks"},
        )
    except SnapshotError as e:
        fail(f"inconsistent: {e}")
    except (TypeError, ValueError, IndexError, OverflowError) as e:
        fail(f"inconsistent: {_one_line(e)}")


def _parse_int(text: str) -> int:
    """json's int hook: refuse absurdly long literals, which would be slow to convert."""
    if len(text) > _MAX_INT_DIGITS:
        raise ValueError(f"integer literal of {len(text)} digits")
    return int(text)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# ----------------------------------------------------------------------------------
# Header checking, shared by save (on its own output) and load
# ----------------------------------------------------------------------------------
_INT64 = 1 << 63
_MAX_DEPTH = 64  # nesting of JSON arrays/objects in the header (the layout itself uses 4)


def _is_int(v: Any) -> bool:
    """A 64-bit integer: every consumer (the exports' int64 fields, float arithmetic)
    handles these, and nothing a sampler records is larger."""
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64


def _is_number(v: Any) -> bool:
    """A finite number within the int64 range: NaN, infinities and 400-digit integers
    pass ``json`` but end in ``OverflowError``/``ValueError`` deep in a consumer."""
    if isinstance(v, float):
        return math.isfinite(v) and -_INT64 <= v < _INT64
    return _is_int(v)


def _check_depth(doc: Any, fail: Callable[[str], NoReturn]) -> None:
    """Refuse a header nested deeper than :data:`_MAX_DEPTH` (iteratively, so the check
    cannot itself overflow the stack): consumers that print a mark value recurse."""
    stack = [(doc, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            if depth > _MAX_DEPTH:
                fail(f"nested more than {_MAX_DEPTH} levels deep")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def _hashable(v: Any) -> Any:
    """JSON arrays to tuples, recursively: mark values and custom keys must hash."""
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _parse_header(doc: Any, fail: Callable[[str], NoReturn]) -> dict[str, Any]:
    """Check the decoded JSON header and turn it into constructor arguments.

    Everything the :class:`Snapshots` constructor and its ``validate()`` do not check
    (types, arities) is checked here, so that a hostile header yields a clear message
    rather than a value that breaks the analyzer later.
    """
    if not isinstance(doc, dict):
        fail("not a JSON object")
    _check_depth(doc, fail)
    required = ("frames", "threads", "runs", "mark_sets", "custom_keys",
                "wall_overflow", "cpu_overflow", "sections")
    for key in required:
        if key not in doc:
            fail(f"missing {key!r}")
        if key != "custom_keys" and not isinstance(doc[key], list):
            fail(f"{key!r} is not a list")
    if not isinstance(doc["custom_keys"], list):
        fail("'custom_keys' is not a list")

    frames = []
    for i, f in enumerate(doc["frames"]):
        if not (isinstance(f, list) and len(f) == 4 and isinstance(f[0], str)
                and isinstance(f[1], str) and _is_int(f[2])
                and (f[3] is None or _is_int(f[3]))):
            fail(f"frames[{i}] is not [name, filename, firstlineno, lineno]")
        frames.append(Frame(*f))

    threads = []
    for i, t in enumerate(doc["threads"]):
        if not (isinstance(t, list) and len(t) == 7 and _is_int(t[0]) and isinstance(t[1], str)
                and (t[2] is None or _is_int(t[2])) and isinstance(t[3], str) and _is_int(t[4])
                and _is_number(t[5]) and _is_number(t[6])):
            fail(f"threads[{i}] is not [id, name, native_id, kind, run, first_wall, first_cpu]")
        threads.append(ThreadInfo(*t))

    runs = [_parse_run(d, i, fail) for i, d in enumerate(doc["runs"])]

    custom_keys = tuple(_check_hashable(k, f"custom_keys[{i}]", fail)
                        for i, k in enumerate(doc["custom_keys"]))
    mark_sets = []
    for i, ms in enumerate(doc["mark_sets"]):
        if not isinstance(ms, list):
            fail(f"mark_sets[{i}] is not a list")
        entries = []
        for j, entry in enumerate(ms):
            if not isinstance(entry, list):
                fail(f"mark_sets[{i}][{j}] is not a list")
            entries.append(tuple(_check_hashable(v, f"mark_sets[{i}][{j}]", fail) for v in entry))
        mark_sets.append(tuple(entries))

    overflow = {}
    for key in ("wall_overflow", "cpu_overflow"):
        d: dict[int, int] = {}
        for pair in doc[key]:
            if not (isinstance(pair, list) and len(pair) == 2 and _is_int(pair[0])
                    and _is_int(pair[1])):
                fail(f"{key} holds {_short_repr(pair)}, not an [index, microseconds] pair of 64-bit integers")
            if pair[0] in d:
                fail(f"{key} names sample {pair[0]} twice")
            d[pair[0]] = pair[1]
        overflow[key] = d

    sections = []
    seen: set[str] = set()
    for sec in doc["sections"]:
        if not (isinstance(sec, dict) and isinstance(sec.get("name"), str)):
            fail(f"section entry {_short_repr(sec)} has no name")
        sname = sec["name"]
        if sname not in ARRAY_SECTIONS:
            fail(f"unknown section {_short_repr(sname)}")
        if sname in seen:
            fail(f"section {sname} listed twice")
        seen.add(sname)
        if sec.get("typecode") != "I":
            fail(f"section {sname} has typecode {_short_repr(sec.get('typecode'))}, not 'I'")
        length = sec.get("length")
        if not (_is_int(length) and 0 <= length <= _MAX_SECTION_LENGTH):
            fail(f"section {sname} has an impossible length {_short_repr(length)}")
        sections.append((sname, length))
    missing = [n for n in ARRAY_SECTIONS if n not in seen and n not in _OPTIONAL_SECTIONS]
    if missing:
        fail(f"missing section(s) {', '.join(missing)}")
    # Cross-check the declared lengths before reading any section, so that a file
    # declaring gigabytes it cannot use is refused without reading them.
    lengths = dict(sections)
    if lengths["stack_frame"] < 1:
        fail("section stack_frame must hold at least the empty stack")
    for group in (("stack_frame", "stack_parent"),
                  ("sample_thread", "sample_stack", "sample_wall", "sample_cpu", "sample_marks")):
        declared = {n: lengths[n] for n in group if n in lengths}
        if len(set(declared.values())) > 1:
            fail("sections " + ", ".join(f"{n} ({v})" for n, v in declared.items())
                 + " differ in length")

    return {
        "frames": frames, "threads": threads, "runs": runs, "mark_sets": mark_sets,
        "custom_keys": custom_keys, "wall_overflow": overflow["wall_overflow"],
        "cpu_overflow": overflow["cpu_overflow"], "sections": sections,
    }


def _check_hashable(v: Any, where: str, fail: Callable[[str], NoReturn]) -> Any:
    """A mark value or custom key: any JSON value but an object; arrays become tuples."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            fail(f"{where} holds a JSON object; mark values and keys must be hashable")
        if isinstance(x, list):
            stack.extend(x)
    return _hashable(v)


_RUN_FIELD_TYPES: dict[str, str] = {
    f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    for f in dataclasses.fields(RunInfo)
}
_KIND_NAMES = {"int": "a 64-bit integer", "float": "a finite number (within the int64 range)"}
_RATE_FIELDS = frozenset({"requested_rate", "achieved_rate"})  # RunInfo.to_dict writes inf as "inf"


def _check_greenlets(table: Any, where: str, fail: Callable[[str], NoReturn]) -> None:
    """The recorder's greenlet table (``sampler.recorder.GREENLETS_KEY``): context id
    (decimal text) -> [greenlet id, parent's context id, thread's context id]."""
    if not isinstance(table, dict):
        fail(f"{where} is {_short_repr(table)}, not an object")
    for key, row in table.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 12):
            fail(f"{where} has the key {_short_repr(key)}, not a thread id")
        if not (isinstance(row, list) and len(row) == 3
                and all(_is_int(x) and 0 <= x < 2 ** 63 for x in row)):
            fail(f"{where}[{key}] is {_short_repr(row)}, not [greenlet id, parent, thread] "
                 "(3 whole numbers)")


def _parse_run(d: Any, i: int, fail: Callable[[str], NoReturn]) -> RunInfo:
    """Check a run's fields against :class:`RunInfo`'s annotations, then build it.

    Driven by the dataclass's own field list, so a field added to ``RunInfo`` later is
    checked without touching this module; unknown keys are ignored (``from_dict``).
    """
    if not isinstance(d, dict):
        fail(f"runs[{i}] is not an object")
    for name, value in d.items():
        kind = _RUN_FIELD_TYPES.get(name)
        if kind is None:
            continue
        ok = {
            "int": _is_int(value),
            "float": _is_number(value) or (name in _RATE_FIELDS and value == "inf"),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "tuple": isinstance(value, list),
            "dict": isinstance(value, dict),
        }.get(kind, True)
        if not ok:
            fail(f"runs[{i}].{name} is {_short_repr(value)}, not {_KIND_NAMES.get(kind, 'a ' + kind)}")
    extra = d.get("extra")
    if isinstance(extra, dict) and "greenlets" in extra:
        _check_greenlets(extra["greenlets"], f"runs[{i}].extra.greenlets", fail)
    d = dict(d)
    if "custom_keys" in d:
        d["custom_keys"] = [_check_hashable(k, f"runs[{i}].custom_keys[{j}]", fail)
                            for j, k in enumerate(d["custom_keys"])]
    try:
        return RunInfo.from_dict(d)
    except (TypeError, ValueError) as e:  # pragma: no cover - types were checked above
        fail(f"runs[{i}]: {_one_line(e)}")

