"""qvattn.diffusers on a tiny random-weight transformer of every video model
it supports (CPU, about a second each): Wan2.1 T2V and I2V, Wan2.2 TI2V,
Wan-VACE, SkyReels-V2, HunyuanVideo, HunyuanVideo-1.5, CogVideoX (1.0 and
1.5), Mochi, LTX-Video.  Per model: qvattn ran on exactly the
self-attention layers ("exact" matches diffusers' output, sage8 is close
but not equal), the latent grid and text prefix reach draft, and remove()
restores diffusers' output bit for bit.  Then diffusers'
set_attention_backend / reset_attention_backend after apply(), a replaced
processor, and the "qvattn" backend without apply().  Skips without torch
or diffusers.
"""
import warnings

import pytest

from _torch_util import need_diffusers, ops, rel_l2, torch

need_diffusers()
import diffusers  # noqa: E402
from diffusers.models import attention_dispatch as ad  # noqa: E402

import qvattn.diffusers as qd  # noqa: E402
from qvattn import _ffi  # noqa: E402


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


def _tiny(cls, **kw):
    torch.manual_seed(0)
    return getattr(diffusers, cls)(**kw).eval().requires_grad_(False)


_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
            out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
            rope_max_seq_len=64)


def _video_inputs(**extra):  # a [1, 4, 2, 16, 16] latent, 8 text tokens
    g = _gen()
    return dict(hidden_states=torch.randn(1, 4, 2, 16, 16, generator=g),
                timestep=torch.tensor([900.0]),
                encoder_hidden_states=torch.randn(1, 8, 32, generator=g), **extra)


def _text_mask(n, *valid):  # [B, n]: the first valid[b] tokens of element b
    m = torch.zeros(len(valid), n, dtype=torch.long)
    for b, v in enumerate(valid):
        m[b, :v] = 1
    return m


def wan_t2v():
    return _tiny("WanTransformer3DModel", in_channels=4, **_WAN), _video_inputs()


def wan_i2v():  # image keys in the cross-attention (added K/V projections)
    g = _gen()
    return (_tiny("WanTransformer3DModel", in_channels=8, image_dim=16,
                  added_kv_proj_dim=128, **_WAN),
            dict(hidden_states=torch.randn(1, 8, 2, 16, 16, generator=g),
                 timestep=torch.tensor([900.0]),
                 encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                 encoder_hidden_states_image=torch.randn(1, 5, 16, generator=g)))


def wan22_ti2v():  # per-token timesteps, the conditioning frame at 0
    kw = _video_inputs()
    kw["timestep"] = torch.full((1, 128), 900.0)
    kw["timestep"][:, :64] = 0.0
    return _tiny("WanTransformer3DModel", in_channels=4, **_WAN), kw


def wan_vace():
    kw = _video_inputs(control_hidden_states=torch.randn(1, 8, 2, 16, 16, generator=_gen(2)))
    return (_tiny("WanVACETransformer3DModel", in_channels=4, vace_layers=[0],
                  vace_in_channels=8, **_WAN), kw)


def skyreels_v2():
    return _tiny("SkyReelsV2Transformer3DModel", in_channels=4, **_WAN), _video_inputs()


def hunyuan_video():  # [video, text] joint attention, padded text masked
    g = _gen()
    return (_tiny("HunyuanVideoTransformer3DModel", in_channels=4, out_channels=4,
                  num_attention_heads=2, attention_head_dim=64, num_layers=1,
                  num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1,
                  text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(16, 24, 24),
                  guidance_embeds=True),
            dict(hidden_states=torch.randn(2, 4, 2, 16, 16, generator=g),
                 timestep=torch.tensor([900.0, 900.0]),
                 encoder_hidden_states=torch.randn(2, 12, 32, generator=g),
                 encoder_attention_mask=_text_mask(12, 7, 12),
                 pooled_projections=torch.randn(2, 16, generator=g),
                 guidance=torch.full((2,), 6000.0)))


