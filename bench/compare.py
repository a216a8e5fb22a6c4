#!/usr/bin/env python3
"""qvattn vs PyTorch SDPA (cuDNN and FlashAttention backends) on video-DiT shapes.

One run times, for each shape, bf16 inputs in HND layout [B, H, N, D]:
  * torch SDPA BF16 with the cuDNN backend and with the FlashAttention backend,
  * each qvattn method of --methods through the ctypes binding, where
    qva_supports() says the CUDA backend can run it:
      - the full call (qva_attention as is); for V-Smooth (vc*) methods
        on a grouping step (num_steps=40, step=0: k-means runs), on a
        reuse step (step=1, same context: the stored permutation is reused,
        the block means restored) and on a plain step (step=20, past the
        window: the stored permutation, no means),
      - the kernel alone, from the library's per-call profiling
        (qva_context_set_profiling / qva_context_last_timings) where the
        library has it, else n/a; each sample is the second of two
        back-to-back calls (a library that waits at the end of a profiled
        call, as qvattn did before 2026-12-03, charges its host launches
        and idle clocks to the first phases).
Timing: CUDA events around every call on the current stream, warm-up first,
then the median of >= --iters calls, rotating over --sets input sets so the
L2 cache never holds the operands of the next call.  --rounds R times every
case of a shape R times, baselines and methods in turn, and reports medians
over the rounds (ratios to cuDNN taken within each round): a GPU whose speed
drifts through a run then favours no case (bench/NOTES.md, "The draft
call's run order").
TOPS = 4*B*H*N^2*D / t / 1e12.  "vs cuDNN" = cuDNN time / this time.
Fidelity: rel-L2 of each output against a float64 reference computed on the
GPU for --rows sampled query rows of --heads heads (input set 0).

Results: a markdown table on stdout (last), and raw JSON + markdown files
compare-<UTC date-time>-<gpu>.{json,md} in --out DIR, else $OUT if set, else
bench/out/ (ignored by git; written after every shape, so a killed run keeps
what it finished).  Raw files are not committed: figures worth keeping go,
with their commit, GPU, date and command, into bench/RESULTS.md.

    QVATTN_LIB=build-gpu/libqvattn.so python3 bench/compare.py
    python3 bench/compare.py --shapes small --methods sage8,vc8+expcast --out /tmp/bench
"""
import argparse
import contextlib
import datetime as _dt
import json
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
from benchutil import OUT_HELP, git_rev, method_suffixes, out_dir, use_checkout_package  # noqa: E402
import peers  # noqa: E402

SHAPES = {  # name -> (B, H, N, D)
    "wan2.2-720p": (1, 40, 75600, 128),
    "longcat-480p": (1, 32, 37440, 128),
    "hunyuanvideo1.5-720p": (1, 16, 111700, 128),
    "small": (1, 8, 8192, 128),
    "small-d64": (1, 16, 8192, 64),
    # head dim 64 at a video length: CogVideoX-5B's 13x30x45 latent tokens
    # and 226 text tokens, 48 heads
    "cogvideox-5b": (1, 48, 17776, 64),
    "wan2.2-720p-text": (1, 40, 76112, 128),
}
DEFAULT_SHAPES = ["wan2.2-720p", "longcat-480p", "hunyuanvideo1.5-720p"]
# Latent grids (T, H, W) for the draft@ methods, which need the video layout;
# a shape without one reports draft as unsupported.  Wan2.2 720p x 81 frames:
# latent 21 x 90 x 160 patchified 1x2x2 -> 21 x 45 x 80 tokens, no prefix.
# HunyuanVideo-1.5 720p x 121 frames: 31 x 45 x 80 latent tokens + 100
# prefix tokens (111,700 in all).  wan2.2-720p-text: the Wan2.2 grid with a
# 512-token text prefix (umT5's length) in the same sequence, prefix first.
# cogvideox-5b: 13 x 30 x 45 latent tokens after the text's 226.
# The prefix is every token outside the grid (N - T*H*W).
GRIDS = {"wan2.2-720p": (21, 45, 80), "wan2.2-720p-text": (21, 45, 80),
         "hunyuanvideo1.5-720p": (31, 45, 80), "small": (8, 32, 32),
         "small-d64": (8, 32, 32), "cogvideox-5b": (13, 30, 45)}
