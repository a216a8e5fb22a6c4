"""The harness's command line (run.py): the arguments, the --set
overrides and the checks that reject a run before it trains."""
import argparse
import json
import os

from benchutil import OUT_HELP, ROOT
import peers
from fidelity import config as C

DEFAULT_CACHE = os.path.join(ROOT, "bench", "out", "fidelity-cache")


def parse_args(argv, description):
    p = argparse.ArgumentParser(description=description.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=description.split("\n", 2)[2])
    p.add_argument("--tiny", action="store_true",
                   help="the CPU smoke size: 4x32x32 clips (256 tokens), hidden 128, "
                        "2 layers, 60 training steps, 4 sampling steps, 2 clips, 1 model")
    p.add_argument("--models", type=int, default=None,
                   help="number of model seeds (default 3; tiny: 1)")
    p.add_argument("--seeds", default=None,
                   help="comma list of model seeds to run (default: the first --models "
                        "of config.MODEL_SEEDS); with the weights cache, one device call "
                        "can train some seeds and a later one report them all")
    p.add_argument("--clips", type=int, default=None,
                   help="clips sampled per model (default 8; tiny: 2)")
    p.add_argument("--methods", default=None,
                   help="comma list of qvattn methods (default: config.METHODS)")
    p.add_argument("--head-dim", type=int, choices=(64, 128), default=None,
                   help="head dim (default 128; 64 doubles the heads at the same width)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--out", metavar="DIR", default=None, help=OUT_HELP)
    p.add_argument("--cache", metavar="DIR", default=DEFAULT_CACHE,
                   help="trained weights cache (default: %(default)s; '' = none)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write weights")
    p.add_argument("--train-steps", type=int, default=None,
                   help="override the training steps (marks the run as not the frozen config)")
    p.add_argument("--sample-steps", type=int, default=None,
                   help="override the sampling steps (marks the run as not the frozen config)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. train.t_dist=uniform or "
                        "train.batch=32 (repeatable; the key must exist; the value keeps "
                        "the type of the one it replaces; marks the run as not the "
                        "frozen config, and the weights cache keys on it)")
    p.add_argument("--probe-every", type=int, default=0, metavar="N",
                   help="every N training steps (and at the end) sample a few clips with "
                        "bf16-sdpa and record their statistics against the data's: does "
                        "longer training help? (not training time; the weights are the same)")
    p.add_argument("--sanity-samplers", default=None, metavar="STEPS:SHIFT,...",
                   help="also compute the sanity statistics (samples against data) with "
                        "these Euler samplers, e.g. 20:3,50:1 (the frozen one is "
                        "num_steps:shift): is the sampler or the model the limit?")
    p.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="train nothing: merge the reports of runs with different "
                        "--seeds (same config and methods) into one table")
    p.add_argument("--paired", default=C.PAIRED_BASELINE, metavar="METHOD",
                   help="the baseline of the clip-by-clip table (default %(default)s, "
                        "SageAttention2; a method of the run, for runs without it)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 with --tiny)")
    return p.parse_args(argv)


def apply_sets(cfg, items):
    """--set: cfg with each SECTION.KEY=VALUE applied; (list of the
    overrides as given, None) or ([], message)."""
    done = []
    for item in items:
        key, eq, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in ("data", "model", "train", "sample"):
            return [], f"--set {item!r}: SECTION.KEY=VALUE with SECTION data, model, train or sample"
        if name not in cfg[section]:
            return [], (f"--set {item!r}: no key {name!r} in {section} "
                        f"(keys: {', '.join(sorted(cfg[section]))})")
        old = cfg[section][name]
        try:
            if isinstance(old, bool):
                if text not in ("true", "false"):
                    raise ValueError("true or false")
                val = text == "true"
            elif isinstance(old, (int, float, str)):
                val = type(old)(text)
            else:
                val = json.loads(text)
                if type(val) is not type(old):
                    raise ValueError(f"a JSON {type(old).__name__}")
        except ValueError as e:
            return [], f"--set {item!r}: {section}.{name} is {type(old).__name__} ({e})"
        cfg[section][name] = val
        done.append(f"--set {key}={text}")
    return done, None


def parse_samplers(text):
    """'20:3,50:1' -> ([(20, 3.0), (50, 1.0)], None), or ([], message)."""
    out = []
    for item in (x.strip() for x in (text or "").split(",")):
        if not item:
            continue
        try:
            steps, shift = item.split(":")
            out.append((int(steps), float(shift)))
        except ValueError:
            return [], f"--sanity-samplers {text!r}: STEPS:SHIFT items, e.g. 20:3,50:1"
        if out[-1][0] < 1 or not out[-1][1] > 0:
            return [], f"--sanity-samplers {item!r}: steps >= 1 and shift > 0"
    return out, None


def parse_seeds(text):
    """'0,2' -> ([0, 2], None): distinct non-negative integers in the order
    given; ([], message) for anything else."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return [], f"--seeds {text!r}: a comma list of integers"
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        return [], f"--seeds {text!r}: distinct integers >= 0"
    return seeds, None


def validate_methods(qvattn, methods):
    """None if every method string parses, else the error message."""
    from qvattn._config import _base_config, options_string
    from fidelity import sample
    for m in methods:
        if m in peers.PEERS:
            continue
        try:
            method, opts = sample.parse_method(m)
            _base_config(method, options_string(opts))
            if "draft.warmup_method" in opts and not method.startswith("draft"):
                raise ValueError(f"{sample.WARM_TAG.strip(':=')} is for draft methods")
        except ValueError as e:
            return f"bad --methods entry {m!r}: {e}"
    return None


def validate_guidance(cfg):
    """None, or why the config's label dropout or guidance cannot run
    (checked before training, not after it)."""
    from fidelity import train
    if cfg["sample"].get("guidance", 1.0) == 1.0 and not cfg["train"].get("label_dropout"):
        return None
    if not 0.0 <= cfg["train"].get("label_dropout", 0.0) < 1.0:
        return "train.label_dropout must lie in [0, 1)"
    try:
        train.null_label(cfg)
    except ValueError as e:
        return str(e)
    return None
