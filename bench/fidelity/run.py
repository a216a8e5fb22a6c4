#!/usr/bin/env python3
"""End-to-end fidelity harness: train small video DiTs on procedural clips,
sample them with bf16 SDPA and with every qvattn method from the same
noise, and report how close each method's clips stay.

    QVATTN_LIB=build-gpu/libqvattn.so python3 bench/fidelity/run.py      # H200, ~8 min
    python3 bench/fidelity/run.py --tiny --device cpu                     # CPU smoke, seconds

For each model seed: train (or load the cached weights), sample `--clips`
clips with the reference (bf16-sdpa, capturing its Q/K/V at the first,
middle and last step) and with each method through qvattn.attention with
the real step schedule, then PSNR/SSIM against the reference, per-layer
attention statistics and the operator rel-L2 on the captured Q/K/V.

Outputs (in --out DIR, else $OUT, else bench/out/, which git ignores):
fidelity-<UTC>-<device>[-tiny][-hd64].json (everything), .md (the report,
also printed), and -model<seed>.png frame sheets.  Exit status 1 when a
retrained model's final loss is off its recorded value (config.py) by more
than 5%, 2 for bad arguments.
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
BENCH = os.path.dirname(HERE)
# Run as a script, Python puts this folder first on sys.path, where config.py,
# data.py and model.py would shadow any top-level module of those names: the
# modules are imported as the package `fidelity` from bench/ instead.
if sys.path and os.path.abspath(sys.path[0] or ".") == HERE:
    sys.path.pop(0)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from benchutil import OUT_HELP, ROOT, git_rev, out_dir, use_checkout_package  # noqa: E402
from fidelity import config as C  # noqa: E402
import peers  # noqa: E402

DEFAULT_CACHE = os.path.join(ROOT, "bench", "out", "fidelity-cache")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--tiny", action="store_true",
                   help="the CPU smoke size: 4x32x32 clips (256 tokens), hidden 128, "
                        "2 layers, 60 training steps, 4 sampling steps, 2 clips, 1 model")
    p.add_argument("--models", type=int, default=None,
                   help="number of model seeds (default 3; tiny: 1)")
    p.add_argument("--seeds", default=None,
                   help="comma list of model seeds to run (default: the first --models "
                        "of config.MODEL_SEEDS); with the weights cache, one device call "
                        "can train some seeds and a later one report them all")
    p.add_argument("--clips", type=int, default=None,
                   help="clips sampled per model (default 8; tiny: 2)")
    p.add_argument("--methods", default=None,
                   help="comma list of qvattn methods (default: config.METHODS)")
    p.add_argument("--head-dim", type=int, choices=(64, 128), default=None,
                   help="head dim (default 128; 64 doubles the heads at the same width)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--out", metavar="DIR", default=None, help=OUT_HELP)
    p.add_argument("--cache", metavar="DIR", default=DEFAULT_CACHE,
                   help="trained weights cache (default: %(default)s; '' = none)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write weights")
    p.add_argument("--train-steps", type=int, default=None,
                   help="override the training steps (marks the run as not the frozen config)")
    p.add_argument("--sample-steps", type=int, default=None,
                   help="override the sampling steps (marks the run as not the frozen config)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. train.t_dist=uniform or "
                        "train.batch=32 (repeatable; the key must exist; the value keeps "
                        "the type of the one it replaces; marks the run as not the "
                        "frozen config, and the weights cache keys on it)")
    p.add_argument("--probe-every", type=int, default=0, metavar="N",
                   help="every N training steps (and at the end) sample a few clips with "
                        "bf16-sdpa and record their statistics against the data's: does "
                        "longer training help? (not training time; the weights are the same)")
    p.add_argument("--sanity-samplers", default=None, metavar="STEPS:SHIFT,...",
                   help="also compute the sanity statistics (samples against data) with "
                        "these Euler samplers, e.g. 20:3,50:1 (the frozen one is "
                        "num_steps:shift): is the sampler or the model the limit?")
    p.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="train nothing: merge the reports of runs with different "
                        "--seeds (same config and methods) into one table")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 with --tiny)")
    return p.parse_args(argv)


def apply_sets(cfg, items):
    """--set: cfg with each SECTION.KEY=VALUE applied; (list of the
    overrides as given, None) or ([], message)."""
    done = []
    for item in items:
        key, eq, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in ("data", "model", "train", "sample"):
            return [], f"--set {item!r}: SECTION.KEY=VALUE with SECTION data, model, train or sample"
        if name not in cfg[section]:
            return [], (f"--set {item!r}: no key {name!r} in {section} "
                        f"(keys: {', '.join(sorted(cfg[section]))})")
        old = cfg[section][name]
        try:
            if isinstance(old, bool):
                if text not in ("true", "false"):
                    raise ValueError("true or false")
                val = text == "true"
            elif isinstance(old, (int, float, str)):
                val = type(old)(text)
            else:
                val = json.loads(text)
                if type(val) is not type(old):
                    raise ValueError(f"a JSON {type(old).__name__}")
        except ValueError as e:
            return [], f"--set {item!r}: {section}.{name} is {type(old).__name__} ({e})"
        cfg[section][name] = val
        done.append(f"--set {key}={text}")
    return done, None


def parse_samplers(text):
    """'20:3,50:1' -> ([(20, 3.0), (50, 1.0)], None), or ([], message)."""
    out = []
    for item in (x.strip() for x in (text or "").split(",")):
        if not item:
            continue
        try:
            steps, shift = item.split(":")
            out.append((int(steps), float(shift)))
        except ValueError:
            return [], f"--sanity-samplers {text!r}: STEPS:SHIFT items, e.g. 20:3,50:1"
        if out[-1][0] < 1 or not out[-1][1] > 0:
            return [], f"--sanity-samplers {item!r}: steps >= 1 and shift > 0"
    return out, None


def parse_seeds(text):
    """'0,2' -> ([0, 2], None): distinct non-negative integers in the order
    given; ([], message) for anything else."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return [], f"--seeds {text!r}: a comma list of integers"
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        return [], f"--seeds {text!r}: distinct integers >= 0"
    return seeds, None


