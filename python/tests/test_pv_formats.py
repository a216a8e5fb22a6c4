"""bench/pv_formats.py models the reference's E4M3 V quantizer and +i8pv's
codes: their V and P terms must equal the library's own
(qvattn.error_terms), and its E4M3 rounding must be the format's."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import qvattn  # noqa: E402
import pv_formats as pf  # noqa: E402


def test_model_matches_library_v_term():
    d = qvattn.synthetic("wan-small")
    q, k, v = (np.ascontiguousarray(pf.bf16(d[x])[:, :1, :1000]) for x in "qkv")
    lib = qvattn.error_terms(q, k, v, method=pf.UNROTATED)
    t = pf.preset_terms(q, k, v)
    assert abs(t["v e4m3"] - lib["v"]) <= 1e-3 * lib["v"], (t, lib)
    assert t["v int8"] < t["v e4m3"]


def test_model_matches_library_i8pv_terms():
    d = qvattn.synthetic("video-global")
    q, k, v = (np.ascontiguousarray(pf.bf16(d[x])[:, :1, :1000]) for x in "qkv")
    lib = qvattn.error_terms(q, k, v, method="sage8+nohadamard+i8pv")
    t = pf.preset_terms(q, k, v)
    assert abs(t["v int8"] - lib["v"]) <= 1e-3 * lib["v"], (t, lib)
    assert abs(t["p u8 blk"] - lib["p"]) <= 1e-2 * lib["p"], (t, lib)
    assert t["i8pv"] < t["fp8 PV"] and t["blk zeros"] < t["u8 zeros"]


def test_e4m3_rounding():
    x = np.array([1.0625, 1.1875, 500.0, 448.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, -0.3])
    want = np.array([1.0, 1.25, 448.0, 448.0, 2.0 ** -9, 0.0, 2.0 ** -8, -0.3125])
    assert np.array_equal(pf.e4m3(x), want)


def test_diffusion_keeps_block_sums():
    rng = np.random.default_rng(1)
    y = rng.standard_normal((256, 8))
    c = pf.e4m3_diffused(y)
    for b in range(0, 256, pf.BLOCK):
        # the carried error never exceeds half a step of the largest code
        assert (np.abs((c - y)[b:b + pf.BLOCK].sum(axis=0)) <= 0.25).all()
