"""Tests of the ctypes binding and qvattn.attention on the CPU (numpy only).

Run from the repository root after building the library:
    QVATTN_LIB=build/libqvattn.so python3 -m pytest -q python/tests
The torch tests at the end run only where torch is installed (the CUDA one
only where the library's CUDA backend supports the method).
"""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    import qvattn
    from qvattn import _ffi
except OSError as e:  # library not built / not found
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)


# ------------------------------------------------------------------ layout
LAYOUT_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "qvattn.h"
#define F(S, f) printf(#S " %s %zu %zu\n", #f, offsetof(S, f), sizeof(((S *)0)->f))
#define Z(S) printf(#S " __size__ %zu %zu\n", sizeof(S), _Alignof(S))
int main(void) {
    Z(qva_tensor);
    F(qva_tensor, data); F(qva_tensor, dtype); F(qva_tensor, device);
    F(qva_tensor, shape); F(qva_tensor, stride);
    Z(qva_vsmooth_params);
    F(qva_vsmooth_params, clusters); F(qva_vsmooth_params, iters);
    F(qva_vsmooth_params, warm_start); F(qva_vsmooth_params, block);
    F(qva_vsmooth_params, schedule); F(qva_vsmooth_params, refresh_every);
    Z(qva_draft_params);
    F(qva_draft_params, lambda); F(qva_draft_params, frac_skip);
    F(qva_draft_params, frac4); F(qva_draft_params, frac8);
    F(qva_draft_params, frac16); F(qva_draft_params, grid_t);
    F(qva_draft_params, grid_h); F(qva_draft_params, grid_w);
    F(qva_draft_params, prefix_tokens); F(qva_draft_params, prefix_at_end);
    F(qva_draft_params, capacity); F(qva_draft_params, dense_warmup_steps);
    F(qva_draft_params, budget); F(qva_draft_params, mass);
    F(qva_draft_params, min_keep); F(qva_draft_params, max_keep);
    F(qva_draft_params, warmup_method); F(qva_draft_params, int8_acc);
    Z(qva_draft_stats);
    F(qva_draft_stats, heads); F(qva_draft_stats, pairs);
    F(qva_draft_stats, kept_mean); F(qva_draft_stats, kept_min);
    F(qva_draft_stats, kept_max);
    Z(qva_config);
    F(qva_config, method); F(qva_config, sm_scale); F(qva_config, hadamard);
    F(qva_config, hadamard_signs); F(qva_config, hadamard_seed);
    F(qva_config, expcast); F(qva_config, q_granularity); F(qva_config, p_sum); F(qva_config, v_code);
    F(qva_config, vsmooth); F(qva_config, draft);
    F(qva_config, layer); F(qva_config, step); F(qva_config, num_steps);
    F(qva_config, check_finite); F(qva_config, k_mean); F(qva_config, v_scale);
    F(qva_config, p_floor);
    F(qva_config, p_max); F(qva_config, skip_fill);
    Z(qva_error_direction);
    F(qva_error_direction, sharpen); F(qva_error_direction, cos);
    Z(qva_error_term_directions);
    F(qva_error_term_directions, full); F(qva_error_term_directions, q);
    F(qva_error_term_directions, k); F(qva_error_term_directions, p);
    F(qva_error_term_directions, v); F(qva_error_term_directions, mu);
    F(qva_error_term_directions, none);
    Z(qva_error_terms);
    F(qva_error_terms, full); F(qva_error_terms, q); F(qva_error_terms, k);
    F(qva_error_terms, p); F(qva_error_terms, v); F(qva_error_terms, mu);
    F(qva_error_terms, none);
    Z(qva_draft_head_report);
    F(qva_draft_head_report, batch); F(qva_draft_head_report, head);
    F(qva_draft_head_report, kept16); F(qva_draft_head_report, kept8);
    F(qva_draft_head_report, kept4); F(qva_draft_head_report, kept_share);
    F(qva_draft_head_report, prefix_mass); F(qva_draft_head_report, mass16);
    F(qva_draft_head_report, mass8); F(qva_draft_head_report, mass4);
    F(qva_draft_head_report, router_mass); F(qva_draft_head_report, oracle_mass);
    F(qva_draft_head_report, ratio); F(qva_draft_head_report, rel_l2);
    Z(qva_draft_report);
    F(qva_draft_report, heads); F(qva_draft_report, regions); F(qva_draft_report, skip);
    F(qva_draft_report, kept_share); F(qva_draft_report, prefix_mass);
    F(qva_draft_report, mass16); F(qva_draft_report, mass8); F(qva_draft_report, mass4);
    F(qva_draft_report, router_mass); F(qva_draft_report, oracle_mass);
    F(qva_draft_report, ratio); F(qva_draft_report, ratio_min);
    F(qva_draft_report, ratio_min_head); F(qva_draft_report, rel_l2);
    Z(qva_synthetic_spec);
    F(qva_synthetic_spec, name); F(qva_synthetic_spec, B); F(qva_synthetic_spec, H);
    F(qva_synthetic_spec, D); F(qva_synthetic_spec, grid_t); F(qva_synthetic_spec, grid_h);
    F(qva_synthetic_spec, grid_w); F(qva_synthetic_spec, prefix_tokens);
    F(qva_synthetic_spec, seed); F(qva_synthetic_spec, recipe);
    TIMINGS
    return 0;
}
"""
LAYOUT_TIMINGS = """Z(qva_timings);
    F(qva_timings, grouping_ms); F(qva_timings, prep_ms);
    F(qva_timings, kernel_ms);"""

PY_STRUCTS = {
    "qva_tensor": _ffi.QvaTensor,
    "qva_vsmooth_params": _ffi.QvaVsmoothParams,
    "qva_draft_params": _ffi.QvaDraftParams,
    "qva_draft_stats": _ffi.QvaDraftStats,
    "qva_config": _ffi.QvaConfig,
    "qva_error_terms": _ffi.QvaErrorTerms,
    "qva_error_direction": _ffi.QvaErrorDirection,
    "qva_error_term_directions": _ffi.QvaErrorTermDirections,
    "qva_draft_head_report": _ffi.QvaDraftHeadReport,
    "qva_draft_report": _ffi.QvaDraftReport,
    "qva_synthetic_spec": _ffi.QvaSyntheticSpec,
}


def _header_has_timings():
    with open(os.path.join(ROOT, "include", "qvattn.h")) as f:
        return "qva_timings" in f.read()


if _header_has_timings():
    PY_STRUCTS["qva_timings"] = _ffi.QvaTimings


def _c_layout(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "layout.c"
    exe = tmp_path / "layout"
    src.write_text(LAYOUT_C.replace(
        "TIMINGS", LAYOUT_TIMINGS if "qva_timings" in PY_STRUCTS else ""))
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I",
                    os.path.join(ROOT, "include"), str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True,
                         text=True).stdout
    layout = {}
    for line in out.splitlines():
        struct, field, a, b = line.split()
        layout.setdefault(struct, {})[field] = (int(a), int(b))
    return layout


def test_struct_layout_matches_c(tmp_path):
    layout = _c_layout(tmp_path)
    assert set(layout) == set(PY_STRUCTS)
    for name, cls in PY_STRUCTS.items():
        c = layout[name]
        size, align = c.pop("__size__")
        assert ctypes.sizeof(cls) == size, name
        assert ctypes.alignment(cls) == align, name
        py_fields = [f[0] for f in cls._fields_]
        # same fields, same order (lambda is lambda_ in Python)
        assert [f.rstrip("_") for f in py_fields] == list(c), name
        for f in py_fields:
            off, sz = c[f.rstrip("_")]
            desc = getattr(cls, f)
            assert (desc.offset, desc.size) == (off, sz), f"{name}.{f}"
        assert _ffi.EXPECTED_SIZES[name] == size, name


def test_config_default_roundtrip():
    cfg = _ffi.config_default()
    assert cfg.method == _ffi.QVA_METHOD_VC8 and cfg.expcast == 1
    assert cfg.vsmooth.block == 128 and cfg.draft.capacity == 128
    assert abs(cfg.draft.lambda_ - 0.2) < 1e-7 and cfg.check_finite == 1
    for name in ["exact", "bf16", "fp8", "sage8", "sage8+nohadamard+fp32sum", "vc8+expcast",
                 "sage4", "vc4", "draft@85/0/7.5/7.5", "draft@p95",
                 "draft@p99.5/0/50/50", "draft@p90+expcast", "vc8+expcast-centred",
                 "sage8+expcast-e5m2"]:
        _ffi.config_set_method(cfg, name)
        assert _ffi.config_method_name(cfg) == name
    _ffi.config_set_method(cfg, "sage8")  # rotates and sums its codes by default
    assert cfg.hadamard == 1 and cfg.p_sum == 1
    _ffi.config_set_method(cfg, "sage8+hadamard+codesum")
    assert _ffi.config_method_name(cfg) == "sage8"
    _ffi.config_set_method(cfg, "draft@p95/0/0/100")  # the short form is canonical
    assert _ffi.config_method_name(cfg) == "draft@p95"
    assert cfg.draft.budget == 1 and abs(cfg.draft.mass - 0.95) < 1e-7
    _ffi.config_set_method(cfg, "draft@85/0/0/15")
    assert cfg.draft.budget == 0
    assert "qvattn" in _ffi.build_info()
    assert _ffi.status_string(_ffi.QVA_ERR_SHAPE) == "shape mismatch"


def test_tensor_helpers_match_c():
    t = _ffi.tensor_nhd(None, _ffi.QVA_BF16, _ffi.QVA_DEVICE_CPU, 2, 3, 5, 64)
    assert list(t.shape) == [2, 3, 5, 64]
    assert list(t.stride) == [5 * 3 * 64, 64, 3 * 64, 1]
    x = np.zeros((2, 5, 3, 64), np.float16)  # NHD memory
    d, dev = qvattn.describe(x, "NHD")
    assert dev == _ffi.QVA_DEVICE_CPU and d.dtype == _ffi.QVA_F16
    assert list(d.shape) == list(t.shape) and list(d.stride) == list(t.stride)


# ------------------------------------------------------------------ attention
def make_qkv(B=1, H=2, N=300, D=64, Nk=None, seed=1):
    """DiT-like data: a common key offset, a per-head value mean, sharp-ish q."""
    r = np.random.default_rng(seed)
    Nk = N if Nk is None else Nk
    q = 2.0 * r.standard_normal((B, H, N, D))
    k = r.standard_normal((B, H, Nk, D)) + 0.5
    v = r.standard_normal((B, H, Nk, D)) + r.standard_normal((B, H, 1, D))
    return tuple(np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))


def reference(q, k, v, sm_scale=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scale = sm_scale if sm_scale else 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bhnd,bhmd->bhnm", q, k) * scale
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    return np.einsum("bhnm,bhmd->bhnd", p / l, v), (np.log(l) + m)[..., 0]


def rel_l2(a, ref):
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


BOUNDS = {"exact": 1e-6, "bf16": 1e-2, "sage8": 6e-2, "vc8": 6e-2,
          "vc8+expcast": 6e-2, "sage8+nohadamard+fp32sum": 6e-2}


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("method", list(BOUNDS))
def test_attention_vs_reference(method, D):
    q, k, v = make_qkv(D=D)
    ref, _ = reference(q, k, v)
    out = qvattn.attention(q, k, v, method=method)
    assert out.shape == q.shape and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) < BOUNDS[method], method


def test_lse_and_sm_scale():
    q, k, v = make_qkv(N=200)
    ref, ref_lse = reference(q, k, v, sm_scale=0.05)
    out, lse = qvattn.attention(q, k, v, method="exact", sm_scale=0.05,
                                return_lse=True)
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    assert rel_l2(out, ref) < 1e-6
    assert np.max(np.abs(lse - ref_lse)) < 1e-4


def test_cross_attention():
    q, k, v = make_qkv(N=64, Nk=320)
    ref, _ = reference(q, k, v)
    assert rel_l2(qvattn.attention(q, k, v, method="sage8"), ref) < 6e-2
    with pytest.raises(ValueError):  # V-Smooth is self-attention only
        qvattn.attention(q, k, v, method="vc8")


@pytest.mark.parametrize("method", ["exact", "bf16", "sage8", "vc8+expcast"])
def test_hnd_nhd_agree(method):
    q, k, v = make_qkv(B=2, H=3, N=200)
    hnd = qvattn.attention(q, k, v, method=method)
    nq, nk, nv = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    nhd = qvattn.attention(nq, nk, nv, method=method, layout="NHD",
                           ctx=qvattn.Context())
    assert nhd.shape == nq.shape and nhd.flags.c_contiguous
    np.testing.assert_allclose(nhd.transpose(0, 2, 1, 3), hnd, rtol=0, atol=1e-6)
    # a strided view of NHD memory passed as HND: no copy, same answer
    view = qvattn.attention(*(x.transpose(0, 2, 1, 3) for x in (nq, nk, nv)),
                            method=method, ctx=qvattn.Context())
    np.testing.assert_allclose(view, hnd, rtol=0, atol=1e-6)


def test_float16_inputs():
    q, k, v = (x.astype(np.float16) for x in make_qkv(D=128))
    ref, _ = reference(q, k, v)
    out = qvattn.attention(q, k, v, method="bf16")
    assert out.dtype == np.float16 and rel_l2(out, ref) < 1e-2


def test_vsmooth_schedule_uses_context():
    q, k, v = make_qkv(N=256)
    ref, _ = reference(q, k, v)
    with qvattn.Context() as ctx:
        cfg = _ffi.make_config("vc8+expcast")
        assert _ffi.schedule_action(cfg, 0, 40) == "group"
        assert _ffi.schedule_action(cfg, 1, 40) == "reuse"
        assert _ffi.schedule_action(cfg, 12, 40) == "plain"
        o0 = qvattn.attention(q, k, v, layer=3, step=0, num_steps=40, ctx=ctx)
        o1 = qvattn.attention(q, k, v, layer=3, step=1, num_steps=40, ctx=ctx)
        o12 = qvattn.attention(q, k, v, layer=3, step=12, num_steps=40, ctx=ctx)
        # reuse of the permutation grouped on the same data: the same result
        np.testing.assert_array_equal(o0, o1)
        for o in (o0, o12):
            assert rel_l2(o, ref) < 6e-2
        ctx.reset()
        with pytest.raises(ValueError):  # step outside the schedule
            qvattn.attention(q, k, v, step=40, num_steps=40, ctx=ctx)


def test_profiling_on_cpu():
    if not qvattn.Context.has_profiling():
        pytest.skip("library predates qva_context_set_profiling")
    q, k, v = make_qkv(N=256)
    with qvattn.Context() as ctx:
        ctx.set_profiling(True)
        qvattn.attention(q, k, v, method="sage8", ctx=ctx)
        t = ctx.last_timings()
        assert set(t) == {"grouping_ms", "prep_ms", "kernel_ms"}
        assert t["kernel_ms"] > 0  # the CPU puts the whole call here


def test_adaptive_draft_budget_on_cpu():
    """draft@pM on the CPU: the kept share varies per head within the
    options' floor and cap; CUDA runs it too where it runs draft."""
    T, H, W = 2, 16, 16  # R = 4 regions, 16 pairs per head
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 3, T * H * W, 64)).astype(np.float32)
               for _ in range(3))
    with qvattn.Context() as ctx:
        qvattn.attention(q, k, v, method="draft@p90", grid=(T, H, W), ctx=ctx)
        st = ctx.last_draft_stats()
        assert st["heads"] == 3 and st["pairs"] == 16
        assert 0 < st["kept_min"] <= st["kept_mean"] <= st["kept_max"] <= 1
        qvattn.attention(q, k, v, method="draft@p90", grid=(T, H, W), ctx=ctx,
                         options={"draft.min_keep": 0.5, "draft.max_keep": 0.5})
        st = ctx.last_draft_stats()
        assert st["kept_min"] == st["kept_max"] == 0.5
        qvattn.attention(q, k, v, method="sage8", ctx=ctx)
        assert ctx.last_draft_stats()["heads"] == 0
        with pytest.raises(qvattn.QvaValueError, match="min_keep"):
            qvattn.attention(q, k, v, method="draft@p90", grid=(T, H, W), ctx=ctx,
                             options={"draft.min_keep": 0.6, "draft.max_keep": 0.5})
    ok, why = _ffi.supports(_ffi.QVA_DEVICE_CUDA, _ffi.make_config("draft@p90"), 0, 128)
    assert ok == bool(_ffi.cuda_available()), why


