"""qvattn.sdpa, torch SDPA's drop-in (issue 18, items 2 and 3): its
signature, F.scaled_dot_product_attention = qvattn.sdpa in a torch model,
positional masks and scale=, grouped K/V heads read without copies, head
dims up to 128 by zero padding, stateless calls, and what it refuses.
CPU only (the CUDA answers are the library's: tests/test_gqa.c)."""
import functools
import inspect
import warnings

import numpy as np
import pytest

from _torch_util import F, _ffi, make_qkv, ops, qvattn, torch

EXACT = dict(rtol=1e-5, atol=1e-5)  # method "exact" (FP64) against torch's float32 SDPA
METHODS = ["exact", "bf16", "fp8+expcast", "sage8", "vc8+expcast", "sage4", "vc4"]


@pytest.fixture
def lib_calls(monkeypatch):
    """The descriptors of every qva_attention call (k's heads, address)."""
    calls = []
    real = _ffi.attention_raw

    def rec(ctx, cfg, q, k, v, out, lse=None):
        calls.append(dict(q_heads=q.shape[1], k_heads=k.shape[1], v_heads=v.shape[1],
                          k_ptr=k.data, v_ptr=v.data, D=q.shape[3], layer=cfg.layer))
        return real(ctx, cfg, q, k, v, out, lse)

    monkeypatch.setattr(_ffi, "attention_raw", rec)
    return calls


@pytest.fixture
def no_torch_sdpa(monkeypatch):
    """torch's SDPA may not run (proves qvattn computed the call)."""
    def boom(*a, **kw):
        raise AssertionError("torch SDPA ran (a fallback)")

    monkeypatch.setattr(F, "scaled_dot_product_attention", boom)


def torch_sdpa(*a, **kw):
    return torch._C._nn.scaled_dot_product_attention(*a, **kw)


# ------------------------------------------------------------------ signature
def test_signature_is_torchs():
    """Names, order, defaults and kinds of aten::scaled_dot_product_attention
    (scale and enable_gqa keyword-only); qvattn's own keywords come after."""
    schema = torch._C._jit_get_schemas_for_operator("aten::scaled_dot_product_attention")[0]
    params = list(inspect.signature(qvattn.sdpa).parameters.values())
    assert len(params) == len(schema.arguments) + 3
    for p, a in zip(params, schema.arguments):
        assert p.name == a.name
        kind = inspect.Parameter.KEYWORD_ONLY if a.kwarg_only else \
            inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert p.kind == kind, p.name
        want = inspect.Parameter.empty if not a.has_default_value() else a.default_value
        assert p.default == want, p.name
    assert [p.name for p in params[len(schema.arguments):]] == ["method", "fallback", "options"]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[len(schema.arguments):])
    assert qvattn.sdpa is ops.sdpa and "sdpa" in qvattn.__all__


def test_positional_mask_scale_and_ranks():
    q, k, v = make_qkv(B=2, H=3, N=100, D=64)
    mask = torch.ones(2, 1, 1, 100, dtype=torch.bool)
    mask[1, ..., 70:] = False
    ref = torch_sdpa(q, k, v, mask, 0.0, False, scale=0.07)
    out = qvattn.sdpa(q, k, v, mask, 0.0, False, scale=0.07, method="exact")
    torch.testing.assert_close(out, ref, **EXACT)
    # rank 3 (no head dim), rank 2, and rank 5 with a broadcast batch dim
    for qs, ks in (((3, 100, 64), (3, 80, 64)), ((100, 64), (80, 64)),
                   ((2, 3, 2, 100, 64), (1, 3, 2, 80, 64))):
        g = torch.Generator().manual_seed(len(qs))
        q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, ks))
        out = qvattn.sdpa(q, k, v, method="exact")
        torch.testing.assert_close(out, torch_sdpa(q, k, v), **EXACT)
    # a key-padding mask over the rank-5 batch
    m = torch.rand(2, 3, 1, 1, 80, generator=g) > 0.3
    torch.testing.assert_close(qvattn.sdpa(q, k, v, m, method="exact"),
                               torch_sdpa(q, k, v, m), **EXACT)


