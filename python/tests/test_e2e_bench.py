"""Smoke test of bench/e2e_dit.py: the --tiny config on the CPU (the H200
run uses the same code with the Wan2.2-A14B config)."""
import importlib.util
import json
import os

import _torch_util  # skips without torch

_torch_util.need_diffusers()


ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_e2e_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "e2e_dit", os.path.join(ROOT, "bench", "e2e_dit.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--tiny", "--device", "cpu", "--iters", "1", "--warmup", "0",
                     "--out", str(tmp_path)]) == 0
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[0].endswith("-tiny.json") and files[1].endswith(".md")
    res = json.load(open(tmp_path / files[0]))
    cases = {c["method"]: c for c in res["cases"]}
    assert set(cases) == {"sdpa", "sage8", "vc8+expcast", "vc8",
                          "vc8+expcast-centred", "draft@85/0/0/15"}
    # the default and its two ExpCast forms
    for vc in ("vc8+expcast", "vc8", "vc8+expcast-centred"):
        assert set(cases[vc]["steps"]) == {"group", "reuse", "plain"}
    assert set(cases["draft@85/0/0/15"]["steps"]) == {"sparse", "dense"}
    assert cases["draft@85/0/0/15"]["draft_dense_backend"] == "qvattn"  # CPU default
    for c in cases.values():
        assert c["schedule_ms"] > 0 and c["schedule_speedup_vs_sdpa"] > 0
        for s in c["steps"].values():
            assert s["ms"] > 0
    assert cases["sage8"]["steps"]["step"]["rel_l2_vs_sdpa"] < 1e-2
    assert res["meta"]["video_tokens"] == 256 and res["meta"]["num_steps"] == 8


def test_e2e_tiny_draft_warmup_method(tmp_path):
    """--draft-warmup-method vc8: the warm-up steps are timed as vc8's
    grouping and reuse steps and the schedule estimate sums them."""
    spec = importlib.util.spec_from_file_location(
        "e2e_dit", os.path.join(ROOT, "bench", "e2e_dit.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--tiny", "--device", "cpu", "--iters", "1", "--warmup", "0",
                     "--methods", "draft@85/0/0/15", "--draft-warmup-method", "vc8",
                     "--out", str(tmp_path)]) == 0
    res = json.load(open(tmp_path / sorted(os.listdir(tmp_path))[0]))
    c = {c["method"]: c for c in res["cases"]}["draft@85/0/0/15"]
    assert c["draft_warmup_method"] == "vc8" and c["draft_warmup_steps"] == 2
    assert set(c["steps"]) == {"sparse", "dense:group", "dense:reuse"}
    assert c["steps"]["dense:group"]["step"] == 0 and c["steps"]["dense:reuse"]["step"] == 1
    t = {a: s["ms"] for a, s in c["steps"].items()}
    want = t["dense:group"] + t["dense:reuse"] + 6 * t["sparse"]
    assert abs(c["schedule_ms"] - want) < 1e-9 * want
