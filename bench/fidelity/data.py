"""A deterministic procedural video dataset (no downloads).

Clip i is a pure function of (seed, i): its scene parameters are drawn from
numpy's generator seeded with [seed, i], and the frames are rendered from
them with torch, vectorized over a batch of clips.  A clip is T x C x H x W,
C = 3, values in [-1, 1].

Why these ingredients: attention in a video DiT has local structure (object
edges, textures), temporal structure (the same object in the next frame,
somewhere else) and global structure (a brightness change or a camera pan
moves every token).  A model trained on clips that have all three learns
attention maps with all three, which is what the methods are judged on.

Each clip has
* a background, one of: a camera pan over a procedural field larger than
  the frame (sum of sinusoids, so it extends forever), drifting stripes, a
  drifting checkerboard, or a slowly moving colour gradient;
* one to three objects -- discs and (rotating) boxes -- that move in a
  straight line or bounce off the frame edges, painted in slot order, so
  they occlude each other when their paths cross (half of the clips force
  two objects onto a collision course);
* in half of the clips a global brightness/contrast ramp over time.

A clip's label is its background kind: the model is conditioned on it, as
a video DiT is on its prompt (model.py says why).

All geometry is in frame units (the frame is [0, 1]^2) and velocities are
per frame, so the tiny preset (32 x 32) shows the same scenes as the
default (64 x 64), only coarser.
"""
import math

import numpy as np
import torch

MAX_OBJECTS = 3
BG_KINDS = ("pan", "stripes", "checker", "gradient")
EDGE_PX = 0.6  # softness of object edges, in pixels (anti-aliasing)


def clip_params(seed, index):
    """The scene parameters of clip `index` (a dict of floats/arrays)."""
    rng = np.random.default_rng([int(seed), int(index)])
    u = rng.uniform
    p = {
        "bg_kind": int(rng.integers(len(BG_KINDS))),
        "c0": u(-0.9, 0.3, 3), "c1": u(-0.3, 0.9, 3),
        # pan: window velocity and the field's wave vectors (cycles / frame width)
        "pan_v": u(-0.06, 0.06, 2),
        "pan_k": u(-3.0, 3.0, (3, 2)), "pan_a": u(0.4, 1.0, 3), "pan_phi": u(0, 2 * math.pi, 3),
        # stripes: direction, frequency, phase speed (cycles / frame)
        "st_theta": u(0, math.pi), "st_freq": u(2.0, 6.0), "st_speed": u(-0.15, 0.15),
        # checker: cells per width, drift
        "ck_freq": u(1.5, 4.0), "ck_v": u(-0.05, 0.05, 2),
        # gradient: direction, drift
        "gr_theta": u(0, 2 * math.pi), "gr_speed": u(-0.08, 0.08),
        "n_obj": int(rng.integers(1, MAX_OBJECTS + 1)),
        "shape": rng.integers(0, 2, MAX_OBJECTS),          # 0 disc, 1 box
        "size": u(0.07, 0.18, MAX_OBJECTS),                # radius / half-width
        "aspect": u(0.35, 1.0, MAX_OBJECTS),               # box half-height / half-width
        "color": u(-1.0, 1.0, (MAX_OBJECTS, 3)),
        "pos": u(0.15, 0.85, (MAX_OBJECTS, 2)),
        "vel": u(-0.07, 0.07, (MAX_OBJECTS, 2)),
        "bounce": rng.integers(0, 2, MAX_OBJECTS),
        "angle": u(0, math.pi, MAX_OBJECTS),
        "omega": u(-0.35, 0.35, MAX_OBJECTS) * rng.integers(0, 2, MAX_OBJECTS),
        "gain": u(-0.6, 0.6) * rng.integers(0, 2), "offset": u(-0.3, 0.3) * rng.integers(0, 2),
    }
    if p["n_obj"] >= 2 and rng.random() < 0.5:
        # collision course: the same row, moving towards each other
        y = u(0.3, 0.7)
        speed = u(0.04, 0.08)
        p["pos"][0] = [0.2, y]
        p["pos"][1] = [0.8, y + u(-0.05, 0.05)]
        p["vel"][0] = [speed, u(-0.01, 0.01)]
        p["vel"][1] = [-speed, u(-0.01, 0.01)]
        p["bounce"][:2] = 1
    return p


