#!/usr/bin/env python3
"""Per-kernel device time of one qvattn call (torch.profiler, CUPTI).

  python3 bench/profile_draft.py [--methods draft@85/0/0/15,...] [--shape 1,40,75600,128]
                                 [--grid 21,45,80] [--iters 2] [--out DIR]

Prints, per method, every CUDA kernel the call launched with its total
device time (ms per call), sorted by time: where the router, the operand
preparation and the attention kernel spend the call.  For profiling only;
speed figures come from bench/compare.py.

The same text, headed by the date (UTC), the GPU, the git revision and the
command, goes to profile-draft-<UTC date-time>-<gpu>.txt in --out DIR, else
$OUT if set, else bench/out/ (ignored by git).  Raw files are not committed:
figures worth keeping go, with their commit, GPU, date and command, into
bench/RESULTS.md.
"""
import argparse
import datetime as _dt
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from benchutil import OUT_HELP, git_rev, out_dir  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="draft@85/0/0/15,draft@85/0/7.5/7.5")
    ap.add_argument("--shape", default="1,40,75600,128")
    ap.add_argument("--grid", default="21,45,80")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--out", metavar="DIR", default=None, help=OUT_HELP)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    import qvattn

    now = _dt.datetime.now(_dt.timezone.utc)
    gpu = torch.cuda.get_device_name()
    lines = [
        f"date (UTC): {now.isoformat(timespec='seconds')}",
        f"GPU: {gpu}",
        f"git: {git_rev()}",
        "command: " + " ".join(shlex.quote(x) for x in
                               [os.path.basename(sys.executable)] + sys.argv)
        + (f" (QVATTN_LIB={os.environ['QVATTN_LIB']})" if os.environ.get("QVATTN_LIB") else ""),
    ]

    def out(line=""):
        print(line, flush=True)
        lines.append(line)

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
        out()
        out(f"== {method}  shape {args.shape} grid {grid}: ms per call by kernel")
        s = 0.0
        for name, ms in sorted(tot.items(), key=lambda x: -x[1]):
            out(f"{ms / args.iters:10.3f}  {name}")
            s += ms / args.iters
        out(f"{s:10.3f}  total")

    tag = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    path = os.path.join(out_dir(args.out),
                        f"profile-draft-{now.strftime('%Y%m%d-%H%M%S')}-{tag}.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"\nwrote {path}", flush=True)


if __name__ == "__main__":
    main()
