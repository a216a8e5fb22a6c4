"""qvattn in ComfyUI through ``transformer_options["optimized_attention_override"]``.

ComfyUI wraps its attention functions so that, when
``transformer_options["optimized_attention_override"]`` is set, the call
``optimized_attention(q, k, v, heads, mask=..., ..., transformer_options=...)``
becomes ``override(func, q, k, v, heads, ...)`` where ``func`` is the
attention function ComfyUI would have used.  Three ways in:

    from qvattn import comfyui
    # 1. on a ModelPatcher (what a node does):
    model = comfyui.patch_model(model, method="vc8+expcast")
    # 2. by hand:
    model.model_options["transformer_options"]["optimized_attention_override"] = \\
        comfyui.QvattnOverride(method="sage8")
    # 3. the node: NODE_CLASS_MAPPINGS below ("qvattn attention"); copy or
    #    symlink a file that imports them into ComfyUI/custom_nodes/.

``attention(q, k, v, heads, mask=None, attn_precision=None,
skip_reshape=False, skip_output_reshape=False, **kwargs)`` has ComfyUI's
signature: q/k/v are [B, N, H*D] (or [B, H, N, D] with skip_reshape), the
output [B, N, H*D] (or [B, H, N, D] with skip_output_reshape).

The step comes from ``transformer_options["sigmas"]`` (the current sigma)
matched against ``transformer_options["sample_sigmas"]`` (the run's
schedule; ``num_steps = len(sample_sigmas) - 1``): the nearest schedule
entry is the step.  It is resolved once per model call (one host sync) and
a new ``sample_sigmas`` object starts a new run (V-Smooth/draft state
dropped).  The layer id is ``transformer_options["block_index"]`` (with
``block_type`` where a model has several block kinds), else the order of
the self-attention calls within the model call.  The draft grid comes from
``transformer_options["grid_sizes"]`` when the model provides it, or from
``grid=`` here.

Routing: self-attention (as many keys as queries) runs ``method``;
cross-attention with fewer than ``min_cross_tokens`` keys, and anything
qvattn cannot run (an additive or dense mask, a method the GPU lacks...),
goes to ComfyUI's own ``func`` -- with a warning once per reason unless
``fallback=False``, in which case it raises.
"""
import warnings

import torch

from . import _config, _ffi, ops

