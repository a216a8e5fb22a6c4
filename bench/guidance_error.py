#!/usr/bin/env python3
"""How classifier-free guidance amplifies a method's error, at the operator.

A guided step combines two attention outputs, g = w·o_label − (w − 1)·o_null.
For each synthetic preset this script makes the null pass's Q, K and V from
the label pass's with relative Gaussian perturbations of size --eps (the two
passes of a guided model differ by their conditioning), runs each method on
both, and prints the single-pass rel-L2, the guided output's rel-L2 and the
correlation of the two passes' errors.  Uncorrelated errors make the guided
error sqrt(w² + (w − 1)²) times one pass's: sqrt(5) = 2.24, −7.0 dB, at w = 2.

    python3 bench/guidance_error.py                           # CPU reference
    python3 bench/guidance_error.py --eps 0.05,0.3 --guidance 2
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import use_checkout_package  # noqa: E402
from expcast_bias import exact  # noqa: E402

DEFAULT_PRESETS = "video-global,video-local-clustered,video-mixed,wan-small"
DEFAULT_METHODS = "sage8,vc8,vc8+expcast,vc8+expcast-centred,vc8+hadamard"


def perturbed(xs, eps, rng):
    """Each tensor plus eps times its std times N(0, 1), float32."""
    return [(x + eps * x.std() * rng.standard_normal(x.shape)).astype(np.float32) for x in xs]


def guided_terms(out_l, out_n, o_l, o_n, w):
    """Single-pass rel-L2, guided rel-L2 and the correlation of the errors."""
    e_l, e_n = out_l - o_l, out_n - o_n
    g, e_g = w * o_l - (w - 1) * o_n, w * e_l - (w - 1) * e_n
    return {"single": float(np.linalg.norm(e_l) / np.linalg.norm(o_l)),
            "guided": float(np.linalg.norm(e_g) / np.linalg.norm(g)),
            "corr": float((e_l * e_n).sum() / (np.linalg.norm(e_l) * np.linalg.norm(e_n)))}


def run(qvattn, preset, method, eps, w, seed=0):
    d = qvattn.synthetic(preset)
    lab = [d["q"], d["k"], d["v"]]
    null = perturbed(lab, eps, np.random.default_rng(seed))
    kw = {"method": method, "grid": d["grid"], "prefix": d["prefix"]}
    outs = [qvattn.attention(*x, **kw).astype(np.float64) for x in (lab, null)]
    return guided_terms(outs[0], outs[1], exact(*lab), exact(*null), w)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--eps", default="0.05,0.3", help="comma list of perturbation sizes")
    ap.add_argument("--guidance", type=float, default=2.0)
    args = ap.parse_args(argv)
    use_checkout_package()
    import qvattn
    methods = [m for m in args.methods.split(",") if m]
    w = args.guidance
    print(f"guidance {w}: uncorrelated errors give {np.hypot(w, w - 1):.2f}x one pass's")
    print("| preset | eps | " + " | ".join(methods) + " |")
    print("|---|--:|" + "---|" * len(methods))
    for preset in [p for p in args.presets.split(",") if p]:
        for eps in [float(e) for e in args.eps.split(",") if e]:
            cells = [run(qvattn, preset, m, eps, w) for m in methods]
            print(f"| {preset} | {eps} | " + " | ".join(
                f"{c['single']:.4f} / {c['guided']:.4f} ({c['corr']:+.2f})" for c in cells) + " |",
                flush=True)
    print("\ncells: one pass's rel-L2 / the guided output's rel-L2 (correlation of the two "
          "passes' errors); against FP64 attention of the same inputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
