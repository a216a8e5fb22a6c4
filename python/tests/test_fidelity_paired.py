"""The fidelity harness's clip-by-clip comparison with a baseline
(bench/fidelity/summary.py: paired, and its table in report.py), on
hand-made per-clip PSNRs: no model is trained."""
import math
import os
import statistics
import sys

import pytest

pytest.importorskip("numpy")  # report.py's imports
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from fidelity import report as fid_report  # noqa: E402
from fidelity import summary as fid_summary  # noqa: E402


def model(seed, **psnr):
    return {"seed": seed, "methods": {m: {"status": "ok", "psnr": p} for m, p in psnr.items()}}


def test_paired_differences_interval_and_counts():
    models = [model(0, sage2=[50.0, 51.0, 52.0], a=[51.0, 50.5, 53.0], b=[49.0, 50.0, 51.0]),
              model(1, sage2=[48.0, 49.0, 50.0], a=[49.5, 49.0, 52.0], b=[47.0, 48.0, 49.0])]
    pr = fid_summary.paired(models, ["sage2", "a", "b"], "sage2")
    assert pr["baseline"] == "sage2" and set(pr["methods"]) == {"a", "b"}
    a = pr["methods"]["a"]
    d = [1.0, -0.5, 1.0, 1.5, 0.0, 2.0]
    assert a["clips"] == 6 and a["clips_above"] == 4
    assert math.isclose(a["mean"], sum(d) / 6)
    half = 2.571 * statistics.stdev(d) / math.sqrt(6)  # t(0.975, 5 df)
    assert math.isclose(a["ci95"][0], a["mean"] - half) and math.isclose(a["ci95"][1], a["mean"] + half)
    assert [round(x, 9) for x in a["per_model"]] == [0.5, round(3.5 / 3, 9)]
    b = pr["methods"]["b"]  # one dB below on every clip: a zero-width interval
    assert b["mean"] == -1.0 and b["ci95"] == [-1.0, -1.0] and b["clips_above"] == 0
    table = "\n".join(fid_report._paired_table({"paired": pr}))
    assert "## Paired against sage2" in table
    assert "| a | +0.83 |" in table and "| 4/6 |" in table and "| b | -1.00 | -1.00 to -1.00 | 0/6 |" in table


def test_paired_needs_the_baseline_everywhere():
    ok = model(0, sage2=[50.0, 51.0], a=[51.0, 52.0])
    skipped = {"seed": 1, "methods": {"sage2": {"status": "skipped: not installed"},
                                      "a": {"status": "ok", "psnr": [50.0, 50.0]}}}
    assert fid_summary.paired([ok, skipped], ["sage2", "a"], "sage2") is None
    assert fid_summary.paired([ok], ["a"], "sage3") is None
    assert fid_report._paired_table({"paired": None}) == []
    # a method that did not run on every model has no row
    broken = model(1, sage2=[50.0, 51.0])
    broken["methods"]["a"] = {"status": "error: boom"}
    assert fid_summary.paired([ok, broken], ["sage2", "a"], "sage2")["methods"] == {}
    # clips whose PSNR is infinite (or lost as null in JSON) are left out
    inf = model(1, sage2=[50.0, 51.0], a=[math.inf, None])
    pr = fid_summary.paired([ok, inf], ["sage2", "a"], "sage2")
    assert pr["methods"]["a"]["clips"] == 2 and pr["methods"]["a"]["per_model"] == [1.0, None]
    assert "| a | +1.00 | +1.00 to +1.00 | 2/2 | +1.00 / n/a |" in fid_report._paired_table({"paired": pr})
    assert fid_summary.paired([inf], ["sage2", "a"], "sage2")["methods"] == {}


def test_t_quantiles():
    assert fid_summary.t975(5) == 2.571 and fid_summary.t975(23) == 2.069
    assert fid_summary.t975(35) == 2.042  # conservative between table entries
    assert fid_summary.t975(1000) == 1.960 and math.isinf(fid_summary.t975(0))


def run_json(seed, **psnr):
    """A run's report as merge_results reads it (hand-made, one model)."""
    meta = {"methods": sorted(psnr), "frozen": True, "clips": 2, "reference": "bf16-sdpa",
            "date_utc": "2026-12-05T00:00:00+00:00", "git": "x", "command": "c",
            "model_seeds": [seed]}
    return {"meta": meta, "config": {"c": 1}, "data_stats": {"d": 1},
            "models": [model(seed, **psnr)], "timings": {"total": 1.0 + seed},
            "warnings": []}


def test_merge_pairs_against_the_baseline_given_and_merges_merged_reports():
    runs = [run_json(0, sage8=[50.0, 51.0], a=[51.0, 52.5]),
            run_json(1, sage8=[49.0, 50.0], a=[49.5, 51.0])]
    res, why = fid_summary.merge_results(runs, ["r0.json", "r1.json"], "sage8")
    assert why is None and res["paired"]["baseline"] == "sage8"
    assert res["paired"]["methods"]["a"]["clips"] == 4
    assert fid_summary.merge_results(runs, ["r0.json", "r1.json"])[0]["paired"] is None  # no sage2
    # a merged report merges again with a third run; its runs' timings stay apart
    again, why = fid_summary.merge_results([res, run_json(2, sage8=[48.0, 49.0], a=[48.0, 50.0])],
                                           ["merged.json", "r2.json"], "sage8")
    assert why is None and set(again["timings"]) == {"r0.json", "r1.json", "r2.json"}
    assert again["paired"]["methods"]["a"]["clips"] == 6
    assert any("Paired against sage8" in line for line in fid_report._paired_table(again))
