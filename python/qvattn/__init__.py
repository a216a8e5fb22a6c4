"""qvattn: 8-bit, sparse and mixed-precision attention for video DiTs.

A Python front end over the C library (see _ffi.py for the binding):

    out = qvattn.attention(q, k, v)        # qvattn.DEFAULT_METHOD
    out = qvattn.sdpa(query, key, value)   # torch SDPA's signature, drop-in

q, k, v are torch tensors (CUDA or CPU) or numpy float32/float16 arrays, all
rank 4 in the given layout: "HND" = [B, H, N, D], "NHD" = [B, N, H, D].
The output has q's dtype, device and layout.  On torch tensors the call is
the custom op torch.ops.qvattn.attention (ops.py: torch.compile, CUDA
streams and graphs).  qvattn.sdpa has exactly the signature of
torch.nn.functional.scaled_dot_product_attention (ops.sdpa).  Model
integration: qvattn.diffusers (apply/remove), qvattn.comfyui,
qvattn.capture.  docs/PYTHON.md has the whole story.
"""
# torch must be imported before libqvattn.so is loaded: the library links
# the system's OpenMP runtime, and loading it ahead of torch's own made
# `import torch` segfault on the H200 machine (2026-11-30, gpu-check).
try:  # torch is optional: numpy-only callers never need it
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

from . import _config, _ffi  # noqa: E402  (after torch, see above)
from ._ffi import (DEFAULT_METHOD, Context, QvaError, QvaUnsupportedError,  # noqa: E402
                   QvaValueError, build_info, cuda_available, default_context, last_error)

__all__ = ["attention", "sdpa", "describe", "DEFAULT_METHOD", "Context", "QvaError", "QvaValueError",
           "QvaUnsupportedError", "build_info", "cuda_available", "last_error",
           "default_context", "supports", "capture", "error_terms", "error_term_directions",
           "error_direction",
           "draft_report",
           "draft_sweep", "synthetic", "synthetic_presets"]

__version__ = "0.1.0"

try:
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

_LAYOUTS = ("HND", "NHD")


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


def _empty_like(x, dtype=None, shape=None):
    if _is_torch(x):
        if shape is None:
            return _torch.empty_like(x, memory_format=_torch.contiguous_format)
        return _torch.empty(shape, dtype=dtype, device=x.device)
    if shape is None:
        return _np.empty(x.shape, dtype=x.dtype)
    return _np.empty(shape, dtype=dtype)


def supports(method, device="cuda", dtype="bfloat16", head_dim=128, heads=1, kv_heads=1):
    """(ok, reason): can `device` ("cpu"/"cuda") run `method` at this
    dtype ("float32"/"bfloat16"/"float16") and head dim, with `heads` query
    heads over `kv_heads` K/V heads (grouped-query attention when fewer)?
    qva_supports_heads."""
    return _ffi.supports_heads(_ffi.device_enum(device), _ffi.make_config(method),
                               _ffi.dtype_enum(dtype), head_dim, heads, kv_heads)


def __getattr__(name):
    """qvattn.sdpa is ops.sdpa itself (so F.scaled_dot_product_attention =
    qvattn.sdpa adds no frame), imported on first use like the op."""
    if name == "sdpa":
        from .ops import sdpa
        return sdpa
    raise AttributeError(f"module 'qvattn' has no attribute {name!r}")


