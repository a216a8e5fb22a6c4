"""qvattn: 8-bit, sparse and mixed-precision attention for video DiTs.

A thin Python front end over the C library (see _ffi.py for the binding):

    out = qvattn.attention(q, k, v, method="vc8+expcast")

q, k, v are torch tensors (CUDA or CPU) or numpy float32/float16 arrays, all
rank 4 in the given layout: "HND" = [B, H, N, D], "NHD" = [B, N, H, D].
The output has q's dtype, device and layout.  The full PyTorch layer (autograd,
modules, model patching) is a later issue; this is only the call.
"""
# torch must be imported before libqvattn.so is loaded: the library links
# the system's OpenMP runtime, and loading it ahead of torch's own made
# `import torch` segfault on the H200 machine (2026-11-30, gpu-check).
try:  # torch is optional: numpy-only callers never need it
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

from . import _ffi  # noqa: E402  (after torch, see above)
from ._ffi import (Context, QvaError, QvaUnsupportedError, QvaValueError,  # noqa: E402
                   build_info, cuda_available, last_error)

__all__ = ["attention", "describe", "Context", "QvaError", "QvaValueError",
           "QvaUnsupportedError", "build_info", "cuda_available", "last_error",
           "default_context"]

__version__ = "0.1.0"

try:
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

_LAYOUTS = ("HND", "NHD")
_contexts = {}  # (device kind, cuda index) -> Context, for ctx=None calls


