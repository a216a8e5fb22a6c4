"""qvattn.diffusers and qvattn.capture on tiny random diffusers models (CPU):
processors installed and removed, layer ids, step counting with and without
classifier-free guidance (and across Wan2.2's two transformers), outputs
close to the SDPA run, HunyuanVideo's text mask, capture files the CLI
reads, and bad arguments.  Skips without torch or diffusers.
"""
import os
import subprocess
import types
import warnings

import pytest

from _torch_util import _ffi, need_diffusers, ops, qvattn, rel_l2, torch

need_diffusers()
from diffusers import HunyuanVideoTransformer3DModel, WanTransformer3DModel  # noqa: E402

import qvattn.capture as qcapture  # noqa: E402
import qvattn.diffusers as qd  # noqa: E402


def tiny_wan(seed=0, head_dim=64, layers=2):
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=head_dim,
        in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
        num_layers=layers, rope_max_seq_len=64).eval().requires_grad_(False)


def wan_inputs(B=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 4, 2, 16, 16, generator=g), torch.randn(B, 8, 32, generator=g)


def tiny_hunyuan(seed=0):
    torch.manual_seed(seed)
    return HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64,
        num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=2,
        patch_size_t=1, text_embed_dim=32, pooled_projection_dim=16,
        rope_axes_dim=(16, 24, 24), guidance_embeds=True).eval().requires_grad_(False)


def hunyuan_inputs(valid=(7, 12), seed=1):
    g = torch.Generator().manual_seed(seed)
    B = len(valid)
    x = torch.randn(B, 4, 2, 16, 16, generator=g)
    enc = torch.randn(B, 12, 32, generator=g)
    emask = torch.zeros(B, 12, dtype=torch.long)
    for b, n in enumerate(valid):
        emask[b, :n] = 1
    return x, enc, emask, torch.randn(B, 16, generator=g), torch.full((B,), 6000.0)



# ------------------------------------------------------------------ install / remove
def test_apply_and_remove_wan():
    m = tiny_wan()
    originals = {n: mod.processor for n, mod in m.named_modules() if hasattr(mod, "processor")}
    h = qd.apply(m, "sage8")
    assert isinstance(m.blocks[0].attn1.processor, qd.QvattnProcessor)
    assert isinstance(m.blocks[1].attn2.processor, qd.QvattnProcessor)
    # self-attention first, then cross-attention
    assert qd.layer_ids(m) == {"blocks.0.attn1": 0, "blocks.1.attn1": 1,
                               "blocks.0.attn2": 2, "blocks.1.attn2": 3}
    assert qd.state(m) is h and len(h.patched) == 4
    # re-applying replaces the install, keeping the true originals
    qd.apply(m, "bf16", layers=[0])
    assert isinstance(m.blocks[0].attn1.processor, qd.QvattnProcessor)
    assert not isinstance(m.blocks[1].attn1.processor, qd.QvattnProcessor)
    assert qd.remove(m) is True and qd.remove(m) is False
    for n, mod in m.named_modules():
        if hasattr(mod, "processor"):
            assert mod.processor is originals[n], n
    assert not m._forward_pre_hooks and qd.state(m) is None


@pytest.mark.parametrize("method,bound", [("exact", 1e-6), ("bf16", 1e-3),
                                          ("sage8", 5e-3), ("vc8+expcast", 5e-3)])
def test_wan_output_close_to_sdpa(method, bound):
    m = tiny_wan()
    x, enc = wan_inputs()
    t = torch.tensor([900.0])
    with torch.no_grad():
        ref = m(x, t, enc).sample
        qd.apply(m, method, num_steps=4)
        out = m(x, t, enc).sample
        qd.remove(m)
        again = m(x, t, enc).sample
    assert rel_l2(out, ref) < bound
    assert rel_l2(out, ref) > 0 or method == "exact"
    torch.testing.assert_close(again, ref, rtol=0, atol=0)


