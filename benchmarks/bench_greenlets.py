"""Greenlets (issue 12): attribution error per greenlet and the switch hook's cost,
stackshot beside yappi's greenlet mode.

* ``greenlets``: three plain greenlets with work 1:2:3; the truth is each worker's
  measured time between its switches (``benchmarks/workloads/greenlets.py``).
* ``gevent_server``: the StreamServer workload; the truth is each handler greenlet's
  CPU in its two parts (``time.thread_time``, ``gvs_main(per_greenlet=)``).
  stackshot: the CPU of the samples of each greenlet's context under those parts;
  yappi: ``ttot`` of the parts in each greenlet context (named after gevent's name for
  it through ``set_context_name_callback``).
* Error per greenlet: percentage points between its share of the parts' CPU among
  the workload's greenlets as measured and as true.
* Switches per second: two greenlets switching back and forth, with no profiler,
  under a stackshot sampler of their thread (the switch hook installed), and under
  yappi's greenlet mode. The C hook estimates the thread's CPU clock between
  reschedulings (``sampler/_native/switchclock.h``); its row ``...-clock-read`` reads
  it at every switch (``STACKSHOT_SWITCH_CLOCK=read``), as before, and each C row
  says how many switches read it.

Each measurement is a fresh interpreter.  Run:
``python -m benchmarks.bench_greenlets [--python PY] [--seconds S] [--rounds N]``;
it prints a table and, with ``--json FILE``, writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILERS = ("none", "stackshot-python-1ms", "stackshot-native-1ms", "yappi-greenlet")
SWITCH_PROFILERS = PROFILERS + ("stackshot-native-1ms-clock-read",)
SWITCHES = 200_000


# -- in the child ----------------------------------------------------------------------
def _start(profiler: str) -> Any:
    if profiler.startswith("stackshot-"):
        engine = profiler.split("-")[1]
        if engine == "python":  # (the pure-Python path whole: the switch hook's Python twin)
            os.environ["STACKSHOT_SWITCH_HOOK"] = "python"
        if profiler.endswith("-clock-read"):  # (the C hook reading the CPU clock at every switch)
            os.environ["STACKSHOT_SWITCH_CLOCK"] = "read"
        import sampler
        return sampler.create_sampler(threading.main_thread(), 0.001, engine=engine)
    if profiler == "yappi-greenlet":
        import yappi

        def name() -> str:
            from greenlet import getcurrent
            g = getcurrent()
            return getattr(g, "name", None) or getattr(getattr(g, "run", None), "__name__", None) \
                or type(g).__name__

        yappi.set_clock_type("cpu")
        yappi.set_context_backend("greenlet")
        yappi.set_context_name_callback(name)
        yappi.start(builtins=False)
        return yappi
    return None


def _stackshot_parts(snaps: Any, parts: tuple) -> dict:
    """CPU seconds per greenlet context under any of ``parts``, by the context's
    name up to its function (``Greenlet-3 (handle)`` -> ``Greenlet-3``)."""
    out: dict = {}
    deltas = snaps.cpu_deltas()
    names = {t.id: t.name.split(" (")[0] for t in snaps.threads if t.kind == "greenlet"}
    for i, (sid, tid) in enumerate(zip(snaps.sample_stack, snaps.sample_thread)):
        if sid and tid in names and any(f.name.rpartition(".")[2] in parts
                                        for f in snaps.stack_frames(sid)):
            out[names[tid]] = out.get(names[tid], 0.0) + deltas[i] / 1e6
    return out


def _yappi_parts(yappi: Any, parts: tuple, by_function: bool) -> dict:
    """CPU seconds under ``parts`` per greenlet context (by the context's name), or,
    ``by_function``, the ``ttot`` of each of ``parts`` (one greenlet each)."""
    out: dict = {}
    for ctx in yappi.get_greenlet_stats():
        for stat in yappi.get_func_stats(filter={"ctx_id": ctx.id}):
            name = stat.name.rpartition(".")[2]
            if name in parts:
                key = name if by_function else ctx.name
                out[key] = out.get(key, 0.0) + stat.ttot
    return out


def child_attribution(workload: str, profiler: str, seconds: float) -> dict:
    from benchmarks.workloads import gevent_server, greenlets
    if workload == "greenlets":
        mod, parts = greenlets, ("gl_spin",)
        yappi_parts = greenlets.PARTS
        state = mod.setup(mod.calibrate(seconds))
        ctl = _start(profiler)
        truth = mod.run(state)
    else:
        mod, parts = gevent_server, gevent_server.PARTS
        yappi_parts = parts
        state = mod.setup(mod.calibrate(seconds))
        truth = {}
        ctl = _start(profiler)
        mod.gvs_main(state["rows"], state["blob_bytes"], state["requests"], per_greenlet=truth)
    if profiler.startswith("stackshot-"):
        ctl.stop()
        snaps = ctl.get_snapshots()
        measured = _stackshot_parts(snaps, parts)
        engine = snaps.runs[0].engine or "python" if snaps.runs else "?"
    elif profiler == "yappi-greenlet":
        ctl.stop()
        measured, engine = _yappi_parts(ctl, yappi_parts, workload == "greenlets"), ""
    else:
        measured, engine = {}, ""
    return {"truth": truth, "measured": measured, "engine": engine}


def child_switches(profiler: str) -> dict:
    from greenlet import greenlet, getcurrent
    main = getcurrent()

    def ping() -> None:
        while True:
            main.switch()

    g = greenlet(ping)
    g.switch()
    ctl = _start(profiler)
    t0 = time.perf_counter()
    for _ in range(SWITCHES // 2):
        g.switch()
    elapsed = time.perf_counter() - t0
    out: dict = {"switches_per_s": SWITCHES / elapsed}
    if profiler.startswith("stackshot-"):
        from sampler import greenlets

        hook = greenlets._hooks.get(threading.get_ident())
        if hook is not None and hasattr(hook, "clock_reads"):
            out["clock_read_share"] = hook.clock_reads / max(hook.clock_reads + hook.clock_estimates, 1)
    if ctl is not None:
        ctl.stop()
    return out


# -- the driver ------------------------------------------------------------------------
def _child(python: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([python, "-m", "benchmarks.bench_greenlets", "--child", *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def errors(truth: dict, measured: dict) -> dict:
    """Points between each greenlet's measured and true share (a greenlet not seen
    counts as 0 measured)."""
    t_total, m_total = sum(truth.values()), sum(measured.get(k, 0.0) for k in truth)
    if not t_total or not m_total:
        return {k: float("nan") for k in truth}
    return {k: 100 * abs(measured.get(k, 0.0) / m_total - v / t_total) for k, v in truth.items()}


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--child", nargs="+")
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        out = (child_switches(rest[0]) if kind == "switches"
               else child_attribution(kind, rest[0], float(rest[1])))
        print(json.dumps(out))
        return
    results: dict = {"attribution": {}, "switches": {}}
    for workload in ("greenlets", "gevent_server"):
        for profiler in PROFILERS[1:]:
            runs = [_child(args.python, workload, profiler, str(args.seconds)) for _ in range(args.rounds)]
            errs = [errors(r["truth"], r["measured"]) for r in runs]
            results["attribution"][f"{workload} {profiler}"] = {
                "engine": runs[0]["engine"], "greenlets": len(runs[0]["truth"]),
                "mean_error_points": statistics.median(statistics.fmean(e.values()) for e in errs),
                "max_error_points": statistics.median(max(e.values()) for e in errs),
                "runs": runs}
    read_shares = {}
    for profiler in SWITCH_PROFILERS:
        runs = [_child(args.python, "switches", profiler) for _ in range(args.rounds)]
        results["switches"][profiler] = statistics.median(r["switches_per_s"] for r in runs)
        if "clock_read_share" in runs[0]:
            read_shares[profiler] = statistics.median(r["clock_read_share"] for r in runs)
    results["clock_read_share"] = read_shares
    print(f"{'workload / profiler':45} {'greenlets':>9} {'mean err':>9} {'max err':>8}  (points)")
    for key, r in results["attribution"].items():
        print(f"{key:45} {r['greenlets']:9d} {r['mean_error_points']:9.2f} {r['max_error_points']:8.2f}")
    base = results["switches"]["none"]
    print(f"\n{'switches/s (2 greenlets)':45} {'per s':>12} {'vs none':>8} {'us/switch':>9} {'clock read':>10}")
    for profiler, rate in results["switches"].items():
        share = f"{read_shares[profiler]:10.1%}" if profiler in read_shares else ""
        print(f"{profiler:45} {rate:12,.0f} {rate / base:8.2f} {1e6 / rate - 1e6 / base:9.2f} {share}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
