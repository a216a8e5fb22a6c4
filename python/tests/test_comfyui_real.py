"""qvattn.comfyui inside ComfyUI's own code, not a stand-in.

ComfyUI is not on PyPI.  This test gets the pinned release below at test
time -- never vendored or committed -- and runs, on the CPU, a tiny
random-weight ComfyUI Wan model (comfy/ldm/wan/model.py) whose attention
goes through ComfyUI's ``optimized_attention`` (comfy/ldm/modules/
attention.py, ``wrap_attn``) into ``QvattnOverride`` via
``transformer_options["optimized_attention_override"]``, the transformer
options shaped as ComfyUI's sampler builds them (``sigmas`` per call,
``sample_sigmas`` per run, cond and uncond in one batch).  It checks that
qvattn ran the self-attention of both blocks at the right steps, that the
short cross-attention went back to ComfyUI's attention function, and that
the output matches ComfyUI's own attention.

Where ComfyUI comes from:

* ``QVATTN_COMFYUI_DIR`` = a ComfyUI checkout (used as it is), or a git
  directory holding the pinned commit (a bare mirror: the commit's ``comfy``
  package is extracted with ``git archive``);
* otherwise ``git fetch --depth 1`` of the pinned commit from GitHub into
  ``QVATTN_COMFYUI_CACHE`` (default ``~/.cache/qvattn``), once;
* if neither works (offline) the test says so and skips.

ComfyUI runs in a subprocess (it parses ``sys.argv`` and keeps global
state).  It needs ``einops`` and ``psutil`` besides torch (the test skips
without them).
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from _torch_util import qvattn, torch  # noqa: F401  (skips without torch/lib)

COMFYUI_URL = "https://github.com/comfyanonymous/ComfyUI"
COMFYUI_TAG = "v0.3.64"
COMFYUI_COMMIT = "637221995f7424a561bd825de3e61ea117dfe1e3"  # "ComfyUI version 0.3.64"

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def _git(*args, timeout=300):
    return subprocess.run(["git", *args], capture_output=True, text=True, timeout=timeout)


def _is_checkout(path):
    return os.path.isfile(os.path.join(path, "comfy", "ldm", "modules", "attention.py"))


def _commit_of(path):
    r = _git("-C", path, "rev-parse", "HEAD", timeout=30)
    return r.stdout.strip() if r.returncode == 0 else "unknown (not a git checkout)"


def _from_git_dir(git_dir, dest):
    """Extracts the pinned commit's comfy package from a (bare) git dir."""
    os.makedirs(dest, exist_ok=True)
    tar = os.path.join(dest, "comfyui.tar")
    # text_encoders holds tokenizer files ComfyUI's attention never reads (and
    # which a partial mirror may lack)
    r = _git(f"--git-dir={git_dir}", "archive", "--format=tar", "-o", tar, COMFYUI_COMMIT,
             "--", "comfy", ":(exclude)comfy/text_encoders", "comfyui_version.py")
    if r.returncode == 0:
        subprocess.run(["tar", "-xf", tar, "-C", dest], check=True)
    if os.path.exists(tar):
        os.remove(tar)
    if not _is_checkout(dest):
        pytest.skip(f"QVATTN_COMFYUI_DIR={git_dir}: no ComfyUI {COMFYUI_TAG} "
                    f"({COMFYUI_COMMIT[:12]}) in it: {r.stderr.strip()[-300:]}")
    return dest, COMFYUI_COMMIT


