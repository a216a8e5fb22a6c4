"""Method configs for the Python layer (no torch needed).

options_string() turns a dict of config overrides into the canonical string
the torch op receives; _base_config() builds (and caches) the qva_config of
a (method, options) pair, config_for() the config of one call.  What the
library decides about a config -- can it run it (support_reason), is a
draft step a dense warm-up step (draft_dense_warmup) -- is asked of the
library (_ffi), never decided here.  Imports _ffi only.
"""
import functools
import math
import threading

from . import _ffi

# Config fields a caller may override: name -> (struct path, python type).
# "draft.dense_warmup_frac" is not a C field: it sets dense_warmup_steps to
# ceil(frac * num_steps) when the step count is known (diffusers.apply).
# "draft.dense_backend" is not a C field either: who computes a draft dense
# warm-up step on torch tensors, "sdpa" (torch SDPA; the default on CUDA) or
# "qvattn" (the library's BF16 kernel; the default on the CPU).
_OPTION_FIELDS = {
    "vsmooth.clusters": (("vsmooth", "clusters"), int),
    "vsmooth.iters": (("vsmooth", "iters"), int),
    "vsmooth.warm_start": (("vsmooth", "warm_start"), int),
    "vsmooth.schedule": (("vsmooth", "schedule"), "schedule"),
    "vsmooth.refresh_every": (("vsmooth", "refresh_every"), int),
    "draft.lambda": (("draft", "lambda_"), float),
    "draft.capacity": (("draft", "capacity"), int),
    "draft.dense_warmup_steps": (("draft", "dense_warmup_steps"), int),
    "draft.warmup_method": (("draft", "warmup_method"), "method"),
    "draft.min_keep": (("draft", "min_keep"), float),
    "draft.max_keep": (("draft", "max_keep"), float),
    "draft.dense_warmup_frac": (None, float),
    "draft.dense_backend": (None, "dense_backend"),
    "hadamard_signs": (("hadamard_signs",), int),
    "hadamard_seed": (("hadamard_seed",), int),
    "check_finite": (("check_finite",), int),
}
_SCHEDULES = {"paper": _ffi.QVA_SCHEDULE_PAPER, "always": _ffi.QVA_SCHEDULE_ALWAYS,
              "demean": _ffi.QVA_SCHEDULE_DEMEAN}
DENSE_BACKENDS = ("sdpa", "qvattn")


def _warmup_method_name(name, value):
    """A plain dense method name the library parses (no +options: the
    warm-up takes the call's own +expcast and +qblock)."""
    v = str(value).strip().strip("'\"").lower()
    if "+" in v or _method_id(v) in (None, _ffi.QVA_METHOD_DRAFT):
        raise ValueError(f"qvattn: option {name} must be a dense method name "
                         f"(bf16, fp8, sage8, vc8, sage4, vc4, exact) without "
                         f"+options, not {value!r}")
    return v


def _method_id(name):
    """The qva_method the library parses name to, or None."""
    cfg = _ffi.config_default()
    try:
        _ffi.config_set_method(cfg, name)
    except ValueError:
        return None
    return cfg.method


def _option_value(name, value):
    path, typ = _OPTION_FIELDS[name]
    if typ == "schedule":
        if isinstance(value, str):
            if value not in _SCHEDULES:
                raise ValueError(f"qvattn: option {name} must be one of "
                                 f"{sorted(_SCHEDULES)}, not {value!r}")
            return _SCHEDULES[value]
        return int(value)
    if typ == "method":
        return _warmup_method_name(name, value)
    if typ == "dense_backend":
        v = str(value).strip().strip("'\"").lower()
        if v not in DENSE_BACKENDS:
            raise ValueError(f"qvattn: option {name} must be one of "
                             f"{list(DENSE_BACKENDS)}, not {value!r}")
        return v
    if typ is int:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"qvattn: option {name} must be an integer, not {value!r}")
        return int(value)
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"qvattn: option {name} must be finite")
    return v


def options_string(options):
    """Canonical string form of an options dict (what the op receives).

    Keys: %s.  Raises ValueError for an unknown key or a bad value.
    """
    if options is None or options == "":
        return ""
    if isinstance(options, str):
        options = dict(kv.split("=", 1) for kv in options.split(";") if kv)
    if not isinstance(options, dict):
        raise TypeError("qvattn: options must be a dict, e.g. {'vsmooth.clusters': 16}")
    parts = []
    for name in sorted(options):
        if name not in _OPTION_FIELDS:
            raise ValueError(f"qvattn: unknown option {name!r}; known: "
                             + ", ".join(sorted(_OPTION_FIELDS)))
        val = _option_value(name, options[name])
        parts.append(f"{name}={val}" if isinstance(val, str) else f"{name}={val!r}")
    return ";".join(parts)


options_string.__doc__ = options_string.__doc__ % ", ".join(sorted(_OPTION_FIELDS))

_cfg_cache = {}
_cfg_lock = threading.Lock()


def _base_config(method, options):
    """QvaConfig bytes for (method, options): parsed once, then copied."""
    key = (method, options)
    raw = _cfg_cache.get(key)
    if raw is None:
        cfg = _ffi.config_default()
        _ffi.config_set_method(cfg, method)  # QvaValueError on a bad name
        for kv in options.split(";") if options else ():
            name, val = kv.split("=", 1)
            path, typ = _OPTION_FIELDS[name]
            if path is None:
                continue
            obj = cfg
            for p in path[:-1]:
                obj = getattr(obj, p)
            if typ == "method":
                setattr(obj, path[-1], _method_id(val))
            else:
                setattr(obj, path[-1], float(val) if typ is float else int(val))
        raw = bytes(cfg)
        with _cfg_lock:
            _cfg_cache[key] = raw
    return _ffi.QvaConfig.from_buffer_copy(raw)


