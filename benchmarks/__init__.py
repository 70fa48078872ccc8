"""stackshot's benchmarks: overhead, sampling rate, accuracy and memory, beside its peers.

Run ``python -m benchmarks --quick`` (a few minutes) or ``python -m benchmarks``
(the full run); see :mod:`benchmarks.harness`.  These measure and report; they
never gate CI (only ``tests/test_benchmarks_smoke.py`` runs a seconds-long smoke of
the harness itself).
"""