def _is_torch(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


def _is_numpy(x):
    return _np is not None and isinstance(x, _np.ndarray)


def _torch_dtype(dt):
    m = {_torch.float32: _ffi.QVA_F32, _torch.bfloat16: _ffi.QVA_BF16,
         _torch.float16: _ffi.QVA_F16}
    if dt not in m:
        raise ValueError(f"qvattn: unsupported torch dtype {dt} "
                         "(float32, bfloat16, float16)")
    return m[dt]


def _numpy_dtype(dt):
    m = {_np.dtype(_np.float32): _ffi.QVA_F32, _np.dtype(_np.float16): _ffi.QVA_F16}
    if dt not in m:
        raise ValueError(f"qvattn: unsupported numpy dtype {dt} (float32, float16)")
    return m[dt]


def _bhnd(shape, stride, layout):
    """Shape/stride of a rank-4 tensor in `layout` as [B,H,N,D] order."""
    if layout == "HND":
        return list(shape), list(stride)
    b, n, h, d = shape
    sb, sn, sh, sd = stride
    return [b, h, n, d], [sb, sh, sn, sd]


def describe(x, layout="HND"):
    """A qva_tensor descriptor of x (no copy).  Returns (QvaTensor, device).

    x must stay alive for as long as the descriptor is used.
    """
    layout = layout.upper()
    if layout not in _LAYOUTS:
        raise ValueError(f"qvattn: layout must be 'HND' or 'NHD', not {layout!r}")
    if _is_torch(x):
        if x.dim() != 4:
            raise ValueError(f"qvattn: expected a rank-4 tensor, got shape {tuple(x.shape)}")
        dt = _torch_dtype(x.dtype)
        if x.device.type == "cuda":
            dev = _ffi.QVA_DEVICE_CUDA
        elif x.device.type == "cpu":
            dev = _ffi.QVA_DEVICE_CPU
        else:
            raise ValueError(f"qvattn: unsupported device {x.device}")
        shape, stride = _bhnd(tuple(x.shape), tuple(x.stride()), layout)
        ptr = x.data_ptr()
    elif _is_numpy(x):
        if x.ndim != 4:
            raise ValueError(f"qvattn: expected a rank-4 array, got shape {x.shape}")
        dt = _numpy_dtype(x.dtype)
        dev = _ffi.QVA_DEVICE_CPU
        isz = x.itemsize
        if any(s % isz for s in x.strides):
            raise ValueError("qvattn: array strides are not whole elements")
        shape, stride = _bhnd(x.shape, [s // isz for s in x.strides], layout)
        ptr = x.ctypes.data
    else:
        raise TypeError(f"qvattn: expected a torch tensor or numpy array, got {type(x).__name__}")
    return _ffi.make_tensor(ptr, dt, dev, shape, stride), dev


def default_context(device=_ffi.QVA_DEVICE_CPU, index=0):
    """The shared context used when attention() gets ctx=None."""
    key = (device, index if device == _ffi.QVA_DEVICE_CUDA else 0)
    c = _contexts.get(key)
    if c is None:
        c = _contexts[key] = Context(device)
    return c


def _empty_like(x, dtype=None, shape=None):
    if _is_torch(x):
        if shape is None:
            return _torch.empty_like(x, memory_format=_torch.contiguous_format)
        return _torch.empty(shape, dtype=dtype, device=x.device)
    if shape is None:
        return _np.empty(x.shape, dtype=x.dtype)
    return _np.empty(shape, dtype=dtype)


def attention(q, k, v, method="vc8+expcast", layout="HND", sm_scale=None,
              layer=0, step=0, num_steps=0, grid=None, prefix=0, ctx=None,
              return_lse=False):
    """softmax(q k^T * sm_scale) v with a qvattn method (non-causal).

    method    qvattn method string: exact | bf16 | fp8 | sage8 | vc8 | sage4 |
              vc4 | draft@S0/S4/S8/S16, with +expcast / +hadamard options.
    layout    "HND" ([B,H,N,D]) or "NHD" ([B,N,H,D]) for q, k, v and out.
    sm_scale  None = 1/sqrt(D).
    layer, step, num_steps
              key and schedule of the per-layer state (V-Smooth permutation,
              draft partition) kept in ctx.
    grid      (T, H, W) latent video grid (draft); prefix: text tokens first.
    ctx       a qvattn.Context on the tensors' device; None = a shared one.
    Returns out (q's dtype and layout), or (out, lse) with lse float32
    [B, H, N] (natural-log sum-exp of the scaled scores) if return_lse.
    Raises ValueError for bad inputs (also NaN/Inf on the CPU), QvaError
    (RuntimeError) otherwise, QvaUnsupportedError when the backend cannot
    run the method.
    """
    kinds = {_is_torch(t) for t in (q, k, v)}
    if len(kinds) != 1:
        raise TypeError("qvattn: q, k and v must all be torch tensors or all numpy arrays")
    tq, dev = describe(q, layout)
    tk, dev_k = describe(k, layout)
    tv, dev_v = describe(v, layout)
    if not dev == dev_k == dev_v:
        raise ValueError("qvattn: q, k and v must be on the same device")
    cuda_index = 0
    if _is_torch(q) and dev == _ffi.QVA_DEVICE_CUDA:
        if not (q.device == k.device == v.device):
            raise ValueError("qvattn: q, k and v must be on the same CUDA device")
        cuda_index = q.device.index if q.device.index is not None else _torch.cuda.current_device()

    cfg = _ffi.config_default()
    _ffi.config_set_method(cfg, method)  # ValueError on a bad method string
    cfg.sm_scale = 0.0 if sm_scale is None else float(sm_scale)
    cfg.layer, cfg.step, cfg.num_steps = int(layer), int(step), int(num_steps)
    if grid is not None:
        t, h, w = (int(g) for g in grid)
        cfg.draft.grid_t, cfg.draft.grid_h, cfg.draft.grid_w = t, h, w
    cfg.draft.prefix_tokens = int(prefix)

    # The CPU reference implements every method: if it declines, the request
    # itself is bad (config, dtype, head dim) -> ValueError.  If only the
    # device declines, it is a backend gap -> QvaUnsupportedError.
    head_dim = int(tq.shape[3])
    ok, why = _ffi.supports(_ffi.QVA_DEVICE_CPU, cfg, tq.dtype, head_dim)
    if not ok:
        raise QvaValueError(_ffi.QVA_ERR_INVALID_ARGUMENT, why, "qva_supports")
    if dev != _ffi.QVA_DEVICE_CPU:
        ok, why = _ffi.supports(dev, cfg, tq.dtype, head_dim)
        if not ok:
            raise QvaUnsupportedError(_ffi.QVA_ERR_UNSUPPORTED, why, "qva_supports")

    if ctx is None:
        ctx = default_context(dev, cuda_index)
    elif ctx.device != dev:
        raise ValueError("qvattn: ctx is on a different device than the tensors")

    out = _empty_like(q)
    to, _ = describe(out, layout)
    lse = tl = None
    if return_lse:
        B, H, N = (int(s) for s in tq.shape[:3])
        if _is_torch(q):
            lse = _empty_like(q, _torch.float32, (B, H, N))
        else:
            lse = _empty_like(q, _np.float32, (B, H, N))
        tl = _ffi.make_tensor(lse.data_ptr() if _is_torch(lse) else lse.ctypes.data,
                              _ffi.QVA_F32, dev, (B, H, N, 1), (H * N, N, 1, 1))

    if dev == _ffi.QVA_DEVICE_CUDA:
        with _torch.cuda.device(cuda_index):
            ctx.set_stream(_torch.cuda.current_stream().cuda_stream)
            _ffi.attention_raw(ctx, cfg, tq, tk, tv, to, tl)
    else:
        _ffi.attention_raw(ctx, cfg, tq, tk, tv, to, tl)
    return (out, lse) if return_lse else out

