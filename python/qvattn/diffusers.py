"""qvattn in diffusers video pipelines: one hook, diffusers' attention dispatch.

    import qvattn.diffusers
    qvattn.diffusers.apply(pipe, method="vc8+expcast")
    video = pipe(prompt, num_inference_steps=40).frames[0]
    qvattn.diffusers.remove(pipe)          # the original processors again

**The hook.**  Importing this module registers ``"qvattn"`` as an attention
backend of diffusers' dispatcher (``diffusers.models.attention_dispatch``:
a member of ``AttentionBackendName`` plus its function in
``_AttentionBackendRegistry``; diffusers has no public call for a
third-party backend, so the enum member is added the way other projects
do it).  Every attention call qvattn takes over in diffusers ends in one
function, ``_attend`` -- the registered backend and the SDPA route below
both call it -- which decides between qvattn, diffusers' own attention and
the fallback.  Under diffusers' context parallelism (``enable_parallelism``
with a ``ContextParallelConfig``: Ulysses, ring or both) the backend is
registered as context-parallel capable and ``_attend`` hands the call to
diffusers' own templated Ulysses / ring code with qvattn as its attention
(``_attend_cp``; the methods per mode are qvattn.parallel's).

apply() then, for each supported attention module of the pipeline's
transformer(s) (``transformer``, ``transformer_2``):

* wraps its processor in a ``QvattnProcessor`` (same call signature) that
  tells ``_attend`` which module is calling (its layer id, whether it is
  self-attention, where its text tokens are);
* sets the wrapped processor's backend to ``"qvattn"`` -- for processors
  that call ``dispatch_attention_fn`` (Wan, SkyReels-V2, HunyuanVideo,
  HunyuanVideo-1.5, LTX-Video) -- or, for processors that call
  ``torch.nn.functional.scaled_dot_product_attention`` themselves
  (CogVideoX, Mochi), routes those calls through a TorchFunctionMode while
  the processor runs;
* hooks each transformer's forward to track the denoising step (below).

The model's own processor still computes the projections, norms and RoPE;
qvattn replaces only the attention.

**set_attention_backend after apply().**  ``model.set_attention_backend(b)``
(and ``reset_attention_backend()``, and a module's own
``set_attention_backend``) set the backend of the wrapped processors:

* ``"qvattn"``: qvattn runs, with apply()'s method, layer ids and steps;
* anything else: that backend runs -- what diffusers documents -- and a
  ``QvattnBackendWarning`` says, at the call, that qvattn no longer runs on
  the modules apply() patched and how to get it back.  (CogVideoX's and
  Mochi's processors call torch SDPA directly; there diffusers' backends
  do not apply and the processor's own SDPA runs.)

Replacing a patched module's processor after apply() (``set_attn_processor``,
``fuse_qkv_projections`` on CogVideoX, ...) leaves that module without
qvattn: the next forward warns once, and remove() leaves the new processor
in place.

``model.set_attention_backend("qvattn")`` without apply() runs
``BACKEND_METHOD`` (sage8: no per-layer state, so no steps needed) on
self-attention calls, stateless, with fallback to torch SDPA, and diffusers'
native SDPA on cross-attention.  It also becomes diffusers' active backend
for processors whose backend is unset, as with any backend.

**Steps.**  Steps are counted from the ``timestep`` argument of the
transformer's forward: a new value is a new step, the same value again
(classifier-free guidance runs the transformer two or three times per step;
Wan2.2's high/low-noise transformers share one counter) is the same step,
and a value *higher* than the previous one (more noise) starts a new run at
step 0 (and drops the V-Smooth/draft state so every run starts alike).
Reading the timestep is one host synchronization per forward when the
timestep lives on the GPU.  The step count of a run is ``num_steps=`` if
given, else ``len(pipe.scheduler.timesteps)`` read at the first forward of
each run, else unknown (V-Smooth then regroups on every call: correct,
slower; a warning says so).  ``set_step(pipe, i, n)`` pins the step
(benchmarks); ``set_step(pipe, None)`` returns to counting.

**Routing inside _attend.**  Self-attention runs ``method`` in the layout it
arrives in (NHD from the dispatcher, HND from a direct SDPA call) without
copies, with the latent grid of the forward (draft) and the text tokens as
the draft prefix (at the end: HunyuanVideo, HunyuanVideo-1.5, Mochi; at the
start: CogVideoX).  Cross-attention (Wan ``attn2``: 512 text keys, plus 257
image keys in I2V; LTX ``attn2``) runs diffusers' own attention (the backend
the processor had before apply(), else native SDPA) unless
``cross_attention="qvattn"`` and the keys number at least
``min_cross_tokens``.  Boolean key-padding masks (HunyuanVideo
``[B,1,1,N]``; HunyuanVideo-1.5's ``[B,1,N,N]`` outer product of one, whose
diagonal is the key-padding vector) are honoured: attention runs over the
valid tokens only (ops.py).  Anything qvattn cannot run raises a clear
error, or with ``fallback=True`` warns once per reason and uses torch SDPA.

Method ``"sdpa"`` installs the same hook but computes attention with
diffusers' own attention (a baseline with identical plumbing; capture uses
it).
"""
import inspect
import warnings

