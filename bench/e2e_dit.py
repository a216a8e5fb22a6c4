#!/usr/bin/env python3
"""End-to-end DiT benchmark: one denoising forward of diffusers'
WanTransformer3DModel, BF16 cuDNN SDPA vs qvattn methods, and the estimate
over a 40-step schedule.

The model has the Wan2.2-A14B (T2V) configuration -- 40 layers, 40 heads,
head dim 128, FFN 13824, text dim 4096 -- with random BF16 weights (speed
does not depend on the weights; none are downloaded).  The input is a 720p,
81-frame latent: [1, 16, 21, 90, 160] -> 21 x 45 x 80 = 75,600 video
tokens, 512 text tokens.

Cases (each: --warmup untimed forwards, then the median of --iters):
  sdpa       diffusers' own processors, torch SDPA forced to the cuDNN
             backend (the baseline),
  sage8      qvattn processors (qvattn.diffusers.apply) on the self-attention;
             cross-attention stays on SDPA (cuDNN) as in every case,
  vc8 (the Python default), vc8+expcast (with the paper's beta) and
             vc8+expcast-centred at a grouping step (step 0: k-means), a reuse step
             (step 1: stored permutation, demeaning) and a plain step (step
             12 >= ceil(40/4): stored permutation, no demeaning),
  draft@85/0/0/15 at a sparse step and at a dense warm-up step, where
             qva_supports() says the device runs it; otherwise the row says
             "skipped: <reason>".  The warm-up step runs on the backend of
             option draft.dense_backend (default: torch SDPA on CUDA, under
             the same sdpa_kernel(CUDNN_ATTENTION) as every case; the
             library's BF16 kernel with --draft-dense-backend qvattn);
             with --draft-warmup-method M the warm-up steps run as M and
             are timed once per action of M's schedule (vc8: grouping and
             reuse steps).
The step is pinned with qvattn.diffusers.set_step(model, step, 40).

Reported: forward time per case, speedup vs SDPA per step, and the 40-step
estimate: sum over steps of the time of the step's action (V-Smooth: 3
grouping + 7 reuse + 30 plain steps; draft: ceil(40/4) = 10 dense warm-up
steps + 30 sparse), vs 40 x the SDPA step.  Fidelity: rel-L2 of the model
output vs the SDPA run's output (same inputs; random weights, so only a
sanity check).

    QVATTN_LIB=build-gpu/libqvattn.so python3 bench/e2e_dit.py   # H200
    python3 bench/e2e_dit.py --tiny                              # CPU smoke test

Results: markdown on stdout and raw JSON + markdown as
e2e-<UTC date-time>-<device>.{json,md} in --out DIR, else $OUT if set, else
bench/out/ (ignored by git; rewritten after each case, so a cut-short run
keeps what it finished).  Raw files are not committed: figures worth keeping
go, with their commit, GPU, date and command, into bench/RESULTS.md.
"""
import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import OUT_HELP, git_rev, out_dir, use_checkout_package  # noqa: E402

A14B = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
            in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
            ffn_dim=13824, num_layers=40, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
            in_channels=4, out_channels=4, text_dim=64, freq_dim=32, ffn_dim=128,
            num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            eps=1e-6, rope_max_seq_len=64)
# latent [B, C, F, H, W]: 720p (1280x720), 81 frames -> VAE /4 in time, /8 in space
LATENT_720P = (1, 16, 21, 90, 160)
LATENT_TINY = (1, 4, 4, 16, 16)  # 4 x 8 x 8 = 256 tokens
TEXT_TOKENS = 512
DEFAULT_METHODS = "sage8,vc8+expcast,vc8,vc8+expcast-centred,draft@85/0/0/15"


def log(*a):
    print(*a, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true",
                   help="a 2-layer, 2-head, head-dim-64 model on a 4x8x8 latent (CPU "
                        "smoke test; float32 on the CPU)")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma list of qvattn methods (default: %(default)s); 'sdpa' "
                        "adds qvattn's processors running torch SDPA (plumbing cost)")
    p.add_argument("--num-steps", type=int, default=40, help="schedule length")
    p.add_argument("--draft-warmup", type=float, default=0.25,
                   help="draft dense warm-up: fraction of the steps (< 1) or a count")
    p.add_argument("--draft-dense-backend", choices=("sdpa", "qvattn"), default=None,
                   help="draft dense warm-up steps on torch SDPA or on the library's "
                        "BF16 kernel (default: the library's default, sdpa on CUDA)")
    p.add_argument("--draft-warmup-method", default=None, metavar="M",
                   help="run draft's dense warm-up steps as the dense method M (option "
                        "draft.warmup_method, e.g. vc8 or sage8; default: bf16); the "
                        "warm-up steps are timed per action of M's schedule")
    p.add_argument("--iters", type=int, default=2, help="timed forwards per case")
    p.add_argument("--warmup", type=int, default=1, help="untimed forwards per case")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) or float32")
    p.add_argument("--no-cudnn", action="store_true",
                   help="do not force the cuDNN SDPA backend")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=float, default=540.0,
                   help="soft limit: no new case starts after this many seconds")
    p.add_argument("--out", metavar="DIR", default=None, help=OUT_HELP)
    return p.parse_args(argv)


