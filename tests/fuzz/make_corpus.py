#!/usr/bin/env python3
"""Writes the seed corpus of the file-reader fuzzer (tests/fuzz/corpus/).

    python3 tests/fuzz/make_corpus.py [OUTDIR]

Standard library only (struct, json), so it runs where numpy is absent.
The output is deterministic: rerunning it must leave `git status` clean.

How the fuzz target reads an input (tests/fuzz/fuzz_readers.c):
  * bytes starting with the .npy magic are one to three .npy files laid end
    to end: 1 -> the same file is q, k and v; 2 -> q, then k = v; 3 -> q, k, v.
  * anything else is one safetensors file that must hold q, k and v.
Names say the format (st-, npy-, npy2-, npy3-) and whether the readers must
accept the file ("ok") or reject it ("bad").  Every file is under 4 KB.
"""
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
NPY_MAGIC = b"\x93NUMPY"


def values(n, salt):
    """Values exact in f32, bf16 and f16: multiples of 1/8 in [-4, 4)."""
    return [(((i * 7 + salt * 13) % 64) - 32) / 8.0 for i in range(n)]


def encode(vals, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    if dtype == "BF16":  # the top half of the f32 bits (exact for these values)
        return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in vals)
    if dtype == "F64":
        return struct.pack("<%dd" % len(vals), *vals)
    if dtype == "I64":
        return struct.pack("<%dq" % len(vals), *[int(v * 8) for v in vals])
    if dtype == "I8":
        return struct.pack("<%db" % len(vals), *[int(v * 8) for v in vals])
    raise ValueError(dtype)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ------------------------------------------------------------ safetensors
def st_file(tensors, meta=None, data_order=None, header=None, hlen=None, data=None, pad=True):
    """tensors: [(name, dtype, shape)]; data laid out in data_order (names).

    header/hlen/data override the computed parts to make broken files."""
    order = data_order or [t[0] for t in tensors]
    by_name = {t[0]: t for t in tensors}
    blobs, offs, off = [], {}, 0
    for salt, name in enumerate(order):
        _, dt, shape = by_name[name]
        b = encode(values(numel(shape), salt + 1), dt)
        offs[name] = [off, off + len(b)]
        off += len(b)
        blobs.append(b)
    if header is None:
        h = {}
        if meta is not None:
            h["__metadata__"] = meta
        for name, dt, shape in tensors:
            h[name] = {"dtype": dt, "shape": list(shape), "data_offsets": offs[name]}
        header = json.dumps(h, separators=(",", ":"))
    hb = header.encode("latin-1") if isinstance(header, str) else header
    if pad:
        hb += b" " * ((-(8 + len(hb))) % 8)
    body = b"".join(blobs) if data is None else data
    return struct.pack("<Q", len(hb) if hlen is None else hlen) + hb + body


def qkv(dt, shape, shape_q=None, dts=None):
    dts = dts or [dt] * 3
    return [("q", dts[0], shape_q or shape), ("k", dts[1], shape), ("v", dts[2], shape)]


