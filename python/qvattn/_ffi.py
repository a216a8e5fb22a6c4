"""ctypes binding of the qvattn C API (include/qvattn.h).

The structures below mirror the C declarations field by field, in order;
python/tests/test_ffi_cpu.py compiles a small C program and checks that
sizeof/offsetof agree with ctypes.  Keep the two in step when the header
changes.

Library lookup, first hit wins:
  1. $QVATTN_LIB (a path to libqvattn.so),
  2. ../../build/libqvattn.so relative to this package (a source checkout),
  3. libqvattn.so next to this file (an installed copy).

Every failing call raises QvaError (a RuntimeError) or QvaValueError (also a
ValueError) carrying the status and qva_last_error().

Conversions (the one place Python values become C values): every integer
that reaches C -- a struct field (the structs below check assignments), a
tensor's shape or stride, an argument of a wrapper -- goes through
c_integer, which converts it (operator.index) and raises ValueError naming
the field when it is outside the C type's range (ctypes itself would wrap
it silently: 2**40 + 3 into a C int is 3).  Strings go through c_string
(a str, no NUL, UTF-8), device and dtype names through device_enum and
dtype_enum.  Nothing else is checked here: whether a value is valid is the
library's to say (include/qvattn.h), and its answer is raised as QvaError.
"""
import ctypes
import itertools
import operator
import os
import threading
import weakref
from ctypes import (POINTER, Array, Structure, byref, c_char_p, c_double,
                    c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p)

# ------------------------------------------------------------------ enums
QVA_OK = 0
QVA_ERR_INVALID_ARGUMENT = 1
QVA_ERR_SHAPE = 2
QVA_ERR_DTYPE = 3
QVA_ERR_UNSUPPORTED = 4
QVA_ERR_OUT_OF_MEMORY = 5
QVA_ERR_NONFINITE = 6
QVA_ERR_DEVICE = 7
QVA_ERR_PARSE = 8
QVA_ERR_IO = 9

QVA_F32, QVA_BF16, QVA_F16 = 0, 1, 2
QVA_DEVICE_CPU, QVA_DEVICE_CUDA = 0, 1

(QVA_METHOD_EXACT, QVA_METHOD_BF16, QVA_METHOD_FP8, QVA_METHOD_SAGE8,
 QVA_METHOD_VC8, QVA_METHOD_SAGE4, QVA_METHOD_VC4, QVA_METHOD_DRAFT) = range(8)

QVA_SCHEDULE_PAPER, QVA_SCHEDULE_ALWAYS, QVA_SCHEDULE_DEMEAN = 0, 1, 2
QVA_EXPCAST_OFF, QVA_EXPCAST_PAPER, QVA_EXPCAST_CENTRED, QVA_EXPCAST_E5M2 = 0, 1, 2, 3  # qva_expcast_mode
QVA_P_SUM_FP32, QVA_P_SUM_CODES = 0, 1  # qva_p_sum
QVA_P_MAX_ROW, QVA_P_MAX_BLOCK = 0, 1  # qva_p_max
QVA_K_MEAN_CALL, QVA_K_MEAN_PREVIOUS, QVA_K_MEAN_SAMPLE = 0, 1, 2  # qva_k_mean
QVA_V_SCALE_CALL, QVA_V_SCALE_PREVIOUS, QVA_V_SCALE_SAMPLE = 0, 1, 2  # qva_v_scale
QVA_LAYER_NONE = -1      # cfg.layer of a stateless call
QVA_MAX_HEAD_DIM = 128
QVA_STEP_GROUP, QVA_STEP_REUSE, QVA_STEP_PLAIN = 0, 1, 2
STEP_ACTION_NAMES = {QVA_STEP_GROUP: "group", QVA_STEP_REUSE: "reuse",
                     QVA_STEP_PLAIN: "plain"}

# C enums are int-sized on every ABI we target (4 bytes, 4-aligned).
c_enum = c_int


# ------------------------------------------------------------------ conversions
def _int_range(ctype):
    bits = 8 * ctypes.sizeof(ctype)
    if ctype is c_void_p or ctype(-1).value > 0:
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


_INT_CTYPES = (c_int, c_int64, c_uint64, c_size_t, c_void_p)
_INT_RANGES = {t: _int_range(t) for t in _INT_CTYPES}
# c_uint64 and c_size_t may be one class (c_ulong): names by size and sign
_INT_NAMES = {(4, True): "int", (8, True): "int64_t", (8, False): "uint64_t"}


def _int_name(ctype):
    if ctype is c_void_p:
        return "pointer"
    lo, _ = _INT_RANGES[ctype]
    return _INT_NAMES.get((ctypes.sizeof(ctype), lo < 0), ctype.__name__)