def load_qvattn():
    use_checkout_package()
    import torch  # before libqvattn: see qvattn/__init__.py
    import qvattn
    del torch
    import qvattn.diffusers
    return qvattn




class Bench:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        self.qvattn = load_qvattn()
        self.t0 = time.time()
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(dev)
        self.cuda = self.device.type == "cuda"
        if args.dtype:
            self.dtype = getattr(torch, args.dtype)
        else:
            self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.cfg = TINY if args.tiny else A14B
        self.latent = LATENT_TINY if args.tiny else LATENT_720P
        self.text_tokens = 16 if args.tiny else TEXT_TOKENS
        p = self.cfg["patch_size"]
        _, _, f, h, w = self.latent
        self.grid = (f // p[0], h // p[1], w // p[2])
        self.tokens = self.grid[0] * self.grid[1] * self.grid[2]
        self.cases = []
        self.results = {"meta": self.meta(), "cases": self.cases}
        self.out_dir = out_dir(args.out)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        name = self.results["meta"]["device_name"]
        tag = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "cpu"
        self.base = os.path.join(self.out_dir, f"e2e-{stamp}-{tag}{'-tiny' if args.tiny else ''}")

    def meta(self):
        torch = self.torch
        import diffusers
        cudnn = None
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:
            pass
        return {
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": str(self.device),
            "device_name": (torch.cuda.get_device_name(self.device) if self.cuda
                            else platform.processor() or platform.machine()),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cudnn": cudnn,
            "diffusers": diffusers.__version__, "python": platform.python_version(),
            "qvattn_build": self.qvattn.build_info(),
            "qvattn_lib": self.qvattn._ffi.lib_path, "git": git_rev(),
            "command": " ".join(shlex.quote(x) for x in
                                [os.path.basename(sys.executable)] + sys.argv),
            "model": ("WanTransformer3DModel, Wan2.2-A14B config (40 layers, 40 heads, "
                      "head dim 128), random weights" if not self.args.tiny else
                      "WanTransformer3DModel, tiny config (2 layers, 2 heads, head dim 64)"),
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in self.cfg.items()},
            "latent": list(self.latent), "text_tokens": self.text_tokens,
            "dtype": str(self.dtype).replace("torch.", ""),
            "sdpa_backend": "native (math/flash)" if (self.args.no_cudnn or not self.cuda)
            else "cuDNN (sdpa_kernel(CUDNN_ATTENTION))",
            "num_steps": self.args.num_steps,
            "timing": ("%s around each forward; %d warm-up, median of %d" %
                       ("CUDA events" if self.cuda else "time.perf_counter",
                        self.args.warmup, self.args.iters)),
        }

    # ------------------------------------------------------------ model
    def build(self):
        torch = self.torch
        from diffusers import WanTransformer3DModel
        torch.manual_seed(self.args.seed)
        t = time.time()
        old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                model = WanTransformer3DModel(**self.cfg)
        finally:
            torch.set_default_dtype(old)
        model = model.to(self.device).eval().requires_grad_(False)
        g = torch.Generator(device="cpu").manual_seed(self.args.seed + 1)
        self.x = torch.randn(self.latent, generator=g).to(self.device, self.dtype)
        self.enc = torch.randn((1, self.text_tokens, self.cfg["text_dim"]),
                               generator=g).to(self.device, self.dtype)
        self.timestep = torch.tensor([999.0], device=self.device)
        self.model = model
        n = sum(p.numel() for p in model.parameters())
        self.results["meta"]["parameters"] = n
        self.results["meta"]["video_tokens"] = self.tokens
        self.results["meta"]["build_s"] = round(time.time() - t, 1)
        log(f"model: {n / 1e9:.2f} B parameters, {self.tokens} video tokens "
            f"(grid {self.grid}), built in {time.time() - t:.1f} s")

    def sdpa_ctx(self):
        import contextlib
        if self.args.no_cudnn or not self.cuda:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)

    def forward(self):
        return self.model(self.x, self.timestep, self.enc, return_dict=False)[0]

    def time_forward(self):
        """(median ms, all ms, output of the last forward)."""
        torch = self.torch
        times, out = [], None
        with torch.inference_mode(), self.sdpa_ctx():
            for _ in range(self.args.warmup):
                out = self.forward()
            for _ in range(self.args.iters):
                if self.cuda:
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    out = self.forward()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b))
                else:
                    t = time.perf_counter()
                    out = self.forward()
                    times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times), times, out

    def rel_l2(self, out):
        if self.ref is None or out is None:
            return None
        a, r = out.double(), self.ref.double()
        d = float((a - r).norm() / r.norm())
        return d if math.isfinite(d) else float("inf")

    def out_of_time(self):
        return time.time() - self.t0 > self.args.time_limit_s

    # ------------------------------------------------------------ cases
    def case_sdpa(self):
        ms, all_ms, out = self.time_forward()
        self.ref = out.float().clone()
        self.sdpa_ms = ms
        finite = bool(self.torch.isfinite(out).all())
        self.add({"method": "sdpa", "label": "SDPA " + ("cuDNN" if self.cuda and not
                                                        self.args.no_cudnn else "torch"),
                  "steps": {"step": {"ms": ms, "all_ms": all_ms}},
                  "output_finite": finite})

    def case_method(self, method):
        qd = self.qvattn.diffusers
        n = self.args.num_steps
        if method != "sdpa":
            dev = "cuda" if self.cuda else "cpu"
            ok, why = self.qvattn.supports(method, dev, str(self.dtype),
                                           self.cfg["attention_head_dim"])
            if not ok:
                log(f"{method}: skipped: {why}")
                self.add({"method": method, "status": f"skipped: {why}"})
                return
        dw = self.args.draft_warmup
        dw = int(dw) if dw >= 1 else dw
        warm = qd.draft_warmup_steps(n, dw)
        if method.startswith("vc"):
            window = (n + 3) // 4
            actions = {"group": 0, "reuse": 1 if n > 1 else 0, "plain": min(n - 1, window + 2)}
        elif method.startswith("draft"):
            actions = {"sparse": min(n - 1, warm)}
            for s, a in enumerate(self.warmup_actions(warm, n)):
                actions.setdefault(a, s)
        else:
            actions = {"step": 0}
        rec = {"method": method, "label": "qvattn " + method, "steps": {}}
        opts = {}
        if method.startswith("draft"):
            rec["draft_warmup_steps"] = warm
            if self.args.draft_warmup_method:
                opts["draft.warmup_method"] = self.args.draft_warmup_method
                rec["draft_warmup_method"] = self.args.draft_warmup_method
                rec["label"] += f" (warm-up as {self.args.draft_warmup_method})"
            if self.args.draft_dense_backend:
                opts["draft.dense_backend"] = self.args.draft_dense_backend
            from qvattn._config import dense_backend
            rec["draft_dense_backend"] = dense_backend(
                self.qvattn.ops.options_string(opts), self.cuda)
        handle = qd.apply(self.model, method, num_steps=n, draft_warmup=dw, options=opts)
        try:
            for action, step in actions.items():
                if self.out_of_time():
                    rec["status"] = "cut short: time limit"
                    break
                qd.set_step(self.model, step, n)
                # a fresh state where the step does not build on the one
                # before (a V-Smooth reuse step needs its grouping step's)
                if action in ("group", "dense:group") or (
                        method.startswith("draft") and not action.startswith("dense:")):
                    handle.state.reset()
                ms, all_ms, out = self.time_forward()
                rec["steps"][action] = {"step": step, "ms": ms, "all_ms": all_ms,
                                        "rel_l2_vs_sdpa": self.rel_l2(out)}
                log(f"{method} {action} (step {step}): {ms:.1f} ms, "
                    f"{self.sdpa_ms / ms:.2f}x vs SDPA")
        except Exception as e:
            rec["status"] = f"error: {type(e).__name__}: {e}"
            log(traceback.format_exc())
        finally:
            qd.remove(self.model)
        self.add(rec)

    def warmup_actions(self, warm, n):
        """The action of each draft warm-up step: "dense" (bf16), or with
        --draft-warmup-method M, "dense:" + M's V-Smooth action (vc*: group,
        reuse or plain, the library's schedule) or "dense:step"."""
        m = self.args.draft_warmup_method
        if not m:
            return ["dense"] * warm
        if m.startswith("vc"):
            cfg = self.qvattn._ffi.make_config(m)
            return ["dense:" + self.qvattn._ffi.schedule_action(cfg, s, n) for s in range(warm)]
        return ["dense:step"] * warm

    def add(self, rec):
        n = self.args.num_steps
        qd = self.qvattn.diffusers
        steps = rec.get("steps") or {}
        if steps and getattr(self, "sdpa_ms", None):
            for s in steps.values():
                s["speedup_vs_sdpa"] = self.sdpa_ms / s["ms"]
            times = {a: s["ms"] for a, s in steps.items()}
            m = rec["method"]
            try:
                if m == "sdpa" or not (m.startswith("vc") or m.startswith("draft")):
                    total = qd.schedule_cost({"step": times["step"]}, n, "sage8")
                elif m.startswith("draft") and rec.get("draft_warmup_method"):
                    warm = rec.get("draft_warmup_steps", 0)
                    total = (sum(times[a] for a in self.warmup_actions(warm, n))
                             + (n - warm) * times["sparse"])
                elif m.startswith("draft"):
                    t = dict(times)
                    t.setdefault("dense", t.get("sparse"))
                    total = qd.schedule_cost(t, n, m, rec.get("draft_warmup_steps", 0))
                else:
                    total = qd.schedule_cost(times, n, m)
                rec["schedule_ms"] = total
                rec["schedule_speedup_vs_sdpa"] = n * self.sdpa_ms / total
            except KeyError:
                rec["schedule_ms"] = None  # an action was cut short
        self.cases.append(rec)
        self.write()

    def write(self):
        self.results["meta"]["elapsed_s"] = round(time.time() - self.t0, 1)
        os.makedirs(self.out_dir, exist_ok=True)
        with open(self.base + ".json", "w") as f:
            json.dump(self.results, f, indent=1, default=str)
        with open(self.base + ".md", "w") as f:
            f.write(markdown(self.results))


