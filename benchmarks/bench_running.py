"""Each workload's running cost: the slowdown target, resolved workload by workload.

    python -m benchmarks.bench_running [--quick] [--workloads a,b] [--json FILE]

Between fresh processes a workload's wall time differs by 1-4% with no profiler at
all, more than the 1% to resolve, so most slowdown checks of a quick run are left
open. Here each workload runs in a process of its own, and one sampler, made once
as the profiled runs make it (every thread, GC time on), is resumed and paused
around blocks of the workload's own ``run``, pairs in alternating order (as
``bench_sampler.py`` measures a deep stack): the differences between processes
cancel in each pair, and what is left is what the sampler costs while it samples.
What a run pays once (the sampler's start, the first look at each code object, the
final drain) is not in it: the fresh-process slowdown keeps those.

``gevent_server``'s ``run`` starts a server and a client and waits for the client
in 5 ms naps, which would round each block's end: its blocks are the requests of a
server kept serving, timed by the client (:class:`GeventServerBlocks`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.bench_sampler import RUNNING_COST_SETTINGS as SETTINGS  # noqa: E402
from benchmarks.bench_sampler import paired_cost, sized  # noqa: E402
from benchmarks.workloads import WORKLOADS, load  # noqa: E402

DELAYS = (0.005, 0.001)


class GeventServerBlocks:
    """The ``gevent_server`` workload's server (``workloads/gevent_server.py``:
    handlers that render a page, ``gevent.sleep`` and checksum it) kept serving in
    this thread's hub across blocks, and its client, a real thread with blocking
    sockets, kept connected: a block is ``requests`` requests, timed by the client
    (this thread waits in 5 ms naps meanwhile)."""

    def __init__(self) -> None:
        import gevent
        from gevent.server import StreamServer

        from benchmarks.workloads import gevent_server as workload

        self._gevent, self._workload = gevent, workload
        params = workload.setup(workload.calibrate(0.05))
        handle = workload.gvs_handler(params["rows"], params["blob_bytes"], dict.fromkeys(workload.PARTS, 0.0))
        self.server = StreamServer(("127.0.0.1", 0), handle)
        self.server.start()
        self.requests = 0
        self.took: Optional[float] = None
        self.failed: Optional[BaseException] = None
        self.go = threading.Event()
        self.client = threading.Thread(target=self._client, name="bench-client", daemon=True)
        self.client.start()

    def _client(self) -> None:
        port = self.server.server_port
        conns = [socket.create_connection(("127.0.0.1", port), timeout=30)
                 for _ in range(self._workload.CONNECTIONS)]
        files = [c.makefile("rb") for c in conns]
        try:
            while True:
                self.go.wait()
                self.go.clear()
                if self.requests <= 0:
                    return
                start = time.perf_counter()
                try:
                    self._workload.gvs_ask(conns, files, self.requests, time.monotonic() + 60, {})
                except BaseException as e:  # (told to the waiting thread)
                    self.failed = e
                    return
                finally:
                    self.took = time.perf_counter() - start
        finally:
            for f in files:
                f.close()
            for c in conns:
                c.close()

    def run(self, requests: int) -> float:
        """Seconds for the client to have ``requests`` requests answered."""
        self.took, self.requests = None, requests
        self.go.set()
        while self.took is None:
            self._gevent.sleep(0.005)
        if self.failed is not None:
            raise RuntimeError(f"the benchmark's client failed: {self.failed!r}")
        return self.took

    def close(self) -> None:
        self.requests = 0
        self.go.set()
        self.client.join(timeout=10)
        self.server.stop(timeout=1)


def _blocks(name: str, block_seconds: float) -> tuple[Callable[[], float], Callable[[], None]]:
    """One block of workload ``name`` (seconds it took) and what ends them."""
    if name == "gevent_server":
        server = GeventServerBlocks()
        requests = sized(server.run, block_seconds, 8)
        return (lambda: server.run(requests)), server.close
    module = load(name)
    state = module.setup(module.calibrate(block_seconds))

    def block() -> float:
        start = time.perf_counter()
        module.run(state)
        return time.perf_counter() - start

    return block, lambda: None


def measure(name: str, pairs: int, block_seconds: float, delays: tuple = DELAYS) -> list[dict]:
    """Workload ``name``'s running cost at each delay, in this process."""
    block, close = _blocks(name, block_seconds)
    try:
        block()  # (warm: the first run of a workload pays for its imports and caches)
        return [dict(paired_cost(block, delay, pairs, gc_time=True), workload=name,
                     block_seconds=block_seconds) for delay in delays]
    finally:
        close()


def run_all(names: list[str], pairs: int, block_seconds: float, python: str = sys.executable,
            env: Optional[dict] = None) -> list[dict]:
    """:func:`measure` of each workload in a fresh process (a workload's leftovers,
    a gevent hub, threads, never touch the next); a workload that fails gives a row
    with its ``error``."""
    rows: list[dict] = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cost.json")
            p = subprocess.run([python, "-m", "benchmarks.bench_running", "--one", name, "--pairs", str(pairs),
                                "--block", str(block_seconds), "--json", out],
                               capture_output=True, text=True, env=env, cwd=os.path.dirname(HERE), timeout=900)
            if p.returncode != 0 or not os.path.exists(out):
                rows.append({"workload": name, "error": (p.stdout + p.stderr)[-800:]})
                continue
            with open(out) as f:
                rows += json.load(f)
    return rows


def _percent(x: Optional[float]) -> str:
    """A spread as a percentage, or "unknown" (too few pairs to have one)."""
    return "unknown" if x is None else f"{100 * x:.1f}%"


def main(argv: Optional[list[str]] = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_running", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{SETTINGS['quick']['pairs']} pairs of "
                        f"{SETTINGS['quick']['block_seconds']:g} s blocks (else {SETTINGS['full']['pairs']})")
    parser.add_argument("--workloads", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    parser.add_argument("--one", help="measure this one workload here (what each fresh process runs)")
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--block", type=float, help="seconds per block")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    settings = dict(SETTINGS["quick" if args.quick else "full"])
    if args.pairs:
        settings["pairs"] = args.pairs
    if args.block:
        settings["block_seconds"] = args.block
    if args.one:
        rows = measure(args.one, settings["pairs"], settings["block_seconds"])
    else:
        names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
        rows = run_all(names, settings["pairs"], settings["block_seconds"])
        for r in rows:
            if "error" in r:
                print(f"{r['workload']}: failed: {r['error'][-200:]}")
            else:
                print(f"{r['workload']} at {r['delay'] * 1000:g} ms ({r['engine']}): {r['ratio']:.4f}x "
                      f"± {r['two_se'] or float('nan'):.4f} (2 SE, {r['pairs']} pairs; spread "
                      f"{_percent(r['spread'])}, control pairs {_percent(r['control_spread'])}); collector "
                      f"{r['collector_cpu_per_tick_us']:.0f} µs CPU/tick"
                      + (f", filing {r['filing_ms_per_s']:.1f} ms/s with the GIL"
                         if r.get("filing_ms_per_s") is not None else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
