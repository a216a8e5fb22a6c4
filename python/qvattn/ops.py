"""The PyTorch layer of qvattn: the ``qvattn::attention`` custom op.

``qvattn.attention(q, k, v, ...)`` on torch tensors lands here.  The split:

* ``attention_torch`` (the Python front) checks the arguments' types,
  ranks, dtypes, devices and layout, asks the library (through _config,
  constant-folded) whether it can run the request (``support_reason``) and
  otherwise raises or, if the caller opted in with ``fallback=True``, warns
  and runs ``torch.nn.functional.scaled_dot_product_attention``.  It reads
  no tensor data, so ``torch.compile`` traces it without graph breaks.
  What the library checks on the call itself (the step of a StepState,
  shapes, self-attention, NaN/Inf of CPU inputs) it checks in the op.
* ``sdpa`` (``qvattn.sdpa``) takes torch SDPA's arguments, signature
  and semantics, brings them to [B, H, N, D] (views where no broadcast is
  needed) and calls ``attention_torch`` statelessly; what it cannot run it
  refuses or, with ``fallback=True``, hands to torch SDPA as given.
* ``torch.ops.qvattn.attention`` (``_attention_op``) is a
  ``torch.library.custom_op`` with a fake (meta) implementation, opaque to
  the compiler.  Its real implementation allocates the outputs with torch
  (the caching allocator, so CUDA-graph capture sees ordinary allocations),
  points the qvattn context at **the current CUDA stream** and calls
  ``qva_attention`` through ctypes.  It does no host synchronization unless
  a key-padding mask has to be read (see below).

Per-call state that changes during a denoising run (the step index, the
latent grid) is not passed as a Python number when a ``StepState`` drives
the call: the op receives ``state_id`` and ``step=-1`` and reads the step
at run time.  That keeps ``torch.compile`` from specializing (and
recompiling) on every step.  Under CUDA-graph replay no Python runs, so a
replayed graph repeats the step it was captured at (docs/PYTHON.md).

Imports go one way: ops uses _config and _ffi, never the package
(qvattn/__init__.py), which uses ops.

Key-padding masks (``attn_mask`` boolean, broadcastable to [B,1,1,Nk],
True = attend, SDPA's convention) are honoured by computing attention
over the valid keys only.  The valid-key pattern has to be known on the
host, so the real implementation copies the mask to the CPU: one device
synchronization per distinct mask (cached per StepState forward pass), and
not possible inside CUDA-graph capture unless cached.  Methods that need
self-attention (vc8, vc4, draft) run on the valid tokens only; the
query rows of padded tokens (whose outputs a model discards) are computed
with torch over the valid keys.

Draft dense warm-up steps (draft.dense_warmup_steps / _frac) are plain
dense BF16 attention: the library computes them "exactly as the bf16
method".  With option "draft.dense_backend" = "sdpa" (the default for CUDA
tensors) the op computes such a step with torch SDPA instead (cuDNN on
Hopper, about 2x the library's mma.sync BF16 kernel), on the current stream,
with the same scale, mask handling and layout.  The decision is the
library's (_config.draft_dense_warmup: qva_draft_step_check), taken at run
time from the call's config, and so are the call's checks before SDPA
computes (qva_attention_check); calls with return_lse keep the library
path (public SDPA returns no LSE).  "qvattn" keeps the library for every
step.
"""
import itertools
import math
import struct
import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from . import _config, _ffi
from ._config import _base_config, options_string  # noqa: F401  (ops.options_string)

__all__ = ["attention_torch", "StepState", "support_reason", "options_string",
           "QvattnFallbackWarning", "sdpa_reference"]

_LAYOUTS = ("HND", "NHD")
_TORCH_DTYPES = {torch.float32: _ffi.QVA_F32, torch.bfloat16: _ffi.QVA_BF16,
                 torch.float16: _ffi.QVA_F16}


class QvattnFallbackWarning(UserWarning):
    """qvattn could not run a call and used torch SDPA instead (fallback=True)."""


# ------------------------------------------------------------------ static checks
@torch.compiler.assume_constant_result
def support_reason(device: int, method: str, options: str, dtype: int,
                   head_dim: int, step: int = 0, num_steps: int = 0, heads: int = 1,
                   kv_heads: int = 1) -> str:
    """'' if the library runs the request, else 'E:', 'V:' or 'U:' and its
    reason (_config.support_reason: qva_supports_heads' answer, cached).
    Constant-folded under torch.compile (no ctypes call in a traced graph).
    """
    return _config.support_reason(device, method, options, dtype, head_dim, step,
                                  num_steps, heads, kv_heads)


# ------------------------------------------------------------------ step state
_state_ids = itertools.count(1)
_states = {}  # id -> StepState (strong: removed by StepState.close)


