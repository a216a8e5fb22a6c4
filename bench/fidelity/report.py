"""The fidelity harness's outputs: the markdown report and PNG frame sheets.

The PNG writer is our own (zlib + struct: an IHDR, one IDAT of unfiltered
RGB scanlines, an IEND), so the harness needs no imaging package.
"""
import math
import struct
import zlib

import numpy as np

from .metrics import LIKENESS_BOUNDS

SEP = 2          # pixels between frames and rows of a frame sheet
SEP_GREY = 128


# ------------------------------------------------------------------ PNG
def _chunk(kind, payload):
    body = kind + payload
    return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def write_png(path, rgb):
    """Write an H x W x 3 uint8 array as an 8-bit RGB PNG."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, c = rgb.shape
    if c != 3:
        raise ValueError("write_png wants H x W x 3")
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))  # filter 0 per row
    png = (b"\x89PNG\r\n\x1a\n"
           + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + _chunk(b"IDAT", zlib.compress(raw, 9))
           + _chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def to_uint8(frame):
    """[C, H, W] in [-1, 1] -> H x W x 3 uint8."""
    a = np.clip((np.asarray(frame, dtype=np.float32) + 1) * 127.5 + 0.5, 0, 255)
    return a.astype(np.uint8).transpose(1, 2, 0)


def frame_sheet(rows, scale):
    """rows: list of clips [T, C, H, W] (numpy) -> one image, a row per clip,
    a column per frame, each frame upscaled `scale` x (nearest)."""
    T, _, H, W = rows[0].shape
    h, w = H * scale, W * scale
    img = np.full((len(rows) * (h + SEP) - SEP, T * (w + SEP) - SEP, 3), SEP_GREY, np.uint8)
    for r, clip in enumerate(rows):
        for t in range(T):
            f = to_uint8(clip[t]).repeat(scale, 0).repeat(scale, 1)
            img[r * (h + SEP):r * (h + SEP) + h, t * (w + SEP):t * (w + SEP) + w] = f
    return img


def sheet_scale(height):
    """Upscale so a frame is at least 128 pixels tall."""
    return max(1, int(math.ceil(128 / height)))


# ------------------------------------------------------------------ markdown
def _f(x, fmt="%.2f"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return fmt % x


def _main_table(res):
    n_models = len(res["models"])
    lines = ["| method | PSNR dB mean | PSNR std | PSNR min–max | SSIM mean | SSIM std "
             "| SSIM min–max | op rel-L2 mean (max) | op sharpen (cos) | per model PSNR |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for m, s in res["summary"].items():
        if s.get("status") != "ok":
            lines.append(f"| {m} | {s.get('status')} | | | | | | | | |")
            continue
        op = s.get("op_rel_l2")
        opt = "n/a" if op is None else f"{op['mean']:.2e} ({op['max']:.2e})"
        sharp = ("n/a" if op is None or "sharpen" not in op
                 else f"{op['sharpen']:+.2e} ({op['cos']:+.2f})")
        if m == res["meta"]["reference"]:
            lines.append(f"| {m} (reference) | – | | | – | | | {opt} | {sharp} | |")
            continue
        std_p = _f(s["psnr_std"]) if n_models > 1 else "–"
        std_s = _f(s["ssim_std"], "%.4f") if n_models > 1 else "–"
        per = " / ".join(_f(p) for p in s["per_model_psnr"])
        lines.append(f"| {m} | {_f(s['psnr_mean'])} | {std_p} | {_f(s['psnr_min'])}–"
                     f"{_f(s['psnr_max'])} | {_f(s['ssim_mean'], '%.4f')} | {std_s} | "
                     f"{_f(s['ssim_min'], '%.4f')}–{_f(s['ssim_max'], '%.4f')} | {opt} | {sharp} | "
                     f"{per} |")
    return lines


def _paired_table(res):
    """Each method against the paired baseline, clip by clip."""
    pr = res.get("paired")
    if not pr or not pr["methods"]:
        return []
    lines = ["", f"## Paired against {pr['baseline']} (same model, same noise)", "",
             f"PSNR of each clip minus {pr['baseline']}'s on the same clip: the mean, a 95% "
             "t-interval over the clips (which treats them as independent; retraining the "
             "models moves these means too), the clips above, and the mean per model.", "",
             "| method | mean dB | 95% CI (clips) | clips above | per model |",
             "|---|--:|---|--:|---|"]
    for m, p in pr["methods"].items():
        lo, hi = p["ci95"]
        lines.append(f"| {m} | {p['mean']:+.2f} | {lo:+.2f} to {hi:+.2f} | "
                     f"{p['clips_above']}/{p['clips']} | "
                     + " / ".join("n/a" if x is None else f"{x:+.2f}" for x in p["per_model"])
                     + " |")
    return lines


def _kept_table(res):
    """Draft methods: the share of region pairs kept on the routed steps,
    per layer (mean over routed steps and heads, then over models)."""
    lines = []
    for m, s in res["summary"].items():
        recs = [mod["methods"].get(m, {}).get("kept_share") for mod in res["models"]]
        if s.get("status") != "ok" or not recs or not all(recs):
            continue
        n = min(len(r["per_layer"]) for r in recs)
        per = [sum(r["per_layer"][i] for r in recs) / len(recs) for i in range(n)]
        lines.append(f"| {m} | {_f(s.get('kept_share_mean'), '%.3f')} | "
                     f"{_f(1 - s['kept_share_mean'], '%.3f') if s.get('kept_share_mean') is not None else 'n/a'} | "
                     + " / ".join(_f(x, "%.3f") for x in per) + " |")
    if not lines:
        return []
    return ["| method | kept share | skip rate | kept share per layer |",
            "|---|--:|--:|---|"] + lines


def _train_table(res):
    lines = ["| model seed | params | steps | train s | steps/s | first-5% loss | final loss "
             "| recorded | check |", "|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for m in res["models"]:
        t, c = m["train"], m["loss_check"]
        rec = _f(c.get("recorded"), "%.4f")
        lines.append(f"| {m['seed']} | {t['params'] / 1e6:.1f} M | {t['steps']} | "
                     f"{t['train_s']:.1f}{' (cached)' if t.get('cached') else ''} | "
                     f"{t['steps_per_s']:.1f} | {t['first_loss']:.4f} | {t['final_loss']:.4f} | "
                     f"{rec} | {c['status']} |")
    return lines


def _stats_row(label, s):
    mean = "/".join("%.3f" % x for x in s["mean"])
    std = "/".join("%.3f" % x for x in s["std"])
    return f"| {label} | {mean} | {std} | {s['frame_diff']:.4f} | {s['hf_ratio']:.4f} |"


def _ratios(like):
    r = like["ratios"]
    return " / ".join(_f(r[k]) for k in ("std", "frame_diff", "hf_ratio"))


def _sanity_table(res):
    lines = ["| clips | mean R/G/B | std R/G/B | mean abs frame diff | HF energy ratio "
             "| ratios to the data (std / frame diff / HF) | like the data? |",
             "|---|---|---|--:|--:|---|---|",
             _stats_row(f"data ({res['data_stats']['clips']} held-out clips)",
                        res["data_stats"]) + " | |"]
    for m in res["models"]:
        if m.get("sample_stats"):
            like = m.get("likeness")
            tail = (f" {_ratios(like)} | {'yes' if like['like_data'] else 'no'} |" if like
                    else " | |")
            n = m["sample_stats"].get("clips")
            sampler = (like or {}).get("sampler")
            lines.append(_stats_row(f"samples, model {m['seed']} (bf16-sdpa"
                                    + (f", {n} clips" if n else "")
                                    + (f", {sampler[0]} Euler steps" if sampler else "") + ")",
                                    m["sample_stats"]) + tail)
    return lines


def _sampler_table(res):
    """--sanity-samplers: the same sanity statistics with other samplers."""
    rows = [(m["seed"], p) for m in res["models"] for p in m.get("sampler_probe") or []]
    if not rows:
        return []
    lines = ["| model | Euler steps | shift | std R/G/B | mean abs frame diff | HF energy ratio "
             "| ratios to the data (std / frame diff / HF) | like the data? |",
             "|--:|--:|--:|---|--:|--:|---|---|"]
    for seed, p in rows:
        st = p["stats"]
        lines.append(f"| {seed} | {p['num_steps']} | {p['shift']:g} | "
                     + "/".join("%.3f" % x for x in st["std"])
                     + f" | {st['frame_diff']:.4f} | {st['hf_ratio']:.4f} | {_ratios(p)} | "
                     f"{'yes' if p['like_data'] else 'no'} |")
    return lines


def _probe_table(res):
    """--probe-every: the reference samples' likeness during training."""
    rows = [(m["seed"], p) for m in res["models"] for p in m["train"].get("probes") or []]
    if not rows:
        return []
    lines = ["| model | step | ratios to the data (std / frame diff / HF) | like the data? |",
             "|--:|--:|---|---|"]
    for seed, p in rows:
        lines.append(f"| {seed} | {p['step']} | {_ratios(p)} | {'yes' if p['like_data'] else 'no'} |")
    return lines