# ------------------------------------------------------------------ errors
def test_bad_inputs_raise_value_error():
    q, k, v = make_qkv(N=130)
    with pytest.raises(ValueError, match="unknown method"):
        qvattn.attention(q, k, v, method="sage9")
    with pytest.raises(ValueError, match="expcast"):
        qvattn.attention(q, k, v, method="bf16+expcast")
    with pytest.raises(ValueError, match="same heads"):
        qvattn.attention(q, k[:, :1].copy(), v, method="exact")
    with pytest.raises(ValueError, match="tokens"):
        qvattn.attention(q, k, v[:, :, :100].copy(), method="exact")
    q160, k160, v160 = make_qkv(N=130, D=160)  # D <= 128 is zero-padded
    with pytest.raises(ValueError, match="160"):
        qvattn.attention(q160, k160, v160, method="exact")
    bad = q.copy()
    bad[0, 1, 7, 3] = np.nan
    with pytest.raises(ValueError, match="not finite") as ei:
        qvattn.attention(bad, k, v, method="sage8")
    assert ei.value.status == _ffi.QVA_ERR_NONFINITE
    kinf = k.copy()
    kinf[0, 0, 0, 0] = np.inf
    with pytest.raises(ValueError):
        qvattn.attention(q, kinf, v, method="exact")
    with pytest.raises(ValueError):
        qvattn.attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError):
        qvattn.attention(q, k, v, layout="NDH")
    with pytest.raises(ValueError):
        qvattn.attention(q[0], k[0], v[0])
    with pytest.raises(ValueError):
        qvattn.attention(q, k, v, sm_scale=-1.0)
    with pytest.raises(TypeError):
        qvattn.attention(q.tolist(), k, v)


