"""sampler.memprof: OCaml's Gc.Memprof over CPython's allocators, each test a real program.

Allocation patterns whose words are known exactly: ``bytes(8 * w - 33)`` is one block
of ``w`` words (a bytes object is its 33-byte header and its characters, allocated in
one request). Statistical checks use bounds derived from the binomial law of sampled
words (``memprof_helpers``), never a tolerance picked by eye.
"""

from __future__ import annotations

import math

import pytest

from memprof_helpers import SIGMAS, binomial_bound, run_program, truncated_binomial_moments

pytest.importorskip("sampler._memprof", reason="the memprof engine is not built here")


def test_ten_times_the_bytes_gets_ten_times_the_estimate():
    rate, n = 1e-3, 20000
    out = run_program(f"""
        RATE, N = {rate}, {n}
        sampled = {{}}
        def record(a):
            if a.callstack:
                key = f"{{a.callstack[0].name}}:{{a.size}}"
                sampled[key] = sampled.get(key, 0) + a.n_samples
            return None
        def small():
            for _ in range(N):
                bytes(8 * 64 - 33)
        def big():
            for _ in range(N):
                bytes(8 * 640 - 33)
        p = memprof.start(RATE, tracker=memprof.Tracker(alloc_minor=record, alloc_major=record))
        small()
        big()
        settle()
        memprof.stop()
        memprof.discard(p)
        print(json.dumps({{"small": sampled.get("small:64", 0), "big": sampled.get("big:640", 0)}}))
    """)
    lo_s, hi_s = binomial_bound(64 * n, rate)
    lo_b, hi_b = binomial_bound(640 * n, rate)
    assert lo_s <= out["small"] <= hi_s
    assert lo_b <= out["big"] <= hi_b
    # the estimated bytes are the sampled words scaled: their ratio is bounded by the two
    # intervals, which hold 10 and are tight enough to tell 10 from 5 or 20
    lo_ratio, hi_ratio = lo_b / hi_s, hi_b / lo_s
    assert 5 < lo_ratio < 10 < hi_ratio < 20
    assert lo_ratio <= out["big"] / out["small"] <= hi_ratio


def test_n_samples_follows_the_binomial_law():
    rate, n, words = 0.05, 20000, 64
    out = run_program(f"""
        found = []
        def record(a):
            if a.callstack and a.callstack[0].name == "blocks" and a.size == {words}:
                found.append(a.n_samples)
            return None
        def blocks():
            for _ in range({n}):
                bytes(8 * {words} - 33)
        p = memprof.start({rate}, tracker=memprof.Tracker(alloc_minor=record, alloc_major=record))
        blocks()
        settle()
        memprof.stop()
        print(json.dumps({{"n_samples": found}}))
    """)
    ns = out["n_samples"]
    # how many blocks are sampled: Binomial(n, 1 - (1 - rate)^words)
    p_block = 1 - (1 - rate) ** words
    sd_count = math.sqrt(n * p_block * (1 - p_block))
    assert abs(len(ns) - n * p_block) <= SIGMAS * sd_count
    assert min(ns) >= 1 and max(ns) <= words
    # n_samples given >= 1 sample: mean and variance of the truncated binomial
    mean, var, m4 = truncated_binomial_moments(words, rate)
    m = len(ns)
    got_mean = sum(ns) / m
    got_var = sum((k - got_mean) ** 2 for k in ns) / (m - 1)
    assert abs(got_mean - mean) <= SIGMAS * math.sqrt(var / m), (got_mean, mean)
    assert abs(got_var - var) <= SIGMAS * math.sqrt((m4 - var ** 2) / m), (got_var, var)


def test_rate_one_samples_every_word_and_rate_zero_none():
    out = run_program("""
        blocks = []
        def record(a):
            if a.callstack and a.callstack[0].name == "make":
                blocks.append((a.size, a.n_samples, a.source.name))
            return None
        def make():
            for w in (5, 7, 64, 65, 1000):
                bytes(8 * w - 33)
        p = memprof.start(1.0, tracker=memprof.Tracker(alloc_minor=record, alloc_major=record))
        make()
        settle()
        memprof.stop()
        zero = []
        q = memprof.start(0.0, tracker=memprof.Tracker(alloc_minor=zero.append, alloc_major=zero.append))
        make()
        settle()
        memprof.stop()
        print(json.dumps({"blocks": blocks, "zero": len(zero), "zero_stats": q.stats(),
                          "est": p.estimated_bytes(), "words": p.stats()["sampled_words"]}))
    """)
    assert out["blocks"], "no allocation seen at rate 1"
    assert all(size == n for size, n, _ in out["blocks"]), out["blocks"]
    sizes = {size for size, _, src in out["blocks"] if src == "NORMAL"}
    assert {5, 7, 64, 65, 1000} <= sizes
    assert out["zero"] == 0 and out["zero_stats"]["samples"] == 0
    assert out["est"] == out["words"] * 8


