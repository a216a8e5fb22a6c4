#!/usr/bin/env python3
"""How much softmax mass lies below each P code's floor, and how that grows
with the sequence.

A P code drops (or crushes) every weight below its smallest normal value,
measured from the row max in log2 units u = log2(p / p_max):

    ExpCast, E4M3 codes      u < -14      subnormal codes (up to 4x too small)
                             u < -14.94   code 0 (dropped)
    exp2, then E4M3          u < -17.8    rounds to 0
    ExpCast, E5M2 codes      u < -29      (the E5M2 code's floor)

(docs/NUMERICS.md §7, "The error's direction".)  The dropped mass sharpens
every row the same way, so it does not average out over steps and layers.
On the small presets it is 0.05-0.16% of a row; a row over 75,600 keys
has more keys far below its max.  This script measures, per preset, the
mean and the largest row mass under each floor from the FP64 softmax of
the preset's f32 Q and K (scale 1/sqrt(D)), on `--rows` random query rows
of the first `--heads` heads (the generator draws each head on its own, so
fewer heads are the same heads); and the output error of the flush alone
(rel-L2 against exact attention, and its cos with ref - mean(V), > 0
sharper rows), all else exact.

    python3 bench/p_floor_mass.py
    python3 bench/p_floor_mass.py --presets wan2.2-720p --heads 2 --rows 128
    python3 bench/p_floor_mass.py --presets longcat-480p --heads 1 --methods sage8,vc8
    python3 bench/p_floor_mass.py --presets wan2.2-720p --heads 1 --codes
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402

FLOORS = (("ExpCast E4M3 subnormal", -14.0), ("ExpCast E4M3 dropped", -14.94),
          ("exp2 E4M3 dropped", -17.8), ("ExpCast E5M2", -29.0))
DEFAULT_PRESETS = "video-global,video-local-clustered,wan-small,longcat-480p,wan2.2-720p"


def generate(qvattn, name, heads, seed=None):
    """q, k, v [H, N, D] float32 of the first `heads` heads of a preset
    (batch element 0)."""
    w = qvattn.synthetic(name, seed=seed, heads=heads)
    return w["q"][0], w["k"][0], w["v"][0]


def _weights(q, k):
    """exp(s - max) and u = (s - max)/ln 2 of q [..., n, D] against k [..., N, D]."""
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))
    s /= np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    return np.exp(s), s / np.log(2.0)


def row_masses(q, k, floors):
    """[rows, len(floors)]: each row's softmax mass with u below each floor."""
    p, u = _weights(q, k)
    total = p.sum(axis=-1)
    return np.stack([np.where(u < f, p, 0.0).sum(axis=-1) / total for f in floors], axis=-1)


def block_means(v, block=128):
    """[blocks, D]: the mean of V over each run of `block` keys (the last
    run may be shorter), and [N]: each key's block."""
    n = v.shape[0]
    starts = np.arange(0, n, block)
    sums = np.add.reduceat(v, starts, axis=0)
    counts = np.diff(np.append(starts, n))[:, None]
    return sums / counts, np.arange(n) // block


def at_block_means(w, mu, blk):
    """sum_j w[:, j] mu[blk[j]]: each key's weight given its block's mean."""
    per_block = np.zeros((w.shape[0], mu.shape[0]))
    np.add.at(per_block.T, blk, w.T)
    return per_block @ mu


def flush_errors(q, k, v, floors, restore=False):
    """Per floor, the output error of dropping the weights below it against
    exact attention, all else exact: (sum ||e||^2, sum ||ref||^2,
    sum <e, d>, sum ||d||^2) over the rows, d = ref - mean(V) (NUMERICS §7's
    direction).  Without `restore` the kept weights are renormalized (as a
    code sum does); with it the dropped weights stay in the row sum and
    their keys contribute their 128-key block's mean of V instead of their
    own value (what a mean restore fed with each block's dropped mass would
    add back; keys in sequence order, no grouping)."""
    p, u = _weights(q, k)
    v = v.astype(np.float64)
    ref = (p @ v) / p.sum(axis=-1, keepdims=True)
    d = ref - v.mean(axis=0)
    mu, blk = block_means(v) if restore else (None, None)
    out = []
    for f in floors:
        w = np.where(u < f, 0.0, p)
        if restore:
            e = (w @ v + at_block_means(p - w, mu, blk)) / p.sum(axis=-1, keepdims=True) - ref
        else:
            e = (w @ v) / w.sum(axis=-1, keepdims=True) - ref
        out.append(((e * e).sum(), (ref * ref).sum(), (e * d).sum(), (d * d).sum()))
    return np.array(out)


