"""A mix of library calls, some holding the GIL and some releasing it.

Each round encodes a large document as JSON into a buffered file (``json.dump``: the
pure-Python encoder, many small writes, the buffer flushed by a GIL-releasing
``write``), scans a text with regular expressions (``re``: C code that holds the GIL
throughout) and hashes big buffers with ``hashlib`` (which releases the GIL for data
over 2 KiB).  A collector that must take the GIL gets it inside the hashing and the
flushes, rarely inside the regex scan.  The truth is each part's own CPU time
(``time.thread_time``) in runs without a profiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import tempfile
import time
from typing import Any

from . import seconds_per_unit

NAME = "io_mix"
DESCRIPTION = "json.dump of a large document to a buffered file, regex scans, hashlib on big buffers"
PARTS = ("io_json_dump", "io_regex_scan", "io_hash")
SINGLE_THREAD = True
PART_SECONDS = 0.01  # each part's time per round, about

_WORD = re.compile(r"\b[a-z]{4,9}\b")
_NUMBER = re.compile(r"(\d+)\.(\d{2})")


def _document(items: int) -> dict:
    rng = random.Random(7)
    return {"items": [{"id": i, "name": f"item-{i}", "price": round(rng.random() * 100, 2),
                       "tags": [rng.choice("abcdefgh") * 3 for _ in range(3)],
                       "stock": {"here": rng.randrange(50), "there": rng.randrange(50)}}
                      for i in range(items)]}


def _text(chars: int) -> str:
    rng = random.Random(11)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "12.50", "golf", "x", "99.99"]
    out, size = [], 0
    while size < chars:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def io_json_dump(doc: dict, path: str) -> None:
    with open(path, "w", buffering=64 * 1024) as f:
        json.dump(doc, f)


def io_regex_scan(text: str) -> int:
    return len(_WORD.findall(text)) + len(_NUMBER.findall(text))


def io_hash(blocks: list) -> str:
    h = hashlib.sha256()
    for b in blocks:
        h.update(b)
    return hashlib.blake2b(h.digest() + blocks[0]).hexdigest()


def calibrate(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "doc.json")
        doc, text, blocks = _document(200), _text(100_000), [os.urandom(1 << 16) for _ in range(16)]
        t_json = seconds_per_unit(lambda _: io_json_dump(doc, path), 1)
        t_re = seconds_per_unit(lambda _: io_regex_scan(text), 1)
        t_hash = seconds_per_unit(lambda _: io_hash(blocks), 1)
    params = {"items": max(1, round(200 * PART_SECONDS / t_json)),
              "chars": max(1000, round(100_000 * PART_SECONDS / t_re)),
              "blocks": max(1, round(16 * PART_SECONDS / t_hash))}
    params["rounds"] = max(1, round(seconds / (3 * PART_SECONDS)))
    return params


def setup(params: dict) -> Any:
    tmp = tempfile.mkdtemp(prefix="stackshot-io-")
    rng = random.Random(3)
    return {"rounds": params["rounds"], "doc": _document(params["items"]), "text": _text(params["chars"]),
            "blocks": [rng.randbytes(1 << 16) for _ in range(params["blocks"])],
            "path": os.path.join(tmp, "doc.json"), "tmp": tmp}


def io_main(rounds: int, doc: dict, text: str, blocks: list, path: str) -> dict:
    clock = time.thread_time
    spent = dict.fromkeys(PARTS, 0.0)
    for _ in range(rounds):
        t0 = clock()
        io_json_dump(doc, path)
        t1 = clock()
        io_regex_scan(text)
        t2 = clock()
        io_hash(blocks)
        t3 = clock()
        spent["io_json_dump"] += t1 - t0
        spent["io_regex_scan"] += t2 - t1
        spent["io_hash"] += t3 - t2
    return spent


def run(state: Any) -> dict:
    os.makedirs(state["tmp"], exist_ok=True)  # (again, when run again: bench_running)
    try:
        return io_main(state["rounds"], state["doc"], state["text"], state["blocks"], state["path"])
    finally:
        try:
            os.remove(state["path"])
        except OSError:
            pass
        os.rmdir(state["tmp"])