def load_qvattn():
    """qvattn from this checkout (torch first: see qvattn/__init__.py)."""
    use_checkout_package()
    import torch  # noqa: F401
    import qvattn
    return qvattn


def _clean(x):
    """JSON-safe: NaN/Inf -> None, tuples -> lists, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


class Harness:
    """One run of the harness; results in .results, clips in .samples
    ({seed: {name: [clips, T, C, H, W] float32 CPU tensor}})."""

    def __init__(self, args, log=print):
        import torch
        self.torch = torch
        self.args = args
        self.log = log
        self.t0 = time.perf_counter()
        threads = args.threads or (1 if args.tiny else None)
        if threads:
            # the tiny ops are too small to share; on a loaded 2-core CI machine
            # two torch threads ran the tiny training 2.6x slower than one
            torch.set_num_threads(threads)
        self.qvattn = load_qvattn()
        self.cfg = C.preset("tiny" if args.tiny else "default", args.head_dim)
        self.overrides = []
        if args.train_steps is not None:
            self.cfg["train"]["steps"] = args.train_steps
            self.overrides.append(f"--train-steps {args.train_steps}")
        if args.sample_steps is not None:
            self.cfg["sample"]["num_steps"] = args.sample_steps
            self.overrides.append(f"--sample-steps {args.sample_steps}")
        if args.clips is not None:
            self.cfg["sample"]["clips"] = args.clips
        self.overrides += apply_sets(self.cfg, args.set)[0]
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(dev)
        seeds = C.TINY_MODEL_SEEDS if args.tiny else C.MODEL_SEEDS
        n = args.models if args.models is not None else len(seeds)
        self.seeds = seeds[:n] if n <= len(seeds) else list(range(n))
        if args.seeds is not None:
            self.seeds = parse_seeds(args.seeds)[0]
        self.samplers = parse_samplers(args.sanity_samplers)[0]
        self.methods = ([m for m in args.methods.split(",") if m] if args.methods
                        else list(C.METHODS))
        self.grid = C.grid(self.cfg)
        self.cache = None if args.no_cache else (args.cache or None)
        self.samples = {}
        self.timings = {}
        self.warnings = []
        self.results = {"meta": self.meta(), "config": self.cfg, "models": [],
                        "summary": {}, "timings": self.timings, "warnings": self.warnings}
        self.out_dir = out_dir(args.out)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        tag = re.sub(r"[^A-Za-z0-9]+", "-", self.results["meta"]["device_name"]).strip("-")
        tag = tag.lower() or self.device.type
        suffix = ("-tiny" if args.tiny else "") + (
            f"-hd{self.cfg['model']['head_dim']}" if self.cfg["model"]["head_dim"] != 128 else "")
        self.base = os.path.join(self.out_dir, f"fidelity-{stamp}-{tag}{suffix}")

    # ------------------------------------------------------------ bookkeeping
    def meta(self):
        torch = self.torch
        from fidelity.metrics import lpips_status
        cuda = self.device.type == "cuda"
        return {
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": str(self.device),
            "device_name": (torch.cuda.get_device_name(self.device) if cuda
                            else platform.processor() or platform.machine()),
            "torch": torch.__version__, "python": platform.python_version(),
            "qvattn_build": self.qvattn.build_info(), "qvattn_lib": self.qvattn._ffi.lib_path,
            "git": git_rev(),
            "command": " ".join(shlex.quote(x) for x in
                                [os.path.basename(sys.executable)] + sys.argv),
            "preset": self.cfg["name"], "frozen": not self.overrides,
            "overrides": self.overrides, "reference": C.REFERENCE,
            "methods": self.methods, "model_seeds": self.seeds,
            "clips": self.cfg["sample"]["clips"], "grid": list(self.grid),
            "tokens": self.grid[0] * self.grid[1] * self.grid[2], "heads": C.heads(self.cfg),
            "capture_steps": C.capture_steps(self.cfg), "lpips": lpips_status(),
            "cache": None if self.args.no_cache else (self.args.cache or None),
        }

    def phase(self, name, t):
        secs = time.perf_counter() - t
        self.timings[name] = secs
        self.log(f"[{time.perf_counter() - self.t0:7.1f} s] {name}: {secs:.1f} s")

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def write(self):
        from fidelity.report import markdown
        self.timings.pop("total", None)  # kept last
        self.timings["total"] = time.perf_counter() - self.t0
        with open(self.base + ".json", "w") as f:
            json.dump(_clean(self.results), f, indent=1)
        with open(self.base + ".md", "w") as f:
            f.write(markdown(self.results))

    # ------------------------------------------------------------ phases
    def data_stats(self):
        from fidelity import data, metrics
        t = time.perf_counter()
        idx = data.stats_indices(self.cfg["data"])
        self.data_clips, self.data_labels = data.make_batch(self.cfg["data"], idx, self.device)
        self.results["data_stats"] = dict(metrics.clip_stats(self.data_clips), clips=len(idx))
        self.phase("data stats", t)

    def loss_check(self, info):
        """Compare the final loss with config.RECORDED_FINAL_LOSS."""
        key = C.loss_key(self.cfg, info["seed"], self.device.type)
        rec = C.RECORDED_FINAL_LOSS.get(key)
        out = {"key": key, "recorded": rec, "final": info["final_loss"]}
        if self.overrides:
            out["status"] = "not checked (not the frozen config)"
        elif rec is None:
            out["status"] = "no recorded value"
            self.log(f"  no recorded final loss for {key}: add to config.RECORDED_FINAL_LOSS:"
                     f"  \"{key}\": {info['final_loss']:.4f},")
        else:
            dev = (info["final_loss"] - rec) / rec
            out["deviation"] = dev
            if abs(dev) <= C.LOSS_TOLERANCE:
                out["status"] = f"ok ({dev:+.1%})"
            else:
                out["status"] = f"FAILED ({dev:+.1%})"
                self.warnings.append(
                    f"model seed {info['seed']}: final loss {info['final_loss']:.4f} is "
                    f"{dev:+.1%} off the recorded {rec:.4f} ({key}; tolerance "
                    f"{C.LOSS_TOLERANCE:.0%}): the model is not the frozen one")
                self.log("!" * 70 + f"\nWARNING: {self.warnings[-1]}\n" + "!" * 70)
        return out

    def probe(self, model, step):
        """--probe-every: the sanity statistics of the model in training,
        against the data's."""
        from fidelity import metrics
        st = self.sanity_stats(model, *self.likeness_sampler())
        like = metrics.likeness(st, self.results["data_stats"])
        return {"stats": st, "ratios": like["ratios"], "like_data": like["like_data"]}

    def likeness_sampler(self):
        """(Euler steps, shift) of the likeness verdict (config.py says why
        it is not the comparison sampler)."""
        sc = self.cfg["sample"]
        return sc["likeness_steps"], sc["shift"]

    def sanity_stats(self, model, num_steps, shift, first=None):
        """clip_stats of sanity_clips reference clips (bf16-sdpa), sampled in
        batches of the method clips' size; `first`, if given, is the first
        batch already sampled (the run's own reference clips)."""
        from fidelity import metrics, sample
        sc = self.cfg["sample"]
        noise = sample.clip_noise(self.cfg, sc["sanity_clips"], self.device)
        labels = sample.clip_labels(self.cfg, sc["sanity_clips"], self.device)
        part = lambda x, i: None if x is None else x[i:i + sc["clips"]]  # noqa: E731
        clips = [first.cpu() if first is not None and i == 0 else
                 sample.sample(model, part(noise, i), sample.SdpaBF16(), num_steps,
                               shift, **sample.sampler_kwargs(self.cfg, part(labels, i))).cpu()
                 for i in range(0, len(noise), sc["clips"])]
        st = metrics.clip_stats(self.torch.cat(clips))
        st["clips"] = len(noise)
        return st

    def sample_method(self, model, noise, labels, name, ref):
        """Sample with one method; returns its per-model record."""
        from fidelity import metrics, sample
        rec = {"status": "ok"}
        head_dim = self.cfg["model"]["head_dim"]
        h = C.heads(self.cfg)
        if name in peers.PEERS:
            call, why = peers.load(name) if self.device.type == "cuda" else (None, "CUDA only")
            ok = call is not None
        else:
            ok, why = self.qvattn.supports(sample.split_method(name)[0], self.device.type,
                                           "bfloat16", head_dim, h, h)
        if not ok:
            rec["status"] = f"skipped: {why}"
            self.log(f"  {name}: {rec['status']}")
            return rec, None
        t = time.perf_counter()
        if name in peers.PEERS:
            attn = sample.PeerMethod(name, call)
        else:
            attn = sample.QvattnMethod(self.qvattn, name, self.grid, self.device,
                                       sample.method_options(name, self.cfg))
        try:
            clips = sample.sample(model, noise, attn, self.cfg["sample"]["num_steps"],
                                  self.cfg["sample"]["shift"],
                                  **sample.sampler_kwargs(self.cfg, labels))
            self.sync()
        except Exception as e:  # a method that fails is a row, not the end of the run
            rec["status"] = f"error: {type(e).__name__}: {e}"
            self.log(traceback.format_exc())
            return rec, None
        finally:
            rec["kept_share"] = attn.kept_share()
            attn.close()
        rec["sample_s"] = time.perf_counter() - t
        rec["finite"] = bool(self.torch.isfinite(clips).all())
        rec["psnr"] = metrics.psnr(clips, ref)
        rec["ssim"] = metrics.ssim(clips, ref)
        rec["psnr_mean"] = _mean(rec["psnr"])
        rec["ssim_mean"] = _mean(rec["ssim"])
        self.log(f"  {name}: PSNR {rec['psnr_mean'] or float('nan'):.2f} dB, SSIM "
                 f"{rec['ssim_mean'] or float('nan'):.4f} ({rec['sample_s']:.1f} s)")
        return rec, clips

    def run_model(self, seed):
        from fidelity import metrics, sample, train
        torch = self.torch
        t = time.perf_counter()
        model, info = train.train_or_load(self.cfg, seed, self.device, self.cache, self.log,
                                          self.probe if self.args.probe_every else None,
                                          max(0, self.args.probe_every))
        self.phase(f"train seed {seed}", t)
        rec = {"seed": seed, "train": info, "loss_check": self.loss_check(info),
               "methods": {}}
        self.results["models"].append(rec)
        noise = sample.clip_noise(self.cfg, self.cfg["sample"]["clips"], self.device)
        labels = sample.clip_labels(self.cfg, self.cfg["sample"]["clips"], self.device)
        sc = self.cfg["sample"]
        clips_of = self.samples.setdefault(seed, {})

        t = time.perf_counter()
        cap = sample.Capture(sample.SdpaBF16(), C.capture_steps(self.cfg))
        ref = sample.sample(model, noise, cap, sc["num_steps"], sc["shift"],
                            **sample.sampler_kwargs(self.cfg, labels))
        self.sync()
        clips_of[C.REFERENCE] = ref.cpu()
        rec["methods"][C.REFERENCE] = {"status": "ok", "sample_s": time.perf_counter() - t,
                                       "finite": bool(torch.isfinite(ref).all())}
        self.phase(f"sample bf16-sdpa seed {seed}", t)
        t = time.perf_counter()
        frozen, judge = (sc["num_steps"], sc["shift"]), self.likeness_sampler()
        stats = {frozen: self.sanity_stats(model, *frozen, first=ref)}
        if judge not in stats:
            stats[judge] = self.sanity_stats(model, *judge)
        rec["sample_stats"] = stats[judge]
        rec["likeness"] = dict(metrics.likeness(stats[judge], self.results["data_stats"]),
                               sampler=list(judge))
        self.log(f"  likeness ({judge[0]} Euler steps, shift {judge[1]:g}): "
                 f"ratios {rec['likeness']['ratios']}, like the data: "
                 f"{rec['likeness']['like_data']}")
        rec["sampler_probe"] = []
        # the comparison sampler's row first, then --sanity-samplers'
        rows = [frozen] if frozen != judge else []
        rows += [s for s in self.samplers if s not in rows and s != judge]
        for steps, shift in rows:
            st = stats.get((steps, shift)) or self.sanity_stats(model, steps, shift)
            like = metrics.likeness(st, self.results["data_stats"])
            rec["sampler_probe"].append({"num_steps": steps, "shift": shift, "stats": st,
                                         "ratios": like["ratios"],
                                         "like_data": like["like_data"]})
            self.log(f"  sampler {steps}:{shift:g}: ratios {like['ratios']}")
        self.phase(f"sanity stats seed {seed}", t)

        t = time.perf_counter()
        for name in self.methods:
            mrec, clips = self.sample_method(model, noise, labels, name, ref)
            rec["methods"][name] = mrec
            if clips is not None:
                clips_of[name] = clips.cpu()
        self.phase(f"sample methods seed {seed}", t)

        t = time.perf_counter()
        rec["layer_stats"] = [dict(layer=l, step=s, **metrics.attention_stats(*qkv))
                              for (l, s), qkv in sorted(cap.saved.items())]
        self.phase(f"attention stats seed {seed}", t)

        t = time.perf_counter()
        rec["op_rel_l2"] = {}
        for name in [C.REFERENCE] + self.methods:
            if rec["methods"][name]["status"] != "ok":
                continue
            try:
                # one routed (stateless) call: a :warm= variant's is its method's
                peer = peers.load(name)[0] if name in peers.PEERS else None
                rec["op_rel_l2"][name] = metrics.operator_rel_l2(
                    self.qvattn, sample.split_method(name)[0], cap.saved, self.grid,
                    call=peer)
            except Exception as e:
                rec["op_rel_l2"][name] = {"error": f"{type(e).__name__}: {e}"}
        self.phase(f"operator rel-L2 seed {seed}", t)
        self.images(seed)
        del model, cap
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.summarize()
        self.write()

    def images(self, seed):
        """A frame sheet per model: for each of the first image_clips clips,
        a row of data (held-out clip j: not the same scene, but the kind the
        samples are conditioned on), then bf16-sdpa, vc8 and draft@85/0/0/15
        when they ran."""
        from fidelity import data, report
        sc = self.cfg["sample"]
        nf = min(sc["image_frames"], self.cfg["data"]["frames"])
        names = [n for n in (C.REFERENCE, "vc8", "draft@85/0/0/15") if n in self.samples[seed]]
        rows, labels = [], []
        for j in self.image_clip_indices():
            rows.append(self.data_clips[j, :nf].cpu().numpy())
            kind = data.BG_KINDS[int(self.data_labels[j])]
            labels.append(f"data (held-out clip {j}, {kind})")
            for n in names:
                rows.append(self.samples[seed][n][j, :nf].numpy())
                labels.append(f"{n} clip {j}")
        path = f"{self.base}-model{seed}.png"
        report.write_png(path, report.frame_sheet(rows, report.sheet_scale(
            self.cfg["data"]["height"])))
        self.results.setdefault("images", []).append(
            {"file": os.path.basename(path), "seed": seed, "rows": labels})

    def image_clip_indices(self):
        """The sampled clips of the frame sheet: the first clip of each kind
        (label), then the next clips in order, image_clips in all."""
        sc = self.cfg["sample"]
        n, want = sc["clips"], min(sc["image_clips"], sc["clips"])
        kinds = [int(x) for x in self.data_labels[:n]]
        firsts = [j for j in range(n) if kinds[j] not in kinds[:j]]
        return (firsts + [j for j in range(n) if j not in firsts])[:want]

    def summarize(self):
        self.results["summary"] = summarize(self.results["models"], self.methods)

    def run(self):
        t = time.perf_counter()
        self.log(f"fidelity: preset {self.cfg['name']}, device {self.device}, models "
                 f"{self.seeds}, {self.cfg['sample']['clips']} clips, {len(self.methods)} "
                 f"methods, grid {self.grid}; cache {self.cache}")
        self.data_stats()
        self.timings["setup"] = time.perf_counter() - self.t0 - self.timings["data stats"]
        for seed in self.seeds:
            self.log(f"model seed {seed}:")
            self.run_model(seed)
            self.write()  # a run cut short keeps the models it finished
        self.phase("all models", t)
        self.write()
        return self.results


