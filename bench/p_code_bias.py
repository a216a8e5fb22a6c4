#!/usr/bin/env python3
"""The probability code alone: its error and that error's sign.

For each synthetic preset, exact softmax weights p = 2^u (u = log2 of the
weight relative to the row max, from bf16-rounded q and k in float64) are
replaced by a code's decoded value, normalised by the decoded sum (as the
kernels' code sum does), and multiplied by exact V.  So only P's code
differs from exact attention.  Codes:

  expcast-e4m3   ExpCast (VC Eq. 7): code = rint(8u + 120 + beta), E4M3,
                 beta = -0.45 (the centred beta, QVA_EXPCAST_BETA_CENTRED);
                 codes below 0.5 are 0, codes 1-7 E4M3 subnormals: weights
                 below 2^-14.94 of the max are lost (docs/NUMERICS.md, 7)
  expcast-e5m2   the same construction in E5M2 (4 codes per binade,
                 code = rint(4u + 120 + beta5), 120 = 2^15): 29 binades of
                 normal range, half the mantissa; beta5 centres the mean
                 decoded/exact ratio as beta does for E4M3
  cast-e4m3      exp2 then E4M3 round-to-nearest (the sage8/vc8 path,
                 max at 2^8.807 = 448, subnormals down to 2^-17.8)

Reported: rel-L2 against exact attention and the error's direction
(qvattn.error_direction: sharpen, cos).  A study of codes, not a method:
no kernel runs E5M2 P.  The row max is global here; the kernels code
against the running max of the blocks seen so far, which only raises u.

    python3 bench/p_code_bias.py
"""
import argparse
import ctypes
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402
from k_granularity import bf16  # noqa: E402
from pv_formats import e4m3  # noqa: E402

DEFAULT_PRESETS = "video-global,video-local-clustered,video-mixed,wan-small"
BETA_E4M3 = -0.45


def e4m3_value(c):
    c = c.astype(np.int64)
    e, m = c >> 3, c & 7
    return np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7))


def e5m2_value(c):
    c = c.astype(np.int64)
    e, m = c >> 2, c & 3
    return np.where(e == 0, m * 2.0 ** -16, (1 + m / 4) * 2.0 ** (e - 15))


def expcast_codes(u, per_binade, beta):
    """rint(per_binade * u + 120 + beta), clamped to [0, 120] (u <= 0)."""
    t = np.minimum(per_binade * u + (120.0 + beta), 120.0)
    return np.where(t >= 0, np.rint(t), 0)


def expcast_weights(u, fmt, beta):
    per, value = (8.0, e4m3_value) if fmt == "e4m3" else (4.0, e5m2_value)
    return value(expcast_codes(u, per, beta)) / value(np.array([120]))[0]


def cast_e4m3_weights(u):
    return e4m3(np.exp2(u + 8.807)) / 448.0


def centred_beta5():
    """beta for E5M2 ExpCast whose mean decoded/exact ratio over one
    period of u is closest to 1 (grid of 0.01)."""
    u = -np.linspace(0, 4, 40001)[:-1]
    best = min(np.arange(-0.5, 0.5, 0.01),
               key=lambda b: abs((expcast_weights(u, "e5m2", b) / np.exp2(u)).mean() - 1))
    return float(best)


def check_against_library(qvattn):
    """The emulated E4M3 ExpCast codes equal qva_expcast_e4m3_beta's."""
    f = qvattn._ffi.lib.qva_expcast_e4m3_beta
    f.restype, f.argtypes = ctypes.c_uint8, [ctypes.c_float, ctypes.c_float]
    u = -np.linspace(0, 17, 4097).astype(np.float32)
    lib = np.array([f(float(x), BETA_E4M3) for x in u])
    emu = expcast_codes(u.astype(np.float64), 8.0, BETA_E4M3)
    bad = int((lib != emu).sum())
    if bad:
        sys.exit(f"p_code_bias: {bad} of {len(u)} emulated ExpCast codes differ from the library's")


def codes_of(beta5):
    return {"expcast-e4m3": lambda u: expcast_weights(u, "e4m3", BETA_E4M3),
            "expcast-e5m2": lambda u: expcast_weights(u, "e5m2", beta5),
            "cast-e4m3": cast_e4m3_weights}


def preset_row(qvattn, name, codes):
    """{code: {"rel_l2", "sharpen", "cos"}} on one preset (bf16 inputs)."""
    w = qvattn.synthetic(name)
    q, k, v = (bf16(w[x]).astype(np.float64) for x in "qkv")
    s = np.einsum("bhnd,bhmd->bhnm", q, k) / np.sqrt(q.shape[-1])
    u = (s - s.max(-1, keepdims=True)) / np.log(2.0)
    p = np.exp2(u)
    ref = np.einsum("bhnm,bhmd->bhnd", p / p.sum(-1, keepdims=True), v)
    row = {}
    for label, code in codes.items():
        pc = code(u)
        out = np.einsum("bhnm,bhmd->bhnd", pc / pc.sum(-1, keepdims=True), v)
        d = qvattn.error_direction(out.astype(np.float32), ref.astype(np.float32),
                                   v.astype(np.float32))
        row[label] = dict(d, rel_l2=float(np.linalg.norm(out - ref) / np.linalg.norm(ref)))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    check_against_library(qvattn)
    b5 = centred_beta5()
    codes = codes_of(b5)
    print(f"E5M2 ExpCast: centred beta5 = {b5:+.2f}")
    print("| preset | " + " | ".join(codes) + " |")
    print("|---|" + "---|" * len(codes))
    for name in [p for p in args.presets.split(",") if p]:
        row = preset_row(qvattn, name, codes)
        cells = [f"{r['rel_l2']:.2e}, {r['sharpen']:+.1e} ({r['cos']:+.2f})" for r in row.values()]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("\ncells: rel-L2 against exact, sharpen (cos)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