def test_raw_errors_carry_last_error():
    q, k, v = make_qkv(N=64)
    cfg = _ffi.make_config("exact")
    tq, _ = qvattn.describe(q)
    tk, _ = qvattn.describe(k[:, :, :32].copy())
    tv, _ = qvattn.describe(v)
    out = np.empty_like(q)
    to, _ = qvattn.describe(out)
    with qvattn.Context() as ctx:
        with pytest.raises(qvattn.QvaValueError) as ei:
            _ffi.attention_raw(ctx, cfg, tq, tk, tv, to)
        assert ei.value.status == _ffi.QVA_ERR_SHAPE
        assert "32" in str(ei.value) and ei.value.message == _ffi.last_error()
        assert _ffi.attention_status(ctx, cfg, tq, tk, tv, to) == _ffi.QVA_ERR_SHAPE


def test_attention_check_is_qva_attentions_validation():
    """qva_attention_check gives qva_attention's errors without computing."""
    q, k, v = make_qkv(N=64)
    out = np.empty_like(q)
    tq, tk, tv, to = (qvattn.describe(x)[0] for x in (q, k, v, out))
    cpu = _ffi.QVA_DEVICE_CPU

    def both(cfg, k=tk, v=tv):
        with qvattn.Context() as ctx:
            ran = _ffi.attention_status(ctx, cfg, tq, k, v, to)
        return _ffi.attention_check_status(cpu, cfg, tq, k, v, to), ran

    assert both(_ffi.make_config("sage8")) == (_ffi.QVA_OK, _ffi.QVA_OK)
    _ffi.attention_check(cpu, _ffi.make_config("sage8"), tq, tk, tv)  # out, lse: None
    assert both(_ffi.make_config("sage8", step=4, num_steps=4)) == \
        (_ffi.QVA_ERR_INVALID_ARGUMENT,) * 2
    with pytest.raises(qvattn.QvaValueError, match="outside the 4-step schedule"):
        _ffi.attention_check(cpu, _ffi.make_config("vc8", step=4, num_steps=4), tq, tk, tv)
    short = [x[:, :, :32].copy() for x in (k, v)]  # alive while described
    k32, v32 = (qvattn.describe(x)[0] for x in short)
    for method in ("vc8", "vc4", "draft@85/0/0/15"):  # self-attention methods
        assert both(_ffi.make_config(method), k32, v32) == (_ffi.QVA_ERR_SHAPE,) * 2, method
    assert both(_ffi.make_config("sage8"), k32, v32) == (_ffi.QVA_OK, _ffi.QVA_OK)
    bad = q.copy()
    bad[0, 1, 7, 3] = np.nan
    tb, _ = qvattn.describe(bad)
    with pytest.raises(qvattn.QvaValueError, match=r"q\[0,1,7,3\] is not finite") as ei:
        _ffi.attention_check(cpu, _ffi.make_config("exact"), tb, tk, tv, func="f")
    assert ei.value.status == _ffi.QVA_ERR_NONFINITE and str(ei.value).startswith("f: ")
    assert _ffi.attention_check_status(cpu, _ffi.make_config("exact", check_finite=0),
                                       tb, tk, tv) == _ffi.QVA_OK
    assert _ffi.attention_check_status(_ffi.QVA_DEVICE_CUDA, _ffi.make_config("exact"),
                                       tq, tk, tv) == _ffi.QVA_ERR_INVALID_ARGUMENT
    assert "cpu" in _ffi.last_error()  # the tensors are on the CPU


