"""bench/p_floor_mass.py: the masses are a direct per-key count of the
softmax below each floor, ordered by floor, and they grow with the
sequence (the reason the script exists)."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import qvattn  # noqa: E402,F401
import p_floor_mass as pfm  # noqa: E402


def test_row_masses_match_a_direct_count():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 16)).astype(np.float32) * 3
    k = rng.standard_normal((200, 16)).astype(np.float32) * 3
    floors = [-2.0, -6.0, -10.0]
    got = pfm.row_masses(q, k, floors)
    for i in range(3):
        s = [float(np.dot(q[i].astype(np.float64), k[j].astype(np.float64))) / 4.0
             for j in range(200)]
        m = max(s)
        p = [np.exp(x - m) for x in s]
        for c, f in enumerate(floors):
            want = sum(w for x, w in zip(s, p) if (x - m) / np.log(2) < f) / sum(p)
            assert abs(got[i, c] - want) < 1e-12
    assert (np.diff(got, axis=1) <= 0).all() and (got >= 0).all() and (got < 1).all()


def test_mass_below_the_floor_grows_with_the_sequence():
    small = pfm.study(qvattn, "wan-small", heads=1, rows=32, seed=None)
    large = pfm.study(qvattn, "longcat-480p", heads=1, rows=32, seed=None)
    assert small["tokens"] < large["tokens"]
    dropped = [n for n, _ in pfm.FLOORS].index("ExpCast E4M3 dropped")
    assert large["mean"][dropped] > 5 * small["mean"][dropped] > 0


def test_flush_error_is_a_sharpening_that_vanishes_below_every_weight():
    """Dropping the small weights moves each row toward its large ones
    (cos with ref - mean(V) > 0), and a floor below every weight changes
    nothing."""
    q, k, v = pfm.generate(qvattn, "wan-small", heads=1)
    e = pfm.flush_errors(q[0, :32], k[0], v[0], [-14.94, -1e9])
    rel = np.sqrt(e[:, 0] / e[:, 1])
    cos = e[:, 2] / np.sqrt(e[:, 0] * e[:, 3] + 1e-300)
    assert 1e-5 < rel[0] < 1e-1 and cos[0] > 0.5
    assert rel[1] == 0.0


def test_method_rows_compare_the_sampled_rows_with_fp64():
    """The library's exact method matches the script's FP64 rows; an 8-bit
    method does not, by a plausible margin."""
    res = dict((m, (rel, cos)) for m, rel, _, cos in
               pfm.method_rows(qvattn, "tiny", heads=1, rows=16, seed=None,
                               methods=["exact", "sage8"]))
    assert res["exact"][0] < 1e-5
    assert 1e-3 < res["sage8"][0] < 0.1


def test_block_mean_restore_matches_a_direct_sum_and_helps():
    """The block means are the means of each run of 128 keys (the last run
    shorter), and giving the dropped keys their block's mean of V takes a
    long preset's flush error down more than tenfold."""
    rng = np.random.default_rng(2)
    v = rng.standard_normal((300, 4))
    mu, blk = pfm.block_means(v)
    assert mu.shape == (3, 4) and np.allclose(mu[2], v[256:].mean(axis=0))
    q, k, v = pfm.generate(qvattn, "longcat-480p", heads=1)
    plain = pfm.flush_errors(q[0, :16], k[0], v[0], [-14.94])
    back = pfm.flush_errors(q[0, :16], k[0], v[0], [-14.94], restore=True)
    assert back[0, 0] < 0.1 * plain[0, 0]


def test_code_emulation_matches_the_library_codes_and_the_floor_helps():
    """The emulated ExpCast codes are the library's (qva_expcast_e4m3_beta
    at the centred beta, on a grid of u), and on a row set with mass
    under the floor every +floormass form has less P error than ExpCast's
    own code, the code < 8 mask less than the code-0 one."""
    import ctypes
    code = qvattn._ffi.lib.qva_expcast_e4m3_beta
    code.argtypes, code.restype = [ctypes.c_float, ctypes.c_float], ctypes.c_uint8
    u = -np.linspace(0.0, 30.0, 2001)
    lib = np.array([code(float(x), -0.45) for x in u])
    assert (pfm.expcast_codes(u) == lib).mean() > 0.999
    assert pfm.E4M3_VALUES[120] == 256.0 and pfm.E4M3_VALUES[8] == 2.0**-6
    q, k, v = pfm.generate(qvattn, "video-global", heads=1)
    e = pfm.code_errors(q[0, :64], k[0], v[0])
    rel = dict(zip(pfm.CODE_FORMS, np.sqrt(e[:, 0] / e[:, 1])))
    assert rel["+floor, code 0, head mean"] < rel["ExpCast E4M3"]
    assert rel["+floor, code < 8, head mean"] < rel["+floor, code 0, head mean"]
    assert rel["+floor, code < 8, block means"] < rel["ExpCast E4M3"]
    assert rel["exp2 + floor, code < 8, head mean"] < 1.2 * rel["exp2 E4M3, code sum"]