DEFAULT_METHODS = ("sage8,vc8,vc8+expcast,vc8+expcast-centred,vc8+nohadamard,fp8,"
                   "sage8+nohadamard+fp32sum")
VSMOOTH_NUM_STEPS = 40
# A step past V-Smooth's window (the first quarter): the stored permutation,
# no block means, the plain kernel (three quarters of the schedule).
VSMOOTH_PLAIN_STEP = 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="default",
                   help="'default' (the three video shapes), 'small', 'all', or a "
                        "comma list of: " + ", ".join(SHAPES))
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma list of qvattn methods, each METHOD[:KEY=VALUE]... with "
                        "qvattn.attention options, e.g. vc8:vsmooth.schedule=demean "
                        "(default: %(default)s)")
    p.add_argument("--baselines", default="cudnn,flash,sage2",
                   help="SDPA backends to time: cudnn, flash, and peers where installed "
                        "(bench/peers.py: sage2) (comma list; '' for none)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per case (>= 10 "
                   "unless --budget-s cuts a very slow case short)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (at least --sets)")
    p.add_argument("--sets", type=int, default=2, help="input sets rotated between calls")
    p.add_argument("--rows", type=int, default=256, help="query rows sampled for fidelity")
    p.add_argument("--heads", type=int, default=2, help="heads sampled for fidelity")
    p.add_argument("--q-scale", type=float, default=2.0,
                   help="std of q (k, v are N(0,1) plus per-head channel offsets); "
                        "larger = sharper softmax")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every case of a shape this many times, the baselines and "
                        "the methods in turn; each figure is the median over the rounds "
                        "and each ratio to cuDNN the median of the rounds' ratios, so a "
                        "GPU whose speed drifts through the run biases no case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=30.0,
                   help="max seconds of timed calls per case; a slower case runs "
                        "fewer iterations (>= 3) and is flagged")
    p.add_argument("--time-limit-s", type=float, default=540.0,
                   help="soft limit for the whole run: later cases are skipped")
    p.add_argument("--out", metavar="DIR", default=None, help=OUT_HELP)
    return p.parse_args(argv)


def shape_list(spec):
    if spec == "default":
        return list(DEFAULT_SHAPES)
    if spec == "all":
        return list(DEFAULT_SHAPES) + ["small"]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        if n not in SHAPES:
            sys.exit(f"unknown shape {n!r}; known: {', '.join(SHAPES)}")
    return names


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------------ qvattn
def load_qvattn():
    """(qvattn module, _ffi module, error string)."""
    use_checkout_package()
    try:
        import qvattn
        from qvattn import _ffi
        return qvattn, _ffi, None
    except Exception as e:  # library missing or not loadable
        return None, None, f"{type(e).__name__}: {e}"


# ------------------------------------------------------------------ helpers
def base_is_draft(ffi, cfg):
    return cfg.method == getattr(ffi, "QVA_METHOD_DRAFT", -1)


