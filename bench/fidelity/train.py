"""Rectified-flow (flow-matching) training of the video DiT.

x_t = (1 - t) x0 + t * noise, the model predicts the velocity noise - x0,
loss = mean squared error.  t is logit-normal (SD3's choice: most samples
in the middle, where the velocity is hardest) or uniform.  AdamW with a
linear warm-up and a cosine decay to min_lr_frac of the peak.  With
train.ema > 0 the returned model holds an exponential moving average of
the weights (the usual diffusion practice: a short run's last weights
jitter with the last batches, their average samples cleaner); the loss
curve is always the trained weights'.

Determinism: training is defined by a step count, never wall time; the
model init comes from torch.manual_seed(seed), and the batch indices, the
times and the noise from generators seeded from (seed, step), so a rerun
with the same seed sees the same data in the same order.  On the CPU (the
smoke test) two runs are bit-identical; on CUDA bf16 kernels may differ in
the last bits, which the 5% loss tolerance of config.py absorbs.

Weights can be cached (run.py: --cache), keyed by a hash of the config and
of the source of data.py, model.py and train.py, so a change to any of them
retrains.
"""
import contextlib
import hashlib
import json
import math
import os
import time

import numpy as np
import torch

from . import data as data_mod
from .model import VideoDiT, param_count

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE_FORMAT = 1


def lr_at(step, tc):
    """Linear warm-up, then cosine from lr down to lr * min_lr_frac."""
    if step < tc["warmup"]:
        return tc["lr"] * (step + 1) / tc["warmup"]
    p = (step - tc["warmup"]) / max(1, tc["steps"] - tc["warmup"])
    lo = tc["min_lr_frac"]
    return tc["lr"] * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def sample_t(n, dist, gen, device):
    if dist == "logit-normal":
        return torch.sigmoid(torch.randn(n, generator=gen, device=device))
    if dist == "uniform":
        return torch.rand(n, generator=gen, device=device)
    raise ValueError(f"unknown t_dist {dist!r}")


def batch_for_step(cfg, seed, step, device):
    """(x0, t, noise, labels) of one training step: a pure function of
    (seed, step) on a given device type (t and the noise are drawn on the
    device, so the host neither waits nor copies); labels is None for a
    model without classes."""
    tc, dc = cfg["train"], cfg["data"]
    rng = np.random.default_rng([int(seed), int(step), 17])
    idx = rng.integers(0, dc["pool"], tc["batch"])
    x0, labels = data_mod.make_batch(dc, idx.tolist(), device)
    gen = torch.Generator(device=device).manual_seed(int(seed) * 1_000_003 + int(step))
    t = sample_t(tc["batch"], tc["t_dist"], gen, device)
    noise = torch.randn(x0.shape, generator=gen, device=device)
    if not cfg["model"].get("classes"):
        return x0, t, noise, None
    p = float(tc.get("label_dropout", 0.0))
    if p > 0:
        # drawn after the indices, so they stay those of a run without dropout
        drop = torch.from_numpy(rng.random(tc["batch"]) < p).to(device)
        labels = torch.where(drop, torch.full_like(labels, null_label(cfg)), labels)
    return x0, t, noise, labels


def null_label(cfg):
    """The index of the "no label" class (model.null_label); an error for
    a config that drops labels or guides without one."""
    m = cfg["model"]
    if not (m.get("classes") and m.get("null_label")):
        raise ValueError("train.label_dropout and sample.guidance need model.classes > 0 "
                         "and model.null_label = true")
    return int(m["classes"])


def autocast(device):
    """bf16 autocast on CUDA (as the model would be trained for real); the
    CPU runs float32 (CPU bf16 is slow and the smoke test needs no speed)."""
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def final_loss(losses):
    """Mean of the last 5% of the steps (at least one)."""
    n = max(1, int(round(0.05 * len(losses))))
    return float(np.mean(losses[-n:]))


def first_loss(losses):
    n = max(1, int(round(0.05 * len(losses))))
    return float(np.mean(losses[:n]))


def ema_decay(step, ema):
    """The averaging weight of step `step`: ramps up from 0.1 so the average
    does not stay near the random init early in a short run."""
    return min(ema, (1 + step) / (10 + step))


def _probe(model, avg, probe, step, log):
    """probe(model, step) on the weights the run would return now (the
    average when there is one), then back to training."""
    saved = None
    if avg is not None:
        saved = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p, a in zip(model.parameters(), avg):
                p.copy_(a)
    model.eval()
    out = probe(model, step)
    model.train()
    if saved is not None:
        with torch.no_grad():
            for p, b in zip(model.parameters(), saved):
                p.copy_(b)
    log(f"  probe at step {step}: {out}")
    return out