def markdown(res):
    m = res["meta"]
    n = m["num_steps"]
    lines = [f"# End-to-end DiT forward: {m['model']}", "",
             f"{m['date_utc']} on {m['device_name']} ({m['device']}), torch {m['torch']} "
             f"(CUDA {m['torch_cuda']}, cuDNN {m['cudnn']}), diffusers {m['diffusers']}, "
             f"{m['qvattn_build']}, git {m['git']}.", "",
             f"Latent {m['latent']} ({m.get('video_tokens')} video tokens), "
             f"{m['text_tokens']} text tokens, {m['dtype']}; SDPA backend: "
             f"{m['sdpa_backend']}; {m['timing']}.", "",
             f"`{m['command']}`", "",
             f"| case | step | forward ms | vs SDPA | rel-L2 vs SDPA | {n}-step est. s "
             f"| {n}-step vs SDPA |",
             "|---|---|---|---|---|---|---|"]
    for c in res["cases"]:
        if not c.get("steps"):
            lines.append(f"| {c.get('label', c['method'])} | - | {c.get('status', '')} "
                         "| | | | |")
            continue
        first = True
        for action, s in c["steps"].items():
            est = c.get("schedule_ms") if first else None
            sp = c.get("schedule_speedup_vs_sdpa") if first else None
            where = action if action == "step" else f"{action} ({s.get('step')})"
            if action == "dense" and c.get("draft_dense_backend"):
                where = f"dense ({s.get('step')}, {c['draft_dense_backend']})"
            rl = s.get("rel_l2_vs_sdpa")
            lines.append("| %s | %s | %.1f | %s | %s | %s | %s |" % (
                c.get("label", c["method"]) if first else "", where, s["ms"],
                "%.2fx" % s["speedup_vs_sdpa"] if s.get("speedup_vs_sdpa") else "",
                "%.2e" % rl if rl is not None else "",
                "%.1f" % (est / 1e3) if est else "", "%.2fx" % sp if sp else ""))
            first = False
        if c.get("status"):
            lines.append(f"| | {c['status']} | | | | | |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    bench = Bench(args)
    from qvattn._config import _base_config
    for method in [m for m in args.methods.split(",") if m and m != "sdpa"]:
        try:
            _base_config(method, "")
        except ValueError as e:
            log(f"e2e_dit: bad --methods entry {method!r}: {e}")
            return 2
    if args.tiny:
        args.num_steps = min(args.num_steps, 8) if args.num_steps == 40 else args.num_steps
        bench.results["meta"]["num_steps"] = args.num_steps
    bench.ref = None
    bench.build()
    bench.case_sdpa()
    log(f"SDPA: {bench.sdpa_ms:.1f} ms per forward")
    for method in [m for m in args.methods.split(",") if m]:
        if bench.out_of_time():
            bench.add({"method": method, "status": "skipped: time limit"})
            continue
        bench.case_method(method)
    md = markdown(bench.results)
    bench.write()
    log(md)
    log(f"results: {bench.base}.json / .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
