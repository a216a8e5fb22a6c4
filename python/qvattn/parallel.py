"""qvattn inside the sequence-parallel engines: yunchang, xDiT, diffusers.

The engines own the communication -- Ulysses' all-to-alls, the ring's K/V
rotation and its merge of partial results -- and call one attention
function per rank.  qvattn is that function; this module holds what the
engines need from it, and the adapters to their hooks:

* ``attend(q, k, v, ..., ring_step=None)`` -- one rank's call: returns
  ``(out, lse)``, lse float32 ``[B, H, Nq]``, the natural-log sum-exp of the
  scaled scores over the keys the method retained (qvattn.attention's
  ``return_lse``: for the K-smoothed methods sage8, vc8, sage4, vc4 the
  smoothing shift ``sm_scale * q . mean(k)`` is added back, so the LSE of a
  chunk is that of its original scores and the engines' LSE merges are
  exact).
* ``YunchangAttention`` -- yunchang's attention-processor protocol
  (``LongContextAttention(attn_processor=...)``, ``UlyssesAttention.attn_fn``):
  q, k, v ``[B, S, H, D]`` -> ``(out [B, S, H, D], lse [B, H, S])``.
* ``XditAttention`` / ``register_xdit`` -- xDiT's attention-function
  registry (``xfuser.core.distributed.attention_backend``): ``fn(q, k, v,
  dropout_p, is_causal, attention_kwargs)`` on ``[B, H, S, D]`` ->
  ``(out, lse)``, which xDiT's ``USP`` runs under Ulysses, under ring
  (torch's templated ring attention merges the LSEs) and both.
* diffusers' context parallelism goes through qvattn's diffusers backend
  (``qvattn.diffusers``), which calls ``attend`` from diffusers' own
  templated Ulysses / ring code.

**Methods per mode.**  Under Ulysses a rank sees the whole sequence of its
heads: every method runs unchanged (V-Smooth and draft state are per rank,
in the rank's own process and context, and per head).  Under ring a rank
sees its query chunk against one K/V chunk per ring step:

* exact, bf16, fp8, sage8, sage4: per-chunk attention; the K-smoothed
  methods smooth with the chunk's key mean and add the shift back to the
  LSE, so the merge is exact;
* vc8, vc4: V-Smooth groups the value tokens of the chunk.  Its state
  (permutation, centroids) belongs to that chunk, so a stateful call keys
  it per ring step: ``ring_layer_key(layer, i)`` = ``layer | i << 10``
  (layer ids below 1024, ring steps below 64).  On a rank, ring step ``i``
  always holds the same K/V chunk (the ring order is fixed), so the schedule
  reuses what it grouped for that chunk.  A call without a layer stays
  stateless (groups afresh).
* draft is refused (``QvaUnsupportedError``; with ``fallback=True`` a
  warning and torch's exact attention with its LSE): its plan ranks every
  pair of query and key regions of the latent grid on one map and spends a
  global quota on it (docs/DRAFT.md); a ring step sees one K/V chunk, so
  neither the map nor the quotas exist there.  Run draft under Ulysses.

Imports: this module uses the op layer (ops, _config, _ffi) and imports
the engines lazily, inside the functions that need them.
"""
import math
import weakref

import torch

from . import _config, _ffi, ops

__all__ = ["attend", "merge_partials", "ring_layer_key", "RING_LAYER_BITS",
           "RING_MAX_STEPS", "YunchangAttention", "yunchang_long_context",
           "yunchang_ulysses", "XditAttention", "register_xdit", "XDIT_BACKEND",
           "is_ring_capable", "all_to_all_bytes", "ring_bytes", "link_seconds"]

RING_LAYER_BITS = 10
"""Layer ids below 2**RING_LAYER_BITS can be keyed per ring step."""
RING_MAX_STEPS = 1 << (16 - RING_LAYER_BITS)
"""Ring steps (ring degree) a per-step key can hold: 64.  The key stays in
the low 16 bits of cfg.layer; ops adds the CFG pass (bits 16-23) and the
mask group (bits 24-30) above it."""


