"""The frozen configuration of the fidelity harness.

Issue 14 asks that the dataset, the model and the seeds be frozen before
methods are compared, and never tuned to favour one: every number that
shapes a result lives here, and run.py marks a run that overrides any of
them (--train-steps, --sample-steps) as "not the frozen config".

Two presets: DEFAULT (the H200 run) and TINY (the CPU smoke size of the
test and of CI).  Each is a dict of four sections -- data, model, train,
sample -- that model.py, data.py, train.py and sample.py read.
"""
import copy

# --------------------------------------------------------------- the presets
DEFAULT = {
    "name": "default",
    "data": {
        "frames": 8, "height": 64, "width": 64, "channels": 3,
        # Clip i of the dataset is rendered from the seed (seed, i); training
        # draws indices from [0, pool), the sanity statistics use the clips
        # that follow the pool, so they were never trained on.
        "seed": 20261201, "pool": 65536, "stats_clips": 64,
    },
    "model": {
        "patch": [1, 4, 4],          # 8 x 16 x 16 = 2048 tokens at 8 x 64 x 64
        "hidden": 512, "head_dim": 128, "layers": 6, "mlp_ratio": 4.0,
        "rope_theta": 10000.0, "freq_dim": 256,
        # conditioned on the clip's background kind (data.BG_KINDS): model.py
        "classes": 4,
        # an extra "no label" class, trained on 10% of the clips
        # (train.label_dropout), for classifier-free guidance: without it the
        # samples had the data's statistics but not its shapes (flat fields
        # for stripes, blotches for checkers; bench/RESULTS.md)
        "null_label": True,
    },
    # 6000 steps and a weight average (ema): 3500 steps without one (the
    # first frozen config, bench/RESULTS.md) sampled blobs, not the data's
    # shapes.  On the H200 (torch.compile, bf16) a step takes 23-28 ms
    # alone; the three models train at once in 428 s (three processes), and
    # sampling every method with guidance takes another 143 s.
    # t is uniform: logit-normal times (SD3's) gave the low-noise steps,
    # where the fine detail is made, little weight, and the samples missed
    # the data's high-frequency energy at every sampler (bench/RESULTS.md).
    "train": {
        "steps": 6000, "ema": 0.999, "batch": 16, "lr": 3e-4, "warmup": 200,
        "min_lr_frac": 0.1, "weight_decay": 0.01, "betas": [0.9, 0.99],
        "grad_clip": 1.0, "t_dist": "uniform", "label_dropout": 0.1, "log_every": 250,
        "compile": True,  # torch.compile the training forward on CUDA
    },
    # 40 Euler steps: Wan2.2's default, and the schedule qvattn's speed
    # figures assume (V-Smooth groups on 3 of 40 steps; 20 steps gave
    # samples with 0.73x the data's std)
    "sample": {
        "num_steps": 40, "shift": 3.0, "clips": 8, "clip_seed": 7700,
        # classifier-free guidance: v = v_null + guidance * (v_label - v_null);
        # 1 = the label's velocity alone (no null-label pass).  2, chosen on
        # the reference samples' likeness before any method was compared:
        # 1.5 kept the blotchy shapes, 3 overshot one model's high-frequency
        # energy (1.40x the data's); bench/RESULTS.md.  The labelled and
        # null-label clips go through attention as one batch, as in Wan.
        "guidance": 2.0,
        # the sanity statistics (samples against data) come from this many
        # reference clips, as many as the data's stats_clips: per-clip
        # statistics vary widely (the data mixes still and moving scenes)
        "sanity_clips": 64,
        # ... sampled with this many Euler steps (at the frozen shift) for the
        # verdict "do the samples look like the data?": a question about the
        # model, so asked with a sampler whose own step error is small (40
        # steps gave 0.77-0.83x the data's std where 100 gave 0.84-0.87x,
        # same models; bench/RESULTS.md).  The comparison sampler's
        # statistics are reported beside it.
        "likeness_steps": 100,
        # draft's dense warm-up: ceil(0.25 * num_steps) steps, the default of
        # qvattn.diffusers.apply (draft_warmup=0.25), passed as the option
        # draft.dense_warmup_frac (the library's own default is 0).
        "draft_warmup_frac": 0.25,
        # the reference run's Q/K/V are captured at these steps (first,
        # middle, last), for the per-layer statistics and the operator rel-L2
        "capture_steps": "first,middle,last",
        # the frame sheet: the first sampled clip of each kind (run.py)
        "image_frames": 8, "image_clips": 4,
    },
}

TINY = copy.deepcopy(DEFAULT)
TINY["name"] = "tiny"
TINY["data"].update({"frames": 4, "height": 32, "width": 32, "pool": 4096,
                     "stats_clips": 16})       # 4 x 8 x 8 = 256 tokens