class StepState:
    """Where a denoising run is, read by the op at run time.

    step       0-based denoising step index of the current forward pass.
    num_steps  steps in the run (0 = unknown: V-Smooth then regroups on
               every call, the fractional draft warm-up is off).
    grid       (T, H, W) latent token grid of the current forward (draft).
    forward_index
               counts forward passes (keys the per-forward mask cache).
    pass_index 0 for the first forward of a step, 1 for the second (CFG)...

    observe(t) is called once per transformer forward with the timestep
    value; it counts denoising *steps*, not forward calls: classifier-free
    guidance runs the transformer two (or more) times per step with the
    same timestep, and those passes share one step index.  A timestep that
    rises (more noise than the previous pass) starts a new run (step 0).
    pin(step) fixes the step (benchmarks, manual control); pin(None)
    returns to counting.
    """

    def __init__(self, num_steps=None):
        self.id = next(_state_ids)
        self.step = 0
        self.num_steps = int(num_steps or 0)
        self.fixed_num_steps = num_steps is not None
        self.grid = None
        self.forward_index = 0
        self.pass_index = 0  # forward passes seen before this one in this step
        self.last_t = None
        self.pinned = None
        self.runs = 0
        self.reset_on_new_run = True
        self._pending_new_run = True
        self._contexts = {}
        self._mask_cache = {}
        self._warned = set()
        _states[self.id] = self

    # -- counting
    def begin_run(self, num_steps=None):
        """Marks the start of a new run (next observe() is step 0)."""
        self._pending_new_run = True
        if num_steps is not None and not self.fixed_num_steps:
            self.num_steps = int(num_steps)

    def _new_run(self):
        self.step = 0
        self.runs += 1
        self._pending_new_run = False
        if self.reset_on_new_run:
            for ctx in self._contexts.values():
                ctx.reset()

    def observe(self, t):
        """Records one forward pass at timestep value t (a float; None:
        unknown, the step stays)."""
        self.forward_index += 1
        self._mask_cache.clear()
        if self.pinned is not None:
            self.step = self.pinned
            return self.step
        if t is None:
            return self.step
        t = float(t)
        self.pass_index += 1
        if self._pending_new_run or self.last_t is None or t > self.last_t:
            self._new_run()
            self.pass_index = 0
        elif t < self.last_t:
            self.pass_index = 0
            self.step += 1
            if self.num_steps > 0 and self.step >= self.num_steps:
                if "overrun" not in self._warned:
                    self._warned.add("overrun")
                    warnings.warn(
                        f"qvattn: more distinct timesteps than num_steps="
                        f"{self.num_steps}; later steps use step "
                        f"{self.num_steps - 1}", RuntimeWarning, stacklevel=3)
                self.step = self.num_steps - 1
        self.last_t = t
        return self.step

    def pin(self, step, num_steps=None):
        if num_steps is not None:
            self.num_steps = int(num_steps)
            self.fixed_num_steps = True
        self.pinned = None if step is None else int(step)
        if self.pinned is not None:
            self.step = self.pinned

    # -- contexts
    def context_for(self, device):
        key = (device.type, device.index if device.type == "cuda" else None)
        if device.type == "cuda" and key[1] is None:
            key = ("cuda", torch.cuda.current_device())
        ctx = self._contexts.get(key)
        if ctx is None:
            kind = _ffi.QVA_DEVICE_CUDA if device.type == "cuda" else _ffi.QVA_DEVICE_CPU
            ctx = self._contexts[key] = _ffi.Context(kind)
            ctx._cuda_index = key[1]
        return ctx

    def reset(self):
        """Drops the per-layer state of every context (next call regroups)."""
        for ctx in self._contexts.values():
            ctx.reset()

    def close(self):
        _states.pop(self.id, None)
        for ctx in self._contexts.values():
            ctx.close()
        self._contexts.clear()


# ------------------------------------------------------------------ contexts
def _context(ctx_id, state, device):
    """ctx_id > 0: that Context; else the StepState's context for the
    device; else qvattn.default_context (one shared context per device)."""
    if ctx_id > 0:
        ctx = _ffi.contexts_by_id.get(ctx_id)
        if ctx is None:
            raise ValueError(f"qvattn: context {ctx_id} was closed or never existed")
    elif state is not None:
        ctx = state.context_for(device)
    elif device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        ctx = _ffi.default_context(_ffi.QVA_DEVICE_CUDA, idx)
        if getattr(ctx, "_cuda_index", None) is None:
            ctx._cuda_index = idx
    else:
        ctx = _ffi.default_context(_ffi.QVA_DEVICE_CPU)
    want = _ffi.QVA_DEVICE_CUDA if device.type == "cuda" else _ffi.QVA_DEVICE_CPU
    if ctx.device != want:
        raise ValueError("qvattn: ctx is on a different device than the tensors")
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        bound = getattr(ctx, "_cuda_index", None)
        if bound is None:
            ctx._cuda_index = idx
        elif bound != idx:
            raise ValueError(f"qvattn: this context holds state on cuda:{bound}; "
                             f"the tensors are on cuda:{idx} (use one context per GPU)")
    return ctx


# ------------------------------------------------------------------ the C call
def _device(t):
    return _ffi.QVA_DEVICE_CUDA if t.is_cuda else _ffi.QVA_DEVICE_CPU


def _desc(t, layout):
    dt = _TORCH_DTYPES[t.dtype] if t.dtype in _TORCH_DTYPES else _ffi.QVA_F32
    s = t.stride()
    if layout == "HND":
        shape, stride = list(t.shape), list(s)
    else:
        b, n, h, d = t.shape
        shape, stride = [b, h, n, d], [s[0], s[2], s[1], s[3]]
    return _ffi.make_tensor(t.data_ptr(), dt, _device(t), shape, stride)


def _lse_desc(lse):
    # lse: f32 [B, H, N] (any strides) -> a [B,H,N,1] descriptor
    s = lse.stride()
    return _ffi.make_tensor(lse.data_ptr(), _ffi.QVA_F32, _device(lse),
                            list(lse.shape) + [1], [s[0], s[1], s[2], 1])


def _c_attention(ctx, cfg, q, k, v, out, lse, layout):
    tq, tk, tv, to = (_desc(x, layout) for x in (q, k, v, out))
    tl = _lse_desc(lse) if lse is not None else None
    if q.is_cuda:
        with torch.cuda.device(q.device):
            ctx.set_stream(torch.cuda.current_stream(q.device).cuda_stream)
            _ffi.attention_raw(ctx, cfg, tq, tk, tv, to, tl)
    else:
        _ffi.attention_raw(ctx, cfg, tq, tk, tv, to, tl)


def _tokdim(layout):
    return 2 if layout == "HND" else 1


def _gqa_kw(gqa):
    """torch SDPA's enable_gqa, passed only when needed (torch >= 2.5 has it)."""
    return {"enable_gqa": True} if gqa else {}