def train(cfg, seed, device, log=print, probe=None, probe_every=0):
    """Train one model.  Returns (model in eval mode, info dict with the
    loss curve, seconds, steps/s, final loss).  probe(model, step), every
    probe_every steps and at the end, looks at the model in training (for
    example the statistics of a few samples) without changing what it
    learns; its results go to info["probes"] and its time is not training
    time."""
    tc = cfg["train"]
    dev = torch.device(device)
    torch.manual_seed(int(seed))
    model = VideoDiT.from_config(cfg).to(dev)
    opt_kw = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=tc["lr"], betas=tuple(tc["betas"]),
                            weight_decay=tc["weight_decay"], **opt_kw)
    losses = []
    ema = float(tc.get("ema", 0.0))
    avg = [p.detach().clone() for p in model.parameters()] if ema > 0 else None
    model.train()
    # torch.compile fuses the many elementwise ops (norms, modulation, RoPE)
    # on CUDA; the CPU smoke size runs eagerly.  Sampling always runs the
    # eager model (its attention calls are Python objects).
    fwd = torch.compile(model) if tc.get("compile") and dev.type == "cuda" else model
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    probes, probe_s = [], 0.0
    for step in range(tc["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        x0, t, noise, labels = batch_for_step(cfg, seed, step, dev)
        tb = t[:, None, None, None, None]
        xt = (1 - tb) * x0 + tb * noise
        with autocast(dev):
            try:
                pred = fwd(xt, t, labels=labels)
            except Exception as e:  # e.g. no Triton: train eagerly, and say so
                if fwd is model:
                    raise
                log(f"  torch.compile failed ({type(e).__name__}: {e}); training eagerly")
                fwd = model
                pred = fwd(xt, t, labels=labels)
        loss = torch.nn.functional.mse_loss(pred.float(), noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tc["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        if avg is not None:
            with torch.no_grad():
                torch._foreach_lerp_(avg, [p.detach() for p in model.parameters()],
                                     1.0 - ema_decay(step, ema))
        losses.append(loss.detach())
        if probe and probe_every and (step + 1) % probe_every == 0 and step + 1 < tc["steps"]:
            tp = time.perf_counter()
            probes.append({"step": step + 1, **_probe(model, avg, probe, step + 1, log)})
            probe_s += time.perf_counter() - tp
        if tc["log_every"] and (step + 1) % tc["log_every"] == 0:
            recent = torch.stack(losses[-tc["log_every"]:]).mean().item()
            el = time.perf_counter() - t0
            log(f"  seed {seed} step {step + 1}/{tc['steps']}: loss {recent:.4f}, "
                f"{(step + 1) / el:.1f} steps/s")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    secs = time.perf_counter() - t0 - probe_s
    curve = torch.stack(losses).float().cpu().tolist()
    if avg is not None:
        with torch.no_grad():
            for p, a in zip(model.parameters(), avg):
                p.copy_(a)
    model.eval().requires_grad_(False)
    info = {"seed": int(seed), "steps": tc["steps"], "train_s": secs,
            "steps_per_s": tc["steps"] / secs, "final_loss": final_loss(curve),
            "first_loss": first_loss(curve), "loss_curve": curve,
            "params": param_count(model), "compiled": fwd is not model, "cached": False,
            "ema": ema}
    if probe and probe_every:  # and the returned model itself, last
        last = probe(model, tc["steps"])
        log(f"  probe at step {tc['steps']}: {last}")
        info["probes"] = probes + [{"step": tc["steps"], **last}]
    log(f"  seed {seed}: {tc['steps']} steps in {secs:.1f} s ({info['steps_per_s']:.1f} "
        f"steps/s), final loss {info['final_loss']:.4f} (first 5%: {info['first_loss']:.4f})")
    return model, info


def cache_key(cfg, seed, device_type):
    """A hash of what determines the weights: the data/model/train config,
    the seed, the device type and the source of the modules involved."""
    h = hashlib.sha256()
    h.update(json.dumps({"fmt": CACHE_FORMAT, "data": cfg["data"], "model": cfg["model"],
                         "train": cfg["train"], "seed": int(seed), "device": device_type},
                        sort_keys=True).encode())
    for name in ("data.py", "model.py", "train.py"):
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def train_or_load(cfg, seed, device, cache_dir=None, log=print, probe=None, probe_every=0):
    """The trained model of `seed`, from cache_dir if a matching file is
    there (None: no cache), else trained and then saved there."""
    dev = torch.device(device)
    path = None
    if cache_dir:
        key = cache_key(cfg, seed, dev.type)
        path = os.path.join(cache_dir, f"{cfg['name']}-seed{seed}-{key}.pt")
        if os.path.exists(path):
            blob = torch.load(path, map_location=dev, weights_only=False)
            model = VideoDiT.from_config(cfg).to(dev)
            model.load_state_dict(blob["state_dict"])
            model.eval().requires_grad_(False)
            info = dict(blob["info"], cached=True, cache_file=path)
            log(f"  seed {seed}: loaded {path} (trained {info['steps']} steps in "
                f"{info['train_s']:.1f} s, final loss {info['final_loss']:.4f})")
            return model, info
    model, info = train(cfg, seed, dev, log, probe, probe_every)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path + ".tmp"
        torch.save({"state_dict": model.state_dict(), "info": info}, tmp)
        os.replace(tmp, path)
        info["cache_file"] = path
    return model, info
