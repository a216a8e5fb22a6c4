"""The harness's summary over models (mean, spread) and the merge of runs
that trained different model seeds into one report."""
import datetime as _dt
import json
import math
import os
import statistics

from benchutil import out_dir
from fidelity import config as C


def clean_json(x):
    """JSON-safe: NaN/Inf -> None, tuples -> lists, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    return x


def _finite(x):
    return x is not None and math.isfinite(x)


def mean(xs):
    xs = [x for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else None


def summarize(models, methods):
    """Per method: mean/std/min/max over models of the per-model means."""
    summary = {}
    for name in [C.REFERENCE] + list(methods):
        recs = [m["methods"].get(name, {}) for m in models]
        bad = [r.get("status") for r in recs if r.get("status") != "ok"]
        s = {"status": bad[0] if bad else "ok"}
        ops = [m["op_rel_l2"].get(name) for m in models if "op_rel_l2" in m]
        ops = [o for o in ops if o and "mean" in o]
        s["op_rel_l2"] = ({"mean": mean([o["mean"] for o in ops]),
                           "max": max(o["max"] for o in ops)} if ops else None)
        if ops and all("sharpen" in o for o in ops):
            s["op_rel_l2"]["sharpen"] = mean([o["sharpen"] for o in ops])
            s["op_rel_l2"]["cos"] = mean([o["cos"] for o in ops])
        if name != C.REFERENCE and not bad:
            for key in ("psnr", "ssim"):
                per = [r.get(f"{key}_mean") for r in recs]
                s[f"per_model_{key}"] = per
                vals = [v for v in per if v is not None]
                s[f"{key}_mean"] = mean(vals)
                s[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
                s[f"{key}_min"] = min(vals) if vals else None
                s[f"{key}_max"] = max(vals) if vals else None
            s["finite"] = all(r.get("finite") for r in recs)
            kept = [r["kept_share"]["mean"] for r in recs if r.get("kept_share")]
            if len(kept) == len(recs):
                s["kept_share_mean"] = mean(kept)
        summary[name] = s
    return summary


# Two-sided 95% quantiles of Student's t by degrees of freedom (tables),
# the normal one past the last entry.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
         8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145,
         15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080,
         22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df):
    """The 97.5% quantile of t with df degrees of freedom (the next table
    entry at or below df: conservative between entries)."""
    if df < 1:
        return math.inf
    return _T975[max(k for k in _T975 if k <= df)] if df <= 120 else 1.960


def paired(models, methods, baseline):
    """Each method's PSNR minus `baseline`'s on the same clips (same model,
    same noise): the mean difference, a 95% t-interval over the clips, how
    many clips are above, and the per-model means.  The interval treats
    the clips as independent draws; it says nothing of retraining the
    models, whose spread can be larger.  None unless the baseline ran on
    every model."""
    base = [m["methods"].get(baseline, {}) for m in models]
    if not base or any(b.get("status") != "ok" or not b.get("psnr") for b in base):
        return None
    out = {}
    for name in methods:
        if name == baseline:
            continue
        recs = [m["methods"].get(name, {}) for m in models]
        if any(r.get("status") != "ok" or not r.get("psnr") for r in recs):
            continue
        per_model, diffs = [], []
        for r, b in zip(recs, base):
            d = [x - y for x, y in zip(r["psnr"], b["psnr"]) if _finite(x) and _finite(y)]
            diffs += d
            per_model.append(sum(d) / len(d) if d else None)
        if not diffs:  # e.g. a clip equal to the reference's: PSNR infinite
            continue
        n, mu = len(diffs), sum(diffs) / len(diffs)
        half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n) if n > 1 else math.inf
        out[name] = {"mean": mu, "ci95": [mu - half, mu + half], "clips": n,
                     "clips_above": sum(1 for d in diffs if d > 0), "per_model": per_model}
    return {"baseline": baseline, "methods": out}


def _run_timings(run, name):
    """(file, timings) pairs of a run; a merged report brings its runs'."""
    if run["meta"].get("merged_from"):
        return list(run["timings"].items())
    return [(name, run["timings"])]


def merge_results(runs, names, baseline=C.PAIRED_BASELINE):
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
           "paired": paired(models, base["meta"]["methods"], baseline),
           "timings": {tn: t for r, n in zip(runs, names) for tn, t in _run_timings(r, n)},
           "warnings": [w for r in runs for w in r["warnings"]],
           "images": [i for r in runs for i in r.get("images", [])]}
    return res, None


def merge_cli(paths, out, log, baseline=C.PAIRED_BASELINE):
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
    res, why = merge_results(runs, names, baseline)
    if why:
        log(f"fidelity --merge: {why}")
        return 2
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = os.path.join(out_dir(out), f"fidelity-merged-{stamp}")
    with open(base + ".json", "w") as f:
        json.dump(clean_json(res), f, indent=1)
    text = markdown(res)
    with open(base + ".md", "w") as f:
        f.write(text)
    log(text)
    log(f"results: {base}.json / .md")
    return exit_status(res)


def exit_status(results):
    return 1 if results["warnings"] else 0
