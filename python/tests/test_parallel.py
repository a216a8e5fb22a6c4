"""qvattn inside the engines' own sequence parallelism (qvattn.parallel).

2- and 4-process torch.distributed worlds on gloo (CPU), started once per
module (_parallel_worker.spawn): yunchang's LongContextAttention (Ulysses,
ring, hybrid) and UlyssesAttention, diffusers' templated context-parallel
attention (dispatch_attention_fn with a ParallelConfig: Ulysses, ring,
unified) and a tiny Wan under enable_parallelism, all over qvattn's CPU
reference.  Checked here, in the test process:

* Ulysses: each rank's output equals its shard of the single-process call,
  bit for bit (every method; V-Smooth and draft state per rank, per head);
* ring: the engine's merge equals the FP64 merge of the per-chunk
  (out, lse) it was given within 1e-6 relative, and the unsplit call within
  the method's own bound; V-Smooth keys its state per ring step; draft is
  refused with its reason;
* hybrid / unified: within the method's bound of the unsplit call.

xDiT (xfuser) enables its sequence parallelism only with CUDA: its test of
USP skips on the CPU and ran on the GPU machine (bench/RESULTS.md); its
attention-function hook is tested here without parallelism.
"""
import importlib.util

import pytest

from _torch_util import qvattn, rel_l2, torch  # noqa: F401  (skips without torch)
import _parallel_worker as W
from qvattn import _ffi, parallel

HAVE_YUNCHANG = importlib.util.find_spec("yunchang") is not None
HAVE_DIFFUSERS = importlib.util.find_spec("diffusers") is not None
HAVE_XFUSER = importlib.util.find_spec("xfuser") is not None
# xfuser 0.7.0 turns its sequence parallelism on only where CUDA is
# available (envs.check_long_ctx_attn; usp.py imports yunchang's process
# groups under the same condition); the tensors stay on the CPU, on gloo
XDIT_WHY = ("xfuser 0.7.0 enables sequence parallelism only where "
            "torch.cuda.is_available() (envs.check_long_ctx_attn, usp.PROCESS_GROUP): "
            "this test runs on a machine with a GPU")
XDIT_RUNS = HAVE_XFUSER and HAVE_YUNCHANG and torch.cuda.is_available()

# each method's bound against float64 (test_torch_ops.BOUNDS; sage4/vc4:
# NVFP4, measured 0.08-0.09 on these inputs)
BOUND = {"exact": 1e-6, "bf16": 1e-2, "fp8": 1.5e-1, "sage8": 6e-2,
         "vc8+expcast": 6e-2, "sage4": 1.5e-1, "vc4": 1.5e-1}


def _scenarios(world):
    names = []
    if HAVE_YUNCHANG:
        names += (["yunchang_ulysses", "yunchang_ulysses_class", "yunchang_ring"]
                  if world == 2 else ["yunchang_hybrid"])
    if HAVE_DIFFUSERS:
        names += (["diffusers_ulysses", "diffusers_ring", "diffusers_model_ulysses",
                   "diffusers_model_ring"] if world == 2 else ["diffusers_unified"])
    if XDIT_RUNS and world == 2:
        names += ["xdit_ulysses", "xdit_ring"]
    return names


def _run(world, tmp_path_factory):
    names = _scenarios(world)
    if not names:
        pytest.skip("neither yunchang nor diffusers is installed")
    return W.spawn(world, names, str(tmp_path_factory.mktemp(f"world{world}")))


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    return _run(2, tmp_path_factory)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    return _run(4, tmp_path_factory)


def _results(world, name, engine):
    if engine == "yunchang" and not HAVE_YUNCHANG:
        pytest.skip("yunchang is not installed (pip install yunchang)")
    if engine == "diffusers" and not HAVE_DIFFUSERS:
        pytest.skip("diffusers is not installed")
    if engine == "xdit":
        if not (HAVE_XFUSER and HAVE_YUNCHANG):
            pytest.skip("xfuser (and yunchang) not installed (pip install xfuser)")
        if not XDIT_RUNS:
            pytest.skip(XDIT_WHY)
    per = world[name]
    for r, x in enumerate(per):
        assert not isinstance(x, str), f"{name}, rank {r}:\n{x}"
    return per