import torch
import torch.nn.functional as F

from . import _config, _ffi, ops, parallel

__all__ = ["apply", "remove", "set_step", "layer_ids", "state", "transformers_of",
           "supported_processors", "QvattnProcessor", "QvattnBackendWarning",
           "BACKEND", "BACKEND_METHOD"]

BACKEND = "qvattn"
"""The name of qvattn's backend in diffusers (``set_attention_backend``)."""

BACKEND_METHOD = "sage8"
"""What the backend runs on a module apply() did not patch (stateless)."""

_HANDLE_ATTR = "_qvattn_handle"
_DRAFT_WARMUP_DEFAULT = 0.25


class QvattnBackendWarning(UserWarning):
    """After apply(), an attention backend other than qvattn was set (or a
    patched processor was replaced): those modules no longer run qvattn."""


# ------------------------------------------------------------------ supported processors
class _Kind:
    """How qvattn reaches one diffusers processor class.

    route          "dispatch": the processor calls dispatch_attention_fn with
                   its _attention_backend; "sdpa": it calls torch SDPA itself.
    self_attention (module name, module) -> True for self-attention modules
                   (numbered first); cross-attention is recognised per call
                   as well (fewer or more keys than queries).
    prefix_at_end  text tokens after the video tokens in joint attention.
    mask           None, or "pairwise": a [B,1,N,N] boolean mask that is the
                   outer product of a key-padding vector (its diagonal).
    """

    def __init__(self, route, self_attention, prefix_at_end=False, mask=None):
        self.route = route
        self.self_attention = self_attention
        self.prefix_at_end = prefix_at_end
        self.mask = mask


def _not_cross(name, module):
    return not getattr(module, "is_cross_attention", False)


def _not_attn2(name, module):
    return not name.endswith("attn2")


def _always(name, module):
    return True


# processor class name -> _Kind.  Matched by name, so copies of a processor
# in other model files (Wan's in ChronoEdit, Wan-Animate; HunyuanVideo's in
# Framepack) are taken too.
_SUPPORTED = {
    "WanAttnProcessor": _Kind("dispatch", _not_cross),           # Wan2.1/2.2, VACE
    "SkyReelsV2AttnProcessor": _Kind("dispatch", _not_cross),    # SkyReels-V2
    "HunyuanVideoAttnProcessor2_0": _Kind("dispatch", _always, prefix_at_end=True),
    "HunyuanVideo15AttnProcessor2_0": _Kind("dispatch", _always, prefix_at_end=True,
                                            mask="pairwise"),
    "LTXVideoAttnProcessor": _Kind("dispatch", _not_attn2),      # LTX-Video 0.9.x
    "CogVideoXAttnProcessor2_0": _Kind("sdpa", _always),         # text first
    "MochiAttnProcessor2_0": _Kind("sdpa", _always, prefix_at_end=True),
}


def supported_processors():
    """Names of the diffusers processor classes apply() patches."""
    return sorted(_SUPPORTED)


# ------------------------------------------------------------------ the backend
_member = None


def _backend_member():
    """diffusers' AttentionBackendName member for "qvattn"; registers the
    backend on first use (idempotent)."""
    global _member
    if _member is not None:
        return _member
    from diffusers.models import attention_dispatch as ad
    names, registry = ad.AttentionBackendName, ad._AttentionBackendRegistry
    m = names._value2member_map_.get(BACKEND)
    if m is None:
        # diffusers' backends are a closed Enum: add a member the way Enum
        # itself stores them (value map, name map, name list)
        m = str.__new__(names, BACKEND)
        m._name_, m._value_ = "QVATTN", BACKEND
        m.__objclass__ = names
        names._value2member_map_[BACKEND] = m
        names._member_map_["QVATTN"] = m
        names._member_names_.append("QVATTN")
        try:
            type.__setattr__(names, "QVATTN", m)
        except (AttributeError, TypeError):  # pragma: no cover - Enum internals
            pass
    if registry._backends.get(m) is not _qvattn_backend:
        # context parallelism: _attend runs diffusers' own Ulysses / ring code
        # (_templated_context_parallel_attention) around qvattn (_attend_cp)
        registry.register(m, constraints=[], supports_context_parallel=True)(_qvattn_backend)
    _member = m
    return m