def c_integer(value, name, ctype=c_int):
    """value as a Python int that fits the C integer type ctype (c_int,
    c_int64, c_uint64, c_size_t; c_void_p: an address, None = NULL).

    Converts like operator.index (int, bool, numpy integers; not floats or
    strings: TypeError).  Raises ValueError naming `name` when the value is
    outside the type's range, where ctypes would silently keep the low bits.
    The only check made here: which values are valid is the library's call.
    """
    lo, hi = _INT_RANGES[ctype]
    if type(value) is int and lo <= value <= hi:  # the common case, fast
        return value
    if value is None and ctype is c_void_p:
        return None
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"qvattn: {name} must be an integer, got "
                        f"{type(value).__name__} {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"qvattn: {name} = {v} is outside the range of a C "
                         f"{_int_name(ctype)} [{lo}, {hi}]")
    return v


def c_string(value, name):
    """value as the bytes of a C string: a str without NUL, in UTF-8.

    TypeError for anything but str (None, bytes...); ValueError for a NUL
    (C would stop reading there: "sage8\\0junk" would be "sage8") or a
    character UTF-8 cannot encode (a lone surrogate)."""
    if not isinstance(value, str):
        raise TypeError(f"qvattn: {name} must be a str, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"qvattn: {name} {value!r} contains a NUL character")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"qvattn: {name} {value!r} cannot be encoded as UTF-8 "
                         f"({e.reason})") from None


DEVICE_NAMES = {"cpu": QVA_DEVICE_CPU, "cuda": QVA_DEVICE_CUDA}
DTYPE_NAMES = {"float32": QVA_F32, "bfloat16": QVA_BF16, "float16": QVA_F16}


def device_enum(device, name="device"):
    """qva_device of a device name: "cpu", "cuda" or "cuda:N" (a
    torch.device too).  ValueError names the accepted ones."""
    kind, sep, index = str(device).partition(":")
    if kind not in DEVICE_NAMES or (sep and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"qvattn: {name} must be 'cpu', 'cuda' or 'cuda:N', "
                         f"not {device!r}")
    return DEVICE_NAMES[kind]


def dtype_enum(dtype, name="dtype"):
    """qva_dtype of a dtype name: "float32", "bfloat16", "float16" (a torch
    or numpy dtype too).  ValueError names the accepted ones."""
    key = str(dtype)
    key = key[len("torch."):] if key.startswith("torch.") else key
    if key not in DTYPE_NAMES:
        raise ValueError(f"qvattn: {name} must be one of {list(DTYPE_NAMES)}, "
                         f"not {dtype!r}")
    return DTYPE_NAMES[key]


def _c_integers(values, name, ctype, length):
    """c_integer of each of `length` values (a C array), named name[i]."""
    values = tuple(values)
    if len(values) != length:
        raise ValueError(f"qvattn: {name} needs {length} values, got {len(values)}")
    lo, hi = _INT_RANGES[ctype]
    for x in values:
        if not (type(x) is int and lo <= x <= hi):
            return tuple(c_integer(x, f"{name}[{i}]", ctype) for i, x in enumerate(values))
    return values


_structure_setattr = Structure.__setattr__


class _CStruct(Structure):
    """A Structure whose integer fields (and integer arrays) take only
    values that fit: assignments go through c_integer, named
    <_c_name>.<field>.  Other fields are ctypes' as usual.  An element
    write into an array field (t.shape[2] = n) is ctypes' own, unchecked:
    assign the whole array (t.shape = [B, H, N, D]), as make_tensor does."""
    _c_name = ""
    _int_fields = {}

    def __setattr__(self, name, value):
        spec = self._int_fields.get(name)
        if spec is not None:
            ctype, length, cname, lo, hi = spec
            if length is None:
                if not (type(value) is int and lo <= value <= hi):  # else as is, fast
                    value = c_integer(value, cname, ctype)
            else:  # into the struct's array in place (faster than a new array)
                getattr(self, name)[:] = _c_integers(value, cname, ctype, length)
                return
        _structure_setattr(self, name, value)


def _checked(cls):
    """Records the integer fields of a _CStruct subclass (after _fields_)."""
    fields = {}
    for fname, ftype in cls._fields_:
        cname = cls._c_name + ("lambda" if fname == "lambda_" else fname)
        if ftype in _INT_CTYPES:
            fields[fname] = (ftype, None, cname, *_INT_RANGES[ftype])
        elif issubclass(ftype, Array) and ftype._type_ in _INT_CTYPES:
            fields[fname] = (ftype._type_, ftype._length_, cname, *_INT_RANGES[ftype._type_])
    cls._int_fields = fields
    return cls


# ------------------------------------------------------------------ structs
@_checked
class QvaTensor(_CStruct):
    """qva_tensor: shape = {B, H, N, D}, stride in elements."""
    _c_name = "tensor."
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_enum),
        ("device", c_enum),
        ("shape", c_int64 * 4),
        ("stride", c_int64 * 4),
    ]