# ------------------------------------------------------------------ references
def _single(method, step=None, seed=0, ctx=None):
    """The single-process call on the whole [B, S, H, D] tensors."""
    q, k, v = W.qkv(seed)
    kw = {}
    if step is not None:
        kw = dict(layer=W.LAYER, step=step, num_steps=W.NUM_STEPS, ctx=ctx)
        if method.startswith("draft"):
            kw["grid"] = W.GRID
    return qvattn.attention(q, k, v, method=method, layout="NHD", **kw)


def _exact64(seed=0):
    q, k, v = (x.double() for x in W.qkv(seed))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / W.D ** 0.5
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v)


def _refs(methods, seed=0):
    """{(method, step): whole output}: stateful methods over STEPS on a
    fresh context, as a rank's process runs them."""
    out = {}
    for m in methods:
        if m in W.STATEFUL or m.startswith("draft"):
            ctx = qvattn.Context()
            for st in W.STEPS:
                out[(m, st)] = _single(m, st, seed, ctx)
        else:
            out[(m, None)] = _single(m, None, seed)
    return out


def _gather(per, key, world):
    return torch.cat([per[r][key]["out"] for r in range(world)], dim=1)


# ------------------------------------------------------------------ yunchang
def test_yunchang_ulysses_bitwise(world2):
    """Ulysses (degree 2): every method, each rank's shard of the output is
    the single-process call's, bit for bit -- V-Smooth (vc8, vc4) and draft
    over a grouping and a reuse step with their state in each rank's own
    context."""
    per = _results(world2, "yunchang_ulysses", "yunchang")
    assert per[0]["groups"] == (2, 1)
    for (m, st), ref in _refs(W.DENSE + W.STATEFUL + [W.DRAFT]).items():
        for r in range(2):
            res = per[r][(m, st)]
            assert "error" not in res, (m, st, res)
            torch.testing.assert_close(res["out"], W.shard(ref, r, 2), rtol=0, atol=0,
                                       msg=f"{m} step {st} rank {r}")
            assert [c[0] for c in res["calls"]] == [None]  # one call, not a ring step


def test_yunchang_ulysses_attention_class(world2):
    """UlyssesAttention (no processor argument: attn_fn set) likewise."""
    per = _results(world2, "yunchang_ulysses_class", "yunchang")
    for (m, st), ref in _refs(["sage8", "vc8+expcast"]).items():
        for r in range(2):
            torch.testing.assert_close(per[r][(m, st)]["out"], W.shard(ref, r, 2),
                                       rtol=0, atol=0)


def _ring_checks(per, world, methods, seed=0, ring_out="ring_out", layout="NHD"):
    """layout: of the per-chunk outputs the engine handed qvattn (the
    results' "out" is [B, S, H, D])."""
    exact = _exact64(seed)
    refs = _refs(methods, seed)
    worst = {}
    for (m, st), ref in refs.items():
        full = _gather(per, (m, st), world)
        assert rel_l2(full, ref) < BOUND[m], (m, st, rel_l2(full, ref))
        assert rel_l2(full, exact) < BOUND[m], (m, st, rel_l2(full, exact))
        for r in range(world):
            res = per[r][(m, st)]
            steps = [c[0] for c in res["calls"]]
            assert steps == list(range(world)), (m, steps)
            o, lse = parallel.merge_partials([c[1] for c in res["calls"]],
                                             [c[2] for c in res["calls"]], layout)
            if layout == "HND":
                o = o.transpose(1, 2)
            got = res[ring_out] if ring_out else res["out"]
            err = rel_l2(got, o)
            worst[m] = max(worst.get(m, 0.0), err)
            assert err < 1e-6, (m, st, r, err)
            if m in W.STATEFUL:  # state keyed per ring step
                assert sorted(set(res["layers"])) == [
                    parallel.ring_layer_key(W.LAYER, i) for i in range(world)]
            else:
                assert set(res["layers"]) == {_ffi.QVA_LAYER_NONE}
    return worst


def test_yunchang_ring_merge_exact(world2):
    """Ring (degree 2): yunchang's merge of qvattn's per-chunk (out, lse)
    equals their FP64 merge within 1e-6 relative, and the unsplit call
    within the method's bound; vc8/vc4 key their state per ring step."""
    per = _results(world2, "yunchang_ring", "yunchang")
    assert per[0]["groups"] == (1, 2)
    _ring_checks(per, 2, W.DENSE + W.STATEFUL)