def _is_qvattn(backend):
    return backend is not None and str(getattr(backend, "value", backend)) == BACKEND


def _diffusers_backend(previous):
    """The backend diffusers' own attention runs with: the processor's
    backend before apply(), else the active one, never qvattn."""
    from diffusers.models import attention_dispatch as ad
    if previous is not None and not _is_qvattn(previous):
        return previous
    active = ad._AttentionBackendRegistry._active_backend
    return ad.AttentionBackendName.NATIVE if _is_qvattn(active) else active


class _Current:
    """Which patched processor is running (set around its call)."""
    processor = None


_current = _Current()


def _qvattn_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False, _parallel_config=None):
    """diffusers' dispatch calls this for backend "qvattn" ([B, N, H, D])."""
    proc = _current.processor

    def original():
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        return dispatch_attention_fn(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
            backend=_diffusers_backend(proc.previous if proc is not None else None),
            parallel_config=_parallel_config)

    return _attend(proc, query, key, value, attn_mask, "NHD", original,
                   dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                   parallel_config=_parallel_config)


class _SdpaRoute(torch.overrides.TorchFunctionMode):
    """While a patched processor of route "sdpa" runs: its calls of
    torch.nn.functional.scaled_dot_product_attention ([B, H, N, D]) go to
    _attend; every other torch function runs as usual."""

    def __init__(self, proc):
        super().__init__()
        self.proc = proc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        sig = _SDPA_SIGNATURE.bind(*args, **kwargs)
        sig.apply_defaults()
        a = sig.arguments
        return _attend(self.proc, a["query"], a["key"], a["value"], a["attn_mask"], "HND",
                       lambda: func(*args, **kwargs), dropout_p=a["dropout_p"],
                       is_causal=a["is_causal"], scale=a["scale"])