@_checked
class QvaVsmoothParams(_CStruct):
    _c_name = "vsmooth."
    _fields_ = [
        ("clusters", c_int),
        ("iters", c_int),
        ("warm_start", c_int),
        ("block", c_int),
        ("schedule", c_enum),
        ("refresh_every", c_int),
    ]


@_checked
class QvaDraftParams(_CStruct):
    _c_name = "draft."
    _fields_ = [
        ("lambda_", c_float),  # C name: lambda (a Python keyword)
        ("frac_skip", c_float),
        ("frac4", c_float),
        ("frac8", c_float),
        ("frac16", c_float),
        ("grid_t", c_int),
        ("grid_h", c_int),
        ("grid_w", c_int),
        ("prefix_tokens", c_int),
        ("prefix_at_end", c_int),
        ("capacity", c_int),
        ("dense_warmup_steps", c_int),
        ("budget", c_int),  # qva_draft_budget (draft@pM sets MASS)
        ("mass", c_float),
        ("min_keep", c_float),
        ("max_keep", c_float),
        ("warmup_method", c_enum),  # qva_method of the dense warm-up steps
        ("int8_acc", c_int),  # qva_draft_int8_acc (+fp16acc sets FP16)
    ]


@_checked
class QvaConfig(_CStruct):
    _fields_ = [
        ("method", c_enum),
        ("sm_scale", c_float),
        ("hadamard", c_int),
        ("hadamard_signs", c_int),
        ("hadamard_seed", c_uint64),
        ("expcast", c_int),
        ("q_granularity", c_int),
        ("p_sum", c_int),
        ("v_code", c_int),
        ("vsmooth", QvaVsmoothParams),
        ("draft", QvaDraftParams),
        ("layer", c_int),
        ("step", c_int),
        ("num_steps", c_int),
        ("check_finite", c_int),
        ("k_mean", c_int),  # qva_k_mean (+kprev: PREVIOUS, +ksample: SAMPLE)
        ("v_scale", c_int),  # qva_v_scale (+vprev: PREVIOUS, +vsample: SAMPLE)
        ("p_floor", c_int),  # qva_p_floor (+floormass sets MEAN)
        ("p_max", c_int),  # qva_p_max (+pblock sets BLOCK)
        ("skip_fill", c_int),  # qva_skip_fill (+pooled sets POOLED)
    ]


# qva_error_terms' fields, in order (the keys of error_terms' dict).
ERROR_TERM_NAMES = ("full", "q", "k", "p", "v", "mu", "none")


class QvaTimings(Structure):
    """qva_timings (optional: libraries with qva_context_last_timings)."""
    _fields_ = [
        ("grouping_ms", c_float),
        ("prep_ms", c_float),
        ("kernel_ms", c_float),
    ]


class QvaSyntheticSpec(Structure):
    """qva_synthetic_spec: a synthetic workload (docs/SYNTHETIC.md)."""
    _fields_ = [
        ("name", ctypes.c_char * 32),
        ("B", c_int), ("H", c_int), ("D", c_int),
        ("grid_t", c_int), ("grid_h", c_int), ("grid_w", c_int),
        ("prefix_tokens", c_int),
        ("seed", ctypes.c_uint64),
        ("recipe", c_int),
    ]


class QvaDraftStats(Structure):
    """qva_draft_stats: the kept share of the last draft call's heads."""
    _fields_ = [
        ("heads", c_int64),
        ("pairs", c_int64),
        ("kept_mean", c_double),
        ("kept_min", c_double),
        ("kept_max", c_double),
    ]


class QvaErrorDirection(Structure):
    """qva_error_direction: the error's part along ref - mean(V)."""
    _fields_ = [("sharpen", c_double), ("cos", c_double)]


class QvaErrorTermDirections(Structure):
    """qva_error_term_directions: each term's qva_error_direction."""
    _fields_ = [(name, QvaErrorDirection) for name in ("full", "q", "k", "p", "v", "mu", "none")]


class QvaErrorTerms(Structure):
    """qva_error_terms: rel-L2 against exact attention of the method with
    every operand quantized (full), one (q, k, p, v, mu) or none."""
    _fields_ = [(name, c_double) for name in ERROR_TERM_NAMES]


# qva_draft_head_report's and qva_draft_report's fields, in order (the keys
# of draft_report's dicts).
DRAFT_HEAD_FIELDS = (("batch", c_int64), ("head", c_int64), ("kept16", c_int64),
                     ("kept8", c_int64), ("kept4", c_int64), ("kept_share", c_double),
                     ("prefix_mass", c_double), ("mass16", c_double), ("mass8", c_double),
                     ("mass4", c_double), ("router_mass", c_double),
                     ("oracle_mass", c_double), ("ratio", c_double), ("rel_l2", c_double))