def test_yunchang_ring_refuses_draft(world2):
    per = _results(world2, "yunchang_ring", "yunchang")
    for r in range(2):
        err = per[r][(W.DRAFT, 0)]["error"]
        assert err.startswith("QvaUnsupportedError") and "draft under ring" in err, err


def test_yunchang_hybrid(world4):
    """Ulysses 2 x ring 2 on 4 processes: the ring merges exactly (1e-6 vs
    FP64) and the output is within the method's bound of the unsplit call."""
    per = _results(world4, "yunchang_hybrid", "yunchang")
    assert per[0]["groups"] == (2, 2)
    methods = ["exact", "sage8", "vc8+expcast"]
    exact = _exact64()
    for (m, st), ref in _refs(methods).items():
        full = _gather(per, (m, st), 4)
        assert rel_l2(full, ref) < BOUND[m] and rel_l2(full, exact) < BOUND[m], m
        for r in range(4):
            res = per[r][(m, st)]
            assert [c[0] for c in res["calls"]] == [0, 1]
            o, _ = parallel.merge_partials([c[1] for c in res["calls"]],
                                           [c[2] for c in res["calls"]], "NHD")
            assert rel_l2(res["ring_out"], o) < 1e-6


# ------------------------------------------------------------------ diffusers
def test_diffusers_ulysses_bitwise(world2):
    """diffusers' templated Ulysses attention (dispatch_attention_fn,
    backend "qvattn", a ParallelConfig of 2 ranks): bit for bit the
    single-process call."""
    per = _results(world2, "diffusers_ulysses", "diffusers")
    for m in ("exact", "sage8", "fp8"):
        ref = _single(m, seed=1)
        for r in range(2):
            assert "error" not in per[r][m], per[r][m]
            torch.testing.assert_close(per[r][m]["out"], W.shard(ref, r, 2), rtol=0, atol=0)


def test_diffusers_ring_merge_exact(world2):
    """diffusers' templated ring attention: its merge equals the FP64 merge
    of qvattn's per-chunk results (1e-6) and the unsplit call within the
    method's bound; draft is refused."""
    per = _results(world2, "diffusers_ring", "diffusers")
    exact = _exact64(1)
    for m in ("exact", "sage8", "sage4"):
        full = torch.cat([per[r][m]["out"] for r in range(2)], dim=1)
        assert rel_l2(full, _single(m, seed=1)) < BOUND[m]
        assert rel_l2(full, exact) < BOUND[m]
        for r in range(2):
            res = per[r][m]
            assert [c[0] for c in res["calls"]] == [0, 1]
            o, _ = parallel.merge_partials([c[1] for c in res["calls"]],
                                           [c[2] for c in res["calls"]], "NHD")
            assert rel_l2(res["out"], o) < 1e-6, (m, rel_l2(res["out"], o))
    # the backend without apply() runs with fallback=True: draft under ring
    # warns (QvattnFallbackWarning) and runs torch's exact attention
    for r in range(2):
        assert rel_l2(per[r][W.DRAFT]["out"], W.shard(exact, r, 2)) < 1e-6


def test_diffusers_unified(world4):
    """Ulysses 2 x ring 2 (diffusers' unified attention) on 4 processes."""
    per = _results(world4, "diffusers_unified", "diffusers")
    exact = _exact64(1)
    for m in ("exact", "sage8"):
        full = torch.cat([per[r][m]["out"] for r in range(4)], dim=1)
        assert rel_l2(full, _single(m, seed=1)) < BOUND[m]
        assert rel_l2(full, exact) < BOUND[m]
        for r in range(4):
            assert [c[0] for c in per[r][m]["calls"]] == [0, 1]


def _wan_single(method):
    import qvattn.diffusers as qd
    m = W._tiny_wan()
    qd.apply(m, method, num_steps=W.NUM_STEPS)
    x, ctx = W.wan_inputs()
    with torch.no_grad():
        return [m(hidden_states=x, timestep=torch.tensor([t]), encoder_hidden_states=ctx,
                  return_dict=False)[0] for t in (900, 800)]


