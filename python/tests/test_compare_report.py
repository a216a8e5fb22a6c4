"""bench/compare.py's report: the 40-step schedule row is the step-weighted
mean of the measured grouping, reuse and plain steps, with the counts the
library's schedule gives (no GPU needed: the report is a pure function)."""
import importlib.util
import os
import sys

import pytest

from qvattn import _ffi

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def compare():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        spec = importlib.util.spec_from_file_location(
            "compare", os.path.join(ROOT, "bench", "compare.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.pop(0)


def test_schedule_counts_are_the_librarys(compare):
    # ceil(40/4) = 10 V-Smooth steps, grouping every 4th: VC App. A
    assert compare.schedule_counts(_ffi) == {"group": 3, "reuse": 7, "plain": 30}


def _result(modes):
    entries = [{"impl": "sdpa-cudnn", "label": "SDPA cuDNN BF16", "ms": 200.0}]
    for mode, ms, kms in modes:
        entries.append({"impl": "vc8+expcast", "label": "qvattn vc8+expcast", "mode": mode,
                        "ms": ms, "kernel_ms": kms, "status": "ok"})
    entries.append({"impl": "sage8", "label": "qvattn sage8", "mode": "-", "ms": 150.0,
                    "status": "ok"})
    return {"meta": {"schedule_counts": {"group": 3, "reuse": 7, "plain": 30}},
            "shapes": [{"name": "wan", "B": 1, "H": 1, "N": 1, "D": 128,
                        "entries": entries}]}


def test_schedule_row_is_the_weighted_mean(compare):
    lines = compare.schedule_lines(_result([("group", 170.0, 150.0), ("reuse", 160.0, 150.0),
                                            ("plain", 140.0, 130.0)]))
    rows = [ln for ln in lines if ln.startswith("| wan")]
    assert len(rows) == 1, lines  # sage8 has no V-Smooth steps
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    full = (3 * 170 + 7 * 160 + 30 * 140) / 40.0
    kern = (3 * 150 + 7 * 150 + 30 * 130) / 40.0
    assert cells == ["wan", "qvattn vc8+expcast", f"{full:.3f}", f"{200 / full:.2f}",
                     f"{kern:.3f}", f"{200 / kern:.2f}"]


def test_schedule_row_needs_every_step(compare):
    # a step that did not run (time limit) leaves no schedule row
    assert compare.schedule_lines(_result([("group", 170.0, 150.0),
                                           ("plain", 140.0, 130.0)])) == []


def test_method_options_reach_the_config_and_the_schedule(compare):
    cfg = compare.method_config(_ffi, "vc8+hadamard:vsmooth.schedule=demean", layer=2, step=5)
    assert cfg.vsmooth.schedule == _ffi.QVA_SCHEDULE_DEMEAN and cfg.hadamard == 1
    assert cfg.layer == 2 and cfg.step == 5
    assert compare.schedule_counts(_ffi, cfg=cfg) == {"group": 3, "reuse": 37, "plain": 0}
    with pytest.raises(ValueError):
        compare.method_config(_ffi, "vc8:vsmooth.schedule")


def test_schedule_row_uses_the_methods_own_counts(compare):
    res = _result([("group", 170.0, 150.0), ("reuse", 160.0, 150.0), ("reuse", 150.0, 140.0)])
    own = {"group": 3, "reuse": 37, "plain": 0}
    for e in res["shapes"][0]["entries"]:
        if e["impl"] == "vc8+expcast":
            e["schedule_counts"] = own
    rows = [ln for ln in compare.schedule_lines(res) if ln.startswith("| wan")]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    full = (3 * 170 + 37 * 150) / 40.0  # the late (step-20) reuse entry stands for the reuse steps
    assert cells[1] == "qvattn vc8+expcast (3 group, 37 reuse, 0 plain)"
    assert cells[2] == f"{full:.3f}"


def test_grids_fit_their_shapes(compare):
    # each latent grid names a shape, and its tokens fit the sequence: the
    # rest is the prefix compare.py passes (N - T*H*W)
    for name, (t, h, w) in compare.GRIDS.items():
        assert name in compare.SHAPES
        n = compare.SHAPES[name][2]
        assert 0 <= n - t * h * w < n
    assert compare.SHAPES["cogvideox-5b"][2] - 13 * 30 * 45 == 226  # CogVideoX's text tokens
    assert compare.SHAPES["small-d64"][2] == 8 * 32 * 32


def _round(cudnn_ms, cases):
    """One round of one shape: cuDNN, then (impl, mode, step, ms, kernel_ms)."""
    entries = [{"impl": "sdpa-cudnn", "label": "SDPA cuDNN BF16", "mode": "-", "ms": cudnn_ms,
                "status": "ok"}]
    for impl, mode, step, ms, kms in cases:
        e = {"impl": impl, "label": f"qvattn {impl}", "mode": mode, "step": step, "ms": ms,
             "status": "ok"}
        if kms is not None:
            e["kernel_ms"] = kms
        entries.append(e)
    return entries


def test_rounds_take_medians_and_ratios_within_each_round(compare):
    # the GPU slows through the run: cuDNN and sage8 both take longer in
    # round 2; the ratio of each round is the same, and so is the merged one
    rounds = [_round(200.0, [("sage8", "-", 0, 100.0, 90.0)]),
              _round(220.0, [("sage8", "-", 0, 110.0, 99.0)]),
              _round(210.0, [("sage8", "-", 0, 130.0, None)])]
    for r in rounds:
        compare.ratios_to_cudnn(r)
    fl = compare.flops(1, 1, 1000, 128)
    merged = compare.merge_rounds(rounds, fl)
    assert [e["impl"] for e in merged] == ["sdpa-cudnn", "sage8"]
    cudnn, sage = merged
    assert cudnn["ms"] == 210.0 and cudnn["rounds"]["ms"] == [200.0, 220.0, 210.0]
    assert sage["ms"] == 110.0
    assert sage["vs_cudnn"] == pytest.approx(2.0)  # median of 2.0, 2.0, 210/130
    assert sage["rounds"]["vs_cudnn"] == pytest.approx([2.0, 2.0, 210.0 / 130.0])
    assert sage["kernel_ms"] == pytest.approx(94.5)  # the two rounds that have it
    assert sage["tops"] == pytest.approx(compare.tops(fl, 110.0))
    assert sage["kernel_tops"] == pytest.approx(compare.tops(fl, 94.5))


def test_rounds_keep_equal_rows_apart(compare):
    # a demean schedule names steps 1 and 20 both "reuse"; a method listed
    # twice gives two equal rows; each pairs with its own in every round
    cases = lambda a, b, c: [("vc8", "reuse", 1, a, None), ("vc8", "reuse", 20, b, None),  # noqa: E731
                             ("sage8", "-", 0, c, None), ("sage8", "-", 0, c + 50.0, None)]
    second = cases(170.0, 140.0, 120.0)  # listed in another order, equal rows in theirs
    rounds = [_round(200.0, cases(160.0, 150.0, 100.0)),
              _round(200.0, [second[1], second[2], second[0], second[3]])]
    merged = compare.merge_rounds(rounds, 1.0)
    got = [(e["impl"], e.get("step"), e["ms"]) for e in merged]
    assert got == [("sdpa-cudnn", None, 200.0), ("vc8", 1, 165.0), ("vc8", 20, 145.0),
                   ("sage8", 0, 110.0), ("sage8", 0, 160.0)]


def test_one_round_is_left_as_it_is(compare):
    r = _round(200.0, [("sage8", "-", 0, 100.0, None)])
    compare.ratios_to_cudnn(r)
    merged = compare.merge_rounds([r], 1.0)
    assert merged == r and "rounds" not in merged[1]
    assert merged[1]["vs_cudnn"] == 2.0
    assert compare.merge_rounds([], 1.0) == []