# ------------------------------------------------------------------ draft warm-up on SDPA
def _warmup_on_sdpa(cfg, backend, want_lse, k, layout):
    """True: compute this call with torch SDPA (backend "sdpa", no LSE
    wanted, and the library says: a draft dense warm-up step; it raises
    for a draft config it rejects)."""
    return (backend == "sdpa" and not want_lse
            and _config.draft_dense_warmup(cfg, k.shape[_tokdim(layout)], k.shape[-1]))


def _sdpa_dense(cfg, q, k, v, layout):
    """The bf16 method's computation with torch SDPA: BF16 operands (FP16
    for float16 inputs, as the library's use_f16), scale cfg.sm_scale or
    1/sqrt(D), after the library's own checks of the call (config, shapes,
    NaN/Inf of CPU inputs: qva_attention_check).  Returns out in q's layout
    and dtype (a new tensor)."""
    _ffi.attention_check(_device(q), cfg, *(_desc(x, layout) for x in (q, k, v)),
                         func="qvattn.attention")
    dt = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16

    def hnd(x):
        return x if layout == "HND" else x.transpose(1, 2)

    qh, kh, vh = (hnd(x).to(dt) for x in (q, k, v))
    scale = float(cfg.sm_scale) if cfg.sm_scale > 0 else 1.0 / math.sqrt(q.shape[-1])
    o = F.scaled_dot_product_attention(qh, kh, vh, scale=scale,
                                       **_gqa_kw(qh.shape[1] != kh.shape[1]))
    return hnd(o).to(q.dtype)


def _attend(ctx, cfg, q, k, v, out, lse, layout, backend):
    """One qva_attention call into out (and lse), or its SDPA equivalent
    on a draft dense warm-up step (_warmup_on_sdpa)."""
    if _warmup_on_sdpa(cfg, backend, lse is not None, k, layout):
        out.copy_(_sdpa_dense(cfg, q, k, v, layout))
    else:
        _c_attention(ctx, cfg, q, k, v, out, lse, layout)


def _config_for(method, options, sm_scale, layer, step, num_steps, grid, prefix,
                prefix_at_end, n_tokens, state):
    """config_for with step = -1 / num_steps = -1 / empty grid taken from the
    StepState at run time."""
    if step < 0:
        if state is None:
            raise ValueError("qvattn: step=-1 (from the step state) needs a state")
        step = state.step
        if num_steps < 0:
            num_steps = state.num_steps
    if not grid and state is not None and state.grid is not None:
        grid = state.grid
    return _config.config_for(method, options, sm_scale, layer, step, num_steps, grid,
                              prefix, prefix_at_end, n_tokens)


# ------------------------------------------------------------------ torch reference
def sdpa_reference(q, k, v, layout="HND", sm_scale=None, want_lse=False,
                   attn_mask=None, is_causal=False, dropout_p=0.0, rows_per_chunk=512):
    """torch attention in q's layout: SDPA, or (want_lse) an exact chunked
    float32 computation that also returns the log-sum-exp [B, H, Nq].
    k and v may have fewer heads than q (grouped-query attention, torch's
    enable_gqa: query head h reads K/V head h // (H // H_kv))."""
    def hnd(x):
        return x if layout == "HND" else x.transpose(1, 2)

    qh, kh, vh = hnd(q), hnd(k), hnd(v)
    gqa = qh.shape[1] != kh.shape[1]
    scale = None if not sm_scale else float(sm_scale)
    if not want_lse:
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask,
                                           dropout_p=dropout_p, is_causal=is_causal,
                                           scale=scale, **_gqa_kw(gqa))
        return hnd(o), None
    if is_causal or dropout_p:
        raise ValueError("qvattn: return_lse with the torch fallback needs "
                         "is_causal=False and dropout_p=0")
    if gqa:  # torch's own computation (the fallback), not qvattn's kernels
        g = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(g, 1), vh.repeat_interleave(g, 1)
    scale = scale if scale is not None else 1.0 / math.sqrt(qh.shape[-1])
    B, H, N, D = qh.shape
    out = torch.empty(B, H, N, vh.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, N, dtype=torch.float32, device=q.device)
    kf, vf = kh.float(), vh.float()
    bias = None
    if attn_mask is not None:
        m = attn_mask
        if m.dtype == torch.bool:
            bias = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
            bias.masked_fill_(~m, float("-inf"))
        else:
            bias = m.float()
    for r0 in range(0, N, rows_per_chunk):
        r1 = min(N, r0 + rows_per_chunk)
        s = (qh[:, :, r0:r1].float() @ kf.transpose(-1, -2)) * scale
        if bias is not None:
            bb = bias
            if bb.dim() == 4 and bb.shape[2] != 1:
                bb = bb[:, :, r0:r1]
            s = s + bb
        l = torch.logsumexp(s, dim=-1)
        lse[:, :, r0:r1] = l
        out[:, :, r0:r1] = (torch.exp(s - l[..., None]) @ vf).to(q.dtype)
    o = out if layout == "HND" else out.transpose(1, 2).contiguous()
    return o, lse


# ------------------------------------------------------------------ masks
def _mask_patterns(mask, state):
    """[Bm, Nk] bool on the host (a device sync unless cached this forward)."""
    key = None
    if state is not None:
        key = (state.forward_index, mask.data_ptr(), tuple(mask.shape),
               mask._version, str(mask.device))
        hit = state._mask_cache.get(key)
        if hit is not None:
            return hit
    host = mask.reshape(mask.shape[0], mask.shape[-1]).to("cpu", torch.bool)
    if key is not None:
        state._mask_cache[key] = host
    return host


def _select_tokens(x, layout, idx, n, is_prefix):
    d = _tokdim(layout)
    if is_prefix:
        return x.narrow(d, 0, n)
    return x.index_select(d, idx.to(x.device))