def attention(q, k, v, *, method=_ffi.DEFAULT_METHOD, layout="HND", sm_scale=None,
              attn_mask=None, return_lse=False, layer=None, step=None,
              num_steps=None, grid=None, prefix=None, prefix_at_end=False,
              ctx=None, fallback=False, is_causal=False, dropout_p=0.0,
              options=None):
    """softmax(q k^T * sm_scale) v with a qvattn method (non-causal).

    method    qvattn method string: exact | bf16 | fp8 | sage8 | vc8 | sage4 |
              vc4 | draft@S0/S4/S8/S16 | draft@pM[/S4/S8/S16] (the adaptive
              budget: per head the region pairs holding M% of the draft
              map, options draft.min_keep / draft.max_keep), with
              +expcast / +expcast-centred / +expcast-e5m2 /
              +hadamard / +nohadamard /
              +qblock / +codesum / +fp32sum / +v2 / +i8pv / +fp16acc / +kprev
              / +vprev / +ksample / +vsample / +floormass / +pblock options
              (docs/CLI.md says what each does; sage8 and vc8 rotate and
              sum their codes unless +nohadamard / +fp32sum; +v2, V in two
              E4M3 digits, runs on CUDA at head dim 128 only; +i8pv, the PV
              product in integers, on CUDA at head dim 128 with bf16/f16
              inputs (with +fp32sum, l the weights' sum); +kprev, K smoothed with the mean the layer's previous
              call left, and +vprev, V coded with the scales the layer's
              previous call made, both on CUDA with bf16/f16 inputs;
              +ksample and +vsample, the same statistics from 1,024
              sampled tokens of this call (stateless; +vsample on CUDA
              with bf16/f16 inputs, on V-Smooth's demeaning steps from 8
              sampled key blocks, and for draft's INT8 phase too);
              +floormass, ExpCast's floor mass put back, CPU only so far;
              +pblock, P coded against each key block's own max).
              Default: qvattn.DEFAULT_METHOD, vc8+expcast-centred+pblock
              (Q and K rotated, ExpCast at the centred beta against each
              key block's max: docs/NUMERICS.md §3).
    layout    "HND" ([B,H,N,D]) or "NHD" ([B,N,H,D]) for q, k, v and out.
    sm_scale  None = 1/sqrt(D).
    attn_mask None, or (torch only) a boolean key-padding mask broadcastable
              to [B,1,1,Nk], True = attend (SDPA's convention), whatever the
              layout.  Other masks are unsupported (see fallback).
    return_lse
              also return lse, float32 [B, H, Nq] (natural-log sum-exp of the
              scaled scores), in either layout.
    layer, step, num_steps
              key and schedule of the per-layer state (V-Smooth permutation,
              draft dense warm-up) kept in ctx.  Without layer and step (and
              no StepState) the call is stateless: identical inputs give
              identical outputs.  One of them given: the other defaults to
              0; num_steps 0 = unknown (V-Smooth then regroups on every
              call).
    grid      (T, H, W) latent video grid (draft).
    prefix    tokens outside the grid (text); None = N - T*H*W when a grid
              is given, else 0.  prefix_at_end: they follow the video tokens.
    ctx       a qvattn.Context on the tensors' device; None = a shared one.
    fallback  False (default): anything qvattn cannot run (is_causal,
              dropout_p > 0, a dense or additive mask, a method the device
              backend lacks, an unsupported head dim) raises.  True: warn
              once per reason (QvattnFallbackWarning) and run torch SDPA.
    options   dict of config overrides, e.g. {"vsmooth.clusters": 16,
              "draft.dense_warmup_steps": 2} (ops.options_string lists them).
    Returns out (q's dtype, device and layout), or (out, lse).
    Raises TypeError for non-tensors, ValueError for bad inputs (also NaN/Inf
    on the CPU), QvaUnsupportedError (NotImplementedError) for valid requests
    the backend cannot run, QvaError (RuntimeError) otherwise.
    """
    if _is_torch(q) or _is_torch(k) or _is_torch(v):
        from . import ops  # on first use: numpy-only callers never import torch's op
        return ops.attention_torch(
            q, k, v, method=method, layout=layout, sm_scale=sm_scale,
            attn_mask=attn_mask, return_lse=return_lse, layer=layer, step=step,
            num_steps=num_steps, grid=grid, prefix=prefix,
            prefix_at_end=prefix_at_end, ctx=ctx, fallback=fallback,
            is_causal=is_causal, dropout_p=dropout_p, options=options)
    return _attention_numpy(q, k, v, method=method, layout=layout,
                            sm_scale=sm_scale, attn_mask=attn_mask,
                            return_lse=return_lse, layer=layer, step=step,
                            num_steps=num_steps, grid=grid, prefix=prefix,
                            prefix_at_end=prefix_at_end, ctx=ctx,
                            is_causal=is_causal, dropout_p=dropout_p,
                            options=options)


