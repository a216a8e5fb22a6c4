#!/usr/bin/env python3
"""What a pooled stand-in for the skipped key blocks would buy block-sparse
attention (issue 17, the adaptive budget; an idea beyond DraftAttention2).

A block-sparse call drops the skipped blocks' whole share of each row's
softmax mass.  Where heads are nearly uniform (the harness's last layers:
the heaviest 15% of blocks hold 16-17% of the mass) that share is most of
the row.  This models, in float64 on a synthetic preset, one cheap stand-in
for it: each skipped key block b of n_b keys enters the row's softmax as
n_b keys at its mean key k̄_b with its mean value v̄_b,

    weight_ib = n_b exp(s·q_i·k̄_b − m_i)        (mf1)
    weight_ib = n_b exp(s·q_i·k̄_b + s²/2·Σ_c q_ic² var_b,c − m_i)   (mf2)

(mf2 adds the second-order term of E[exp(q·k)] for independent channels),
added to the kept blocks' numerator (weight_ib v̄_b) and row sum.  mf1v is
mf1 with the value's first-order term: weight_ib (v̄_b + C_b q_i), with
C_b = s/n_b Σ_j v_j (k_j − k̄_b)ᵀ, the weights' lean toward the keys the
row prefers carried onto the values (the mass's first-order term is 0).  In a
kernel the pooled scores are one N x R GEMM (1/128 of QK^T's work) sharing
the online softmax.  Blocks here are 128 tokens in sequence order (DA2's 2D
regions would be more coherent), ranked per query block by exact mass (the
oracle), so the figures isolate the stand-in from the router.

    QVATTN_LIB=build-cpu/libqvattn.so python3 bench/draft_pooled.py \\
        --presets wan-small,video-global,video-local-clustered [--q-scale 0.3]

--q-scale multiplies Q before the scores: below 1 flattens every row,
standing in for the harness's nearly uniform heads.  Prints rel-L2 against
exact attention, mean over heads, per kept share.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import qvattn  # noqa: E402

BLOCK = 128


def pooled_errors(q, k, v, keeps):
    """rel-L2 of sparse, mf1 and mf2 for one head, per kept share."""
    n, d = q.shape
    scale = 1.0 / np.sqrt(d)
    nblk = (n + BLOCK - 1) // BLOCK
    kb = np.arange(n) // BLOCK
    s = (q @ k.T) * scale
    m = s.max(1, keepdims=True)
    p = np.exp(s - m)
    ref = (p @ v) / p.sum(1, keepdims=True)
    mass = np.zeros((nblk, n))
    np.add.at(mass, kb, p.T)
    mass = mass.T / p.sum(1, keepdims=True)  # rows x key blocks, each row sums to 1
    qmass = np.zeros((nblk, nblk))
    np.add.at(qmass, kb, mass)  # query block x key block
    kbar = np.stack([k[kb == b].mean(0) for b in range(nblk)])
    vbar = np.stack([v[kb == b].mean(0) for b in range(nblk)])
    kvar = np.stack([k[kb == b].var(0) for b in range(nblk)])
    cnt = np.bincount(kb, minlength=nblk).astype(float)
    pooled = {"mf1": (q @ kbar.T) * scale,
              "mf2": (q @ kbar.T) * scale + 0.5 * ((q * q) @ kvar.T) * scale * scale}
    # mf1v: mf1's mass with the value's first-order term, v̄_b + C_b q, where
    # C_b = s/n_b Σ_j v_j (k_j − k̄_b)ᵀ (the block's value–key covariance)
    cov = np.stack([v[kb == b].T @ (k[kb == b] - kbar[b]) / cnt[b] for b in range(nblk)]) * scale
    vq = vbar[None, :, :] + np.einsum("bvk,nk->nbv", cov, q)  # rows x blocks x D
    out = {}
    for keep in keeps:
        kept = np.zeros((nblk, nblk), bool)
        kn = max(1, int(round(keep * nblk)))
        for a in range(nblk):
            kept[a, np.argsort(-qmass[a])[:kn]] = True
        row_kept = kept[kb]  # rows x key blocks
        ps = np.where(row_kept[:, kb], p, 0.0)
        num, den = ps @ v, ps.sum(1, keepdims=True)
        forms = {"sparse": num / den}
        for tag, sb in pooled.items():
            w = np.where(row_kept, 0.0, cnt * np.exp(sb - m))
            forms[tag] = (num + w @ vbar) / (den + w.sum(1, keepdims=True))
            if tag == "mf1":
                forms["mf1v"] = ((num + np.einsum("nb,nbv->nv", w, vq)) /
                                 (den + w.sum(1, keepdims=True)))
        for tag, o in forms.items():
            out[(keep, tag)] = np.linalg.norm(o - ref) / np.linalg.norm(ref)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="wan-small,video-global,video-local-clustered")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--keep", default="0.15,0.3,0.5,0.6", help="kept shares of the key blocks")
    ap.add_argument("--q-scale", type=float, default=1.0)
    a = ap.parse_args()
    keeps = [float(x) for x in a.keep.split(",")]
    print(f"q-scale {a.q_scale}; rel-L2 against exact attention, mean over heads")
    print(f"{'preset':24s} {'kept':>5s} {'sparse':>8s} {'mf1':>8s} {'mf2':>8s} {'mf1v':>8s}")
    for name in a.presets.split(","):
        w = qvattn.synthetic(name, heads=a.heads)
        q, k, v = (w[x][0].astype(np.float64) for x in "qkv")
        per_head = [pooled_errors(q[h] * a.q_scale, k[h], v[h], keeps) for h in range(q.shape[0])]
        for keep in keeps:
            e = {t: np.mean([r[(keep, t)] for r in per_head])
                 for t in ("sparse", "mf1", "mf2", "mf1v")}
            print(f"{name:24s} {keep:5.2f} {e['sparse']:8.4f} {e['mf1']:8.4f} {e['mf2']:8.4f} "
                  f"{e['mf1v']:8.4f}")


if __name__ == "__main__":
    main()