E4M3_VALUES = np.array([(c & 7) / 8.0 * 2.0**-6 if c >> 3 == 0 else
                        (1 + (c & 7) / 8.0) * 2.0**((c >> 3) - 7) for c in range(127)])
CODE_FORMS = ("ExpCast E4M3", "+floor, code 0, head mean", "+floor, code < 8, head mean",
              "+floor, code < 8, block means", "exp2 E4M3, code sum",
              "exp2 + floor, code < 8, head mean")


def expcast_codes(u, beta=-0.45):
    """ExpCast's E4M3 code of u = log2(p / p_max) (VC Eq. 7; float64 here,
    the library's fmaf in float32)."""
    t = 8.0 * u + 120.0 + beta
    return np.where(t >= 0, np.rint(np.minimum(t, 120.0)), 0.0).astype(np.int64)


def exp2_codes(u):
    """The exp2 path's E4M3 code of 2^(u + 8.807), rounded to nearest."""
    p = np.exp2(u + 8.807)
    i = np.clip(np.searchsorted(E4M3_VALUES, p), 1, 126)
    return np.where(p - E4M3_VALUES[i - 1] <= E4M3_VALUES[i] - p, i - 1, i)


def code_errors(q, k, v):
    """P alone coded (all else exact), per CODE_FORMS: the sums as in
    flush_errors.  The floor forms (+floormass, docs/NUMERICS.md §7) take
    the masked keys' weight from ExpCast's code 12 binades up, times
    2^-12 (and 2^0.807 on the exp2 path's scale), into the row sum, and
    give them a mean of V: the head's, or their 128-key block's."""
    _, u = _weights(q, k)
    v = v.astype(np.float64)
    p = np.exp2(u)
    ref = (p @ v) / p.sum(axis=-1, keepdims=True)
    d = ref - v.mean(axis=0)
    mu, blk = block_means(v)
    up = E4M3_VALUES[expcast_codes(u + 12.0)] * 2.0**-12
    ec, e2 = expcast_codes(u), exp2_codes(u)

    def floored(codes, under_w, mask_below, block):
        w = np.where(codes >= mask_below, E4M3_VALUES[codes], 0.0)
        f = np.where(codes >= mask_below, 0.0, under_w)
        extra = (at_block_means(f, mu, blk) if block
                 else f.sum(axis=-1, keepdims=True) * v.mean(axis=0))
        return (w @ v + extra) / (w.sum(axis=-1, keepdims=True) + f.sum(axis=-1, keepdims=True))

    outs = [floored(ec, 0.0, 1, False), floored(ec, up, 1, False), floored(ec, up, 8, False),
            floored(ec, up, 8, True), floored(e2, 0.0, 1, False),
            floored(e2, up * 2.0**0.807, 8, False)]
    res = []
    for o in outs:
        e = o - ref
        res.append(((e * e).sum(), (ref * ref).sum(), (e * d).sum(), (d * d).sum()))
    return np.array(res)


def study(qvattn, name, heads, rows, seed):
    """Mass under each floor (mean, max over the rows) and the flush-only
    output error: rel-L2 and its cos with ref - mean(V)."""
    q, k, v = generate(qvattn, name, heads, seed)
    rng = np.random.default_rng(seed or 0)
    floors = [f for _, f in FLOORS]
    out, err, back = [], np.zeros((len(floors), 4)), np.zeros((len(floors), 4))
    for h in range(q.shape[0]):
        idx = rng.choice(q.shape[1], size=min(rows, q.shape[1]), replace=False)
        out.append(row_masses(q[h, idx], k[h], floors))
        err += flush_errors(q[h, idx], k[h], v[h], floors)
        back += flush_errors(q[h, idx], k[h], v[h], floors, restore=True)
    m = np.concatenate(out)
    rel = lambda e: np.sqrt(e[:, 0] / e[:, 1])  # noqa: E731
    cos = lambda e: e[:, 2] / np.sqrt(np.maximum(e[:, 0] * e[:, 3], 1e-300))  # noqa: E731
    return {"preset": name, "tokens": int(k.shape[1]), "heads": int(q.shape[0]),
            "rows": int(m.shape[0]), "mean": m.mean(axis=0).tolist(),
            "max": m.max(axis=0).tolist(), "rel_l2": rel(err).tolist(),
            "cos": cos(err).tolist(), "rel_l2_restored": rel(back).tolist(),
            "cos_restored": cos(back).tolist()}


