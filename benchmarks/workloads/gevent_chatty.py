"""A chatty gevent server: many short requests, tens of thousands of switches a second.

``gevent_server``'s handlers take ~2 ms a request and its client is a thread of its
own: about 2,000 greenlet switches a second, so what a profiler pays per switch hardly
shows. Servers that answer small requests (a cache, a key-value store, an RPC front)
switch at every request: here a ``gevent.server.StreamServer`` on 127.0.0.1 (an
ephemeral port) serves ``CONNECTIONS`` client greenlets of the same hub, each sending
one short request line at a time and reading the reply: about four switches a
request, ~30 us of CPU in the handler's two parts, 50,000 switches a second and more.
Each request's handler parses the line into fields (``gvc_parse``, pure Python) and
formats the reply (``gvc_reply``, pure Python). The truth is each part's own CPU time
(``time.thread_time``; the parts never switch greenlets inside) in runs without a
profiler. No monkey-patching and no resolver: everything runs in one OS thread.
"""

from __future__ import annotations

import time
from typing import Any

from . import seconds_per_unit_each

NAME = "gevent_chatty"
DESCRIPTION = "gevent StreamServer on loopback, 16 client greenlets of short requests: parse + reply (Python)"
PARTS = ("gvc_parse", "gvc_reply")
SINGLE_THREAD = True
CONNECTIONS = 16
PARSE_SECONDS = 20e-6  # CPU per request, about
REPLY_SECONDS = 10e-6
PROBE_REQUESTS = 2000  # a run of these sizes the real one (the parts, gevent's sockets, the switches)
REQUEST = b"GET /item?id=12345&user=alice&tags=red,green,blue&limit=25&offset=100&sort=name\n"


def gvc_parse(line: bytes, reps: int) -> dict:
    """The request's fields (``reps`` times over: sized to PARSE_SECONDS)."""
    fields: dict = {}
    for _ in range(reps):
        method, _, target = line.decode().strip().partition(" ")
        path, _, query = target.partition("?")
        fields = {"method": method, "path": path}
        for pair in query.split("&"):
            key, _, value = pair.partition("=")
            fields[key] = value.split(",") if "," in value else (int(value) if value.isdigit() else value)
    return fields


def gvc_reply(fields: dict, reps: int) -> bytes:
    """The reply line (``reps`` times over: sized to REPLY_SECONDS)."""
    out = ""
    for _ in range(reps):
        out = " ".join(f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in sorted(fields.items()))
    return (out + "\n").encode()


def calibrate(seconds: float) -> dict:
    fields = gvc_parse(REQUEST, 1)
    parse, reply = seconds_per_unit_each([lambda n: gvc_parse(REQUEST, n), lambda n: gvc_reply(fields, n)], 200)
    reps = {"parse_reps": max(1, round(PARSE_SECONDS / parse)), "reply_reps": max(1, round(REPLY_SECONDS / reply))}
    per_request = min(_probe(reps) for _ in range(3)) / PROBE_REQUESTS  # (the least disturbed)
    return dict(reps, requests=max(CONNECTIONS, round(seconds / per_request)))


def _probe(reps: dict) -> float:
    """Seconds a run of PROBE_REQUESTS requests takes."""
    start = time.perf_counter()
    gvc_main(reps["parse_reps"], reps["reply_reps"], PROBE_REQUESTS)
    return time.perf_counter() - start


def setup(params: dict) -> Any:
    import gevent  # noqa: F401 - imported untimed

    return params


def gvc_handler(parse_reps: int, reply_reps: int, spent: dict) -> Any:
    """The server's connection handler: each request line is parsed and answered;
    each part's CPU is added to ``spent``."""
    clock = time.thread_time

    def handle(sock: Any, _address: Any) -> None:
        f = sock.makefile("rb")
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                t0 = clock()
                fields = gvc_parse(line, parse_reps)
                t1 = clock()
                reply = gvc_reply(fields, reply_reps)
                t2 = clock()
                spent["gvc_parse"] += t1 - t0
                spent["gvc_reply"] += t2 - t1
                sock.sendall(reply)
        finally:
            f.close()
            sock.close()

    return handle


def gvc_client(port: int, requests: int, answered: list) -> None:
    """One client greenlet: ``requests`` requests on one connection, one at a time."""
    from gevent import socket

    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.connect(("127.0.0.1", port))  # (a numeric address: no resolver thread)
    f = conn.makefile("rb")
    try:
        for _ in range(requests):
            conn.sendall(REQUEST)
            if not f.readline():
                raise ConnectionError("the server closed the connection")
            answered[0] += 1
    finally:
        f.close()
        conn.close()


def gvc_main(parse_reps: int, reply_reps: int, requests: int) -> dict:
    import gevent
    from gevent.server import StreamServer

    spent = dict.fromkeys(PARTS, 0.0)
    server = StreamServer(("127.0.0.1", 0), gvc_handler(parse_reps, reply_reps, spent))
    server.start()
    answered = [0]
    share, extra = divmod(requests, CONNECTIONS)
    clients = [gevent.spawn(gvc_client, server.server_port, share + (i < extra), answered)
               for i in range(CONNECTIONS)]
    try:
        gevent.joinall(clients, timeout=60 + requests * 1e-3, raise_error=True)
    finally:
        gevent.killall(clients)
        server.stop(timeout=1)
    if answered[0] != requests:
        raise RuntimeError(f"the clients got {answered[0]} of {requests} answers")
    return spent


def run(state: Any) -> dict:
    return gvc_main(state["parse_reps"], state["reply_reps"], state["requests"])
