"""qvattn.draft_report and qvattn.draft_sweep: the Python face of
qva_draft_report_compute and qva_draft_sweep_compute.

Python only converts types; what each mass means and every check is the
library's (tests/test_draft_report.c).  Here: the dicts, their agreement
with qvattn.attention, layouts and dtypes, the sweep, and that the
library's errors come through as the usual exceptions.
"""
import math

import pytest

np = pytest.importorskip("numpy")

try:
    import qvattn
    from qvattn import _ffi
except OSError as e:  # library not built / not found
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)

if not _ffi.has_symbol("qva_draft_report_compute"):
    pytest.skip("this libqvattn has no qva_draft_report_compute", allow_module_level=True)

GRID, PREFIX = (2, 12, 16), 4  # 2 regions per frame: R = 4, 16 region pairs
HEAD_KEYS = {name for name, _ in _ffi.DRAFT_HEAD_FIELDS}
SUMMARY_KEYS = {name for name, _ in _ffi.DRAFT_REPORT_FIELDS}


def make_qkv(H=2, D=64, seed=5):
    """Prefix rows first, then video tokens whose q and k vary smoothly
    over the grid (local heads)."""
    r = np.random.default_rng(seed)
    t, h, w = GRID
    pos = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"),
                   -1).reshape(-1, 3).astype(np.float64)
    out = []
    for _ in range(H):
        feat = np.cos(pos @ (0.5 * r.standard_normal((3, 8))) + 6.28 * r.random(8))
        a = 0.5 * r.standard_normal((8, D))
        q = feat @ a + 0.3 * r.standard_normal((len(pos), D))
        k = feat @ (0.9 * a + 0.2 * r.standard_normal((8, D))) + 0.3 * r.standard_normal(q.shape)
        pre = r.standard_normal((3, PREFIX, D))
        out.append([np.concatenate([pre[0], q]), np.concatenate([pre[1], k]),
                    np.concatenate([pre[2], r.standard_normal(q.shape)])])
    return tuple(np.ascontiguousarray(np.stack([o[i] for o in out])[None], dtype=np.float32)
                 for i in range(3))


def rel_l2(a, ref):
    a, ref = (np.asarray(x, np.float64) for x in (a, ref))
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def test_report_dict_and_agreement_with_attention():
    q, k, v = make_qkv()
    rep = qvattn.draft_report(q, k, v, method="draft@50/0/25/25", grid=GRID)
    assert set(rep) == {"summary", "heads"}
    s, heads = rep["summary"], rep["heads"]
    assert set(s) == SUMMARY_KEYS and s["heads"] == 2 and s["regions"] == 4
    assert len(heads) == 2 and all(set(h) == HEAD_KEYS for h in heads)
    for i, h in enumerate(heads):
        assert (h["batch"], h["head"]) == (0, i)
        assert h["kept16"] == 4 and h["kept8"] == 4 and h["kept4"] == 0  # 25% of 16 each
        assert 0 < h["prefix_mass"] < h["router_mass"] <= h["oracle_mass"] <= 1
        assert h["ratio"] == pytest.approx(h["router_mass"] / h["oracle_mass"], rel=1e-15)
        assert h["router_mass"] == pytest.approx(
            h["prefix_mass"] + h["mass16"] + h["mass8"] + h["mass4"], abs=1e-12)
    out = qvattn.attention(q, k, v, method="draft@50/0/25/25", grid=GRID)
    exact = qvattn.attention(q, k, v, method="exact")
    assert s["rel_l2"] == pytest.approx(rel_l2(out, exact), rel=1e-9)
    assert s["ratio_min"] == min(h["ratio"] for h in heads)
    assert s["router_mass"] == pytest.approx(np.mean([h["router_mass"] for h in heads]),
                                             rel=1e-15)


def test_dense_config_keeps_everything():
    q, k, v = make_qkv(H=1)
    s = qvattn.draft_report(q, k, v, method="draft@0/0/0/100", grid=GRID)["summary"]
    assert s["kept_share"] == 1 and s["ratio"] == 1
    assert s["router_mass"] == pytest.approx(1, abs=1e-12)


def test_layout_dtype_and_torch():
    q, k, v = make_qkv()
    ref = qvattn.draft_report(q, k, v, grid=GRID)
    nhd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    assert qvattn.draft_report(*nhd, grid=GRID, layout="NHD") == ref
    half = qvattn.draft_report(*(x.astype(np.float16) for x in (q, k, v)), grid=GRID)
    assert all(math.isfinite(h["rel_l2"]) for h in half["heads"])
    torch = pytest.importorskip("torch")
    assert qvattn.draft_report(*(torch.from_numpy(x) for x in (q, k, v)), grid=GRID) == ref
    tb = qvattn.draft_report(*(torch.from_numpy(x).bfloat16() for x in (q, k, v)), grid=GRID)
    assert tb["summary"]["router_mass"] == pytest.approx(ref["summary"]["router_mass"],
                                                         abs=0.02)


def test_sweep():
    q, k, v = make_qkv()
    pts = qvattn.draft_sweep(q, k, v, [0, 50, 85, 100], method="draft@85/0/7.5/7.5", grid=GRID)
    assert [p["summary"]["skip"] for p in pts] == [0, 0.5, 0.85, 1]
    kept = [p["summary"]["kept_share"] for p in pts]
    assert kept == sorted(kept, reverse=True) and kept[0] == 1 and kept[-1] == 0
    assert pts[0]["summary"]["router_mass"] == pytest.approx(1, abs=1e-12)
    assert all(h["kept4"] == 0 and h["kept8"] >= h["kept16"] - 1 for h in pts[1]["heads"])
    rep = qvattn.draft_report(q, k, v, method="draft@85/0/7.5/7.5", grid=GRID)
    assert pts[2]["heads"] == rep["heads"]  # the same route and run as the report
    for p in pts:
        assert all(h["router_mass"] <= h["oracle_mass"] for h in p["heads"])


def test_errors_come_through():
    q, k, v = make_qkv(H=1)
    with pytest.raises(ValueError, match="not a draft config"):
        qvattn.draft_report(q, k, v, method="sage8", grid=GRID)
    with pytest.raises(ValueError, match="grid"):
        qvattn.draft_report(q, k, v)
    with pytest.raises(ValueError, match="sequence length"):
        qvattn.draft_report(q, k, v, grid=(3, 12, 16))
    with pytest.raises(ValueError, match=r"skip\[0\]"):
        qvattn.draft_sweep(q, k, v, [150], grid=GRID)
    q[0, 0, 9, 3] = np.nan
    with pytest.raises(qvattn.QvaValueError, match="not finite"):
        qvattn.draft_report(q, k, v, grid=GRID)
