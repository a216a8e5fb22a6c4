"""The library side of qvattn.sdpa through the numpy path (no torch: what
CI runs): grouped K/V heads, head dims padded by the library, stateless
calls, and the capability question with heads (test_sdpa.py has the
torch layer)."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.normpath(os.path.join(HERE, "..", "..")), "python"))

try:
    import qvattn
    from qvattn import _ffi
except OSError as e:  # library not built / not found
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)


def qkv(H=4, Hkv=2, N=200, D=64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, H, N, D), dtype=np.float32)
    k = rng.standard_normal((1, Hkv, N, D), dtype=np.float32) + 0.5
    v = rng.standard_normal((1, Hkv, N, D), dtype=np.float32)
    return q, k, v


def reference(q, k, v):
    """float64 attention, K/V repeated to q's heads (torch's enable_gqa)."""
    g = q.shape[1] // k.shape[1]
    k, v = (np.repeat(x.astype(np.float64), g, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("method", ["exact", "sage8", "vc8+expcast", "sage4"])
def test_grouped_kv_equals_repeated(method):
    q, k, v = qkv()
    a = qvattn.attention(q, k, v, method=method)
    b = qvattn.attention(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), method=method)
    assert np.array_equal(a, b)
    if method == "exact":
        assert np.abs(a - reference(q, k, v)).max() < 1e-5


def test_padded_head_dims_and_the_limit():
    for D in (24, 80, 100):
        q, k, v = qkv(H=2, Hkv=1, N=150, D=D, seed=D)
        out = qvattn.attention(q, k, v, method="exact")
        assert out.shape == q.shape
        assert np.abs(out - reference(q, k, v)).max() < 1e-5, D
    q, k, v = qkv(H=2, Hkv=2, N=64, D=160)
    with pytest.raises(ValueError, match="at most 128"):
        qvattn.attention(q, k, v, method="exact")


def test_stateless_without_layer_and_step():
    q, k, v = qkv(H=2, Hkv=2, N=300)
    q2, k2, v2 = qkv(H=2, Hkv=2, N=300, seed=7)
    a = qvattn.attention(q, k, v)  # the default method on the shared default context
    qvattn.attention(q2, k2, v2)
    assert np.array_equal(a, qvattn.attention(q, k, v))
    with qvattn.Context() as ctx:  # layer and step named: the schedule's state
        x = qvattn.attention(q, k, v, layer=0, step=0, ctx=ctx)
        qvattn.attention(q2, k2, v2, layer=0, step=0, ctx=ctx)
        assert np.array_equal(x, a)
        assert not np.array_equal(x, qvattn.attention(q, k, v, layer=0, step=0, ctx=ctx))


def test_supports_heads():
    ok, why = qvattn.supports("vc8", "cpu", "float32", 80, heads=32, kv_heads=8)
    assert ok and "zero-padded to 128" in why
    ok, why = qvattn.supports("vc8", "cpu", heads=6, kv_heads=4)
    assert not ok and "multiple" in why
    q, k, v = qkv(H=6, Hkv=4, N=64)
    with pytest.raises(ValueError, match="multiple of the K/V heads"):
        qvattn.attention(q, k, v, method="exact")
    # grouped K/V run on CUDA wherever the method does (no GPU here: both
    # refused with a reason; on one, both supported)
    cfg = _ffi.make_config("sage8")
    ok, why = _ffi.supports_heads(_ffi.QVA_DEVICE_CUDA, cfg, _ffi.QVA_BF16, 128, 4, 2)
    ok_mha, _ = _ffi.supports_heads(_ffi.QVA_DEVICE_CUDA, cfg, _ffi.QVA_BF16, 128, 4, 4)
    assert ok == ok_mha and (ok or why)