def test_drop_in_for_torch_multihead_attention(monkeypatch, lib_calls):
    """nn.MultiheadAttention calls F.scaled_dot_product_attention with
    positional arguments; patched to qvattn.sdpa it runs qvattn (head dim
    80: padded) and stays close to torch."""
    torch.manual_seed(0)
    # batch_first=False: not the fused fast path, which bypasses F's SDPA
    mha = torch.nn.MultiheadAttention(320, 4).eval()
    x = torch.randn(150, 2, 320)
    with torch.no_grad():
        ref = mha(x, x, x, need_weights=False)[0]
        monkeypatch.setattr(F, "scaled_dot_product_attention",
                            functools.partial(qvattn.sdpa, method="bf16"))
        out = mha(x, x, x, need_weights=False)[0]
    assert len(lib_calls) == 1 and lib_calls[0]["D"] == 128
    assert float((out - ref).norm() / ref.norm()) < 0.01


# ------------------------------------------------------------------ GQA
@pytest.mark.parametrize("hkv", [2, 1])
def test_gqa_reads_grouped_kv_without_copies(hkv, lib_calls, no_torch_sdpa):
    q, _, _ = make_qkv(B=2, H=8, N=130, D=64)
    _, k, v = make_qkv(B=2, H=hkv, N=130, D=64, seed=1)
    out = qvattn.sdpa(q, k, v, enable_gqa=True, method="exact")
    # the library got k's and v's own memory with H_kv heads: nothing expanded
    assert lib_calls == [dict(q_heads=8, k_heads=hkv, v_heads=hkv, k_ptr=k.data_ptr(),
                              v_ptr=v.data_ptr(), D=64, layer=_ffi.QVA_LAYER_NONE)]
    g = 8 // hkv
    ref = torch_sdpa(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))
    torch.testing.assert_close(out, ref, **EXACT)


@pytest.mark.parametrize("method", METHODS + ["draft@50/20/15/15"])
def test_gqa_equals_repeated_kv(method):
    """Every method: grouped K/V gives what K/V repeated to the query heads
    give, bit for bit (V-Smooth keeps its state per K/V head)."""
    q, _, _ = make_qkv(B=1, H=4, N=200, D=64)
    _, k, v = make_qkv(B=1, H=2, N=200, D=64, seed=2)
    kw = dict(method=method, grid=(1, 8, 24), layer=1, step=0, num_steps=8)
    with qvattn.Context() as c1, qvattn.Context() as c2:
        for step in range(3 if method.startswith("vc") else 1):
            kw["step"] = step
            a = qvattn.attention(q, k, v, ctx=c1, **kw)
            b = qvattn.attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                 ctx=c2, **kw)
            assert torch.equal(a, b), (method, step)


def test_gqa_rules_are_torchs():
    q, _, _ = make_qkv(H=8, N=64)
    _, k, v = make_qkv(H=2, N=64)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        qvattn.sdpa(q, k, v)
    _, k3, v3 = make_qkv(H=3, N=64)
    with pytest.raises(ValueError, match="must divide"):
        qvattn.sdpa(q, k3, v3, enable_gqa=True)
    with pytest.raises(ValueError, match="heads"):
        qvattn.sdpa(q, k, v3[:, :1], enable_gqa=True)
    # one K/V head broadcasts without enable_gqa, as in torch
    _, k1, v1 = make_qkv(H=1, N=64)
    torch.testing.assert_close(qvattn.sdpa(q, k1, v1, method="exact"),
                               torch_sdpa(q, k1, v1), **EXACT)
    # qvattn.attention takes grouped K/V as such (the library's convention)
    assert qvattn.attention(q, k, v, method="exact").shape == q.shape