def _option_raw(options, name):
    for kv in options.split(";") if options else ():
        k, v = kv.split("=", 1)
        if k == name:
            return v
    return None


def _option_float(options, name):
    v = _option_raw(options, name)
    return None if v is None else float(v)


def dense_warmup_steps(frac, num_steps):
    """Steps of a num_steps run that option draft.dense_warmup_frac = frac
    makes dense: ceil(frac * num_steps)."""
    return int(math.ceil(frac * num_steps - 1e-9))


def config_for(method, options, sm_scale, layer, step, num_steps, grid, prefix,
               prefix_at_end, n_tokens):
    """The qva_config of one call.  options: an options_string; sm_scale 0 =
    1/sqrt(D); grid None or (T, H, W); prefix < 0 = n_tokens - T*H*W."""
    cfg = _base_config(method, options)
    cfg.sm_scale = float(sm_scale)
    cfg.layer, cfg.step, cfg.num_steps = int(layer), int(step), max(0, int(num_steps))
    if grid:
        t, h, w = (int(g) for g in grid)
        cfg.draft.grid_t, cfg.draft.grid_h, cfg.draft.grid_w = t, h, w
        if prefix < 0:
            prefix = n_tokens - t * h * w
    cfg.draft.prefix_tokens = max(0, int(prefix))
    cfg.draft.prefix_at_end = 1 if prefix_at_end else 0
    frac = _option_float(options, "draft.dense_warmup_frac")
    if frac is not None and cfg.num_steps > 0:
        cfg.draft.dense_warmup_steps = dense_warmup_steps(frac, cfg.num_steps)
    return cfg


# ------------------------------------------------------------------ the library's answers
@functools.lru_cache(maxsize=512)
def support_reason(device, method, options, dtype, head_dim, step=0, num_steps=0,
                   heads=1, kv_heads=1):
    """'' if the library runs (method, options) at dtype and head_dim on
    `device` at `step` of a num_steps schedule (0: unknown), with `heads`
    query heads over `kv_heads` K/V heads (grouped-query attention when
    fewer), else a code:

    'E:<msg>'  a bad request (method string, options, a step outside the
               schedule): always a ValueError;
    'V:<msg>'  declined by the reference backend (e.g. head dim 96): a
               ValueError, or the SDPA fallback where the caller opted in;
    'U:<msg>'  valid, but the device backend cannot run it today (e.g.
               grouped K/V heads on CUDA): QvaUnsupportedError, or the
               fallback.
    The answers are qva_supports_heads' (cached: one query per distinct
    request).
    """
    try:
        cfg = _base_config(method, options)
    except ValueError as e:
        return "E:" + str(e)
    cfg.step, cfg.num_steps = int(step), max(0, int(num_steps))
    ok, why = _ffi.supports_heads(_ffi.QVA_DEVICE_CPU, cfg, dtype, head_dim, heads, kv_heads)
    if not ok:
        return ("E:" if why.startswith("invalid config") else "V:") + why
    if device != _ffi.QVA_DEVICE_CPU:
        ok, why = _ffi.supports_heads(device, cfg, dtype, head_dim, heads, kv_heads)
        if not ok:
            return "U:cuda backend: " + why
    return ""


def dense_backend(options, cuda):
    """Who computes a draft dense warm-up step: "sdpa" or "qvattn".

    options: an options_string; its "draft.dense_backend", else "sdpa" for
    CUDA tensors (cuda=True) and "qvattn" (the CPU reference) otherwise."""
    v = _option_raw(options, "draft.dense_backend")
    if v is None:
        return "sdpa" if cuda else "qvattn"
    return v


def draft_dense_warmup(cfg, n_tokens, head_dim, func="qvattn.attention"):
    """True when qva_attention computes the call `cfg` over n_tokens tokens
    of head_dim as a draft dense warm-up step, i.e. exactly as the bf16
    method (every row dense, BF16 operands -- FP16 for float16 inputs --
    FP32 softmax); False for the other methods.  The library decides
    (qva_draft_step_check, the draft plan), and raises what qva_attention
    raises for a draft config it rejects (grid, prefix, capacity, lambda,
    quotas).  cfg is the call's final config (config_for)."""
    if cfg.method != _ffi.QVA_METHOD_DRAFT:
        return False
    return _ffi.draft_step_check(cfg, n_tokens, head_dim, func)


_SCHEDULE_GRID = (1, 1, 128)  # a stand-in grid: the warm-up decision ignores it


def draft_warmup_schedule(method, warmup_steps, num_steps):
    """[True if dense] for each step of a num_steps run of the draft method
    with option draft.dense_warmup_steps = warmup_steps: the library's
    decision per step (draft_dense_warmup)."""
    n = _SCHEDULE_GRID[0] * _SCHEDULE_GRID[1] * _SCHEDULE_GRID[2]
    # within a C int; the same steps are dense
    opts = options_string({"draft.dense_warmup_steps":
                           max(0, min(int(warmup_steps), num_steps))})
    return [draft_dense_warmup(config_for(method, opts, 0.0, 0, s, num_steps, _SCHEDULE_GRID,
                                          0, False, n), n, 128)
            for s in range(num_steps)]
