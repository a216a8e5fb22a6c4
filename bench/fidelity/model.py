"""A small video DiT in the style of Wan.

What it shares with Wan (and why it matters here): 3D patchify, 3D RoPE over
(t, h, w) on q and k, RMS norm of q and k across heads, adaLN modulation
of every block from the flow time (zero-initialized: "adaLN-zero"), a GELU
MLP, and a final modulated layer that unpatchifies.  No text: the model is
conditioned on a class label (the clip's background kind, data.py) added
to the time embedding, as DiT's class-conditional models do, so all its
attention is still video self-attention -- what qvattn's methods are for.
The label stands in for a prompt: the unconditional model of this size
sampled clips flatter and smoother than the data (bench/RESULTS.md), a
mixture of scene kinds; given the kind, each sample has one scene to draw.

The attention is pluggable: every block calls attn(q, k, v, layer_index) on
[B, H, N, D] tensors with q and k after RoPE, and uses its output as
[B, H, N, D].  Training uses torch SDPA (sdpa_attention); sample.py passes
the reference and the qvattn methods.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def sdpa_attention(q, k, v, layer):
    """The default attention: torch SDPA in the tensors' own dtype."""
    del layer
    return F.scaled_dot_product_attention(q, k, v)


def rope_split(head_dim):
    """Channels of the head given to (t, h, w): Wan's split, h and w get
    2*(D//6) each and t the rest (D=128: 44/42/42; D=64: 24/20/20)."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_angles(grid, head_dim, theta):
    """Rotation angles [N, D/2] of the tokens of a (T, H, W) grid, raster
    order (t slowest): each axis rotates its own channel pairs."""
    axes = []
    for n, d in zip(grid, rope_split(head_dim)):
        inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        axes.append(torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :])
    T, H, W = grid
    at = axes[0][:, None, None, :].expand(T, H, W, -1)
    ah = axes[1][None, :, None, :].expand(T, H, W, -1)
    aw = axes[2][None, None, :, :].expand(T, H, W, -1)
    return torch.cat([at, ah, aw], -1).reshape(T * H * W, -1).float()


def apply_rope(x, cos, sin):
    """Rotate channel pairs (2i, 2i+1) of x [B,H,N,D] by the angles; in
    float32, returned in x's dtype."""
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)
    return out.flatten(-2).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def timestep_embedding(t, dim):
    """Sinusoidal embedding of the flow time t in [0, 1] (scaled by 1000,
    as diffusion models embed their timesteps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
    arg = 1000.0 * t.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(arg), torch.sin(arg)], -1)


def modulate(x, shift, scale):
    return x * (1 + scale[:, None, :]) + shift[:, None, :]


class Block(nn.Module):
    """Pre-norm transformer block with adaLN-zero: self-attention + MLP."""

    def __init__(self, hidden, heads, mlp_ratio):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.norm_q = RMSNorm(hidden)   # across heads, as Wan's rms_norm_across_heads
        self.norm_k = RMSNorm(hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        mlp = int(hidden * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(hidden, mlp), nn.GELU(approximate="tanh"),
                                 nn.Linear(mlp, hidden))
        self.ada = nn.Linear(hidden, 6 * hidden)

    def forward(self, x, c, cos, sin, attn, layer):
        B, N, C = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(c).chunk(6, -1)
        h = modulate(self.norm1(x), sh1, sc1)
        q, k, v = self.qkv(h).chunk(3, -1)
        q, k = self.norm_q(q), self.norm_k(k)
        split = lambda t: t.view(B, N, self.heads, C // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attn(q, k, v, layer).to(v.dtype)
        o = o.transpose(1, 2).reshape(B, N, C)
        x = x + g1[:, None, :] * self.proj(o)
        x = x + g2[:, None, :] * self.mlp(modulate(self.norm2(x), sh2, sc2))
        return x


class VideoDiT(nn.Module):
    """x [B, T, C, H, W], t [B] in [0, 1] (and labels [B]) -> velocity
    [B, T, C, H, W]."""

    def __init__(self, frames, height, width, channels=3, patch=(1, 4, 4), hidden=512,
                 head_dim=128, layers=6, mlp_ratio=4.0, rope_theta=10000.0, freq_dim=256,
                 classes=0, null_label=False):
        super().__init__()
        self.classes = classes
        # an extra label, index `classes`, for "no label": trained by
        # dropping labels (train.label_dropout), sampled beside the real one
        # for classifier-free guidance (sample.guidance)
        self.null_label = bool(null_label and classes)
        self.patch = tuple(patch)
        self.channels = channels
        self.grid = (frames // patch[0], height // patch[1], width // patch[2])
        self.heads = hidden // head_dim
        self.freq_dim = freq_dim
        pdim = channels * patch[0] * patch[1] * patch[2]
        self.embed = nn.Linear(pdim, hidden)
        self.t_mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(),
                                   nn.Linear(hidden, hidden))
        self.label_embed = (nn.Embedding(classes + self.null_label, hidden) if classes
                            else None)
        self.blocks = nn.ModuleList(Block(hidden, self.heads, mlp_ratio) for _ in range(layers))
        self.norm_out = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(hidden, 2 * hidden)
        self.out = nn.Linear(hidden, pdim)
        ang = rope_angles(self.grid, head_dim, rope_theta)
        self.register_buffer("rope_cos", torch.cos(ang), persistent=False)
        self.register_buffer("rope_sin", torch.sin(ang), persistent=False)
        self._init()

    def _init(self):
        """DiT's init: Xavier linears, zero adaLN and output layers, so every
        block starts as the identity and the model predicts 0."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for b in self.blocks:
            nn.init.zeros_(b.ada.weight)
            nn.init.zeros_(b.ada.bias)
        for m in (self.ada_out, self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)
        if self.label_embed is not None:
            nn.init.normal_(self.label_embed.weight, std=0.02)

    @classmethod
    def from_config(cls, cfg):
        d, m = cfg["data"], cfg["model"]
        return cls(d["frames"], d["height"], d["width"], d["channels"], m["patch"],
                   m["hidden"], m["head_dim"], m["layers"], m["mlp_ratio"],
                   m["rope_theta"], m["freq_dim"], m.get("classes", 0),
                   m.get("null_label", False))

    def patchify(self, x):
        B, T, C, H, W = x.shape
        pt, ph, pw = self.patch
        x = x.reshape(B, T // pt, pt, C, H // ph, ph, W // pw, pw)
        x = x.permute(0, 1, 4, 6, 2, 3, 5, 7)
        return x.reshape(B, -1, pt * C * ph * pw)

    def unpatchify(self, x):
        B = x.shape[0]
        gt, gh, gw = self.grid
        pt, ph, pw = self.patch
        x = x.reshape(B, gt, gh, gw, pt, self.channels, ph, pw)
        x = x.permute(0, 1, 4, 5, 2, 6, 3, 7)
        return x.reshape(B, gt * pt, self.channels, gh * ph, gw * pw)

    def forward(self, x, t, attn=None, labels=None):
        """labels [B] int64 in [0, classes) (or the null label `classes`,
        when the model has one): required when the model has classes,
        refused when it has none."""
        attn = attn or sdpa_attention
        c = self.t_mlp(timestep_embedding(t, self.freq_dim))
        if (labels is None) != (self.label_embed is None):
            raise ValueError(f"this model has {self.classes} classes: labels "
                             + ("required" if labels is None else "not accepted"))
        if labels is not None:
            c = c + self.label_embed(labels)
        c = F.silu(c)
        h = self.embed(self.patchify(x))
        for i, blk in enumerate(self.blocks):
            h = blk(h, c, self.rope_cos, self.rope_sin, attn, i)
        sh, sc = self.ada_out(c).chunk(2, -1)
        h = self.out(modulate(self.norm_out(h), sh, sc))
        return self.unpatchify(h.float())


def param_count(model):
    return sum(p.numel() for p in model.parameters())
