"""qvattn.comfyui: the optimized_attention_override protocol, ComfyUI's
attention signature and layouts, the step from sigmas/sample_sigmas, layer
ids, routing to ComfyUI's own attention, the node.  No ComfyUI needed:
ComfyUI's side is a fake ``func`` and dicts shaped like its
transformer_options.
"""
import copy
import types
import warnings

import pytest

from _torch_util import F, make_qkv, rel_l2, torch

from qvattn import comfyui  # noqa: E402


def comfy_sdpa(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
               skip_output_reshape=False, **kwargs):
    """What ComfyUI's attention_pytorch computes (the reference and `func`)."""
    if skip_reshape:
        b, _, _, d = q.shape
    else:
        b, _, hd = q.shape
        d = hd // heads
        q, k, v = (x.view(b, -1, heads, d).transpose(1, 2) for x in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if skip_output_reshape:
        return o
    return o.transpose(1, 2).reshape(b, -1, heads * d)


class Func:
    def __init__(self):
        self.calls = 0

    def __call__(self, *a, **kw):
        self.calls += 1
        assert kw.get("_inside_attn_wrapper") is True
        return comfy_sdpa(*a, **kw)


def options(step, n=4):
    sched = torch.linspace(1.0, 0.0, n + 1)
    return {"sigmas": sched[step:step + 1].clone(), "sample_sigmas": sched}


def flat(x):  # [B, H, N, D] -> [B, N, H*D]
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)



def test_override_protocol_and_layouts():
    q, k, v = make_qkv(N=256)
    ov = comfyui.QvattnOverride("sage8")
    func = Func()
    ref = comfy_sdpa(flat(q), flat(k), flat(v), 2)
    topts = options(0)
    out = ov(func, flat(q), flat(k), flat(v), 2, transformer_options=topts,
             _inside_attn_wrapper=True)
    assert out.shape == ref.shape and func.calls == 0
    assert rel_l2(out, ref) < 6e-2
    # [B,H,N,D] in and out
    o2 = ov(func, q, k, v, 2, skip_reshape=True, skip_output_reshape=True,
            transformer_options=topts, _inside_attn_wrapper=True)
    assert o2.shape == q.shape and rel_l2(o2, comfy_sdpa(q, k, v, 2, skip_reshape=True,
                                                         skip_output_reshape=True)) < 6e-2
    o3 = ov(func, q, k, v, 2, skip_reshape=True, transformer_options=topts,
            _inside_attn_wrapper=True)
    torch.testing.assert_close(o3, flat(o2))
    with warnings.catch_warnings():  # no sigmas here: "step unknown" warning
        warnings.simplefilter("ignore")
        o4 = comfyui.attention(flat(q), flat(k), flat(v), 2)  # the plain signature
    assert o4.shape == ref.shape


def test_step_from_sigmas_and_block_index(spy):
    q, k, v = (flat(x) for x in make_qkv(N=256))
    ov = comfyui.QvattnOverride("vc8+expcast")
    func = Func()
    for step in range(4):
        topts = options(step)
        for block in range(2):
            topts["block_index"] = block
            ov(func, q, k, v, 2, transformer_options=topts, _inside_attn_wrapper=True)
    assert spy == [(b, s, 4) for s in range(4) for b in range(2)]
    # no block_index: the order of self-attention calls within a model call
    del spy[:]
    ov2 = comfyui.QvattnOverride("sage8")
    topts = options(2)
    for _ in range(3):
        ov2(func, q, k, v, 2, transformer_options=topts, _inside_attn_wrapper=True)
    assert [c[0] for c in spy] == [0, 1, 2] and {c[1] for c in spy} == {2}


def test_new_schedule_resets_state():
    q, k, v = (flat(x) for x in make_qkv(N=256))
    ov = comfyui.QvattnOverride("vc8")
    resets = []
    ov.state.reset = lambda: resets.append(1)
    func = Func()
    a = options(0)
    ov(func, q, k, v, 2, transformer_options=a, _inside_attn_wrapper=True)
    ov(func, q, k, v, 2, transformer_options=dict(a, sigmas=a["sample_sigmas"][1:2]),
       _inside_attn_wrapper=True)
    assert len(resets) == 1
    ov(func, q, k, v, 2, transformer_options=options(0), _inside_attn_wrapper=True)
    assert len(resets) == 2