@pytest.mark.skipif(_ffi.cuda_available(), reason="a CUDA device is present")
def test_cuda_context_without_device():
    with pytest.raises(RuntimeError) as ei:
        qvattn.Context(_ffi.QVA_DEVICE_CUDA)
    assert isinstance(ei.value, qvattn.QvaUnsupportedError)
    ok, why = _ffi.supports(_ffi.QVA_DEVICE_CUDA, _ffi.make_config("sage8"),
                            _ffi.QVA_BF16, 128)
    assert not ok and why


# ------------------------------------------------------------------ torch (optional)
def test_torch_cpu_matches_numpy():
    torch = pytest.importorskip("torch")
    q, k, v = make_qkv(D=128)
    ref, _ = reference(q, k, v)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    out = qvattn.attention(tq, tk, tv, method="sage8")
    np.testing.assert_array_equal(out.numpy(), qvattn.attention(q, k, v, method="sage8"))
    bq, bk, bv = (x.to(torch.bfloat16) for x in (tq, tk, tv))
    ob = qvattn.attention(bq, bk, bv, method="bf16")
    assert ob.dtype == torch.bfloat16
    assert rel_l2(ob.float().numpy(), ref) < 1e-2


@pytest.mark.parametrize("method", ["bf16", "sage8", "vc8+expcast"])
def test_torch_cuda_matches_cpu(method):
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and _ffi.cuda_available()):
        pytest.skip("no CUDA")
    ok, why = _ffi.supports(_ffi.QVA_DEVICE_CUDA, _ffi.make_config(method),
                            _ffi.QVA_BF16, 128)
    if not ok:
        pytest.skip(f"cuda: {why}")
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16) for x in make_qkv(N=384, D=128))
    cpu = qvattn.attention(q, k, v, method=method, ctx=qvattn.Context())
    gpu = qvattn.attention(q.cuda(), k.cuda(), v.cuda(), method=method,
                           ctx=qvattn.Context(_ffi.QVA_DEVICE_CUDA))
    torch.cuda.synchronize()
    assert gpu.is_cuda and gpu.dtype == torch.bfloat16
    assert rel_l2(gpu.float().cpu().numpy(), cpu.float().numpy().astype(np.float64)) < 2e-2


