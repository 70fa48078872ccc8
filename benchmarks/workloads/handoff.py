"""A request handler woken by each request that parses, then responds, ~1 ms each.

A real thread-per-connection server shape: a client thread sends a request over a
socket pair and waits ~2 ms after each answer; the server (the thread that runs the
workload) blocks in ``recv``, then runs ``hnd_parse`` and ``hnd_respond`` (pure
Python, about 1 ms of CPU each) and answers.  The work changes between two samples
once per request, always from the first part to the second, and the first part
always starts right after a wait: a rule that charges an interval wholly to the
sample that ends it (``'end'``) gives ``hnd_respond`` the tail of ``hnd_parse`` every
time, and nothing comes back the other way (``analyzer.weights``, ``'split'``).  The
truth is each part's own CPU time (``time.thread_time``) in runs without a profiler.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from . import seconds_per_unit

NAME = "handoff"
DESCRIPTION = "a server thread woken by each request: parse (~1 ms) then respond (~1 ms), pure Python"
PARTS = ("hnd_parse", "hnd_respond")
SINGLE_THREAD = False
PART_SECONDS = 0.001
WAIT_SECONDS = 0.002


def hnd_parse(n: int) -> int:
    s = 0
    for i in range(n):
        s += (i * 7) % 13
    return s


def hnd_respond(n: int) -> int:
    s = 0
    for i in range(n):
        s ^= (i * 11) % 17
    return s


def calibrate(seconds: float) -> dict:
    n = max(1, round(PART_SECONDS / seconds_per_unit(hnd_parse, 100_000)))
    m = max(1, round(PART_SECONDS / seconds_per_unit(hnd_respond, 100_000)))
    return {"n": n, "m": m, "requests": max(1, round(seconds / (2 * PART_SECONDS + WAIT_SECONDS)))}


def setup(params: dict) -> Any:
    return params


def hnd_client(sock: socket.socket, requests: int, out: dict) -> None:
    """Send ``requests`` one-byte requests, each after the last answer and a wait."""
    done = 0
    try:
        for _ in range(requests):
            sock.sendall(b"?")
            if not sock.recv(1):
                break
            done += 1
            time.sleep(WAIT_SECONDS)
    finally:
        out["answered"] = done
        sock.close()


def hnd_main(n: int, m: int, requests: int) -> dict:
    spent = dict.fromkeys(PARTS, 0.0)
    clock = time.thread_time
    server, client = socket.socketpair()
    out: dict = {}
    thread = threading.Thread(target=hnd_client, name="hnd-client", args=(client, requests, out))
    thread.start()
    try:
        while server.recv(1):
            t0 = clock()
            hnd_parse(n)
            t1 = clock()
            hnd_respond(m)
            t2 = clock()
            spent["hnd_parse"] += t1 - t0
            spent["hnd_respond"] += t2 - t1
            server.sendall(b"!")
    finally:
        thread.join(timeout=30)
        server.close()
    if out.get("answered") != requests:
        raise RuntimeError(f"the client got {out.get('answered')} of {requests} answers")
    return spent


def run(state: Any) -> dict:
    return hnd_main(state["n"], state["m"], state["requests"])