_SDPA_SIGNATURE = inspect.Signature([
    inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
    for n, d in (("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
                 ("value", inspect.Parameter.empty), ("attn_mask", None),
                 ("dropout_p", 0.0), ("is_causal", False), ("scale", None),
                 ("enable_gqa", False))])


def _attend(proc, q, k, v, mask, layout, original, *, dropout_p=0.0, is_causal=False,
            scale=None, parallel_config=None):
    """The hook: every attention call qvattn takes over in diffusers.

    proc      the QvattnProcessor running (None: the backend was selected
              without apply()).
    layout    "NHD" (the dispatcher) or "HND" (a direct SDPA call).
    original  () -> what diffusers would have computed (its own backend, or
              the processor's own SDPA call).
    """
    if parallel_config is not None and _cp_degree(parallel_config) > 1:
        return _attend_cp(proc, q, k, v, mask, original, dropout_p=dropout_p,
                          is_causal=is_causal, scale=scale, parallel_config=parallel_config)
    tok = 1 if layout == "NHD" else 2
    nq, nk = q.shape[tok], k.shape[tok]
    if proc is None:
        if nq != nk:
            return original()
        return ops.attention_torch(q, k, v, method=BACKEND_METHOD, layout=layout,
                                   sm_scale=scale, attn_mask=mask, fallback=True,
                                   is_causal=is_causal, dropout_p=dropout_p)
    h = proc.handle
    kind = proc.kind
    if (not proc.self_attention or nq != nk) and (
            h.cross_attention != "qvattn" or nk < h.min_cross_tokens):
        return original()
    if kind.mask == "pairwise" and isinstance(mask, torch.Tensor) and mask.dim() == 4 \
            and mask.dtype == torch.bool and mask.shape[-2] == mask.shape[-1] == nk:
        mask = mask.diagonal(dim1=-2, dim2=-1).unsqueeze(-2)  # [B, 1, 1, N], a view
    st = h.state
    cap = h.capture
    if cap is not None and cap.wants(proc.layer_id, st.step):
        qn, kn, vn = (x if layout == "NHD" else x.transpose(1, 2) for x in (q, k, v))
        cap.writer(proc, qn, kn, vn, mask, kind.prefix_at_end)
    if h.method == "sdpa":
        return original()
    if h.warn_unknown_steps and st.num_steps <= 0 and "steps" not in h.warned:
        h.warned.add("steps")
        warnings.warn("qvattn.diffusers: the number of denoising steps is unknown "
                      "(pass num_steps= to apply()); V-Smooth regroups on every "
                      "step and the draft warm-up is off", RuntimeWarning, stacklevel=3)
    return ops.attention_torch(
        q, k, v, method=h.method, layout=layout, sm_scale=scale, attn_mask=mask,
        layer=proc.layer_id, step=None, num_steps=None, grid=None, prefix=None,
        prefix_at_end=kind.prefix_at_end, fallback=h.fallback, options=h.options,
        state=st, is_causal=is_causal, dropout_p=dropout_p)


def _cp_degree(parallel_config):
    """Ranks of diffusers' context-parallel mesh (1: none)."""
    cp = getattr(parallel_config, "context_parallel_config", None)
    if cp is None:
        return 1
    return int(cp.ring_degree or 1) * int(cp.ulysses_degree or 1)


def _attend_cp(proc, q, k, v, mask, original, *, dropout_p, is_causal, scale,
               parallel_config):
    """_attend under diffusers' context parallelism (the dispatch route:
    q, k, v are this rank's [B, S/P, H, D] shards).

    diffusers' own templated Ulysses / ring / unified code
    (``_templated_context_parallel_attention``) does the all-to-alls, the
    K/V rotation and the LSE merge, and calls ``forward_op`` once (Ulysses:
    the whole sequence of this rank's heads) or once per ring step (one K/V
    chunk; the closure counts the steps, which on a rank always hold the
    same chunk).  forward_op runs qvattn through qvattn.parallel.attend:
    every method under Ulysses; under ring the dense ones, V-Smooth state
    keyed per ring step, draft refused (docs/PYTHON.md, multi-GPU).
    Cross-attention and method "sdpa" go to diffusers' own backend, which
    runs its context-parallel code itself."""
    from diffusers.models.attention_dispatch import _templated_context_parallel_attention

    nq, nk = q.shape[1], k.shape[1]
    ring = int(parallel_config.context_parallel_config.ring_degree or 1) > 1
    if proc is None:
        if nq != nk:
            return original()
        kw = dict(method=BACKEND_METHOD, fallback=True)
    else:
        h = proc.handle
        if (not proc.self_attention or nq != nk) and (
                h.cross_attention != "qvattn" or nk < h.min_cross_tokens):
            return original()
        if h.method == "sdpa":
            return original()
        if h.capture is not None:
            raise NotImplementedError("qvattn.diffusers: capture under context parallelism "
                                      "is not supported (each rank holds a shard)")
        if h.warn_unknown_steps and h.state.num_steps <= 0 and "steps" not in h.warned:
            h.warned.add("steps")
            warnings.warn("qvattn.diffusers: the number of denoising steps is unknown "
                          "(pass num_steps= to apply()); V-Smooth regroups on every "
                          "step and the draft warm-up is off", RuntimeWarning, stacklevel=4)
        kw = dict(method=h.method, layer=proc.layer_id, state=h.state,
                  prefix_at_end=proc.kind.prefix_at_end, options=h.options,
                  fallback=h.fallback)
        if proc.kind.mask == "pairwise" and isinstance(mask, torch.Tensor) \
                and mask.dim() == 4 and mask.dtype == torch.bool \
                and mask.shape[-2] == mask.shape[-1] == nk:
            mask = mask.diagonal(dim1=-2, dim2=-1).unsqueeze(-2)
    if ring and mask is not None:
        why = ("a key-padding mask under ring attention: diffusers passes the same local "
               "mask at every ring step, whose K/V chunk is another rank's")
        if kw["fallback"]:
            ops._fallback_warn(why)
            return original()
        raise _ffi.QvaUnsupportedError(_ffi.QVA_ERR_UNSUPPORTED, why, "qvattn.diffusers")
    calls = [0]

    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False, return_lse=False, _save_ctx=True,
                   _parallel_config=None):
        step = calls[0]
        calls[0] += 1
        out, lse = parallel.attend(query, key, value, layout="NHD",
                                   ring_step=step if ring else None, sm_scale=scale,
                                   attn_mask=attn_mask, is_causal=is_causal,
                                   dropout_p=dropout_p, **kw)
        if return_lse:
            return out, lse.transpose(1, 2).contiguous()  # diffusers: [B, S, H]
        return out

    return _templated_context_parallel_attention(
        q, k, v, mask, dropout_p, is_causal, scale, False, False,
        forward_op=forward_op, backward_op=_cp_backward, _parallel_config=parallel_config)