def _needs_self_attention(cfg, q, k, v, layout):
    """True when the library declines q's rows against the keys k, v for
    their count alone: vc8, vc4 and draft are self-attention methods
    (qva_attention_check answers QVA_ERR_SHAPE).  q, k and v agree on
    everything but the token count here, so that is the only shape it can
    decline; any other error is left to the call itself."""
    probe = _ffi.QvaConfig.from_buffer_copy(cfg)
    probe.check_finite = 0  # a question about shapes: no NaN/Inf scan
    st = _ffi.attention_check_status(_device(q), probe,
                                     *(_desc(x, layout) for x in (q, k, v)))
    return st == _ffi.QVA_ERR_SHAPE


def _run_masked(ctx, method, options, sm_scale, layer, step, num_steps, grid,
                prefix, prefix_at_end, q, k, v, mask, out, lse, layout, state):
    d = _tokdim(layout)
    backend = _config.dense_backend(options, q.is_cuda)
    B, Nk = q.shape[0], k.shape[d]
    host = _mask_patterns(mask, state)
    if host.shape[0] == 1 and B > 1:
        host = host.expand(B, Nk)
    groups = {}
    for b in range(B):
        groups.setdefault(host[b].numpy().tobytes(), []).append(b)
    for gi, bidx in enumerate(groups.values()):
        # batch elements with different padding run as separate calls on
        # different N: give each its own per-layer state key, so the
        # V-Smooth schedule can reuse what it grouped (a stateless call
        # stays stateless)
        glayer = layer
        if len(groups) > 1 and layer != _ffi.QVA_LAYER_NONE:
            glayer = layer + (min(gi, 127) << 24)
        pat = host[bidx[0]]
        n = int(pat.sum())
        if n == 0:
            raise ValueError(f"qvattn: attn_mask masks every key of batch element "
                             f"{bidx[0]} (softmax over no keys is undefined)")
        contiguous = bidx == list(range(bidx[0], bidx[-1] + 1))
        if contiguous:
            sl = slice(bidx[0], bidx[-1] + 1)
            qb, kb, vb, ob = q[sl], k[sl], v[sl], out[sl]
            lb = lse[sl] if lse is not None else None
        else:
            bi = torch.tensor(bidx, device=q.device)
            qb, kb, vb = q.index_select(0, bi), k.index_select(0, bi), v.index_select(0, bi)
            ob = torch.empty_like(qb, memory_format=torch.contiguous_format)
            lb = lse.index_select(0, bi) if lse is not None else None
        idx = torch.nonzero(pat).flatten()
        is_prefix = bool(idx[-1] == n - 1)
        if n == Nk:
            cfg = _config_for(method, options, sm_scale, glayer, step, num_steps, grid,
                              prefix, prefix_at_end, Nk, state)
            _attend(ctx, cfg, qb, kb, vb, ob, lb, layout, backend)
        else:
            ks = _select_tokens(kb, layout, idx, n, is_prefix)
            vs = _select_tokens(vb, layout, idx, n, is_prefix)
            cfg = _config_for(method, options, sm_scale, glayer, step, num_steps, grid,
                              prefix, prefix_at_end, n, state)
            if q.shape[d] != Nk or not _needs_self_attention(cfg, qb, ks, vs, layout):
                # every query row over the valid keys (cross-attention: the
                # library rejects it here for the self-attention methods)
                _attend(ctx, cfg, qb, ks, vs, ob, lb, layout, backend)
            else:
                # self-attention over the valid tokens; padded query rows
                # (outputs a model discards) attend to the valid keys in torch
                qs = _select_tokens(qb, layout, idx, n, is_prefix)
                if is_prefix:
                    os_ = ob.narrow(d, 0, n)
                    ls_ = lb.narrow(2, 0, n) if lb is not None else None
                else:
                    os_ = torch.empty_like(qs, memory_format=torch.contiguous_format)
                    ls_ = (torch.empty(qs.shape[0], lb.shape[1], n, dtype=torch.float32,
                                       device=q.device) if lb is not None else None)
                _attend(ctx, cfg, qs, ks, vs, os_, ls_, layout, backend)
                rest = torch.nonzero(~pat).flatten()
                qr = qb.index_select(d, rest.to(q.device))
                orr, lr = sdpa_reference(qr, ks, vs, layout, sm_scale, lb is not None)
                if not is_prefix:
                    ob.index_copy_(d, idx.to(q.device), os_)
                    if lb is not None:
                        lb.index_copy_(2, idx.to(q.device), ls_)
                ob.index_copy_(d, rest.to(q.device), orr.to(ob.dtype))
                if lb is not None:
                    lb.index_copy_(2, rest.to(q.device), lr)
        if not contiguous:
            bi = torch.tensor(bidx, device=q.device)
            out.index_copy_(0, bi, ob)
            if lse is not None:
                lse.index_copy_(0, bi, lb)


# ------------------------------------------------------------------ the custom op
def _out_shapes(q, layout, return_lse):
    """Shape of the lse output: [B, H, Nq] in either layout, or [0]."""
    if not return_lse:
        return (0,)
    if layout == "HND":
        return (q.shape[0], q.shape[1], q.shape[2])
    return (q.shape[0], q.shape[2], q.shape[1])