def _clone(dest):
    """git fetch --depth 1 of the pinned commit; skips when it cannot."""
    if _is_checkout(dest) and _commit_of(dest) == COMFYUI_COMMIT:
        return dest, COMFYUI_COMMIT
    tmp = dest + ".part"
    subprocess.run(["rm", "-rf", tmp], check=False)
    try:
        steps = [("init", "-q", tmp),
                 ("-C", tmp, "fetch", "-q", "--depth", "1", COMFYUI_URL, COMFYUI_COMMIT),
                 ("-C", tmp, "-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD")]
        for step in steps:
            r = _git(*step, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(r.stderr.strip()[-300:] or f"git {step[0]} failed")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        subprocess.run(["rm", "-rf", tmp], check=False)
        pytest.skip(f"cannot clone ComfyUI {COMFYUI_TAG} from {COMFYUI_URL} (offline?): {e}; "
                    "set QVATTN_COMFYUI_DIR to a checkout or a git directory holding "
                    f"{COMFYUI_COMMIT[:12]}")
    subprocess.run(["rm", "-rf", dest], check=False)
    os.replace(tmp, dest)
    return dest, _commit_of(dest)


@pytest.fixture(scope="module")
def comfyui_root(tmp_path_factory):
    for mod in ("einops", "psutil"):
        try:
            __import__(mod)
        except ImportError:
            pytest.skip(f"ComfyUI needs {mod} (pip install einops psutil)")
    given = os.environ.get("QVATTN_COMFYUI_DIR")
    if given:
        if _is_checkout(given):
            return given, _commit_of(given)
        if os.path.isdir(os.path.join(given, "objects")):
            return _from_git_dir(given, str(tmp_path_factory.mktemp("comfyui")))
        pytest.skip(f"QVATTN_COMFYUI_DIR={given} is neither a ComfyUI checkout nor a git "
                    "directory")
    cache = os.environ.get("QVATTN_COMFYUI_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "qvattn"))
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        cache = tempfile.mkdtemp(prefix="qvattn-comfyui-")
    return _clone(os.path.join(cache, f"ComfyUI-{COMFYUI_COMMIT[:12]}"))


# Runs in the subprocess: argv = [script, comfyui_root, qvattn's python dir]
_SCRIPT = r'''
import json, sys, time
t0 = time.time()
root, qdir = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, qdir]
import torch  # before libqvattn (see qvattn/__init__.py)
import comfy.options
comfy.options.enable_args_parsing()
sys.argv = [sys.argv[0], "--cpu"]
import comfy.ops
import comfy.ldm.modules.attention as cattn
import comfy.ldm.wan.model as wan
from qvattn import comfyui, ops

torch.manual_seed(0)
model = wan.WanModel(model_type="t2v", patch_size=(1, 2, 2), text_len=8, in_dim=4, dim=128,
                     ffn_dim=256, freq_dim=64, text_dim=32, out_dim=4, num_heads=2,
                     num_layers=2, operations=comfy.ops.disable_weight_init).eval()
with torch.no_grad():  # ComfyUI's ops skip weight init: a plain random one
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, p[0].numel() ** -0.5)
        elif "norm" in name:
            p.normal_(1.0, 0.1)
        else:
            p.normal_(0.0, 0.1)
g = torch.Generator().manual_seed(1)
B = 2  # cond and uncond in one call, as ComfyUI batches them
x = torch.randn(B, 4, 2, 16, 16, generator=g)     # latent grid (2, 8, 8): 128 tokens
context = torch.randn(B, 8, 32, generator=g)      # 8 text tokens
sample_sigmas = torch.linspace(1.0, 0.0, 5)        # a 4-step run


def options(override, step):
    # what comfy/samplers.py puts in transformer_options for a model call
    topts = {"sample_sigmas": sample_sigmas, "cond_or_uncond": [0, 1]}
    if override is not None:
        topts["optimized_attention_override"] = override
    topts["sigmas"] = sample_sigmas[step:step + 1].expand(B).clone()
    return topts


def run(override, step):
    topts = options(override, step)
    with torch.no_grad():
        return model(x, topts["sigmas"] * 1000.0, context, transformer_options=topts)


calls, routed = [], []
real = ops.attention_torch


def spy(q, k, v, **kw):
    calls.append({"layer": kw.get("layer"), "layout": kw.get("layout"),
                  "shape": list(q.shape), "method": kw.get("method")})
    return real(q, k, v, **kw)


ops.attention_torch = spy  # qvattn.comfyui calls ops.attention_torch


class Recording(comfyui.QvattnOverride):
    def __call__(self, func, *args, **kwargs):
        def comfy_func(*a, **k):
            routed.append({"func": func.__name__, "keys": int(a[1].shape[1])})
            return func(*a, **k)
        return super().__call__(comfy_func, *args, **kwargs)


res = {"comfy_attention": cattn.optimized_attention.__name__,
       "wrapped": hasattr(cattn.optimized_attention, "__wrapped__")}
refs = [run(None, s) for s in range(4)]  # ComfyUI's own attention
res["ref_calls"] = len(calls)
exact = Recording("exact", fallback=False)
outs = [run(exact, s) for s in range(4)]
res["exact_rel"] = [float((o - r).norm() / r.norm()) for o, r in zip(outs, refs)]
res["exact_calls"], calls[:] = list(calls), []
res["routed"], routed[:] = list(routed), []
vc = Recording("vc8+expcast", fallback=False)
steps = []
for s in range(4):
    out = run(vc, s)
    steps.append([vc.state.step, vc.state.num_steps])
    res.setdefault("vc8_rel", []).append(float((out - refs[s]).norm() / refs[s].norm()))
res["vc8_steps"] = steps
res["vc8_calls"] = len(calls)
res["seconds"] = time.time() - t0
print("QVATTN_RESULT " + json.dumps(res))
'''


def test_override_inside_comfyui(comfyui_root, record_property):
    root, commit = comfyui_root
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", _SCRIPT, root, PYTHON_DIR],
                       capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("QVATTN_RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout[-2000:], r.stderr[-4000:])
    res = json.loads(lines[-1][len("QVATTN_RESULT "):])
    record_property("comfyui_commit", commit)
    record_property("comfyui_result", res)
    print(f"\nComfyUI {commit} ({root}): attention {res['comfy_attention']}, "
          f"{res['seconds']:.1f} s in the subprocess; exact rel-L2 "
          f"{max(res['exact_rel']):.2e}, vc8+expcast {max(res['vc8_rel']):.2e}")
    # ComfyUI's attention is the wrapped one the override hooks into
    assert res["wrapped"] and res["ref_calls"] == 0
    # exact: qvattn ran both blocks' self-attention at every step, NHD, one
    # call per block and step (B=2: cond and uncond together)
    ex = res["exact_calls"]
    assert [c["layer"] for c in ex] == [0, 1] * 4
    assert all(c["layout"] == "NHD" and c["shape"] == [2, 128, 2, 64] for c in ex)
    # the 8-key cross-attention went back to ComfyUI's own function
    assert len(res["routed"]) == 8
    assert {c["func"] for c in res["routed"]} == {res["comfy_attention"]}
    assert {c["keys"] for c in res["routed"]} == {8}
    assert max(res["exact_rel"]) < 1e-5
    # vc8+expcast: the step from sigmas/sample_sigmas, close to ComfyUI's output
    assert res["vc8_steps"] == [[0, 4], [1, 4], [2, 4], [3, 4]]
    assert res["vc8_calls"] == 8
    assert 0 < max(res["vc8_rel"]) < 2e-2
