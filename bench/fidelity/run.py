#!/usr/bin/env python3
"""End-to-end fidelity harness: train small video DiTs on procedural clips,
sample them with bf16 SDPA and with every qvattn method from the same
noise, and report how close each method's clips stay.

    QVATTN_LIB=build-gpu/libqvattn.so python3 bench/fidelity/run.py      # H200, 3 models in turn
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
import datetime as _dt
import json
import os
import platform
import re
import shlex
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

from benchutil import git_rev, out_dir, use_checkout_package  # noqa: E402
from fidelity import config as C  # noqa: E402
from fidelity.cli import (apply_sets, parse_args, parse_samplers, parse_seeds,  # noqa: E402
                          validate_guidance, validate_methods)
from fidelity.summary import (clean_json, exit_status, mean, merge_cli, paired,  # noqa: E402
                              summarize)
import peers  # noqa: E402


def load_qvattn():
    """qvattn from this checkout (torch first: see qvattn/__init__.py)."""
    use_checkout_package()
    import torch  # noqa: F401
    import qvattn
    return qvattn


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
            json.dump(clean_json(self.results), f, indent=1)
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
        rec["psnr_mean"] = mean(rec["psnr"])
        rec["ssim_mean"] = mean(rec["ssim"])
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
                # one routed (stateless) call with the name's options: a
                # :warm= variant's is its method's, a schedule's the same
                peer = peers.load(name)[0] if name in peers.PEERS else None
                opts = None if peer or name == C.REFERENCE else \
                    sample.routed_options(name)
                rec["op_rel_l2"][name] = metrics.operator_rel_l2(
                    self.qvattn, sample.split_method(name)[0], cap.saved, self.grid,
                    options=opts, call=peer)
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
        self.results["paired"] = paired(self.results["models"], self.methods,
                                        self.args.paired)

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


def run_cli(argv=None, log=print):
    """The command line, in-process: (exit status, Harness or None)."""
    args = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    if args.merge:
        return merge_cli(args.merge, args.out, log, args.paired), None
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
