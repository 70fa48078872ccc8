"""``%%sample`` in a real IPython kernel monkey-patched by gevent: the cell's greenlets
are profiled, each under its own name, and the profile shows their handlers, not an
error.

The cell patches everything but threads (``patch_all(thread=False)``, what gevent
users do in Jupyter): ipykernel's own threads (heartbeat, shell channel) must stay
OS threads -- a kernel patched whole hangs at start, and one patched from a cell
fails ipykernel's own ``current_thread()`` check -- so that is as far as a kernel
can be patched, whatever the profiler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export_consumers import need_module

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("gevent")

# Each handler spins until it spent its CPU, then waits on the hub; the cell runs
# until every running sampler took enough samples (a loaded machine can starve the
# collector), polling the sampler's counter from the kernel's main greenlet.
SETUP = """\
import sys
sys.path.insert(0, {repo!r})
from gevent import monkey; monkey.patch_all(thread=False)
import time, gevent
from tests.sampling_helpers import spin

def handle_light():
    for _ in range(10):
        spin(0.004)
        gevent.sleep(0.001)

def handle_heavy():
    for _ in range(10):
        spin(0.012)
        gevent.sleep(0.001)

def serve():
    from sampler.controller import _live
    from tests.sampling_helpers import _samples_taken
    while True:
        gevent.joinall([gevent.spawn(handle_light), gevent.spawn(handle_heavy)])
        if all(_samples_taken(s) >= 40 for s in list(_live) if not s._collector.stopped):
            break
"""


def test_sample_magic_profiles_greenlets_in_a_monkey_patched_kernel(tmp_path):
    nbformat = need_module("nbformat")
    nbclient = need_module("nbclient")
    need_module("ipykernel")
    sources = [
        SETUP.format(repo=str(REPO)),
        "%load_ext stackshot",
        "%%sample -d 0.001 -f none -v snaps\nserve()",
        "import json\nfrom analyzer.greenlets import greenlet_times, greenlets_of\n"
        "names = {f.name for sid in set(snaps.sample_stack) for f in snaps.stack_frames(sid)}\n"
        "print(json.dumps(dict(functions=sorted(names), times=greenlet_times(snaps),\n"
        "    kinds=sorted({t.kind for t in snaps.threads}),\n"
        "    patched=[monkey.is_module_patched(m) for m in ('socket', 'time', 'threading')])))",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = json.dumps(nb.cells[2].outputs)
    assert "Error" not in shown and "Traceback" not in shown, shown
    result = json.loads("".join(o.get("text", "") for o in nb.cells[3].outputs
                                if o["output_type"] == "stream"))
    assert {"handle_light", "handle_heavy", "spin"} <= set(result["functions"]), result
    assert result["kinds"] == ["greenlet", "thread"], result
    times = result["times"]
    light = [t for name, t in times.items() if name.endswith("(handle_light)")]
    heavy = [t for name, t in times.items() if name.endswith("(handle_heavy)")]
    # every round spawns one of each: each has its profile, and together the heavy
    # ones took more CPU than the light ones (3x in truth)
    assert light and heavy, times
    assert result["patched"] == [True, True, False], result
    assert sum(heavy) > sum(light), times
