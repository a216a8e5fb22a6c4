#!/usr/bin/env python3
"""GPU idle time inside back-to-back qvattn calls (torch profiler trace).

  python3 bench/idle_gaps.py METHOD[,METHOD...] [--timeline] [--step S]
                             [--shape wan|hunyuan] [--compare-data]

For each method: four calls at Wan2.2-720p (bf16, layer 0, step S of 40,
default 20: a plain step of V-Smooth's schedule; 1 is a reuse step;
draft methods on the 21x45x80 grid), or with --shape hunyuan at
HunyuanVideo-1.5-720p (1,16,111700,128; grid 31x45x80 after 100 prefix
tokens), after three warm-up calls, profiled
with CPU and CUDA activities.  Prints the calls' window on the GPU, the
time some kernel, copy or memset ran, the idle gaps between them (by
the kernel pair around each gap, with when the next kernel's launch call
ended relative to the gap's start: positive means the host was late),
and the host's CUDA runtime calls per call.  --timeline also lists the
last call's GPU work in order: start and end (us from the call's first
kernel), stream and name, to see which preparation chains overlap.  The
chrome traces go to
/tmp.  --compare-data: bench/compare.py's inputs instead (Q times 2, K and
V with a mean per head and channel, two input sets on layers 0 and 1 in
turn).  For profiling only; speed figures come from bench/compare.py.
"""
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import torch  # noqa: E402
import qvattn  # noqa: E402
from torch.profiler import profile, ProfilerActivity  # noqa: E402

argv = sys.argv[1:]
step = 20
if "--step" in argv:
    i = argv.index("--step")
    if i + 1 >= len(argv) or not argv[i + 1].isdigit():
        sys.exit(__doc__)
    step = int(argv[i + 1])
    del argv[i:i + 2]
SHAPES = {"wan": ((1, 40, 75600, 128), (21, 45, 80)),
          "hunyuan": ((1, 16, 111700, 128), (31, 45, 80))}
shape = "wan"
if "--shape" in argv:
    i = argv.index("--shape")
    if i + 1 >= len(argv) or argv[i + 1] not in SHAPES:
        sys.exit(__doc__)
    shape = argv[i + 1]
    del argv[i:i + 2]
args = [a for a in argv if a not in ("--timeline", "--compare-data")]
timeline = "--timeline" in argv
compare_data = "--compare-data" in argv
if len(args) != 1:
    sys.exit(__doc__)
(B, H, N, D), GRID = SHAPES[shape]
g = torch.Generator(device="cuda").manual_seed(0)


def inputs():
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    if compare_data:
        q.mul_(2.0)
        k.add_(0.5 * torch.randn(1, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g))
    v.add_(torch.randn(1, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g))
    return q, k, v


sets = [inputs() for _ in range(2 if compare_data else 1)]
methods = args[0].split(",")
for m in methods:
    kw = dict(grid=GRID) if m.startswith("draft") else {}
    turn = [0]

    def call():
        i = turn[0] % len(sets)
        turn[0] += 1
        return qvattn.attention(*sets[i], method=m, layer=i, step=step, num_steps=40, **kw)
    for _ in range(3): call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4): call()
        torch.cuda.synchronize()
    path = f"/tmp/trace_{m.replace('/', '_').replace('+', '_').replace('@', '_')}.json"
    prof.export_chrome_trace(path)
    ev = json.load(open(path))["traceEvents"]
    gpu = sorted([e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e], key=lambda e: e["ts"])
    rt = [e for e in ev if e.get("cat") == "cuda_runtime" and "dur" in e]
    launch_of = {e["args"].get("correlation"): e for e in rt if "args" in e}
    t0, t1 = gpu[0]["ts"], max(e["ts"] + e["dur"] for e in gpu)
    busy_end = t0; gaps = []; busy = 0.0; prev = None
    for e in gpu:
        s, f = e["ts"], e["ts"] + e["dur"]
        if s > busy_end + 1.0 and prev is not None:
            L = launch_of.get(e["args"].get("correlation"))
            late = (L["ts"] + L["dur"]) - busy_end if L else float("nan")
            gaps.append((s - busy_end, prev["name"][:40], e["name"][:40], late, L["name"] if L else "?"))
        if f > busy_end:
            busy += f - max(s, busy_end); busy_end = f; prev = e
    tot = sum(x[0] for x in gaps)
    print(f"== {m} (step {step}): window {(t1 - t0) / 4000:.3f} ms/call, busy {busy / 4000:.3f}, gaps {tot / 4000:.3f} ms/call, {len(gaps) / 4:.0f} gaps/call")
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for gl, a, b, late, ln in gaps:
        key = (a, b); agg[key][0] += 1; agg[key][1] += gl; agg[key][2] += late if late == late else 0
    for (a, b), (n, s, l) in sorted(agg.items(), key=lambda x: -x[1][1])[:14]:
        print(f"   {s / 4:8.1f} us/call  {n / 4:4.1f}x  {a:40s} -> {b:40s} (launch ended {l / n:7.1f} us after the idle began)")
    long_rt = collections.defaultdict(lambda: [0, 0.0])
    for e in rt:
        long_rt[e["name"]][0] += 1; long_rt[e["name"]][1] += e["dur"]
    print("   host runtime calls per call:", ", ".join(f"{n} {c / 4:.0f}x {d / 4:.0f}us" for n, (c, d) in sorted(long_rt.items(), key=lambda x: -x[1][1])[:8]))
    if timeline:
        # the last call: everything that starts after the previous call's
        # attention kernel (the longest) ends; side streams may start their
        # first kernel before the main stream's, so no kernel name marks it
        longest = max(gpu, key=lambda e: e["dur"])["name"]
        ends = [e["ts"] + e["dur"] for e in gpu if e["name"] == longest]
        cut = ends[-2] if len(ends) >= 2 else float("-inf")
        last = [e for e in gpu if e["ts"] >= cut]
        c0 = last[0]["ts"]
        print("   last call:  start     end  stream  kernel")
        for e in last:
            print(f"   {e['ts'] - c0:10.1f} {e['ts'] + e['dur'] - c0:8.1f}  {e['args'].get('stream', '?'):>6}  {e['name'][:70]}")
        # the attention kernel is the call's longest; what runs before it is
        # the preparation (and the router or grouping), as the GPU sees it
        att = max(last, key=lambda e: e["dur"])
        first = min(e["ts"] for e in last)
        print(f"   before the attention kernel: {att['ts'] - first:.1f} us ({att['name'][:40]})")