def draft_kept_fraction(cfg, grid, n):
    """(computed 128x128 blocks / dense N^2 equivalent, kept region pairs)
    of a draft config on grid (T, H, W) with n tokens in all: the pairs the
    quotas keep (skip fraction rounded as the library's largest remainder
    does, to within a pair) plus every prefix block of every video query
    region, each a full block, over N^2 / 128^2 (the prefix query rows run
    the dense bf16 kernel and are not counted)."""
    t, h, w = grid
    regions = t * -(-(h * w) // 128)
    pairs = regions * regions
    kept = pairs - round(cfg.draft.frac_skip * pairs)
    prefix_blocks = -(-(n - t * h * w) // 128)
    blocks = kept + regions * prefix_blocks
    return blocks * 128.0 * 128.0 / (n * n), kept


def method_config(ffi, name, **fields):
    """The config of a --methods name, METHOD[:KEY=VALUE]... (the fidelity
    harness's form: each suffix a qvattn.attention option, e.g.
    "vc8+hadamard:vsmooth.schedule=demean"), with top-level fields set."""
    from qvattn import _config
    method, opts = method_suffixes(name)
    cfg = _config._base_config(method, _config.options_string(opts))
    for key, value in fields.items():
        setattr(cfg, key, value)
    return cfg


def schedule_counts(ffi, num_steps=VSMOOTH_NUM_STEPS, cfg=None):
    """{action name: steps} of a V-Smooth schedule over num_steps (cfg's,
    default vc8's), as the library decides it (qva_schedule_action)."""
    cfg = cfg if cfg is not None else ffi.make_config("vc8")
    counts = {name: 0 for name in ffi.STEP_ACTION_NAMES.values()}
    for step in range(num_steps):
        counts[ffi.schedule_action(cfg, step, num_steps)] += 1
    return counts


def schedule_mean(entries, counts, key):
    """The step-weighted mean of entries' `key` (ms) over the schedule, or
    None unless every action with steps has a measured entry."""
    by_mode = {e.get("mode"): e.get(key) for e in entries if e.get("status") == "ok"}
    total = sum(counts.values())
    if not total or any(n and not isinstance(by_mode.get(a), (int, float))
                        for a, n in counts.items()):
        return None
    return sum(n * by_mode[a] for a, n in counts.items() if n) / total


def flops(B, H, N, D):
    return 4.0 * B * H * N * N * D


def tops(fl, ms):
    return fl / (ms * 1e-3) / 1e12 if ms else None


def ratios_to_cudnn(entries):
    """Each entry's vs_cudnn and kernel_vs_cudnn against the cuDNN entry of
    the same list (one round of one shape)."""
    cudnn = next((e for e in entries if e.get("impl") == "sdpa-cudnn" and e.get("ms")), None)
    if cudnn is None:
        return
    for e in entries:
        if e.get("ms"):
            e["vs_cudnn"] = cudnn["ms"] / e["ms"]
        if e.get("kernel_ms"):
            e["kernel_vs_cudnn"] = cudnn["ms"] / e["kernel_ms"]


# what --rounds takes the median of; the rest of an entry is its first round's
ROUND_KEYS = ("ms", "ms_min", "ms_max", "kernel_ms", "prep_ms", "grouping_ms",
              "vs_cudnn", "kernel_vs_cudnn")


def merge_rounds(rounds, fl):
    """One entry list from several rounds of the same cases: each case as
    its first round's entry, with the ROUND_KEYS replaced by their medians
    over the rounds that have them, the values of every round under
    "rounds", and TOPS from the median times.  A case is its impl, row
    name and step, and its place among equal ones (a method listed twice,
    or two steps a schedule names alike, stay apart)."""
    if len(rounds) <= 1:
        return list(rounds[0]) if rounds else []

    def keyed(entries):
        seen, out = {}, {}
        for e in entries:
            k = (e.get("impl"), e.get("mode"), e.get("step"))
            out[k + (seen.get(k, 0),)] = e
            seen[k] = seen.get(k, 0) + 1
        return out

    by_round = [keyed(r) for r in rounds]
    merged = []
    for k, e in by_round[0].items():
        same = [r[k] for r in by_round if k in r]
        m = dict(e)
        per = {}
        for key in ROUND_KEYS:
            vals = [x[key] for x in same if isinstance(x.get(key), (int, float))]
            if vals:
                m[key] = statistics.median(vals)
                per[key] = vals
        if per:
            m["rounds"] = per
            m["tops"] = tops(fl, m.get("ms"))
            if m.get("kernel_ms"):
                m["kernel_tops"] = tops(fl, m["kernel_ms"])
                if m.get("kept_fraction"):
                    m["block_tops"] = tops(fl * m["kept_fraction"], m["kernel_ms"])
        merged.append(m)
    return merged




class Timer:
    """CUDA-event timing of call(i) rotating over input sets."""

    def __init__(self, torch, args):
        self.torch = torch
        self.args = args

    def run(self, call, nsets):
        torch, a = self.torch, self.args
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        for i in range(max(a.warmup, nsets)):
            call(i % nsets)
        torch.cuda.synchronize()
        s, e = ev(), ev()
        s.record()
        call(0)
        e.record()
        e.synchronize()
        est = s.elapsed_time(e)
        n = a.iters
        reduced = False
        budget_ms = a.budget_s * 1e3
        if est * n > budget_ms:
            n = max(3, int(budget_ms / max(est, 1e-3)))
            reduced = n < a.iters
        pairs = [(ev(), ev()) for _ in range(n)]
        for j, (s, e) in enumerate(pairs):
            s.record()
            call((j + 1) % nsets)
            e.record()
        torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, e in pairs]
        return {"ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms),
                "iters": n, "iters_reduced": reduced}


# ------------------------------------------------------------------ the run
class Bench:
    def __init__(self, args, torch):
        self.args = args
        self.torch = torch
        self.t0 = time.time()
        self.deadline = self.t0 + args.time_limit_s
        self.timer = Timer(torch, args)
        self.qvattn, self.ffi, self.qva_err = load_qvattn()
        self.results = {"meta": self.meta(), "shapes": []}
        self.out_dir = out_dir(args.out)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", self.results["meta"]["gpu"]).strip("-").lower()
        self.base = os.path.join(self.out_dir, f"compare-{stamp}-{gpu}")

    def meta(self):
        torch = self.torch
        cudnn = None
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:
            pass
        m = {
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "cudnn": cudnn,
            "python": platform.python_version(),
            "command": " ".join(shlex.quote(x) for x in [os.path.basename(sys.executable)] + sys.argv),
            "argv": sys.argv,
            "QVATTN_LIB": os.environ.get("QVATTN_LIB"),
            "git": git_rev(),
            "timing": ("CUDA events per call on the current stream; warm-up %d; median "
                       "of %d calls rotating over %d input sets" %
                       (max(self.args.warmup, self.args.sets), self.args.iters, self.args.sets)
                       + ("; %d rounds of every case per shape (baselines, then methods), "
                          "medians over the rounds, ratios to cuDNN within each round"
                          % self.args.rounds if self.args.rounds > 1 else "")),
            "flops": "4*B*H*N^2*D",
            "data": ("bf16 HND; q ~ %g*N(0,1); k ~ N(0,1) + 0.5*N(0,1)[head,channel]; "
                     "v ~ N(0,1) + N(0,1)[head,channel]; seed %d" %
                     (self.args.q_scale, self.args.seed)),
            "fidelity": ("rel-L2 vs float64 reference on %d sampled query rows x %d heads "
                         "(input set 0)" % (self.args.rows, self.args.heads)),
        }
        if self.qvattn is not None:
            m["qvattn_build"] = self.ffi.build_info()
            m["qvattn_lib"] = self.ffi.lib_path
            m["qvattn_cuda_available"] = self.ffi.cuda_available()
            m["kernel_alone"] = ("qva_context_last_timings (profiling on)"
                                 if self.qvattn.Context.has_profiling() else "n/a")
            m["schedule_counts"] = schedule_counts(self.ffi)
        else:
            m["qvattn_error"] = self.qva_err
        return m

    # ---------------------------------------------------------------- data
    def make_inputs(self, B, H, N, D):
        torch, a = self.torch, self.args
        g = torch.Generator(device="cuda")
        g.manual_seed(a.seed)
        bf = torch.bfloat16
        sets = []
        for _ in range(a.sets):
            q = torch.randn(B, H, N, D, device="cuda", dtype=bf, generator=g)
            q.mul_(a.q_scale)
            k = torch.randn(B, H, N, D, device="cuda", dtype=bf, generator=g)
            k.add_(0.5 * torch.randn(1, H, 1, D, device="cuda", dtype=bf, generator=g))
            v = torch.randn(B, H, N, D, device="cuda", dtype=bf, generator=g)
            v.add_(torch.randn(1, H, 1, D, device="cuda", dtype=bf, generator=g))
            sets.append((q, k, v))
        return sets

    def reference(self, q, k, v, H, N, D):
        torch, a = self.torch, self.args
        gc = torch.Generator()
        gc.manual_seed(a.seed + 1)
        nh = min(a.heads, H)
        heads = sorted({round(i * (H - 1) / max(nh - 1, 1)) for i in range(nh)})
        rows = torch.randperm(N, generator=gc)[:min(a.rows, N)].sort().values
        heads_t = torch.tensor(heads, device="cuda")
        rows_t = rows.to("cuda")
        scale = 1.0 / (D ** 0.5)
        refs = []
        for h in heads:
            qs = q[0, h].index_select(0, rows_t).double()
            kh = k[0, h].double()
            s = (qs @ kh.T) * scale
            p = torch.softmax(s, dim=-1)
            del s, kh
            refs.append(p @ v[0, h].double())
            del p
        return {"heads": heads_t, "rows": rows_t, "ref": torch.stack(refs)}

    def rel_l2(self, out, ref):
        o = out[0].index_select(0, ref["heads"]).index_select(1, ref["rows"]).double()
        r = ref["ref"]
        if not bool(self.torch.isfinite(o).all()):
            return float("nan")
        return float((o - r).norm() / r.norm())

    # ---------------------------------------------------------------- cases
    def out_of_time(self):
        return time.time() > self.deadline

    def timed_entry(self, e, call, sets, ref, fl, context=None):
        """Times call(q, k, v) over the input sets (inside `context`, e.g. an
        SDPA backend choice) and checks its output against ref; fills e."""
        if self.out_of_time():
            e["status"] = "skipped: time limit"
        else:
            out = None
            try:
                with context or contextlib.nullcontext():
                    e.update(self.timer.run(lambda i: call(*sets[i]), len(sets)))
                    out = call(*sets[0])
                e["status"] = "ok"
            except Exception as ex:  # backend or peer not available for this shape/GPU
                msg = (str(ex).splitlines() or [""])[0][:200]
                e["status"] = f"unavailable: {type(ex).__name__}: {msg}"
            if out is not None:
                try:
                    e["rel_l2"] = self.rel_l2(out, ref)
                except Exception as ex:
                    e["status"] = f"ok (fidelity failed: {type(ex).__name__}: {ex})"
                del out
        e["tops"] = tops(fl, e.get("ms"))
        log(f"  {e['impl']:<22} {fmt_ms(e.get('ms'))} ms  {e['status']}")
        self.torch.cuda.empty_cache()
        return e

    def sdpa_entries(self, sets, ref, fl):
        """The baselines: torch SDPA backends and installed peers (bench/peers.py)."""
        entries = []
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except Exception as e:
            return [{"impl": f"sdpa-{b}", "status": f"unavailable: {e}"}
                    for b in self.args.baselines.split(",") if b]
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        backends = {"cudnn": ("cuDNN", SDPBackend.CUDNN_ATTENTION),
                    "flash": ("FlashAttention", SDPBackend.FLASH_ATTENTION)}
        for b in [x.strip() for x in self.args.baselines.split(",") if x.strip()]:
            if b in peers.PEERS:
                e = {"impl": b, "label": f"peer {b}", "mode": "-"}
                call, why = peers.load(b)
                if call is None:
                    e["status"] = f"unavailable: {why}"
                    entries.append(e)
                    log(f"  {b:<22} {e['status']}")
                else:
                    entries.append(self.timed_entry(e, call, sets, ref, fl))
            elif b in backends:
                label, backend = backends[b]
                e = {"impl": f"sdpa-{b}", "label": f"SDPA {label} BF16", "mode": "-"}
                entries.append(self.timed_entry(e, sdpa, sets, ref, fl, sdpa_kernel(backend)))
            else:
                entries.append({"impl": f"sdpa-{b}", "status": "unknown baseline"})
        return entries

    def qvattn_entries(self, sets, ref, fl, B, H, N, D):
        torch = self.torch
        entries = []
        methods = [m.strip() for m in self.args.methods.split(",") if m.strip()]
        if self.qvattn is None:
            return [{"impl": m, "label": f"qvattn {m}",
                     "status": f"unsupported: qvattn not loadable ({self.qva_err})"}
                    for m in methods]
        qv, ffi = self.qvattn, self.ffi
        for method in methods:
            label = method
            try:
                base = method_config(ffi, method)
            except (qv.QvaError, ValueError) as ex:
                entries.append({"impl": label, "label": f"qvattn {label}",
                                "status": f"error: {ex}"})
                continue
            ok, why = ffi.supports(ffi.QVA_DEVICE_CUDA, base, ffi.QVA_BF16, D)
            if not ok:
                log(f"  {label:<22} unsupported: {why}")
                entries.append({"impl": label, "label": f"qvattn {label}",
                                "status": f"unsupported: {why}"})
                continue
            if base_is_draft(ffi, base) and self.cur_grid is None:
                log(f"  {label:<22} unsupported: no latent grid known for this shape")
                entries.append({"impl": label, "label": f"qvattn {label}",
                                "status": "unsupported: no latent grid known for this shape"})
                continue
            vc = base.method in (ffi.QVA_METHOD_VC8, ffi.QVA_METHOD_VC4)
            # steps 0, 1 and 20 are the paper schedule's group, reuse and plain
            # steps; a row is named for what the method's own schedule does there
            modes = ([(ffi.schedule_action(base, st, VSMOOTH_NUM_STEPS), st)
                      for st in (0, 1, VSMOOTH_PLAIN_STEP)] if vc else [("-", 0)])
            counts = schedule_counts(ffi, cfg=base) if vc else None
            ctx = None
            try:
                ctx = qv.Context(ffi.QVA_DEVICE_CUDA)
                ctx.set_stream(torch.cuda.current_stream().cuda_stream)
                out = torch.empty_like(sets[0][0])
                t_out, _ = qv.describe(out)
                descs = [tuple(qv.describe(x)[0] for x in s) for s in sets]
                for mode, step in modes:
                    e = {"impl": label, "label": f"qvattn {label}", "mode": mode}
                    if counts:
                        e["schedule_counts"] = counts
                    entries.append(e)
                    if self.out_of_time():
                        e["status"] = "skipped: time limit"
                        continue
                    try:
                        self.qvattn_case(e, ctx, method, vc, step, descs, t_out, out, ref, fl,
                                         len(sets))
                    except Exception as ex:
                        e["status"] = f"error: {type(ex).__name__}: {ex}"
                        if not isinstance(ex, qv.QvaError):
                            traceback.print_exc()
                    log(f"  {label + (' ' + mode if vc else ''):<22} {fmt_ms(e.get('ms'))} ms"
                        f"  kernel {fmt_ms(e.get('kernel_ms'))} ms  {e['status']}")
                del out
            except Exception as ex:  # context / allocation failures
                entries.append({"impl": label, "label": f"qvattn {label}",
                                "status": f"error: {type(ex).__name__}: {ex}"})
                log(f"  {label}: error: {ex}")
            finally:
                if ctx is not None:
                    ctx.close()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        return entries

    def qvattn_case(self, e, ctx, method, vc, step, descs, t_out, out, ref, fl, nsets):
        """Times one (method, step) on a CUDA context; fills entry e."""
        qv, ffi, torch = self.qvattn, self.ffi, self.torch
        cfgs = [method_config(ffi, method, layer=i, step=step,  # one layer per input set
                              num_steps=VSMOOTH_NUM_STEPS if vc else 0)
                for i in range(nsets)]
        if base_is_draft(ffi, cfgs[0]):
            for c in cfgs:  # a sparse step (after the dense warm-up) on the shape's grid
                c.draft.grid_t, c.draft.grid_h, c.draft.grid_w = self.cur_grid
                c.draft.prefix_tokens = self.cur_n - self.cur_grid[0] * self.cur_grid[1] * self.cur_grid[2]
                c.step = max(c.draft.dense_warmup_steps, 0)
                c.num_steps = 40
            e["step"] = cfgs[0].step
        if vc:
            e["schedule_action"] = ffi.schedule_action(cfgs[0], step, VSMOOTH_NUM_STEPS)
            e["step"], e["num_steps"] = step, VSMOOTH_NUM_STEPS

        def call(i):
            st = ffi.attention_status(ctx, cfgs[i], *descs[i], t_out)
            if st != ffi.QVA_OK:
                raise ffi.error_for(st, "qva_attention")

        e.update(self.timer.run(call, nsets))
        e["tops"] = tops(fl, e["ms"])
        if qv.Context.has_profiling():
            ph = []
            ctx.set_profiling(True)
            try:
                # Each sample is the second of two back-to-back calls: its
                # host launches run while the first call's kernel does, so
                # its phases start on a busy GPU, as in the timed loop and
                # in a model, not after an idle gap (last_timings waits).
                for j in range(max(3, min(self.args.iters, e["iters"]))):
                    call(j % nsets)
                    call((j + 1) % nsets)
                    ph.append(ctx.last_timings())
            finally:
                ctx.set_profiling(False)
            for key in ("kernel_ms", "prep_ms", "grouping_ms"):
                e[key] = statistics.median(p[key] for p in ph)
            e["kernel_tops"] = tops(fl, e["kernel_ms"])
            if base_is_draft(ffi, cfgs[0]):
                # TOPS over the blocks the kernel computes (whole 128x128
                # blocks, padding included): its efficiency on what it runs
                frac, kept = draft_kept_fraction(cfgs[0], self.cur_grid, self.cur_n)
                e["kept_fraction"] = frac
                e["block_tops"] = tops(fl * frac, e["kernel_ms"])
                e["kept_blocks"] = kept
        call(0)  # input set 0 (layer 0) at this step: the fidelity output
        torch.cuda.synchronize()
        e["rel_l2"] = self.rel_l2(out, ref)
        e["status"] = "ok"

    def run_shape(self, name):
        torch = self.torch
        B, H, N, D = SHAPES[name]
        fl = flops(B, H, N, D)
        log(f"\n== {name}: B={B} H={H} N={N} D={D}  ({fl / 1e12:.1f} TFLOP per call)")
        rec = {"name": name, "B": B, "H": H, "N": N, "D": D, "flops": fl, "entries": []}
        self.results["shapes"].append(rec)
        if self.out_of_time():
            rec["status"] = "skipped: time limit"
            return
        sets = self.make_inputs(B, H, N, D)
        ref = self.reference(*sets[0], H, N, D)
        self.cur_grid = GRIDS.get(name)
        self.cur_n = N
        rounds = []
        for r in range(max(self.args.rounds, 1)):
            if r and self.out_of_time():
                break
            if self.args.rounds > 1:
                log(f"  -- round {r + 1} of {self.args.rounds}")
            entries = self.sdpa_entries(sets, ref, fl)
            entries += self.qvattn_entries(sets, ref, fl, B, H, N, D)
            ratios_to_cudnn(entries)
            rounds.append(entries)
        rec["entries"] = merge_rounds(rounds, fl)
        rec["rounds"] = len(rounds)
        del sets, ref
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def write(self):
        self.results["meta"]["elapsed_s"] = round(time.time() - self.t0, 1)
        md = markdown(self.results)
        with open(self.base + ".json", "w") as f:
            json.dump(self.results, f, indent=1, default=str)
        with open(self.base + ".md", "w") as f:
            f.write(md)
        return md


# ------------------------------------------------------------------ report
def fmt_ms(x):
    return f"{x:.3f}" if isinstance(x, (int, float)) else "n/a"


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) and x == x else "n/a"


