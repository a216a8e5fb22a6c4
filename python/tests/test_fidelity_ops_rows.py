"""bench/fidelity_ops.py's --heads and --rows (the production-length
presets, whose float64 reference of every row does not fit): the rel-L2 it
reports on sampled rows equals one computed here from the same rows of the
same call, and --heads keeps the preset's first heads."""
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

qvattn = pytest.importorskip("qvattn")
try:
    qvattn._ffi.lib  # noqa: B018  (loads libqvattn)
except Exception as e:  # pragma: no cover - depends on the build
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)

import fidelity_ops  # noqa: E402


def run(tmp_path, *extra):
    out = tmp_path / "o"
    rc = fidelity_ops.main(["--device", "cpu", "--presets", "small", "--methods", "sage8",
                            "--peers", "", "--out", str(out), *extra])
    assert rc == 0
    (f,) = [p for p in out.iterdir() if p.suffix == ".json"]
    return json.loads(f.read_text())


def test_sampled_rows_give_the_rel_l2_of_those_rows(tmp_path):
    res = run(tmp_path, "--heads", "1", "--rows", "64")
    row = res["rows"][0]
    assert row["shape"][1] == 1 and row["rows"] == 64
    assert res["meta"]["heads"] == 1 and res["meta"]["rows"] == 64
    w = qvattn.synthetic("small", heads=1)
    q, k, v = (torch.from_numpy(w[x]).bfloat16() for x in "qkv")
    idx = fidelity_ops.sample_rows(torch, q.shape[2], 64, w["seed"], torch.device("cpu"))
    assert len(set(idx.tolist())) == 64
    out = qvattn.attention(q, k, v, method="sage8", grid=w["grid"], prefix=w["prefix"])
    qs, ks, vs = (x.double().numpy()[0, 0] for x in (q[:, :, idx], k, v))
    s = qs @ ks.T / np.sqrt(qs.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ vs
    got = out[:, :, idx].double().numpy()[0, 0]
    want = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert row["rel_l2"]["sage8"] == pytest.approx(want, rel=1e-6)


def test_all_rows_when_rows_exceed_the_sequence(tmp_path):
    res = run(tmp_path, "--heads", "1", "--rows", "100000")
    assert res["rows"][0]["rows"] is None


def test_bad_counts_are_refused():
    for flag in ("--heads", "--rows"):
        with pytest.raises(SystemExit):
            fidelity_ops.parse_args([flag, "0"])
