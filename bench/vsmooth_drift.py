#!/usr/bin/env python3
"""What a late step gains from demeaning V with a permutation made on an
earlier step's V (vsmooth.schedule "demean" against the paper's plain steps),
as the inputs drift away from the ones that were grouped.

A sampler groups the value tokens on its early steps and keeps the
permutation; by a late step Q, K and V have moved.  This script grades that
drift on the synthetic presets (docs/SYNTHETIC.md): the grouping step sees
X0 = the preset at --seed-a, the late step sees

    X(a) = sqrt(1 - a) * X0 + sqrt(a) * X1      for X in q, k, v,

with X1 the same preset at --seed-b (a = 0: the grouped inputs again; a = 1:
inputs that share nothing with them but the preset's statistics).  For each
a, one context per schedule runs step 0 on X0 and step 30 of 40 on X(a):

    paper   the plain step (stored permutation, no demeaning)
    demean  the reuse step (stored permutation, block means subtracted)
    always  a fresh grouping on X(a) (k-means on the late step's own V)

and each output is compared with FP64 attention of X(a) (rel-L2 over every
row of the first --heads heads).  CPU reference by default.

    python3 bench/vsmooth_drift.py
    python3 bench/vsmooth_drift.py --preset video-local-clustered --drifts 0,0.5,1
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402
from expcast_bias import exact, rel_l2  # noqa: E402  (FP64 attention of [B, H, N, D] arrays)

SCHEDULES = ("paper", "demean", "always")


def mixed(x0, x1, a):
    """sqrt(1-a) x0 + sqrt(a) x1 in float32."""
    return (np.sqrt(1.0 - a) * x0 + np.sqrt(a) * x1).astype(np.float32)


def late_step_errors(qvattn, x0, xa, method):
    """{schedule: rel-L2 of step 30 of 40 on xa after step 0 on x0}."""
    ref = exact(*xa)
    res = {}
    for sched in SCHEDULES:
        with qvattn.Context() as ctx:
            for step, (q, k, v) in ((0, x0), (30, xa)):
                out = qvattn.attention(q, k, v, method=method, ctx=ctx, layer=0, step=step,
                                       num_steps=40, options={"vsmooth.schedule": sched})
        res[sched] = rel_l2(np.asarray(out), ref)
    return res


def preset(qvattn, name, seed, heads):
    w = qvattn.synthetic(name, seed=seed, heads=heads)
    return tuple(np.ascontiguousarray(w[n][:, :heads]) for n in ("q", "k", "v"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="wan-small")
    ap.add_argument("--method", default="vc8")
    ap.add_argument("--heads", type=int, default=2, help="the preset's first heads")
    ap.add_argument("--drifts", default="0,0.05,0.1,0.2,0.4,0.7,1")
    ap.add_argument("--seed-a", type=int, default=1)
    ap.add_argument("--seed-b", type=int, default=2)
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    x0 = preset(qvattn, args.preset, args.seed_a, args.heads)
    x1 = preset(qvattn, args.preset, args.seed_b, args.heads)
    print(f"{args.preset}, {args.method}, heads {args.heads}, tokens {x0[0].shape[2]}: "
          "rel-L2 of step 30 of 40 against FP64, after step 0 grouped X0\n")
    print("| drift a | paper (plain) | demean (reuse) | demean / paper | always (regroup) |")
    print("|--:|--:|--:|--:|--:|")
    for a in (float(t) for t in args.drifts.split(",")):
        xa = tuple(mixed(u, w, a) for u, w in zip(x0, x1))
        e = late_step_errors(qvattn, x0, xa, args.method)
        print(f"| {a:g} | {e['paper']:.4e} | {e['demean']:.4e} | "
              f"{e['demean'] / e['paper']:.3f} | {e['always']:.4e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
