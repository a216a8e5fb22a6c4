"""The error's direction (qva_error_direction_compute through
qvattn.error_direction, which the fidelity harness's metrics and
bench/fidelity_ops.py call): the signed part of an attention error along
ref - mean(V), which rel-L2 cannot see."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

qvattn = pytest.importorskip("qvattn")
try:
    qvattn._ffi.lib  # noqa: B018  (loads libqvattn)
except Exception as e:  # pragma: no cover - depends on the build
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)
if not qvattn._ffi.has_symbol("qva_error_direction_compute"):
    pytest.skip("this libqvattn has no qva_error_direction_compute", allow_module_level=True)

from fidelity.metrics import error_direction  # noqa: E402


def attention(q, k, v, keep=None):
    """float64 attention; keep(p) -> mask of the probabilities kept (the
    rest are dropped and each row renormalised)."""
    p = torch.softmax(q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
    if keep is not None:
        p = p * keep(p)
        p = p / p.sum(-1, keepdim=True)
    return p @ v.double()


def qkv(h_kv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 96, 32, generator=g, dtype=torch.float64) * 2
    k = torch.randn(1, h_kv, 96, 32, generator=g, dtype=torch.float64)
    v = torch.randn(1, h_kv, 96, 32, generator=g, dtype=torch.float64) + 0.5
    return q, k.repeat_interleave(4 // h_kv, 1), v


def direction_of(out, ref, v):
    """The test's own FP64 form of the definition."""
    out, ref, v = out.double(), ref.double(), v.double()
    d = ref - v.mean(-2, keepdim=True).repeat_interleave(ref.shape[1] // v.shape[1], 1)
    e = out - ref
    ed = float((e * d).sum())
    return {"sharpen": ed / float((d * d).sum()),
            "cos": ed / float(e.norm() * d.norm())}


def test_sharpen_recovers_a_planted_bias_with_sign():
    q, k, v = qkv()
    ref = attention(q, k, v.repeat_interleave(2, 1))
    d = ref - v.mean(-2, keepdim=True).repeat_interleave(2, 1)
    for beta in (0.01, -0.02):
        r = error_direction((ref + beta * d).float(), ref.float(), v.float())
        assert r["sharpen"] == pytest.approx(beta, rel=1e-4)  # out, ref rounded to float32
        assert r["cos"] == pytest.approx(1.0 if beta > 0 else -1.0, abs=1e-4)


def test_noise_orthogonal_to_the_direction_reads_near_zero():
    q, k, v = qkv(h_kv=4)
    ref = attention(q, k, v)
    d = ref - v.mean(-2, keepdim=True)
    e = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    e = e - (e * d).sum() / (d * d).sum() * d
    r = error_direction(ref + 1e-3 * e, ref, v)
    assert abs(r["cos"]) < 1e-3 and abs(r["sharpen"]) < 1e-5  # float32 copies


def test_dropping_small_probabilities_sharpens_and_rounding_noise_does_not():
    # +i8pv's P codes round every key below 1/510 of its block's largest
    # weight to 0 (docs/NUMERICS.md): the rows lose their tails the same way.
    q, k, v = qkv(h_kv=4)
    ref = attention(q, k, v)
    flushed = attention(q, k, v, keep=lambda p: p >= p.amax(-1, keepdim=True) / 510)
    noisy = ref + 1e-3 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(2),
                                     dtype=torch.float64)
    rf, rn = error_direction(flushed, ref, v), error_direction(noisy, ref, v)
    assert (flushed - ref).abs().max() > 1e-4  # the flush did drop mass
    assert rf["sharpen"] > 0 and rf["cos"] > 0.2
    assert abs(rn["cos"]) < 0.05


def test_library_equals_the_definition_on_grouped_heads_and_layouts():
    q, k, v = qkv(h_kv=2, seed=3)
    ref = attention(q, k, v.repeat_interleave(2, 1)).float()
    out = attention(q, k, v.repeat_interleave(2, 1),
                    keep=lambda p: p >= p.amax(-1, keepdim=True) / 300).float()
    want = direction_of(out, ref, v.float())
    got = qvattn.error_direction(out, ref, v.float())
    assert got["sharpen"] == pytest.approx(want["sharpen"], rel=1e-6)
    assert got["cos"] == pytest.approx(want["cos"], rel=1e-6)
    nhd = [x.permute(0, 2, 1, 3) for x in (out, ref, v.float())]
    assert qvattn.error_direction(*nhd, layout="NHD")["cos"] == pytest.approx(got["cos"],
                                                                             rel=1e-12)
    bad = out.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(qvattn.QvaValueError, match="NaN"):
        qvattn.error_direction(bad, ref, v)
    with pytest.raises(ValueError, match="shape"):
        qvattn.error_direction(out[:, :, :5], ref, v)


def test_term_directions_put_i8pv_lean_in_p():
    # qvattn.error_term_directions: the terms equal error_terms', the full
    # term's direction equals error_direction of the method's own output,
    # and +i8pv's lean sits in its P term (its u8 codes drop the tails).
    w = qvattn.synthetic("tiny")
    q, k, v = (torch.from_numpy(w[x]) for x in "qkv")
    terms, dirs = qvattn.error_term_directions(q, k, v, method="sage8+i8pv")
    plain = qvattn.error_terms(q, k, v, method="sage8+i8pv")
    assert all(terms[t] == plain[t] or (terms[t] != terms[t] and plain[t] != plain[t])
               for t in plain)  # equal, NaN (mu) included
    ref = qvattn.attention(q, k, v, method="exact")
    full = qvattn.error_direction(qvattn.attention(q, k, v, method="sage8+i8pv"), ref, v)
    assert dirs["full"]["cos"] == pytest.approx(full["cos"], abs=1e-6)
    assert dirs["p"]["cos"] > 0.5 and abs(dirs["q"]["cos"]) < 0.1 and abs(dirs["k"]["cos"]) < 0.1
    assert dirs["mu"]["cos"] != dirs["mu"]["cos"]  # NaN: sage8 has no means