def hunyuan_video_15():  # its mask is [B,1,N,N]: padded text tokens
    g = _gen()
    return (_tiny("HunyuanVideo15Transformer3DModel", in_channels=4, out_channels=4,
                  num_attention_heads=2, attention_head_dim=64, num_layers=2,
                  num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=32,
                  text_embed_2_dim=16, image_embed_dim=16, rope_axes_dim=(16, 24, 24)),
            dict(hidden_states=torch.randn(2, 4, 2, 8, 8, generator=g),
                 timestep=torch.tensor([900.0, 900.0]),
                 encoder_hidden_states=torch.randn(2, 12, 32, generator=g),
                 encoder_attention_mask=_text_mask(12, 7, 12),
                 encoder_hidden_states_2=torch.randn(2, 6, 16, generator=g),
                 encoder_attention_mask_2=_text_mask(6, 4, 4), image_embeds=torch.zeros(2, 5, 16)))


_COG = dict(num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
            time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=16,
            sample_height=16, sample_frames=5, patch_size=2, max_text_seq_length=8)


def cogvideox():  # [text, video]; its processor calls torch SDPA itself
    g = _gen()
    return (_tiny("CogVideoXTransformer3DModel", **_COG),
            dict(hidden_states=torch.randn(1, 2, 4, 16, 16, generator=g),
                 encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                 timestep=torch.tensor([900])))


def cogvideox_15():  # temporal patches of 2, RoPE
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    g = _gen()
    rope = get_3d_rotary_pos_embed(embed_dim=64, crops_coords=None, grid_size=(8, 8),
                                   temporal_size=2, grid_type="slice", max_size=(8, 8))
    return (_tiny("CogVideoXTransformer3DModel", patch_size_t=2, ofs_embed_dim=32,
                  use_rotary_positional_embeddings=True, **_COG),
            dict(hidden_states=torch.randn(1, 4, 4, 16, 16, generator=g),
                 encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                 timestep=torch.tensor([900]), ofs=torch.tensor([2.0]),
                 image_rotary_emb=rope))


def mochi():  # [video, valid text] per batch element, through torch SDPA
    g = _gen()
    return (_tiny("MochiTransformer3DModel", patch_size=2, num_attention_heads=2,
                  attention_head_dim=64, num_layers=2, pooled_projection_dim=16,
                  in_channels=4, text_embed_dim=32, time_embed_dim=16,
                  max_sequence_length=8),
            dict(hidden_states=torch.randn(2, 4, 2, 16, 16, generator=g),
                 encoder_hidden_states=torch.randn(2, 8, 32, generator=g),
                 timestep=torch.tensor([900.0, 900.0]),
                 encoder_attention_mask=_text_mask(8, 5, 8)))


def ltx_video():  # packed tokens; attn2 is cross-attention with a text mask
    g = _gen()
    return (_tiny("LTXVideoTransformer3DModel", in_channels=4, out_channels=4,
                  num_attention_heads=2, attention_head_dim=64, cross_attention_dim=128,
                  num_layers=2, caption_channels=32),
            dict(hidden_states=torch.randn(1, 2 * 8 * 8, 4, generator=g),
                 encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                 timestep=torch.tensor([900.0]), encoder_attention_mask=_text_mask(8, 6),
                 num_frames=2, height=8, width=8))


# name -> (factory, self-attention layer ids, cross-attention layer ids, grid)
MODELS = {
    "wan2.1-t2v": (wan_t2v, [0, 1], [2, 3], (2, 8, 8)),
    "wan2.1-i2v": (wan_i2v, [0, 1], [2, 3], (2, 8, 8)),
    "wan2.2-ti2v": (wan22_ti2v, [0, 1], [2, 3], (2, 8, 8)),
    "wan-vace": (wan_vace, [0, 1, 2], [3, 4, 5], (2, 8, 8)),
    "skyreels-v2": (skyreels_v2, [0, 1], [2, 3], (2, 8, 8)),
    "hunyuanvideo": (hunyuan_video, [0, 1], [], (2, 8, 8)),
    "hunyuanvideo-1.5": (hunyuan_video_15, [0, 1], [], (2, 8, 8)),
    "cogvideox": (cogvideox, [0, 1], [], (2, 8, 8)),
    "cogvideox-1.5": (cogvideox_15, [0, 1], [], (2, 8, 8)),
    "mochi": (mochi, [0, 1], [], (2, 8, 8)),
    "ltx-video": (ltx_video, [0, 1], [2, 3], (2, 8, 8)),
}