def test_gqa_refused_by_the_device_raises_or_falls_back(monkeypatch):
    """Where a device backend refuses grouped K/V (none does today: CUDA
    runs it since issue 18; this keeps the refusal path honest), sdpa raises
    that reason, or with fallback=True warns and runs torch's enable_gqa
    SDPA.  Simulated on the CPU by a support answer that refuses."""
    real = ops.support_reason

    def cuda_like(device, method, options, dtype, head_dim, step=0, num_steps=0, heads=1,
                  kv_heads=1):
        if heads != kv_heads:
            return "U:cuda backend: grouped K/V heads (GQA/MQA) are not implemented"
        return real(device, method, options, dtype, head_dim, step, num_steps, heads, kv_heads)

    monkeypatch.setattr(ops, "support_reason", cuda_like)
    q, _, _ = make_qkv(H=4, N=64)
    _, k, v = make_qkv(H=2, N=64)
    with pytest.raises(qvattn.QvaUnsupportedError, match="grouped K/V heads"):
        qvattn.sdpa(q, k, v, enable_gqa=True)
    ops._warned.clear()
    with pytest.warns(ops.QvattnFallbackWarning, match="grouped K/V"):
        out = qvattn.sdpa(q, k, v, enable_gqa=True, fallback=True)
    torch.testing.assert_close(out, torch_sdpa(q, k, v, enable_gqa=True))
    # the real answer: grouped K/V run on CUDA wherever the method does
    monkeypatch.undo()
    ok_mha, _ = qvattn.supports("sage8", "cuda")
    ok_gqa, why = qvattn.supports("sage8", "cuda", heads=4, kv_heads=2)
    assert ok_gqa == ok_mha and (ok_gqa or why)


# ------------------------------------------------------------------ head dims
@pytest.mark.parametrize("D,Dv", [(16, 16), (40, 40), (80, 80), (96, 96), (100, 100),
                                  (80, 48), (64, 128)])
def test_head_dims_by_zero_padding(D, Dv, lib_calls):
    """exact at any D <= 128 equals torch; the library computed at 64/128."""
    g = torch.Generator().manual_seed(D + Dv)
    q, k = torch.randn(1, 2, 130, D, generator=g), torch.randn(1, 2, 90, D, generator=g)
    v = torch.randn(1, 2, 90, Dv, generator=g)
    out = qvattn.sdpa(q, k, v, method="exact")
    assert out.shape == (1, 2, 130, Dv) and out.is_contiguous()
    assert lib_calls[0]["D"] == (64 if max(D, Dv) <= 64 else 128)
    torch.testing.assert_close(out, torch_sdpa(q, k, v), **EXACT)
    out = qvattn.sdpa(q, k, v, scale=0.3, method="exact")
    torch.testing.assert_close(out, torch_sdpa(q, k, v, scale=0.3), **EXACT)


@pytest.mark.parametrize("method", METHODS + ["sage8+nohadamard+fp32sum"])
def test_padding_in_python_is_the_librarys(method):
    """The torch layer pads (for the CUDA kernels, which take 64/128 only);
    the CPU library pads itself (numpy path).  Same bits: the one definition
    (tests/test_gqa.c checks it against the unpadded CPU reference)."""
    q, k, v = make_qkv(H=2, N=200, D=80)
    t = qvattn.attention(q, k, v, method=method)
    n = qvattn.attention(*(x.numpy() for x in (q, k, v)), method=method)
    assert np.array_equal(t.numpy(), n), method


def test_head_dim_above_128():
    q, k, v = make_qkv(N=64, D=160)
    with pytest.raises(ValueError, match="at most 128"):
        qvattn.sdpa(q, k, v)
    ops._warned.clear()
    with pytest.warns(ops.QvattnFallbackWarning):
        out = qvattn.sdpa(q, k, v, fallback=True)
    torch.testing.assert_close(out, torch_sdpa(q, k, v))


