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


def mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
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
        json.dump(clean_json(res), f, indent=1)
    text = markdown(res)
    with open(base + ".md", "w") as f:
        f.write(text)
    log(text)
    log(f"results: {base}.json / .md")
    return exit_status(res)


def exit_status(results):
    return 1 if results["warnings"] else 0
