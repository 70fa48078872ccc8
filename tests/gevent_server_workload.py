"""A gevent StreamServer on loopback and a bounded client loop, in one process,
profiled (run by tests/test_sampler_gevent.py in a fresh interpreter).

Handlers burn known CPU (light 3 ms, heavy 9 ms per request), measured with
``time.thread_time`` around each burn: the truth the profile is held to.
argv: mode (``api``: create_sampler; ``profile``: ``with profile()``; ``cli``: run
under ``stackshot``, which writes the profile), ``patch`` (gevent's ``patch_all()``
first) or ``plain``, and the file the result goes to (JSON)."""
import json
import sys
import time

MODE, PATCH, OUT = sys.argv[1], sys.argv[2] == "patch", sys.argv[3]
if PATCH:
    from gevent import monkey; monkey.patch_all()
import threading
import gevent
from gevent import socket
from gevent.server import StreamServer

truth = {"light": 0.0, "heavy": 0.0}
requests = [0]

def burn(cpu):
    end = time.thread_time() + cpu
    while time.thread_time() < end:
        for i in range(500):
            pass

def light():
    start = time.thread_time()
    burn(0.003)
    truth["light"] += time.thread_time() - start

def heavy():
    start = time.thread_time()
    burn(0.009)
    truth["heavy"] += time.thread_time() - start

def handle(sock, address):
    f = sock.makefile("rwb")
    for line in f:
        (heavy if line.strip() == b"heavy" else light)()
        requests[0] += 1
        f.write(b"ok\n")
        f.flush()
    f.close()
    sock.close()

def client(server, pairs):
    sock = socket.create_connection(("127.0.0.1", server.server_port))
    f = sock.makefile("rwb")
    for _ in range(pairs):
        for kind in (b"light\n", b"heavy\n"):
            f.write(kind)
            f.flush()
            assert f.readline() == b"ok\n"
    f.close()
    sock.close()

def serve(enough=lambda: True):
    """Clients in 4 greenlets, 10 request pairs each, in rounds until ``enough()``
    (bounded: at most 10 rounds) -- a CPU budget of about 0.5 s per round."""
    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    for _ in range(10):
        gevent.joinall([gevent.spawn(client, server, 10) for _ in range(4)], raise_error=True)
        if enough():
            break
    server.stop()

def cpu_by_function(snaps):
    """CPU seconds charged to light, heavy, <hub idle>; whether Hub.run was ever
    seen with time of its own; the CPU interval of each sample with a stack."""
    out = {"light": 0.0, "heavy": 0.0, "<hub idle>": 0.0}
    hub_run = False
    deltas = snaps.cpu_deltas()
    for i, sid in enumerate(snaps.sample_stack):
        if not sid:
            continue
        frames = snaps.stack_frames(sid)
        names = [f.name for f in frames]
        # Hub.run with time of its own (named 'run' before Python 3.11)
        hub_run = hub_run or (names[0] in ("Hub.run", "run")
                              and frames[0].filename.replace("\\", "/").endswith("gevent/hub.py"))
        for name in out:
            if name in names:
                out[name] += deltas[i] / 1e6
    real_deltas = [d / 1e6 for d, s in zip(deltas, snaps.sample_stack) if s]
    return {"cpu": out, "hub_run": hub_run, "deltas": real_deltas,
            "greenlets": sorted({t.name for t in snaps.threads if t.kind == "greenlet"}),
            "threads": sorted({t.name for t in snaps.threads if t.kind == "thread"})}

result = {}
if MODE == "api":
    import sampler
    ctl = sampler.create_sampler(threading.main_thread(), 0.0005)
    serve(lambda: len(ctl.get_snapshots()) >= 1500)  # more rounds on a loaded machine
    ctl.stop()
    assert not ctl.errors, ctl.errors
    result = cpu_by_function(ctl.get_snapshots())
elif MODE == "profile":
    from stackshot import profile
    with profile(render=None, delay=0.0005) as p:
        serve()
    result = cpu_by_function(p.snapshots)
else:  # cli: stackshot writes the profile
    serve()
result["truth"] = truth
result["requests"] = requests[0]
with open(OUT, "w") as f:
    json.dump(result, f)