def test_diffusers_model_ulysses(world2):
    """A tiny Wan under enable_parallelism(ContextParallelConfig(
    ulysses_degree=2)) after qvattn.diffusers.apply(): qvattn runs the
    self-attention of both layers (layer ids 0, 1) through diffusers' own
    Ulysses code, over a V-Smooth grouping and reuse step; the output is the
    single-process model's (the rest of the model runs on sequence shards:
    float32 GEMMs on other row counts, hence a tolerance)."""
    pytest.importorskip("transformers", reason="diffusers 0.42.1's context-parallel hook "
                        "needs Logger.warning_once, which transformers provides")
    per = _results(world2, "diffusers_model_ulysses", "diffusers")
    ref = _wan_single("vc8+expcast")
    for r in range(2):
        res = per[r]["vc8+expcast"]
        assert res["rings"] == [None] * 4 and res["layers"] == [0, 1, 0, 1]
        for o, want in zip(res["outs"], ref):
            assert rel_l2(o, want) < 1e-5


def test_diffusers_model_ring(world2):
    """The same model under ring_degree=2: qvattn per ring step, V-Smooth
    state keyed per (layer, ring step), within vc8's bound."""
    pytest.importorskip("transformers", reason="diffusers 0.42.1's context-parallel hook "
                        "needs Logger.warning_once, which transformers provides")
    per = _results(world2, "diffusers_model_ring", "diffusers")
    ref = _wan_single("vc8+expcast")
    for r in range(2):
        res = per[r]["vc8+expcast"]
        assert res["rings"] == [0, 1] * 4
        keys = [parallel.ring_layer_key(lay, i) for lay in (0, 1) for i in (0, 1)]
        assert res["layers"] == keys * 2
        for o, want in zip(res["outs"], ref):
            assert rel_l2(o, want) < BOUND["vc8+expcast"]
        err = per[r][W.DRAFT]["error"]  # apply(draft) under ring: refused
        assert err.startswith("QvaUnsupportedError") and "draft under ring" in err, err


# ------------------------------------------------------------------ no processes
def test_ring_layer_key_and_merge():
    assert parallel.ring_layer_key(5, 0) == 5
    assert parallel.ring_layer_key(5, 3) == 5 | 3 << 10
    with pytest.raises(ValueError):
        parallel.ring_layer_key(1024, 0)
    with pytest.raises(ValueError):
        parallel.ring_layer_key(0, 64)
    # merging the two halves of the keys gives the whole call (FP64 exact)
    q, k, v = W.qkv()
    parts = [parallel.attend(q, k[:, s], v[:, s], method="exact", layout="NHD",
                             ring_step=i)
             for i, s in enumerate((slice(0, 200), slice(200, None)))]
    o, lse = parallel.merge_partials([p[0] for p in parts], [p[1] for p in parts], "NHD")
    whole, lse1 = qvattn.attention(q, k, v, method="exact", layout="NHD", return_lse=True)
    assert rel_l2(o, whole) < 1e-6 and rel_l2(lse, lse1) < 1e-6
    # a chunk no key survives in (lse -inf) adds nothing
    o2, lse2 = parallel.merge_partials(
        [parts[0][0], torch.zeros_like(parts[0][0])],
        [parts[0][1], torch.full_like(parts[0][1], float("-inf"))], "NHD")
    torch.testing.assert_close(o2, parts[0][0].double(), rtol=0, atol=0)


def test_attend_refuses_draft_under_ring_and_falls_back():
    q, k, v = W.qkv()
    with pytest.raises(_ffi.QvaUnsupportedError, match="draft under ring"):
        parallel.attend(q, k, v, method=W.DRAFT, layout="NHD", ring_step=0, grid=W.GRID)
    with pytest.warns(qvattn.ops.QvattnFallbackWarning, match="draft under ring"):
        out, lse = parallel.attend(q, k, v, method=W.DRAFT, layout="NHD", ring_step=0,
                                   fallback=True)
    assert rel_l2(out, _exact64()) < 1e-6 and lse.shape == (W.B, W.H, W.S)
    assert parallel.is_ring_capable("vc4") == (True, "")
    # under Ulysses draft runs
    out, lse = parallel.attend(q, k, v, method=W.DRAFT, layout="NHD", grid=W.GRID)
    assert out.shape == q.shape