def ring_layer_key(layer, ring_step):
    """The per-layer state key of ring step `ring_step` of layer `layer`:
    ``layer | ring_step << RING_LAYER_BITS``.  ValueError outside the
    ranges."""
    layer, ring_step = int(layer), int(ring_step)
    if not 0 <= layer < (1 << RING_LAYER_BITS):
        raise ValueError(f"qvattn.parallel: layer {layer} cannot be keyed per ring step "
                         f"(layer ids 0..{(1 << RING_LAYER_BITS) - 1})")
    if not 0 <= ring_step < RING_MAX_STEPS:
        raise ValueError(f"qvattn.parallel: ring step {ring_step} outside 0.."
                         f"{RING_MAX_STEPS - 1} (ring degree at most {RING_MAX_STEPS})")
    return layer | (ring_step << RING_LAYER_BITS)


_DRAFT_RING = ("draft under ring attention is not supported: a ring step sees one K/V "
               "chunk, and the draft plan ranks every pair of query and key regions of "
               "the latent grid on one map with a quota over all of them "
               "(docs/DRAFT.md); run draft under Ulysses, or a dense method (exact, "
               "bf16, fp8, sage8, vc8, sage4, vc4) under ring")


def _method_id(method):
    return int(_config._base_config(method, "").method)  # ValueError on a bad name


def is_ring_capable(method):
    """(ok, reason): can `method` run on one K/V chunk per ring step?"""
    if _method_id(method) == _ffi.QVA_METHOD_DRAFT:
        return False, _DRAFT_RING
    return True, ""


def attend(q, k, v, *, method="sage8", layout="HND", ring_step=None, sm_scale=None,
           attn_mask=None, layer=None, step=None, num_steps=None, state=None, grid=None,
           prefix=None, prefix_at_end=False, ctx=None, options=None, fallback=False,
           is_causal=False, dropout_p=0.0):
    """One rank's attention inside a sequence-parallel engine: ``(out, lse)``.

    q, k, v   torch tensors in `layout` ("HND" [B,H,N,D] or "NHD" [B,N,H,D]).
    ring_step None: the whole sequence of these heads (Ulysses, or no
              parallelism); i >= 0: ring step i, k and v are one chunk.
    layer, step, num_steps, state
              as qvattn.attention (state: a qvattn.ops.StepState); under
              ring a stateful call keys its state per ring step
              (ring_layer_key).  No layer and no state: stateless.
    Returns out (q's layout, dtype) and lse float32 [B, H, Nq].  Raises
    QvaUnsupportedError for draft under ring (fallback=True: a warning and
    torch's exact attention with its LSE) and whatever qvattn.attention
    raises.
    """
    if ring_step is not None:
        ok, why = is_ring_capable(method)
        if not ok:
            if not fallback:
                raise _ffi.QvaUnsupportedError(_ffi.QVA_ERR_UNSUPPORTED, why,
                                               "qvattn.parallel")
            ops._fallback_warn(why)
            return ops.sdpa_reference(q, k, v, layout, sm_scale, True, attn_mask=attn_mask,
                                      is_causal=is_causal, dropout_p=dropout_p)
        if layer is not None or state is not None:
            layer = ring_layer_key(0 if layer is None else layer, ring_step)
        grid = prefix = None  # only draft reads them
    return ops.attention_torch(
        q, k, v, method=method, layout=layout, sm_scale=sm_scale, attn_mask=attn_mask,
        return_lse=True, layer=layer, step=step, num_steps=num_steps, grid=grid,
        prefix=prefix, prefix_at_end=prefix_at_end, ctx=ctx, fallback=fallback,
        is_causal=is_causal, dropout_p=dropout_p, options=options, state=state)