def st_raw(header, data_len=768, hlen=None):
    """A hand-written header followed by data_len bytes of f32 values."""
    return st_file([], header=header, data=encode(values(data_len // 4, 1), "F32"), hlen=hlen, pad=False)


def st_qkv(q=None, k=None, v=None, data_len=768):
    """q, k, v entries as JSON text (dtype, shape, offsets); the defaults are
    F32 [1,1,64] at 0, 256, 512, and a given entry replaces its default."""
    ent = {"q": q, "k": k, "v": v}
    parts = []
    for i, name in enumerate("qkv"):
        e = ent[name] or ('"F32"', "[1,1,64]", "[%d,%d]" % (256 * i, 256 * i + 256))
        parts.append('"%s":{"dtype":%s,"shape":%s,"data_offsets":%s}' % ((name,) + tuple(e)))
    return st_raw("{" + ",".join(parts) + "}", data_len)


# ------------------------------------------------------------ npy
def npy_file(descr, shape, fortran=False, version=1, dict_text=None, data=None, salt=1, hlen=None):
    if dict_text is None:
        shp = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        dict_text = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shp)
    d = dict_text.encode("latin-1") if isinstance(dict_text, str) else dict_text
    lbytes = 2 if version == 1 else 4
    pre = 6 + 2 + lbytes
    d += b" " * ((-(pre + len(d) + 1)) % 64) + b"\n"
    if data is None:
        dt = {"<f4": "F32", "<f2": "F16", ">f4": "F32", "<f8": "F64", "|V2": "F16"}.get(descr, "F32")
        data = encode(values(numel(shape), salt), dt)
    n = len(d) if hlen is None else hlen
    return NPY_MAGIC + bytes([version, 0]) + n.to_bytes(lbytes, "little") + d + data


def npy_dict(body):
    return "{" + body + "}"


# ------------------------------------------------------------ seeds
def seeds():
    s = {}
    R3, R4 = [1, 1, 64], [1, 1, 2, 64]
    # -- safetensors the readers must accept
    s["st-ok-f32-r3.safetensors"] = st_file(qkv("F32", R3))
    s["st-ok-bf16-r4.safetensors"] = st_file(qkv("BF16", R4))
    s["st-ok-f16-d128.safetensors"] = st_file(qkv("F16", [1, 1, 128]))
    s["st-ok-mixed-nq.safetensors"] = st_file(qkv(None, [1, 3, 64], [1, 1, 64], ["F16", "BF16", "F32"]))
    s["st-ok-b2h2-bf16.safetensors"] = st_file(qkv("BF16", [2, 2, 1, 64]))
    s["st-ok-extra-1d-2d.safetensors"] = st_file(
        [("bias", "F32", [4]), ("w", "F32", [2, 2]), ("idx", "I64", [2])] + qkv("F32", R3),
        meta={"format": "pt", "note": "x"}, data_order=["v", "idx", "k", "w", "q", "bias"])
    s["st-ok-liberal.safetensors"] = st_raw(
        ' \n{ "extra" : {"dtype":"I8","shape":[],"data_offsets":[768,768]},'
        '\t"v": {"data_offsets": [512, 768], "shape": [1, 1, 64], "dtype": "F32"},'
        '"__metadata__" : {"format": "pt", "nested\\"": "\\u00e9"},'
        '"\\u0071" : {"shape":[1,1,64],"dtype":"F\\u00332","data_offsets":[0,256],'
        '"note":[1,{"x":null},true,-1.5e3]},'
        '"k":{"dtype":"F32","shape":[1,1,64],"data_offsets":[256,512]}}   ')
    s["st-ok-shared-bytes.safetensors"] = st_raw(  # q, k, v all read one range
        '{"q":{"dtype":"BF16","shape":[1,2,64],"data_offsets":[0,256]},'
        '"k":{"dtype":"F32","shape":[1,1,64],"data_offsets":[0,256]},'
        '"v":{"dtype":"F32","shape":[1,1,64],"data_offsets":[0,256]}}', 256)
    # -- safetensors the readers must reject
    s["st-bad-rank1.safetensors"] = st_file(qkv("F32", R3)[1:] + [("q", "F32", [64])])
    s["st-bad-rank2.safetensors"] = st_file(qkv("F32", R3)[:2] + [("v", "F32", [1, 64])])
    s["st-bad-rank5.safetensors"] = st_file(qkv("BF16", [1, 1, 1, 1, 64]))
    s["st-bad-d96.safetensors"] = st_file(qkv("F16", [1, 1, 96]))
    s["st-bad-n0.safetensors"] = st_file(qkv("F32", [1, 0, 64]))
    s["st-bad-missing-v.safetensors"] = st_file(qkv("F32", R3)[:2])
    s["st-bad-dup-q.safetensors"] = st_raw(
        '{"q":{"dtype":"F32","shape":[1,1,64],"data_offsets":[0,256]},'
        '"q":{"dtype":"F32","shape":[1,1,64],"data_offsets":[256,512]}}')
    s["st-bad-dtype-i8.safetensors"] = st_file(qkv(None, R3, dts=["F32", "I8", "F32"]))
    s["st-bad-dtype-f64.safetensors"] = st_file(qkv(None, R3, dts=["F32", "F32", "F64"]))
    s["st-bad-dtype-unknown.safetensors"] = st_qkv(k=('"F33"', "[1,1,64]", "[256,512]"))
    s["st-bad-off-mismatch.safetensors"] = st_qkv(q=('"F32"', "[1,1,64]", "[0,255]"))
    s["st-bad-off-past-end.safetensors"] = st_file(qkv("F32", R3))[:-100]
    s["st-bad-off-reversed.safetensors"] = st_qkv(q=('"F32"', "[1,1,64]", "[256,0]"))
    s["st-bad-off-float.safetensors"] = st_raw(
        '{"q":{"dtype":"F32","shape":[1,1,64],"data_offsets":[0.0,256]}}')
    s["st-bad-off-three.safetensors"] = st_raw(
        '{"q":{"dtype":"F32","shape":[1,1,64],"data_offsets":[0,256,512]}}')
    nan = bytearray(st_file(qkv("F32", R3)))
    nan[-300:-296] = struct.pack("<I", 0x7FC00000)
    s["st-bad-nan-f32.safetensors"] = bytes(nan)
    inf = bytearray(st_file(qkv("F16", R3)))
    inf[-2:] = struct.pack("<H", 0xFC00)
    s["st-bad-inf-f16.safetensors"] = bytes(inf)
    good = st_file(qkv("F32", R3))
    s["st-bad-hlen-huge.safetensors"] = b"\xff" * 8 + good[8:]
    s["st-bad-hlen-1.safetensors"] = struct.pack("<Q", 1) + good[8:]
    s["st-bad-hlen-past-end.safetensors"] = struct.pack("<Q", len(good) - 7) + good[8:]
    s["st-bad-hlen-2e8.safetensors"] = struct.pack("<Q", 100000001) + good[8:]
    s["st-bad-json-cut.safetensors"] = st_raw('{"q":{"dtype":"F3')
    s["st-bad-json-deep.safetensors"] = st_raw('{"__metadata__":{"a":' + "[" * 70 + "]" * 70 + "}}")
    s["st-bad-json-trailing.safetensors"] = st_raw('{}x')
    s["st-bad-json-empty-object.safetensors"] = st_raw("{}", 0)
    s["st-bad-json-escape.safetensors"] = st_raw('{"q\\x":1}')
    s["st-bad-json-ctrl.safetensors"] = st_raw('{"q\x01":1}')
    s["st-bad-json-entry-empty.safetensors"] = st_raw('{"q":{},"k\\r\\b\\f\\/":{}}')
    s["st-bad-json-meta-array.safetensors"] = st_raw('{"__metadata__":[1,2]}')
    s["st-bad-json-negative.safetensors"] = st_raw(
        '{"q":{"dtype":"F32","shape":[1,-1,64],"data_offsets":[0,256]}}')
    s["st-bad-dim-2p53.safetensors"] = st_qkv(v=('"F32"', "[9007199254740992,1,64]", "[512,768]"))
    s["st-bad-many-elems.safetensors"] = st_qkv(k=('"BF16"', "[2147483647,2147483647,64]", "[256,512]"))
    s["st-bad-int-2p53p1.safetensors"] = st_qkv(q=('"F32"', "[1,1,64]", "[9007199254740993,0]"))
    s["st-bad-kv-shape.safetensors"] = st_file([("q", "F32", [1, 2, 64]), ("k", "F32", [1, 2, 64]),
                                                ("v", "F32", [1, 3, 64])])
    s["st-bad-q-heads.safetensors"] = st_file([("q", "BF16", [2, 1, 64]), ("k", "BF16", R3),
                                               ("v", "BF16", R3)])
    # an escaped control character in a name the message echoes (regression:
    # the message went to the terminal with the ESC and newline intact)
    s["st-bad-dtype-ctrl.safetensors"] = st_qkv(q=('"\\u001b[2J\\nqvattn: ok"', "[1,1,64]", "[0,256]"))
    s["empty.bin"] = b""
    s["short-7.bin"] = b"\x08\x00\x00\x00\x00\x00\x00"

    # -- one .npy used as q, k and v
    s["npy-ok-f32-r3.npy"] = npy_file("<f4", R3)
    s["npy-ok-f16-r4.npy"] = npy_file("<f2", [1, 1, 1, 64])
    s["npy-ok-f16-d128.npy"] = npy_file("<f2", [1, 1, 128])
    s["npy-ok-v2.npy"] = npy_file("<f4", R3, version=2)
    s["npy-ok-v3-f16.npy"] = npy_file("<f2", [1, 2, 64], version=3)
    s["npy-ok-extra-keys.npy"] = npy_file("<f4", R3, dict_text=npy_dict(
        "'extra': {'a': [1, (2, 3)], 'b': None, \"c\": -1.5e3}, 'shape': (1L, 1L, 64L), "
        "\"descr\": '<f4', 'fortran_order': False"))
    s["npy-bad-fortran.npy"] = npy_file("<f4", R3, fortran=True)
    s["npy-bad-big-endian.npy"] = npy_file(">f4", R3)
    s["npy-bad-f8.npy"] = npy_file("<f8", [1, 1, 64])
    s["npy-bad-bf16-v2.npy"] = npy_file("|V2", R3)
    s["npy-bad-structured.npy"] = npy_file("<f4", R3, dict_text=npy_dict(
        "'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1, 1, 64)"))
    s["npy-bad-version4.npy"] = npy_file("<f4", R3, version=4)
    s["npy-bad-hlen-past-end.npy"] = npy_file("<f4", R3, hlen=0xFFFF)
    s["npy-bad-hlen-0.npy"] = npy_file("<f4", R3, hlen=0)
    s["npy-bad-data-cut.npy"] = npy_file("<f4", R3)[:-1]
    s["npy-bad-rank9.npy"] = npy_file("<f4", [1] * 8 + [64])
    s["npy-bad-rank2.npy"] = npy_file("<f4", [1, 64])
    s["npy-bad-rank1.npy"] = npy_file("<f4", [64])
    s["npy-bad-scalar.npy"] = npy_file("<f4", [])
    s["npy-bad-huge-dim.npy"] = npy_file("<f4", [9007199254740993, 1, 64], data=b"")
    s["npy-bad-many-elems.npy"] = npy_file("<f4", [2147483647, 2147483647, 64], data=b"")
    s["npy-bad-deep.npy"] = npy_file("<f4", R3, dict_text=npy_dict(
        "'x': " + "[" * 70 + "]" * 70 + ", 'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 64)"))
    s["npy-bad-missing-shape.npy"] = npy_file("<f4", R3, dict_text=npy_dict(
        "'descr': '<f4', 'fortran_order': False"))
    s["npy-bad-unterminated.npy"] = npy_file("<f4", R3, dict_text="{'descr': '<f4")
    nan = bytearray(npy_file("<f2", R3))
    nan[-10:-8] = struct.pack("<H", 0x7E00)
    s["npy-bad-nan-f16.npy"] = bytes(nan)
    s["npy-bad-magic-only.npy"] = NPY_MAGIC
    s["npy-bad-magic-v1.npy"] = NPY_MAGIC + b"\x01\x00\x76"
    # regression: raw ESC and newline in descr went into the message
    s["npy-bad-descr-ctrl.npy"] = npy_file("<f4", R3, dict_text=npy_dict(
        "'descr': '\x1b[2J\nqvattn: ok', 'fortran_order': False, 'shape': (1, 1, 64)"))

    # -- two or three .npy laid end to end
    s["npy2-ok-q-kv.npy2"] = npy_file("<f4", R3) + npy_file("<f2", [1, 2, 64], salt=2)
    s["npy3-ok-f32.npy3"] = b"".join(npy_file("<f4", R3, salt=i) for i in range(3))
    s["npy3-ok-mixed-nq.npy3"] = (npy_file("<f2", [1, 2, 64]) + npy_file("<f4", [1, 3, 64], salt=2)
                                  + npy_file("<f2", [1, 3, 64], version=2, salt=3))
    s["npy3-ok-r4.npy3"] = b"".join(npy_file("<f2", [2, 1, 1, 64], salt=i) for i in range(3))
    s["npy3-bad-kv-shape.npy3"] = (npy_file("<f4", R3) + npy_file("<f4", [1, 2, 64])
                                   + npy_file("<f4", [1, 3, 64]))
    s["npy3-bad-q-d128.npy3"] = npy_file("<f2", [1, 1, 128]) + npy_file("<f4", R3) + npy_file("<f4", R3)
    s["npy3-bad-v-fortran.npy3"] = npy_file("<f4", R3) + npy_file("<f4", R3) + npy_file("<f4", R3, fortran=True)
    return s


def main():
    os.makedirs(OUT, exist_ok=True)
    made = seeds()
    for name in os.listdir(OUT):  # drop seeds this script no longer makes
        if name not in made:
            os.remove(os.path.join(OUT, name))
    for name, data in sorted(made.items()):
        assert len(data) < 4096, (name, len(data))
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("%d seeds in %s (%d bytes)" % (len(made), OUT, sum(len(d) for d in made.values())))


if __name__ == "__main__":
    main()