def test_survivors_are_promoted_and_freed_blocks_deallocated():
    out = run_program("""
        gc.disable()   # collections only where the program asks for one
        events, ids = [], {}
        def alloc(a):
            if (a.size != 64 or a.source is not memprof.AllocationSource.NORMAL or not a.callstack
                    or a.callstack[0].name not in ("make_kept", "make_temp")):
                return None   # only the bytes objects (not the list's item array)
            ids[len(ids)] = a.callstack[0].name
            return len(ids) - 1
        log = lambda kind: (lambda v: events.append((kind, v)) or v)
        t = memprof.Tracker(alloc_minor=alloc, alloc_major=alloc, promote=log("promote"),
                            dealloc_minor=log("dealloc_minor"), dealloc_major=log("dealloc_major"))
        def make_kept(n):
            out = []
            for _ in range(n):
                out.append(bytes(8 * 64 - 33))
            return out
        def make_temp(n):
            for _ in range(n):
                bytes(8 * 64 - 33)
        p = memprof.start(0.01, tracker=t)
        kept = make_kept(3000)
        make_temp(3000)
        settle()
        before_gc = len(events)
        gc.collect()
        settle()
        after_gc = len(events)
        del kept
        settle()
        memprof.stop()
        memprof.discard(p)
        print(json.dumps({"events": events, "ids": ids, "before_gc": before_gc, "after_gc": after_gc}))
    """)
    ids = {int(k): v for k, v in out["ids"].items()}
    kept = {i for i, name in ids.items() if name == "make_kept"}
    temp = {i for i, name in ids.items() if name == "make_temp"}
    assert len(kept) > 50 and len(temp) > 50  # expected about 3000 * (1 - 0.99**64) = 1420 each
    events = [tuple(e) for e in out["events"]]
    before, during, after = events[:out["before_gc"]], events[out["before_gc"]:out["after_gc"]], events[out["after_gc"]:]
    # the temporaries died young: deallocated as minor blocks, before any collection
    assert sorted(v for k, v in before if k == "dealloc_minor") == sorted(temp)
    assert not [e for e in before if e[0] != "dealloc_minor"]
    # the survivors are promoted by the collection, each once
    assert sorted(v for k, v in during if k == "promote") == sorted(kept)
    assert not [e for e in during if e[0] != "promote"]
    # and freed afterwards as major blocks, each once
    assert sorted(v for k, v in after if k == "dealloc_major") == sorted(kept)
    assert not [e for e in after if e[0] != "dealloc_major"]


def test_lifecycle_errors_where_the_seeds_put_them():
    out = run_program("""
        errors = {}
        def expect(name, exc_type, f, *args):
            try:
                f(*args)
            except exc_type as exc:
                errors[name] = str(exc)
        expect("stop_none", RuntimeError, memprof.stop)
        for bad in (-0.1, 1.5, float("nan")):
            expect(f"rate {bad}", ValueError, memprof.start, bad)
        p = memprof.start(1e-4)
        expect("start_twice", RuntimeError, memprof.start, 1e-4)
        expect("discard_sampling", RuntimeError, memprof.discard, p)
        memprof.stop()
        expect("stop_twice", RuntimeError, memprof.stop)
        q = memprof.start(1e-4)   # a stopped profile does not stop another from starting
        memprof.stop()
        memprof.discard(p)
        memprof.discard(q)
        print(json.dumps({"errors": errors, "states": [p.state, q.state], "info": _memprof.info()}))
    """)
    assert set(out["errors"]) == {"stop_none", "rate -0.1", "rate 1.5", "rate nan", "start_twice",
                                  "discard_sampling", "stop_twice"}
    assert all("\n" not in message for message in out["errors"].values())
    assert out["states"] == ["discarded", "discarded"]
    assert out["info"]["records"] == 0 and out["info"]["hooks_installed"] == 0


