#!/usr/bin/env python3
"""Per-kernel device time of one qvattn call (torch.profiler, CUPTI).

  python3 bench/profile_draft.py [--methods draft@85/0/0/15,...] [--shape 1,40,75600,128]
                                 [--grid 21,45,80] [--iters 2]

Prints, per method, every CUDA kernel the call launched with its total
device time (ms per call), sorted by time: where the router, the operand
preparation and the attention kernel spend the call.  For profiling only;
speed figures come from bench/compare.py.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="draft@85/0/0/15,draft@85/0/7.5/7.5")
    ap.add_argument("--shape", default="1,40,75600,128")
    ap.add_argument("--grid", default="21,45,80")
    ap.add_argument("--iters", type=int, default=2)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    import qvattn

    B, H, N, D = (int(x) for x in args.shape.split(","))
    grid = tuple(int(x) for x in args.grid.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    for method in args.methods.split(","):
        for _ in range(2):  # warm-up: layouts, allocations
            qvattn.attention(q, k, v, method=method, grid=grid, step=10, num_steps=40)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                qvattn.attention(q, k, v, method=method, grid=grid, step=10, num_steps=40)
            torch.cuda.synchronize()
        tot = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                name = ev.name[:90]
                tot[name] = tot.get(name, 0.0) + ev.device_time / 1000.0
        print(f"\n== {method}  shape {args.shape} grid {grid}: ms per call by kernel")
        s = 0.0
        for name, ms in sorted(tot.items(), key=lambda x: -x[1]):
            print(f"{ms / args.iters:10.3f}  {name}")
            s += ms / args.iters
        print(f"{s:10.3f}  total")


if __name__ == "__main__":
    main()