__all__ = ["QvattnOverride", "attention", "optimized_attention_override",
           "patch_model", "NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]

METHODS = [_ffi.DEFAULT_METHOD, "vc8", "vc8+expcast-centred", "vc8+expcast", "vc8+nohadamard",
           "sage8", "sage8+nohadamard+fp32sum", "fp8", "bf16", "draft@85/0/0/15", "draft@85/0/7.5/7.5",
           "sage4", "vc4", "exact"]


def _resolve_step(sigmas, sample_sigmas):
    """(step, num_steps) of the current sigma in the schedule."""
    cur = float(sigmas.detach().float().max()) if isinstance(sigmas, torch.Tensor) \
        else float(sigmas)
    sched = sample_sigmas.detach().float().flatten().cpu() \
        if isinstance(sample_sigmas, torch.Tensor) else torch.tensor(
            [float(s) for s in sample_sigmas])
    num_steps = max(1, int(sched.numel()) - 1)
    step = int(torch.argmin((sched[:num_steps] - cur).abs()))
    return step, num_steps


class QvattnOverride:
    """A ComfyUI optimized_attention_override running a qvattn method."""

    def __init__(self, method=_ffi.DEFAULT_METHOD, *, fallback=True, min_cross_tokens=4096,
                 options=None, grid=None, draft_warmup=0.25, num_steps=None):
        _config._base_config(method, "")  # ValueError on a bad method name
        opts = dict(options or {})
        if method.startswith("draft") and "draft.dense_warmup_steps" not in opts:
            if isinstance(draft_warmup, float) and draft_warmup < 1:
                opts["draft.dense_warmup_frac"] = draft_warmup
            else:
                opts["draft.dense_warmup_steps"] = int(draft_warmup)
        self.method = method
        self.fallback = bool(fallback)
        self.min_cross_tokens = int(min_cross_tokens)
        self.options = ops.options_string(opts)
        self.grid = None if grid is None else tuple(int(g) for g in grid)
        self.num_steps = num_steps
        self.state = ops.StepState(num_steps)
        self._layers = {}
        self._forward_key = None
        self._sample_sigmas = None
        self._call_counter = 0
        self._warned = set()

    # ComfyUI deep-copies model_options when it clones a patcher: share.
    def __deepcopy__(self, memo):
        return self

    def _warn(self, reason):
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"qvattn: {reason}; using ComfyUI's attention for these calls",
                          ops.QvattnFallbackWarning, stacklevel=4)

    def _begin_call(self, topts):
        sigmas = topts.get("sigmas")
        sample = topts.get("sample_sigmas")
        key = (id(sigmas), id(sample))
        cached = topts.get("_qvattn_step")
        if cached is not None and cached[0] is sigmas and cached[1] is sample:
            return
        st = self.state
        if sample is not None and sample is not self._sample_sigmas:
            self._sample_sigmas = sample
            st.reset()
        if sigmas is not None and sample is not None:
            step, n = _resolve_step(sigmas, sample)
            st.step = step
            st.num_steps = int(self.num_steps or n)
            if step >= st.num_steps:
                st.step = st.num_steps - 1
        elif "nosigmas" not in self._warned:
            self._warned.add("nosigmas")
            warnings.warn("qvattn: transformer_options has no sigmas/sample_sigmas; "
                          "the denoising step is unknown (step 0, V-Smooth regroups "
                          "every call)", RuntimeWarning, stacklevel=4)
        st.forward_index += 1
        st._mask_cache.clear()
        self._forward_key = key
        self._call_counter = 0
        try:
            topts["_qvattn_step"] = (sigmas, sample)
        except TypeError:
            pass

    def _layer_id(self, topts):
        bi = topts.get("block_index")
        if isinstance(bi, int):
            key = (str(topts.get("block_type", "")), bi)
        else:
            key = ("call", self._call_counter)
        self._call_counter += 1
        lid = self._layers.get(key)
        if lid is None:
            lid = self._layers[key] = len(self._layers)
        return lid

    def _grid(self, topts):
        if self.grid is not None:
            return list(self.grid)
        g = topts.get("grid_sizes")
        if g is None:
            return None
        if isinstance(g, torch.Tensor):
            g = g.flatten()[-3:].tolist()
        g = [int(x) for x in list(g)[-3:]]
        return g if len(g) == 3 else None

    # -- ComfyUI's override protocol
    def __call__(self, func, *args, **kwargs):
        return self.attention(*args, _comfy_func=func, **kwargs)

    # -- ComfyUI's attention signature
    def attention(self, q, k, v, heads, mask=None, attn_precision=None,
                  skip_reshape=False, skip_output_reshape=False, _comfy_func=None,
                  **kwargs):
        topts = kwargs.get("transformer_options") or {}

        def original(reason):
            if _comfy_func is None or not self.fallback:
                raise ops._ffi.QvaUnsupportedError(
                    ops._ffi.QVA_ERR_UNSUPPORTED, reason, "qvattn.comfyui")
            self._warn(reason)
            return _comfy_func(q, k, v, heads, mask=mask, attn_precision=attn_precision,
                               skip_reshape=skip_reshape,
                               skip_output_reshape=skip_output_reshape, **kwargs)

        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            raise TypeError("qvattn.comfyui: q, k and v must be torch tensors")
        heads = int(heads)
        if skip_reshape:
            if q.dim() != 4:
                raise ValueError(f"qvattn.comfyui: skip_reshape needs [B,H,N,D], got "
                                 f"{tuple(q.shape)}")
            layout, qq, kk, vv = "HND", q, k, v
        else:
            if q.dim() != 3 or q.shape[-1] % heads:
                raise ValueError(f"qvattn.comfyui: expected [B, N, heads*D] with heads="
                                 f"{heads}, got {tuple(q.shape)}")
            layout = "NHD"
            qq, kk, vv = (x.unflatten(-1, (heads, -1)) for x in (q, k, v))
        tok = 2 if layout == "HND" else 1
        nq, nk = qq.shape[tok], kk.shape[tok]
        if nq != nk and nk < self.min_cross_tokens:
            if _comfy_func is not None:  # short cross-attention: ComfyUI's own
                return _comfy_func(q, k, v, heads, mask=mask,
                                   attn_precision=attn_precision,
                                   skip_reshape=skip_reshape,
                                   skip_output_reshape=skip_output_reshape, **kwargs)
        if attn_precision is not None and attn_precision != q.dtype:
            self._warn_once_precision(attn_precision)
        self._begin_call(topts)
        layer = self._layer_id(topts) if nq == nk else 0
        m = mask
        if m is not None and m.dim() == 2 and m.dtype == torch.bool and \
                m.shape[-1] == nk and m.shape[0] == qq.shape[0] and nq != m.shape[0]:
            m = m[:, None, None, :]  # [B, Nk] key padding
        try:
            out = ops.attention_torch(
                qq, kk, vv, method=self.method, layout=layout, attn_mask=m,
                layer=layer, step=None, num_steps=None, grid=self._grid(topts),
                prefix=None, options=self.options, state=self.state)
        except ops._ffi.QvaUnsupportedError as e:
            return original(e.message)
        except ValueError as e:
            if m is not None or nq != nk:
                return original(str(e))
            raise
        if skip_output_reshape:
            return out if layout == "HND" else out.transpose(1, 2)
        if layout == "NHD":
            return out.flatten(2)
        b, h, n, d = out.shape
        return out.transpose(1, 2).reshape(b, n, h * d)

    def _warn_once_precision(self, prec):
        key = f"attn_precision={prec}"
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"qvattn: ComfyUI asked for attn_precision={prec}; the "
                          f"method {self.method} keeps its own precision",
                          RuntimeWarning, stacklevel=4)


optimized_attention_override = QvattnOverride()
"""A default override (qvattn.DEFAULT_METHOD, falls back to ComfyUI's attention)."""


def attention(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
              skip_output_reshape=False, **kwargs):
    """ComfyUI-signature attention with the default override's settings."""
    return optimized_attention_override.attention(
        q, k, v, heads, mask=mask, attn_precision=attn_precision,
        skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape, **kwargs)


def patch_model(model, method=_ffi.DEFAULT_METHOD, **kwargs):
    """A clone of a ComfyUI ModelPatcher whose attention runs qvattn."""
    m = model.clone()
    topts = m.model_options.setdefault("transformer_options", {})
    topts["optimized_attention_override"] = QvattnOverride(method, **kwargs)
    return m


class QvattnAttentionNode:
    """ComfyUI node: MODEL -> MODEL with qvattn attention."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",),
                             "method": (METHODS, {"default": _ffi.DEFAULT_METHOD})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "qvattn"

    def patch(self, model, method):
        return (patch_model(model, method),)


NODE_CLASS_MAPPINGS = {"QvattnAttention": QvattnAttentionNode}
NODE_DISPLAY_NAME_MAPPINGS = {"QvattnAttention": "qvattn attention"}
