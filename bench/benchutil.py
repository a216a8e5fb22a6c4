"""Helpers shared by the benchmark scripts in bench/."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Raw outputs (JSON, markdown, logs) go here unless --out or $OUT says
# otherwise; .gitignore ignores it.  Curated figures live in bench/RESULTS.md.
DEFAULT_OUT = os.path.join(ROOT, "bench", "out")
OUT_HELP = ("directory for the raw output files (default: $OUT if set, "
            "else bench/out/, which git ignores; curated figures go in bench/RESULTS.md)")


def out_dir(arg=None):
    """The raw-output directory: --out if given, else $OUT (set by
    scripts/gpu-check.sh and the device runs), else bench/out/.  Created."""
    path = arg or os.environ.get("OUT") or DEFAULT_OUT
    os.makedirs(path, exist_ok=True)
    return path


def git_rev():
    """Short commit of the checkout, "+dirty" if it has local changes, or
    None where git or the repository is not there (the GPU machine gets a
    copy of the tree without .git).  $QVATTN_GIT_REV, when set, is taken as
    is: the lent GPU machine's copy can carry stale git metadata, so the
    caller who knows the commit passes it."""
    if os.environ.get("QVATTN_GIT_REV"):
        return os.environ["QVATTN_GIT_REV"]
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain"],
                                   capture_output=True, text=True, timeout=10)
            return r.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except Exception:
        pass
    return None


def use_checkout_package():
    """Makes `import qvattn` find this checkout's python/ package and, unless
    QVATTN_LIB is set, the library of build/ or build-gpu/."""
    if "QVATTN_LIB" not in os.environ:
        for cand in ("build/libqvattn.so", "build-gpu/libqvattn.so"):
            path = os.path.join(ROOT, cand)
            if os.path.exists(path):
                os.environ["QVATTN_LIB"] = path
                break
    sys.path.insert(0, os.path.join(ROOT, "python"))


def method_suffixes(name):
    """A method name with options, METHOD[:KEY=VALUE]... -> (METHOD,
    {KEY: VALUE}): the form the fidelity harness and compare.py take (each
    suffix a qvattn.attention option).  ValueError for a suffix without "="."""
    method, *suffixes = name.split(":")
    opts = {}
    for sfx in suffixes:
        key, eq, value = sfx.partition("=")
        if not eq or not key:
            raise ValueError(f"method suffix {sfx!r} of {name!r} is not KEY=VALUE")
        opts[key] = value
    return method, opts