def test_routing_to_comfy_attention():
    q, k, v = make_qkv(N=256, Nk=77)
    func = Func()
    ov = comfyui.QvattnOverride("vc8")
    # short cross-attention: ComfyUI's own, silently (it is the designed route)
    out = ov(func, flat(q), flat(k), flat(v), 2, transformer_options=options(0),
             _inside_attn_wrapper=True)
    assert func.calls == 1 and out.shape == (1, 256, 128)
    # an additive mask: ComfyUI's attention with a warning, or an error
    q, k, v = (flat(x) for x in make_qkv(N=256))
    mask = torch.zeros(1, 1, 256, 256)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ov(func, q, k, v, 2, mask=mask, transformer_options=options(0),
           _inside_attn_wrapper=True)
    assert func.calls == 2 and any("ComfyUI" in str(w.message) for w in rec)
    strict = comfyui.QvattnOverride("vc8", fallback=False)
    with pytest.raises(NotImplementedError):
        strict(func, q, k, v, 2, mask=mask, transformer_options=options(0),
               _inside_attn_wrapper=True)
    # a boolean key-padding mask [B, Nk] is run by qvattn
    kp = torch.ones(1, 256, dtype=torch.bool)
    kp[:, 200:] = False
    out = ov(func, q, k, v, 2, mask=kp, transformer_options=options(0),
             _inside_attn_wrapper=True)
    assert func.calls == 2
    ref = comfy_sdpa(q, k, v, 2, mask=kp[:, None, None, :])
    assert rel_l2(out, ref) < 6e-2


def test_grid_from_transformer_options(spy):
    q, k, v = (flat(x) for x in make_qkv(N=2 * 64))
    ov = comfyui.QvattnOverride("draft@85/0/0/15", draft_warmup=0)
    topts = options(1)
    topts["grid_sizes"] = (2, 8, 8)
    out = ov(Func(), q, k, v, 2, transformer_options=topts, _inside_attn_wrapper=True)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError):  # no grid anywhere: draft cannot run
        comfyui.QvattnOverride("draft@85/0/0/15", fallback=False)(
            Func(), q, k, v, 2, transformer_options=options(1), _inside_attn_wrapper=True)


def test_patch_model_and_node():
    class Patcher:
        def __init__(self):
            self.model_options = {"transformer_options": {}}

        def clone(self):
            n = Patcher()
            n.model_options = copy.deepcopy(self.model_options)
            return n

    p = Patcher()
    (patched,) = comfyui.NODE_CLASS_MAPPINGS["QvattnAttention"]().patch(p, "sage8")
    ov = patched.model_options["transformer_options"]["optimized_attention_override"]
    assert isinstance(ov, comfyui.QvattnOverride) and ov.method == "sage8"
    assert "optimized_attention_override" not in p.model_options["transformer_options"]
    assert copy.deepcopy(ov) is ov  # clones share the override (and its state)
    assert "model" in comfyui.QvattnAttentionNode.INPUT_TYPES()["required"]


def test_bad_inputs():
    ov = comfyui.QvattnOverride("sage8")
    q, k, v = make_qkv(N=64)
    with pytest.raises(TypeError):
        ov(Func(), q.tolist(), k, v, 2)
    with pytest.raises(ValueError):
        ov(Func(), flat(q), flat(k), flat(v), 3)  # 128 channels are not 3 heads
    with pytest.raises(ValueError):
        ov(Func(), flat(q), flat(k), flat(v), 2, skip_reshape=True)
    with pytest.raises(ValueError):
        comfyui.QvattnOverride("sage9")
    assert isinstance(comfyui.optimized_attention_override, comfyui.QvattnOverride)
    assert isinstance(types.SimpleNamespace, type)
