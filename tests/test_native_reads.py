"""How the native engine reads this process's memory where the kernel refuses a way.

It reads frames with ``process_vm_readv`` on its own pid, so that a frame freed
mid-read is an error, never a crash. Some seccomp profiles refuse that call: the
engine then reads ``/proc/self/mem``, and where that is refused too it cannot read
at all and the Python engine runs instead, saying why. Each test runs a child
process whose own seccomp filter refuses those calls (``seccomp_helpers.refuse``).
"""

from __future__ import annotations

import pytest

from seccomp_helpers import run_refusing

pytestmark = pytest.mark.engines("native")


def test_where_process_vm_readv_is_refused_frames_are_read_through_proc_self_mem():
    """Two functions with a known split of the CPU (each timed with the thread's own
    clock, 1:3): read through /proc/self/mem, no read fails and each gets its share
    (about 800 samples: two standard errors are 3 points)."""
    out = run_refusing(("process_vm_readv",), """
        import threading, time
        import analyzer, sampler
        from sampler import engines

        def light(n):
            s = 0
            for i in range(n):
                s += i * i % 7
            return s

        def heavy(n):
            s = 0
            for i in range(3 * n):
                s += i * i % 7
            return s

        spent = {"light": 0.0, "heavy": 0.0}
        ctl = sampler.create_sampler(threading.current_thread(), 0.001)
        while spent["light"] + spent["heavy"] < 0.8:
            t0 = time.thread_time()
            light(20000)
            t1 = time.thread_time()
            heavy(20000)
            spent["light"] += t1 - t0
            spent["heavy"] += time.thread_time() - t1
        ctl.stop()
        snaps = ctl.get_snapshots()
        run = snaps.runs[0]
        profile = analyzer.analyze_samples(snaps)
        light_s, heavy_s = profile.find("light").self, profile.find("heavy").self
        print(json.dumps({"way": engines.read_via(), "engine": run.engine, "read_via": run.extra["read_via"],
                          "failed_reads": run.extra["failed_reads"], "samples": len(snaps),
                          "share": heavy_s / (light_s + heavy_s),
                          "truth": spent["heavy"] / (spent["light"] + spent["heavy"])}))
    """)
    assert out["way"] == "/proc/self/mem"
    assert (out["engine"], out["read_via"]) == ("native", "/proc/self/mem")
    assert out["failed_reads"] == 0
    assert out["samples"] >= 200, out
    assert abs(out["share"] - out["truth"]) < 0.08, out


def test_where_no_way_to_read_is_left_the_python_engine_runs_and_says_why():
    """process_vm_readv and pread refused: the collector could read no frame (before,
    the native engine ran anyway and took no sample: 300 failed reads in 0.3 s). The
    default is then the Python engine, with one warning saying why; asking for the
    native engine is a one-line error."""
    out = run_refusing(("process_vm_readv", "pread64"), """
        import threading, warnings
        import sampler
        from sampler import engines
        from sampling_helpers import spin_until_sampled

        warnings.simplefilter("always")
        ctl = sampler.create_sampler(threading.current_thread(), 0.001)
        spin_until_sampled(ctl, 5)
        ctl.stop()
        try:
            sampler.create_sampler(threading.current_thread(), 0.001, engine="native")
            refused = None
        except RuntimeError as exc:
            refused = str(exc)
        try:
            sampler._native.Engine(0.001)  # (the engine's own check, under the one above)
            engine_refused = None
        except OSError as exc:
            engine_refused = str(exc)
        print(json.dumps({"way": engines.read_via(), "engine": ctl.get_snapshots().runs[0].engine,
                          "samples": len(ctl.get_snapshots()), "refused": refused,
                          "engine_refused": engine_refused}))
    """)
    assert out["way"] is None
    assert (out["engine"], out["samples"] >= 5) == ("python", True), out
    why = "may not read its own memory through the kernel (process_vm_readv: Operation not permitted; " \
          "/proc/self/mem: Operation not permitted)"
    assert out["refused"].startswith("engine='native' is not available: this process " + why), out
    assert "\n" not in out["refused"]
    assert out["engine_refused"] == ("this process cannot read its own memory: process_vm_readv: Operation not "
                                     "permitted; /proc/self/mem: Operation not permitted"), out
    assert out["stderr"].count("RuntimeWarning: stackshot uses its Python engine: this process " + why) == 1, \
        out["stderr"]
