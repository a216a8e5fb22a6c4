"""Smoke test of the end-to-end fidelity harness (bench/fidelity, issue 14)
at its --tiny size on the CPU: the H200 run uses the same code with the
default preset.

Two in-process runs with the same seeds (no weight cache, so both train):
the training loss drops, the two runs give bit-identical clips, the methods
give finite clips with a PSNR, and the report files are written.
"""
import json
import os
import struct
import sys
import zlib

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

try:
    import qvattn  # noqa: F401  (the library from $QVATTN_LIB, as the other tests)
except OSError as e:  # library not built
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)

from fidelity import config as fid_config  # noqa: E402
from fidelity import cli as fid_cli  # noqa: E402
from fidelity import run as fid_run  # noqa: E402

METHODS = ["bf16", "sage8", "vc8", "vc8:vsmooth.schedule=always", "draft@85/0/0/15",
           "draft@85/0/0/15:warm=sage8", "draft@p95"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs: [(exit status, Harness, out dir, log lines)]."""
    threads = torch.get_num_threads()
    out = []
    try:
        for i in range(2):
            d = tmp_path_factory.mktemp(f"fidelity{i}")
            lines = []
            status, h = fid_run.run_cli(
                ["--tiny", "--device", "cpu", "--no-cache", "--methods", ",".join(METHODS),
                 "--out", str(d)], log=lines.append)
            out.append((status, h, d, lines))
    finally:
        torch.set_num_threads(threads)  # --tiny sets 1 thread for the process
    return out


def test_loss_drops(runs):
    info = runs[0][1].results["models"][0]["train"]
    assert len(info["loss_curve"]) == fid_config.TINY["train"]["steps"]
    assert info["final_loss"] < 0.7 * info["first_loss"], info


def test_same_seed_same_samples(runs):
    a, b = runs[0][1], runs[1][1]
    assert a.results["models"][0]["train"]["loss_curve"] == \
        b.results["models"][0]["train"]["loss_curve"]
    for name in (fid_config.REFERENCE, "vc8"):
        x, y = a.samples[0][name], b.samples[0][name]
        assert x.shape == (fid_config.TINY["sample"]["clips"], 4, 3, 32, 32)
        assert torch.equal(x, y), name


def test_methods_finite_with_psnr(runs):
    status, h, _, _ = runs[0]
    assert status == 0  # no recorded loss for the tiny preset: nothing to fail
    summary = h.results["summary"]
    for name in METHODS:
        s = summary[name]
        assert s["status"] == "ok", (name, s)
        assert s["finite"] and torch.isfinite(h.samples[0][name]).all()
        assert s["psnr_mean"] is not None and s["ssim_mean"] is not None
        assert -1.0 <= s["ssim_mean"] <= 1.0
        assert s["op_rel_l2"]["mean"] >= 0
    # qvattn's own BF16 kernel stays close to torch's BF16 SDPA; 8-bit further
    assert summary["bf16"]["psnr_mean"] > 30.0
    assert summary["bf16"]["psnr_mean"] > summary["sage8"]["psnr_mean"]
    stats = h.results["models"][0]["layer_stats"]
    assert len(stats) == 2 * len(fid_config.capture_steps(fid_config.TINY))
    for r in stats:
        assert 0.15 - 1e-6 <= r["locality"] <= 1 and 0 < r["entropy"] <= 1


def test_draft_warmup_method_changes_only_the_warmup(runs):
    """":warm=sage8" reaches the library as option draft.warmup_method: its
    clips differ from the bf16 warm-up's (the warm-up steps run as sage8)."""
    h = runs[0][1]
    a, b = h.samples[0]["draft@85/0/0/15"], h.samples[0]["draft@85/0/0/15:warm=sage8"]
    assert not torch.equal(a, b)
    from fidelity import sample
    assert sample.split_method("draft@85/0/0/15+expcast:warm=vc8") == \
        ("draft@85/0/0/15+expcast", "vc8")
    assert sample.method_options("draft@85/0/0/15:warm=sage8", fid_config.TINY) == {
        "draft.dense_warmup_frac": fid_config.TINY["sample"]["draft_warmup_frac"],
        "draft.warmup_method": "sage8"}
    assert sample.method_options("vc8", fid_config.TINY) is None


def test_method_options_suffix(runs):
    """"vc8:vsmooth.schedule=always" reaches the library as that option: the
    sampled clips differ from the paper schedule's (grouping on every step,
    not only the early ones), while the operator metric's stateless calls,
    which group on every call either way, give vc8's figures."""
    h = runs[0][1]
    a, b = h.samples[0]["vc8"], h.samples[0]["vc8:vsmooth.schedule=always"]
    assert not torch.equal(a, b)
    ops = h.results["models"][0]["op_rel_l2"]
    assert ops["vc8:vsmooth.schedule=always"]["mean"] == ops["vc8"]["mean"]
    from fidelity import sample
    assert sample.parse_method("vc8+codesum:vsmooth.schedule=always:vsmooth.clusters=16") == \
        ("vc8+codesum", {"vsmooth.schedule": "always", "vsmooth.clusters": "16"})
    assert sample.routed_options("draft@85/0/0/15:warm=vc8") is None
    with pytest.raises(ValueError, match="KEY=VALUE"):
        sample.parse_method("vc8:always")
    assert fid_cli.validate_methods(qvattn, ["vc8:vsmooth.schedule=always"]) is None
    assert "unknown option" in fid_cli.validate_methods(qvattn, ["vc8:vsmooth.nope=1"])
    assert "schedule" in fid_cli.validate_methods(qvattn, ["vc8:vsmooth.schedule=never"])


def test_draft_kept_share(runs):
    """The routed steps' kept share per layer: the fixed quotas keep their
    share on every layer; the adaptive budget's lies in (0, 1]."""
    h = runs[0][1]
    n_layers = fid_config.TINY["model"]["layers"]
    fixed = h.results["models"][0]["methods"]["draft@85/0/0/15"]["kept_share"]
    assert len(fixed["per_layer"]) == n_layers
    assert all(abs(x - fixed["per_layer"][0]) < 1e-12 for x in fixed["per_layer"])
    assert 0.1 < fixed["mean"] < 0.25, fixed
    ada = h.results["summary"]["draft@p95"]
    assert 0 < ada["kept_share_mean"] <= 1
    text = open(h.base + ".md").read()
    assert "## Draft: region pairs kept" in text and "| draft@p95 |" in text


def test_probes_watch_training_without_changing_it(runs, tmp_path):
    """--probe-every: sample statistics during training (steps 20, 40 and
    the end), the same loss curve and samples as a run without probes, and
    the likeness verdict in the report."""
    lines, threads = [], torch.get_num_threads()
    try:
        status, h = fid_run.run_cli(["--tiny", "--device", "cpu", "--no-cache", "--methods",
                                     "bf16", "--probe-every", "20", "--out", str(tmp_path)],
                                    log=lines.append)
    finally:
        torch.set_num_threads(threads)  # --tiny sets 1 thread for the process
    assert status == 0
    m, ref = h.results["models"][0], runs[0][1].results["models"][0]
    assert m["train"]["loss_curve"] == ref["train"]["loss_curve"]
    assert torch.equal(h.samples[0][fid_config.REFERENCE], runs[0][1].samples[0][fid_config.REFERENCE])
    probes = m["train"]["probes"]
    assert [p["step"] for p in probes] == [20, 40, 60]
    for p in probes:
        assert set(p["ratios"]) == {"std", "frame_diff", "hf_ratio"} and isinstance(p["like_data"], bool)
    # the last probe looks at the returned model: the run's own sanity statistics
    assert isinstance(m["likeness"]["like_data"], bool)
    assert probes[-1]["ratios"] == m["likeness"]["ratios"]
    assert m["sample_stats"]["clips"] == fid_config.TINY["sample"]["sanity_clips"]
    text = open(h.base + ".md").read()
    assert "During training (`--probe-every`" in text and "| like the data? |" in text


def test_sanity_samplers(tmp_path):
    """--sanity-samplers: the frozen sampler reproduces the run's own sanity
    statistics; another sampler gives its own row; bad lists exit 2."""
    sc = fid_config.TINY["sample"]
    frozen = f"{sc['num_steps']}:{sc['shift']:g}"
    lines, threads = [], torch.get_num_threads()
    try:
        status, h = fid_run.run_cli(["--tiny", "--device", "cpu", "--no-cache", "--methods",
                                     "bf16", "--sanity-samplers", frozen + ",8:1",
                                     "--out", str(tmp_path)], log=lines.append)
        assert fid_run.run_cli(["--tiny", "--sanity-samplers", "8"], log=lines.append)[0] == 2
        assert fid_run.run_cli(["--tiny", "--sanity-samplers", "0:1"], log=lines.append)[0] == 2
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    m = h.results["models"][0]
    probe = m["sampler_probe"]
    # the comparison sampler's row (listed once), then the other one; the
    # verdict's own sampler is the run's sanity row, not repeated
    assert [(p["num_steps"], p["shift"]) for p in probe] == [(sc["num_steps"], sc["shift"]), (8, 1.0)]
    assert m["likeness"]["sampler"] == [sc["likeness_steps"], sc["shift"]]
    assert sc["likeness_steps"] != sc["num_steps"]
    assert probe[0]["stats"] != m["sample_stats"] and probe[1]["stats"] != m["sample_stats"]
    text = open(h.base + ".md").read()
    assert "--sanity-samplers" in text and f"{sc['likeness_steps']} Euler steps)" in text


def test_set_overrides(tmp_path):
    """--set SECTION.KEY=VALUE: typed, checked, marks the run as not frozen
    and trains another model; bad keys, sections and values exit 2."""
    cfg = fid_config.preset("tiny")
    done, err = fid_cli.apply_sets(cfg, ["train.t_dist=logit-normal", "train.batch=3",
                                         "train.lr=5e-4", "train.compile=false"])
    assert err is None and len(done) == 4
    assert (cfg["train"]["t_dist"], cfg["train"]["batch"], cfg["train"]["lr"],
            cfg["train"]["compile"]) == ("logit-normal", 3, 5e-4, False)
    for bad in ["train.batch=3.5", "train.nope=1", "optim.lr=1", "train.lr", "lr=1",
                "train.compile=yes", "model.patch=[1,2]x"]:
        assert fid_cli.apply_sets(fid_config.preset("tiny"), [bad])[1], bad
    lines, threads = [], torch.get_num_threads()
    try:
        assert fid_run.run_cli(["--tiny", "--set", "train.nope=1"], log=lines.append)[0] == 2
        status, h = fid_run.run_cli(["--tiny", "--device", "cpu", "--no-cache", "--methods",
                                     "bf16", "--set", "train.t_dist=logit-normal",
                                     "--out", str(tmp_path)], log=lines.append)
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    meta = h.results["meta"]
    assert not meta["frozen"] and meta["overrides"] == ["--set train.t_dist=logit-normal"]
    assert h.results["config"]["train"]["t_dist"] == "logit-normal"
    assert h.results["models"][0]["loss_check"]["status"].startswith("not checked")
    assert "Not the frozen config" in open(h.base + ".md").read()


def test_likeness_bounds():
    from fidelity import metrics
    data = {"std": [0.4, 0.4, 0.4], "frame_diff": 0.1, "hf_ratio": 0.02}
    same = metrics.likeness(data, data)
    assert same["like_data"] and all(abs(r - 1) < 1e-12 for r in same["ratios"].values())
    flat = dict(data, std=[0.25, 0.25, 0.25])
    assert not metrics.likeness(flat, data)["like_data"]


def test_seeds_option():
    assert fid_cli.parse_seeds("2,0") == ([2, 0], None)
    for bad in ("", "a", "1,1", "-1"):
        assert fid_cli.parse_seeds(bad)[1], bad
    lines = []
    assert fid_run.run_cli(["--tiny", "--device", "cpu", "--seeds", "0,0"],
                           log=lines.append) == (2, None)
    assert "distinct" in lines[-1]


def _png_size(path):
    """(width, height) of a PNG after checking its chunks and CRCs."""
    blob = open(path, "rb").read()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(blob):
        n, kind = struct.unpack(">I4s", blob[pos:pos + 8])
        body = blob[pos + 4:pos + 8 + n]
        assert struct.unpack(">I", blob[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(body)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[4:12])
        elif kind == b"IDAT":
            idat += body[4:]
        pos += 12 + n
    w, h = size
    assert len(zlib.decompress(idat)) == h * (1 + 3 * w)
    return w, h


def test_outputs_written(runs):
    status, h, d, lines = runs[0]
    files = sorted(os.listdir(d))
    js = [f for f in files if f.endswith("-tiny.json")]
    md = [f for f in files if f.endswith("-tiny.md")]
    png = [f for f in files if f.endswith(".png")]
    assert len(js) == 1 and len(md) == 1 and len(png) == 1, files
    res = json.load(open(d / js[0]))
    assert res["meta"]["preset"] == "tiny" and res["meta"]["frozen"]
    assert res["meta"]["tokens"] == 256
    assert set(res["summary"]) == {fid_config.REFERENCE, *METHODS}
    text = open(d / md[0]).read()
    assert "| method | PSNR dB mean" in text and "## Sanity" in text
    assert "LPIPS" in text
    assert any("| method | PSNR dB mean" in line for line in lines)  # printed too
    w, hgt = _png_size(d / png[0])
    assert w > 0 and hgt > 0


def test_recorded_loss_check(runs, monkeypatch):
    h = runs[0][1]
    info = h.results["models"][0]["train"]
    key = fid_config.loss_key(h.cfg, 0, "cpu")
    monkeypatch.setitem(fid_config.RECORDED_FINAL_LOSS, key, info["final_loss"] * 1.02)
    assert h.loss_check(info)["status"].startswith("ok")
    assert not h.warnings
    monkeypatch.setitem(fid_config.RECORDED_FINAL_LOSS, key, info["final_loss"] * 1.2)
    assert h.loss_check(info)["status"].startswith("FAILED")
    assert fid_run.exit_status(h.results) == 1
    h.warnings.clear()


def test_merge_runs(runs, tmp_path):
    """--merge: the reports of two runs with different seeds become one table
    over both models; the same seed twice, or another config, is refused."""
    d = runs[0][2]
    js = [f for f in os.listdir(d) if f.endswith("-tiny.json")][0]
    res = json.load(open(d / js))
    other = json.loads(json.dumps(res))
    other["models"][0]["seed"] = 1
    other["models"][0]["methods"]["sage8"]["psnr_mean"] += 2.0
    other["meta"]["model_seeds"] = [1]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(res))
    b.write_text(json.dumps(other))
    lines = []
    assert fid_run.main(["--merge", str(b), str(a), "--out", str(tmp_path)],
                        log=lines.append) == 0
    merged = [f for f in os.listdir(tmp_path) if f.startswith("fidelity-merged-")]
    assert sorted(f.rsplit(".", 1)[1] for f in merged) == ["json", "md"]
    m = json.load(open(tmp_path / [f for f in merged if f.endswith(".json")][0]))
    assert m["meta"]["model_seeds"] == [0, 1] and len(m["meta"]["merged_from"]) == 2
    s = m["summary"]["sage8"]
    p0 = res["models"][0]["methods"]["sage8"]["psnr_mean"]
    assert s["per_model_psnr"] == [p0, p0 + 2.0]
    assert abs(s["psnr_mean"] - (p0 + 1.0)) < 1e-9 and abs(s["psnr_std"] - 2 ** 0.5) < 1e-9
    assert any("merged: `a.json`" in line for line in lines)
    # the same seed in two runs, and a run of another configuration
    assert fid_run.main(["--merge", str(a), str(a), "--out", str(tmp_path)],
                        log=lines.append) == 2
    assert "two runs" in lines[-1]
    other["config"]["train"]["steps"] += 1
    b.write_text(json.dumps(other))
    assert fid_run.main(["--merge", str(a), str(b), "--out", str(tmp_path)],
                        log=lines.append) == 2
    assert "config differs" in lines[-1]


def test_labels_condition_the_model():
    """The model is conditioned on the clip's background kind: it refuses a
    call without labels, its output depends on them, and sampled clip j
    carries the label of held-out data clip j (the clip it is shown and
    counted beside)."""
    from fidelity import data, sample
    from fidelity.model import VideoDiT
    cfg = fid_config.preset("tiny")
    assert cfg["model"]["classes"] == len(data.BG_KINDS)
    torch.manual_seed(0)
    model = VideoDiT.from_config(cfg).eval()
    with torch.no_grad():  # past the zero init, which makes every output 0
        for p in model.parameters():
            p.normal_(0, 0.05)
    d = cfg["data"]
    x = torch.randn(2, d["frames"], d["channels"], d["height"], d["width"])
    t = torch.tensor([0.3, 0.7])
    with pytest.raises(ValueError, match="labels required"):
        model(x, t)
    with torch.no_grad():
        a = model(x, t, labels=torch.tensor([0, 1]))
        b = model(x, t, labels=torch.tensor([2, 1]))
    assert not torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    n = d["stats_clips"] + 3
    labels = sample.clip_labels(cfg, n, "cpu").tolist()
    held = data.stats_indices(d)
    assert labels[:len(held)] == data.clip_labels(d, held)
    assert labels[len(held):] == labels[:3]
    assert set(labels) <= set(range(len(data.BG_KINDS)))
    unconditional = fid_config.preset("tiny")
    unconditional["model"]["classes"] = 0
    assert sample.clip_labels(unconditional, n, "cpu") is None
    with pytest.raises(ValueError, match="not accepted"):
        VideoDiT.from_config(unconditional)(x, t, labels=torch.tensor([0, 1]))


def test_frame_sheet_shows_each_kind_first():
    """The frame sheet takes the first sampled clip of each kind, then the
    rest in order."""
    class Fake:
        cfg = fid_config.preset("default")
        data_labels = torch.tensor([2, 2, 2, 2, 3, 1, 2, 2] + [0] * 56)
    assert fid_run.Harness.image_clip_indices(Fake()) == [0, 4, 5, 1]


def test_classifier_free_guidance(tmp_path):
    """model.null_label, train.label_dropout, sample.guidance (on in the
    frozen config): the labels are dropped to the null class in training,
    the sampler runs each clip with its label and the null label in one
    batch and guides; guidance 1 is the label alone; configs that cannot
    run exit 2 before training."""
    from fidelity import sample, train
    from fidelity.model import VideoDiT
    cfg = fid_config.preset("tiny")
    cfg["model"]["null_label"] = True
    cfg["train"]["label_dropout"] = 0.5
    null = cfg["model"]["classes"]
    labels = [train.batch_for_step(cfg, 0, s, "cpu")[3] for s in range(8)]
    no_dropout = fid_config.preset("tiny")
    no_dropout["train"]["label_dropout"] = 0.0
    plain = [train.batch_for_step(no_dropout, 0, s, "cpu")[3] for s in range(8)]
    assert all(int((b == null).sum()) == 0 for b in plain)
    dropped = sum(int((a == null).sum()) for a in labels)
    assert 0 < dropped < sum(a.numel() for a in labels)
    for a, b in zip(labels, plain):  # dropout only replaces labels by the null one
        assert torch.equal(torch.where(a == null, b, a), b)
    torch.manual_seed(0)
    model = VideoDiT.from_config(cfg).eval()
    assert model.label_embed.num_embeddings == null + 1
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    noise = sample.clip_noise(cfg, 2, "cpu")
    lab = sample.clip_labels(cfg, 2, "cpu")
    seen = []

    def attn(q, k, v, layer):
        seen.append(q.shape[0])
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    cfg["sample"]["guidance"] = 3.0
    guided = sample.sample(model, noise, attn, 2, 3.0, **sample.sampler_kwargs(cfg, lab))
    assert set(seen) == {4}  # labelled and null clips in one batch
    alone = sample.sample(model, noise, attn, 2, 3.0, labels=lab)
    assert not torch.equal(guided, alone)
    # one Euler step is linear in v: guidance 3 = null + 3 (label - null)
    one = [sample.sample(model, noise, attn, 1, 3.0, **kw) for kw in (
        sample.sampler_kwargs(cfg, lab), {"labels": lab},
        {"labels": torch.full_like(lab, null)})]
    assert torch.allclose(one[0] - noise, (one[2] - noise) + 3.0 * (one[1] - one[2]), atol=1e-5)
    cfg["sample"]["guidance"] = 1.0
    assert sample.sampler_kwargs(cfg, lab) == {"labels": lab}
    lines, threads = [], torch.get_num_threads()
    try:
        no_null = ["--tiny", "--set", "model.null_label=false", "--set"]
        assert fid_run.run_cli(no_null + ["train.label_dropout=0.0"], log=lines.append)[0] == 2
        assert fid_run.run_cli(no_null + ["sample.guidance=1.0"], log=lines.append)[0] == 2
        assert "null_label" in lines[-1]
        status, h = fid_run.run_cli(
            ["--tiny", "--device", "cpu", "--no-cache", "--methods", "bf16,vc8",
             "--out", str(tmp_path)], log=lines.append)
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    s = h.results["summary"]
    assert s["vc8"]["status"] == "ok" and s["vc8"]["finite"] and s["vc8"]["psnr_mean"] > 0