@torch.library.custom_op("qvattn::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  attn_mask: Optional[torch.Tensor], method: str, layout: str,
                  sm_scale: float, layer: int, step: int, num_steps: int,
                  grid: List[int], prefix: int, prefix_at_end: bool, options: str,
                  ctx_id: int, state_id: int,
                  return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """qva_attention on torch tensors (see the module docstring).

    step = -1 (and num_steps = -1): read from StepState `state_id` at run
    time.  prefix = -1: all tokens outside the grid (after masking).
    ctx_id = 0: the state's per-device context, else a shared default one.
    Returns (out, lse); lse is an empty tensor unless return_lse.
    """
    state = _states.get(state_id) if state_id > 0 else None
    ctx = _context(ctx_id, state, q.device)
    if state is not None and state.pass_index:
        # the 2nd (3rd...) forward of a step (classifier-free guidance) keeps
        # its own per-layer state: cond and uncond group their own values
        layer = layer + (min(state.pass_index, 127) << 16)
    lse = torch.empty(_out_shapes(q, layout, return_lse), dtype=torch.float32,
                      device=q.device)
    lse_hnd = lse if return_lse else None
    if attn_mask is None:
        d = _tokdim(layout)
        cfg = _config_for(method, options, sm_scale, layer, step, num_steps, grid,
                          prefix, prefix_at_end, k.shape[d], state)
        backend = _config.dense_backend(options, q.is_cuda)
        if _warmup_on_sdpa(cfg, backend, return_lse, k, layout):
            out = _sdpa_dense(cfg, q, k, v, layout)
            if not out.is_contiguous():  # the fake's (and the library's) layout
                out = out.contiguous()
            return out, lse
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _c_attention(ctx, cfg, q, k, v, out, lse_hnd, layout)
    else:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _run_masked(ctx, method, options, sm_scale, layer, step, num_steps, grid,
                    prefix, prefix_at_end, q, k, v, attn_mask, out, lse_hnd, layout,
                    state)
    return out, lse


@_attention_op.register_fake
def _attention_fake(q, k, v, attn_mask, method, layout, sm_scale, layer, step,
                    num_steps, grid, prefix, prefix_at_end, options, ctx_id,
                    state_id, return_lse):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(_out_shapes(q, layout, return_lse), dtype=torch.float32)
    return out, lse


def _no_autograd(ctx, grad_out, grad_lse):
    raise NotImplementedError(
        "qvattn::attention has no backward (inference only); run the model "
        "under torch.no_grad() / torch.inference_mode(), or use SDPA for training")


def _setup_ctx(ctx, inputs, output):
    pass


_attention_op.register_autograd(_no_autograd, setup_context=_setup_ctx)


# ------------------------------------------------------------------ the front
_warned = set()


def _fallback_warn(reason):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"qvattn: {reason}; falling back to torch SDPA "
                      "(fallback=True)", QvattnFallbackWarning, stacklevel=4)


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"qvattn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"qvattn: {name} must be rank 4 ([B,H,N,D] or [B,N,H,D]), "
                         f"got shape {tuple(t.shape)}")
    if t.dtype not in _TORCH_DTYPES:
        raise ValueError(f"qvattn: {name} has dtype {t.dtype}; supported: float32, "
                         "bfloat16, float16")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"qvattn: {name} is on {t.device}; supported: cpu, cuda")


def _padded_head_dim(d, dv):
    """Head dim the library computes q, k (d) and v (dv) at: 64 or 128 by
    zero padding (the larger of the two), or d where it runs as is.  Above
    QVA_MAX_HEAD_DIM the larger dim, which the library refuses."""
    m = max(d, dv)
    if (d == dv and m in (64, 128)) or m > _ffi.QVA_MAX_HEAD_DIM:
        return m
    return 64 if m <= 64 else 128


@torch.compiler.assume_constant_result
def _default_scale(d: int) -> float:
    """1/sqrt(d) as the library computes it (1.0f / sqrtf(d) in FP32), so a
    call padded here scales exactly like one the library pads."""
    r = struct.unpack("f", struct.pack("f", math.sqrt(d)))[0]
    return struct.unpack("f", struct.pack("f", 1.0 / r))[0]


def _classify_mask(attn_mask, B, H, Nq, Nk, device):
    """'' for no mask, 'pad:<4-d shape>' for a boolean key-padding mask, else a reason
    ('U:...') the mask cannot be run by qvattn.  ValueError for a mask that
    is not a mask of this call at all."""
    if attn_mask is None:
        return ""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"qvattn: attn_mask must be a torch.Tensor or None, got "
                        f"{type(attn_mask).__name__}")
    if attn_mask.device != device:
        raise ValueError(f"qvattn: attn_mask is on {attn_mask.device}, q on {device}")
    shape = tuple(attn_mask.shape)
    if len(shape) > 4 or len(shape) == 0:
        raise ValueError(f"qvattn: attn_mask of shape {shape} is not broadcastable "
                         f"to [B,H,Nq,Nk] = [{B},{H},{Nq},{Nk}]")
    full = (1,) * (4 - len(shape)) + shape
    for have, want in zip(full, (B, H, Nq, Nk)):
        if have != 1 and have != want:
            raise ValueError(f"qvattn: attn_mask of shape {shape} is not broadcastable "
                             f"to [B,H,Nq,Nk] = [{B},{H},{Nq},{Nk}]")
    if attn_mask.dtype != torch.bool:
        return ("U:a non-boolean (additive) attn_mask is not supported; pass a "
                "boolean key-padding mask [B,1,1,Nk] (True = attend)")
    if full[1] != 1 or full[2] != 1:
        return ("U:only boolean key-padding masks broadcastable to [B,1,1,Nk] are "
                f"supported, got a dense mask of shape {shape}")
    if full[3] != Nk:
        return ""  # [.., 1] broadcast over keys: attends to all or none
    return "pad:" + ",".join(str(x) for x in full)


