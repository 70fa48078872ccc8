"""A stress program for sampler.memprof, run by the tests and under AddressSanitizer
(``.ci/sanitize-memprof``): every path of the engine at once, on several threads.

Threads allocate and free (small and large blocks, lists that grow by realloc) while
the main thread starts, stops and discards profiles, collects, and lets threads exit
with callbacks still waiting; trackers keep values, return None, raise, allocate, and
one stops and discards its own profile from inside a callback. The program checks
that nothing is left held once every profile is discarded, and prints ``memprof
stress ok``.

    python tests/memprof_stress.py [rounds]
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import _thread

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sampler import _memprof, memprof  # noqa: E402


def churn(n: int) -> int:
    kept, total = [], 0
    for i in range(n):
        t = (i, str(i), [i] * (i % 50))
        total += len(t[2])
        kept.append(t)
        if i % 97 == 0:
            kept.append(bytearray(3000 + i % 5000))
        if len(kept) > 300:
            del kept[:150]
    return total


def make_tracker(kind: int) -> memprof.Tracker:
    lock = threading.Lock()
    live = {}

    def alloc(a: memprof.Allocation):
        if kind == 1 and a.n_samples % 3 == 0:
            raise ValueError("a tracker that raises")
        if kind == 2:
            [bytes(200) for _ in range(5)]  # a callback that allocates
        key = (a.size, a.callstack[0] if a.callstack else None)
        with lock:
            live[key] = live.get(key, 0) + 1
        return key if a.n_samples % 4 else None

    def promote(key):
        return key if kind != 2 else None

    def dealloc(key):
        with lock:
            live[key] -= 1

    return memprof.Tracker(alloc, alloc, promote, dealloc, dealloc)


def main(rounds: int) -> None:
    sys.unraisablehook = lambda u: None  # the raising tracker's reports: expected
    stop_threads = threading.Event()

    def worker() -> None:
        while not stop_threads.is_set():
            churn(2000)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for r in range(rounds):
        profile = memprof.start(0.02 if r % 2 else 1e-3, tracker=make_tracker(r % 3))
        churn(3000)
        for _ in range(3):  # threads that exit straight after allocating: callbacks dropped
            _thread.start_new_thread(bytes, (50_000,))
        if r % 4 == 3:
            gc.collect()
        memprof.stop()
        churn(1000)  # promotions and deallocations after stop
        gc.collect()
        memprof.discard(profile)

    # a callback that stops and discards its own profile (in whichever thread a
    # sample comes first: the workers allocate too). The state is read once that
    # callback is through: read as soon as this thread's own churn ended, it was
    # "stopped" once in CI, a worker's callback caught between the two calls.
    box = {}
    discarded = threading.Event()

    def stopping(a):
        if "p" in box and box["p"].state == "sampling":
            memprof.stop()
            memprof.discard(box["p"])
            discarded.set()
        return 1

    box["p"] = memprof.start(0.05, tracker=memprof.Tracker(stopping, stopping))
    churn(500)
    assert discarded.wait(30), box["p"].state
    assert box["p"].state == "discarded", box["p"].state

    stop_threads.set()
    for t in threads:
        t.join()
    while _thread._count():
        pass
    churn(10)
    info = _memprof.info()
    assert info["records"] == 0 and info["in_table"] == 0, info
    assert info["hooks_installed"] == 0 and info["eval_installed"] == 0, info
    print("memprof stress ok", info["callbacks_run"])


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