def test_sdpa_method_and_cross_attention_routes():
    m = tiny_wan()
    x, enc = wan_inputs()
    t = torch.tensor([900.0])
    with torch.no_grad():
        ref = m(x, t, enc).sample
        qd.apply(m, "sdpa")
        torch.testing.assert_close(m(x, t, enc).sample, ref, rtol=1e-5, atol=1e-6)
        # cross-attention through qvattn too (8 text keys >= min_cross_tokens=1)
        qd.apply(m, "sage8", cross_attention="qvattn", min_cross_tokens=1)
        out = m(x, t, enc).sample
    qd.remove(m)
    assert 0 < rel_l2(out, ref) < 1e-2


# ------------------------------------------------------------------ step counting
def _run_steps(m, timesteps, cfg_passes):
    x, enc = wan_inputs()
    seen = []
    with torch.no_grad():
        for t in timesteps:
            for _ in range(cfg_passes):
                m(x, torch.tensor([t]), enc)
                seen.append(qd.state(m).step)
    return seen


@pytest.mark.parametrize("cfg_passes", [1, 2])
def test_step_counting_with_and_without_cfg(cfg_passes, spy):
    m = tiny_wan()
    qd.apply(m, "vc8+expcast", num_steps=4)
    seen = _run_steps(m, [999.0, 750.0, 500.0, 250.0], cfg_passes)
    assert seen == [s for s in range(4) for _ in range(cfg_passes)]
    # every self-attention call saw its layer id and the step of its forward
    expect = [(layer, s, 4) for s in range(4) for _ in range(cfg_passes) for layer in (0, 1)]
    assert spy == expect
    # under CFG the second pass of a step keeps its own per-layer state
    assert spy.passes == [p for _ in range(4) for p in range(cfg_passes) for _ in (0, 1)]
    # a second run: the timestep goes up again -> step 0, fresh state
    assert _run_steps(m, [999.0, 750.0], cfg_passes)[0] == 0
    assert qd.state(m).state.runs == 2
    qd.remove(m)


def test_two_transformers_share_the_step_and_scheduler_gives_num_steps(spy):
    """Wan2.2 A14B: transformer (high noise) then transformer_2 (low noise)."""
    m1, m2 = tiny_wan(0), tiny_wan(1)
    ts = [999.0, 800.0, 600.0, 400.0, 200.0]
    pipe = types.SimpleNamespace(transformer=m1, transformer_2=m2,
                                 scheduler=types.SimpleNamespace(timesteps=torch.tensor(ts)))
    h = qd.apply(pipe, "vc8+expcast")
    assert qd.layer_ids(pipe)["transformer_2.blocks.0.attn1"] == 2
    assert qd.layer_ids(pipe)["transformer.blocks.0.attn2"] == 4
    x, enc = wan_inputs()
    with torch.no_grad():
        for i, t in enumerate(ts):
            model = m1 if i < 2 else m2
            for _ in range(2):  # CFG
                model(x, torch.tensor([t]), enc)
    assert h.state.num_steps == 5
    layers_by_step = {}
    for layer, step, n in spy:
        assert n == 5
        layers_by_step.setdefault(step, set()).add(layer)
    assert layers_by_step == {0: {0, 1}, 1: {0, 1}, 2: {2, 3}, 3: {2, 3}, 4: {2, 3}}
    qd.set_step(pipe, 3, 5)
    with torch.no_grad():
        m1(x, torch.tensor([999.0]), enc)
    assert h.state.step == 3
    qd.set_step(pipe, None)
    qd.remove(pipe)
    assert qd.state(pipe) is None


def test_unknown_step_count_warns():
    m = tiny_wan()
    qd.apply(m, "vc8")
    x, enc = wan_inputs()
    with warnings.catch_warnings(record=True) as rec, torch.no_grad():
        warnings.simplefilter("always")
        m(x, torch.tensor([900.0]), enc)
    assert any("num_steps" in str(w.message) for w in rec)
    qd.remove(m)