DRAFT_REPORT_FIELDS = (("heads", c_int64), ("regions", c_int64), ("skip", c_double),
                       ("kept_share", c_double), ("prefix_mass", c_double),
                       ("mass16", c_double), ("mass8", c_double), ("mass4", c_double),
                       ("router_mass", c_double), ("oracle_mass", c_double),
                       ("ratio", c_double), ("ratio_min", c_double),
                       ("ratio_min_head", c_int64), ("rel_l2", c_double))


class QvaDraftHeadReport(Structure):
    """qva_draft_head_report: the route quality of one query head."""
    _fields_ = list(DRAFT_HEAD_FIELDS)


class QvaDraftReport(Structure):
    """qva_draft_report: the route quality over every head (means)."""
    _fields_ = list(DRAFT_REPORT_FIELDS)


# Expected x86-64 / aarch64 LP64 layout, derived by hand from the header
# (the test checks it against the compiler as well).
EXPECTED_SIZES = {"qva_tensor": 80, "qva_config": 176, "qva_timings": 12,
                  "qva_vsmooth_params": 24, "qva_draft_params": 72,
                  "qva_error_terms": 56, "qva_error_direction": 16,
                  "qva_error_term_directions": 112, "qva_draft_stats": 40,
                  "qva_draft_head_report": 112, "qva_draft_report": 112,
                  "qva_synthetic_spec": 80}


# ------------------------------------------------------------------ errors
class QvaError(RuntimeError):
    """A qvattn call failed; .status is the qva_status code."""

    def __init__(self, status, message, func=None):
        self.status = int(status)
        self.status_name = status_string(status)
        self.message = message
        self.func = func
        where = f"{func}: " if func else ""
        super().__init__(f"{where}{self.status_name}: {message}" if message
                         else f"{where}{self.status_name}")


class QvaValueError(QvaError, ValueError):
    """Bad argument, shape, dtype, method string or non-finite input."""


class QvaUnsupportedError(QvaError, NotImplementedError):
    """A valid request the chosen backend cannot run (QVA_ERR_UNSUPPORTED)."""


_VALUE_STATUSES = {QVA_ERR_INVALID_ARGUMENT, QVA_ERR_SHAPE, QVA_ERR_DTYPE,
                   QVA_ERR_PARSE, QVA_ERR_NONFINITE}


def error_for(status, func=None, message=None):
    """The exception object for a failed status (message: qva_last_error)."""
    if message is None:
        message = last_error()
    if status in _VALUE_STATUSES:
        return QvaValueError(status, message, func)
    if status == QVA_ERR_UNSUPPORTED:
        return QvaUnsupportedError(status, message, func)
    return QvaError(status, message, func)


def check(status, func=None):
    if status != QVA_OK:
        raise error_for(status, func)


# ------------------------------------------------------------------ loading
_LIB_NAME = "libqvattn.so"


def _candidates():
    env = os.environ.get("QVATTN_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.normpath(os.path.join(here, "..", "..", "build", _LIB_NAME)),
            os.path.join(here, _LIB_NAME)]


def _load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            return ctypes.CDLL(os.path.abspath(path)), os.path.abspath(path)
        tried.append(path)
    raise OSError("libqvattn.so not found (tried: %s); build it with `make` "
                  "or set QVATTN_LIB" % ", ".join(tried))


lib, lib_path = _load()

