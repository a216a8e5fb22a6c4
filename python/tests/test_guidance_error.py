"""bench/guidance_error.py: its guided-error arithmetic, and the property
it reports: two passes whose inputs differ by 5% get uncorrelated
quantization errors, so guidance 2 amplifies one pass's error about
sqrt(5) times."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import qvattn  # noqa: E402
import guidance_error as ge  # noqa: E402


def test_guided_terms_arithmetic():
    rng = np.random.default_rng(1)
    o_l, o_n = rng.standard_normal((2, 3, 50, 8))
    e = 1e-3 * rng.standard_normal(o_l.shape)
    # the same error on both passes: it passes through guidance once
    t = ge.guided_terms(o_l + e, o_n + e, o_l, o_n, 2.0)
    assert t["corr"] == pytest.approx(1.0)
    g = 2 * o_l - o_n
    assert t["guided"] == pytest.approx(np.linalg.norm(e) / np.linalg.norm(g))
    # opposite errors: amplified 3 times
    t = ge.guided_terms(o_l + e, o_n - e, o_l, o_n, 2.0)
    assert t["corr"] == pytest.approx(-1.0)
    assert t["guided"] == pytest.approx(3 * np.linalg.norm(e) / np.linalg.norm(g))


def test_passes_errors_uncorrelated():
    t = ge.run(qvattn, "wan-small", "sage8", 0.05, 2.0)
    assert abs(t["corr"]) < 0.2, t
    assert 1.8 < t["guided"] / t["single"] < 2.7, t