def test_synthetic_workloads():
    """qvattn.synthetic: the library's presets as float32 HND arrays, seeded
    and deterministic; unknown names raise with the list of presets."""
    import numpy as np
    import qvattn
    names = qvattn.synthetic_presets()
    assert "tiny" in names and "video-mixed" in names
    w = qvattn.synthetic("tiny")
    assert w["q"].shape == (1, 2, 128, 64) and w["q"].dtype == np.float32
    assert w["grid"] == (2, 8, 8) and w["prefix"] == 0 and w["name"] == "tiny"
    again = qvattn.synthetic("tiny")
    assert all(np.array_equal(w[x], again[x]) for x in "qkv")
    other = qvattn.synthetic("tiny", seed=w["seed"] + 1)
    assert other["seed"] == w["seed"] + 1 and not np.array_equal(w["q"], other["q"])
    p = qvattn.synthetic("wan-small-prefix")
    assert p["prefix"] == 64 and p["q"].shape[2] == 64 + 4 * 16 * 24
    with pytest.raises(qvattn.QvaValueError, match="presets: tiny"):
        qvattn.synthetic("no-such-preset")
    # heads: the first heads of the same workload (each head drawn on its own)
    mixed = qvattn.synthetic("video-mixed")
    one = qvattn.synthetic("video-mixed", heads=1)
    assert one["q"].shape[1] == 1
    assert all(np.array_equal(one[x][:, :1], mixed[x][:, :1]) for x in "qkv")
    assert qvattn.synthetic("tiny", heads=99)["q"].shape[1] == 2
    with pytest.raises(ValueError, match="heads"):
        qvattn.synthetic("tiny", heads=0)