def test_draft_gets_grid_and_warmup():
    m = tiny_wan()
    x, enc = wan_inputs()
    t = torch.tensor([900.0])
    with torch.no_grad():
        qd.apply(m, "bf16")
        dense = m(x, t, enc).sample
        qd.apply(m, "draft@85/0/0/15", num_steps=8)  # warm-up: ceil(0.25*8) = 2 steps
        assert qd.state(m).state.grid is None
        warm = m(x, t, enc).sample
        assert qd.state(m).state.grid == (2, 8, 8)
        qd.set_step(m, 5, 8)
        sparse = m(x, t, enc).sample
    qd.remove(m)
    torch.testing.assert_close(warm, dense, rtol=0, atol=0)
    assert not torch.equal(sparse, dense) and torch.isfinite(sparse).all()


# ------------------------------------------------------------------ HunyuanVideo and masks
def test_hunyuan_text_mask():
    m = tiny_hunyuan()
    args = hunyuan_inputs(valid=(7, 12))
    t = torch.tensor([900.0, 900.0])
    with torch.no_grad():
        ref = m(args[0], t, *args[1:]).sample
        h = qd.apply(m, "exact", num_steps=4)
        # only the joint attention is patched, not the token refiner's
        assert set(h.layer_ids) == {"transformer_blocks.0.attn",
                                    "single_transformer_blocks.0.attn"}
        exact = m(args[0], t, *args[1:]).sample
        qd.apply(m, "vc8+expcast", num_steps=4)
        vc = m(args[0], t, *args[1:]).sample
        qd.apply(m, "draft@85/0/0/15", num_steps=4, draft_warmup=0)
        draft = m(args[0], t, *args[1:]).sample
        qd.remove(m)
    assert rel_l2(exact, ref) < 1e-5
    assert 0 < rel_l2(vc, ref) < 5e-3
    assert torch.isfinite(draft).all()
    # the mask matters: ignoring it would change the output a lot
    m2 = tiny_hunyuan()
    with torch.no_grad():
        full = m2(args[0], t, args[1], torch.ones_like(args[2]), *args[3:]).sample
    assert rel_l2(full, ref) > 1e-3


def test_unsupported_head_dim_raises_or_falls_back():
    m = tiny_wan(head_dim=160)  # qvattn: head dims up to 128
    x, enc = wan_inputs()
    t = torch.tensor([900.0])
    with torch.no_grad():
        ref = m(x, t, enc).sample
        qd.apply(m, "sage8")
        with pytest.raises(ValueError, match="head dim 160"):
            m(x, t, enc)
        qd.apply(m, "sage8", fallback=True)
        ops._warned.clear()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            out = m(x, t, enc).sample
    qd.remove(m)
    assert any(issubclass(w.category, ops.QvattnFallbackWarning) for w in rec)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_bad_arguments():
    m = tiny_wan()
    with pytest.raises(TypeError):
        qd.apply(object())
    with pytest.raises(ValueError, match="unknown method"):
        qd.apply(m, "vc9")
    with pytest.raises(TypeError):
        qd.apply(m, 8)
    with pytest.raises(ValueError):
        qd.apply(m, "sage8", cross_attention="flash")
    with pytest.raises(ValueError):
        qd.apply(m, "sage8", num_steps=0)
    with pytest.raises(ValueError, match="no supported attention"):
        qd.apply(torch.nn.Linear(4, 4), "sage8")
    with pytest.raises(ValueError, match="draft_warmup must be >= 0"):
        qd.apply(m, "draft@85/0/0/15", draft_warmup=-1)
    with pytest.raises(ValueError, match="apply"):
        qd.set_step(m, 1)
    with pytest.raises(TypeError):
        qvattn.capture(m, layers=3)
    assert qd.state(m) is None


# ------------------------------------------------------------------ capture
def _cli():
    lib = _ffi.lib_path
    exe = os.path.join(os.path.dirname(lib), "qvattn")
    return exe if os.path.isfile(exe) and os.access(exe, os.X_OK) else None