def merge_partials(outs, lses, layout="HND"):
    """The exact merge of per-chunk results, in FP64: softmax attention over
    the union of the chunks' keys from each chunk's (out, lse).

    outs      per-chunk outputs in `layout`; lses: float [B, H, Nq] each.
    Returns (out float64 in `layout`, lse float64 [B, H, Nq]).  Rows that no
    chunk retained (lse -inf everywhere) come out as zeros with lse -inf.
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError("qvattn.parallel.merge_partials: one lse per output, at least one")
    ls = torch.stack([x.double() for x in lses])            # [C, B, H, N]
    m = ls.amax(0)
    finite = torch.isfinite(m)
    m0 = torch.where(finite, m, torch.zeros_like(m))
    w = torch.exp(ls - m0)                                   # exp(-inf) = 0
    tot = w.sum(0)
    lse = torch.where(finite, m0 + torch.log(tot), m)
    w = w / torch.where(tot > 0, tot, torch.ones_like(tot))
    if layout.upper() == "NHD":
        w = w.transpose(2, 3)                                # [C, B, N, H]
    out = sum(wi.unsqueeze(-1) * o.double() for wi, o in zip(w, outs))
    return out, lse


# ------------------------------------------------------------------ ring steps
class _RingSteps:
    """Which ring step a call is.  The engines' ring loops call the
    attention function once per K/V chunk with the same query tensor
    object; a different query object starts a new pass.  Counted modulo the
    ring degree, so a caller that reuses one query tensor for two passes
    still gets 0..P-1 twice."""

    def __init__(self):
        self._q = None
        self._i = 0

    def next(self, q, size):
        if self._q is not None and self._q() is q:
            self._i = (self._i + 1) % size
        else:
            self._q = weakref.ref(q)
            self._i = 0
        return self._i


def _group_size(group):
    import torch.distributed as dist
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


class _Adapter:
    """What the engine adapters share: the method and the state."""

    def __init__(self, method, *, layer=None, state=None, step=None, num_steps=None,
                 grid=None, prefix=None, prefix_at_end=False, ctx=None, options=None,
                 fallback=False):
        _method_id(method)  # ValueError now for a bad method string
        self.method = method
        self.layer = layer
        self.state = state
        self.step = step
        self.num_steps = num_steps
        self.grid = grid
        self.prefix = prefix
        self.prefix_at_end = prefix_at_end
        self.ctx = ctx
        self.options = options
        self.fallback = fallback
        self._ring = _RingSteps()
        self.calls = 0

    def _attend(self, q, k, v, layout, ring_size, sm_scale, attn_mask=None,
                is_causal=False, dropout_p=0.0, **over):
        self.calls += 1
        ring_step = self._ring.next(q, ring_size) if ring_size > 1 else None
        kw = dict(method=self.method, layer=self.layer, step=self.step,
                  num_steps=self.num_steps, state=self.state, grid=self.grid,
                  prefix=self.prefix, prefix_at_end=self.prefix_at_end, ctx=self.ctx,
                  options=self.options, fallback=self.fallback)
        kw.update({n: x for n, x in over.items() if x is not None})
        return attend(q, k, v, layout=layout, ring_step=ring_step, sm_scale=sm_scale,
                      attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, **kw)


# ------------------------------------------------------------------ yunchang
class YunchangAttention(_Adapter):
    """qvattn as yunchang's attention processor.

        proc = YunchangAttention("sage8")                   # or vc8, draft...
        attn = qvattn.parallel.yunchang_long_context(proc)  # Ulysses x ring
        out = attn(q, k, v)          # local [B, S/P, H, D] -> [B, S/P, H, D]

    yunchang calls it as ``proc(q, k, v, dropout_p=, softmax_scale=,
    causal=, window_size=, softcap=, alibi_slopes=, ...)`` with
    ``[B, S, H, D]`` tensors and reads ``(out [B, S, H, D], lse [B, H, S]
    float32)``; its ring loop merges the LSEs.  `ring`: None = yunchang's
    ring group (``set_seq_parallel_pg``) tells whether the calls are ring
    steps (degree > 1); True/False force it.  Keyword arguments: as
    qvattn.attention (method, layer, state, step, num_steps, grid, prefix,
    prefix_at_end, ctx, options, fallback); one instance per transformer
    layer when the method keeps state (vc8, vc4, draft), with its `layer`.
    """

    def __init__(self, method="sage8", *, ring=None, ring_group=None, **kw):
        super().__init__(method, **kw)
        self.ring = ring
        self.ring_group = ring_group

    def _ring_size(self):
        group = self.ring_group
        if group is None:
            try:
                from yunchang.globals import PROCESS_GROUP
            except ImportError:  # pragma: no cover - used without yunchang
                return 1
            group = PROCESS_GROUP.RING_PG
        size = _group_size(group)
        if self.ring is False:
            return 1
        if self.ring and size < 2:
            raise ValueError("qvattn.parallel.YunchangAttention: ring=True, but the ring "
                             "group has one rank")
        return size

    def __call__(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                 window_size=(-1, -1), softcap=0.0, alibi_slopes=None, *args, **kwargs):
        if tuple(window_size or (-1, -1)) != (-1, -1) or softcap or alibi_slopes is not None:
            raise _ffi.QvaUnsupportedError(
                _ffi.QVA_ERR_UNSUPPORTED, "sliding windows, softcap and ALiBi are not "
                "supported (video DiTs attend to every token)", "qvattn.parallel")
        return self._attend(q, k, v, "NHD", self._ring_size(), softmax_scale,
                            is_causal=bool(causal), dropout_p=dropout_p)


def yunchang_long_context(processor, ring_impl_type="basic", **kwargs):
    """yunchang's ``LongContextAttention`` (Ulysses x ring, the degrees of
    ``set_seq_parallel_pg``) running `processor` (a YunchangAttention).
    yunchang takes a custom kernel as ``attn_processor``; its kernel table
    (``select_flash_attn_impl``) hands the call to that processor when
    ``attn_type`` names none of its own kernels, so it is None here.  Only
    the "basic" ring passes the processor on."""
    from yunchang import LongContextAttention
    if ring_impl_type != "basic":
        raise ValueError("qvattn.parallel: yunchang's ring hands a custom processor the "
                         "call only in ring_impl_type='basic'")
    return LongContextAttention(ring_impl_type=ring_impl_type, attn_type=None,
                                attn_processor=processor, **kwargs)


def yunchang_ulysses(processor, group=None, **kwargs):
    """yunchang's ``UlyssesAttention`` (all-to-all over `group`, default the
    Ulysses group of ``set_seq_parallel_pg``) running `processor`.
    UlyssesAttention has no processor argument: it calls the function in its
    ``attn_fn`` attribute, which is set here (built with a torch kernel,
    ``AttnType.TORCH_MATH``, that is never called)."""
    from yunchang import UlyssesAttention
    from yunchang.kernels import AttnType
    if group is None:
        from yunchang.globals import PROCESS_GROUP
        group = PROCESS_GROUP.ULYSSES_PG
    attn = UlyssesAttention(sequence_process_group=group, attn_type=AttnType.TORCH_MATH,
                            **kwargs)
    if isinstance(processor, YunchangAttention) and processor.ring is None:
        processor.ring = False  # one call per forward, whatever the ring group
    attn.attn_fn = processor
    return attn


# ------------------------------------------------------------------ xDiT
XDIT_BACKEND = "QVATTN"
"""The member qvattn adds to xfuser's AttentionBackendType."""