TINY["model"].update({"hidden": 128, "layers": 2, "freq_dim": 64})
TINY["train"].update({"steps": 60, "ema": 0.9, "batch": 4, "lr": 1e-3, "warmup": 6,
                      "log_every": 20})
TINY["sample"].update({"num_steps": 4, "clips": 2, "sanity_clips": 16, "likeness_steps": 8,
                       "image_frames": 4,
                       "image_clips": 1})

PRESETS = {"default": DEFAULT, "tiny": TINY}

# Model seeds: each trains its own model (init and data order).
MODEL_SEEDS = [0, 1, 2]
TINY_MODEL_SEEDS = [0]

# The methods compared against the bf16-sdpa reference, in report order.
METHODS = [
    # vc8 (the Python layer's default) and sage8 rotate Q and K and sum
    # P's codes; +qblock is the papers' per-block Q scale
    "bf16", "sage8", "sage8+qblock", "vc8", "vc8+qblock", "vc8+expcast",
    # ExpCast at the centred beta
    "vc8+expcast-centred",
    # sage8 in SageAttention2's form, and vc8 unrotated (the VC paper's
    # Q and K, with the per-row Q scale and the code sum)
    "sage8+nohadamard+fp32sum", "vc8+nohadamard", "vc8+nohadamard+expcast",
    # the PV product in integers (docs/NUMERICS.md §3): the most faithful
    # one-product forms on the operator presets
    "sage8+i8pv", "vc8+i8pv",
    "fp8", "sage4", "vc4",
    "draft@85/0/0/15", "draft@70/0/0/30", "draft@50/0/0/50",
    # draft's 8-bit phase (half of the kept blocks at INT8/FP8)
    "draft@85/0/7.5/7.5+expcast",
    # the dense warm-up steps on an 8-bit method (option draft.warmup_method)
    "draft@85/0/0/15+expcast:warm=vc8", "draft@85/0/0/15:warm=sage8",
    # the adaptive budget (per-head K, on the device on CUDA)
    "draft@p95",
    # peers (bench/peers.py), a "skipped" row where not installed
    "sage2",
]
REFERENCE = "bf16-sdpa"
# The method every other is compared with clip by clip (summary.paired):
# the peer the fidelity target is stated against.
PAIRED_BASELINE = "sage2"

# Final training loss (mean of the last 5% of steps) of each frozen model as
# recorded on the first GPU run, keyed by loss_key().  A retrained model must
# land within LOSS_TOLERANCE of it (run.py warns loudly and exits non-zero
# otherwise).  The maintainer fills this after the first H200 run: run.py
# prints the lines to paste for every model that has no entry.
RECORDED_FINAL_LOSS = {
    # H200, torch 2.11.0+cu130, 2026-12-02 07:07 UTC, tree 3f0891f (null
    # label, label dropout 0.1), the three models trained at once in three
    # processes (bench/RESULTS.md)
    "cuda/default/hd128/seed0": 0.0463,
    "cuda/default/hd128/seed1": 0.0454,
    "cuda/default/hd128/seed2": 0.0449,
}
LOSS_TOLERANCE = 0.05


def preset(name="default", head_dim=None):
    """A deep copy of preset `name`, with the head-dim variant applied: the
    hidden width stays, the head count follows (512 = 4 x 128 or 8 x 64)."""
    cfg = copy.deepcopy(PRESETS[name])
    if head_dim is not None:
        cfg["model"]["head_dim"] = int(head_dim)
    m = cfg["model"]
    if m["hidden"] % m["head_dim"]:
        raise ValueError(f"hidden {m['hidden']} is not a multiple of head dim {m['head_dim']}")
    return cfg


def heads(cfg):
    return cfg["model"]["hidden"] // cfg["model"]["head_dim"]


def grid(cfg):
    """The latent token grid (T, H, W) after patchify."""
    d, p = cfg["data"], cfg["model"]["patch"]
    return (d["frames"] // p[0], d["height"] // p[1], d["width"] // p[2])


def capture_steps(cfg):
    """The sampling steps whose Q/K/V the reference run captures."""
    n = cfg["sample"]["num_steps"]
    named = {"first": 0, "middle": n // 2, "last": n - 1}
    return sorted({named[s] for s in cfg["sample"]["capture_steps"].split(",")})


def loss_key(cfg, seed, device_type):
    """The RECORDED_FINAL_LOSS key of one model: the preset, the head dim,
    the seed and the device type (bf16 autocast on CUDA, float32 on the CPU
    give different losses)."""
    return f"{device_type}/{cfg['name']}/hd{cfg['model']['head_dim']}/seed{seed}"