def _attention_numpy(q, k, v, *, method, layout, sm_scale, attn_mask, return_lse,
                     layer, step, num_steps, grid, prefix, prefix_at_end, ctx,
                     is_causal, dropout_p, options):
    """The numpy path (CPU only; no masks, no fallback)."""
    if attn_mask is not None or is_causal or dropout_p:
        raise QvaUnsupportedError(
            _ffi.QVA_ERR_UNSUPPORTED, "masks, causal attention and dropout are not "
            "supported on numpy inputs (masks: use torch tensors)", "qvattn.attention")
    kinds = {_is_torch(t) for t in (q, k, v)}
    if len(kinds) != 1:
        raise TypeError("qvattn: q, k and v must all be torch tensors or all numpy arrays")
    tq, dev = describe(q, layout)
    tk, dev_k = describe(k, layout)
    tv, dev_v = describe(v, layout)
    if not dev == dev_k == dev_v:
        raise ValueError("qvattn: q, k and v must be on the same device")

    n_tokens = int(tk.shape[2])
    if prefix is not None and int(prefix) < 0:
        raise ValueError(f"qvattn: prefix must be >= 0, got {prefix}")
    if layer is not None and int(layer) < 0:
        raise ValueError(f"qvattn: layer must be >= 0, got {layer}")
    stateless = layer is None and step is None  # see qvattn.attention
    cfg = _config.config_for(  # ValueError on a bad method or option
        method, _config.options_string(options), 0.0 if sm_scale is None else sm_scale,
        _ffi.QVA_LAYER_NONE if stateless else layer or 0, step or 0, num_steps or 0, grid,
        -1 if prefix is None else int(prefix), prefix_at_end, n_tokens)

    # The CPU reference implements every method: if it declines, the request
    # itself is bad (config, dtype, head dim) -> ValueError.  If only the
    # device declines, it is a backend gap -> QvaUnsupportedError.
    head_dim = int(tq.shape[3])
    ok, why = _ffi.supports_heads(_ffi.QVA_DEVICE_CPU, cfg, tq.dtype, head_dim,
                                  int(tq.shape[1]), int(tk.shape[1]))
    if not ok:
        raise QvaValueError(_ffi.QVA_ERR_INVALID_ARGUMENT, why, "qva_supports")

    if ctx is None:
        ctx = default_context(dev, 0)
    elif ctx.device != dev:
        raise ValueError("qvattn: ctx is on a different device than the tensors")

    out = _empty_like(q)
    to, _ = describe(out, layout)
    lse = tl = None
    if return_lse:
        B, H, N = (int(s) for s in tq.shape[:3])
        lse = _empty_like(q, _np.float32, (B, H, N))
        tl = _ffi.make_tensor(lse.ctypes.data, _ffi.QVA_F32, dev, (B, H, N, 1),
                              (H * N, N, 1, 1))
    _ffi.attention_raw(ctx, cfg, tq, tk, tv, to, tl)
    return (out, lse) if return_lse else out


def _terms_call(q, k, v, method, layout, sm_scale, options):
    """The stateless config and the CPU descriptors of a decomposition."""
    tq, _ = describe(q, layout)
    tk, _ = describe(k, layout)
    tv, _ = describe(v, layout)
    cfg = _config.config_for(method, _config.options_string(options),
                             0.0 if sm_scale is None else sm_scale, _ffi.QVA_LAYER_NONE,
                             0, 0, None, 0, False, int(tk.shape[2]))
    return cfg, tq, tk, tv


def error_terms(q, k, v, *, method=_ffi.DEFAULT_METHOD, layout="HND", sm_scale=None,
                options=None):
    """Where `method`'s error comes from, on CPU inputs (qva_error_terms_compute).

    q, k, v: numpy arrays or CPU torch tensors (float32, bfloat16, float16),
    rank 4 in `layout` ("HND" or "NHD").  The CPU reference runs the method
    with every operand quantized ("full"), with one of them quantized and
    the others FP32 ("q", "k", "p", "v", and "mu", the V-Smooth block means
    of vc8/vc4), and with none ("none"), and compares each output with exact
    attention.  Returns {"full", "q", "k", "p", "v", "mu", "none"}: rel-L2
    values, NaN where a term does not apply (mu without V-Smooth).
    Stateless (V-Smooth groups from a cold start).  Decomposes fp8, sage8,
    vc8, sage4, vc4 and their options; exact, bf16 and draft raise
    QvaUnsupportedError; bad inputs raise what qvattn.attention raises.
    docs/NUMERICS.md, "Where the error comes from", defines each term.
    """
    return _ffi.error_terms(*_terms_call(q, k, v, method, layout, sm_scale, options))


