#!/usr/bin/env python3
"""What other formats of the PV product would do to its error (issue 15).

The 8-bit methods code P as E4M3 of p * 2^8.807 and V as E4M3 with one
scale per channel (amax / 2.25), and multiply them on FP8 tensor cores.
NUMERICS §7 puts V's term at about 0.8x SageAttention2's whole error on
the global presets, a floor for one E4M3 digit of V.  This models the
quantizers in float64 with Q and K exact (so only the PV product's
operands are coded), sums the squared errors over heads, and prints the
rel-L2 against exact attention of

    v e4m3      V's E4M3 codes (the library's V term; "lib v" must match it)
    v int8      V in INT8 with one scale per channel (amax / 127)
    v diffused  V's E4M3 codes with each key's rounding error carried to
                the next key of the same channel within its 128-key block
                (error diffusion: the coded block sums stay close, so an
                output whose weights vary slowly along the keys gains)
    p e4m3      P's E4M3 codes, the row sum adding the codes (sage8's
                default; "lib p" is the FP32-sum form's, for scale)
    p u8        P as round(255 p), the unsigned INT8 code an INT8 PV
                product would take (P is 1 at the row max, so no scale)
    p u8 blk    P as round(255 p / p_b) * p_b / 255, p_b the row's largest
                p in each 128-key block (the library's +i8pv codes)
    fp8 PV      both E4M3 (the library's form, without Q and K error)
    int8 PV     u8 P and INT8 V (the integer tensor cores' form)
    i8pv        u8 P per block max and INT8 V (+i8pv's product)
    u8 zeros    the share of P's entries that round(255 p) sends to 0
    blk zeros   the same for the per-block codes

The row max is the exact one (the kernels' running max gives the same
codes once a row's max is reached), so "p e4m3" sits near the library's
term, not on it.

    QVATTN_LIB=build-cpu/libqvattn.so python3 bench/pv_formats.py
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402
from k_granularity import bf16, int8_round  # noqa: E402

DEFAULT_PRESETS = "video-global,video-global-d64,video-local-clustered,video-mixed,wan-small"
BLOCK = 128
P_SHIFT = 2.0 ** 8.807  # docs/NUMERICS.md §3: p's codes at exp2(s - m + 8.807)
V_RANGE = 2.25          # QVI_V_E4M3_RANGE: a channel's amax codes as 2.25
UNROTATED = "sage8+nohadamard+fp32sum"  # V and P coded as modelled here


def e4m3(x):
    """Round to E4M3 (nearest even, subnormals from 2^-6, saturate at 448)."""
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-300))), -6.0)
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)


def e4m3_diffused(y):
    """E4M3 codes of the rows of y (keys) with each key's rounding error
    added to the next key of its channel, restarting at every block."""
    out = np.empty_like(y)
    carry = np.zeros(y.shape[1])
    for j in range(y.shape[0]):
        if j % BLOCK == 0:
            carry[:] = 0.0
        t = y[j] + carry
        out[j] = e4m3(t)
        carry = t - out[j]
    return out


def u8_block(p):
    """P coded as +i8pv codes it: u8 of each 128-key block's row max."""
    out = np.empty_like(p)
    for b0 in range(0, p.shape[1], BLOCK):
        pb = p[:, b0:b0 + BLOCK]
        mb = pb.max(axis=1, keepdims=True)
        out[:, b0:b0 + BLOCK] = np.rint(pb / mb * 255.0) * mb / 255.0
    return out


def head_forms(Q, K, V):
    """{form: (P used, V used, weights of the row sum)} and the reference."""
    s = Q @ K.T / np.sqrt(Q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = (p @ V) / p.sum(axis=1, keepdims=True)
    amax = np.abs(V).max(axis=0)
    amax = np.where(amax > 0, amax, 1.0)
    sc8, sci = amax / V_RANGE, amax / 127.0
    v8 = e4m3(V / sc8) * sc8
    vi = int8_round(V / sci) * sci
    vd = e4m3_diffused(V / sc8) * sc8
    p8 = e4m3(p * P_SHIFT) / P_SHIFT
    pu = np.floor(p * 255.0 + 0.5) / 255.0
    pb = u8_block(p)
    forms = {"v e4m3": (p, v8, p), "v int8": (p, vi, p), "v diffused": (p, vd, p),
             "p e4m3": (p8, V, p8), "p u8": (pu, V, pu), "p u8 blk": (pb, V, pb),
             "fp8 PV": (p8, v8, p8), "int8 PV": (pu, vi, pu), "i8pv": (pb, vi, pb)}
    return forms, ref, (float((pu == 0).mean()), float((pb == 0).mean()))


def preset_terms(q, k, v):
    sums, zeros = {}, []
    B, H = q.shape[:2]
    for b in range(B):
        for h in range(H):
            Q, K, V = (x[b, h].astype(np.float64) for x in (q, k, v))
            forms, ref, z = head_forms(Q, K, V)
            zeros.append(z)
            for name, (pp, vv, ww) in forms.items():
                e = (pp @ vv) / ww.sum(axis=1, keepdims=True) - ref
                acc = sums.setdefault(name, [0.0, 0.0])
                acc[0] += float((e * e).sum())
                acc[1] += float((ref * ref).sum())
    out = {name: np.sqrt(a / r) for name, (a, r) in sums.items()}
    out["u8 zeros"] = float(np.mean([z[0] for z in zeros]))
    out["blk zeros"] = float(np.mean([z[1] for z in zeros]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    cols = ["v e4m3", "v int8", "v diffused", "p e4m3", "p u8", "p u8 blk", "fp8 PV", "int8 PV",
            "i8pv"]
    print("| preset | lib full | lib v | " + " | ".join(cols) +
          " | lib p | u8 zeros | blk zeros |")
    print("|---|" + "--:|" * (len(cols) + 5))
    for name in args.presets.split(","):
        d = qvattn.synthetic(name)
        q, k, v = (bf16(d[x]) for x in "qkv")
        lib = qvattn.error_terms(q, k, v, method=UNROTATED)
        t = preset_terms(q, k, v)
        print(f"| {name} | {lib['full']:.3e} | {lib['v']:.3e} | "
              + " | ".join(f"{t[c]:.3e}" for c in cols)
              + f" | {lib['p']:.3e} | {100 * t['u8 zeros']:.0f}% | {100 * t['blk zeros']:.0f}% |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
