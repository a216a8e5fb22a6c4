"""bench/k_granularity.py models the reference's INT8 K quantizer: its
per-block K term must equal the library's own (qvattn.error_terms), and a
scale per key must not be worse than one per block."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import qvattn  # noqa: E402
import k_granularity as kg  # noqa: E402


def test_model_matches_library_k_term():
    d = qvattn.synthetic("wan-small")
    q, k, v = (kg.bf16(d[x])[:, :1, :1000] for x in "qkv")  # one head, 1000 tokens
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    lib = qvattn.error_terms(q, k, v, method=kg.SAGE8_UNROTATED)
    t = kg.terms(q, k, v)
    assert abs(t["k block"] - lib["k"]) <= 1e-3 * lib["k"], (t, lib)
    assert t["k token"] < t["k block"]
    assert t["qk token"] < t["qk block"]


def test_int8_dequant_is_an_int8_grid():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 64)) * rng.uniform(0.1, 10, (256, 1))
    for rows in (1, 128):
        y = kg.int8_dequant(x, rows)
        scale = np.abs(x.reshape(-1, rows * 64)).max(1).repeat(rows)[:, None] / 127 + 1e-7
        code = y / scale
        assert np.allclose(code, np.round(code)) and np.round(np.abs(code)).max() <= 127
        assert (np.abs(y - x) <= scale / 2 + 1e-12).all()