_XDIT_KWARGS = ("method", "layer", "step", "num_steps", "grid", "prefix", "state")


class XditAttention(_Adapter):
    """qvattn as an xDiT attention function: ``fn(query, key, value,
    dropout_p=0.0, is_causal=False, attention_kwargs=None)`` on
    ``[B, H, S, D]`` -> ``(out [B, H, S, D], lse [B, H, S] float32)``.

    xDiT's USP calls it after its Ulysses all-to-all, and under ring
    through torch's templated ring attention, which merges the LSEs.
    attention_kwargs may carry ``attn_mask`` (a boolean key-padding mask)
    and per-call ``qvattn_method``, ``qvattn_layer``, ``qvattn_step``,
    ``qvattn_num_steps``, ``qvattn_grid``, ``qvattn_prefix``,
    ``qvattn_state``: xDiT's models pass no layer, so without them a call is
    stateless (V-Smooth groups afresh).  `ring`: None = xDiT's ring degree
    (``get_ring_parallel_world_size``); True/False force it.
    """

    def __init__(self, method="sage8", *, ring=None, ring_size=None, **kw):
        super().__init__(method, **kw)
        self.ring = ring
        self.ring_size = ring_size

    def _ring_size(self):
        if self.ring is False:
            return 1
        if self.ring_size is not None:
            return int(self.ring_size)
        try:
            from xfuser.core.distributed import get_ring_parallel_world_size
            return int(get_ring_parallel_world_size())
        except (ImportError, AssertionError, AttributeError):
            return 1  # xDiT's parallel state not initialized: no ring

    def __call__(self, query, key, value, dropout_p=0.0, is_causal=False,
                 attention_kwargs=None, **_):
        akw = attention_kwargs or {}
        over = {n: akw.get("qvattn_" + n) for n in _XDIT_KWARGS}
        return self._attend(query, key, value, "HND", self._ring_size(),
                            akw.get("scale"), attn_mask=akw.get("attn_mask"),
                            is_causal=bool(is_causal), dropout_p=dropout_p, **over)


