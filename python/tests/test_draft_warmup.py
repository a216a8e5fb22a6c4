"""Draft dense warm-up steps on torch SDPA (option "draft.dense_backend").

CPU: the warm-up decision (qvattn._config.draft_dense_warmup, which asks the
library: qva_draft_step_check) against the library's output, the option's
defaults and values, the grid checks, and the SDPA path forced on the CPU
(routing, closeness, masks, lse, opcheck, torch.compile).  GPU (skip without CUDA): the default "sdpa" backend vs the
library's BF16 kernel on a warm-up step, sparse steps still on the
library, masks, CUDA graphs.
"""
import pytest

from _torch_util import _ffi, cuda_ok, make_qkv, ops, qvattn, rel_l2, torch

from qvattn import _config

DRAFT = "draft@85/0/0/15"
GRID = (2, 8, 8)      # 128 video tokens + 16 text tokens at the end (CPU)
N = 2 * 8 * 8 + 16


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Counts the calls computed by torch SDPA as a draft warm-up step."""
    calls = []
    real = ops._sdpa_dense

    def spy(cfg, q, k, v, layout):
        calls.append((cfg.step, cfg.draft.dense_warmup_steps))
        return real(cfg, q, k, v, layout)

    monkeypatch.setattr(ops, "_sdpa_dense", spy)
    return calls


def draft(q, k, v, step, backend=None, warm=1, num_steps=4, **kw):
    opts = {"draft.dense_warmup_steps": warm}
    if backend is not None:
        opts["draft.dense_backend"] = backend
    kw.setdefault("grid", GRID)
    kw.setdefault("prefix_at_end", True)
    return qvattn.attention(q, k, v, method=DRAFT, step=step, num_steps=num_steps,
                            options=opts, **kw)


# ------------------------------------------------------------------ the decision (CPU)
def _cfg(method, options, step, num_steps):
    return _config.config_for(method, _config.options_string(options), 0.0, 0, step,
                              num_steps, GRID, -1, True, N)


def test_decision_function():
    def f(cfg):  # the library's decision (qva_draft_step_check), N tokens, D = 64
        return _config.draft_dense_warmup(cfg, N, 64)

    assert [f(_cfg(DRAFT, {"draft.dense_warmup_steps": 2}, s, 4)) for s in range(4)] == \
        [True, True, False, False]
    # the fraction resolves against num_steps: ceil(0.25 * 40) = 10 steps
    fr = {"draft.dense_warmup_frac": 0.25}
    assert [s for s in range(40) if f(_cfg(DRAFT, fr, s, 40))] == list(range(10))
    assert not f(_cfg(DRAFT, fr, 0, 0))  # num_steps unknown: no fractional warm-up
    assert not f(_cfg(DRAFT, {}, 0, 40))  # the library default: no warm-up
    # only draft has a warm-up
    assert not f(_cfg("bf16", {"draft.dense_warmup_steps": 5}, 0, 40))
    assert not f(_cfg("vc8+expcast", {"draft.dense_warmup_steps": 5}, 0, 40))


@pytest.mark.parametrize("options,num_steps", [
    ({"draft.dense_warmup_steps": 2}, 5),
    ({"draft.dense_warmup_frac": 0.5}, 5),   # ceil(2.5) = 3
    ({"draft.dense_warmup_frac": 0.25}, 0),  # unknown schedule: none
    ({}, 3)])
def test_decision_is_the_library_decision(options, num_steps):
    """The library's warm-up output is the bf16 method's, bit for bit; its
    sparse steps are not: the Python decision must agree step by step."""
    q, k, v = make_qkv(N=N)
    dense = qvattn.attention(q, k, v, method="bf16")
    opts = dict(options, **{"draft.dense_backend": "qvattn"})
    for step in range(max(num_steps, 4)):
        ns = num_steps if num_steps else 0
        if ns and step >= ns:
            break
        out = qvattn.attention(q, k, v, method=DRAFT, grid=GRID, prefix_at_end=True,
                               step=step, num_steps=ns, options=opts, ctx=qvattn.Context())
        lib_warm = torch.equal(out, dense)
        cfg = _cfg(DRAFT, options, step, ns)
        assert lib_warm == _config.draft_dense_warmup(cfg, N, q.shape[-1]), step
        assert lib_warm == _ffi.draft_step_check(cfg, N, q.shape[-1]), step


def test_dense_backend_option():
    s = ops.options_string
    assert s({"draft.dense_backend": "SDPA"}) == "draft.dense_backend=sdpa"
    assert s("draft.dense_backend=qvattn") == "draft.dense_backend=qvattn"
    assert s(s({"draft.dense_backend": "qvattn", "draft.dense_warmup_steps": 2})) == \
        "draft.dense_backend=qvattn;draft.dense_warmup_steps=2"
    with pytest.raises(ValueError, match="dense_backend"):
        s({"draft.dense_backend": "flash"})
    assert _config.dense_backend("", cuda=True) == "sdpa"
    assert _config.dense_backend("", cuda=False) == "qvattn"
    assert _config.dense_backend(s({"draft.dense_backend": "qvattn"}), cuda=True) == "qvattn"
    assert _config.dense_backend(s({"draft.dense_backend": "sdpa"}), cuda=False) == "sdpa"
    # not a C field: the C config is the same with or without it
    assert bytes(ops._base_config(DRAFT, s({"draft.dense_backend": "sdpa"}))) == \
        bytes(ops._base_config(DRAFT, ""))


def test_cpu_default_is_the_library(sdpa_calls):
    q, k, v = make_qkv(N=N)
    warm = draft(q, k, v, step=0)
    assert sdpa_calls == []
    torch.testing.assert_close(warm, qvattn.attention(q, k, v, method="bf16"),
                               rtol=0, atol=0)


# ------------------------------------------------------------------ draft.warmup_method
def test_warmup_method_option():
    s = ops.options_string
    assert s({"draft.warmup_method": "VC8"}) == "draft.warmup_method=vc8"
    assert s("draft.warmup_method=bf16") == "draft.warmup_method=bf16"
    for bad in ("vc8+expcast", "draft@85/0/0/15", "flash", ""):
        with pytest.raises(ValueError, match="warmup_method"):
            s({"draft.warmup_method": bad})
    assert ops._base_config(DRAFT, "").draft.warmup_method == _ffi.QVA_METHOD_BF16
    assert ops._base_config(DRAFT, s({"draft.warmup_method": "sage8"})).draft.warmup_method \
        == _ffi.QVA_METHOD_SAGE8


@pytest.mark.parametrize("draft_method,warm,as_method", [
    (DRAFT, "vc8", "vc8"),
    (DRAFT + "+expcast", "vc8", "vc8+expcast"),
    (DRAFT + "+expcast", "sage4", "sage4"),  # expcast is 8-bit only
])
def test_warmup_method_runs_that_method(sdpa_calls, draft_method, warm, as_method):
    """A warm-up step is a call of the warm-up method (bit for bit, on the
    library even with the SDPA backend); routed steps are unchanged."""
    q, k, v = make_qkv(N=N)
    opts = {"draft.dense_warmup_steps": 2, "draft.warmup_method": warm,
            "draft.dense_backend": "sdpa"}
    kw = dict(grid=GRID, prefix_at_end=True, num_steps=4)
    for step in range(2):
        got = qvattn.attention(q, k, v, method=draft_method, step=step, options=opts,
                               ctx=qvattn.Context(), **kw)
        want = qvattn.attention(q, k, v, method=as_method, step=step, num_steps=4,
                                ctx=qvattn.Context())
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        cfg = _cfg(draft_method, opts, step, 4)
        assert not _config.draft_dense_warmup(cfg, N, q.shape[-1])
    assert sdpa_calls == []
    routed = qvattn.attention(q, k, v, method=draft_method, step=2, options=opts, **kw)
    plain = qvattn.attention(q, k, v, method=draft_method, step=2,
                             options={"draft.dense_warmup_steps": 2}, **kw)
    torch.testing.assert_close(routed, plain, rtol=0, atol=0)


# ------------------------------------------------------------------ SDPA forced on the CPU
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_sdpa_warmup_close_to_library(sdpa_calls, layout, dtype):
    q, k, v = make_qkv(N=N, layout=layout, dtype=dtype)
    kw = dict(layout=layout, sm_scale=0.1)
    lib = draft(q, k, v, step=0, backend="qvattn", **kw)
    assert sdpa_calls == []
    sd = draft(q, k, v, step=0, backend="sdpa", **kw)
    assert sdpa_calls == [(0, 1)]
    assert sd.shape == q.shape and sd.dtype == q.dtype and sd.is_contiguous()
    assert rel_l2(sd, lib) < 1e-2
    # not a warm-up step: the library, whatever the backend option
    a = draft(q, k, v, step=2, backend="sdpa", **kw)
    b = draft(q, k, v, step=2, backend="qvattn", **kw)
    assert len(sdpa_calls) == 1
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert rel_l2(a, sd) > 1e-2  # 85% of the region pairs skipped


def test_cpu_sdpa_warmup_lse_stays_on_library(sdpa_calls):
    q, k, v = make_qkv(N=N)
    o1, l1 = draft(q, k, v, step=0, backend="sdpa", return_lse=True)
    o2, l2 = draft(q, k, v, step=0, backend="qvattn", return_lse=True)
    assert sdpa_calls == []
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(l1, l2, rtol=0, atol=0)


def test_cpu_sdpa_warmup_state_driven(sdpa_calls):
    """The step comes from a StepState at run time (step = -1 in the op)."""
    q, k, v = make_qkv(N=N)
    st = ops.StepState(num_steps=4)
    opts = {"draft.dense_warmup_steps": 1, "draft.dense_backend": "sdpa"}
    outs = []
    for t in (999.0, 750.0):
        st.observe(t)
        outs.append(ops.attention_torch(q, k, v, method=DRAFT, grid=GRID,
                                        prefix_at_end=True, options=opts, state=st))
    st.close()
    assert sdpa_calls == [(0, 1)]
    assert rel_l2(outs[0], qvattn.attention(q, k, v, method="bf16")) < 1e-2


@pytest.mark.parametrize("kind", ["prefix", "scattered"])
def test_cpu_sdpa_warmup_with_mask(sdpa_calls, kind):
    """Key-padding masks: same handling (valid tokens only, padded query rows
    over the valid keys) on both backends."""
    B = 2
    q, k, v = make_qkv(B=B, N=N + 24)
    mask = torch.ones(B, 1, 1, N + 24, dtype=torch.bool)
    if kind == "prefix":
        mask[:, ..., N:] = False          # 24 padded tokens at the end
    else:
        mask[0, ..., 100:124] = False     # 24 padded tokens inside
        mask[1, ..., 7:31] = False
    kw = dict(attn_mask=mask, grid=GRID, prefix=None)
    lib = draft(q, k, v, step=0, backend="qvattn", **kw)
    sd = draft(q, k, v, step=0, backend="sdpa", **kw)
    assert len(sdpa_calls) == (1 if kind == "prefix" else 2)
    assert rel_l2(sd, lib) < 1e-2


def test_cpu_sdpa_warmup_checks_like_the_library(sdpa_calls):
    q, k, v = make_qkv(N=N)
    for backend in ("qvattn", "sdpa"):
        with pytest.raises(ValueError, match="sequence length N = 144"):
            draft(q, k, v, step=0, backend=backend, prefix=5)
        with pytest.raises(qvattn.QvaUnsupportedError, match="capacity"):
            qvattn.attention(q, k, v, method=DRAFT, grid=GRID, prefix_at_end=True,
                             step=0, options={"draft.dense_warmup_steps": 1,
                                              "draft.capacity": 64,
                                              "draft.dense_backend": backend})
        bad = q.clone()
        bad[0, 1, 5, 3] = float("nan")
        with pytest.raises(ValueError, match=r"q\[0,1,5,3\] is not finite"):
            draft(bad, k, v, step=0, backend=backend)
    # grid and capacity: rejected by the library's warm-up decision itself
    # (qva_draft_step_check); the NaN reached SDPA and was rejected before
    # computing (qva_attention_check)
    assert sdpa_calls == [(0, 1)]


def test_cpu_sdpa_warmup_opcheck_and_compile(sdpa_calls):
    q, k, v = make_qkv(N=N, dtype=torch.bfloat16)
    opts = ops.options_string({"draft.dense_warmup_steps": 1, "draft.dense_backend": "sdpa"})
    for layout in ("HND", "NHD"):
        qq, kk, vv = (x if layout == "HND" else x.transpose(1, 2).contiguous()
                      for x in (q, k, v))
        args = (qq, kk, vv, None, DRAFT, layout, 0.0, 0, 0, 4, list(GRID), -1, True,
                opts, 0, 0, False)
        torch.library.opcheck(torch.ops.qvattn.attention.default, args)
    assert sdpa_calls

    def f(q, k, v):
        return draft(q, k, v, step=0, backend="sdpa") * 2

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(g(q, k, v), f(q, k, v), rtol=0, atol=0)


# ------------------------------------------------------------------ CUDA (H200)
need_cuda_draft = pytest.mark.skipif(not cuda_ok(DRAFT),
                                     reason="no CUDA device / CUDA build with draft")
GGRID = (2, 16, 16)   # 512 video tokens + 64 text tokens (GPU, head dim 128)
GN = 2 * 16 * 16 + 64


def gdraft(q, k, v, step, backend=None, **kw):
    return draft(q, k, v, step, backend, grid=GGRID, **kw)


def _cuda_qkv(layout="HND", dtype=torch.bfloat16, B=1, N=GN):
    return tuple(x.cuda() for x in make_qkv(B=B, H=4, N=N, D=128, dtype=dtype,
                                            layout=layout))


@need_cuda_draft
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_warmup_sdpa_matches_library(sdpa_calls, layout, dtype):
    q, k, v = _cuda_qkv(layout, dtype)
    ctx = qvattn.Context(_ffi.QVA_DEVICE_CUDA)
    lib = gdraft(q, k, v, 0, "qvattn", layout=layout, ctx=ctx)
    assert sdpa_calls == []
    sd = gdraft(q, k, v, 0, None, layout=layout, ctx=ctx)  # the default on CUDA
    assert sdpa_calls == [(0, 1)]
    assert sd.shape == q.shape and sd.dtype == q.dtype and sd.is_contiguous()
    assert sd.device == q.device
    assert rel_l2(sd.float(), lib.float()) < 1e-2
    cpu = draft(*(x.cpu() for x in (q, k, v)), 0, "qvattn", grid=GGRID, layout=layout)
    assert rel_l2(sd.float().cpu(), cpu.float()) < 1e-2


@need_cuda_draft
def test_cuda_sparse_step_stays_on_library(sdpa_calls):
    q, k, v = _cuda_qkv()
    ctx = qvattn.Context(_ffi.QVA_DEVICE_CUDA)
    warm = gdraft(q, k, v, 0, ctx=ctx)
    a = gdraft(q, k, v, 2, ctx=ctx)
    b = gdraft(q, k, v, 2, "qvattn", ctx=ctx)
    assert sdpa_calls == [(0, 1)]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    sd = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert rel_l2(a.float(), sd.float()) > 1e-2  # 85% of the region pairs skipped
    assert rel_l2(warm.float(), sd.float()) < 1e-2
    # return_lse on a warm-up step: the library computes it
    o, lse = gdraft(q, k, v, 0, return_lse=True, ctx=ctx)
    assert len(sdpa_calls) == 1 and lse.shape == (1, 4, GN)
    assert rel_l2(o.float(), warm.float()) < 1e-2


@need_cuda_draft
def test_cuda_warmup_sdpa_with_mask(sdpa_calls):
    q, k, v = _cuda_qkv(B=2, N=GN + 32)
    mask = torch.ones(2, 1, 1, GN + 32, dtype=torch.bool, device="cuda")
    mask[0, ..., GN:] = False
    mask[1, ..., 40:72] = False
    ctx = qvattn.Context(_ffi.QVA_DEVICE_CUDA)
    lib = gdraft(q, k, v, 0, "qvattn", attn_mask=mask, prefix=None, ctx=ctx)
    sd = gdraft(q, k, v, 0, "sdpa", attn_mask=mask, prefix=None, ctx=ctx)
    assert len(sdpa_calls) == 2
    assert rel_l2(sd.float(), lib.float()) < 1e-2


@need_cuda_draft
def test_cuda_warmup_sdpa_stream_and_graph(sdpa_calls):
    q, k, v = _cuda_qkv()
    ctx = qvattn.Context(_ffi.QVA_DEVICE_CUDA)
    eager = gdraft(q, k, v, 0, ctx=ctx)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        side = gdraft(q, k, v, 0, ctx=ctx)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    torch.testing.assert_close(side, eager, rtol=0, atol=0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = gdraft(q, k, v, 0, ctx=ctx)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)
    q.mul_(0.5)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, gdraft(q, k, v, 0, ctx=ctx), rtol=0, atol=0)
    assert len(sdpa_calls) == 4


@need_cuda_draft
def test_cuda_warmup_sdpa_compile(sdpa_calls):
    q, k, v = _cuda_qkv()

    def f(q, k, v):
        return gdraft(q, k, v, 0) * 2

    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v),
                               f(q, k, v), rtol=0, atol=0)
    assert len(sdpa_calls) == 2