# ------------------------------------------------------------------ default method
def test_default_method_is_rotated_expcast_pblock(monkeypatch):
    """One default for every entry point: vc8 with the Hadamard rotation and
    ExpCast at the centred beta against each key block's max (+pblock);
    cross-attention (Nq != Nk) drops V-Smooth and keeps the options."""
    assert qvattn.DEFAULT_METHOD == "vc8+expcast-centred+pblock"
    seen = []
    real = _ffi.attention_raw

    def rec(ctx, cfg, q, k, v, out, lse=None):
        seen.append((cfg.method, cfg.expcast, cfg.hadamard, cfg.p_max))
        return real(ctx, cfg, q, k, v, out, lse)

    monkeypatch.setattr(_ffi, "attention_raw", rec)
    q, k, v = make_qkv(H=2, N=300)
    a = qvattn.attention(q, k, v)
    torch.testing.assert_close(
        a, qvattn.attention(q, k, v, method="vc8+hadamard+expcast-centred+pblock"),
        rtol=0, atol=0)
    assert not torch.equal(a, qvattn.attention(q, k, v, method="vc8+expcast-centred"))
    assert not torch.equal(a, qvattn.attention(q, k, v, method="vc8"))
    s = qvattn.sdpa(q, k, v)
    torch.testing.assert_close(s, a, rtol=0, atol=0)
    qvattn.sdpa(q, k[:, :, :200], v[:, :, :200])
    vc8, sage8 = _ffi.QVA_METHOD_VC8, _ffi.QVA_METHOD_SAGE8
    off, centred = _ffi.QVA_EXPCAST_OFF, _ffi.QVA_EXPCAST_CENTRED
    block, row = _ffi.QVA_P_MAX_BLOCK, _ffi.QVA_P_MAX_ROW
    assert seen[:2] == [(vc8, centred, 1, block)] * 2
    assert seen[2] == (vc8, centred, 1, row)
    assert seen[3][:2] == (vc8, off)
    assert seen[4:] == [(vc8, centred, 1, block), (sage8, centred, 1, block)]


# ------------------------------------------------------------------ stateless
def test_stateless_unless_asked(lib_calls):
    """The issue's symptom: the default method on the shared default
    context kept V-Smooth state under layer 0 (outputs differed by 0.029).
    Without layer/step a call is a function of its inputs."""
    q, k, v = make_qkv(H=2, N=300)
    q2, k2, v2 = make_qkv(H=2, N=300, seed=5)
    a = qvattn.attention(q, k, v)
    qvattn.attention(q2, k2, v2)
    b = qvattn.attention(q, k, v)
    with qvattn.Context() as fresh:
        c = qvattn.attention(q, k, v, ctx=fresh)
    assert torch.equal(a, b) and torch.equal(a, c)
    s = qvattn.sdpa(q, k, v)
    qvattn.sdpa(q2, k2, v2)
    assert torch.equal(s, qvattn.sdpa(q, k, v)) and torch.equal(s, a)
    assert {c["layer"] for c in lib_calls} == {_ffi.QVA_LAYER_NONE}
    # naming a layer (and step) asks for state: the schedule warm-starts
    with qvattn.Context() as ctx:
        x = qvattn.attention(q, k, v, layer=0, step=0, ctx=ctx)
        qvattn.attention(q2, k2, v2, layer=0, step=0, ctx=ctx)
        y = qvattn.attention(q, k, v, layer=0, step=0, ctx=ctx)
    assert torch.equal(x, a) and not torch.equal(x, y)
    with pytest.raises(ValueError, match="layer must be >= 0"):
        qvattn.attention(q, k, v, layer=-1)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("what", ["causal", "dropout", "additive-mask", "dense-mask",
                                  "float64", "scale-0"])
