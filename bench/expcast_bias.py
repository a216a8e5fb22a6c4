#!/usr/bin/env python3
"""How much of a method's error is a systematic flattening of attention.

For each synthetic preset, the output o_hat of each method is compared with
exact attention o and with the uniform-attention output u (the mean of V
over the keys, per head):

    flattening = sum <o_hat - o, u - o> / sum ||u - o||^2      (over rows)

the least-squares coefficient of the error on the direction that flattens
every row toward uniform weights: minus the `sharpen` of
qvattn.error_direction (qva_error_direction_compute), which computes it,
with the share of the error along that direction (its cos).  0 means no systematic pull; 0.01 means
the rows moved 1% of the way to uniform attention.  Errors that are noise
average out over the 20-40 steps and tens of layers of a video model; a
pull of the same sign in every call does not (NUMERICS "ExpCast's
bias", §7).  rel-L2 is printed beside it.

    python3 bench/expcast_bias.py                       # CPU reference
    python3 bench/expcast_bias.py --device cuda --methods vc8,vc8+expcast
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402

DEFAULT_PRESETS = "video-global,video-local-clustered,video-mixed,wan-small"
DEFAULT_METHODS = "sage8,sage8+expcast,sage8+expcast-centred,vc8,vc8+expcast,vc8+expcast-centred"


def exact(q, k, v):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = np.einsum("bhnd,bhmd->bhnm", q, k) / np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhnm,bhmd->bhnd", p, v)


def rel_l2(out, ref):
    """||out - ref|| / ||ref|| in float64."""
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def measure(qvattn, out, o, v):
    """flattening = -sharpen of qvattn.error_direction (the library's FP64
    sums; o rounded to float32 for it), its cos, and rel-L2."""
    d = qvattn.error_direction(np.asarray(out, np.float32), o.astype(np.float32), v)
    return {"flattening": -d["sharpen"], "cos": d["cos"],
            "rel_l2": rel_l2(out, o)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    methods = [m for m in args.methods.split(",") if m]
    print("| preset | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for name in [p for p in args.presets.split(",") if p]:
        w = qvattn.synthetic(name)
        q, k, v = w["q"], w["k"], w["v"]
        o = exact(q, k, v)
        cells = []
        for m in methods:
            if args.device == "cuda":
                import torch
                t = [torch.from_numpy(x).cuda() for x in (q, k, v)]
                out = qvattn.attention(*t, method=m, grid=w["grid"], prefix=w["prefix"])
                out = out.float().cpu().numpy()
            else:
                out = qvattn.attention(q, k, v, method=m, grid=w["grid"], prefix=w["prefix"])
            r = measure(qvattn, out, o, v)
            cells.append(f"{r['flattening']:+.4f} (cos {-r['cos']:+.2f}, {r['rel_l2']:.4f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("\ncells: flattening coefficient (its share of the error along the pull, "
          "rel-L2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