def test_promote_and_dealloc_run_after_stop_until_discard():
    out = run_program("""
        gc.disable()
        events = []
        def alloc(a):
            return a.size if a.size == 640 and a.callstack and a.callstack[0].name == "kept_blocks" else None
        t = memprof.Tracker(alloc_minor=alloc, alloc_major=alloc,
                            promote=lambda v: events.append("promote") or v,
                            dealloc_major=lambda v: events.append("dealloc_major"))
        p = memprof.start(1.0, tracker=t)
        first, second = kept_blocks(10, 640), kept_blocks(10, 640)
        settle()
        memprof.stop()
        settle()
        at_stop = list(events)
        del first
        settle()
        after_stop = list(events)
        memprof.discard(p)
        del second
        gc.collect()
        settle()
        print(json.dumps({"at_stop": at_stop, "after_stop": after_stop, "after_discard": events,
                          "records": _memprof.info()["records"]}))
    """)
    assert out["at_stop"] == []
    assert out["after_stop"] == ["dealloc_major"] * 10   # large blocks: major from the start
    assert out["after_discard"] == out["after_stop"]     # nothing for `second` after discard
    assert out["records"] == 0


def test_allocation_callbacks_waiting_at_stop_or_thread_exit_are_dropped():
    out = run_program("""
        calls = []
        def alloc(a):
            calls.append((threading.get_ident(), a.size))
            return None
        big = 10 ** 6 // 8   # words of the blocks allocated below: sampled surely at 1e-3
        p = memprof.start(1e-3, tracker=memprof.Tracker(alloc_minor=alloc, alloc_major=alloc))
        # a thread that allocates then blocks without reaching a safe point (no Python call)
        gate, done = _thread.allocate_lock(), _thread.allocate_lock()
        gate.acquire(); done.acquire()
        def blocked():
            b = bytes(10 ** 6 - 33)
            gate.acquire()
            done.release()
        tid = _thread.start_new_thread(blocked, ())
        while tid not in _memprof.waiting_threads():   # its block is sampled, its callback waits
            pass
        # (a smaller allocation of the thread's, sampled with odds of a few percent, is
        # delivered at a safe point before it blocks: seen once on 3.10 in CI, 50 words)
        delivered = len([c for c in calls if c[0] == tid])
        memprof.stop()
        gate.release()
        done.acquire()
        dropped_at_stop = [c for c in calls if c[0] == tid][delivered:]
        memprof.discard(p)
        # a thread that allocates and exits without a safe point: a C function as its body
        before_q = len(calls)  # (the threads below can get the ident of the one above)
        q = memprof.start(1e-3, tracker=memprof.Tracker(alloc_minor=alloc, alloc_major=alloc))
        exits = []
        for _ in range(5):
            exits.append(_thread.start_new_thread(bytes, (10 ** 6 - 33,)))
        import time
        # each block is sampled surely (125 000 words at 1e-3); its thread runs no Python
        # and exits: the engine must drop the waiting callback (count it as orphaned)
        while _memprof.info()["orphaned"] < 5:
            time.sleep(0.01)
        settle()
        # the control: the same allocation on the main thread is delivered, on this thread
        bytes(10 ** 6 - 33)
        settle()
        memprof.stop()
        info = _memprof.info()
        memprof.discard(q)
        print(json.dumps({"dropped_at_stop": dropped_at_stop, "exits": exits, "calls": calls[before_q:],
                          "main": threading.get_ident(), "big": big, "records": info["records"],
                          "orphaned": info["orphaned"]}))
    """)
    assert out["dropped_at_stop"] == []
    by_thread = {c[0] for c in out["calls"]}
    assert not by_thread & set(out["exits"])
    assert [out["main"], out["big"]] in out["calls"]
    assert out["orphaned"] >= 5  # each exiting thread's block was sampled, its callback dropped
    assert out["records"] == 0   # the exited threads' blocks were released, not kept


def test_a_callback_returning_none_or_raising_ends_tracking():
    out = run_program("""
        seen, raised, freed = [], [], []
        sys.unraisablehook = lambda u: raised.append(str(u.exc_value))
        def alloc(a):
            if (a.size != 64 or a.source is not memprof.AllocationSource.NORMAL or not a.callstack
                    or a.callstack[0].name != "kept_blocks"):
                return None
            k = len(seen)
            seen.append(k)
            if k % 3 == 0:
                return None
            if k % 3 == 1:
                raise ValueError(f"boom {k}")
            return k
        t = memprof.Tracker(alloc_minor=alloc, alloc_major=alloc, dealloc_minor=freed.append,
                            promote=lambda v: v, dealloc_major=freed.append)
        p = memprof.start(0.01, tracker=t)
        kept = kept_blocks(2000, 64)
        settle()
        del kept
        settle()
        memprof.stop()
        memprof.discard(p)
        print(json.dumps({"seen": len(seen), "raised": raised, "freed": sorted(freed)}))
    """)
    assert out["seen"] > 30
    assert out["freed"] == [k for k in range(out["seen"]) if k % 3 == 2]
    assert out["raised"] == [f"boom {k}" for k in range(out["seen"]) if k % 3 == 1]


