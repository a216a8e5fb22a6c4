"""qvattn.error_terms: the Python face of qva_error_terms_compute.

Python only converts types; what each term means and every check is the
library's (tests/test_decompose.c).  Here: the dict, its agreement with
qvattn.attention, layouts and dtypes, and that the library's errors come
through as the usual exceptions.
"""
import math

import pytest

np = pytest.importorskip("numpy")

try:
    import qvattn
    from qvattn import _ffi
except OSError as e:  # library not built / not found
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)

if not _ffi.has_symbol("qva_error_terms_compute"):
    pytest.skip("this libqvattn has no qva_error_terms_compute", allow_module_level=True)

KEYS = {"full", "q", "k", "p", "v", "mu", "none"}


def make_qkv(H=2, N=200, D=64, seed=3):
    r = np.random.default_rng(seed)
    q = 1.5 * r.standard_normal((1, H, N, D))
    k = r.standard_normal((1, H, N, D)) + 0.5
    v = r.standard_normal((1, H, N, D)) + r.standard_normal((1, H, 1, D))
    return tuple(np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))


def same(a, b):
    """Equal dicts of terms, NaN equal to NaN (a term that does not apply)."""
    return a.keys() == b.keys() and all(
        a[n] == b[n] or (math.isnan(a[n]) and math.isnan(b[n])) for n in a)


def rel_l2(a, ref):
    a, ref = (np.asarray(x, np.float64) for x in (a, ref))
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("method", ["sage8", "vc8+expcast", "fp8"])
def test_full_is_the_methods_error(method):
    q, k, v = make_qkv()
    t = qvattn.error_terms(q, k, v, method=method)
    assert set(t) == KEYS
    exact = qvattn.attention(q, k, v, method="exact")
    out = qvattn.attention(q, k, v, method=method)
    assert t["full"] == pytest.approx(rel_l2(out, exact), rel=1e-9)
    singles = [t[n] for n in ("q", "k", "p", "v")]
    assert all(0 < x < t["full"] * 1.1 for x in singles)
    assert t["none"] < 1e-5
    assert math.isnan(t["mu"]) == (not method.startswith("vc"))


def test_layout_and_dtype():
    q, k, v = make_qkv()
    t = qvattn.error_terms(q, k, v, method="sage8")
    nhd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    assert same(qvattn.error_terms(*nhd, method="sage8", layout="NHD"), t)
    half = qvattn.error_terms(*(x.astype(np.float16) for x in (q, k, v)), method="sage8")
    assert all(math.isfinite(half[n]) for n in ("full", "q", "k", "p", "v"))


def test_options_and_sm_scale_reach_the_config():
    q, k, v = make_qkv()
    a = qvattn.error_terms(q, k, v, method="vc8")
    b = qvattn.error_terms(q, k, v, method="vc8", options={"vsmooth.clusters": 4})
    c = qvattn.error_terms(q, k, v, method="vc8", sm_scale=0.05)
    assert a["v"] != b["v"] and a["mu"] != b["mu"]  # another grouping of the values
    assert c["full"] != a["full"]


@pytest.mark.parametrize("method,pattern", [("exact", "nothing"), ("bf16", "not decomposed")])
def test_unsupported_methods(method, pattern):
    q, k, v = make_qkv(N=130)
    with pytest.raises(qvattn.QvaUnsupportedError, match=pattern):
        qvattn.error_terms(q, k, v, method=method)


def test_bad_inputs_raise_value_errors():
    q, k, v = make_qkv(N=130)
    with pytest.raises(ValueError):
        qvattn.error_terms(q, k, v, method="sage9")
    with pytest.raises(ValueError, match="agree"):
        qvattn.error_terms(q[..., :32].copy(), k, v, method="sage8")
    q[0, 0, 3, 5] = np.nan
    with pytest.raises(qvattn.QvaValueError, match="not finite"):
        qvattn.error_terms(q, k, v, method="sage8")


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    q, k, v = make_qkv()
    t32 = qvattn.error_terms(*(torch.from_numpy(x) for x in (q, k, v)), method="sage8")
    assert same(t32, qvattn.error_terms(q, k, v, method="sage8"))
    tb = qvattn.error_terms(*(torch.from_numpy(x).bfloat16() for x in (q, k, v)),
                            method="vc8+expcast")
    assert all(math.isfinite(tb[n]) for n in ("full", "q", "k", "p", "v", "mu"))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            qvattn.error_terms(*(torch.from_numpy(x).cuda() for x in (q, k, v)),
                               method="sage8")