def _to_device(params, device):
    """The parameters of a batch of clips as float32 tensors on `device`,
    [B, ...] each.  Packed into one pinned buffer and copied once without
    blocking: a copy per key from pageable memory made the host wait for
    the GPU 30 times per training step."""
    keys = sorted(params[0])
    arrays = [np.stack([np.asarray(p[k], dtype=np.float32) for p in params]) for k in keys]
    flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]))
    dev = torch.device(device)
    if dev.type == "cuda":
        flat = flat.pin_memory().to(dev, non_blocking=True)
    out, pos = {}, 0
    for k, a in zip(keys, arrays):
        out[k] = flat[pos:pos + a.size].view(a.shape)
        pos += a.size
    return out


def _mix(w, c0, c1):
    """Blend colours c0 -> c1 [B,3] by weight w [B,T,H,W] -> [B,T,3,H,W]."""
    w = w.unsqueeze(2)
    return c0[:, None, :, None, None] * (1 - w) + c1[:, None, :, None, None] * w


def _background(P, x, y, t):
    """The background weight field [B,T,H,W] of each clip (all four kinds
    are computed and the clip's kind picked: cheap, and branch-free)."""
    B = P["bg_kind"].shape[0]
    tt = t[None, :, None, None]
    X, Y = x[None, None, None, :], y[None, None, :, None]
    # pan: sample the infinite field at the moving window
    px = X + P["pan_v"][:, 0, None, None, None] * tt
    py = Y + P["pan_v"][:, 1, None, None, None] * tt
    f = 0
    for j in range(3):
        k = P["pan_k"][:, j]
        f = f + P["pan_a"][:, j, None, None, None] * torch.sin(
            2 * math.pi * (k[:, 0, None, None, None] * px + k[:, 1, None, None, None] * py)
            + P["pan_phi"][:, j, None, None, None])
    pan = 0.5 + 0.5 * torch.tanh(1.5 * f)
    # stripes
    th = P["st_theta"][:, None, None, None]
    s = torch.sin(2 * math.pi * (P["st_freq"][:, None, None, None]
                                 * (torch.cos(th) * X + torch.sin(th) * Y)
                                 - P["st_speed"][:, None, None, None] * tt))
    stripes = 0.5 + 0.5 * torch.tanh(3 * s)
    # checker
    cf = P["ck_freq"][:, None, None, None]
    c = (torch.sin(2 * math.pi * cf * (X - P["ck_v"][:, 0, None, None, None] * tt))
         * torch.sin(2 * math.pi * cf * (Y - P["ck_v"][:, 1, None, None, None] * tt)))
    checker = 0.5 + 0.5 * torch.tanh(6 * c)
    # gradient
    gt = P["gr_theta"][:, None, None, None]
    g = torch.cos(gt) * (X - 0.5) + torch.sin(gt) * (Y - 0.5) - P["gr_speed"][:, None, None, None] * tt
    gradient = 0.5 + 0.5 * torch.sin(math.pi * g)
    kinds = torch.stack([pan, stripes, checker, gradient], 0).expand(4, B, *pan.shape[1:])
    onehot = torch.nn.functional.one_hot(P["bg_kind"].long(), 4).T.float()
    return (kinds * onehot[:, :, None, None, None]).sum(0)


def _bounce(p, lo, hi):
    """Reflect positions p into [lo, hi] (a triangle wave): bouncing off walls."""
    span = (hi - lo).clamp_min(1e-6)
    u = torch.remainder(p - lo, 2 * span)
    return lo + torch.where(u < span, u, 2 * span - u)


