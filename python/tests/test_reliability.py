"""Issue 13, the Python items: values reach C converted, never truncated.

Defect 3: an integer outside its C type's range was cut to the low bits by
ctypes (layer=2**40+3 ran as layer 3, sharing its V-Smooth state; grid
(2**32+1, 8, 16) ran as (1, 8, 16)).  Defect 6: method="sage8\\0junk" ran
sage8 (C stops at the NUL), method=None raised AttributeError,
supports(device="tpu") KeyError.  Item 2's rule: Python only converts
types and rejects integers outside the C type's range (_ffi.c_integer,
c_string, device_enum, dtype_enum); whether a value in range is valid is
the library's to say, and its message is the one raised.

numpy inputs (CI has no torch); the torch op's path where torch exists.
"""
import ctypes

import numpy as np
import pytest

try:
    import qvattn
    from qvattn import _ffi
except OSError as e:  # library not built
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)

INT_MAX = 2**31 - 1
DRAFT = "draft@85/0/0/15"


def qkv(H=1, N=128, D=64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, H, N, D)).astype(np.float32) for _ in range(3))


def _torch():
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"torch not importable: {e}")
    return torch


# ------------------------------------------------------------------ defect 3
def test_layer_outside_c_int_is_rejected_not_truncated():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"layer = 1099511627779 is outside the range "
                                         r"of a C int"):
        qvattn.attention(q, k, v, method="vc8", layer=2**40 + 3)
    with pytest.raises(ValueError, match=r"-2147483649"):
        qvattn.attention(q, k, v, method="vc8", layer=-2**31 - 1)
    qvattn.attention(q, k, v, method="vc8", layer=INT_MAX)  # the largest fits


def test_grid_outside_c_int_is_rejected_not_truncated():
    q, k, v = qkv()  # N = 128 = 1 x 8 x 16: the truncated grid would run
    with pytest.raises(ValueError, match=r"draft\.grid_t = 4294967297 is outside the "
                                         r"range of a C int"):
        qvattn.attention(q, k, v, method=DRAFT, grid=(2**32 + 1, 8, 16))
    with pytest.raises(ValueError, match=r"draft\.prefix_tokens = 4294967296"):
        qvattn.attention(q, k, v, method=DRAFT, grid=(1, 8, 16), prefix=2**32)
    qvattn.attention(q, k, v, method=DRAFT, grid=(1, 8, 16))


def test_torch_layer_outside_c_int_is_rejected():
    torch = _torch()
    q, k, v = (torch.from_numpy(x) for x in qkv())
    with pytest.raises(ValueError, match=r"layer = 1099511627779 is outside"):
        qvattn.attention(q, k, v, method="vc8", layer=2**40 + 3)
    with pytest.raises(ValueError, match=r"step = 4294967296 is outside"):
        qvattn.attention(q, k, v, method="sage8", step=2**32, num_steps=2**32 + 1)


def _int_fields():
    """(struct class, field, ctype) of every integer field the binding writes."""
    for cls in (_ffi.QvaConfig, _ffi.QvaVsmoothParams, _ffi.QvaDraftParams, _ffi.QvaTensor):
        for name, ctype in cls._fields_:
            if ctype in (ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p):
                yield cls, name, ctype


