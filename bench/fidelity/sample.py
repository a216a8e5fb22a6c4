"""Euler sampling of the flow model with a pluggable attention.

The sampler integrates dx/dt = v(x, t) from t = 1 (noise) to t = 0 over
num_steps Euler steps on a shifted time grid (shift > 1 spends more steps
at high noise, as Wan and SD3 sample).  Before each step it tells the
attention which step it is (begin_step), so a qvattn method sees the real
schedule: V-Smooth groups on its early steps and reuses the permutation
after, draft runs its dense warm-up steps, each layer keyed by its index in
the method's own qvattn.Context (one per method per sampling run).

Attentions:
  SdpaBF16      the reference "bf16-sdpa": torch SDPA on bf16 q, k, v;
  QvattnMethod  qvattn.attention(q, k, v, method=M, layer=i, step=s,
                num_steps=n, grid=(T, Hp, Wp), ctx=...) on bf16 q, k, v;
  PeerMethod    a peer kernel (bench/peers.py) where it is installed.
Capture wraps either and keeps q, k, v of clip 0 at chosen steps.
"""
import torch
import torch.nn.functional as F

from benchutil import method_suffixes

from . import data
from .train import autocast, null_label


def time_grid(num_steps, shift):
    """num_steps + 1 flow times from 1 down to 0, shifted:
    t' = shift * t / (1 + (shift - 1) * t)."""
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return (shift * s / (1 + (shift - 1) * s)).tolist()


def clip_noise(cfg, clips, device):
    """The fixed starting noise of the sampled clips: clip j from seed
    clip_seed + j, drawn on the CPU so it is the same on every device."""
    d = cfg["data"]
    shape = (d["frames"], d["channels"], d["height"], d["width"])
    out = [torch.randn(shape, generator=torch.Generator().manual_seed(
        cfg["sample"]["clip_seed"] + j)) for j in range(clips)]
    return torch.stack(out).to(device)


def clip_labels(cfg, clips, device):
    """The class of sampled clip j, for a model with classes (else None):
    the label of held-out data clip j (j modulo the held-out clips), so the
    samples have the data's mix of kinds and each sample sits beside the
    data clip of its kind in the sanity statistics and the frame sheets."""
    if not cfg["model"].get("classes"):
        return None
    held = data.stats_indices(cfg["data"])
    labels = data.clip_labels(cfg["data"], [held[j % len(held)] for j in range(clips)])
    return torch.tensor(labels, dtype=torch.long, device=device)


@torch.no_grad()
def sample(model, noise, attn, num_steps, shift, labels=None, guidance=1.0, null=None):
    """Euler from t = 1 to 0; returns the clips [B, T, C, H, W] float32.
    labels [B]: the class of each clip, for a model with classes.  With
    guidance != 1 (classifier-free guidance), each step also runs the clips
    with the null label `null`, in the same batch (so each attention call
    sees 2B clips, the labelled ones first), and steps along
    v_null + guidance * (v_label - v_null)."""
    ts = time_grid(num_steps, shift)
    x = noise.float().clone()
    dev = x.device
    guided = guidance != 1.0
    if guided:
        if labels is None or null is None:
            raise ValueError("guidance needs labels and a null label")
        labels = torch.cat([labels, torch.full_like(labels, int(null))])
    for i in range(num_steps):
        if hasattr(attn, "begin_step"):
            attn.begin_step(i, num_steps)
        xin = torch.cat([x, x]) if guided else x
        t = torch.full((xin.shape[0],), ts[i], device=dev, dtype=torch.float32)
        with autocast(dev):
            v = model(xin, t, attn, labels).float()
        if guided:
            v_label, v_null = v.chunk(2)
            v = v_null + guidance * (v_label - v_null)
        x = x + (ts[i + 1] - ts[i]) * v
    return x


def sampler_kwargs(cfg, labels):
    """labels, guidance and null label of sample() for a config."""
    g = float(cfg["sample"].get("guidance", 1.0))
    if g == 1.0:
        return {"labels": labels}
    return {"labels": labels, "guidance": g, "null": null_label(cfg)}


class SdpaBF16:
    """The reference: torch SDPA on bf16 tensors (the model's own kernel)."""
    name = "bf16-sdpa"

    def __call__(self, q, k, v, layer):
        return F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())


