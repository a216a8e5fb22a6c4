"""Metrics of the fidelity harness: clip similarity, sample statistics,
per-layer attention statistics and the operator-level error.

Clip similarity (each method's clip against the bf16-sdpa clip from the
same noise and the same model):
  PSNR   10 log10(range^2 / MSE) over the whole clip, range 2 ([-1, 1]);
         an MSE of 0 is reported as PSNR_CAP dB.
  SSIM   Wang et al.'s index with an 11-tap Gaussian window (sigma 1.5),
         K1 = 0.01, K2 = 0.03, data range 2, valid positions only, per
         frame and per channel, averaged.

Attention statistics (on q, k, v captured from the reference run, batch
element 0, per head, averaged over heads):
  locality   share of the attention probability mass (softmax(q k^T/sqrt(D)),
             each row sums to 1, total N) in the heaviest 15% of the
             128 x 128 blocks of the N x N map: 0.15 for a uniform map, 1 when
             all mass sits in few blocks;
  entropy    mean over rows of -sum p log p, divided by log N: 1 = uniform;
  v_block    share of V's energy carried by its 128-token block means: with
             V centred per channel over the tokens (Vc = V - mean), the energy
             of the block-mean approximation sum_b 128 ||mean_b(Vc)||^2 over
             ||Vc||^2 (the between-block share of V's variance; blocks in the
             model's token order t, h, w).  High: V is smooth over blocks, so
             a per-block mean removes most of it;
  v_mean     share of V's (uncentred) energy in its per-channel mean over all
             tokens, N ||mean(V)||^2 / ||V||^2: what subtracting the mean of V
             removes.

Operator rel-L2: ||out - ref|| / ||ref|| of one stateless qvattn.attention
call on captured bf16 q, k, v, against softmax attention computed in float32
from the same bf16 values.

The operator error's direction (error_direction): rel-L2 has no sign, but
an error that pushes every row the same way compounds over steps and
layers where noise does not.  With v_bar the per-head mean of V over the
keys (what uniform attention returns) and d = ref - v_bar per row:
  sharpen  <e, d> / <d, d> over all rows and heads (e = out - ref), so
           out = ref + sharpen (ref - v_bar) + a part orthogonal to d:
           > 0 moves the rows away from the uniform average (sharper
           attention), < 0 toward it (flatter);
  cos      <e, d> / (|e| |d|), the share of the error's norm along d:
           about 0 for unbiased rounding noise.
"""
import importlib.util
import math

import torch
import torch.nn.functional as F

PSNR_CAP = 100.0
BLOCK = 128
TOP_BLOCKS = 0.15


# ------------------------------------------------------------ clip similarity
def psnr(x, ref, data_range=2.0):
    """PSNR per clip of x [B, ...] against ref (same shape) -> list of floats."""
    mse = (x.double() - ref.double()).pow(2).flatten(1).mean(1)
    out = []
    for m in mse.tolist():
        out.append(PSNR_CAP if m <= 0 else min(PSNR_CAP, 10 * math.log10(data_range ** 2 / m)))
    return out


def gaussian_window(size=11, sigma=1.5):
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-x * x / (2 * sigma * sigma))
    return g / g.sum()


def _blur(x, g):
    """Separable valid Gaussian filter of x [M, 1, H, W]."""
    k = g.to(x)
    x = F.conv2d(x, k.view(1, 1, 1, -1))
    return F.conv2d(x, k.view(1, 1, -1, 1))


def ssim(x, ref, data_range=2.0):
    """SSIM per clip of x [B, T, C, H, W] against ref -> list of floats
    (mean over frames, channels and valid window positions)."""
    B = x.shape[0]
    a = x.double().reshape(-1, 1, *x.shape[-2:])
    b = ref.double().reshape(-1, 1, *ref.shape[-2:])
    g = gaussian_window()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_a, mu_b = _blur(a, g), _blur(b, g)
    saa = _blur(a * a, g) - mu_a * mu_a
    sbb = _blur(b * b, g) - mu_b * mu_b
    sab = _blur(a * b, g) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / \
        ((mu_a * mu_a + mu_b * mu_b + c1) * (saa + sbb + c2))
    return s.reshape(B, -1).mean(1).tolist()


def lpips_status():
    """The report's LPIPS note.  LPIPS needs a package and pretrained network
    weights (a torchvision backbone), and nothing may be downloaded here, so
    it is never computed; the note says which of the two is missing."""
    if importlib.util.find_spec("lpips") is None:
        return "LPIPS: n/a (no weights offline)"
    return "LPIPS: n/a (package present, but its backbone weights would be downloaded)"


# ------------------------------------------------------------ sample statistics
def clip_stats(x):
    """Statistics of clips x [B, T, C, H, W] that a trained model should
    reproduce: per-channel mean and std, mean |frame-to-frame difference|,
    and the high-frequency energy ratio (share of each centred frame's 2D
    spectral energy above half the Nyquist frequency, i.e. radial frequency
    > 0.25 cycles/pixel): low = blurrier than the data, high = noisier."""
    x = x.float()
    mean = x.mean(dim=(0, 1, 3, 4)).tolist()
    std = x.std(dim=(0, 1, 3, 4)).tolist()
    tdiff = (x[:, 1:] - x[:, :-1]).abs().mean().item() if x.shape[1] > 1 else 0.0
    H, W = x.shape[-2:]
    xc = x - x.mean(dim=(-2, -1), keepdim=True)
    power = torch.fft.fft2(xc).abs().pow(2)
    fy = torch.fft.fftfreq(H).abs()[:, None]
    fx = torch.fft.fftfreq(W).abs()[None, :]
    high = (torch.sqrt(fx * fx + fy * fy) > 0.25).to(x.device)
    tot = power.sum().item()
    hf = power[..., high].sum().item() / tot if tot > 0 else 0.0
    return {"mean": mean, "std": std, "frame_diff": tdiff, "hf_ratio": hf}


