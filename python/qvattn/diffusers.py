"""qvattn in diffusers pipelines: Wan2.1/2.2 (incl. transformer_2) and HunyuanVideo.

    import qvattn.diffusers
    qvattn.diffusers.apply(pipe, method="vc8+expcast")
    video = pipe(prompt, num_inference_steps=40).frames[0]
    qvattn.diffusers.remove(pipe)          # the original processors again

apply() replaces the attention processors of the pipeline's transformer(s)
with qvattn processors, gives every patched attention module its own layer
id, and hooks each transformer's forward to track the denoising step:

* Steps are counted from the ``timestep`` argument of the transformer's
  forward: a new value is a new step, the same value again (classifier-free
  guidance runs the transformer two or three times per step; Wan2.2's
  high/low-noise transformers share one counter) is the same step, and a
  value *higher* than the previous one (more noise) starts a new run at
  step 0 (and drops the V-Smooth/draft state so every run starts alike).
  Reading the timestep is one host synchronization per forward when the
  timestep lives on the GPU.
* The step count of a run (the V-Smooth schedule groups on steps <
  ceil(n/4) and refreshes every 4; the draft warm-up is a fraction of it)
  is ``num_steps=`` if given, else ``len(pipe.scheduler.timesteps)`` read
  at the first forward of each run, else unknown (V-Smooth then regroups on
  every call: correct, slower; a warning says so).
* ``set_step(pipe, i, n)`` pins the step (benchmarks); ``set_step(pipe,
  None)`` returns to counting.

Routing inside the processors:

* Self-attention (Wan ``attn1``; HunyuanVideo's joint video+text attention)
  runs ``method`` through the qvattn::attention op, in NHD layout without
  copies, with the latent grid from the forward's input shape (draft).
* Cross-attention (Wan ``attn2``: 512 text keys, plus 257 image keys in
  I2V) is delegated to the module's original processor, i.e. diffusers'
  SDPA path, unless ``cross_attention="qvattn"`` and the keys number at
  least ``min_cross_tokens``.
* HunyuanVideo's boolean key-padding mask [B,1,1,N] (padded text tokens)
  is honoured: attention runs over the valid tokens only (ops.py).
* Anything qvattn cannot run raises a clear error, or with
  ``fallback=True`` warns once per reason and uses torch SDPA.

Method ``"sdpa"`` installs the same processors but computes attention with
torch SDPA (a baseline with identical plumbing; capture uses it).
"""
import warnings

import torch
import torch.nn.functional as F

from . import _config, _ffi, ops

__all__ = ["apply", "remove", "set_step", "layer_ids", "state", "transformers_of",
           "QvattnWanAttnProcessor", "QvattnHunyuanVideoAttnProcessor"]

_HANDLE_ATTR = "_qvattn_handle"
_DRAFT_WARMUP_DEFAULT = 0.25


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


def _rope_table(x):
    """A (cos or sin) table as [S, D] for diffusers' apply_rotary_emb."""
    if x.dim() == 4 and x.shape[0] == 1 and x.shape[2] == 1:  # Wan: [1, S, 1, D]
        return x[0, :, 0, :]
    if x.dim() == 2:
        return x
    raise ValueError(f"qvattn.diffusers: unexpected rotary table of shape "
                     f"{tuple(x.shape)} (this diffusers version is not supported)")


def _apply_rope(x, rope):
    """Rotary embedding on x [B, S, H, D] (NHD), interleaved real pairs."""
    from diffusers.models.embeddings import apply_rotary_emb
    if not (isinstance(rope, (tuple, list)) and len(rope) == 2):
        raise ValueError("qvattn.diffusers: expected rotary embeddings as (cos, sin)")
    cos, sin = (_rope_table(t) for t in rope)
    return apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1,
                            sequence_dim=1)


def _timestep_value(t):
    if isinstance(t, torch.Tensor):
        # the highest value: Wan2.2 TI2V passes per-token timesteps with the
        # conditioning frame at 0
        return float(t.detach().max())
    return float(t)


