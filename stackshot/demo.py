"""A small program to profile: summarising a synthetic web-server access log.

Try it under the profiler::

    stackshot -m stackshot.demo                  # the main thread
    stackshot --all-threads -m stackshot.demo    # and its helper thread

It is written so that its profile has a clear, known shape.  The main thread makes
a log (``make_log``), parses every line with a regular expression (``parse_line``),
counts visitors by a salted hash of their address (``pseudonym`` calling
``fingerprint``, pure Python: the hot spot) and summarises per endpoint
(``summarize``, cheap).  Meanwhile a helper thread estimates how well the log
compresses (``compression_report``), work that only shows up when every thread is
sampled.  It prints one line.

``python -m stackshot.demo [LINES]`` sets the size (default 30000 lines).
"""

from __future__ import annotations

import random
import re
import sys
import threading
import zlib
from typing import Optional, Sequence

ENDPOINTS = ("/", "/login", "/search", "/cart", "/checkout", "/api/items", "/api/user",
             "/static/app.js", "/static/site.css", "/help")
LINE = re.compile(r'^(\S+) - - \[(\d+)\] "(GET|POST) (\S+) HTTP/1\.1" (\d{3}) (\d+) (\d+)ms$')


class Request:
    """One parsed line (a plain class: its constructor shows by name in a profile)."""

    __slots__ = ("client", "when", "method", "path", "status", "size", "millis")

    def __init__(self, client: str, when: int, method: str, path: str, status: int,
                 size: int, millis: int) -> None:
        self.client, self.when, self.method, self.path = client, when, method, path
        self.status, self.size, self.millis = status, size, millis


def make_log(lines: int, seed: int = 7) -> list[str]:
    """Deterministic log lines, so that every run does the same work."""
    rng = random.Random(seed)
    clients = [f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}"
               for _ in range(max(lines // 40, 1))]
    out = []
    for i in range(lines):
        path = rng.choice(ENDPOINTS)
        slow = 5 if path.startswith("/search") else 1
        out.append(f'{rng.choice(clients)} - - [{1700000000 + i}] '
                   f'"{"POST" if path == "/checkout" else "GET"} {path} HTTP/1.1" '
                   f'{rng.choice((200, 200, 200, 304, 404, 500))} {rng.randrange(200, 90000)} '
                   f'{int(rng.expovariate(1 / (20 * slow)))}ms')
    return out


def parse_line(line: str) -> Request:
    m = LINE.match(line)
    if m is None:
        raise ValueError(f"not a log line: {line!r}")
    c, when, method, path, status, size, millis = m.groups()
    return Request(c, int(when), method, path, int(status), int(size), int(millis))


def parse_all(lines: Sequence[str]) -> list[Request]:
    return [parse_line(line) for line in lines]


def fingerprint(data: bytes) -> int:
    """FNV-1a, 64 bits, deliberately in pure Python: the hot spot."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def pseudonym(client: str, rounds: int = 2) -> int:
    """A client address replaced by a salted, repeatedly hashed number (privacy)."""
    h = 0
    for _ in range(rounds):
        h = fingerprint(b"demo-salt:%d:%s" % (h, client.encode()))
    return h


def count_visitors(requests: Sequence[Request]) -> int:
    """How many different clients came, counted by pseudonym."""
    return len({pseudonym(r.client) for r in requests})


def summarize(requests: Sequence[Request]) -> dict[str, tuple[int, int]]:
    """Per endpoint: the number of requests and the 95th percentile latency."""
    by_path: dict[str, list[int]] = {}
    for r in requests:
        by_path.setdefault(r.path, []).append(r.millis)
    out = {}
    for path, millis in by_path.items():
        millis.sort()
        out[path] = (len(millis), millis[int(len(millis) * 0.95) - 1 if len(millis) > 1 else 0])
    return out


def compression_report(lines: Sequence[str], result: dict[str, float]) -> None:
    """The helper thread's job: the log's compression ratio, chunk by chunk."""
    raw = packed = 0
    for start in range(0, len(lines), 200):
        chunk = "\n".join(lines[start:start + 200]).encode()
        for _ in range(3):  # as if trying three settings
            small = zlib.compress(chunk, 9)
        raw, packed = raw + len(chunk), packed + len(small)
    result["ratio"] = raw / packed if packed else 0.0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    lines = int(args[0]) if args else 30000
    log = make_log(lines)
    compression: dict[str, float] = {}
    helper = threading.Thread(target=compression_report, args=(log, compression),
                              name="compressor")
    helper.start()
    requests = parse_all(log)
    visitors = count_visitors(requests)
    summary = summarize(requests)
    helper.join()
    slowest = max(summary, key=lambda p: summary[p][1])
    print(f"demo: {len(requests)} requests, {len(summary)} endpoints, slowest {slowest} "
          f"(p95 {summary[slowest][1]} ms), {visitors} visitors, "
          f"log compresses {compression['ratio']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
