"""bench/vsmooth_drift.py: the mix's endpoints are the two inputs, and on
values that cluster by object a late step that demeans with the grouped
permutation beats the paper's plain step, with and without drift (the
reason the demean schedule exists)."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import qvattn  # noqa: E402
import vsmooth_drift as vd  # noqa: E402


def test_mix_endpoints():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 5)).astype(np.float32)
    assert np.array_equal(vd.mixed(a, b, 0.0), a) and np.array_equal(vd.mixed(a, b, 1.0), b)


def test_demeaning_late_step_beats_plain_on_clustered_values():
    x0 = vd.preset(qvattn, "video-local-clustered", 1, 1)
    x1 = vd.preset(qvattn, "video-local-clustered", 2, 1)
    still = vd.late_step_errors(qvattn, x0, x0, "vc8+hadamard")
    assert still["demean"] < 0.9 * still["paper"]
    drifted = vd.late_step_errors(qvattn, x0, tuple(vd.mixed(u, w, 0.4) for u, w in zip(x0, x1)),
                                  "vc8+hadamard")
    assert drifted["demean"] < drifted["paper"]
    assert all(0 < e < 0.05 for e in list(still.values()) + list(drifted.values()))