def _check_call(q, k, v, layout, method, sm_scale, options, ctx, grid, fallback, layer):
    """The argument checks of attention_torch, in order; returns the shapes
    (B, H, Nq, D, Nk, Hkv, Dv) and the normalized layout, sm_scale,
    options string and grid."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not isinstance(layout, str) or layout.upper() not in _LAYOUTS:
        raise ValueError(f"qvattn: layout must be 'HND' or 'NHD', not {layout!r}")
    layout = layout.upper()
    if not isinstance(method, str):
        raise TypeError(f"qvattn: method must be a string, got {type(method).__name__}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"qvattn: q, k and v must be on one device "
                         f"(q {q.device}, k {k.device}, v {v.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"qvattn: q, k and v must have one dtype "
                         f"(q {q.dtype}, k {k.dtype}, v {v.dtype})")
    d = _tokdim(layout)
    hdim = 2 if layout == "NHD" else 1
    B, H, Nq, D = q.shape[0], q.shape[hdim], q.shape[d], q.shape[3]
    Nk, Hkv, Dv = k.shape[d], k.shape[hdim], v.shape[3]
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"qvattn: q {tuple(q.shape)} and k {tuple(k.shape)} must agree "
                         f"on B and D (layout {layout})")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"qvattn: k {tuple(k.shape)} and v {tuple(v.shape)} must agree "
                         "on B, H and N (v may have its own head dim)")
    if H % Hkv:
        raise ValueError(f"qvattn: q has {H} heads and k, v {Hkv}: grouped-query "
                         "attention needs the query heads to be a multiple of the K/V "
                         "heads (query head h reads K/V head h // (H // H_kv))")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1 and t.shape[3] > 1:
            raise ValueError(f"qvattn: {name}'s head dimension is not contiguous "
                             f"(stride {t.stride(3)}); call .contiguous() first")
    if sm_scale is not None:
        sm_scale = float(sm_scale)
        if not (sm_scale > 0 and math.isfinite(sm_scale)):
            raise ValueError(f"qvattn: sm_scale must be finite and > 0, got {sm_scale}")
    opts = options_string(options)
    if ctx is not None and not isinstance(ctx, _ffi.Context):
        raise TypeError(f"qvattn: ctx must be a qvattn.Context, got {type(ctx).__name__}")
    if grid is not None:
        grid = [int(g) for g in grid]
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"qvattn: grid must be (T, H, W) of positive ints, got {grid}")
        if grid[0] * grid[1] * grid[2] > Nk:
            raise ValueError(f"qvattn: grid {tuple(grid)} has {grid[0] * grid[1] * grid[2]} "
                             f"tokens, more than the {Nk} keys")
    if fallback not in (False, True, "sdpa", None):
        raise ValueError(f"qvattn: fallback must be False, True or 'sdpa', not {fallback!r}")
    if layer is not None and int(layer) < 0:
        raise ValueError(f"qvattn: layer must be >= 0, got {layer} (negative ids are "
                         "reserved: no layer and no step means a stateless call)")
    return (B, H, Nq, D, Nk, Hkv, Dv), layout, sm_scale, opts, grid


def _refusals(q, method, opts, shapes, attn_mask, is_causal, dropout_p, step, num_steps):
    """Why the library would not run this call, as "U:"/"V:" reasons in the
    order they are reported (empty: it runs), with the mask's kind and the
    head dim the call runs at.  An invalid request raises here."""
    B, H, Nq, D, Nk, Hkv, Dv = shapes
    reasons = []
    if is_causal:
        reasons.append("U:causal attention is not supported (video DiTs are non-causal)")
    if dropout_p:
        reasons.append(f"U:dropout (dropout_p={dropout_p}) is not supported")
    mkind = _classify_mask(attn_mask, B, H, Nq, Nk, q.device)
    if mkind.startswith("U:"):
        reasons.append(mkind)
    dev = _ffi.QVA_DEVICE_CUDA if q.device.type == "cuda" else _ffi.QVA_DEVICE_CPU
    # the library's answer for the request, an explicit step included (a
    # StepState's step is checked by qva_attention at run time); the rest
    # of what it checks (shapes, self-attention, NaN/Inf) it checks in the op
    dp = _padded_head_dim(int(D), int(Dv))
    why = support_reason(dev, method, opts, _TORCH_DTYPES[q.dtype], dp,
                         0 if step is None else int(step), int(num_steps or 0), int(H),
                         int(Hkv))
    if why.startswith("E:"):
        raise _ffi.QvaValueError(_ffi.QVA_ERR_INVALID_ARGUMENT, why[2:], "qvattn.attention")
    if why:
        reasons.append(why)
    return reasons, mkind, dp


def _refuse(reasons):
    """Raises the first reason, with the fallback hint."""
    reason, code = reasons[0][2:], reasons[0][0]
    hint = " (pass fallback=True to run torch SDPA instead)"
    if code == "V":
        raise _ffi.QvaValueError(_ffi.QVA_ERR_INVALID_ARGUMENT, reason + hint,
                                 "qvattn.attention")
    raise _ffi.QvaUnsupportedError(_ffi.QVA_ERR_UNSUPPORTED, reason + hint,
                                   "qvattn.attention")


def _op_mask(attn_mask, mkind, Nk):
    """The mask the op takes: a key-padding mask reshaped as _classify_mask
    found it, else None (an all-True or absent mask)."""
    if mkind.startswith("pad:"):
        return attn_mask.reshape([int(x) for x in mkind[4:].split(",")])
    if attn_mask is not None and attn_mask.shape[-1] == 1 and Nk != 1:
        # a [.., 1] boolean mask broadcast over keys: all True is no mask;
        # anything else cannot be checked without reading it
        raise _ffi.QvaValueError(
            _ffi.QVA_ERR_SHAPE, "attn_mask's last dimension must be Nk for a "
            "key-padding mask", "qvattn.attention")
    return None


def _call_ids(state, layer, step, num_steps, grid, prefix):
    """The op's state id, layer, step, number of steps and prefix: -1 where
    a StepState decides at run time, QVA_LAYER_NONE for a stateless call."""
    sid = 0
    if state is not None:
        sid = state.id if isinstance(state, StepState) else int(state)
    # no layer, step or state: a stateless call (the library keeps nothing
    # that a later call reads: QVA_LAYER_NONE)
    stateless = not sid and layer is None and step is None
    layer_i = _ffi.QVA_LAYER_NONE if stateless else int(layer or 0)
    if step is None:
        step_i, nsteps_i = (-1, -1) if sid else (0, int(num_steps or 0))
    else:
        step_i, nsteps_i = int(step), int(num_steps or 0)
    if prefix is None:
        prefix_i = -1 if (grid is not None or sid) else 0
    else:
        prefix_i = int(prefix)
        if prefix_i < 0:
            raise ValueError(f"qvattn: prefix must be >= 0, got {prefix}")
    return sid, layer_i, step_i, nsteps_i, prefix_i


def attention_torch(q, k, v, *, method=_ffi.DEFAULT_METHOD, layout="HND", sm_scale=None,
                    attn_mask=None, return_lse=False, layer=None, step=None,
                    num_steps=None, grid=None, prefix=None, prefix_at_end=False,
                    ctx=None, fallback=False, is_causal=False, dropout_p=0.0,
                    options=None, state=None):
    """qvattn.attention for torch tensors (see qvattn.attention)."""
    shapes, layout, sm_scale, opts, grid = _check_call(
        q, k, v, layout, method, sm_scale, options, ctx, grid, fallback, layer)
    D, Nk, Dv = shapes[3], shapes[4], shapes[6]
    reasons, mkind, dp = _refusals(q, method, opts, shapes, attn_mask, is_causal,
                                   dropout_p, step, num_steps)
    if reasons:
        if not fallback:
            _refuse(reasons)
        _fallback_warn(reasons[0][2:])
        out, lse = sdpa_reference(q, k, v, layout, sm_scale, return_lse,
                                  attn_mask=attn_mask, is_causal=is_causal,
                                  dropout_p=dropout_p)
        return (out, lse) if return_lse else out
    attn_mask = _op_mask(attn_mask, mkind, Nk)

    if dp != D or dp != Dv:
        # head dims other than 64/128 (or v's differing from q's): zero
        # channels up to dp change no score; the scale stays q's 1/sqrt(D)
        if sm_scale is None:
            sm_scale = _default_scale(int(D))
        q, k, v = (x if x.shape[3] == dp else F.pad(x, (0, dp - x.shape[3]))
                   for x in (q, k, v))

    sid, layer_i, step_i, nsteps_i, prefix_i = _call_ids(state, layer, step, num_steps,
                                                         grid, prefix)
    out, lse = torch.ops.qvattn.attention(
        q, k, v, attn_mask, method, layout, float(sm_scale or 0.0),
        layer_i, step_i, nsteps_i, grid or [], prefix_i, bool(prefix_at_end),
        opts, ctx.id if ctx is not None else 0, sid, bool(return_lse))
    if out.shape[3] != Dv:
        out = out[..., :Dv].contiguous()  # the padded output columns dropped
    return (out, lse) if return_lse else out


# ------------------------------------------------------------------ SDPA's signature
_CROSS_METHODS = {"vc8": "sage8", "vc4": "sage4"}  # V-Smooth methods without it


def _sdpa_method(method, n_q, n_k):
    """method=None: qvattn.DEFAULT_METHOD, and where the call is not
    self-attention (Nq != Nk) the same method without V-Smooth (vc8 ->
    sage8, vc4 -> sage4, options kept): V-Smooth groups the tokens of a
    self-attention call.  An explicit method is taken as given."""
    if method is not None:
        return method
    if n_q == n_k:
        return _ffi.DEFAULT_METHOD
    base, plus, rest = _ffi.DEFAULT_METHOD.partition("+")
    return _CROSS_METHODS.get(base, base) + plus + rest


def _lead4(x):
    """x with leading singleton dims up to rank 4 (SDPA's (N..., H, L, E))."""
    return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape)) if x.dim() < 4 else x


