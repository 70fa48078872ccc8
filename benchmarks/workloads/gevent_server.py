"""A real gevent server on loopback whose handlers split their CPU between two functions.

A ``gevent.server.StreamServer`` on 127.0.0.1 (an ephemeral port) serves a bounded
client: one real OS thread with a few blocking connections, sending a fixed number
of requests (and giving up after a deadline), after which the server stops.  Each
request's handler renders a page in pure Python (``gvs_render_page``, holds the GIL),
yields with ``gevent.sleep``, then checksums the page and a large blob with
``hashlib`` (``gvs_checksum``, releases the GIL on big buffers).  A collector that
must take the GIL gets it in the hub's poll and inside the hashing, so it under-counts
the rendering (DESIGN.md, "Where samples land").  The truth is each part's own CPU
time (``time.thread_time``, the parts never switch greenlets inside) in runs without a
profiler.  No monkey-patching: the server uses gevent's own sockets.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from typing import Any

from . import seconds_per_unit

NAME = "gevent_server"
DESCRIPTION = "gevent StreamServer on loopback: handlers render (Python) + checksum (hashlib) + gevent.sleep"
PARTS = ("gvs_render_page", "gvs_checksum")
SINGLE_THREAD = False
CONNECTIONS = 4
RENDER_SECONDS = 0.0014  # CPU per request, about
CHECKSUM_SECONDS = 0.0006
SLEEP_SECONDS = 0.001


def gvs_render_page(rows: int) -> bytes:
    out = ["<table>"]
    for i in range(rows):
        out.append(f"<tr><td>{i}</td><td>{(i * i) % 97}</td><td>{'x' * (i % 7)}</td></tr>")
    out.append("</table>")
    return "".join(out).encode()


def gvs_checksum(body: bytes, blob: bytes) -> str:
    h = hashlib.sha256(blob)
    h.update(body)
    return h.hexdigest()


def calibrate(seconds: float) -> dict:
    rows = max(1, round(RENDER_SECONDS / seconds_per_unit(gvs_render_page, 1000)))
    probe = bytes(1 << 20)
    per_byte = seconds_per_unit(lambda _: gvs_checksum(b"", probe), 1) / len(probe)
    blob = max(1 << 12, round(CHECKSUM_SECONDS / per_byte))
    per_request = RENDER_SECONDS + CHECKSUM_SECONDS
    return {"rows": rows, "blob": blob, "requests": max(CONNECTIONS, round(seconds / per_request))}


def setup(params: dict) -> Any:
    import gevent  # noqa: F401 - imported untimed

    return dict(params, blob_bytes=bytes(range(256)) * (params["blob"] // 256 + 1))


def gvs_client(port: int, requests: int, deadline: float, out: dict) -> None:
    """Real blocking sockets in a real thread: ``requests`` requests over a few connections."""
    t0 = time.thread_time()
    conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(CONNECTIONS)]
    files = [c.makefile("rb") for c in conns]
    try:
        gvs_ask(conns, files, requests, deadline, out)
    finally:
        for f in files:
            f.close()
        for c in conns:
            c.close()
        out["client_cpu"] = time.thread_time() - t0


def gvs_ask(conns: list, files: list, requests: int, deadline: float, out: dict) -> int:
    """The client's loop on open connections (``files``: their readers): ``requests``
    requests, a batch of one per connection at a time, each batch's answers read
    before the next; the number answered (also ``out["answered"]`` as it goes)."""
    done = out["answered"] = 0
    while done < requests and time.monotonic() < deadline:
        batch = conns[:min(len(conns), requests - done)]
        for c in batch:
            c.sendall(b"GET\n")
        for f in files[:len(batch)]:
            if not f.readline():
                raise ConnectionError("the server closed the connection")
        done += len(batch)
        out["answered"] = done
    return done


def gvs_handler(rows: int, blob: bytes, spent: dict, per_greenlet: Any = None) -> Any:
    """The server's connection handler: each request line is answered with a page
    rendered and checksummed, a ``gevent.sleep`` between; each part's CPU is added
    to ``spent`` (and to ``per_greenlet``, see :func:`gvs_main`)."""
    import gevent

    clock = time.thread_time

    def handle(sock: Any, _address: Any) -> None:
        f = sock.makefile("rb")
        try:
            while f.readline():
                t0 = clock()
                body = gvs_render_page(rows)
                t1 = clock()
                spent["gvs_render_page"] += t1 - t0
                gevent.sleep(SLEEP_SECONDS)
                t2 = clock()
                digest = gvs_checksum(body, blob)
                spent["gvs_checksum"] += clock() - t2
                if per_greenlet is not None:
                    name = gevent.getcurrent().name
                    per_greenlet[name] = per_greenlet.get(name, 0.0) + (t1 - t0) + (clock() - t2)
                sock.sendall(f"{len(body)} {digest}\n".encode())
        finally:
            f.close()
            sock.close()

    return handle


def gvs_main(rows: int, blob: bytes, requests: int, per_greenlet: Any = None) -> dict:
    """The run; ``per_greenlet``, a dict, also gets each handler greenlet's CPU in the
    two parts, by gevent's name for it (``benchmarks/bench_greenlets.py``)."""
    import gevent
    from gevent.server import StreamServer

    spent = dict.fromkeys(PARTS, 0.0)
    handle = gvs_handler(rows, blob, spent, per_greenlet)
    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    client_out: dict = {}
    deadline = time.monotonic() + 60 + 10 * requests * (RENDER_SECONDS + CHECKSUM_SECONDS + SLEEP_SECONDS)
    client = threading.Thread(target=gvs_client, name="gvs-client",
                              args=(server.server_port, requests, deadline, client_out))
    client.start()
    try:
        while client.is_alive() and time.monotonic() < deadline:
            gevent.sleep(0.005)
    finally:
        server.stop(timeout=1)
        client.join(timeout=5)
    if client_out.get("answered") != requests:
        raise RuntimeError(f"the client got {client_out.get('answered')} of {requests} answers")
    return spent


def run(state: Any) -> dict:
    return gvs_main(state["rows"], state["blob_bytes"], state["requests"])
