"""The stress programs of ``native_stress.py``, each in its own interpreter, on each
engine: never a crash, a hang, a lost thread or a kept code object."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from native_stress import SCENARIOS

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_runs_clean(scenario, sampler_engine):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "native_stress.py"), scenario],
                          capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, STACKSHOT_ENGINE=sampler_engine))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith(f"{scenario} ok"), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