def _flat_batch(x, batch):
    """x [..., H, L, E] broadcast to batch + [H, L, E], batch dims flattened
    into one (a view where no broadcast is needed)."""
    if tuple(x.shape[:-3]) != tuple(batch):
        x = x.expand(*batch, *x.shape[-3:])
    return x.reshape(-1, *x.shape[-3:])


def _sdpa_check_args(query, key, value, attn_mask, is_causal):
    """The checks of sdpa's arguments that SDPA itself makes (ValueError,
    TypeError), before any shape is broadcast."""
    for name, t in zip(("query", "key", "value"), (query, key, value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"qvattn.sdpa: {name} must be a torch.Tensor, got "
                            f"{type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"qvattn.sdpa: {name} must have rank >= 2, got shape "
                             f"{tuple(t.shape)}")
    if is_causal and attn_mask is not None:
        raise ValueError("qvattn.sdpa: attn_mask and is_causal=True cannot both be set "
                         "(as in torch SDPA)")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"qvattn.sdpa: query's head dim {query.shape[-1]} differs from "
                         f"key's {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"qvattn.sdpa: key has {key.shape[-2]} tokens, value "
                         f"{value.shape[-2]}")


def _sdpa_heads(query, key, value, enable_gqa):
    """query, key, value as rank-4 views, with their broadcast batch dims;
    a one-head query broadcast over the K/V heads as SDPA does (no copy),
    grouped K/V kept as they are under enable_gqa."""
    q, k, v = (_lead4(t) for t in (query, key, value))
    try:
        batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    except RuntimeError as e:
        raise ValueError(f"qvattn.sdpa: the batch dims of query {tuple(query.shape)}, "
                         f"key {tuple(key.shape)} and value {tuple(value.shape)} do not "
                         f"broadcast: {e}") from None
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hk != hv:
        raise ValueError(f"qvattn.sdpa: key has {hk} heads and value {hv}: they must "
                         "agree (as for torch's enable_gqa)")
    if hq != hk:
        if enable_gqa:
            if hq % hk:
                raise ValueError(f"qvattn.sdpa: number of heads in key and value ({hk}) "
                                 f"must divide the number of heads in query ({hq})")
        elif hq == 1:
            q = q.expand(*q.shape[:-3], hk, q.shape[-2], q.shape[-1])  # broadcast, no copy
        elif hk != 1:
            raise ValueError(f"qvattn.sdpa: query has {hq} heads, key and value {hk}: "
                             "pass enable_gqa=True for grouped-query attention (torch "
                             "SDPA would not broadcast these either)")
    return q, k, v, batch