_P = POINTER
_SIGS = {
    "qva_status_string": (c_char_p, [c_enum]),
    "qva_last_error": (c_char_p, []),
    "qva_tensor_hnd": (QvaTensor, [c_void_p, c_enum, c_enum, c_int64, c_int64,
                                   c_int64, c_int64]),
    "qva_tensor_nhd": (QvaTensor, [c_void_p, c_enum, c_enum, c_int64, c_int64,
                                   c_int64, c_int64]),
    "qva_dtype_size": (c_size_t, [c_enum]),
    "qva_config_default": (None, [_P(QvaConfig)]),
    "qva_config_set_method": (c_enum, [_P(QvaConfig), c_char_p]),
    "qva_config_method_name": (c_enum, [_P(QvaConfig), c_char_p, c_size_t]),
    "qva_context_create": (c_enum, [_P(c_void_p), c_enum]),
    "qva_context_free": (None, [c_void_p]),
    "qva_context_set_stream": (c_enum, [c_void_p, c_void_p]),
    "qva_context_reset": (c_enum, [c_void_p]),
    "qva_supports": (c_int, [c_enum, _P(QvaConfig), c_enum, c_int64, c_char_p,
                             c_size_t]),
    "qva_cuda_available": (c_int, []),
    "qva_draft_step_check": (c_enum, [_P(QvaConfig), c_int64, c_int64, _P(c_int)]),
    "qva_attention_check": (c_enum, [c_enum, _P(QvaConfig), _P(QvaTensor), _P(QvaTensor),
                                     _P(QvaTensor), _P(QvaTensor), _P(QvaTensor)]),
    "qva_device_synchronize": (c_enum, []),
    "qva_attention": (c_enum, [c_void_p, _P(QvaConfig), _P(QvaTensor),
                               _P(QvaTensor), _P(QvaTensor), _P(QvaTensor),
                               _P(QvaTensor)]),
    "qva_schedule_action": (c_enum, [_P(QvaVsmoothParams), c_int, c_int]),
    "qva_build_info": (c_char_p, []),
}
# Entry points newer than the first release: bound only where exported.
_OPTIONAL_SIGS = {
    "qva_context_set_profiling": (c_enum, [c_void_p, c_int]),
    "qva_context_last_timings": (c_enum, [c_void_p, _P(QvaTimings)]),
    "qva_context_last_draft_stats": (c_enum, [c_void_p, _P(QvaDraftStats)]),
    "qva_supports_heads": (c_int, [c_enum, _P(QvaConfig), c_enum, c_int64, c_int64, c_int64,
                                   c_char_p, c_size_t]),
    "qva_error_terms_compute": (c_enum, [_P(QvaConfig), _P(QvaTensor), _P(QvaTensor),
                                         _P(QvaTensor), _P(QvaErrorTerms)]),
    "qva_error_terms_directions_compute": (c_enum, [_P(QvaConfig), _P(QvaTensor), _P(QvaTensor),
                                                    _P(QvaTensor), _P(QvaErrorTerms),
                                                    _P(QvaErrorTermDirections)]),
    "qva_error_direction_compute": (c_enum, [_P(ctypes.c_float), _P(ctypes.c_float), c_int64,
                                             c_int64, _P(QvaTensor), _P(QvaErrorDirection)]),
    "qva_draft_report_compute": (c_enum, [_P(QvaConfig), _P(QvaTensor), _P(QvaTensor),
                                          _P(QvaTensor), _P(QvaDraftReport),
                                          _P(QvaDraftHeadReport), c_int64]),
    "qva_synthetic_preset": (c_enum, [c_char_p, _P(QvaSyntheticSpec)]),
    "qva_synthetic_preset_count": (c_int, []),
    "qva_synthetic_preset_name": (c_char_p, [c_int]),
    "qva_synthetic_generate": (c_enum, [_P(QvaSyntheticSpec), _P(ctypes.c_float),
                                        _P(ctypes.c_float), _P(ctypes.c_float)]),
    "qva_draft_sweep_compute": (c_enum, [_P(QvaConfig), _P(QvaTensor), _P(QvaTensor),
                                         _P(QvaTensor), _P(c_double), c_int64,
                                         _P(QvaDraftReport), _P(QvaDraftHeadReport),
                                         c_int64]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
for _name, (_res, _args) in _OPTIONAL_SIGS.items():
    _f = getattr(lib, _name, None)
    if _f is not None:
        _f.restype = _res
        _f.argtypes = _args


def has_symbol(name):
    """True if the loaded library exports `name` (for optional entry points)."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


# ------------------------------------------------------------------ wrappers
def _s(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _ref(x):
    return byref(x) if x is not None else None


def status_string(status):
    return _s(lib.qva_status_string(c_integer(status, "status", c_enum)))


def last_error():
    return _s(lib.qva_last_error())


def build_info():
    return _s(lib.qva_build_info())


def cuda_available():
    return bool(lib.qva_cuda_available())


def dtype_size(dtype):
    return int(lib.qva_dtype_size(c_integer(dtype, "dtype", c_enum)))


def _tensor_args(data, dtype, device, B, H, N, D):
    return (c_integer(data, "tensor.data", c_void_p), c_integer(dtype, "tensor.dtype", c_enum),
            c_integer(device, "tensor.device", c_enum),
            *(c_integer(x, f"tensor.{n}", c_int64) for x, n in zip((B, H, N, D), "BHND")))


def tensor_hnd(data, dtype, device, B, H, N, D):
    return lib.qva_tensor_hnd(*_tensor_args(data, dtype, device, B, H, N, D))


def tensor_nhd(data, dtype, device, B, H, N, D):
    return lib.qva_tensor_nhd(*_tensor_args(data, dtype, device, B, H, N, D))


def make_tensor(data, dtype, device, shape, stride):
    """A descriptor from an address, shape [B,H,N,D] and element strides
    (each converted by c_integer, as every field of the struct)."""
    t = QvaTensor()
    t.data = data
    t.dtype = dtype
    t.device = device
    t.shape = shape
    t.stride = stride
    return t


def config_default():
    cfg = QvaConfig()
    lib.qva_config_default(byref(cfg))
    return cfg


def config_set_method(cfg, name):
    check(lib.qva_config_set_method(byref(cfg), c_string(name, "method")),
          "qva_config_set_method")
    return cfg


def config_method_name(cfg):
    buf = ctypes.create_string_buffer(128)
    check(lib.qva_config_method_name(byref(cfg), buf, len(buf)),
          "qva_config_method_name")
    return _s(buf.value)


# The method of every qvattn entry point that takes one (attention, sdpa,
# the diffusers and ComfyUI integrations): vc8 (V-Smooth, Q and K rotated
# by a Hadamard matrix) with ExpCast at the centred beta and P coded against
# each 128-key block's own max (+pblock).  On three retrained models with
# SageAttention2 in the same run it was -0.24 dB against vc8 (exp2 P, the
# default of 2026-12-05) and +2.68 dB over SageAttention2, every clip above
# it, at 1.71x cuDNN over the 40-step schedule at Wan2.2-720p against vc8's
# 1.54x (bench/RESULTS.md, "`+pblock` on three models with
# SageAttention2").  +pblock removes the floor that made ExpCast 2.3x
# SageAttention2's error at production lengths (docs/NUMERICS.md §3).  The
# C config's default (qva_config_default) keeps the paper's VC-Attention:
# no rotation, ExpCast at the paper's beta, the row max.
DEFAULT_METHOD = "vc8+expcast-centred+pblock"


def make_config(method=DEFAULT_METHOD, **fields):
    """qva_config_default + qva_config_set_method + top-level field overrides."""
    cfg = config_default()
    config_set_method(cfg, method)
    for k, v in fields.items():
        setattr(cfg, k, v)
    return cfg


def supports(device, cfg, dtype, head_dim):
    """(ok, reason) of qva_supports."""
    why = ctypes.create_string_buffer(256)
    ok = lib.qva_supports(c_integer(device, "device", c_enum), byref(cfg),
                          c_integer(dtype, "dtype", c_enum),
                          c_integer(head_dim, "head_dim", c_int64), why, len(why))
    return bool(ok), _s(why.value)


def supports_heads(device, cfg, dtype, head_dim, heads, kv_heads):
    """(ok, reason) of qva_supports_heads: q with `heads` heads over k, v
    with `kv_heads` (grouped-query attention when fewer).  A library
    without it answers qva_supports where the heads agree, else no."""
    if not has_symbol("qva_supports_heads"):
        if int(heads) == int(kv_heads):
            return supports(device, cfg, dtype, head_dim)
        return False, "this libqvattn predates grouped K/V heads (qva_supports_heads)"
    why = ctypes.create_string_buffer(256)
    ok = lib.qva_supports_heads(c_integer(device, "device"), byref(cfg),
                                c_integer(dtype, "dtype"),
                                c_integer(head_dim, "head_dim", c_int64),
                                c_integer(heads, "heads", c_int64),
                                c_integer(kv_heads, "kv_heads", c_int64), why, len(why))
    return bool(ok), _s(why.value)


def error_terms(cfg, q, k, v):
    """qva_error_terms_compute on CPU descriptors: {name: rel-L2} for the
    names of ERROR_TERM_NAMES (NaN where a term does not apply)."""
    if not has_symbol("qva_error_terms_compute"):
        raise QvaUnsupportedError(QVA_ERR_UNSUPPORTED,
                                  "this libqvattn predates qva_error_terms_compute")
    t = QvaErrorTerms()
    check(lib.qva_error_terms_compute(byref(cfg), byref(q), byref(k), byref(v), byref(t)),
          "qva_error_terms_compute")
    return {name: float(getattr(t, name)) for name in ERROR_TERM_NAMES}


def error_direction(out, ref, heads, rows, v):
    """qva_error_direction_compute: out and ref C-contiguous float32 numpy
    arrays [B, heads, rows, D], v a CPU descriptor; {"sharpen", "cos"}."""
    _need("qva_error_direction_compute")
    fp = _P(ctypes.c_float)
    d = QvaErrorDirection()
    check(lib.qva_error_direction_compute(out.ctypes.data_as(fp), ref.ctypes.data_as(fp),
                                          c_integer(heads, "heads", c_int64),
                                          c_integer(rows, "rows", c_int64), byref(v), byref(d)),
          "qva_error_direction_compute")
    return {"sharpen": float(d.sharpen), "cos": float(d.cos)}


def error_term_directions(cfg, q, k, v):
    """qva_error_terms_directions_compute on CPU descriptors: ({name:
    rel-L2}, {name: {"sharpen", "cos"}}) for the names of ERROR_TERM_NAMES."""
    _need("qva_error_terms_directions_compute")
    t, d = QvaErrorTerms(), QvaErrorTermDirections()
    check(lib.qva_error_terms_directions_compute(byref(cfg), byref(q), byref(k), byref(v),
                                                 byref(t), byref(d)),
          "qva_error_terms_directions_compute")
    return ({name: float(getattr(t, name)) for name in ERROR_TERM_NAMES},
            {name: {"sharpen": float(getattr(d, name).sharpen), "cos": float(getattr(d, name).cos)}
             for name in ERROR_TERM_NAMES})


def _struct_dict(x, fields):
    return {name: (int if ctype is c_int64 else float)(getattr(x, name))
            for name, ctype in fields}


def _need(name):
    if not has_symbol(name):
        raise QvaUnsupportedError(QVA_ERR_UNSUPPORTED, f"this libqvattn predates {name}")


def draft_report(cfg, q, k, v):
    """qva_draft_report_compute on CPU descriptors: {"summary": {...},
    "heads": [{...} per query head, (b, h) order]} with the fields of
    DRAFT_REPORT_FIELDS and DRAFT_HEAD_FIELDS."""
    _need("qva_draft_report_compute")
    nh = int(q.shape[0]) * int(q.shape[1])
    rep, heads = QvaDraftReport(), (QvaDraftHeadReport * max(nh, 1))()
    check(lib.qva_draft_report_compute(byref(cfg), byref(q), byref(k), byref(v), byref(rep),
                                       heads, c_integer(nh, "heads", c_int64)),
          "qva_draft_report_compute")
    return {"summary": _struct_dict(rep, DRAFT_REPORT_FIELDS),
            "heads": [_struct_dict(heads[i], DRAFT_HEAD_FIELDS) for i in range(nh)]}


def draft_sweep(cfg, q, k, v, skip):
    """qva_draft_sweep_compute at the skip fractions `skip`: one
    {"summary", "heads"} dict per point, as draft_report."""
    _need("qva_draft_sweep_compute")
    skip = [float(x) for x in skip]
    nh, n = int(q.shape[0]) * int(q.shape[1]), len(skip)
    reps = (QvaDraftReport * max(n, 1))()
    heads = (QvaDraftHeadReport * max(n * nh, 1))()
    check(lib.qva_draft_sweep_compute(byref(cfg), byref(q), byref(k), byref(v),
                                      (c_double * max(n, 1))(*skip), c_integer(n, "points", c_int64),
                                      reps, heads, c_integer(nh, "heads", c_int64)),
          "qva_draft_sweep_compute")
    return [{"summary": _struct_dict(reps[i], DRAFT_REPORT_FIELDS),
             "heads": [_struct_dict(heads[i * nh + j], DRAFT_HEAD_FIELDS) for j in range(nh)]}
            for i in range(n)]


def synthetic_presets():
    """The names of the synthetic presets, in the library's order."""
    _need("qva_synthetic_preset_count")
    return [_s(lib.qva_synthetic_preset_name(i)) for i in range(lib.qva_synthetic_preset_count())]


def synthetic_spec(name, seed=None):
    """qva_synthetic_preset(name), with `seed` replacing the preset's."""
    _need("qva_synthetic_preset")
    spec = QvaSyntheticSpec()
    check(lib.qva_synthetic_preset(c_string(name, "name"), byref(spec)), "qva_synthetic_preset")
    if seed is not None:
        spec.seed = c_integer(seed, "seed", ctypes.c_uint64)
    return spec


def synthetic_generate(spec, q, k, v):
    """qva_synthetic_generate into three float32 buffers (ctypes pointers)."""
    check(lib.qva_synthetic_generate(byref(spec), q, k, v), "qva_synthetic_generate")


def draft_step_check(cfg, n_tokens, head_dim, func="qva_draft_step_check"):
    """qva_draft_step_check: raises what qva_attention would for this draft
    config at n_tokens x head_dim; returns True on a dense warm-up step."""
    warm = c_int(0)
    check(lib.qva_draft_step_check(byref(cfg), c_integer(n_tokens, "n_tokens", c_int64),
                                   c_integer(head_dim, "head_dim", c_int64), byref(warm)),
          func)
    return bool(warm.value)


def attention_check_status(device, cfg, q, k, v, out=None, lse=None):
    """qva_attention_check without raising: the status qva_attention gives
    this call before computing (config, descriptors, self-attention, lse,
    NaN/Inf of CPU inputs with cfg.check_finite); out, lse may be None."""
    return lib.qva_attention_check(c_integer(device, "device", c_enum), byref(cfg),
                                   byref(q), byref(k), byref(v), _ref(out), _ref(lse))


def attention_check(device, cfg, q, k, v, out=None, lse=None, func="qva_attention_check"):
    """qva_attention_check: raises what qva_attention would raise for this
    call before computing (see attention_check_status)."""
    check(attention_check_status(device, cfg, q, k, v, out, lse), func)


def schedule_action(cfg, step, num_steps):
    """'group' | 'reuse' | 'plain' for the V-Smooth schedule of cfg."""
    a = lib.qva_schedule_action(byref(cfg.vsmooth), c_integer(step, "step"),
                                c_integer(num_steps, "num_steps"))
    return STEP_ACTION_NAMES.get(a, str(a))


def device_synchronize():
    check(lib.qva_device_synchronize(), "qva_device_synchronize")


_context_ids = itertools.count(1)
# id -> Context, so the torch custom op (which takes only tensors, numbers
# and strings) can name a context: see ops.py.  Weak: the registry never
# keeps a context alive.
contexts_by_id = weakref.WeakValueDictionary()


class Context:
    """Owns a qva_context_t (per-layer V-Smooth / draft state).

    .id is a small positive integer naming the context in the
    qvattn::attention torch op (contexts_by_id maps it back).
    """

    def __init__(self, device=QVA_DEVICE_CPU):
        self._h = c_void_p()
        device = c_integer(device, "device", c_enum)
        check(lib.qva_context_create(byref(self._h), device), "qva_context_create")
        self.device = device
        self._stream = None
        self.id = next(_context_ids)
        contexts_by_id[self.id] = self

    @property
    def handle(self):
        if not self._h:
            raise ValueError("qvattn context is closed")
        return self._h

    def set_stream(self, stream):
        """stream: a cudaStream_t as an int (0/None = default stream)."""
        stream = c_integer(stream or 0, "stream", c_void_p)
        if stream != self._stream:
            check(lib.qva_context_set_stream(self.handle, c_void_p(stream)),
                  "qva_context_set_stream")
            self._stream = stream

    def reset(self):
        check(lib.qva_context_reset(self.handle), "qva_context_reset")

    @staticmethod
    def has_profiling():
        return has_symbol("qva_context_set_profiling") and \
            has_symbol("qva_context_last_timings")

    def set_profiling(self, on=True):
        """Phase timings per call (CUDA: events + a stream sync per call).
        Raises QvaUnsupportedError if the library predates profiling."""
        if not self.has_profiling():
            raise QvaUnsupportedError(QVA_ERR_UNSUPPORTED,
                                      "library has no qva_context_set_profiling")
        check(lib.qva_context_set_profiling(self.handle, 1 if on else 0),
              "qva_context_set_profiling")

    def last_timings(self):
        """{'grouping_ms', 'prep_ms', 'kernel_ms'} of the last call."""
        if not self.has_profiling():
            raise QvaUnsupportedError(QVA_ERR_UNSUPPORTED,
                                      "library has no qva_context_last_timings")
        t = QvaTimings()
        check(lib.qva_context_last_timings(self.handle, byref(t)),
              "qva_context_last_timings")
        return {"grouping_ms": t.grouping_ms, "prep_ms": t.prep_ms,
                "kernel_ms": t.kernel_ms}

    def last_draft_stats(self):
        """{'heads', 'pairs', 'kept_mean', 'kept_min', 'kept_max'}: the share of
        region pairs each head kept in the last call (heads 0 when it routed
        none: not draft, or a warm-up step).  After a CUDA call with the
        adaptive budget this waits for that call's router."""
        if not has_symbol("qva_context_last_draft_stats"):
            raise QvaUnsupportedError(QVA_ERR_UNSUPPORTED,
                                      "library has no qva_context_last_draft_stats")
        t = QvaDraftStats()
        check(lib.qva_context_last_draft_stats(self.handle, byref(t)),
              "qva_context_last_draft_stats")
        return {name: getattr(t, name) for name, _ in QvaDraftStats._fields_}

    def close(self):
        if self._h:
            lib.qva_context_free(self._h)
            self._h = c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


_default_contexts = {}  # (device kind, cuda index) -> Context, for ctx=None calls
_default_lock = threading.Lock()


def default_context(device=QVA_DEVICE_CPU, index=0):
    """The shared context used when attention() gets ctx=None: one per
    device, created once even when threads ask for it at the same time (two
    would split a layer's state between them).  Threads may share it: the
    library serializes the calls on one context (qvattn.h, "Threads")."""
    key = (device, index if device == QVA_DEVICE_CUDA else 0)
    c = _default_contexts.get(key)
    if c is None:
        with _default_lock:
            c = _default_contexts.get(key)
            if c is None:
                c = _default_contexts[key] = Context(device)
    return c


def attention_status(ctx, cfg, q, k, v, out, lse=None):
    """qva_attention without raising: returns the status code (hot loops)."""
    return lib.qva_attention(ctx.handle, byref(cfg), byref(q), byref(k), byref(v),
                             byref(out), _ref(lse))


def attention_raw(ctx, cfg, q, k, v, out, lse=None):
    """qva_attention on prepared descriptors (QvaTensor); raises on failure."""
    check(attention_status(ctx, cfg, q, k, v, out, lse), "qva_attention")