def error_term_directions(q, k, v, *, method=_ffi.DEFAULT_METHOD, layout="HND",
                          sm_scale=None, options=None):
    """error_terms, and the sign of each term's error: (terms, directions)
    with directions = {term: {"sharpen", "cos"}} (qva_error_terms_directions_compute;
    error_direction says what the two numbers mean).  Which operand's code
    makes the rows sharper or flatter: +i8pv's lean sits in its "p" term.
    Same inputs, costs and errors as error_terms."""
    return _ffi.error_term_directions(*_terms_call(q, k, v, method, layout, sm_scale, options))


def _host_f32_hnd(x, layout, what):
    """x (numpy or torch, any device) as a C-contiguous float32 numpy array
    laid out [B, H, N, D]."""
    if layout not in _LAYOUTS:
        raise ValueError(f"qvattn: layout must be one of {_LAYOUTS}, got {layout!r}")
    if _is_torch(x):
        x = x.detach().float().cpu()
        x = (x.permute(0, 2, 1, 3) if layout == "NHD" else x).contiguous().numpy()
    elif _is_numpy(x):
        x = _np.asarray(x, dtype=_np.float32)
        x = _np.ascontiguousarray(x.transpose(0, 2, 1, 3) if layout == "NHD" else x)
    else:
        raise TypeError(f"qvattn: {what} must be a torch tensor or a numpy array")
    if x.ndim != 4:
        raise ValueError(f"qvattn: {what} must have rank 4, got shape {tuple(x.shape)}")
    return x