def summarize(models, methods):
    """Per method: mean/std/min/max over models of the per-model means."""
    summary = {}
    for name in [C.REFERENCE] + list(methods):
        recs = [m["methods"].get(name, {}) for m in models]
        bad = [r.get("status") for r in recs if r.get("status") != "ok"]
        s = {"status": bad[0] if bad else "ok"}
        ops = [m["op_rel_l2"].get(name) for m in models if "op_rel_l2" in m]
        ops = [o for o in ops if o and "mean" in o]
        s["op_rel_l2"] = ({"mean": _mean([o["mean"] for o in ops]),
                           "max": max(o["max"] for o in ops)} if ops else None)
        if name != C.REFERENCE and not bad:
            for key in ("psnr", "ssim"):
                per = [r.get(f"{key}_mean") for r in recs]
                s[f"per_model_{key}"] = per
                vals = [v for v in per if v is not None]
                s[f"{key}_mean"] = _mean(vals)
                s[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
                s[f"{key}_min"] = min(vals) if vals else None
                s[f"{key}_max"] = max(vals) if vals else None
            s["finite"] = all(r.get("finite") for r in recs)
            kept = [r["kept_share"]["mean"] for r in recs if r.get("kept_share")]
            if len(kept) == len(recs):
                s["kept_share_mean"] = _mean(kept)
        summary[name] = s
    return summary


def merge_results(runs, names):
    """One report from several runs of the same frozen configuration and
    method list, each with its own model seeds (one device call cannot
    train every model, and trained weights do not travel back).  Returns
    (results, None) or (None, why they cannot be merged)."""
    base = runs[0]
    seen = set()
    for r, name in zip(runs, names):
        for key in ("config", "data_stats"):
            if r.get(key) != base.get(key):
                return None, f"{name}: its {key} differs from {names[0]}'s"
        for key in ("methods", "frozen", "clips", "reference"):
            if r["meta"].get(key) != base["meta"].get(key):
                return None, f"{name}: meta {key} differs from {names[0]}'s"
        for m in r["models"]:
            if m["seed"] in seen:
                return None, f"{name}: model seed {m['seed']} is in two runs"
            seen.add(m["seed"])
    models = sorted((m for r in runs for m in r["models"]), key=lambda m: m["seed"])
    meta = dict(base["meta"], model_seeds=[m["seed"] for m in models],
                merged_from=[{"file": n, "date_utc": r["meta"]["date_utc"],
                              "git": r["meta"]["git"], "command": r["meta"]["command"],
                              "model_seeds": r["meta"]["model_seeds"]}
                             for r, n in zip(runs, names)])
    res = {"meta": meta, "config": base["config"], "data_stats": base.get("data_stats"),
           "models": models, "summary": summarize(models, base["meta"]["methods"]),
           "timings": {n: r["timings"] for r, n in zip(runs, names)},
           "warnings": [w for r in runs for w in r["warnings"]],
           "images": [i for r in runs for i in r.get("images", [])]}
    return res, None


def merge_cli(paths, out, log):
    """--merge: write <out>/fidelity-merged-<UTC>.json/.md from run JSONs."""
    from fidelity.report import markdown
    runs, names = [], []
    for p in paths:
        try:
            with open(p) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            log(f"fidelity --merge: {p}: {e}")
            return 2
        names.append(os.path.basename(p))
    res, why = merge_results(runs, names)
    if why:
        log(f"fidelity --merge: {why}")
        return 2
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = os.path.join(out_dir(out), f"fidelity-merged-{stamp}")
    with open(base + ".json", "w") as f:
        json.dump(_clean(res), f, indent=1)
    text = markdown(res)
    with open(base + ".md", "w") as f:
        f.write(text)
    log(text)
    log(f"results: {base}.json / .md")
    return exit_status(res)


def validate_methods(qvattn, methods):
    """None if every method string parses, else the error message."""
    from qvattn._config import _base_config, options_string
    from fidelity import sample
    for m in methods:
        if m in peers.PEERS:
            continue
        method, warm = sample.split_method(m)
        try:
            _base_config(method, options_string({"draft.warmup_method": warm} if warm else {}))
            if warm and not method.startswith("draft"):
                raise ValueError(f"{sample.WARM_TAG.strip(':=')} is for draft methods")
        except ValueError as e:
            return f"bad --methods entry {m!r}: {e}"
    return None


def validate_guidance(cfg):
    """None, or why the config's label dropout or guidance cannot run
    (checked before training, not after it)."""
    from fidelity import train
    if cfg["sample"].get("guidance", 1.0) == 1.0 and not cfg["train"].get("label_dropout"):
        return None
    if not 0.0 <= cfg["train"].get("label_dropout", 0.0) < 1.0:
        return "train.label_dropout must lie in [0, 1)"
    try:
        train.null_label(cfg)
    except ValueError as e:
        return str(e)
    return None


def exit_status(results):
    return 1 if results["warnings"] else 0


def run_cli(argv=None, log=print):
    """The command line, in-process: (exit status, Harness or None)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.merge:
        return merge_cli(args.merge, args.out, log), None
    err = parse_seeds(args.seeds)[1] if args.seeds is not None else None
    err = err or parse_samplers(args.sanity_samplers)[1]
    err = err or apply_sets(C.preset("tiny" if args.tiny else "default", args.head_dim),
                            args.set)[1]
    if err:
        log(f"fidelity: {err}")
        return 2, None
    h = Harness(args, log)
    err = validate_methods(h.qvattn, h.methods) or validate_guidance(h.cfg)
    if err:
        log(f"fidelity: {err}")
        return 2, None
    h.run()
    from fidelity.report import markdown
    log(markdown(h.results))
    log(f"results: {h.base}.json / .md / -model*.png")
    return exit_status(h.results), h


def main(argv=None, log=print):
    return run_cli(argv, log)[0]


if __name__ == "__main__":
    sys.exit(main())