def test_threads_allocating_concurrently_each_run_their_own_callbacks():
    rate, k = 1e-3, 20000
    sizes = (40, 48, 56, 64)
    out = run_program(f"""
        RATE, K, SIZES = {rate}, {k}, {sizes}
        lock = threading.Lock()
        sampled = {{w: 0 for w in SIZES}}
        wrong_thread = []
        owner = {{}}
        def record(a):
            if a.callstack and a.callstack[0].name == "work" and a.size in sampled:
                with lock:
                    sampled[a.size] += a.n_samples
                    if owner[a.size] != threading.get_ident():
                        wrong_thread.append(a.size)
            return None
        def keep(x):
            return x
        def work(w, go):
            owner[w] = threading.get_ident()
            go.wait()
            for _ in range(K):
                keep(bytes(8 * w - 33))
            settle()
        p = memprof.start(RATE, tracker=memprof.Tracker(alloc_minor=record, alloc_major=record))
        go = threading.Event()
        threads = [threading.Thread(target=work, args=(w, go)) for w in SIZES]   # started after start()
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        memprof.stop()
        memprof.discard(p)
        print(json.dumps({{"sampled": sampled, "wrong_thread": wrong_thread}}))
    """)
    assert out["wrong_thread"] == []
    for w in sizes:
        lo, hi = binomial_bound(w * k, rate)
        assert lo <= out["sampled"][str(w)] <= hi, (w, out["sampled"])


def test_a_callback_that_allocates_is_not_reentered_nor_sampled():
    out = run_program("""
        depth, deepest, own, calls = [0], [0], [], [0]
        def alloc(a):
            depth[0] += 1
            deepest[0] = max(deepest[0], depth[0])
            calls[0] += 1
            if any(f.name == "alloc" for f in a.callstack):
                own.append(a.size)
            junk = [bytes(1000) for _ in range(50)]   # 6 000 words per call, sampled if it could be
            depth[0] -= 1
            return None
        def make(n):
            for _ in range(n):
                bytes(8 * 64 - 33)
        p = memprof.start(0.01, tracker=memprof.Tracker(alloc_minor=alloc, alloc_major=alloc))
        make(2000)
        settle()
        memprof.stop()
        print(json.dumps({"deepest": deepest[0], "own": own, "calls": calls[0]}))
    """)
    assert out["calls"] > 50
    assert out["deepest"] == 1
    assert out["own"] == []


def test_memory_is_bounded_and_drops_are_counted():
    out = run_program("""
        t = memprof.Tracker(alloc_minor=lambda a: 1, alloc_major=lambda a: 1, promote=lambda v: v)
        p = memprof.start(1.0, tracker=t)
        def make(n):
            return [bytes(8) for _ in range(n)]
        kept = make(memprof.MAX_TRACKED + 1000)
        settle()
        stats = p.stats()
        memprof.stop()
        del kept
        memprof.discard(p)
        print(json.dumps({"stats": stats, "max": memprof.MAX_TRACKED, "records": _memprof.info()["records"]}))
    """)
    assert out["stats"]["records_peak"] <= out["max"]
    assert out["stats"]["dropped"] >= 1000
    assert out["records"] == 0


def test_without_the_engine_start_says_why_in_one_line():
    import subprocess
    import sys

    from run_helpers import repo_env
    code = ("import sys; sys.modules['sampler._memprof'] = None\n"
            "import sampler, sampler.memprof as m\n"
            "try:\n    m.start(1e-4)\nexcept RuntimeError as e:\n    print('ERR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=repo_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERR ") and "not built" in lines[0], proc.stdout


def test_the_stress_program_runs_clean():
    """Threads, start/stop/discard cycles, raising and allocating trackers, a profile
    discarded from its own callback: no crash, nothing left held (memprof_stress.py)."""
    import os
    import subprocess
    import sys

    from run_helpers import repo_env
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, os.path.join(here, "memprof_stress.py"), "6"],
                          capture_output=True, text=True, env=repo_env(), timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("memprof stress ok"), proc.stdout