def _cp_backward(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError("qvattn has no backward (inference only)")


# ------------------------------------------------------------------ the processor
class QvattnProcessor:
    """A diffusers attention processor wrapped by apply(): calls the wrapped
    one (``.original``) with qvattn as its attention.  Its subclasses
    (``Qvattn<Original>``) carry the wrapped class's call signature, which
    diffusers inspects to pass keyword arguments on."""

    def __init__(self, original, handle, layer_id, name, kind, self_attention):
        self.original = original
        self.handle = handle
        self.layer_id = layer_id
        self.name = name
        self.kind = kind
        self.self_attention = self_attention
        self.previous = getattr(original, "_attention_backend", None)
        self._backend = _backend_member()  # route "sdpa": held here
        if kind.route == "dispatch":
            original._attention_backend = self._backend

    # diffusers' set_attention_backend/reset_attention_backend write this
    @property
    def _attention_backend(self):
        if self.kind.route == "dispatch":
            return self.original._attention_backend
        return self._backend

    @_attention_backend.setter
    def _attention_backend(self, backend):
        if self.kind.route == "dispatch":
            self.original._attention_backend = backend
        else:
            self._backend = backend
        self.handle._backend_set(backend)

    @property
    def _parallel_config(self):
        return getattr(self.original, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, config):
        self.original._parallel_config = config

    def _active(self):
        b = self._attention_backend
        if b is None:
            from diffusers.models.attention_dispatch import _AttentionBackendRegistry
            b = _AttentionBackendRegistry._active_backend
        return _is_qvattn(b)

    def _run(self, attn, args, kwargs):
        if not self._active():
            return self.original(attn, *args, **kwargs)
        outer = _current.processor
        _current.processor = self
        try:
            if self.kind.route == "sdpa":
                with _SdpaRoute(self):
                    return self.original(attn, *args, **kwargs)
            return self.original(attn, *args, **kwargs)
        finally:
            _current.processor = outer


_wrapper_classes = {}


def _wrapper_class(cls):
    """QvattnProcessor subclass for processor class cls, with its __call__
    signature (diffusers filters keyword arguments by it)."""
    sub = _wrapper_classes.get(cls)
    if sub is None:
        def __call__(self, attn, *args, **kwargs):
            return self._run(attn, args, kwargs)

        __call__.__signature__ = inspect.signature(cls.__call__)
        sub = type("Qvattn" + cls.__name__, (QvattnProcessor,),
                   {"__call__": __call__, "__module__": __name__,
                    "__doc__": f"qvattn's wrapper of diffusers' {cls.__name__}."})
        _wrapper_classes[cls] = sub
    return sub


# ------------------------------------------------------------------ helpers
def transformers_of(obj):
    """The transformer models of a pipeline (transformer, transformer_2), or
    [obj] for a model.  Raises TypeError for anything else."""
    if isinstance(obj, torch.nn.Module):
        return [obj]
    found = []
    for name in ("transformer", "transformer_2"):
        m = getattr(obj, name, None)
        if isinstance(m, torch.nn.Module):
            found.append(m)
    if not found:
        raise TypeError(f"qvattn.diffusers: {type(obj).__name__} is neither a model "
                        "nor a pipeline with a .transformer")
    return found


def _set_processor(module, proc):
    if hasattr(module, "set_processor"):
        module.set_processor(proc)
    else:  # MochiAttention has no set_processor
        module.processor = proc


def _timestep_value(t):
    if isinstance(t, torch.Tensor):
        # the highest value: Wan2.2 TI2V passes per-token timesteps with the
        # conditioning frame at 0
        return float(t.detach().max())
    return float(t)


def _patch(cfg):
    """(p_t, p_h, p_w) of a model config."""
    p = getattr(cfg, "patch_size", None)
    if p is None:
        return None
    if isinstance(p, int):
        pt = int(getattr(cfg, "patch_size_t", 1) or 1)
        return (pt, p, p)
    return tuple(int(x) for x in p)


def _latent_grid(frame_axis):
    """Grid of a 5-D latent with frames on frame_axis: 2 for [B, C, F, H, W]
    (Wan, SkyReels, HunyuanVideo(-1.5), Mochi), 1 for [B, F, C, H, W]
    (CogVideoX)."""
    def grid(model, arg):
        hs, p = arg("hidden_states"), _patch(model.config)
        if not isinstance(hs, torch.Tensor) or hs.dim() != 5 or p is None:
            return None
        f, h, w = hs.shape[frame_axis], hs.shape[3], hs.shape[4]
        return (int(f) // p[0], int(h) // p[1], int(w) // p[2])
    return grid


_grid_cfhw, _grid_fchw = _latent_grid(2), _latent_grid(1)


def _grid_packed(model, arg):
    """Packed tokens with num_frames/height/width arguments (LTX-Video: the
    token grid, patch size 1)."""
    dims = [arg(n) for n in ("num_frames", "height", "width")]
    if any(d is None for d in dims):
        return None
    return tuple(int(d) for d in dims)


# model class name -> its latent grid.  A model not named here (a copy of a
# supported processor in another model) gets no grid: draft then raises.
_GRIDS = {
    "WanTransformer3DModel": _grid_cfhw,
    "WanVACETransformer3DModel": _grid_cfhw,
    "SkyReelsV2Transformer3DModel": _grid_cfhw,
    "HunyuanVideoTransformer3DModel": _grid_cfhw,
    "HunyuanVideo15Transformer3DModel": _grid_cfhw,
    "MochiTransformer3DModel": _grid_cfhw,
    "CogVideoXTransformer3DModel": _grid_fchw,
    "ConsisIDTransformer3DModel": _grid_fchw,
    "LTXVideoTransformer3DModel": _grid_packed,
}


def _no_grid(model, arg):
    return None


def _arg_reader(model):
    """(args, kwargs) -> callable name -> the forward argument (or None)."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        names = ["hidden_states", "timestep"]
    index = {n: i for i, n in enumerate(names)}

    def reader(args, kwargs):
        def arg(name):
            if name in kwargs:
                return kwargs[name]
            i = index.get(name)
            return args[i] if i is not None and i < len(args) else None
        return arg
    return reader


# ------------------------------------------------------------------ capture spec
class _CaptureSpec:
    def __init__(self, layers, steps, path, heads, writer):
        self.layers = None if layers is None else {int(x) for x in layers}
        self.steps = None if steps is None else {int(x) for x in steps}
        self.path = path
        self.heads = heads
        self.writer = writer
        self.files = []

    def wants(self, layer, step):
        return ((self.layers is None or layer in self.layers)
                and (self.steps is None or step in self.steps))


# ------------------------------------------------------------------ the handle
class QvattnHandle:
    """What apply() installed: processors, hooks, the StepState.  Returned by
    apply(); remove() undoes it."""

    def __init__(self, method, fallback, options, cross_attention, min_cross_tokens,
                 num_steps, pipe):
        self.method = method
        self.fallback = fallback
        self.options = options
        self.cross_attention = cross_attention
        self.min_cross_tokens = int(min_cross_tokens)
        self.state = ops.StepState(num_steps)
        self.pipe = pipe
        self.models = []
        self.patched = []      # (module, original processor, QvattnProcessor)
        self.hooks = []
        self.readers = {}      # id(model) -> forward argument reader
        self._names = []       # qualified names of self.patched
        self.active_before = None  # diffusers' active backend at apply()
        self.layer_ids = {}    # qualified module name -> layer id
        self.capture = None
        self.warned = set()
        self.warn_unknown_steps = False

    @property
    def step(self):
        return self.state.step

    @property
    def num_steps(self):
        return self.state.num_steps

    def _backend_set(self, backend):
        """A wrapped processor's backend was set (set_attention_backend...)."""
        what = f"diffusers' {str(getattr(backend, 'value', backend))!r} backend"
        if backend is None:  # reset: the processor follows the active backend
            from diffusers.models.attention_dispatch import _AttentionBackendRegistry
            backend = _AttentionBackendRegistry._active_backend
            what = (f"diffusers' active backend "
                    f"{str(getattr(backend, 'value', backend))!r} (reset_attention_backend)")
        if _is_qvattn(backend):
            self.warned.discard("backend")
            return
        if "backend" in self.warned:
            return
        self.warned.add("backend")
        warnings.warn(
            f"qvattn.diffusers: an attention backend was set after qvattn.diffusers."
            f"apply(): the {len(self.patched)} attention modules apply() patched now run "
            f"{what}, not qvattn ({self.method}). model.set_attention_backend("
            f"'{BACKEND}') runs qvattn again with apply()'s settings; "
            "qvattn.diffusers.remove(pipe) drops it", QvattnBackendWarning, stacklevel=4)

    def _check_processors(self):
        """Warns once if a patched module's processor was replaced."""
        lost = [name for name, (module, _, new) in
                zip(self._names, self.patched) if module.processor is not new]
        if lost and "replaced" not in self.warned:
            self.warned.add("replaced")
            warnings.warn(
                f"qvattn.diffusers: the processor of {len(lost)} attention module(s) "
                f"patched by qvattn.diffusers.apply() was replaced ({lost[0]}"
                f"{', ...' if len(lost) > 1 else ''}): those modules no longer run qvattn; "
                "call apply() again after changing processors", QvattnBackendWarning,
                stacklevel=4)

    def _pre_forward(self, model, args, kwargs):
        arg = self.readers[id(model)](args, kwargs)
        self._check_processors()
        st = self.state
        grid = _GRIDS.get(type(model).__name__, _no_grid)
        st.grid = grid(model, arg)
        t = arg("timestep")
        if t is None or st.pinned is not None:
            # a pinned step reads no timestep: no host sync, so a pinned
            # forward can be captured in a CUDA graph
            st.observe(None)
            return None
        tv = _timestep_value(t)
        new_run = st.pinned is None and (st._pending_new_run or st.last_t is None
                                         or tv > st.last_t)
        if new_run and not st.fixed_num_steps and self.pipe is not None:
            ts = getattr(getattr(self.pipe, "scheduler", None), "timesteps", None)
            if ts is not None and len(ts) > 0:
                st.num_steps = len(ts)
        st.observe(tv)
        return None

    def remove(self):
        for module, orig, new in self.patched:
            if module.processor is new:  # not replaced since: restore
                _set_processor(module, orig)
            if new.kind.route == "dispatch" and _is_qvattn(
                    getattr(orig, "_attention_backend", None)):
                orig._attention_backend = new.previous
        self.patched.clear()
        self._names = []
        # set_attention_backend("qvattn") made qvattn diffusers' active backend
        # (process-wide): processors whose backend is unset would keep
        # running it; back to the one active at apply()
        from diffusers.models import attention_dispatch as ad
        if _is_qvattn(ad._AttentionBackendRegistry._active_backend):
            ad._AttentionBackendRegistry.set_active_backend(
                _diffusers_backend(self.active_before))
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        for m in self.models:
            if getattr(m, _HANDLE_ATTR, None) is self:
                delattr(m, _HANDLE_ATTR)
        self.models.clear()
        self.state.close()


def _apply_options(method, options, draft_warmup):
    """apply's config overrides: options, with draft_warmup turned into
    draft.dense_warmup_steps (an int) or draft.dense_warmup_frac (a float
    < 1) for a draft method that does not set the steps itself.  Raises
    ValueError on a bad method string or a negative warm-up."""
    opts = dict(options or {})
    if method == "sdpa":
        return opts
    _config._base_config(method, "")  # ValueError on a bad method string now
    if method.startswith("draft") and "draft.dense_warmup_steps" not in opts:
        if isinstance(draft_warmup, float) and 0 <= draft_warmup < 1:
            opts["draft.dense_warmup_frac"] = draft_warmup
        elif draft_warmup is not None:
            if int(draft_warmup) < 0:
                raise ValueError("qvattn.diffusers.apply: draft_warmup must be >= 0")
            opts["draft.dense_warmup_steps"] = int(draft_warmup)
    return opts


def _attention_modules(models):
    """The supported attention modules of the models, as (name, module,
    processor, kind, is_self) in the order layer ids are given: every
    self-attention module first, over all transformers (transformer_2's
    after transformer's), then the cross-attention ones."""
    selfs, crosses = [], []
    for mi, m in enumerate(models):
        prefix = "" if len(models) == 1 else ("transformer." if mi == 0 else "transformer_2.")
        for name, module in m.named_modules():
            proc = getattr(module, "processor", None)
            kind = _SUPPORTED.get(type(proc).__name__)
            if kind is None:
                continue
            is_self = bool(kind.self_attention(name, module))
            (selfs if is_self else crosses).append((prefix + name, module, proc, kind,
                                                    is_self))
    return selfs, crosses


def apply(pipe, method=_ffi.DEFAULT_METHOD, *, num_steps=None, layers=None,
          cross_attention="sdpa", min_cross_tokens=4096, fallback=False,
          options=None, draft_warmup=_DRAFT_WARMUP_DEFAULT):
    """Put qvattn on the attention of a pipeline's transformer(s).

    pipe        a diffusers pipeline (its .transformer and .transformer_2) or
                a transformer model (supported_processors() lists the
                attention processors it patches: Wan2.1/2.2, SkyReels-V2,
                HunyuanVideo, HunyuanVideo-1.5, LTX-Video, CogVideoX, Mochi).
    method      a qvattn method string, or "sdpa" (diffusers' own attention,
                same plumbing).
    num_steps   denoising steps per run; None = len(pipe.scheduler.timesteps)
                at the start of each run (unknown for a bare model).
    layers      None (all) or a collection of layer ids to patch; the others
                keep their original processors.  Self-attention modules are
                numbered 0.. in module order (transformer_2 continues after
                transformer), cross-attention modules after them.
    cross_attention
                "sdpa" (default: diffusers' own attention) or "qvattn" (the
                method, when the keys number >= min_cross_tokens).
    fallback    True: unsupported calls warn once and use torch SDPA.
    options     config overrides (see qvattn.ops.options_string).
    draft_warmup
                draft only: dense steps at the start of a run, an int, or a
                float < 1 as a fraction of num_steps (ceil).  Ignored when
                options sets draft.dense_warmup_steps.
    Returns a QvattnHandle.  Re-applying first removes the previous install.
    Raises TypeError/ValueError for a bad argument or a model without any
    supported attention module.
    """
    if not isinstance(method, str):
        raise TypeError("qvattn.diffusers.apply: method must be a string")
    if cross_attention not in ("sdpa", "qvattn"):
        raise ValueError("qvattn.diffusers.apply: cross_attention must be 'sdpa' or 'qvattn'")
    if num_steps is not None and int(num_steps) <= 0:
        raise ValueError("qvattn.diffusers.apply: num_steps must be positive")
    models = transformers_of(pipe)
    opts_s = ops.options_string(_apply_options(method, options, draft_warmup))
    for m in models:
        old = getattr(m, _HANDLE_ATTR, None)
        if old is not None:
            old.remove()
    selfs, crosses = _attention_modules(models)
    if not selfs and not crosses:
        raise ValueError("qvattn.diffusers.apply: no supported attention module found "
                         "(supported processors: " + ", ".join(supported_processors()) + ")")
    handle = QvattnHandle(method, bool(fallback), opts_s, cross_attention,
                          min_cross_tokens, num_steps,
                          None if isinstance(pipe, torch.nn.Module) else pipe)
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    handle.active_before = _AttentionBackendRegistry._active_backend
    wanted = None if layers is None else {int(x) for x in layers}
    for lid, (name, module, proc, kind, is_self) in enumerate(selfs + crosses):
        handle.layer_ids[name] = lid
        if wanted is not None and lid not in wanted:
            continue
        new = _wrapper_class(type(proc))(proc, handle, lid, name, kind, is_self)
        _set_processor(module, new)
        handle.patched.append((module, proc, new))
        handle._names.append(name)
    for m in models:
        handle.readers[id(m)] = _arg_reader(m)
        handle.hooks.append(m.register_forward_pre_hook(handle._pre_forward,
                                                        with_kwargs=True))
        setattr(m, _HANDLE_ATTR, handle)
        handle.models.append(m)
    handle.warn_unknown_steps = (method.startswith("vc") or method.startswith("draft")) \
        and num_steps is None and handle.pipe is None
    return handle


def _handle(pipe):
    for m in transformers_of(pipe):
        h = getattr(m, _HANDLE_ATTR, None)
        if h is not None:
            return h
    return None


def state(pipe):
    """The QvattnHandle installed on pipe (or None)."""
    return _handle(pipe)


def remove(pipe):
    """Restore the original processors (those not replaced since) and drop
    the hooks.  Returns True if something was installed."""
    h = _handle(pipe)
    if h is None:
        return False
    h.remove()
    return True


def set_step(pipe, step, num_steps=None):
    """Pin the denoising step (None: count from the timesteps again)."""
    h = _handle(pipe)
    if h is None:
        raise ValueError("qvattn.diffusers.set_step: apply() was not called on this pipeline")
    if step is not None and num_steps is not None and not 0 <= int(step) < int(num_steps):
        raise ValueError(f"qvattn.diffusers.set_step: step {step} outside {num_steps} steps")
    h.state.pin(step, num_steps)


def layer_ids(pipe):
    """{qualified module name: layer id} of the installed processors."""
    h = _handle(pipe)
    return dict(h.layer_ids) if h is not None else {}


def schedule_cost(times, num_steps, method, draft_warmup_steps=0):
    """Total time of a num_steps run from per-step times {action: seconds}.

    vc*: actions 'group', 'reuse', 'plain' (the V-Smooth schedule);
    draft: 'dense' (warm-up) and 'sparse'; others: 'step'.  Which step does
    what is the library's decision (qva_schedule_action, the draft plan)."""
    if method.startswith("vc"):
        cfg = _ffi.make_config(method)
        return sum(times[_ffi.schedule_action(cfg, s, num_steps)] for s in range(num_steps))
    if method.startswith("draft"):
        w = sum(_config.draft_warmup_schedule(method, draft_warmup_steps, num_steps))
        return w * times["dense"] + (num_steps - w) * times["sparse"]
    return num_steps * times["step"]


def draft_warmup_steps(num_steps, draft_warmup=_DRAFT_WARMUP_DEFAULT):
    """Dense warm-up steps apply() gives draft for a num_steps run."""
    if isinstance(draft_warmup, float) and draft_warmup < 1:
        return _config.dense_warmup_steps(draft_warmup, num_steps)
    return int(draft_warmup)


try:  # "qvattn" is a diffusers backend as soon as this module is imported
    _backend_member()
except ImportError:  # pragma: no cover - diffusers missing: apply() says so
    pass