# The harness's sanity criterion (issue 14: "samples look like the data"):
# each statistic of the reference samples within these factors of the
# held-out data's.  Loose on purpose (the sanity clips are few), it catches what
# the eye sees first: samples too flat (low std, little high-frequency
# energy), too still or too jittery.  Set after the 6,000-step runs, which
# miss it by a wide margin (ratios 0.6-0.75), not to pass or fail them.
LIKENESS_BOUNDS = (0.8, 1.25)


def likeness(sample, data):
    """Ratios of the reference samples' statistics to the data's (mean
    over channels for the std) and whether all lie within LIKENESS_BOUNDS."""
    lo, hi = LIKENESS_BOUNDS
    std = sum(a / b for a, b in zip(sample["std"], data["std"]) if b > 0) / len(data["std"])
    ratios = {"std": std,
              "frame_diff": sample["frame_diff"] / data["frame_diff"] if data["frame_diff"] else None,
              "hf_ratio": sample["hf_ratio"] / data["hf_ratio"] if data["hf_ratio"] else None}
    ok = all(r is not None and lo <= r <= hi for r in ratios.values())
    return {"ratios": ratios, "like_data": ok, "bounds": [lo, hi]}


# ------------------------------------------------------------ attention statistics
def attention_stats(q, k, v, block=BLOCK, top=TOP_BLOCKS):
    """Locality, normalized entropy, v_block and v_mean (module docstring)
    of one captured call, q, k, v [1, H, N, D]; averaged over heads."""
    q, k, v = (t[0].float() for t in (q, k, v))
    H, N, D = q.shape
    nb = N // block
    loc, ent, vb, vm = [], [], [], []
    for h in range(H):
        p = torch.softmax((q[h] @ k[h].T) / math.sqrt(D), dim=-1)
        ent.append((-(p * torch.log(p.clamp_min(1e-30))).sum(-1)).mean().item() / math.log(N))
        if nb >= 1:
            pb = p[:nb * block, :nb * block].reshape(nb, block, nb, block).sum((1, 3)).flatten()
            keep = max(1, int(math.ceil(top * pb.numel())))
            loc.append(pb.sort(descending=True).values[:keep].sum().item() / (nb * block))
        vc = v[h] - v[h].mean(0, keepdim=True)
        tot = vc.pow(2).sum().item()
        if nb >= 1 and tot > 0:
            means = vc[:nb * block].reshape(nb, block, -1).mean(1)
            vb.append(block * means.pow(2).sum().item() / tot)
        vv = v[h].pow(2).sum().item()
        vm.append(N * v[h].mean(0).pow(2).sum().item() / vv if vv > 0 else 0.0)
    avg = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"locality": avg(loc), "entropy": avg(ent), "v_block": avg(vb), "v_mean": avg(vm)}


# ------------------------------------------------------------ operator error
def reference_attention(q, k, v):
    """float32 softmax attention of bf16 q, k, v [B, H, N, D]."""
    q, k, v = (t.float() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    n = ref.norm().item()
    return (out - ref).norm().item() / n if n > 0 else float("nan")


def error_direction(out, ref, v):
    """{"sharpen", "cos"} of out's error against ref (module docstring), by
    the library (qvattn.error_direction, FP64 on the host): out, ref
    [B, H, N, D]; v [B, H_kv, N_k, D], H a multiple of H_kv."""
    import qvattn
    return qvattn.error_direction(out, ref, v)


def operator_rel_l2(qvattn, method, captured, grid, options=None, call=None):
    """Mean and max rel-L2 of one stateless qvattn call per captured
    (layer, step) against float32 attention; {point: value} too; the mean
    over the points of error_direction's sharpen and cos.  `call`
    (q, k, v) -> out replaces qvattn for a peer kernel."""
    per, dirs = {}, []
    for key, (q, k, v) in captured.items():
        ref = reference_attention(q, k, v)
        if method == "bf16-sdpa":
            out = F.scaled_dot_product_attention(q, k, v)
        elif call is not None:
            out = call(q, k, v)
        else:
            out = qvattn.attention(q, k, v, method=method, grid=grid, options=options)
        per[key] = rel_l2(out, ref)
        try:
            dirs.append(error_direction(out, ref, v))
        except qvattn.QvaError:  # a library before qva_error_direction_compute, or NaN
            dirs.append({"sharpen": float("nan"), "cos": float("nan")})
    vals = list(per.values())
    return {"mean": sum(vals) / len(vals), "max": max(vals),
            "sharpen": sum(x["sharpen"] for x in dirs) / len(dirs),
            "cos": sum(x["cos"] for x in dirs) / len(dirs),
            "points": {f"L{l}/s{s}": x for (l, s), x in sorted(per.items())}}