def method_rows(qvattn, name, heads, rows, seed, methods):
    """Each method's rel-L2 and error direction on the same sampled rows:
    the library runs the whole self-attention of the first `heads` heads
    (V-Smooth needs every query), and the rows are compared with FP64
    attention.  [(method, rel-L2, sharpen, cos)]."""
    q, k, v = generate(qvattn, name, heads, seed)
    rng = np.random.default_rng(seed or 0)
    idx = np.sort(rng.choice(q.shape[1], size=min(rows, q.shape[1]), replace=False))
    p, _ = _weights(q[:, idx], k)
    ref = (np.einsum("hnm,hmd->hnd", p, v.astype(np.float64)) / p.sum(-1)[..., None])[None]
    res = []
    for m in methods:
        out = np.asarray(qvattn.attention(q[None], k[None], v[None], method=m),
                         dtype=np.float64)[:, :, idx]
        rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        d = qvattn.error_direction(np.ascontiguousarray(out, dtype=np.float32),
                                   ref.astype(np.float32), v[None])
        res.append((m, rel, d["sharpen"], d["cos"]))
    return res


def print_errors(res, rel_key, cos_key, title):
    """One markdown table of the studies' errors per floor: rel-L2 (cos)."""
    print(f"\n{title}\n")
    print("| preset | " + " | ".join(n for n, _ in FLOORS) + " |")
    print("|---|" + "--:|" * len(FLOORS))
    for r in res:
        print(f"| {r['preset']} | " + " | ".join(
            f"{a:.2e} ({c:+.2f})" for a, c in zip(r[rel_key], r[cos_key])) + " |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    ap.add_argument("--heads", type=int, default=2, help="first heads of each preset")
    ap.add_argument("--rows", type=int, default=128, help="random query rows per head")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--codes", action="store_true",
                    help="also emulate P's codes alone (all else exact): ExpCast's, "
                         "the exp2 path's, and +floormass's forms of each")
    ap.add_argument("--methods", default="",
                    help="also run these qvattn methods (whole CPU calls of the "
                         "first --heads heads) and report rel-L2 and the error's "
                         "direction on the sampled rows")
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    hdr = " | ".join(f"{n} (u < {f:g}) mean / max" for n, f in FLOORS)
    print(f"| preset | tokens | rows | {hdr} |")
    print("|---|--:|--:|" + "--:|" * len(FLOORS))
    res = []
    for name in args.presets.split(","):
        r = study(qvattn, name, args.heads, args.rows, args.seed)
        res.append(r)
        cells = " | ".join(f"{a:.2e} / {b:.2e}" for a, b in zip(r["mean"], r["max"]))
        print(f"| {name} | {r['tokens']} | {r['rows']} | {cells} |", flush=True)
    print_errors(res, "rel_l2", "cos",
                 "The output error of the flush alone (the weights under the floor "
                 "dropped, the rest renormalized, all else exact): rel-L2 (cos with "
                 "ref - mean(V)).")
    print_errors(res, "rel_l2_restored", "cos_restored",
                 "The same with the dropped weights kept in the row sum and their keys "
                 "given their 128-key block's mean of V (a mean restore fed with each "
                 "block's dropped mass): rel-L2 (cos).")
    if args.codes:
        print("\nP's codes alone, emulated in float64 (all else exact): rel-L2 (cos).\n")
        print("| preset | " + " | ".join(CODE_FORMS) + " |\n|---|" + "--:|" * len(CODE_FORMS))
        for name in args.presets.split(","):
            q, k, v = generate(qvattn, name, args.heads, args.seed)
            rng = np.random.default_rng(args.seed or 0)
            e = np.zeros((len(CODE_FORMS), 4))
            for h in range(q.shape[0]):
                idx = rng.choice(q.shape[1], size=min(args.rows, q.shape[1]), replace=False)
                e += code_errors(q[h, idx], k[h], v[h])
            rel = np.sqrt(e[:, 0] / e[:, 1])
            cos = e[:, 2] / np.sqrt(np.maximum(e[:, 0] * e[:, 3], 1e-300))
            print(f"| {name} | " + " | ".join(f"{a:.2e} ({c:+.2f})" for a, c in zip(rel, cos))
                  + " |", flush=True)
    if args.methods:
        print("\nThe methods on the same rows (whole calls): rel-L2 against FP64, "
              "sharpen (cos).\n")
        print("| preset | method | rel-L2 | sharpen (cos) |\n|---|---|--:|--:|")
        for name in args.presets.split(","):
            for m, rel, sh, cos in method_rows(qvattn, name, args.heads, args.rows,
                                               args.seed, args.methods.split(",")):
                print(f"| {name} | {m} | {rel:.3e} | {sh:+.2e} ({cos:+.2f}) |", flush=True)
    return res


if __name__ == "__main__":
    main()