def _sdpa_refusal(query, args, S, E, scale, fallback):
    """Why qvattn would not run this SDPA call ("" if it would), in the
    order the reasons are reported."""
    if query.dtype not in _TORCH_DTYPES:
        return f"dtype {query.dtype} is not supported (float32, bfloat16, float16)"
    if S == 0 or E == 0:
        return f"attention over no keys or channels (S = {S}, E = {E})"
    if scale is not None and not (float(scale) > 0 and math.isfinite(float(scale))):
        return f"scale={scale} is not supported (finite and > 0)"
    if fallback and torch.is_grad_enabled() and any(t.requires_grad for t in args):
        return "inputs that need a gradient (qvattn has no backward)"
    return ""


def _sdpa_mask(attn_mask, batch, hq, L, S):
    """sdpa's mask in the flattened batch: checked to broadcast to the
    attention weights [batch..., hq, L, S] where the batch is not one dim."""
    mask = attn_mask
    if isinstance(mask, torch.Tensor) and (mask.dim() > 4 or len(batch) != 1):
        full = tuple(batch) + (hq, L, S)
        try:
            if torch.broadcast_shapes(mask.shape, full) != torch.Size(full):
                raise RuntimeError("larger than the attention weights")
        except RuntimeError:
            raise ValueError(f"qvattn.sdpa: attn_mask of shape {tuple(mask.shape)} does "
                             f"not broadcast to the attention weights {full}") from None
        mask = mask.reshape((1,) * (len(full) - mask.dim()) + tuple(mask.shape))
        mask = _flat_batch(mask, batch)
    return mask


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
         scale=None, enable_gqa=False, method=None, fallback=False, options=None):
    """torch.nn.functional.scaled_dot_product_attention, computed by qvattn.

    The signature and semantics are SDPA's (torch 2.5+: scale and
    enable_gqa keyword-only), so ``F.scaled_dot_product_attention =
    qvattn.sdpa`` works; method, fallback and options are qvattn's, after
    them and keyword-only (functools.partial fixes them for the patch).

    query [N..., Hq, L, E], key [N..., H, S, E], value [N..., H, S, Ev]:
    any rank >= 2, batch dims broadcast as SDPA does, float32, bfloat16 or
    float16 on the CPU or a CUDA device.  Heads: H == Hq; or with
    enable_gqa=True grouped-query attention, Hq a multiple of H (query head
    h reads K/V head h // (Hq // H)), run on grouped K/V without copies
    on both backends; without enable_gqa H == 1 broadcasts as in SDPA.  Head dims E,
    Ev <= 128; other than 64/128 (or Ev != E) they are zero-padded to 64 or
    128 with the scale kept at 1/sqrt(E) (exact: zero channels change no
    score) and the padded output columns dropped; above 128 an error.
    scale: None = 1/sqrt(E); must be > 0.  attn_mask: None, or a boolean
    key-padding mask broadcastable to [N..., 1, 1, S] (True = attend).
    Returns [N..., Hq, L, Ev] in query's dtype.

    Stateless: no layer, no step -- identical inputs give identical outputs
    (V-Smooth groups afresh on each call).  method=None: qvattn.DEFAULT_METHOD
    for self-attention (L == S), the same without V-Smooth otherwise
    ("sage8+hadamard", which is sage8).

    What qvattn cannot run -- is_causal, dropout_p > 0, an additive or
    dense mask, float64, scale <= 0, S or E == 0, a method the device backend
    lacks (qvattn.supports says which), and with fallback=True
    inputs that need a gradient (qvattn has no backward) -- raises
    QvaUnsupportedError (a NotImplementedError) naming the reason, or with
    fallback=True warns once per reason (QvattnFallbackWarning) and runs
    torch's SDPA on the original arguments.  Shapes SDPA itself rejects
    raise ValueError; so does is_causal together with attn_mask.
    """
    args = (query, key, value)
    _sdpa_check_args(query, key, value, attn_mask, is_causal)

    def unsupported(reason):
        if fallback:
            _fallback_warn(reason)
            return F.scaled_dot_product_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                **_gqa_kw(enable_gqa))
        raise _ffi.QvaUnsupportedError(
            _ffi.QVA_ERR_UNSUPPORTED, reason + " (pass fallback=True to run torch SDPA "
            "instead)", "qvattn.sdpa")

    q, k, v, batch = _sdpa_heads(query, key, value, enable_gqa)
    hq, L, S, Ev = q.shape[-3], q.shape[-2], k.shape[-2], v.shape[-1]
    out_rank = max(query.dim(), key.dim(), value.dim())
    out_shape = (tuple(batch) + (hq, L, Ev))[4 - out_rank:] if out_rank < 4 else \
        tuple(batch) + (hq, L, Ev)
    if math.prod(out_shape) == 0:
        return query.new_empty(out_shape)
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"qvattn.sdpa: query, key and value must have one dtype "
                         f"({query.dtype}, {key.dtype}, {value.dtype})")
    reason = _sdpa_refusal(query, args, S, q.shape[-1], scale, fallback)
    if reason:
        return unsupported(reason)
    mask = _sdpa_mask(attn_mask, batch, hq, L, S)
    q, k, v = (_flat_batch(t, batch) for t in (q, k, v))
    out = attention_torch(q, k, v, method=_sdpa_method(method, L, S), layout="HND",
                          sm_scale=scale, attn_mask=mask, fallback=fallback,
                          is_causal=is_causal, dropout_p=dropout_p, options=options)
    return out.reshape(out_shape)
