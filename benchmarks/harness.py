"""The benchmark driver: stackshot side by side with the profilers users would pick instead.

    python -m benchmarks [--quick | --smoke] [--install] [--workloads a,b] [--profilers x,y]

Every measurement runs in a fresh interpreter (:mod:`benchmarks.child`), so nothing
one profiler leaves behind touches the next.  For each workload, rounds alternate
"no profiler" with each profiler in turn (the order rotating from round to round),
and a profiler's slowdown is its time over the time of the no-profiler run just
before it: on a shared, noisy 2-core machine only such paired ratios, and their
median, mean anything.  Results go to a JSON file and to ``benchmarks/RESULTS.md``.

The peers (py-spy, pyinstrument, yappi) come from ``benchmarks/requirements.txt``,
installed with ``--install`` into a virtual environment of the benchmark's own
(``--venv``, default ``/tmp/bench-venv``); a peer that is missing or cannot run is
reported as such, never silently dropped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from . import attribution
from .workloads import WORKLOADS, is_workload_file, load

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_VENV = "/tmp/bench-venv"

CONFIGS: dict[str, dict] = {
    "none": {"profiler": "none"},
    # stackshot runs once per engine (issue 9): the native engine reads frames without
    # the GIL, the Python engine takes it (DESIGN.md, "Where samples land")
    "stackshot-native-5ms": {"profiler": "stackshot", "delay": 0.005, "engine": "native"},
    "stackshot-native-1ms": {"profiler": "stackshot", "delay": 0.001, "engine": "native"},
    "stackshot-python-5ms": {"profiler": "stackshot", "delay": 0.005, "engine": "python"},
    "stackshot-python-1ms": {"profiler": "stackshot", "delay": 0.001, "engine": "python"},
    "py-spy-200": {"external": "py-spy", "rate": 200},
    "py-spy-1000": {"external": "py-spy", "rate": 1000},
    "pyinstrument": {"profiler": "pyinstrument", "interval": 0.001},
    "yappi": {"profiler": "yappi"},
    "cProfile": {"profiler": "cProfile"},
}
REFERENCE = "py-spy-1000"  # judge of the workloads without a measured truth
ENGINES = ("native", "python")
SLOWDOWN_LIMITS = {0.005: 1.01, 0.001: 1.03}  # issue 9's targets, by sampling delay
ERROR_LIMIT = 2.0  # points of attribution error (issue 9)
RATE_LIMIT = 0.95  # achieved over requested rate (issue 9)
RATE_WORKLOADS = {"deep": 1, "threads8": 8}  # where the rate is judged: busy threads each
TIE_POINTS = 0.5
"""Accuracy differences below this many points count as a tie when judging "no peer
ahead": medians of a few runs do not resolve finer differences (compare the spread
of each error over its runs in the JSON)."""

MODES = {
    # seconds of work per run (unprofiled), rounds, sampler microbenchmark flags,
    # bench_running.py flags (each workload's running cost, on the native engine)
    "smoke": {"seconds": 0.15, "rounds": 1, "sampler_bench": None, "running_cost": None},
    "quick": {"seconds": 0.4, "rounds": 3, "sampler_bench": ["--quick"], "running_cost": ["--quick"]},
    "full": {"seconds": 1.0, "rounds": 7, "sampler_bench": [], "running_cost": []},
}


# -- environment -------------------------------------------------------------------------

def install(venv: str) -> None:
    """Create ``venv`` (if needed) and install into it the peers from
    requirements.txt and this checkout, editable: that builds the C extension in
    the checkout, which the measured processes import first (a fresh clone has none,
    and its native rows were skipped)."""
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "-r", os.path.join(HERE, "requirements.txt")],
                   check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", REPO], check=True)


def child_env(engine: Optional[str] = None) -> dict:
    """The environment of every measured process: this checkout first on the path, and
    ``STACKSHOT_ENGINE`` set to ``engine`` (removed when None). The Python engine's
    rows run the pure-Python path whole, with the greenlet switch hook's Python twin
    (``STACKSHOT_SWITCH_HOOK=python``), as where the extension is not built."""
    env = dict(os.environ)
    env.pop("STACKSHOT_ENGINE", None)
    env.pop("STACKSHOT_SWITCH_HOOK", None)
    if engine:
        env["STACKSHOT_ENGINE"] = engine
    if engine == "python":
        env["STACKSHOT_SWITCH_HOOK"] = "python"
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONHASHSEED"] = "0"
    return env


def _run_text(cmd: list[str], timeout: float = 60, engine: Optional[str] = None) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(engine))
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, str(e)
    return p.returncode, (p.stdout + p.stderr).strip()


def probe_peers(python: str, pyspy: Optional[str]) -> dict:
    """Which peers can run here, their versions, and why not when they cannot.

    py-spy is probed for real: it needs ptrace (``process_vm_readv``) on its child,
    which a container may forbid even to root; the error it prints is kept.
    """
    out: dict[str, Any] = {}
    code = ("import importlib.metadata as m, json\n"
            "v = {}\n"
            "for n in ('pyinstrument', 'yappi', 'greenlet', 'gevent'):\n"
            "    try: v[n] = m.version(n)\n"
            "    except Exception: v[n] = None\n"
            "print(json.dumps(v))")
    rc, text = _run_text([python, "-c", code])
    versions = json.loads(text.splitlines()[-1]) if rc == 0 else {}
    for name in ("pyinstrument", "yappi", "greenlet", "gevent"):
        out[name] = {"version": versions.get(name), "ok": bool(versions.get(name)),
                     "error": None if versions.get(name) else f"{name} is not installed in {python}"}
    if pyspy is None:
        out["py-spy"] = {"version": None, "ok": False, "error": "py-spy not found (run with --install)"}
    else:
        rc, version = _run_text([pyspy, "--version"])
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "spin.py")
            with open(target, "w") as f:
                f.write("s = 0\nfor i in range(3_000_000):\n    s += i % 7\n")
            raw = os.path.join(tmp, "out.txt")
            rc, text = _run_text([pyspy, "record", "--rate", "200", "--format", "raw", "-o", raw,
                                  "--", python, target])
            ok = rc == 0 and os.path.exists(raw) and os.path.getsize(raw) > 0
        out["py-spy"] = {"version": version.split()[-1] if version else None, "ok": ok,
                         "error": None if ok else f"py-spy record failed (exit {rc}): {text[-800:]}"}
    return out


ENGINE_PROBE = """
import json, sys, threading, time
import sampler
engine = sys.argv[1]
try:
    ctl = sampler.create_sampler(threading.main_thread(), 0.001, engine=engine)
except TypeError as e:
    if "engine" not in str(e):
        raise
    ctl = sampler.create_sampler(threading.main_thread(), 0.001)
end = time.perf_counter() + 0.05
while time.perf_counter() < end:
    pass
