"""pytest setup for the Python tests: the package from this checkout.

The library is found through $QVATTN_LIB or ../../build/libqvattn.so
(python/qvattn/_ffi.py).  Tests that need torch or diffusers skip cleanly
where those are not installed (CI installs numpy and pytest only).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import pytest  # noqa: E402


@pytest.fixture
def spy(monkeypatch):
    """Records (layer, step, num_steps) of every qvattn call made through
    the torch op; calls.passes holds the CFG pass of each.  Needs torch
    (the tests using it skip without it before this runs)."""
    from qvattn import ops

    class Calls(list):
        passes = []

    calls = Calls()
    passes = calls.passes = []
    real = ops._config_for

    def rec(*a, **kw):
        cfg = real(*a, **kw)
        calls.append((cfg.layer & 0xFFFF, cfg.step, cfg.num_steps))
        passes.append(cfg.layer >> 16)
        return cfg

    monkeypatch.setattr(ops, "_config_for", rec)
    return calls
