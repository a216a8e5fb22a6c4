"""Shared imports and helpers for the torch tests (skip without torch)."""
import math

import pytest

try:  # a missing or broken torch (ImportError of any kind) skips the module
    import torch
except ImportError as e:
    pytest.skip(f"torch not importable: {e}", allow_module_level=True)
F = torch.nn.functional

try:
    import qvattn
    from qvattn import _ffi, ops
except OSError as e:  # library not built
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)


__all__ = ["torch", "F", "qvattn", "_ffi", "ops", "rel_l2", "make_qkv", "reference",
           "cuda_ok", "need_diffusers"]


def need_diffusers():
    """Skips the calling test module without a working diffusers."""
    try:
        import diffusers
        del diffusers
    except ImportError as e:
        pytest.skip(f"diffusers not importable: {e}", allow_module_level=True)


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def make_qkv(B=1, H=2, N=256, D=64, Nk=None, dtype=None, seed=0, layout="HND"):
    """DiT-like data: a common key offset, a per-head value mean."""
    g = torch.Generator().manual_seed(seed)
    Nk = N if Nk is None else Nk
    q = 2.0 * torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, H, Nk, D, generator=g) + 0.5
    v = torch.randn(B, H, Nk, D, generator=g) + torch.randn(B, H, 1, D, generator=g)
    out = []
    for x in (q, k, v):
        if dtype is not None:
            x = x.to(dtype)
        if layout == "NHD":
            x = x.transpose(1, 2).contiguous()
        out.append(x)
    return tuple(out)


def reference(q, k, v, mask=None, scale=None, layout="HND"):
    """float64 attention and lse [B,H,N] (mask: bool, SDPA convention)."""
    if layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    q, k, v = (x.double() for x in (q, k, v))
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ v
    if layout == "NHD":
        o = o.transpose(1, 2)
    return o, lse


def cuda_ok(method="sage8"):
    if not (torch.cuda.is_available() and _ffi.cuda_available()):
        return False
    ok, _ = _ffi.supports(_ffi.QVA_DEVICE_CUDA, _ffi.make_config(method), _ffi.QVA_BF16, 128)
    return ok