def error_direction(out, ref, v, *, layout="HND"):
    """The part of out's error that moves every row the same way
    (qva_error_direction_compute; docs/NUMERICS.md, "The error's direction").

    out, ref: a method's output and the exact one, [B, H, N, D] in `layout`;
    v: the values given to the call ([B, H_kv, N_k, D], H a multiple of
    H_kv).  numpy arrays or torch tensors on any device (copied to the host
    as float32; the sums are FP64 in the library).  Returns {"sharpen",
    "cos"}: with d = ref - mean(V) per head and e = out - ref, sharpen =
    <e, d>/<d, d> (> 0: rows sharper than exact, < 0: flatter) and cos =
    <e, d>/(|e||d|) (about 0 for rounding noise).  NaN/Inf anywhere raises
    QvaValueError.
    """
    o = _host_f32_hnd(out, layout, "out")
    r = _host_f32_hnd(ref, layout, "ref")
    if o.shape != r.shape:
        raise ValueError(f"qvattn: out {tuple(o.shape)} and ref {tuple(r.shape)} differ in shape")
    vh = _host_f32_hnd(v, layout, "v")
    tv = _ffi.make_tensor(vh.ctypes.data, _ffi.QVA_F32, _ffi.QVA_DEVICE_CPU, vh.shape,
                          tuple(s // 4 for s in vh.strides))
    return _ffi.error_direction(o, r, int(o.shape[1]), int(o.shape[2]), tv)


def _draft_call(q, k, v, method, grid, prefix, prefix_at_end, layout, sm_scale, options):
    """Descriptors and the stateless config of a route report."""
    tq, _ = describe(q, layout)
    tk, _ = describe(k, layout)
    tv, _ = describe(v, layout)
    n_tokens = int(tk.shape[2])
    if prefix is not None and int(prefix) < 0:
        raise ValueError(f"qvattn: prefix must be >= 0, got {prefix}")
    cfg = _config.config_for(method, _config.options_string(options),
                             0.0 if sm_scale is None else sm_scale, _ffi.QVA_LAYER_NONE, 0, 0,
                             grid, -1 if prefix is None else int(prefix), prefix_at_end,
                             n_tokens)
    return cfg, tq, tk, tv


def draft_report(q, k, v, *, method="draft@85/0/0/15", grid=None, prefix=None,
                 prefix_at_end=False, layout="HND", sm_scale=None, options=None):
    """How much of the exact attention mass a draft route keeps, per head, on
    CPU inputs (qva_draft_report_compute; docs/DRAFT.md, "Route quality").

    q, k, v: numpy arrays or CPU torch tensors (float32, bfloat16, float16),
    rank 4 in `layout`; grid (T, H, W) and prefix as for qvattn.attention.
    Masses are exact (FP64) softmax probability averaged over the video
    query rows: "router_mass" is what the kept region pairs hold (with
    "mass16", "mass8", "mass4" per phase and "prefix_mass", the always-kept
    prefix keys), "oracle_mass" what the heaviest pairs of the same number
    hold, "ratio" router / oracle, "rel_l2" the draft output against exact.
    Returns {"summary": {...}, "heads": [{...} per query head]}; the
    summary's masses are means over heads, "ratio_min" the lowest head's
    ratio.  Bad inputs raise what qvattn.attention raises.
    """
    cfg, tq, tk, tv = _draft_call(q, k, v, method, grid, prefix, prefix_at_end, layout,
                                  sm_scale, options)
    return _ffi.draft_report(cfg, tq, tk, tv)


def draft_sweep(q, k, v, skip_rates=(50, 70, 85, 90, 95), *, method="draft@85/0/0/15",
                grid=None, prefix=None, prefix_at_end=False, layout="HND", sm_scale=None,
                options=None):
    """draft_report at each skip rate (percent) with `method`'s split of the
    kept pairs among 16, 8 and 4 bits (qva_draft_sweep_compute): a list of
    {"summary", "heads"} dicts, one per rate, whose summary["skip"] is the
    rate as a fraction.  The curve to pick a sparsity from."""
    cfg, tq, tk, tv = _draft_call(q, k, v, method, grid, prefix, prefix_at_end, layout,
                                  sm_scale, options)
    return _ffi.draft_sweep(cfg, tq, tk, tv, [float(s) / 100.0 for s in skip_rates])


def synthetic_presets():
    """The names of the built-in synthetic workloads (docs/SYNTHETIC.md)."""
    return _ffi.synthetic_presets()


def synthetic(name="wan-small", seed=None, heads=None):
    """A built-in synthetic workload (qva_synthetic_generate, the same
    tensors as `qvattn eval --synthetic NAME --seed S`).

    Returns {"q", "k", "v": float32 numpy arrays [B, H, N, D] (HND),
    "grid": (T, H, W), "prefix": prefix tokens, "name", "seed", "recipe"}.
    heads: generate only the first `heads` heads (each head is drawn on its
    own, so they equal the full workload's; for the long presets, whose 40
    heads take gigabytes).  An unknown name raises QvaValueError listing the
    presets."""
    if _np is None:
        raise ImportError("qvattn.synthetic needs numpy")
    spec = _ffi.synthetic_spec(name, seed)
    if heads is not None:
        if int(heads) < 1:
            raise ValueError(f"qvattn.synthetic: heads must be >= 1, not {heads!r}")
        spec.H = min(int(spec.H), int(heads))
    n = spec.prefix_tokens + spec.grid_t * spec.grid_h * spec.grid_w
    shape = (spec.B, spec.H, n, spec.D)
    q, k, v = (_np.empty(shape, dtype=_np.float32) for _ in range(3))
    ptr = lambda a: a.ctypes.data_as(_ffi.POINTER(_ffi.ctypes.c_float))  # noqa: E731
    _ffi.synthetic_generate(spec, ptr(q), ptr(k), ptr(v))
    return {"q": q, "k": k, "v": v, "grid": (spec.grid_t, spec.grid_h, spec.grid_w),
            "prefix": int(spec.prefix_tokens), "name": spec.name.decode(),
            "seed": int(spec.seed), "recipe": int(spec.recipe)}


def capture(pipe, layers=None, steps=None, path="qvattn-capture", **kwargs):
    """Save post-RoPE q/k/v of chosen layers and steps (see qvattn.capture)."""
    from .capture import capture as _capture
    return _capture(pipe, layers=layers, steps=steps, path=path, **kwargs)