def test_capture_wan(tmp_path):
    from diffusers.models.embeddings import apply_rotary_emb
    m = tiny_wan()
    x, enc = wan_inputs()
    seen = {}

    def grab(mod, args, kwargs):  # the input of every forward of this module
        seen.setdefault("calls", []).append(
            (args[0], args[3] if len(args) > 3 else kwargs.get("rotary_emb")))

    hook = m.blocks[1].attn1.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        ref = m(x, torch.tensor([900.0]), enc).sample
        with qvattn.capture(m, layers=[1], steps=[1], path=str(tmp_path), num_steps=3) as cap:
            outs = [m(x, torch.tensor([t]), enc).sample for t in (900.0, 600.0, 600.0, 300.0)]
    hook.remove()
    assert qd.state(m) is None  # capture removed the processors it installed
    torch.testing.assert_close(outs[0], ref, rtol=1e-5, atol=1e-6)  # SDPA: unchanged run
    names = sorted(os.path.basename(f) for f in cap.files)
    assert names == ["layer001-step001-pass0.safetensors",
                     "layer001-step001-pass1.safetensors"]
    tensors, meta = qcapture.load_safetensors(cap.files[0])
    assert set(tensors) == {"q", "k", "v"}
    assert tuple(tensors["q"].shape) == (1, 2, 128, 64)
    assert meta["layer"] == "1" and meta["step"] == "1" and meta["grid"] == "2,8,8"
    # q is post-RoPE: recompute it from the module's input at that step
    attn = m.blocks[1].attn1
    hs, rope = seen["calls"][2]  # ref forward, step 0, then step 1 pass 0
    with torch.no_grad():
        q = attn.norm_q(attn.to_q(hs)).unflatten(2, (2, -1))
        cos, sin = (r[0, :, 0, :] for r in rope)
        q = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1,
                             sequence_dim=1)
    torch.testing.assert_close(tensors["q"], q.transpose(1, 2), rtol=1e-6, atol=1e-6)
    cli = _cli()
    if cli:
        r = subprocess.run([cli, "eval", "--input", cap.files[0], "--methods", "sage8"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "sage8" in r.stdout


def test_capture_rides_on_apply_and_drops_padding(tmp_path):
    m = tiny_hunyuan()
    args = hunyuan_inputs(valid=(7, 12))
    h = qd.apply(m, "sage8", num_steps=2)
    with torch.no_grad():
        with qvattn.capture(m, layers=[0], steps=[0], path=str(tmp_path), heads=[1]) as cap:
            m(args[0], torch.tensor([900.0, 900.0]), *args[1:])
    assert qd.state(m) is h  # the install stays; only the capture ended
    files = sorted(cap.files)
    assert [os.path.basename(f) for f in files] == [
        "layer000-step000-pass0-b0.safetensors", "layer000-step000-pass0-b1.safetensors"]
    t0, meta0 = qcapture.load_safetensors(files[0])
    t1, _ = qcapture.load_safetensors(files[1])
    assert tuple(t0["k"].shape) == (1, 1, 128 + 7, 64)  # padded text dropped
    assert tuple(t1["k"].shape) == (1, 1, 128 + 12, 64)
    assert meta0["prefix"] == "7" and meta0["prefix_at_end"] == "1"
    qd.remove(m)


def test_safetensors_roundtrip(tmp_path):
    p = str(tmp_path / "x.safetensors")
    ts = {"q": torch.randn(1, 2, 3, 4).to(torch.bfloat16), "k": torch.randn(2, 5),
          "v": torch.randn(3).half()}
    qcapture.save_safetensors(p, ts, {"a": 1})
    back, meta = qcapture.load_safetensors(p)
    assert meta == {"a": "1"}
    for k, t in ts.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t)
    st = pytest.importorskip("safetensors.torch")
    other = st.load_file(p)
    assert all(torch.equal(other[k], ts[k]) for k in ts)


# ------------------------------------------------------------------ CUDA (H200)
from _torch_util import cuda_ok  # noqa: E402


@pytest.mark.skipif(not cuda_ok("sage8"), reason="no CUDA device / CUDA build")
@pytest.mark.parametrize("method", ["sage8", "vc8+expcast"])
def test_cuda_wan_close_to_sdpa_and_graph(method):
    """Tiny Wan (head dim 128, bf16) on the GPU: close to the SDPA run, and a
    CUDA graph of a whole forward (pinned step) replays the eager output."""
    if not cuda_ok(method):
        pytest.skip(f"cuda backend lacks {method}")
    m = tiny_wan(head_dim=128).cuda().to(torch.bfloat16)
    x, enc = (a.cuda().to(torch.bfloat16) for a in wan_inputs())
    t = torch.tensor([900.0], device="cuda")
    with torch.no_grad():
        ref = m(x, t, enc).sample.float()
        qd.apply(m, method, num_steps=8)
        out = m(x, t, enc).sample.float()
        assert rel_l2(out, ref) < 2e-2
        for step in (0, 1, 5):  # group, reuse, plain
            qd.set_step(m, step, 8)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):  # warm-up: workspace, per-layer state
                    eager = m(x, t, enc).sample.clone()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                captured = m(x, t, enc).sample
            g.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(captured, eager, rtol=0, atol=0)
    qd.remove(m)