def _objects(P, x, y, t, width):
    """Alpha masks [B,K,T,H,W] and colours [B,K,3] of the objects."""
    tt = t[None, None, :]
    pos = P["pos"][:, :, :, None] + P["vel"][:, :, :, None] * tt[:, :, None, :]  # [B,K,2,T]
    r = P["size"][:, :, None, None]
    bounced = _bounce(pos, r, 1 - r)
    pos = torch.where(P["bounce"][:, :, None, None] > 0, bounced, pos)
    dx = x[None, None, None, None, :] - pos[:, :, 0, :, None, None]
    dy = y[None, None, None, :, None] - pos[:, :, 1, :, None, None]
    ang = (P["angle"][:, :, None] + P["omega"][:, :, None] * tt)[..., None, None]
    u = torch.cos(ang) * dx + torch.sin(ang) * dy
    w = -torch.sin(ang) * dx + torch.cos(ang) * dy
    a = P["size"][:, :, None, None, None]
    b = a * P["aspect"][:, :, None, None, None]
    disc = torch.sqrt(dx * dx + dy * dy) - a
    qx, qy = u.abs() - a, w.abs() - b
    box = (torch.sqrt(qx.clamp_min(0) ** 2 + qy.clamp_min(0) ** 2)
           + torch.maximum(qx, qy).clamp_max(0))
    d = torch.where(P["shape"][:, :, None, None, None] > 0, box, disc)
    alpha = torch.sigmoid(-d * width / EDGE_PX)
    k = torch.arange(MAX_OBJECTS, device=x.device)
    active = (k[None, :] < P["n_obj"][:, None]).float()
    return alpha * active[:, :, None, None, None], P["color"]


def render(params, frames, height, width, device="cpu"):
    """Render a list of clip_params dicts -> [B, T, 3, H, W] float32 in [-1, 1]."""
    P = _to_device(params, device)
    x = (torch.arange(width, device=device, dtype=torch.float32) + 0.5) / width
    y = (torch.arange(height, device=device, dtype=torch.float32) + 0.5) / width
    t = torch.arange(frames, device=device, dtype=torch.float32)
    img = _mix(_background(P, x, y, t), P["c0"], P["c1"])
    alpha, colour = _objects(P, x, y, t, width)
    for k in range(MAX_OBJECTS):  # slot order = depth order: later slots occlude
        a = alpha[:, k].unsqueeze(2)
        img = img * (1 - a) + colour[:, k, :, None, None, None].transpose(1, 2) * a
    ramp = (t / max(frames - 1, 1) - 0.5)[None, :, None, None, None]
    img = img * (1 + P["gain"][:, None, None, None, None] * ramp) \
        + P["offset"][:, None, None, None, None] * ramp
    return img.clamp(-1, 1)


def make_batch(data_cfg, indices, device="cpu"):
    """Clips `indices` of the dataset described by data_cfg (config.py's
    "data" section) and their labels: ([len(indices), T, C, H, W] float32,
    [len(indices)] int64 background kinds), both on `device`."""
    params = [clip_params(data_cfg["seed"], i) for i in indices]
    clips = render(params, data_cfg["frames"], data_cfg["height"], data_cfg["width"], device)
    labels = torch.tensor([p["bg_kind"] for p in params], dtype=torch.long)
    return clips, labels.to(device)


def make_clips(data_cfg, indices, device="cpu"):
    """The clips of make_batch alone."""
    return make_batch(data_cfg, indices, device)[0]


def clip_labels(data_cfg, indices):
    """The label of each clip: its background kind (an index into
    BG_KINDS), the class the model is conditioned on."""
    return [clip_params(data_cfg["seed"], i)["bg_kind"] for i in indices]


def stats_indices(data_cfg):
    """Indices of the held-out clips used for the data statistics (after the
    training pool, so never trained on)."""
    return list(range(data_cfg["pool"], data_cfg["pool"] + data_cfg["stats_clips"]))