def _patch_grid(model, hidden_states):
    """(T, H, W) token grid of a [B, C, F, H, W] latent under the model's
    patch size."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 5:
        return None
    cfg = getattr(model, "config", None)
    p = getattr(cfg, "patch_size", None)
    if p is None:
        return None
    if isinstance(p, int):
        pt = int(getattr(cfg, "patch_size_t", 1) or 1)
        p = (pt, p, p)
    _, _, f, h, w = hidden_states.shape
    return (int(f) // int(p[0]), int(h) // int(p[1]), int(w) // int(p[2]))


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


# ------------------------------------------------------------------ processors
class _QvattnProcessorBase:
    """Shared routing: qvattn method, SDPA baseline, capture, fallback."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, original, handle, layer_id, name):
        self.original = original
        self.handle = handle
        self.layer_id = layer_id
        self.name = name

    def _attend(self, q, k, v, mask, prefix_at_end):
        """q, k, v: [B, N, H, D] (NHD).  Returns [B, Nq, H, D]."""
        h = self.handle
        st = h.state
        cap = h.capture
        if cap is not None and cap.wants(self.layer_id, st.step):
            cap.writer(self, q, k, v, mask, prefix_at_end)
        if h.method == "sdpa":
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), attn_mask=mask)
            return o.transpose(1, 2)
        if h.warn_unknown_steps and st.num_steps <= 0 and "steps" not in h.warned:
            h.warned.add("steps")
            warnings.warn("qvattn.diffusers: the number of denoising steps is unknown "
                          "(pass num_steps= to apply()); V-Smooth regroups on every "
                          "step and the draft warm-up is off", RuntimeWarning,
                          stacklevel=3)
        return ops.attention_torch(
            q, k, v, method=h.method, layout="NHD", attn_mask=mask,
            layer=self.layer_id, step=None, num_steps=None, grid=None, prefix=None,
            prefix_at_end=prefix_at_end, fallback=h.fallback, options=h.options,
            state=st)

    def _cross_to_original(self, n_keys):
        h = self.handle
        return h.cross_attention != "qvattn" or n_keys < h.min_cross_tokens