def markdown(res):
    m = res["meta"]
    lines = [
        "# qvattn vs SDPA",
        "",
        f"- date (UTC): {m['date_utc']}",
        f"- GPU: {m['gpu']}",
        f"- torch {m['torch']} (CUDA {m['torch_cuda']}), cuDNN {m['cudnn']}",
        f"- qvattn: {m.get('qvattn_build', m.get('qvattn_error'))}",
        f"- git: {m.get('git')}",
        f"- command: `{m['command']}`" + (f" (QVATTN_LIB={m['QVATTN_LIB']})" if m.get("QVATTN_LIB") else ""),
        f"- timing: {m['timing']}; TOPS = {m['flops']} / t",
        f"- kernel alone: {m.get('kernel_alone', 'n/a')}",
        f"- data: {m['data']}",
        f"- fidelity: {m['fidelity']}",
        "",
        "| shape | impl | step | ms | TOPS | vs cuDNN | kernel ms | kernel TOPS | kernel vs cuDNN "
        "| prep ms | group ms | rel-L2 | status |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for s in res["shapes"]:
        shape = f"{s['name']} ({s['B']},{s['H']},{s['N']},{s['D']})"
        if s.get("status"):
            lines.append(f"| {shape} | - | - | | | | | | | | | | {s['status']} |")
        for e in s["entries"]:
            mode = e.get("mode", "-")
            if e.get("schedule_action") and e["schedule_action"] != mode:
                mode += f" ({e['schedule_action']})"
            status = e.get("status", "")
            if e.get("iters_reduced"):
                status += f" ({e['iters']} iters)"
            lines.append("| " + " | ".join([
                shape, e.get("label", e["impl"]), mode,
                fmt(e.get("ms"), ".3f"), fmt(e.get("tops"), ".1f"),
                fmt(e.get("vs_cudnn"), ".2f"),
                fmt(e.get("kernel_ms"), ".3f"), fmt(e.get("kernel_tops"), ".1f"),
                fmt(e.get("kernel_vs_cudnn"), ".2f"),
                fmt(e.get("prep_ms"), ".3f"), fmt(e.get("grouping_ms"), ".3f"),
                fmt(e.get("rel_l2"), ".2e"), status.replace("|", "/")]) + " |")
    lines += schedule_lines(res)
    notes = [f"- {s['name']} {e.get('label', e['impl'])}: kernel TOPS over the computed blocks "
             f"{e['block_tops']:.1f} ({e['kept_blocks']} region pairs per head kept, "
             f"{100 * e['kept_fraction']:.1f}% of the dense work)"
             for s in res["shapes"] for e in s["entries"] if e.get("block_tops")]
    if notes:
        lines += ["", "Draft kernels on the blocks they compute:", ""] + notes
    return "\n".join(lines) + "\n"


def schedule_lines(res):
    """A table of each V-Smooth method's whole schedule: its measured
    grouping, reuse and plain steps weighted by their counts in the
    method's own schedule (its entries' schedule_counts, which a
    vsmooth.schedule option changes), else the library's default (meta
    schedule_counts)."""
    counts = res["meta"].get("schedule_counts")
    if not counts:
        return []
    rows = []
    for s in res["shapes"]:
        cudnn = next((e["ms"] for e in s["entries"]
                      if e["impl"] == "sdpa-cudnn" and e.get("ms")), None)
        impls = []
        for e in s["entries"]:
            if e.get("mode") in counts and e["impl"] not in impls:
                impls.append(e["impl"])
        for impl in impls:
            es = [e for e in s["entries"] if e["impl"] == impl]
            own = es[0].get("schedule_counts") or counts  # a method's own schedule option
            full = schedule_mean(es, own, "ms")
            kern = schedule_mean(es, own, "kernel_ms")
            if full is None:
                continue
            label = f"qvattn {impl}" + ("" if own == counts else " (" + ", ".join(
                f"{v} {k}" for k, v in own.items()) + ")")
            rows.append("| " + " | ".join([
                s["name"], label, fmt(full, ".3f"),
                fmt(cudnn / full if cudnn else None, ".2f"), fmt(kern, ".3f"),
                fmt(cudnn / kern if cudnn and kern else None, ".2f")]) + " |")
    if not rows:
        return []
    n = sum(counts.values())
    steps = ", ".join(f"{v} {k}" for k, v in counts.items())
    return ["", f"V-Smooth's {n}-step schedule ({steps} steps), the step-weighted mean of "
            "the measured steps:", "",
            "| shape | impl | ms | vs cuDNN | kernel ms | kernel vs cuDNN |",
            "|---|---|--:|--:|--:|--:|"] + rows


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    shapes = shape_list(args.shapes)
    try:
        import torch
    except ImportError:
        sys.exit("compare.py needs torch (with CUDA)")
    if not torch.cuda.is_available():
        sys.exit("compare.py needs a CUDA device (torch.cuda.is_available() is False)")
    bench = Bench(args, torch)
    m = bench.results["meta"]
    log(f"{m['gpu']} | torch {m['torch']} | cuDNN {m['cudnn']} | "
        f"{m.get('qvattn_build', 'qvattn: ' + str(m.get('qvattn_error')))}")
    log(f"kernel alone: {m.get('kernel_alone', 'n/a')}")
    rc = 0
    try:
        for name in shapes:
            try:
                bench.run_shape(name)
            except Exception as ex:  # keep going: record and move on
                traceback.print_exc()
                bench.results["shapes"][-1]["status"] = f"error: {type(ex).__name__}: {ex}"
                rc = 1
                try:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                except Exception:  # a sticky CUDA error: the context is gone
                    log("CUDA context unusable; stopping")
                    break
            bench.write()
    finally:
        md = bench.write()
        print()
        print(md)
        log(f"wrote {bench.base}.json and {bench.base}.md")
    return rc


if __name__ == "__main__":
    sys.exit(main())