@pytest.fixture(autouse=True)
def _restore_active_backend():
    """set_attention_backend also sets diffusers' process-wide active
    backend: put it back after each test."""
    active = ad._AttentionBackendRegistry._active_backend
    yield
    ad._AttentionBackendRegistry._active_backend = active


def _run(m, kw):
    with torch.no_grad():
        return m(**kw).sample


@pytest.mark.parametrize("name", list(MODELS))
def test_model_runs_qvattn_on_its_self_attention(name, spy):
    make, selfs, crosses, grid = MODELS[name]
    m, kw = make()
    ref = _run(m, kw)
    h = qd.apply(m, "exact", num_steps=2)
    assert sorted(h.layer_ids.values()) == selfs + crosses
    assert all(isinstance(p.processor, qd.QvattnProcessor)
               for p, _, _ in h.patched)
    exact = _run(m, kw)
    assert h.state.grid == grid
    # qvattn ran every self-attention layer, and no cross-attention layer
    assert sorted({c[0] for c in spy}) == selfs
    assert rel_l2(exact, ref) < 1e-5
    qd.apply(m, "sage8", num_steps=2)
    sage = _run(m, kw)
    assert 0 < rel_l2(sage, ref) < 1e-2
    qd.remove(m)
    torch.testing.assert_close(_run(m, kw), ref, rtol=0, atol=0)
    assert not any(isinstance(getattr(mod, "processor", None), qd.QvattnProcessor)
                   for mod in m.modules())


@pytest.mark.parametrize("name", ["wan2.1-t2v", "hunyuanvideo-1.5", "cogvideox",
                                  "cogvideox-1.5", "mochi", "ltx-video"])
def test_model_draft_gets_grid_and_prefix(name):
    """draft needs the latent grid and the text tokens' place: the library
    rejects a prefix that does not fit (N - T*H*W text tokens)."""
    make = MODELS[name][0]
    m, kw = make()
    ref = _run(m, kw)
    qd.apply(m, "draft@85/0/0/15", num_steps=2, draft_warmup=0)
    out = _run(m, kw)
    qd.remove(m)
    assert torch.isfinite(out).all() and 0 < rel_l2(out, ref) < 0.5


@pytest.mark.parametrize("name", ["wan2.1-i2v", "hunyuanvideo", "cogvideox", "mochi",
                                  "ltx-video"])
def test_set_attention_backend_after_apply(name):
    make = MODELS[name][0]
    m, kw = make()
    ref = _run(m, kw)
    h = qd.apply(m, "sage8", num_steps=2)
    sage = _run(m, kw)
    # another backend: it runs (diffusers' native here = the reference), and
    # qvattn says so once, at the call
    with pytest.warns(qd.QvattnBackendWarning, match="now run diffusers' 'native'"):
        m.set_attention_backend("native")
    with warnings.catch_warnings():
        warnings.simplefilter("error", qd.QvattnBackendWarning)
        torch.testing.assert_close(_run(m, kw), ref, rtol=0, atol=0)
    # reset: the processors follow diffusers' active backend ("native" now)
    with warnings.catch_warnings():
        warnings.simplefilter("error", qd.QvattnBackendWarning)  # said already
        m.reset_attention_backend()
    torch.testing.assert_close(_run(m, kw), ref, rtol=0, atol=0)
    # "qvattn": apply()'s settings again
    m.set_attention_backend(qd.BACKEND)
    torch.testing.assert_close(_run(m, kw), sage, rtol=0, atol=0)
    m.reset_attention_backend()  # the active backend is "qvattn" now: stays
    torch.testing.assert_close(_run(m, kw), sage, rtol=0, atol=0)
    assert qd.state(m) is h
    # one module's own set_attention_backend goes the same way
    module, _, proc = h.patched[0]
    module.set_attention_backend(qd.BACKEND) if hasattr(module, "set_attention_backend") \
        else setattr(proc, "_attention_backend", qd.BACKEND)
    assert proc._active()
    qd.remove(m)
    for mod in m.modules():
        p = getattr(mod, "processor", None)
        assert not isinstance(p, qd.QvattnProcessor)
        assert getattr(p, "_attention_backend", None) is None  # as before apply()
    torch.testing.assert_close(_run(m, kw), ref, rtol=0, atol=0)