class QvattnWanAttnProcessor(_QvattnProcessorBase):
    """For diffusers' WanAttention (Wan2.1 / Wan2.2, T2V, I2V, TI2V)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                 attention_mask=None, rotary_emb=None, **kwargs):
        if encoder_hidden_states is not None:
            if attn.add_k_proj is not None or self._cross_to_original(
                    encoder_hidden_states.shape[1]):
                return self.original(attn, hidden_states, encoder_hidden_states,
                                     attention_mask, rotary_emb, **kwargs)
        src = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        if getattr(attn, "fused_projections", False):
            if encoder_hidden_states is None:
                query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
            else:
                query = attn.to_q(hidden_states)
                key, value = attn.to_kv(src).chunk(2, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(src), attn.to_v(src)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        if rotary_emb is not None:
            query = _apply_rope(query, rotary_emb)
            key = _apply_rope(key, rotary_emb)
        out = self._attend(query, key, value, attention_mask, prefix_at_end=False)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


class QvattnHunyuanVideoAttnProcessor(_QvattnProcessorBase):
    """For HunyuanVideo's joint attention (dual- and single-stream blocks).

    The sequence is [video tokens, text tokens]; the text tokens are the
    draft prefix (at the end) and the padded ones are masked out by the
    model's boolean [B,1,1,N] mask."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                 attention_mask=None, image_rotary_emb=None):
        single = attn.add_q_proj is None
        n_txt = encoder_hidden_states.shape[1] if encoder_hidden_states is not None else 0
        x = hidden_states
        if single and n_txt:
            x = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query = attn.to_q(x).unflatten(2, (attn.heads, -1))
        key = attn.to_k(x).unflatten(2, (attn.heads, -1))
        value = attn.to_v(x).unflatten(2, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            if single and n_txt:
                nv = query.shape[1] - n_txt
                query = torch.cat([_apply_rope(query[:, :nv], image_rotary_emb),
                                   query[:, nv:]], dim=1)
                key = torch.cat([_apply_rope(key[:, :nv], image_rotary_emb),
                                 key[:, nv:]], dim=1)
            else:
                query = _apply_rope(query, image_rotary_emb)
                key = _apply_rope(key, image_rotary_emb)
        if not single and n_txt:
            eq = attn.add_q_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            ek = attn.add_k_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            ev = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            query = torch.cat([query, eq], dim=1)
            key = torch.cat([key, ek], dim=1)
            value = torch.cat([value, ev], dim=1)
        out = self._attend(query, key, value, attention_mask, prefix_at_end=True)
        out = out.flatten(2, 3).to(query.dtype)
        if n_txt:
            vid, txt = out[:, :-n_txt], out[:, -n_txt:]
            if getattr(attn, "to_out", None) is not None:
                vid = attn.to_out[1](attn.to_out[0](vid))
            if getattr(attn, "to_add_out", None) is not None:
                txt = attn.to_add_out(txt)
            return vid, txt
        return out, encoder_hidden_states


# original processor class name -> (qvattn processor, self-attention test)
_PROCESSORS = {
    "WanAttnProcessor": (QvattnWanAttnProcessor,
                         lambda m: not getattr(m, "is_cross_attention", False)),
    "WanAttnProcessor2_0": (QvattnWanAttnProcessor,
                            lambda m: not getattr(m, "is_cross_attention", False)),
    "HunyuanVideoAttnProcessor2_0": (QvattnHunyuanVideoAttnProcessor, lambda m: True),
}


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
        self.patched = []      # (module, original processor, qvattn processor)
        self.hooks = []
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

    def _pre_forward(self, model, args, kwargs):
        t = kwargs.get("timestep", args[1] if len(args) > 1 else None)
        hs = kwargs.get("hidden_states", args[0] if args else None)
        st = self.state
        st.grid = _patch_grid(model, hs)
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
        for module, orig, _ in self.patched:
            module.set_processor(orig)
        self.patched.clear()
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        for m in self.models:
            if getattr(m, _HANDLE_ATTR, None) is self:
                delattr(m, _HANDLE_ATTR)
        self.models.clear()
        self.state.close()


def apply(pipe, method="vc8+expcast", *, num_steps=None, layers=None,
          cross_attention="sdpa", min_cross_tokens=4096, fallback=False,
          options=None, draft_warmup=_DRAFT_WARMUP_DEFAULT):
    """Install qvattn attention processors and step hooks.

    pipe        a diffusers pipeline (its .transformer and .transformer_2) or
                a transformer model (WanTransformer3DModel,
                HunyuanVideoTransformer3DModel).
    method      a qvattn method string, or "sdpa" (torch SDPA, same plumbing).
    num_steps   denoising steps per run; None = len(pipe.scheduler.timesteps)
                at the start of each run (unknown for a bare model).
    layers      None (all) or a collection of layer ids to patch; the others
                keep their original processors.  Self-attention modules are
                numbered 0.. in module order (transformer_2 continues after
                transformer), cross-attention modules after them.
    cross_attention
                "sdpa" (default: the original processor) or "qvattn" (the
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
    opts = dict(options or {})
    if method != "sdpa":
        _config._base_config(method, "")  # ValueError on a bad method string now
        if method.startswith("draft") and "draft.dense_warmup_steps" not in opts:
            if isinstance(draft_warmup, float) and 0 <= draft_warmup < 1:
                opts["draft.dense_warmup_frac"] = draft_warmup
            elif draft_warmup is not None:
                if int(draft_warmup) < 0:
                    raise ValueError("qvattn.diffusers.apply: draft_warmup must be >= 0")
                opts["draft.dense_warmup_steps"] = int(draft_warmup)
    opts_s = ops.options_string(opts)
    for m in models:
        old = getattr(m, _HANDLE_ATTR, None)
        if old is not None:
            old.remove()
    handle = QvattnHandle(method, bool(fallback), opts_s, cross_attention,
                          min_cross_tokens, num_steps,
                          None if isinstance(pipe, torch.nn.Module) else pipe)
    # number the modules: self-attention first, over all transformers
    selfs, crosses = [], []
    for mi, m in enumerate(models):
        prefix = "" if len(models) == 1 else ("transformer." if mi == 0 else "transformer_2.")
        for name, module in m.named_modules():
            proc = getattr(module, "processor", None)
            if proc is None or not hasattr(module, "set_processor"):
                continue
            entry = _PROCESSORS.get(type(proc).__name__)
            if entry is None:
                continue
            if getattr(proc, "_parallel_config", None) is not None:
                raise ValueError("qvattn.diffusers.apply: context parallelism "
                                 f"({prefix}{name}) is not supported")
            cls, is_self = entry
            (selfs if is_self(module) else crosses).append((prefix + name, module, proc, cls))
    if not selfs and not crosses:
        raise ValueError("qvattn.diffusers.apply: no supported attention module found "
                         "(supported: Wan2.x and HunyuanVideo transformers)")
    wanted = None if layers is None else {int(x) for x in layers}
    for lid, (name, module, proc, cls) in enumerate(selfs + crosses):
        handle.layer_ids[name] = lid
        if wanted is not None and lid not in wanted:
            continue
        new = cls(proc, handle, lid, name)
        module.set_processor(new)
        handle.patched.append((module, proc, new))
    for m in models:
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
    """Restore the original processors and drop the hooks.  Returns True if
    something was installed."""
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
