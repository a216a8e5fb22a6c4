"""Peer attention kernels for same-run comparisons, where they are installed.

Nothing of a peer is in this repository: a peer is used only if its package
imports (built from its public source on the GPU machine, in an ignored
folder; bench/README.md says how).  Each loader returns (call, None) with
call(q, k, v) -> out on bf16 [B, H, N, D] CUDA tensors, or (None, why).

  sage2   SageAttention2's Hopper kernel, as `sageattn` picks it on sm90:
          INT8 QK with per-thread query scales and K smoothing, FP8 PV
          with the two-level FP32 accumulation (pv_accum_dtype fp32+fp32).
"""

PEERS = ("sage2",)


def _sage2():
    try:
        import sageattention
        fn = sageattention.sageattn_qk_int8_pv_fp8_cuda_sm90
    except Exception as e:  # not installed, or built without the sm90 kernel
        return None, f"sageattention not importable ({type(e).__name__}: {e})"

    def call(q, k, v):
        return fn(q, k, v, tensor_layout="HND", is_causal=False,
                  qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32", smooth_k=True)
    return call, None


_LOADERS = {"sage2": _sage2}


def load(name):
    """(call, None) or (None, why) for peer `name`."""
    if name not in _LOADERS:
        return None, f"unknown peer {name!r} (known: {', '.join(PEERS)})"
    return _LOADERS[name]()


def origin(name):
    """Where the peer was imported from (its package folder), or None: an
    in-place build from source has no installed version to report."""
    if name == "sage2":
        try:
            import sageattention
            return sageattention.__file__
        except Exception:
            return None
    return None