def test_unsupported_raises_or_falls_back(what):
    q, k, v = make_qkv(N=64)
    kw = {}
    if what == "causal":
        kw["is_causal"] = True
    elif what == "dropout":
        kw["dropout_p"] = 0.2
    elif what == "additive-mask":
        kw["attn_mask"] = torch.zeros(1, 1, 1, 64)
    elif what == "dense-mask":
        kw["attn_mask"] = torch.rand(64, 64) > 0.5
    elif what == "float64":
        q, k, v = (x.double() for x in (q, k, v))
    else:
        kw["scale"] = 0.0
    with pytest.raises(qvattn.QvaUnsupportedError, match="fallback=True"):
        qvattn.sdpa(q, k, v, **kw)
    ops._warned.clear()
    with pytest.warns(ops.QvattnFallbackWarning):
        torch.manual_seed(0)
        out = qvattn.sdpa(q, k, v, fallback=True, **kw)
    torch.manual_seed(0)
    torch.testing.assert_close(out, torch_sdpa(q, k, v, **kw))


def test_torch_errors_and_gradients():
    q, k, v = make_qkv(N=64)
    with pytest.raises(ValueError, match="is_causal"):
        qvattn.sdpa(q, k, v, torch.ones(64, 64, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError):
        qvattn.sdpa(q.numpy(), k, v)
    assert qvattn.sdpa(q[:, :, :0], k, v).shape == (1, 2, 0, 64)
    # inputs that need a gradient: torch with fallback=True, else qvattn's
    # forward whose backward says it has none
    qg = q.clone().requires_grad_()
    ops._warned.clear()
    with pytest.warns(ops.QvattnFallbackWarning, match="gradient"):
        qvattn.sdpa(qg, k, v, fallback=True).sum().backward()
    assert qg.grad is not None
    with pytest.raises(NotImplementedError, match="backward"):
        qvattn.sdpa(qg, k, v).sum().backward()


def test_compile_fullgraph():
    q, _, _ = make_qkv(H=4, N=128, D=80)
    _, k, v = make_qkv(H=2, N=128, D=80, seed=3)

    def f(q, k, v):
        return qvattn.sdpa(q, k, v, enable_gqa=True, method="sage8") * 2

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(g(q, k, v), f(q, k, v), rtol=0, atol=0)


def test_warnings_are_not_swallowed():
    """Nothing in a supported call warns (the fallback warning is the only
    one sdpa gives)."""
    q, k, v = make_qkv(N=64, D=96)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qvattn.sdpa(q, k, v)


# ------------------------------------------------------------------ sampled statistics
def test_sampled_statistics_reach_the_library(monkeypatch):
    """+ksample / +vsample through the Python API: the options reach the
    config, the output stays as near SDPA as the method's own (1,500 keys:
    the sample is 1,024 of them), and a call is a function of its inputs
    even at a layer (nothing is carried)."""
    seen = []
    real = _ffi.attention_raw

    def rec(ctx, cfg, q, k, v, out, lse=None):
        seen.append((cfg.k_mean, cfg.v_scale))
        return real(ctx, cfg, q, k, v, out, lse)

    monkeypatch.setattr(_ffi, "attention_raw", rec)
    q, k, v = make_qkv(H=2, N=1500)
    q2, k2, v2 = make_qkv(H=2, N=1500, seed=4)
    ref = torch_sdpa(q, k, v)
    own = qvattn.attention(q, k, v, method="sage8")
    a = qvattn.attention(q, k, v, method="sage8+ksample+vsample", layer=3, step=20)
    qvattn.attention(q2, k2, v2, method="sage8+ksample+vsample", layer=3, step=20)
    b = qvattn.attention(q, k, v, method="sage8+ksample+vsample", layer=3, step=20)
    assert seen[1:] == [(_ffi.QVA_K_MEAN_SAMPLE, _ffi.QVA_V_SCALE_SAMPLE)] * 3
    assert not torch.equal(a, own)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    err = lambda x: float((x - ref).norm() / ref.norm())  # noqa: E731
    assert err(a) < 1.1 * err(own), (err(a), err(own))