@pytest.mark.parametrize("cls,name,ctype", list(_int_fields()),
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_every_integer_field_takes_its_range_and_nothing_else(cls, name, ctype):
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype not in (ctypes.c_uint64, ctypes.c_void_p)
    lo, hi = (-(1 << bits - 1), (1 << bits - 1) - 1) if signed else (0, (1 << bits) - 1)
    s = cls()
    for ok in (lo, hi, np.int64(7)):
        setattr(s, name, ok)
        assert getattr(s, name) in (ok, None if ok == 0 else ok)  # c_void_p 0 reads None
    for bad in (lo - 1, hi + 1, hi + 2**bits):
        with pytest.raises(ValueError, match=rf"{name.rstrip('_')} = {bad} is outside"):
            setattr(s, name, bad)
    with pytest.raises(TypeError, match=rf"{name} must be an integer"):
        setattr(s, name, 1.5)


def test_tensor_shape_and_stride_are_not_truncated():
    with pytest.raises(ValueError, match=r"tensor\.shape\[2\] = 18446744073709551744"):
        _ffi.make_tensor(None, _ffi.QVA_F32, _ffi.QVA_DEVICE_CPU, [1, 1, 2**64 + 128, 64],
                         [1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"tensor\.stride\[0\] = -9223372036854775809"):
        _ffi.make_tensor(None, _ffi.QVA_F32, _ffi.QVA_DEVICE_CPU, [1, 1, 1, 64],
                         [-2**63 - 1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"tensor\.shape needs 4 values, got 3"):
        _ffi.make_tensor(None, _ffi.QVA_F32, _ffi.QVA_DEVICE_CPU, [1, 1, 64], [1, 1, 1])
    with pytest.raises(ValueError, match=r"tensor\.N = 18446744073709551621"):
        _ffi.tensor_hnd(None, _ffi.QVA_F32, _ffi.QVA_DEVICE_CPU, 1, 1, 2**64 + 5, 64)
    t = _ffi.make_tensor(None, _ffi.QVA_F32, _ffi.QVA_DEVICE_CPU, [1, 2, 3, 4], [24, 12, 4, 1])
    assert list(t.shape) == [1, 2, 3, 4] and list(t.stride) == [24, 12, 4, 1]


def test_call_arguments_are_not_truncated():
    cfg = _ffi.make_config("vc8+expcast")
    with pytest.raises(ValueError, match=r"step = 4294967297"):  # was step 1: "reuse"
        _ffi.schedule_action(cfg, 2**32 + 1, 40)
    with pytest.raises(ValueError, match=r"head_dim = 18446744073709551680"):  # was 64
        _ffi.supports(_ffi.QVA_DEVICE_CPU, cfg, _ffi.QVA_F32, 2**64 + 64)
    with pytest.raises(ValueError, match=r"head_dim = 18446744073709551680"):
        qvattn.supports("sage8", "cpu", "float32", 2**64 + 64)
    with pytest.raises(ValueError, match=r"device = 4294967296"):  # was the CPU
        _ffi.Context(2**32)
    with pytest.raises(ValueError, match=r"n_tokens = 9223372036854775808"):
        _ffi.draft_step_check(_ffi.make_config(DRAFT), 2**63, 64)


# ------------------------------------------------------------------ item 2's rule
def test_values_in_range_reach_c_which_decides():
    """A value that fits goes to C unchanged; C's verdict and message are
    raised (a QvaError with its status), not a Python copy of its checks."""
    q, k, v = qkv()
    with pytest.raises(_ffi.QvaValueError, match=r"vsmooth\.clusters = 2147483647 must "
                                                  r"be in \[1, ") as e:
        qvattn.attention(q, k, v, method="vc8", options={"vsmooth.clusters": INT_MAX})
    assert e.value.status == _ffi.QVA_ERR_INVALID_ARGUMENT
    # one past the range is the conversion's ValueError, naming the value
    # (it was C's "clusters = -2147483648", of a value nobody passed)
    with pytest.raises(ValueError, match=r"vsmooth\.clusters = 2147483648 is outside") as e:
        qvattn.attention(q, k, v, method="vc8", options={"vsmooth.clusters": INT_MAX + 1})
    cfg = _ffi.config_default()
    cfg.step, cfg.num_steps, cfg.hadamard_seed = INT_MAX, 0, 2**64 - 1
    assert (cfg.step, cfg.hadamard_seed) == (INT_MAX, 2**64 - 1)
    cfg.layer = -2**31  # a layer key C accepts: no Python opinion on it
    assert cfg.layer == -2**31


# ------------------------------------------------------------------ defect 6 (Python)
@pytest.mark.parametrize("method", ["sage8\0junk", "sage8\0", "\0"])
def test_method_with_nul_is_rejected(method):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"method .* contains a NUL character"):
        qvattn.attention(q, k, v, method=method)
    with pytest.raises(ValueError, match=r"NUL"):
        qvattn.supports(method, "cpu", "float32", 64)
    with pytest.raises(ValueError, match=r"NUL"):
        _ffi.make_config(method)


def test_torch_method_with_nul_is_rejected():
    torch = _torch()
    q, k, v = (torch.from_numpy(x) for x in qkv())
    with pytest.raises(ValueError, match=r"NUL"):
        qvattn.attention(q, k, v, method="sage8\0junk")


@pytest.mark.parametrize("method", [None, b"sage8", 8])
def test_method_that_is_not_a_str_is_a_type_error(method):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"method must be a str"):
        qvattn.attention(q, k, v, method=method)
    with pytest.raises(TypeError, match=r"method must be a str"):
        qvattn.supports(method, "cpu")


def test_method_that_utf8_cannot_encode_is_a_value_error():
    with pytest.raises(ValueError, match=r"cannot be encoded as UTF-8"):
        _ffi.make_config("sage8\udc80")


@pytest.mark.parametrize("device", ["tpu", "", None, "cuda:x", "cpu:0:1"])
def test_supports_unknown_device_is_a_value_error(device):
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or 'cuda:N'"):
        qvattn.supports("sage8", device=device)


@pytest.mark.parametrize("dtype", ["int8", "float64", None])
def test_supports_unknown_dtype_is_a_value_error(dtype):
    with pytest.raises(ValueError, match=r"dtype must be one of \['float32', 'bfloat16', "
                                         r"'float16'\]"):
        qvattn.supports("sage8", device="cpu", dtype=dtype)


def test_supports_known_names():
    assert qvattn.supports("sage8", device="cpu", dtype="float32", head_dim=64)[0]
    ok, why = qvattn.supports("sage8", device="cpu", dtype="bfloat16", head_dim=160)
    assert not ok and why  # the library's answer (head dim 160), not Python's
    assert _ffi.device_enum("cuda:1") == _ffi.QVA_DEVICE_CUDA
    assert _ffi.dtype_enum(np.dtype(np.float16)) == _ffi.QVA_F16
