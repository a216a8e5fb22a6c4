"""bench/draft_pooled.py models block-sparse attention with a pooled
stand-in for the skipped blocks: with every block kept all three forms are
exact attention, and on flattened rows the stand-in must beat dropping."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import draft_pooled as dp  # noqa: E402


def _qkv(n=512, d=32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)), rng.standard_normal((n, d)),
            rng.standard_normal((n, d)) + 0.5)


def test_all_kept_is_exact():
    q, k, v = _qkv()
    e = dp.pooled_errors(q, k, v, [1.0])
    for tag in ("sparse", "mf1", "mf2", "mf1v"):
        assert e[(1.0, tag)] < 1e-12, (tag, e)


def test_pooled_beats_dropping_on_flat_rows():
    q, k, v = _qkv()
    e = dp.pooled_errors(0.2 * q, k, v, [0.25, 0.5])
    for keep in (0.25, 0.5):
        assert e[(keep, "mf1")] < 0.5 * e[(keep, "sparse")], e
        assert e[(keep, "sparse")] > 1e-3, e  # the case drops something


def test_value_term_follows_keys():
    """Where values depend on keys (v = k A + c), the row's weights lean the
    skipped blocks' values toward the keys it likes: mf1v's first-order
    term carries that, the plain mean (mf1) does not."""
    q, k, _ = _qkv()
    a = np.random.default_rng(1).standard_normal((k.shape[1], k.shape[1]))
    v = k @ a + 0.5
    e = dp.pooled_errors(0.2 * q, k, v, [0.25])
    assert e[(0.25, "mf1v")] < 0.5 * e[(0.25, "mf1")], e