ctl.stop()
run = ctl.get_snapshots().runs[0]
print(json.dumps({"used": getattr(run, "engine", "") or "python", "ticks": run.ticks}))
"""


def probe_engines(python: str) -> dict:
    """Which of stackshot's engines run here: each asked for (environment and argument),
    and the engine the run reports having used.  An engine that is asked for but not
    used (a sampler without it falls back, or ignores the request) is not available."""
    out = {}
    for engine in ENGINES:
        rc, text = _run_text([python, "-c", ENGINE_PROBE, engine], engine=engine)
        try:
            used = json.loads(text.splitlines()[-1])["used"] if rc == 0 else None
        except (ValueError, KeyError, IndexError):
            used = None
        ok = used == engine
        error = None if ok else (
            f"asked for the {engine} engine, the sampler ran the {used} engine" if used
            else f"asking for the {engine} engine failed (exit {rc}): {text[-600:]}")
        out[engine] = {"ok": ok, "used": used, "error": error}
    return out


def machine_info(python: str) -> dict:
    """What the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
            mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    rc, pyver = _run_text([python, "-c", "import sys, platform; print(platform.python_implementation(), sys.version.split()[0])"])
    rc2, stackshot = _run_text([python, "-c", "import sampler; print(sampler.__version__)"])
    rc3, commit = _run_text(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    rc4, dirty = _run_text(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"])
    return {
        "cpu": model, "cores": os.cpu_count(), "memory": mem, "platform": platform.platform(),
        "python": pyver if rc == 0 else "?", "python_path": python,
        "stackshot": (stackshot if rc2 == 0 else "?") + (f" (git {commit}{'+' if dirty else ''})" if rc3 == 0 else ""),
        "load_average_start": os.getloadavg(),
    }


# -- one measurement ---------------------------------------------------------------------

class Runner:
    """Runs single measurements in fresh processes and keeps the raw results."""

    def __init__(self, python: str, pyspy: Optional[str], timeout: float) -> None:
        self.python = python
        self.pyspy = pyspy
        self.timeout = timeout

    def child(self, spec: dict, wrap: Optional[list[str]] = None) -> dict:
        """Run :mod:`benchmarks.child` on ``spec`` (under ``wrap``, e.g. py-spy) and return its result."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            cmd = [self.python, "-m", "benchmarks.child", json.dumps(spec), out]
            if wrap:
                cmd = wrap + ["--"] + cmd
            try:
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=child_env(spec.get("engine")), cwd=REPO, timeout=self.timeout)
            except subprocess.TimeoutExpired as e:
                raise MeasurementError(f"timed out after {self.timeout:.0f} s: {e.output!r:.1500}") from None
            if proc.returncode != 0 or not os.path.exists(out):
                raise MeasurementError(f"exit {proc.returncode}: {proc.stdout[-1500:]}")
            with open(out) as f:
                return json.load(f)

    def calibrate(self, workload: str, seconds: float) -> dict:
        return self.child({"workload": workload, "calibrate": seconds})["params"]

    def measure(self, workload: str, params: dict, config: str) -> dict:
        conf = CONFIGS[config]
        if conf.get("external") == "py-spy":
            return self._measure_pyspy(workload, params, conf["rate"])
        spec = dict(conf, workload=workload, params=params)
        return self.child(spec)

    def _under_pyspy(self, spec: dict, rate: int) -> tuple[dict, list]:
        """The child of ``spec``, recorded by py-spy at ``rate`` from outside: its
        result and py-spy's stacks (:func:`attribution.parse_pyspy_raw`)."""
        assert self.pyspy is not None
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "pyspy.txt")
            wrap = [self.pyspy, "record", "--rate", str(rate), "--format", "raw", "--nolineno",
                    "--full-filenames", "-o", raw]
            result = self.child(spec, wrap)
            with open(raw) as f:
                return result, attribution.parse_pyspy_raw(f.read())

    def measure_beside_reference(self, workload: str, params: dict, config: str) -> dict:
        """A run of stackshot ``config`` that the reference (py-spy-1000) records too,
        from outside, in the same process: its result, with py-spy's profile of that
        process as ``reference_profile``. (A program's own split of time moves from
        process to process: spectral_norm's sn_times_u had 17-22% of py-spy-1000's
        samples from one process to the next, on one machine, so a profile from one
        process judged against py-spy's from others mixes that in. Two samplers of one
        process differ only by their sampling and their biases.) Only the workload's
        own frames count in either profile, as everywhere: the sampler's own threads
        that py-spy sees have none.

        py-spy stops the process to read it, as in its own rows, and so some of
        stackshot's samples find the thread stopped (``t`` in ``/proc``): the native
        engine takes a stopped thread for one preempted where it computes. (Taken
        for asleep, nbody's nb_pair came out 3.1 ± 0.5 points under py-spy's share
        of the same processes.) Read without stops (``--nonblocking``), py-spy
        mixes moments in its own reads: its nb_pair came out 1.8 points under its
        share with stops, with stackshot beside it in both."""
        spec = dict(CONFIGS[config], workload=workload, params=params)
        result, stacks = self._under_pyspy(spec, CONFIGS[REFERENCE]["rate"])
        result["reference_profile"] = attribution.from_stacks(stacks)
        return result

    def _measure_pyspy(self, workload: str, params: dict, rate: int) -> dict:
        """py-spy records the unprofiled child from outside, raw collapsed stacks out."""
        result, stacks = self._under_pyspy({"workload": workload, "profiler": "none", "params": params}, rate)
        profile = attribution.from_stacks(stacks)
        # Samples taken inside the timed run: under the workload's ``run`` or one of its
        # parts (a greenlet's stack does not reach down to ``run``).
        module = load(workload)
        marks = {"run", *module.PARTS}
        in_run = sum(w for frames, w in stacks
                     if any(n in marks and is_workload_file(f) for n, f in frames))
        samples = sum(w for _, w in stacks)
        stats = {"samples": samples, "ticks_in_run": in_run}
        if module.SINGLE_THREAD and result["elapsed"] > 0:
            stats["achieved_rate"] = in_run / result["elapsed"]
            stats["requested_rate"] = rate
            stats["rate_ratio"] = stats["achieved_rate"] / rate
        result["profiles"] = {"default": profile}
        result["stats"] = stats
        return result


class MeasurementError(RuntimeError):
    """A measured process failed; its output tail is the message."""


# -- the plan ----------------------------------------------------------------------------

BUSY_MARK = "stackshot-benchmarks-busy"  # (in each busy process's command line)


def start_busy() -> subprocess.Popen:
    """A process that spins in a Python loop: a loaded machine, on purpose. Its
    command line holds :data:`BUSY_MARK` and ``parent=<this process's pid>``, so
    that one left behind by a run that ended can be told from another run's."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass", BUSY_MARK,
                             f"parent={os.getpid()}"])


def stop_busy(procs: list) -> Optional[float]:
    """Stop the processes of :func:`start_busy`; the CPU seconds they had, all told
    (``None`` where ``/proc`` does not tell)."""
    spent: Optional[float] = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if spent is not None:
                spent += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        except (OSError, IndexError, ValueError):
            spent = None
        p.kill()
        p.wait()
    return spent


def run_benchmarks(runner: Runner, workloads: list[str], configs: list[str], mode: dict,
                   log: Any = sys.stderr) -> dict:
    """Calibrate each workload, then alternate no-profiler and profiler runs, round by round.

    With ``mode["busy"]``, the rounds run beside that many busy processes (the
    calibration does not: each workload keeps the shape it has on a quiet machine,
    and only the load differs)."""
    params: dict[str, dict] = {}
    for w in workloads:
        print(f"calibrating {w} ...", file=log, flush=True)
        params[w] = runner.calibrate(w, mode["seconds"])
    busy: list = []
    try:
        for _ in range(mode.get("busy", 0)):
            busy.append(start_busy())
        result = _rounds(runner, workloads, configs, mode, params, log)
    finally:
        busy_cpu = stop_busy(busy)
    if busy and busy_cpu is not None:
        result["busy_cpu_seconds"] = busy_cpu
    return result


def _rounds(runner: Runner, workloads: list[str], configs: list[str], mode: dict, params: dict,
            log: Any) -> dict:
    """The rounds of :func:`run_benchmarks`: in each, per workload, a run without a
    profiler beside each profiler's run, the profilers' order rotating by round."""
    runs: dict[str, dict[str, list]] = {w: {c: [] for c in ["none"] + configs} for w in workloads}
    errors: list[dict] = []
    others = [c for c in configs if c != "none"]
    for r in range(mode["rounds"]):
        for w in workloads:
            order = others[r % len(others):] + others[:r % len(others)] if others else []
            pairs = [("none", c) for c in order] or [("none", None)]
            for base, c in pairs:
                pair = {}
                for cfg in (base, c):
                    if cfg is None:
                        continue
                    print(f"round {r + 1}/{mode['rounds']} {w:14s} {cfg}", file=log, flush=True)
                    try:
                        pair[cfg] = runner.measure(w, params[w], cfg)
                    except MeasurementError as e:
                        errors.append({"workload": w, "config": cfg, "round": r, "error": str(e)})
                        print(f"  failed: {str(e)[:300]}", file=log, flush=True)
                if "none" in pair:
                    runs[w]["none"].append(pair["none"])
                if c is not None and c in pair:
                    if "none" in pair:
                        pair[c]["paired_baseline"] = {"elapsed": pair["none"]["elapsed"],
                                                      "process_cpu": pair["none"]["process_cpu"],
                                                      "maxrss_kb_run": pair["none"]["maxrss_kb_run"],
                                                      "workload_stats": pair["none"].get("workload_stats", {})}
                    pair[c]["round"] = r
                    runs[w][c].append(pair[c])
            if REFERENCE in configs and not load(w).PARTS:  # (no truth: judged against py-spy)
                for c in order:
                    if CONFIGS[c].get("profiler") != "stackshot":
                        continue
                    key = beside_reference(c)
                    print(f"round {r + 1}/{mode['rounds']} {w:14s} {key}", file=log, flush=True)
                    try:
                        run = runner.measure_beside_reference(w, params[w], c)
                    except MeasurementError as e:
                        errors.append({"workload": w, "config": key, "round": r, "error": str(e)})
                        print(f"  failed: {str(e)[:300]}", file=log, flush=True)
                        continue
                    run["round"] = r
                    runs[w].setdefault(key, []).append(run)
    return {"params": params, "runs": runs, "errors": errors}


def beside_reference(config: str) -> str:
    """The key, among a workload's raw runs, of ``config``'s runs that the reference
    recorded in the same process (:meth:`Runner.measure_beside_reference`)."""
    return f"{config} beside {REFERENCE}"


# -- summarising -------------------------------------------------------------------------

def _median(xs: list) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _spread(xs: list) -> Optional[list]:
    xs = [x for x in xs if x is not None]
    return [min(xs), max(xs)] if xs else None


def variants(config: str, run: dict) -> list[tuple[str, dict]]:
    """``(label, profile)`` per analysis variant of one run.

    stackshot's runs carry one profile per interval rule; the analyzer's default
    rule is the headline (labelled with the bare config name), the other is shown
    as ``"stackshot-5ms (end)"`` or ``"(midpoint)"``.
    """
    # runs recorded before the key existed were analysed with Racket's midpoint rule;
    # None means "the input's natural rule" for stackshot's snapshots ('end', later 'active')
    default = run.get("stats", {}).get("default_interval", "midpoint")
    if default is None:
        from analyzer.weights import resolve_interval

        default = resolve_interval(None)
    out = []
    for v, prof in run.get("profiles", {}).items():
        out.append((config if v in ("default", default) else f"{config} ({v})", prof))
    return out


def summarise(raw: dict, configs: list[str]) -> dict:
    """Medians and accuracy figures per workload and profiler, from the raw runs."""
    summary: dict[str, Any] = {}
    for w, by_config in raw["runs"].items():
        module = load(w)
        base_runs = by_config.get("none", [])
        truth = None
        if module.PARTS and base_runs:
            truth = attribution.shares(attribution.pooled(r["parts_seconds"] for r in base_runs), module.PARTS)
        reference = None
        ref_runs = by_config.get(REFERENCE, [])
        if ref_runs:
            reference = [r["profiles"]["default"]["self"] for r in ref_runs]
        # py-spy's own noise: the TVD of self time between its consecutive runs
        pair_tvds = []
        for a, b in zip(reference or [], (reference or [])[1:]):
            p, q = attribution.shares(a), attribution.shares(b)
            if p is not None and q is not None:
                pair_tvds.append(attribution.tvd_points(p, q))
        ws: dict[str, Any] = {"description": module.DESCRIPTION, "parts": list(module.PARTS),
                              "truth": truth, "params": raw["params"].get(w), "configs": {},
                              "accuracy": {},
                              "reference_noise": {"pair_tvds": [round(x, 2) for x in pair_tvds],
                                                  "median_pair_tvd": _median(pair_tvds)}}
        if truth and w == "function_bias":
            ws["calibrated_truth"] = raw["params"][w].get("calibrated_share")
        # each no-profiler run's shares (runs that timed nothing left out)
        truth_runs = [x for x in (attribution.shares(r["parts_seconds"], module.PARTS)
                                  for r in base_runs) if x is not None] if truth else []
        if truth:
            ws["truth_noise_points"] = _truth_noise(truth_runs, module.PARTS)
        base_elapsed = _median([r["elapsed"] for r in base_runs])
        # The noise floor of a slowdown: the same ratio between two consecutive
        # no-profiler runs, which should be 1.
        control = [b["elapsed"] / a["elapsed"] for a, b in zip(base_runs, base_runs[1:])]
        ws["noise"] = {"none_over_previous_none": [round(x, 4) for x in control],
                       "median_abs_deviation": _median([abs(x - 1) for x in control]),
                       "none_cpu_over_wall": _median([r["process_cpu"] / r["elapsed"] for r in base_runs])}
        base_rss = _median([r["maxrss_kb_run"] for r in base_runs])
        for c in ["none"] + configs:
            rs = by_config.get(c, [])
            if not rs:
                continue
            ratios = [r["elapsed"] / r["paired_baseline"]["elapsed"] for r in rs if "paired_baseline" in r]
            cpu_ratios = [r["process_cpu"] / r["paired_baseline"]["process_cpu"] for r in rs
                          if "paired_baseline" in r and r["paired_baseline"]["process_cpu"] > 0]
            stats = [r.get("stats", {}) for r in rs]
            entry = {
                "runs": len(rs),
                "elapsed_median": _median([r["elapsed"] for r in rs]),
                "slowdown": _median(ratios), "slowdown_range": _spread(ratios),
                "slowdown_runs": [round(x, 4) for x in ratios],
                # min over min: contention from other processes only ever adds time,
                # so the fastest runs are the least disturbed (a second estimate)
                "slowdown_of_minimums": (min(r["elapsed"] for r in rs) / min(r["elapsed"] for r in base_runs))
                if base_runs else None,
                # how much of the wall time the process got the CPU: ~1.0 for a
                # single-threaded CPU-bound run on a quiet machine, less when others ran
                "cpu_over_wall": _median([r["process_cpu"] / r["elapsed"] for r in rs]),
                "process_cpu_ratio": _median(cpu_ratios),
                "maxrss_mb": _median([r["maxrss_kb_run"] / 1024 for r in rs]),
                "maxrss_delta_mb": (_median([r["maxrss_kb_run"] for r in rs]) - base_rss) / 1024
                if base_rss is not None else None,
            }
            engines = sorted({s["engine"] for s in stats if s.get("engine")})
            if engines:
                entry["engine"] = ",".join(engines)
            entry.update(_gap_figures(rs))
            entry.update(_gc_figures(rs))
            analysis_errors = [s["analysis_error"] for s in stats if s.get("analysis_error")]
            if analysis_errors:
                entry["analysis_errors"] = analysis_errors
            for key in ("rate_ratio", "achieved_rate", "requested_rate", "collector_cpu_per_tick_us",
                        "collector_cpu_share",
                        "column_bytes_per_sample", "file_bytes_per_sample", "analysis_seconds", "samples"):
                entry[key] = _median([s.get(key) for s in stats])
            if any("late_ticks" in s for s in stats):
                entry["late_fraction"] = _median([s["late_ticks"] / s["ticks"] for s in stats if s.get("ticks")])
                entry["missed_fraction"] = _median([s["missed_ticks"] / (s["ticks"] + s["missed_ticks"])
                                                    for s in stats if s.get("ticks")])
            if entry.get("analysis_seconds") is not None and entry.get("samples"):
                entry["analysis_us_per_sample"] = entry["analysis_seconds"] / entry["samples"] * 1e6
            if base_elapsed:
                entry["elapsed_over_base_median"] = entry["elapsed_median"] / base_elapsed
            ws["configs"][c] = entry
            # accuracy, per analysis variant
            per_variant: dict[str, dict[str, list]] = {}
            for i, r in enumerate(rs):
                for label, prof in variants(c, r):
                    acc = per_variant.setdefault(label, {"error": [], "tvd": [], "shares": [], "blind": 0,
                                                         "pooled": [], "own": [], "paired": []})
                    if truth:
                        got = attribution.shares(prof["inclusive"], module.PARTS)
                        if got is None:
                            acc["blind"] += 1
                        else:
                            # each run weighs the same in the pool, whatever its unit
                            acc["pooled"].append(got)
                            acc["error"].append(attribution.max_error_points(got, truth))
                            acc["shares"].append(got)
                            own = attribution.shares(r.get("parts_seconds") or {}, module.PARTS)
                            if own is not None:
                                acc["own"].append(attribution.max_error_points(got, own))
                                acc["paired"].append((got, own))
                    if reference:
                        # py-spy-1000 is judged against its other runs (leave one out)
                        refs = [x for j, x in enumerate(reference) if not (c == REFERENCE and j == i)]
                        p = attribution.shares(prof["self"])
                        q = attribution.shares(attribution.pooled(refs)) if refs else None
                        if p is not None and q is not None:
                            acc["tvd"].append(attribution.tvd_points(p, q))
            for label, acc in per_variant.items():
                pooled_error = None
                if acc["pooled"]:
                    got = attribution.shares(attribution.pooled(acc["pooled"]), module.PARTS)
                    pooled_error = attribution.max_error_points(got, truth) if got else None
                ws["accuracy"][label] = {
                    "runs": len(acc["error"]),
                    "error_points": _median(acc["error"]), "error_range": _spread(acc["error"]),
                    # all runs' profiles summed: sampling noise averages out, bias stays
                    "pooled_error_points": pooled_error,
                    # against the parts' thread_time in the profiled run itself: what
                    # the profiler missed of that run, whatever the run-to-run drift
                    "own_error_points": _median(acc["own"]),
                    # the mean over runs against the no-profiler runs' mean, and the
                    # same run by run against each run's own clocks, with standard errors
                    "bias": attribution.share_bias(acc["shares"], truth_runs, module.PARTS)
                    if truth else None,
                    "own_bias": attribution.share_bias([g for g, _ in acc["paired"]],
                                                       [o for _, o in acc["paired"]], module.PARTS, paired=True)
                    if truth else None,
                    "tvd_vs_reference": _median(acc["tvd"]), "blind_runs": acc["blind"],
                    "shares": {k: _median([s[k] for s in acc["shares"]]) for k in module.PARTS}
                    if acc["shares"] else None,
                }
            beside = _beside_reference(c, by_config.get(beside_reference(c), []))
            if beside is not None and c in ws["accuracy"]:
                ws["accuracy"][c]["beside_reference"] = beside
        summary[w] = ws
    return summary


def _beside_reference(config: str, runs: list) -> Optional[dict]:
    """How far ``config``'s headline profile sits from py-spy-1000's of the same
    processes (``runs``: :meth:`Runner.measure_beside_reference`): the TVD of self
    time run by run, and the bias function by function (the mean over runs of the
    difference of shares, with its standard error: :func:`attribution.share_bias`,
    paired), or None without such runs."""
    pairs = []
    for r in runs:
        q = attribution.shares(r["reference_profile"]["self"])
        for label, prof in variants(config, r):
            p = attribution.shares(prof["self"]) if label == config else None
            if p is not None and q is not None:
                pairs.append((p, q))
    if not pairs:
        return None
    names = sorted({k for p, q in pairs for k in (*p, *q)})
    return {"runs": len(pairs),
            "tvd": _median([attribution.tvd_points(p, q) for p, q in pairs]),
            "bias": attribution.share_bias([p for p, _ in pairs], [q for _, q in pairs], names, paired=True)}


def _truth_noise(shares: list, parts: tuple) -> Optional[float]:
    """How far one no-profiler run's shares (``shares``, one map per run) stray from
    the truth the others make (median over runs, in points): the floor under any
    profiler's error against the truth, on a machine where the parts' costs drift
    from run to run."""
    errors = []
    for i, mine in enumerate(shares):
        others = [x for j, x in enumerate(shares) if j != i]
        if not others:
            continue
        rest = attribution.shares(attribution.pooled(others), parts)
        if rest is not None:
            errors.append(attribution.max_error_points(mine, rest))
    return _median(errors)


def _gap_figures(rs: list) -> dict:
    """The pauses of the ``gap`` workload's loop: what the profiler added to them.

    ``gap_lost_us_per_tick``: pauses containing one of stackshot's ticks, per tick
    (matched in the child); ``gap_excess_*``: all pauses of the run minus those of the
    paired no-profiler run, per tick (stackshot's ticks, py-spy's samples in the run)
    and as a share of the run -- for every profiler, noisier (the OS preempts too).
    """
    ws = [r.get("workload_stats") or {} for r in rs]
    if not any("gap_ns" in x for x in ws):
        return {}
    per_tick, share, own = [], [], []
    for r, x in zip(rs, ws):
        if "gap_ns" not in x:
            continue
        own.append(x["gap_ns"] / 1e9 / r["elapsed"])
        base = (r.get("paired_baseline") or {}).get("workload_stats", {}).get("gap_ns")
        if base is None:
            continue
        share.append((x["gap_ns"] - base) / 1e9 / r["elapsed"])
        st = r.get("stats", {})
        ticks = st.get("ticks") or st.get("ticks_in_run")
        if ticks:
            per_tick.append((x["gap_ns"] - base) / 1e3 / ticks)
    return {"gap_share": _median(own), "gap_excess_share": _median(share),
            "gap_excess_us_per_tick": _median(per_tick),
            "gap_lost_us_per_tick": _median([x.get("gap_lost_us_per_tick") for x in ws]),
            "gap_ticks_hit": _median([x.get("gap_ticks_hit") for x in ws]),
            "gap_matched_median_us": _median([x.get("gap_matched_median_us") for x in ws]),
            "gap_chance_ticks_hit": _median([x.get("gap_chance_ticks_hit") for x in ws]),
            "gap_chance_lost_us_per_tick": _median([x.get("gap_chance_lost_us_per_tick") for x in ws])}


def _gc_figures(rs: list) -> dict:
    """The ``gc_heavy`` workload: the GC time the profiler reported over the time of the
    collections the workload timed itself (``gc.callbacks``): 1.0 is exact."""
    ratios = []
    for r in rs:
        measured = (r.get("workload_stats") or {}).get("gc_callback_seconds")
        reported = (r.get("stats") or {}).get("gc_seconds")
        if measured and reported is not None:
            ratios.append(reported / measured)
    return {"gc_reported_over_measured": _median(ratios)} if ratios else {}


def stackshot_configs(configs: list[str]) -> list[str]:
    """stackshot's rows among ``configs``, in table order."""
    return [c for c in configs if CONFIGS.get(c, {}).get("profiler") == "stackshot"]


# -- targets ------------------------------------------------------------------------------

def judge_targets(summary: dict) -> list[dict]:
    """stackshot against issue 9's targets, each with the figure it was judged on.

    Every stackshot row (engine x delay) is judged: attribution error <= 2 points on
    every workload (against the measured truth; where none is known, the TVD from
    py-spy-1000 may exceed that of py-spy at the row's own rate by at most 2 points:
    :func:`tvd_noise_floor`), slowdown <= 1.01x at 5 ms and <= 1.03x at 1 ms (beyond
    two standard errors: :func:`slowdown_estimate`), achieved rate >= 95% with 1 busy
    thread (``deep``) and with 8 (``threads8``).  Each check carries ``engine``,
    ``delay`` and ``kind`` so the report can say met / not met per row.
    """
    checks: list[dict] = []

    def add(*args: Any, **kwargs: Any) -> None:
        checks.append(_check(*args, **kwargs))

    for w, ws in summary.items():
        cfgs = ws["configs"]
        ours_configs = [c for c in CONFIGS if CONFIGS[c].get("profiler") == "stackshot" and c in cfgs]
        spread = ws["noise"]["median_abs_deviation"]
        for c in ours_configs:
            limit = SLOWDOWN_LIMITS.get(CONFIGS[c]["delay"])
            s = cfgs[c].get("slowdown")
            if s is not None and limit is not None:
                est = slowdown_estimate(cfgs[c].get("slowdown_runs") or [],
                                        ws["noise"]["none_over_previous_none"])
                beside = [_slowdown_text(est), "" if spread is None else f"none/none spread {spread:.1%}"]
                add(f"slowdown, {c}, {w}", s, f"<= {limit:.2f}x", _slowdown_within(est, limit),
                    "; ".join(x for x in beside if x), c, "slowdown", w)
        if w in RATE_WORKLOADS:
            for c in ours_configs:
                rr = cfgs[c].get("rate_ratio")
                if rr is not None:
                    n = RATE_WORKLOADS[w]
                    add(f"rate, {c}, {n} busy thread{'s' if n > 1 else ''} ({w})", rr,
                        f">= {RATE_LIMIT:.0%} of requested", rr >= RATE_LIMIT, "", c, "rate", w)
        acc = ws["accuracy"]
        for c in ours_configs:
            a = acc.get(c, {})
            if ws["truth"]:
                # Judged on the bias against each run's own clocks (every part's
                # thread_time in the profiled run itself), mean over runs, beyond its
                # 95% range (attribution.reach): the parts' costs drift between runs
                # by about as much as the target, so no number of runs on this machine
                # resolves 2 points against the no-profiler runs (that figure is
                # beside it).
                own, bias = a.get("own_bias"), a.get("bias")
                e = a.get("error_points")
                if own is not None:
                    beside = [_bias_text("bias against each run's own clocks", own),
                              _bias_text("against the no-profiler runs", bias),
                              f"median of single runs: {e:.1f}" if e is not None else "",
                              f"no-profiler runs against each other: {ws['truth_noise_points']:.1f}"
                              if ws.get("truth_noise_points") is not None else ""]
                    add(f"attribution error, {c}, {w}", own["points"], f"<= {ERROR_LIMIT:g} points",
                        attribution.within_limit(own, ERROR_LIMIT),
                        "; ".join(x for x in beside if x), c, "attribution", w)
            elif a.get("beside_reference") is not None and a["beside_reference"]["bias"] is not None:
                # Judged as a truth is: the bias, function by function, against
                # py-spy-1000 recording the same processes, beyond its 95% range
                # (the figures across processes beside it).
                beside = a["beside_reference"]
                floor = tvd_noise_floor(ws, CONFIGS[c]["delay"])
                t = a.get("tvd_vs_reference")
                notes = [_bias_text(f"bias against {REFERENCE} in the same process", beside["bias"]),
                         f"TVD from it in the same process: {beside['tvd']:.1f} (median of {beside['runs']})",
                         f"across processes: {t:.1f}" if t is not None else "",
                         floor["note"] if floor is not None else ""]
                add(f"attribution beside {REFERENCE}, {c}, {w}", beside["bias"]["points"],
                    f"<= {ERROR_LIMIT:g} points", attribution.within_limit(beside["bias"], ERROR_LIMIT),
                    "; ".join(x for x in notes if x), c, "attribution", w)
            elif a.get("tvd_vs_reference") is not None:
                floor = tvd_noise_floor(ws, CONFIGS[c]["delay"])
                if floor is not None:
                    t = a["tvd_vs_reference"]
                    add(f"TVD vs {REFERENCE}, {c}, {w}", t, f"<= {floor['name']} + {ERROR_LIMIT:g} points",
                        t <= floor["points"] + ERROR_LIMIT, floor["note"], c, "attribution", w)
        key = "error_points" if ws["truth"] else "tvd_vs_reference"
        ours = [(label, a[key]) for label, a in acc.items()
                if label.startswith("stackshot") and "(" not in label and a.get(key) is not None]
        peers = [(label, a[key]) for label, a in acc.items()
                 if not label.startswith("stackshot") and a.get(key) is not None
                 and not (key == "tvd_vs_reference" and label == REFERENCE)]
        if ours and peers:
            best_ours = min(ours, key=lambda x: x[1])
            best_peer = min(peers, key=lambda x: x[1])
            add(f"accuracy vs peers, {w}", best_ours[1],
                f"no peer ahead by more than {TIE_POINTS} pt"
                + (" (TVD vs py-spy-1000)" if key == "tvd_vs_reference" else ""),
                best_ours[1] <= best_peer[1] + TIE_POINTS,
                f"best stackshot {best_ours[0]} {best_ours[1]:.1f} vs best peer {best_peer[0]} {best_peer[1]:.1f}",
                kind="peers", workload=w)
    return checks


def cost_label(x: dict) -> str:
    """What a running cost ran: ``4 busy threads`` (``bench_sampler.py``'s deep
    stack), or the workload's name (``bench_running.py``)."""
    if "workload" in x:
        return x["workload"]
    return f"{x['threads']} busy thread{'s' if x['threads'] > 1 else ''}"


def judge_running_cost(micro: Optional[dict], per_workload: Optional[dict] = None) -> list[dict]:
    """The slowdown target judged on the sampler's running cost (blocks sampled and
    paused in turn inside one process: ``bench_sampler.py``'s deep stack in 1 and 4
    threads, ``micro``, and ``bench_running.py``'s workloads, ``per_workload``:
    engine -> rows), per engine and delay: the geometric mean of the pairs' ratios
    beyond two standard errors (:func:`attribution.within`), the pairs' spread taken
    no smaller than that of the paused/paused control pairs measured beside them
    (``bench_sampler.paired_cost``). Between fresh processes wall time differs by
    1-4% with no profiler at all, more than the 1% to resolve; within one process the
    pairs cancel that, but not the host's speed wandering from block to block: on the
    shared AMD host one ratio of two unprofiled 0.25 s blocks spreads 8-12%, so 20
    pairs resolve about 5% and 200 about 1.5%. What a run pays once (starting, the
    final drain) is not in it."""
    checks: list[dict] = []
    rows = [(engine, x) for engine, one in (micro or {}).items() for x in (one or {}).get("running_cost", [])]
    rows += [(engine, x) for engine, xs in (per_workload or {}).items() for x in xs or [] if "error" not in x]
    for engine, x in rows:
        config = f"stackshot-{x.get('engine') or engine}-{x['delay'] * 1000:g}ms"
        limit = SLOWDOWN_LIMITS.get(x["delay"])
        if config not in CONFIGS or limit is None:
            continue
        est = {"log_mean": x["log_mean"], "se": x["se"], "estimate": x["ratio"]}
        label = f"running cost, {cost_label(x)}"
        checks.append(_check(
            f"slowdown, {config}, {label}", x["ratio"], f"<= {limit:.2f}x", _slowdown_within(est, limit),
            f"{_slowdown_text(est)}; {x['pairs']} pairs of {x['block_seconds']:g} s blocks in one "
            f"process{_spreads_text(x)}; collector {x['collector_cpu_per_tick_us']:.0f} µs CPU/tick"
            + (f", filing {x['filing_ms_per_s']:.1f} ms/s with the GIL" if x.get("filing_ms_per_s") is not None else ""),
            config, "slowdown", label))
    return checks


def _spreads_text(x: dict) -> str:
    """``, spread 6.1% (10 control pairs 14.0%), median pair 1.004x [0.998, 1.011]``:
    a running cost's spread, one ratio's, beside that of its paused/paused control
    pairs, which floors it, and its median pair with a range of about 95%
    (``bench_sampler.median_range``: steadier than the mean where the host's noise
    puts a few pairs far out; shown, not judged). Rows measured before there were
    control pairs: nothing."""
    if x.get("spread") is None or x.get("control_spread") is None:
        return ""
    median = (f", median pair {x['median']:.3f}x [{x['median_range'][0]:.3f}, {x['median_range'][1]:.3f}]"
              if x.get("median_range") else "")
    return (f", spread {100 * x['spread']:.1f}% ({len(x.get('control_ratios') or ())} control pairs "
            f"{100 * x['control_spread']:.1f}%){median}")


def _check(what: str, value: Optional[float], target: str, ok: Optional[bool], note: str = "",
           config: str = "", kind: str = "", workload: str = "") -> dict:
    """One check of a target, as the report reads it (``ok`` None: unresolved)."""
    conf = CONFIGS.get(config, {})
    return {"what": what, "value": value, "target": target, "ok": ok, "note": note,
            "config": config, "kind": kind, "workload": workload,
            "engine": conf.get("engine"), "delay": conf.get("delay")}


def _slowdown_within(est: Optional[dict], limit: float) -> Optional[bool]:
    """Whether slowdown estimate ``est`` (:func:`slowdown_estimate`) is within ``limit``
    beyond two standard errors (None: unresolved, or nothing measured)."""
    return attribution.within(est["log_mean"], est["se"], math.log(limit)) if est else None


def tvd_noise_floor(ws: dict, delay: float) -> Optional[dict]:
    """The TVD from py-spy-1000 that sampling noise alone gives a row sampling every
    ``delay`` seconds, on workload summary ``ws``: ``{"points", "name" (what the
    floor is, for the target), "note"}``, or None when nothing gives it.

    A 5 ms row takes a fifth of py-spy-1000's samples, so its noise alone puts it
    farther from py-spy-1000 than py-spy-1000's runs are from each other.  The floor
    is therefore py-spy's at the row's own rate: py-spy-200's ``tvd_vs_reference``
    for a 5 ms row (an external, unbiased sampler at 200 Hz, figured as the row's
    own figure is), py-spy-1000's run-to-run TVD for a 1 ms row.  Where py-spy did
    not run at the row's rate, the run-to-run TVD stands in, and the note says so:
    a floor too low for the row, which can only make the verdict harsher."""
    run_to_run = ws.get("reference_noise", {}).get("median_pair_tvd")
    seen = None if run_to_run is None else f"{REFERENCE} run to run: {run_to_run:.1f}"
    rate = round(1 / delay)
    same = next((c for c, conf in CONFIGS.items()
                 if conf.get("external") == "py-spy" and conf["rate"] == rate), None)
    if same is not None and same != REFERENCE:
        t = ws["accuracy"].get(same, {}).get("tvd_vs_reference")
        if t is not None:
            note = f"py-spy at the same rate ({rate} Hz) from {REFERENCE}: {t:.1f}"
            return {"points": t, "name": f"{same}'s {t:.1f}", "note": "; ".join(x for x in (note, seen) if x)}
    if run_to_run is None:
        return None
    return {"points": run_to_run, "name": f"{REFERENCE}'s run-to-run {run_to_run:.1f}",
            "note": seen if same == REFERENCE else
            f"py-spy at the same rate ({rate} Hz) did not run: judged on {seen}, the floor at "
            f"{CONFIGS[REFERENCE]['rate']} Hz"}


def slowdown_estimate(ratios: list[float], control: list[float]) -> Optional[dict]:
    """A row's slowdown with its standard error, from its paired ratios (each profiled
    run over the no-profiler run just before it) and the control ratios (each
    no-profiler run over the no-profiler run before it: the same ratio with no
    profiler, ideally 1).  ``{"log_mean", "se"}`` in log units (0.01 is about 1%;
    ``se`` None when unknown), ``"estimate"``: the geometric mean; None without ratios.

    Logs, because a run's noise scales it (a ratio and its inverse are as far from 1);
    their mean is the log of the geometric mean.  Each paired ratio has a no-profiler
    run of its own, so the ratios are independent and their mean's standard error is
    their spread (standard deviation) over the square root of their number.  But that
    spread, from the 3 ratios of a quick run, is itself a guess: one time in ten it
    comes out under a third of the true one, and a row whose three ratios happened to
    agree would be judged to a precision the machine does not have.  The control
    ratios are the same kind of ratio, two runs a pair apart, and there are many of
    them (every row's rounds): their spread is what the machine alone puts into one
    paired ratio.  A profiler can add to that noise (its thread competing for the
    cores), not take the baseline's away, so the spread used is the larger of the
    two.  With fewer than 2 ratios the row's own spread is unknown, and so is ``se``
    (the verdict stays open, as :func:`attribution.within_limit`'s does)."""
    if not ratios:
        return None
    logs = [math.log(r) for r in ratios]
    log_mean = sum(logs) / len(logs)
    se = None
    if len(logs) > 1:
        spread = statistics.stdev(logs)
        if len(control) > 1:
            spread = max(spread, statistics.stdev(math.log(r) for r in control))
        se = spread / len(logs) ** 0.5
    return {"log_mean": log_mean, "se": se, "estimate": math.exp(log_mean)}


def _slowdown_text(est: Optional[dict], z: float = 2.0) -> str:
    """``mean 1.015x ± 0.026 (2 SE)``: a slowdown estimate and the reach of its noise."""
    if est is None:
        return ""
    if est["se"] is None:
        return f"mean {est['estimate']:.3f}x, noise unknown (one run)"
    half = (math.exp(est["log_mean"] + z * est["se"]) - math.exp(est["log_mean"] - z * est["se"])) / 2
    return f"mean {est['estimate']:.3f}x ± {half:.3f} ({z:g} SE)"


def _bias_text(what: str, bias: Optional[dict]) -> str:
    """``what: 1.2 ± 0.8 (part)``: a bias with its 95% range, its part named."""
    return f"{what}: {attribution.bias_text(bias)}" if bias is not None else ""


def issue9_verdicts(checks: list[dict]) -> list[dict]:
    """One verdict per issue-9 target and stackshot row: met only if every check of it is."""
    out = []
    groups = (("attribution", "attribution error <= 2 points on every workload "
                              "(no truth known: against py-spy-1000 recording the same processes)", max),
              ("slowdown", "slowdown <= 1.01x at 5 ms, <= 1.03x at 1 ms, every workload", max),
              ("rate", "achieved rate >= 95% of requested with 1 and 8 busy threads", min))
    configs = []
    for t in checks:
        if t.get("config") and t["config"] not in configs:
            configs.append(t["config"])
    for kind, target, worst in groups:
        for c in configs:
            these = [t for t in checks if t.get("kind") == kind and t.get("config") == c]
            if not these:
                continue
            failed = [t for t in these if t["ok"] is False]
            open_ = [t for t in these if t["ok"] is None]
            w = worst(these, key=lambda t: t["value"])
            # met: every check is; not met: one is short; else noise leaves it open
            out.append({"target": target, "kind": kind, "config": c,
                        "met": False if failed else None if open_ else True,
                        "checks": len(these), "failed": [t["workload"] for t in failed],
                        "unresolved": [t["workload"] for t in open_],
                        "worst": w["value"], "worst_workload": w["workload"]})
    return out


# -- the command ---------------------------------------------------------------------------

def sampler_microbench(python: str, flags: Optional[list[str]], log: Any,
                       engine: Optional[str] = None) -> Optional[dict]:
    """The sampler's own figures (issue 2's ``bench_sampler.py``), in a fresh process,
    with ``STACKSHOT_ENGINE=engine``."""
    if flags is None:
        return None
    print(f"sampler microbenchmark (bench_sampler.py, {engine or 'default'} engine) ...", file=log, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sampler.json")
        p = subprocess.run([python, os.path.join(HERE, "bench_sampler.py"), *flags, "--json", out],
                           capture_output=True, text=True, env=child_env(engine), cwd=REPO, timeout=1800)
        if p.returncode != 0 or not os.path.exists(out):
            return {"error": (p.stdout + p.stderr)[-1500:]}
        with open(out) as f:
            return json.load(f)


def workload_running_costs(python: str, flags: list[str], workloads: list[str], log: Any,
                           engine: str = "native") -> list[dict]:
    """Each workload's running cost (``bench_running.py``: one fresh process per
    workload), with ``STACKSHOT_ENGINE=engine``: the native engine's only, the one
    the slowdown targets are for (the Python engine's running cost is
    ``bench_sampler.py``'s, on a deep stack)."""
    print(f"running cost of each workload (bench_running.py, {engine} engine) ...", file=log, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "running.json")
        p = subprocess.run([python, "-m", "benchmarks.bench_running", *flags, "--workloads", ",".join(workloads),
                            "--json", out], capture_output=True, text=True, env=child_env(engine), cwd=REPO,
                           timeout=3600)
        if p.returncode != 0 or not os.path.exists(out):
            return [{"workload": ",".join(workloads), "error": (p.stdout + p.stderr)[-1500:]}]
        with open(out) as f:
            return json.load(f)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="short runs, 3 rounds (26 min on a shared 2-core machine)")
    g.add_argument("--smoke", action="store_true",
                   help="seconds: one tiny round (used by tests/test_benchmarks_smoke.py)")
    ap.add_argument("--workloads", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    ap.add_argument("--profilers", help=f"comma-separated subset of: {', '.join(c for c in CONFIGS if c != 'none')}")
    ap.add_argument("--rounds", type=int, help="override the mode's number of rounds")
    ap.add_argument("--seconds", type=float, help="override the mode's seconds of work per run")
    ap.add_argument("--install", action="store_true", help="create --venv and pip install requirements.txt into it")
    ap.add_argument("--venv", default=DEFAULT_VENV, help=f"the peers' virtual environment (default {DEFAULT_VENV})")
    ap.add_argument("--python", help="interpreter for the measured processes (default: the venv's, else this one)")
    ap.add_argument("--json", dest="json_path", help="result file (default benchmarks/results.json)")
    ap.add_argument("--markdown", help="table file (default benchmarks/RESULTS.md)")
    ap.add_argument("--no-sampler-bench", action="store_true", help="skip bench_sampler.py")
    ap.add_argument("--no-running-cost", action="store_true", help="skip bench_running.py")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="run the rounds beside N processes that spin (a loaded machine; "
                         "the calibration and bench_sampler.py run without them)")
    ap.add_argument("--render", metavar="JSON",
                    help="measure nothing: rewrite the Markdown table from an earlier result file")
    return ap.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> dict:
    from .report import render_markdown, verdicts

    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            result = json.load(f)
        # summarise again from the raw runs, so the file gets today's summary rules
        raw = {"runs": result["raw_runs"], "params": {w: ws["params"] for w, ws in result["summary"].items()}}
        result["summary"] = summarise(raw, [c for c in result["configs"] if c != "none"])
        result["targets"] = (judge_targets(result["summary"])
                             + judge_running_cost(result.get("sampler_microbench"), result.get("running_costs")))
        if args.json_path:
            with open(args.json_path, "w") as f:
                json.dump(result, f, indent=1, default=str)
        md_path = args.markdown or os.path.join(HERE, "RESULTS.md")
        with open(md_path, "w") as f:
            f.write(render_markdown(result))
        print(f"wrote {md_path} from {args.render}", file=sys.stderr)
        return result
    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    mode = dict(MODES[mode_name])
    if args.rounds:
        mode["rounds"] = args.rounds
    if args.seconds:
        mode["seconds"] = args.seconds
    if args.no_sampler_bench:
        mode["sampler_bench"] = None
    if args.no_running_cost:
        mode["running_cost"] = None
    if args.busy < 0:
        raise SystemExit(f"--busy must be 0 or more, not {args.busy}")
    if args.busy:
        mode["busy"] = args.busy
    if args.install:
        install(args.venv)
    venv_python = os.path.join(args.venv, "bin", "python")
    python = args.python or (venv_python if os.path.exists(venv_python) else sys.executable)
    pyspy = None
    for candidate in (os.path.join(os.path.dirname(python), "py-spy"), shutil.which("py-spy")):
        if candidate and os.path.exists(candidate):
            pyspy = candidate
            break

    workloads = args.workloads.split(",") if args.workloads else (
        ["deep"] if args.smoke else list(WORKLOADS))
    for w in workloads:
        load(w)
    wanted = args.profilers.split(",") if args.profilers else (
        ["stackshot-python-5ms"] if args.smoke else [c for c in CONFIGS if c != "none"])
    unknown = [c for c in wanted if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown profiler {unknown[0]!r}; known: {', '.join(CONFIGS)}")

    log = sys.stderr
    started = time.time()
    peers = probe_peers(python, pyspy) if any(not c.startswith(("stackshot", "none")) for c in wanted) else {}
    workload_needs = {"greenlets": "greenlet", "greenlet_naps": "greenlet", "gevent_server": "gevent",
                      "gevent_chatty": "gevent"}
    if any(w in workloads for w in workload_needs) and not peers:
        peers = {k: v for k, v in probe_peers(python, None).items() if k in workload_needs.values()}
    needs = {"py-spy-200": "py-spy", "py-spy-1000": "py-spy", "pyinstrument": "pyinstrument", "yappi": "yappi"}
    skipped = {c: peers[needs[c]]["error"] for c in wanted if c in needs and not peers[needs[c]]["ok"]}
    engines = probe_engines(python) if any(CONFIGS[c].get("engine") for c in wanted) else {}
    for c in wanted:
        engine = CONFIGS[c].get("engine")
        if engine and not engines[engine]["ok"]:
            skipped[c] = f"the {engine} engine is not available here ({engines[engine]['error']})"
    configs = [c for c in wanted if c not in skipped and c != "none"]
    for w, package in workload_needs.items():
        if w in workloads and peers.get(package) and not peers[package]["ok"]:
            workloads.remove(w)
            skipped[f"{w} workload"] = peers[package]["error"]
    for c, why in skipped.items():
        print(f"skipping {c}: {why}", file=log, flush=True)

    machine = machine_info(python)
    runner = Runner(python, pyspy, timeout=max(300.0, 60 * mode["seconds"]))
    raw = run_benchmarks(runner, workloads, configs, mode, log)
    used = [e for e in ENGINES if any(CONFIGS[c].get("engine") == e for c in configs)] or [None]
    micro = {e or "default": sampler_microbench(python, mode["sampler_bench"], log, e) for e in used}
    if all(v is None for v in micro.values()):
        micro = None
    running = ({"native": workload_running_costs(python, mode["running_cost"], workloads, log)}
               if "native" in used and mode["running_cost"] is not None else None)
    summary = summarise(raw, configs)
    machine["load_average_end"] = os.getloadavg()
    result = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks" + ("" if argv is None and len(sys.argv) <= 1 else
                                             " " + " ".join(argv if argv is not None else sys.argv[1:])),
        "mode": mode_name, "settings": mode, "duration_seconds": time.time() - started,
        "machine": machine, "peers": peers, "engines": engines, "skipped": skipped,
        "workloads": workloads, "configs": ["none"] + configs,
        "summary": summary, "targets": judge_targets(summary) + judge_running_cost(micro, running),
        "sampler_microbench": micro, "running_costs": running,
        "errors": raw["errors"], "raw_runs": raw["runs"],
    }
    if "busy_cpu_seconds" in raw:
        result["machine"]["busy_cpu_seconds"] = raw["busy_cpu_seconds"]
    json_path = args.json_path or os.path.join(HERE, "results.json")
    md_path = args.markdown or os.path.join(HERE, "RESULTS.md")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(md_path, "w") as f:
        f.write(render_markdown(result))
    print(verdicts(result), file=log)
    print(f"wrote {json_path} and {md_path} in {result['duration_seconds']:.0f} s", file=log)
    return result