class QvattnMethod:
    """A qvattn method through the public API, with the step schedule."""

    def __init__(self, qvattn, method, grid, device, options=None):
        self.qvattn = qvattn
        self.name = split_method(method)[0]
        self.grid = tuple(grid)
        self.options = options
        dev = torch.device(device)
        self.ctx = qvattn.Context(qvattn._ffi.device_enum(dev.type))
        self.step, self.num_steps = 0, 0
        # draft: the kept share of each routed call, per layer (the adaptive
        # budget's varies by head and layer); empty where the library does
        # not report it
        self.kept = {} if self.name.startswith("draft") else None

    def begin_step(self, step, num_steps):
        self.step, self.num_steps = step, num_steps

    def __call__(self, q, k, v, layer):
        out = self.qvattn.attention(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), method=self.name, layer=layer,
            step=self.step, num_steps=self.num_steps, grid=self.grid, ctx=self.ctx,
            options=self.options)
        if self.kept is not None:
            st = self.ctx.last_draft_stats()
            if st["heads"] > 0:  # a routed step (not a dense warm-up one)
                self.kept.setdefault(layer, []).append(st["kept_mean"])
        return out

    def kept_share(self):
        """None, or {'per_layer': mean kept share of each layer's routed
        calls, 'mean': their mean}."""
        if not self.kept:
            return None
        per = [sum(v) / len(v) for _, v in sorted(self.kept.items())]
        return {"per_layer": per, "mean": sum(per) / len(per)}

    def close(self):
        self.ctx.close()


class PeerMethod:
    """A peer kernel of bench/peers.py (SageAttention2 as "sage2"): no
    schedule, the same call on every step."""

    def __init__(self, name, call):
        self.name, self.call = name, call

    def __call__(self, q, k, v, layer):
        return self.call(q.bfloat16().contiguous(), k.bfloat16().contiguous(),
                         v.bfloat16().contiguous())

    def kept_share(self):
        return None

    def close(self):
        pass


WARM_TAG = ":warm="


def parse_method(name):
    """A harness method name -> (qvattn method, {option: value}).

    The name is METHOD[:KEY=VALUE]...: each suffix is a qvattn option
    (qvattn.attention's options, e.g. "vc8+codesum:vsmooth.schedule=always"),
    and "warm=M" is short for draft.warmup_method=M (draft whose dense
    warm-up steps run as M).  Raises ValueError for a suffix without "=".
    """
    method, opts = method_suffixes(name)
    return method, {("draft.warmup_method" if k == "warm" else k): v for k, v in opts.items()}


def split_method(name):
    """A harness method name -> (qvattn method, draft warm-up method or None).
    "draft@85/0/0/15+expcast:warm=vc8" is draft whose dense warm-up steps run
    as vc8 (+expcast: the draft string's), option draft.warmup_method."""
    method, opts = parse_method(name)
    return method, opts.get("draft.warmup_method")


def routed_options(name):
    """The name's options for one stateless routed call (the operator
    metric): its suffixes less the draft warm-up's, or None."""
    opts = {k: v for k, v in parse_method(name)[1].items()
            if k not in ("draft.warmup_method", "draft.dense_warmup_frac")}
    return opts or None


def method_options(name, cfg):
    """Per-method qvattn options, or None: the name's own suffixes, and for
    draft the config's dense warm-up fraction."""
    method, opts = parse_method(name)
    if method.startswith("draft"):
        opts = {"draft.dense_warmup_frac": cfg["sample"]["draft_warmup_frac"], **opts}
    return opts or None


class Capture:
    """Wraps an attention and keeps (q, k, v) of batch element 0, as bf16,
    at the steps in `steps`: {(layer, step): (q, k, v)}."""

    def __init__(self, inner, steps):
        self.inner = inner
        self.steps = set(steps)
        self.step = 0
        self.saved = {}

    def begin_step(self, step, num_steps):
        self.step = step
        if hasattr(self.inner, "begin_step"):
            self.inner.begin_step(step, num_steps)

    def __call__(self, q, k, v, layer):
        if self.step in self.steps:
            self.saved[(layer, self.step)] = tuple(
                t[:1].detach().bfloat16().contiguous().clone() for t in (q, k, v))
        return self.inner(q, k, v, layer)
