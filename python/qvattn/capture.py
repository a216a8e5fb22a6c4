"""Capture post-RoPE Q/K/V from a running diffusers pipeline.

    with qvattn.capture(pipe, layers=[0, 20, 39], steps=[0, 10, 30], path="qkv"):
        pipe(prompt, num_inference_steps=40)
    # qkv/layer000-step000-pass0.safetensors ... then, offline:
    #   qvattn eval --input qkv/layer000-step000-pass0.safetensors

Each file holds tensors ``q``, ``k``, ``v`` of shape [B, H, N, D] in the
model's dtype (F32/BF16/F16), exactly what ``qvattn eval --input`` reads
(docs/CLI.md), plus ``__metadata__`` strings: layer, module, step,
num_steps, pass (0 = the first forward of the step, 1 = the second under
classifier-free guidance, ...), grid "T,H,W", prefix (tokens outside the
grid), prefix_at_end, model.  The CLI ignores the metadata; pass
``--grid``/``--prefix`` from it when evaluating draft.

With a key-padding mask (HunyuanVideo's padded text tokens) the padded
tokens are dropped, one file per batch element (suffix ``-b<i>``), because
the model attends over the valid tokens only and the file format has no
mask.

Layers are qvattn layer ids (``qvattn.diffusers.layer_ids(pipe)``: the
self-attention modules first, 0..), steps are denoising step indices.  If
qvattn processors are already installed (``qvattn.diffusers.apply``) the
capture rides on them (the attention keeps running the installed method);
otherwise capture installs processors that compute attention with torch
SDPA, so the run itself is unchanged, and removes them when done.

Files are large: one Wan2.2 720p layer-step is 3 x 774 MB in bf16.
``heads=[0, 1]`` keeps only some heads.
"""
import json
import os
import struct

import torch

__all__ = ["capture", "save_safetensors", "load_safetensors", "CaptureHandle"]

_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_ST_TORCH = {v: k for k, v in _ST_DTYPES.items()}


def _tensor_bytes(t):
    t = t.detach().to("cpu").contiguous()
    try:
        return t.view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError):  # numpy unavailable
        return bytes(t.view(torch.uint8).flatten().tolist())


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} as a safetensors file (F32/BF16/F16 only).

    Own minimal writer (8-byte little-endian header length, JSON header
    with dtype/shape/data_offsets, 8-byte aligned, then the raw data), so
    capture needs no safetensors package."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"save_safetensors: {name} has dtype {t.dtype}")
        b = _tensor_bytes(t)
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    """(tensors, metadata) of a file written by save_safetensors (tests)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        buf = bytearray(data[a:b])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(_ST_TORCH[h["dtype"]]).reshape(h["shape"])
    return out, meta


class CaptureHandle:
    """Returned by capture(); a context manager.  .files lists what was
    written; remove() stops capturing (and removes processors capture
    installed)."""

    def __init__(self, pipe, spec, handle, installed):
        self.pipe = pipe
        self.spec = spec
        self.handle = handle
        self.installed = installed

    @property
    def files(self):
        return list(self.spec.files)

    def remove(self):
        if self.handle is None:
            return
        if self.handle.capture is self.spec:
            self.handle.capture = None
        if self.installed:
            self.handle.remove()
        self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _writer(spec, handle):
    from . import ops

    def write(proc, q, k, v, mask, prefix_at_end):
        st = handle.state
        grid = st.grid
        # q, k, v: [B, N, H, D] -> [B, H, N, D]
        q, k, v = (x.detach().transpose(1, 2) for x in (q, k, v))
        if spec.heads is not None:
            hi = torch.tensor(list(spec.heads), device=q.device)
            q, k, v = (x.index_select(1, hi) for x in (q, k, v))
        parts = [(None, q, k, v)]
        if mask is not None and mask.dtype == torch.bool and mask.shape[-1] == k.shape[2]:
            host = ops._mask_patterns(mask, None)
            if host.shape[0] == 1:
                host = host.expand(q.shape[0], host.shape[1])
            if not bool(host.all()):
                parts = []
                for b in range(q.shape[0]):
                    idx = torch.nonzero(host[b]).flatten().to(q.device)
                    sel = [x[b:b + 1].index_select(2, idx) for x in (k, v)]
                    qs = q[b:b + 1].index_select(2, idx) if q.shape[2] == k.shape[2] \
                        else q[b:b + 1]
                    parts.append((b, qs, sel[0], sel[1]))
        for b, qq, kk, vv in parts:
            n = kk.shape[2]
            prefix = n - grid[0] * grid[1] * grid[2] if grid else 0
            meta = {"layer": proc.layer_id, "module": proc.name, "step": st.step,
                    "num_steps": st.num_steps, "pass": st.pass_index,
                    "grid": ",".join(str(g) for g in grid) if grid else "",
                    "prefix": max(prefix, 0), "prefix_at_end": int(bool(prefix_at_end)),
                    "model": type(proc).__name__}
            name = f"layer{proc.layer_id:03d}-step{st.step:03d}-pass{st.pass_index}"
            if b is not None:
                name += f"-b{b}"
                meta["batch"] = b
            path = os.path.join(spec.path, name + ".safetensors")
            save_safetensors(path, {"q": qq, "k": kk, "v": vv}, meta)
            spec.files.append(path)

    return write


def capture(pipe, layers=None, steps=None, path="qvattn-capture", heads=None,
            num_steps=None):
    """Save post-RoPE q/k/v of the chosen layers and steps (see module doc).

    layers, steps  collections of ints, or None for all (beware the size).
    path           output directory (created).
    heads          None (all) or head indices to keep.
    num_steps      passed to apply() when capture installs the processors.
    Returns a CaptureHandle (use it as a context manager).
    """
    from . import diffusers as qd
    for name, val in (("layers", layers), ("steps", steps), ("heads", heads)):
        if val is not None:
            if isinstance(val, (int, str)):
                raise TypeError(f"qvattn.capture: {name} must be a collection of ints "
                                f"or None, got {val!r}")
            if any(int(x) < 0 for x in val):
                raise ValueError(f"qvattn.capture: {name} must be >= 0")
    os.makedirs(path, exist_ok=True)
    handle = qd.state(pipe)
    installed = False
    if handle is None:
        handle = qd.apply(pipe, method="sdpa", num_steps=num_steps)
        installed = True
    elif handle.capture is not None:
        raise ValueError("qvattn.capture: a capture is already active on this pipeline")
    spec = qd._CaptureSpec(layers, steps, path, heads, None)
    spec.writer = _writer(spec, handle)
    handle.capture = spec
    return CaptureHandle(pipe, spec, handle, installed)


class _CallableModule(type(os)):
    """Importing qvattn.capture (the module) replaces the package attribute
    qvattn.capture (the function); calling the module keeps
    qvattn.capture(pipe, ...) working either way."""

    def __call__(self, *args, **kwargs):
        return capture(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