def _enum_member(cls, name, value):
    """cls's member `name`, added (value map, name map, name list) when the
    Enum is closed to extension and lacks it."""
    m = cls.__members__.get(name)
    if m is not None:
        return m
    base = cls._member_type_
    m = object.__new__(cls) if base is object else base.__new__(cls, value)
    m._name_, m._value_ = name, value
    m.__objclass__ = cls
    cls._value2member_map_[value] = m
    cls._member_map_[name] = m
    cls._member_names_.append(name)
    try:
        type.__setattr__(cls, name, m)
    except (AttributeError, TypeError):  # pragma: no cover - Enum internals
        pass
    return m


def register_xdit(fn=None, name=XDIT_BACKEND, **kwargs):
    """Registers qvattn with xDiT: `fn` (default ``XditAttention(**kwargs)``)
    under a new member `name` of xfuser's ``AttentionBackendType``, in
    ``ATTENTION_FUNCTION_REGISTRY`` -- the table xDiT's ``USP`` and
    ``attention`` read.  Then ``get_runtime_state().set_attention_backend(
    "QVATTN")`` or ``USP(..., backend=member)`` run qvattn.  xDiT registers
    its own backends with a decorator on that closed Enum and has no call for
    a third party, so the member is added the way the Enum stores its own
    (as qvattn.diffusers does for diffusers).  Returns the member."""
    from xfuser.core.distributed import attention_backend as ab
    member = _enum_member(ab.AttentionBackendType, name, name.lower())
    ab.ATTENTION_FUNCTION_REGISTRY[member] = fn if fn is not None else XditAttention(**kwargs)
    return member


# ------------------------------------------------------------------ traffic models
def all_to_all_bytes(B, S, H, D, world, itemsize=2, tensors=4):
    """Bytes one rank sends in one attention call under Ulysses of degree
    `world`: q, k, v in and out back (`tensors` = 4 all-to-alls), each moving
    (world-1)/world of the rank's [B, S/world, H, D] shard."""
    if world < 2:
        return 0
    shard = B * (S // world) * H * D * itemsize
    return tensors * shard * (world - 1) // world


def ring_bytes(B, S, H, D, world, itemsize=2):
    """Bytes one rank sends in one attention call under ring of degree
    `world`: its K and V chunk travel world-1 hops."""
    if world < 2:
        return 0
    return 2 * B * (S // world) * H * D * itemsize * (world - 1)


def link_seconds(nbytes, gbps):
    """Seconds to send nbytes at gbps GB/s (1e9 bytes/s)."""
    return nbytes / (gbps * 1e9) if gbps > 0 else math.inf