@pytest.mark.skipif(not cuda_ok("vc8+expcast"), reason="no CUDA device / CUDA build")
def test_cuda_hunyuan_mask_and_cfg_steps(spy):
    m = tiny_hunyuan().cuda().to(torch.bfloat16)
    args = [a.cuda() for a in hunyuan_inputs(valid=(7, 12))]
    args[0], args[1], args[3] = (args[i].to(torch.bfloat16) for i in (0, 1, 3))
    with torch.no_grad():
        ref = m(args[0], torch.tensor([900.0, 900.0], device="cuda"), *args[1:]).sample
        qd.apply(m, "vc8+expcast", num_steps=3)
        outs = {}
        for t in (900.0, 600.0, 300.0):
            for _ in range(2):
                outs[t] = m(args[0], torch.tensor([t, t], device="cuda"), *args[1:]).sample
    qd.remove(m)
    assert sorted({c[1] for c in spy}) == [0, 1, 2]
    out = outs[900.0]  # the step whose timestep the SDPA reference used
    assert all(torch.isfinite(o).all() for o in outs.values())
    assert rel_l2(out.float(), ref.float()) < 5e-2


def test_regional_compile_no_recompiles_per_step():
    """Blocks compiled with fullgraph: one graph per block for all steps,
    outputs bitwise equal to eager."""
    from torch._dynamo.utils import counters
    x, enc = wan_inputs()
    # diffusers' own blocks first: where they do not compile with fullgraph
    # on this torch (seen with diffusers 0.42.1 on torch 2.11: a lazy import
    # in its attention dispatch), there is nothing of qvattn's to test
    plain = tiny_wan()
    for b in plain.blocks:
        b.compile(backend="aot_eager", fullgraph=True)
    try:
        with torch.no_grad():
            plain(x, torch.tensor([999.0]), enc)
    except torch._dynamo.exc.Unsupported as e:
        pytest.skip(f"diffusers' own blocks do not compile with fullgraph here: "
                    f"{str(e).splitlines()[0]}")
    torch._dynamo.reset()
    counters.clear()
    m = tiny_wan()
    ts = (999.0, 700.0, 400.0, 100.0)
    qd.apply(m, "vc8+expcast", num_steps=4)
    with torch.no_grad():
        ref = [m(x, torch.tensor([t]), enc).sample for t in ts]
        for b in m.blocks:
            b.compile(backend="aot_eager", fullgraph=True)
        out = [m(x, torch.tensor([t]), enc).sample for t in ts]
    qd.remove(m)
    assert counters["stats"]["unique_graphs"] == 2
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