def _layer_table(res):
    steps = res["meta"]["capture_steps"]
    head = "/".join(f"s{s}" for s in steps)
    lines = [f"| model | layer | locality@15% ({head}) | entropy ({head}) | v_block ({head}) "
             f"| v_mean ({head}) |", "|--:|--:|---|---|---|---|"]
    for m in res["models"]:
        by_layer = {}
        for r in m.get("layer_stats", []):
            by_layer.setdefault(r["layer"], {})[r["step"]] = r
        for layer in sorted(by_layer):
            row = by_layer[layer]
            cell = lambda k: "/".join(_f(row[s][k], "%.3f") if s in row else "-"  # noqa: E731
                                      for s in steps)
            lines.append(f"| {m['seed']} | {layer} | {cell('locality')} | {cell('entropy')} | "
                         f"{cell('v_block')} | {cell('v_mean')} |")
    return lines


def markdown(res):
    """The report (also printed to stdout)."""
    m = res["meta"]
    cfg = res["config"]
    d, mc, tc, sc = cfg["data"], cfg["model"], cfg["train"], cfg["sample"]
    out = [f"# End-to-end fidelity: {m['preset']} video DiT", "",
           f"{m['date_utc']} on {m['device_name']} ({m['device']}), torch {m['torch']}, "
           f"{m['qvattn_build']}, git {m['git']}.", "",
           f"`{m['command']}`", ""]
    for r in m.get("merged_from", []):
        out += [f"* merged: `{r['file']}` (models {r['model_seeds']}), {r['date_utc']}, "
                f"git {r['git']}: `{r['command']}`"]
    if m.get("merged_from"):
        out += [""]
    if not m["frozen"]:
        out += [f"**Not the frozen config**: {', '.join(m['overrides'])}.", ""]
    for w in res.get("warnings", []):
        out += [f"**WARNING: {w}**", ""]
    out += [f"Data: {d['frames']}×{d['height']}×{d['width']} clips, seed {d['seed']}. "
            f"Model: {res['models'][0]['train']['params'] / 1e6:.1f} M parameters, "
            f"{mc['layers']} layers, hidden {mc['hidden']} = {m['heads']} heads × {mc['head_dim']}, "
            f"patch {'×'.join(map(str, mc['patch']))} → grid {tuple(m['grid'])} = "
            f"{m['tokens']} tokens. Training: {tc['steps']} steps of batch {tc['batch']}, "
            f"lr {tc['lr']}. Sampling: {sc['num_steps']} Euler steps (shift {sc['shift']}), "
            f"{m['clips']} clips per model, models (seeds) {m['model_seeds']}; draft dense "
            f"warm-up {sc['draft_warmup_frac']} of the steps.", "",
            "## Fidelity against bf16-sdpa (same model, same noise)", "",
            "PSNR (data range 2) and SSIM (11-tap Gaussian, σ 1.5) of each method's clips "
            "against the bf16-sdpa clips: the mean over a model's clips, then the mean, "
            "std and min–max over models. op rel-L2: one stateless call per captured "
            "(layer, step) of the reference run against float32 attention; mean (max) "
            "over models and points. op sharpen (cos): the same calls' error along "
            "ref − mean(V) (> 0 sharper rows, < 0 flatter; cos the share of the error "
            f"there, about 0 for noise; bench/fidelity/metrics.py). {m['lpips']}.", ""]
    out += _main_table(res)
    out += _paired_table(res)
    kept = _kept_table(res)
    if kept:
        out += ["", "## Draft: region pairs kept on the routed steps", "",
                "The share of the R² video-region pairs each routed call kept "
                "(16, 8 or 4 bits), mean over heads and routed steps, then over "
                "models; the dense warm-up steps are not counted.", ""] + kept
    out += ["", "## Training", ""] + _train_table(res)
    out += ["", "## Sanity: reference samples against the data", "",
            "Per-channel mean/std, mean absolute frame-to-frame difference, and the share "
            "of spectral energy above half the Nyquist frequency; the samples look like "
            "the data when every ratio lies in [%g, %g] (metrics.LIKENESS_BOUNDS), "
            "sampled with sample.likeness_steps Euler steps: the verdict is on the "
            "model, not on the comparison sampler's step error." % LIKENESS_BOUNDS,
            ""] + _sanity_table(res)
    samplers = _sampler_table(res)
    if samplers:
        out += ["", "The same statistics with the comparison sampler (sample.num_steps) and "
                "the other Euler samplers of `--sanity-samplers`, same model and noise:",
                ""] + samplers
    probes = _probe_table(res)
    if probes:
        out += ["", "During training (`--probe-every`, the sanity clips, the weights the run "
                "would return at that step):", ""] + probes
    out += ["", "## Attention per layer (reference run, clip 0)", "",
            "locality: share of the probability mass in the heaviest 15% of 128×128 blocks; "
            "entropy: mean row entropy / log N; v_block: share of the centred V's energy "
            "that its 128-token block means carry; v_mean: share of V's energy in its "
            "per-channel mean. Averages over heads, at the captured steps.", ""]
    out += _layer_table(res)
    if res.get("images"):
        out += ["", "## Frames", ""]
        for img in res["images"]:
            out.append(f"* `{img['file']}`: rows {', '.join(img['rows'])}; columns: frames.")
    out += ["", "## Timings (s)", ""]
    if m.get("merged_from"):
        for name, t in res["timings"].items():
            out.append(f"* {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
        out.append("")
    else:
        out += [", ".join(f"{k} {v:.1f}" for k, v in res["timings"].items()), ""]
    return "\n".join(out)
