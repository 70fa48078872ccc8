"""The stress programs of ``native_stress.py``, each in its own interpreter, on each
engine (the native one also reading through /proc/self/mem, where a seccomp filter
refuses process_vm_readv): never a crash, a hang, a lost thread or a kept code object."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from native_stress import SCENARIOS
from seccomp_helpers import can_refuse

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_runs_clean(scenario, sampler_engine):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "native_stress.py"), scenario],
                          capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, STACKSHOT_ENGINE=sampler_engine))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith(f"{scenario} ok"), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.engines("native")
@pytest.mark.skipif(not can_refuse(), reason="no seccomp filter for this machine's system calls")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_runs_clean_reading_through_proc_self_mem(scenario):
    """Each read of freed memory goes through pread of /proc/self/mem (EIO there, an
    error as EFAULT is for process_vm_readv); the scenario also checks which way the
    engine read (``STRESS_REFUSE``)."""
    proc = subprocess.run([sys.executable, os.path.join(HERE, "native_stress.py"), scenario],
                          capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, STACKSHOT_ENGINE="native", STRESS_REFUSE="process_vm_readv"))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith(f"{scenario} ok"), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
