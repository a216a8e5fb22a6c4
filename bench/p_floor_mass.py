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
fewer heads are the same heads).

    python3 bench/p_floor_mass.py
    python3 bench/p_floor_mass.py --presets wan2.2-720p --heads 2 --rows 128
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
    """q, k [H, N, D] float32 of the first `heads` heads of a preset."""
    from qvattn import _ffi
    spec = _ffi.synthetic_spec(name, seed)
    spec.H = min(int(spec.H), heads)
    spec.B = 1
    n = spec.prefix_tokens + spec.grid_t * spec.grid_h * spec.grid_w
    shape = (spec.B, spec.H, n, spec.D)
    q, k, v = (np.empty(shape, dtype=np.float32) for _ in range(3))
    ptr = lambda a: a.ctypes.data_as(_ffi.POINTER(_ffi.ctypes.c_float))  # noqa: E731
    _ffi.synthetic_generate(spec, ptr(q), ptr(k), ptr(v))
    return q[0], k[0]


def row_masses(q, k, floors):
    """[rows, len(floors)]: each row's softmax mass with u below each floor."""
    s = (q.astype(np.float64) @ k.astype(np.float64).T) / np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    u = s / np.log(2.0)
    total = p.sum(axis=-1)
    return np.stack([np.where(u < f, p, 0.0).sum(axis=-1) / total for f in floors], axis=-1)


def study(qvattn, name, heads, rows, seed):
    q, k = generate(qvattn, name, heads, seed)
    rng = np.random.default_rng(seed or 0)
    out = []
    for h in range(q.shape[0]):
        idx = rng.choice(q.shape[1], size=min(rows, q.shape[1]), replace=False)
        out.append(row_masses(q[h, idx], k[h], [f for _, f in FLOORS]))
    m = np.concatenate(out)
    return {"preset": name, "tokens": int(k.shape[1]), "heads": int(q.shape[0]),
            "rows": int(m.shape[0]), "mean": m.mean(axis=0).tolist(),
            "max": m.max(axis=0).tolist()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    ap.add_argument("--heads", type=int, default=2, help="first heads of each preset")
    ap.add_argument("--rows", type=int, default=128, help="random query rows per head")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    qvattn = use_checkout_package()
    hdr = " | ".join(f"{n} (u < {f:g}) mean / max" for n, f in FLOORS)
    print(f"| preset | tokens | rows | {hdr} |")
    print("|---|--:|--:|" + "--:|" * len(FLOORS))
    res = []
    for name in args.presets.split(","):
        r = study(qvattn, name, args.heads, args.rows, args.seed)
        res.append(r)
        cells = " | ".join(f"{a:.2e} / {b:.2e}" for a, b in zip(r["mean"], r["max"]))
        print(f"| {name} | {r['tokens']} | {r['rows']} | {cells} |", flush=True)
    return res


if __name__ == "__main__":
    main()