def test_traffic_model():
    # Wan2.2-720p, 8-way Ulysses, bf16: 4 all-to-alls of 7/8 of a 1/8 shard
    b = parallel.all_to_all_bytes(1, 75600, 40, 128, 8)
    assert b == 4 * (75600 // 8) * 40 * 128 * 2 * 7 // 8
    assert parallel.ring_bytes(1, 75600, 40, 128, 1) == 0
    assert parallel.link_seconds(450e9, 450) == pytest.approx(1.0)


# ------------------------------------------------------------------ xDiT
def test_xdit_hook_without_parallelism():
    """xDiT's attention-function registry: register_xdit adds a QVATTN
    member to xfuser's AttentionBackendType and its function to
    ATTENTION_FUNCTION_REGISTRY; xfuser's own attention() (the call USP
    makes on each rank) runs qvattn.  [B, H, S, D] in, (out, lse) from the
    function."""
    pytest.importorskip("xfuser", reason="xfuser is not installed (pip install xfuser)")
    from xfuser.core.distributed import attention_backend as ab
    from xfuser.model_executor.layers import usp
    member = parallel.register_xdit(method="sage8")
    assert ab.AttentionBackendType["QVATTN"] is member
    assert ab.ATTENTION_FUNCTION_REGISTRY[member].method == "sage8"
    q, k, v = (x.transpose(1, 2).contiguous() for x in W.qkv())
    out = usp.attention(q, k, v, backend=member)
    torch.testing.assert_close(out, qvattn.attention(q, k, v, method="sage8"), rtol=0, atol=0)
    o, lse = ab.ATTENTION_FUNCTION_REGISTRY[member](
        q, k, v, 0.0, False, attention_kwargs={"qvattn_method": "exact"})
    assert lse.shape == (W.B, W.H, W.S) and rel_l2(o, _exact64().transpose(1, 2)) < 1e-6
    assert parallel.register_xdit(method="sage8") is member  # idempotent


def test_xdit_usp_ulysses_bitwise(world2):
    """xDiT's USP, Ulysses degree 2 (its all-to-alls, torch functional
    collectives), over XditAttention: bit for bit the single-process call,
    V-Smooth over a grouping and a reuse step with its state per rank."""
    per = _results(world2, "xdit_ulysses", "xdit")
    for (m, st), ref in _refs(["exact", "sage8", "vc8+expcast"]).items():
        for r in range(2):
            res = per[r][(m, st)]
            assert "error" not in res, res
            torch.testing.assert_close(res["out"], W.shard(ref, r, 2), rtol=0, atol=0)
            assert [c[0] for c in res["calls"]] == [None]


def test_xdit_usp_ring(world2):
    """xDiT's USP, ring degree 2 (torch's templated ring attention merges
    the LSEs): within 1e-6 of the FP64 merge of the per-chunk results and the
    method's bound of the unsplit call; V-Smooth keyed per ring step; draft
    refused."""
    per = _results(world2, "xdit_ring", "xdit")
    _ring_checks(per, 2, ["exact", "sage8", "vc8+expcast"], ring_out=None, layout="HND")
    for r in range(2):
        err = per[r][(W.DRAFT, None)]["error"]
        assert err.startswith("QvaUnsupportedError") and "draft under ring" in err, err


# ------------------------------------------------------------------ the benchmark
def test_multi_gpu_bench_tiny(tmp_path):
    """bench/multi_gpu.py --simulate --tiny --device cpu: the ranks of a
    simulated world in turn; Ulysses bit for bit the one-device call, ring
    within sage8's bound, draft refused under ring."""
    import importlib.util
    import json
    import os
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    spec = importlib.util.spec_from_file_location(
        "multi_gpu", os.path.join(root, "bench", "multi_gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--simulate", "--tiny", "--device", "cpu", "--worlds", "2",
                     "--modes", "ulysses,ring", "--methods", "sage8,draft@85/0/0/15",
                     "--iters", "1", "--warmup", "0", "--out", str(tmp_path)]) == 0
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[0].endswith("-tiny.json")
    rows = {(r["method"], r["mode"], r["world"]): r
            for r in json.load(open(tmp_path / files[0]))["rows"]}
    assert rows[("sage8", "ulysses", 2)]["bitwise"]
    assert rows[("draft@85/0/0/15", "ulysses", 2)]["bitwise"]
    assert rows[("sage8", "ring", 2)]["rel_l2_vs_one_gpu"] < BOUND["sage8"]
    assert "draft under ring" in rows[("draft@85/0/0/15", "ring", 2)]["error"]
    r = rows[("sage8", "ulysses", 2)]
    assert r["all_to_all_bytes"] == parallel.all_to_all_bytes(1, 512, 4, 64, 2, 4)
    assert len(r["rank_ms"]) == 2 and r["scaling"] > 0