def test_skyreels_causal_blocks_raise_or_fall_back():
    """SkyReels-V2 with causal frame blocks (diffusion forcing) passes a
    dense mask: not plain SDPA, so qvattn raises or falls back."""
    m, kw = skyreels_v2()
    m._set_ar_attention(2)  # causal blocks of two frames: a dense bool mask
    kw["hidden_states"] = torch.randn(1, 4, 4, 16, 16, generator=_gen())
    ref = _run(m, kw)
    qd.apply(m, "sage8", num_steps=2)
    with pytest.raises(NotImplementedError, match="dense mask"):
        _run(m, kw)
    qd.apply(m, "sage8", num_steps=2, fallback=True)
    ops._warned.clear()
    with pytest.warns(ops.QvattnFallbackWarning, match="dense mask"):
        out = _run(m, kw)
    qd.remove(m)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_replaced_processor_warns_and_survives_remove():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor
    m, kw = wan_t2v()
    ref = _run(m, kw)
    qd.apply(m, "sage8", num_steps=2)
    mine = WanAttnProcessor()
    m.blocks[0].attn1.set_processor(mine)
    with pytest.warns(qd.QvattnBackendWarning, match=r"replaced \(blocks.0.attn1\)"):
        out = _run(m, kw)
    assert 0 < rel_l2(out, ref) < 1e-2  # block 1 still runs qvattn
    qd.remove(m)
    assert m.blocks[0].attn1.processor is mine
    torch.testing.assert_close(_run(m, kw), ref, rtol=0, atol=0)


def test_backend_without_apply(spy):
    """set_attention_backend("qvattn") alone: BACKEND_METHOD on
    self-attention, stateless; cross-attention stays native."""
    m, kw = wan_t2v()
    ref = _run(m, kw)
    m.set_attention_backend(qd.BACKEND)
    out = _run(m, kw)
    assert 0 < rel_l2(out, ref) < 1e-2
    # 2 self-attention calls, stateless (QVA_LAYER_NONE, as the spy masks it)
    assert len(spy) == 2 and {c[0] for c in spy} == {_ffi.QVA_LAYER_NONE & 0xFFFF}
    assert qd.BACKEND_METHOD == "sage8"
    m.set_attention_backend("native")
    torch.testing.assert_close(_run(m, kw), ref, rtol=0, atol=0)


def test_backend_is_registered_with_diffusers():
    assert qd.BACKEND in {b.value for b in ad.AttentionBackendName}
    assert ad.AttentionBackendName(qd.BACKEND) in ad._AttentionBackendRegistry._backends
    with ad.attention_backend(qd.BACKEND):  # diffusers' context manager takes it
        pass
    # registered as context-parallel capable (Ulysses and ring run qvattn
    # through diffusers' own templated attention: docs/PYTHON.md, Multi-GPU)
    assert ad._AttentionBackendRegistry._is_context_parallel_available(
        ad.AttentionBackendName(qd.BACKEND))
    assert set(qd.supported_processors()) >= {
        "WanAttnProcessor", "HunyuanVideoAttnProcessor2_0", "CogVideoXAttnProcessor2_0",
        "MochiAttnProcessor2_0", "LTXVideoAttnProcessor", "SkyReelsV2AttnProcessor",
        "HunyuanVideo15AttnProcessor2_0"}


def test_fallback_through_the_hook():
    """An unsupported call (head dim 160: above 128, past what zero-padding
    covers) raises, or falls back with a warning: the same rules on the
    SDPA route (CogVideoX)."""
    kw = dict(_COG, attention_head_dim=160)
    m = _tiny("CogVideoXTransformer3DModel", **kw)
    g = _gen()
    args = dict(hidden_states=torch.randn(1, 2, 4, 16, 16, generator=g),
                encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                timestep=torch.tensor([900]))
    ref = _run(m, args)
    qd.apply(m, "sage8")
    with pytest.raises(ValueError, match="head dim 160"):
        _run(m, args)
    qd.apply(m, "sage8", fallback=True)
    ops._warned.clear()
    with pytest.warns(ops.QvattnFallbackWarning):
        out = _run(m, args)
    qd.remove(m)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