def test_to_snapshots_weighs_each_sample_by_its_estimated_bytes():
    rate = 1e-3
    out = run_program(f"""
        import analyzer, itertools
        RATE = {rate}
        log = memprof.AllocationLog()
        def small():   # nothing but the bytes objects (repeat allocates no ints)
            for _ in itertools.repeat(None, 20000):
                bytes(8 * 64 - 33)
        def big():
            keep = []
            for _ in itertools.repeat(None, 20000):
                keep.append(bytes(8 * 640 - 33))
            return keep
        p = memprof.start(RATE, tracker=log.tracker)
        small()
        kept = big()
        settle()
        memprof.stop()
        def totals(snapshots):
            prof = analyzer.analyze_samples(snapshots)
            return {{n.id: n.total for n in prof.nodes}}
        def expected(name, live_only):
            return sum(round(n * memprof.WORD_SIZE / RATE) for _, stack, n, alive in log.blocks
                       if (alive or not live_only) and any(f.name == name for f in stack))
        allocated = totals(memprof.to_snapshots(p, log))
        live_before = totals(memprof.to_snapshots(p, log, live=True))
        want = {{name: [expected(name, False), expected(name, True)] for name in ("small", "big")}}
        del kept
        gc.collect()
        live_after = totals(memprof.to_snapshots(p, log, live=True))
        memprof.discard(p)
        print(json.dumps({{"allocated": allocated, "live_before": live_before, "live_after": live_after,
                          "want": want}}))
    """)
    want = out["want"]
    for name in ("small", "big"):
        assert out["allocated"][name] == pytest.approx(want[name][0], rel=1e-9)
    # small's blocks died at once; big's are all alive until `kept` goes
    assert "small" not in out["live_before"]
    assert out["live_before"]["big"] == pytest.approx(want["big"][1], rel=1e-9)
    assert out["live_before"]["big"] >= 0.98 * out["allocated"]["big"]
    assert "big" not in out["live_after"]
    # big allocates ten times small's bytes (plus its list): the estimate says so,
    # within the bounds of the binomial (in bytes: words * 8 / rate)
    lo_s, hi_s = binomial_bound(64 * 20000, rate)
    lo_b, _ = binomial_bound(640 * 20000, rate)
    per_word = 8 / rate
    assert lo_s * per_word <= out["allocated"]["small"] <= hi_s * per_word
    assert out["allocated"]["big"] >= lo_b * per_word


def test_the_benchmark_script_runs_and_prints_every_configuration():
    """A smoke run (no timing is asserted: the numbers are for people)."""
    import subprocess
    import sys

    from run_helpers import REPO, repo_env
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_memprof", "--runs", "1", "--size", "0.02"],
                          capture_output=True, text=True, env=repo_env(), cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["profiler", "none", "memprof 1e-4", "memprof 1e-3", "memprof 1e-2", "tracker 1e-4",
                    "tracker 1e-3", "tracemalloc"], proc.stdout
    assert "bytes of record" in proc.stdout, proc.stdout


def test_sources_sizes_and_callstack_size():
    out = run_program("""
        seen = []
        def record(a):
            if a.callstack and a.callstack[0].name == "make":
                seen.append([a.source.name, a.size, [f.name for f in a.callstack]])
            return None
        def make():
            return [None] * 1000   # an item array of 1000 words (the list object may come from a freelist)
        def outer():
            return make()
        tracker = memprof.Tracker(alloc_minor=record, alloc_major=record)
        for size in (sys.maxsize, 2, 1):
            p = memprof.start(1.0, callstack_size=size, tracker=tracker)
            outer()
            settle()
            memprof.stop()
            memprof.discard(p)
        p = memprof.start(1.0, callstack_size=0, tracker=memprof.Tracker(
            alloc_minor=lambda a: seen.append(len(a.callstack)), alloc_major=lambda a: seen.append(len(a.callstack))))
        outer()
        settle()
        memprof.stop()
        print(json.dumps({"seen": seen}))
    """)
    seen = out["seen"]
    full = [s for s in seen if isinstance(s, list) and len(s[2]) > 2]
    assert ["CUSTOM", 1000, ["make", "outer", "<module>"]] in full
    assert ["CUSTOM", 1000, ["make", "outer"]] in seen
    assert ["CUSTOM", 1000, ["make"]] in seen
    zero = [s for s in seen if isinstance(s, int)]
    assert zero and set(zero) == {0}
