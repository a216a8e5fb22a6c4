#!/usr/bin/env python3
"""What finer K scales, or Q smoothing, would buy the INT8 QK path (issue 15).

sage8 and vc8 quantize Q to INT8 with one scale per row and the smoothed K
(minus its channel mean) with one scale per 128-key block.  This models
those quantizers in float64 (docs/NUMERICS.md §1: scale = amax/127 + 1e-7,
round half away from zero, clamp to ±127) with exact softmax and exact PV,
and prints, per synthetic preset, the rel-L2 against exact attention of

    k block   K per 128-key block (the library today), Q exact
    k token   K per key, Q exact
    k pow2    K per block times a per-key power of two (the largest that
              keeps the key's codes within ±127), Q exact
    qk block  Q per row and K per block
    qk token  Q per row and K per key
    qs block  Q smoothed, then per row; K per block
    qs token  Q smoothed, then per row; K per key

Q smoothing (issue 15's candidate): each 128-query block's channel mean is
subtracted before the INT8 rows are quantized and added back exactly
(q = q̄ + code·δ, so the scores gain q̄·kᵀ at full precision, one GEMV per
block pair in a kernel).

pooled over heads, beside the library's own K term (qvattn.error_terms,
sage8 in SageAttention2's form, "k"), which "k block" must reproduce: the
check that this model is the reference's quantizer (it does not rotate, so
the library's sage8 is run without its default rotation and code sum).  It also estimates sage8's whole error with
per-key K scales, replacing the library's K term by k token / k block of
it and adding the terms in quadrature (NUMERICS §7: full² ≈ Σ term²),
and with both changes, replacing qk block by qs token in that sum.

    QVATTN_LIB=build-cpu/libqvattn.so python3 bench/k_granularity.py
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402

DEFAULT_PRESETS = "video-global,video-global-d64,video-local-clustered,video-mixed,wan-small"
BLOCK = 128
SAGE8_UNROTATED = "sage8+nohadamard+fp32sum"  # the quantizers this model rebuilds


def bf16(x):
    """Round float32 to bfloat16 (nearest even), back in float32."""
    x = np.ascontiguousarray(x, dtype=np.float32).copy()
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return x


def int8_round(y):
    """INT8 code of y: round half away from zero, clamp to ±127."""
    return np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), -127, 127)


def int8_dequant(x, rows):
    """code * scale with one scale per `rows` rows (1 = per row)."""
    n, d = x.shape
    g = np.abs(x.reshape(-1, rows, d) if n % rows == 0 else x).reshape(-1, rows * d)
    scale = (g.max(axis=1) / 127.0 + 1e-7).repeat(rows)[:, None]
    return int8_round(x / scale) * scale


def int8_dequant_pow2(x):
    """The block scale divided, per key, by the largest power of two
    2^e (e in 0..15) with the key's amax still within 127 codes."""
    n, d = x.shape
    out = np.empty_like(x)
    for b in range(0, n, BLOCK):
        blk = x[b:b + BLOCK]
        amax = np.abs(blk).max()
        key = np.maximum(np.abs(blk).max(axis=1), 1e-30)
        e = np.clip(np.floor(np.log2(np.maximum(amax / key, 1.0))), 0, 15)
        scale = ((amax / 127.0 + 1e-7) / 2.0 ** e)[:, None]
        out[b:b + BLOCK] = int8_round(blk / scale) * scale
    return out


def pad_rows(x, mult):
    n = x.shape[0]
    extra = (-n) % mult
    return np.vstack([x, np.zeros((extra, x.shape[1]))]) if extra else x


def smoothed_q(q):
    """Q with each 128-row block's channel mean removed before the per-row
    INT8 quantizer and added back exactly."""
    out = np.empty_like(q)
    for b in range(0, q.shape[0], BLOCK):
        m = q[b:b + BLOCK].mean(axis=0)
        out[b:b + BLOCK] = int8_dequant(q[b:b + BLOCK] - m, 1) + m
    return out


def key_amax_ratios(k):
    """Each smoothed key's amax over its 128-key block's (all heads)."""
    out = []
    for b in range(k.shape[0]):
        for h in range(k.shape[1]):
            K = k[b, h].astype(np.float64)
            K = pad_rows(K - K.mean(axis=0), BLOCK)
            for i in range(0, len(K), BLOCK):
                key = np.abs(K[i:i + BLOCK]).max(axis=1)
                key = key[key > 0]
                out.append(key / np.abs(K[i:i + BLOCK]).max())
    return np.concatenate(out)


def attention(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return (p @ v) / p.sum(axis=1, keepdims=True)


def terms(q, k, v):
    """{name: (squared error, squared reference)} summed over heads."""
    out = {}
    B, H, N, _ = q.shape
    for b in range(B):
        for h in range(H):
            Q, K, V = (x[b, h].astype(np.float64) for x in (q, k, v))
            ref = attention(Q, K, V)
            Ks = K - K.mean(axis=0)
            Kb = int8_dequant(pad_rows(Ks, BLOCK), BLOCK)[:N]
            Kt = int8_dequant(Ks, 1)
            Kp = int8_dequant_pow2(pad_rows(Ks, BLOCK))[:N]
            Qr = int8_dequant(Q, 1)
            Qs = smoothed_q(Q)
            for name, (qq, kk) in {"k block": (Q, Kb), "k token": (Q, Kt), "k pow2": (Q, Kp),
                                   "qk block": (Qr, Kb), "qk token": (Qr, Kt),
                                   "qs block": (Qs, Kb), "qs token": (Qs, Kt)}.items():
                e = attention(qq, kk, V) - ref
                acc = out.setdefault(name, [0.0, 0.0])
                acc[0] += float((e * e).sum())
                acc[1] += float((ref * ref).sum())
    return {k: np.sqrt(a / r) for k, (a, r) in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    print("| preset | library k (sage8) | k block | k token | k pow2 | qk block | qk token "
          "| qs block | qs token | sage8 full | sage8 full, K per key (estimate) "
          "| sage8 full, both (estimate) | keys < ½ block amax | median key/block amax |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name in args.presets.split(","):
        d = qvattn.synthetic(name)
        q, k, v = (bf16(d[x]) for x in "qkv")
        lib = qvattn.error_terms(q, k, v, method=SAGE8_UNROTATED)
        t = terms(q, k, v)
        k_new = lib["k"] * t["k token"] / t["k block"]
        est = np.sqrt(lib["full"] ** 2 - lib["k"] ** 2 + k_new ** 2)
        both = np.sqrt(lib["full"] ** 2 - t["qk block"] ** 2 + t["qs token"] ** 2)
        r = key_amax_ratios(k)
        print(f"| {name} | {lib['k']:.3e} | {t['k block']:.3e} | {t['k token']:.3e} | "
              f"{t['k pow2']:.3e} | "
              f"{t['qk block']:.3e} | {t['qk token']:.3e} | {t['qs block']:.3e} | "
              f"{t['qs token']:.3e} | {lib['full']:.3e} | {est:.3e} | {both:.3e} | "
              f"{100 * (r < 0.5).mean():.1f}% | {np.median(r):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
