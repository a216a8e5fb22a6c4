"""Worker processes of test_parallel.py: the engines' own sequence-parallel
code (yunchang, diffusers) over qvattn's CPU reference, on gloo.

``spawn(world, scenarios, outdir)`` starts `world` processes once
(torch.multiprocessing, one CPU thread each); every process runs the named
scenarios in order and saves what it saw to ``outdir/<scenario>-<rank>.pt``
(or the error to ``<scenario>-<rank>.err``); the test process compares
against single-process qvattn calls.  Inputs are made from seeds, the same
in every process.
"""
import os
import socket
import traceback

import torch
import torch.distributed as dist

B, H, S, D = 1, 4, 512, 64
GRID = (2, 16, 16)                    # T*H*W = S: draft's latent grid
DRAFT = "draft@50/0/0/50"
DENSE = ["exact", "bf16", "fp8", "sage8", "sage4"]
STATEFUL = ["vc8+expcast", "vc4"]     # V-Smooth: run with a layer over steps
NUM_STEPS = 4
STEPS = (0, 1)                         # a grouping and a reuse step of 4
LAYER = 3


def qkv(seed=0, dtype=torch.float32):
    """Global [B, S, H, D] q, k, v (yunchang's and diffusers' layout)."""
    g = torch.Generator().manual_seed(seed)
    q = 2.0 * torch.randn(B, S, H, D, generator=g)
    k = torch.randn(B, S, H, D, generator=g) + 0.5
    v = torch.randn(B, S, H, D, generator=g) + torch.randn(B, 1, H, D, generator=g)
    return tuple(x.to(dtype) for x in (q, k, v))


def shard(x, rank, world):
    """The sequence shard of a rank: chunk `rank` of `world` (yunchang's
    basic_extract_local; diffusers splits the same way)."""
    return x.chunk(world, dim=1)[rank].contiguous()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ recording
class Recorder:
    """Wraps qvattn.parallel.attend: every per-rank call's (ring_step,
    cfg layer key, out, lse)."""

    def __init__(self):
        from qvattn import ops, parallel
        self.calls = []
        self.layers = []
        self._attend = parallel.attend
        self._config_for = ops._config_for
        rec = self

        def attend(*a, **kw):
            out, lse = rec._attend(*a, **kw)
            rec.calls.append((kw.get("ring_step"), out.clone(), lse.clone()))
            return out, lse

        def config_for(*a, **kw):
            cfg = rec._config_for(*a, **kw)
            rec.layers.append(int(cfg.layer))
            return cfg

        parallel.attend = attend
        ops._config_for = config_for

    def close(self):
        from qvattn import ops, parallel
        parallel.attend = self._attend
        ops._config_for = self._config_for

    def take(self):
        calls, layers = self.calls, self.layers
        self.calls, self.layers = [], []
        return calls, layers


# ------------------------------------------------------------------ yunchang
def _yunchang_run(rank, world, uly, ring, methods, ulysses_class=False):
    import yunchang
    from yunchang.globals import PROCESS_GROUP
    import qvattn
    from qvattn import parallel
    yunchang.set_seq_parallel_pg(uly, ring, rank, world)
    q, k, v = qkv()
    ql, kl, vl = (shard(x, rank, world) for x in (q, k, v))
    res = {}
    rec = Recorder()
    try:
        for method in methods:
            stateful = method in STATEFUL or method.startswith("draft")
            steps = STEPS if stateful else (None,)
            # its own context, as the single-process reference (the state of
            # layer LAYER belongs to one method)
            kw = dict(layer=LAYER, num_steps=NUM_STEPS, ctx=qvattn.Context()) \
                if stateful else {}
            if method.startswith("draft"):
                kw["grid"] = GRID
            proc = parallel.YunchangAttention(method, **kw)
            if ulysses_class:
                attn = parallel.yunchang_ulysses(proc)
                ring_out = None
            else:
                attn = parallel.yunchang_long_context(proc)
                inner = attn.ring_attn_fn
                ring_out = []

                def ring_fn(*a, _inner=inner, _keep=ring_out, **kw2):
                    o = _inner(*a, **kw2)
                    _keep.append((o[0] if isinstance(o, tuple) else o).clone())
                    return o
                attn.ring_attn_fn = ring_fn
            for st in steps:
                proc.step = st
                try:
                    out = attn(ql, kl, vl)
                except Exception as e:  # noqa: BLE001 - reported to the test
                    res[(method, st)] = {"error": f"{type(e).__name__}: {e}"}
                    rec.take()
                    continue
                calls, layers = rec.take()
                res[(method, st)] = {"out": out, "calls": calls, "layers": layers,
                                     "ring_out": ring_out.pop() if ring_out else None}
        res["groups"] = (dist.get_world_size(PROCESS_GROUP.ULYSSES_PG),
                         dist.get_world_size(PROCESS_GROUP.RING_PG))
    finally:
        rec.close()
    return res


def yunchang_ulysses(rank, world):
    return _yunchang_run(rank, world, world, 1, DENSE + STATEFUL + [DRAFT])


def yunchang_ulysses_class(rank, world):
    return _yunchang_run(rank, world, world, 1, ["sage8", "vc8+expcast"],
                         ulysses_class=True)


def yunchang_ring(rank, world):
    return _yunchang_run(rank, world, 1, world, DENSE + STATEFUL + [DRAFT])


def yunchang_hybrid(rank, world):
    return _yunchang_run(rank, world, 2, world // 2, ["exact", "sage8", "vc8+expcast"])


# ------------------------------------------------------------------ diffusers
def _cp_config(rank, world, ring, uly):
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh
    cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=uly)
    pc = ParallelConfig(context_parallel_config=cp)
    mesh = init_device_mesh("cpu", (ring, uly), mesh_dim_names=("ring", "ulysses"))
    pc.setup(rank, world, torch.device("cpu"), mesh=mesh)
    return pc


def _diffusers_dispatch(rank, world, ring, uly, methods):
    """diffusers' dispatch_attention_fn with backend "qvattn" and a
    ParallelConfig: its templated Ulysses / ring / unified attention around
    qvattn (the backend without apply(): BACKEND_METHOD, stateless), and
    through apply()'s processors (below, on a model)."""
    import qvattn.diffusers as qd
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    pc = _cp_config(rank, world, ring, uly)
    q, k, v = qkv(seed=1)
    ql, kl, vl = (shard(x, rank, world) for x in (q, k, v))
    res = {}
    rec = Recorder()
    try:
        for method in methods:
            old = qd.BACKEND_METHOD
            qd.BACKEND_METHOD = method
            try:
                out = dispatch_attention_fn(ql, kl, vl, backend=qd.BACKEND,
                                            parallel_config=pc)
                calls, layers = rec.take()
                res[method] = {"out": out, "calls": calls, "layers": layers}
            except Exception as e:  # noqa: BLE001
                rec.take()
                res[method] = {"error": f"{type(e).__name__}: {e}"}
            finally:
                qd.BACKEND_METHOD = old
    finally:
        rec.close()
    return res


def diffusers_ulysses(rank, world):
    return _diffusers_dispatch(rank, world, 1, world, ["exact", "sage8", "fp8"])


def diffusers_ring(rank, world):
    return _diffusers_dispatch(rank, world, world, 1, ["exact", "sage8", "sage4", DRAFT])


def diffusers_unified(rank, world):
    return _diffusers_dispatch(rank, world, 2, world // 2, ["exact", "sage8"])


def _tiny_wan():
    from diffusers import WanTransformer3DModel
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
        in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
        num_layers=2, rope_max_seq_len=64).eval().requires_grad_(False)


def wan_inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, 4, 2, 16, 16, generator=g), torch.randn(1, 8, 32, generator=g)


def _diffusers_model(rank, world, ring, uly, method):
    """A tiny random Wan with qvattn.diffusers.apply() and diffusers'
    enable_parallelism(ContextParallelConfig): the model's own cp_plan
    splits and gathers the sequence; 2 steps of 4 (vc8: group, reuse)."""
    import qvattn.diffusers as qd
    # diffusers 0.42.1's context-parallel hook logs with Logger.warning_once,
    # which only transformers' logging module adds; a video pipeline always
    # imports it (its text encoder), so the test does too
    import transformers.utils.logging  # noqa: F401
    from diffusers.models._modeling_parallel import ContextParallelConfig
    m = _tiny_wan()
    qd.apply(m, method, num_steps=NUM_STEPS)
    # diffusers 0.42.1 places the rank on device rank % accelerator count,
    # which is 0 on a machine without an accelerator: one "device", the CPU
    count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda *a: 1
    try:
        m.enable_parallelism(config=ContextParallelConfig(ring_degree=ring,
                                                          ulysses_degree=uly))
    finally:
        torch.accelerator.device_count = count
    x, ctx = wan_inputs()
    rec = Recorder()
    outs = []
    try:
        with torch.no_grad():
            for t in (900, 800):
                outs.append(m(hidden_states=x, timestep=torch.tensor([t]),
                              encoder_hidden_states=ctx, return_dict=False)[0])
        calls, layers = rec.take()
    finally:
        rec.close()
    return {"outs": outs, "rings": [c[0] for c in calls], "layers": layers}


def diffusers_model_ulysses(rank, world):
    return {m: _diffusers_model(rank, world, 1, world, m) for m in ("vc8+expcast",)}


def diffusers_model_ring(rank, world):
    res = {m: _diffusers_model(rank, world, world, 1, m) for m in ("vc8+expcast",)}
    try:
        _diffusers_model(rank, world, world, 1, DRAFT)
        res[DRAFT] = {"error": None}
    except Exception as e:  # noqa: BLE001
        res[DRAFT] = {"error": f"{type(e).__name__}: {e}"}
    return res


# ------------------------------------------------------------------ xDiT
def _xdit_setup(rank, world, uly, ring):
    """xDiT's parallel state on the gloo world (CPU tensors).  xfuser 0.7.0
    turns sequence parallelism on only where torch.cuda.is_available()
    (the caller skips otherwise); every rank binds a visible GPU, the
    groups are gloo.  xDiT builds its runtime state from a pipeline; without
    one it takes one-rank defaults, so it is made from this run's config."""
    from xfuser.config.args import xFuserArgs
    from xfuser.core.distributed import parallel_state as ps
    from xfuser.core.distributed import runtime_state as rs
    ps.init_distributed_environment(rank=rank, world_size=world,
                                    local_rank=rank % torch.cuda.device_count(),
                                    backend="gloo")
    ps.initialize_model_parallel(sequence_parallel_degree=world, ulysses_degree=uly,
                                 ring_degree=ring, backend="gloo")
    cfg, _ = xFuserArgs(model="qvattn-test", ulysses_degree=uly,
                        ring_degree=ring).create_config()
    rt = rs.ExternalRuntimeState.__new__(rs.ExternalRuntimeState)
    rs.RuntimeState.__init__(rt, cfg)
    rs._RUNTIME = rt


def _xdit(rank, world, uly, ring, methods):
    from qvattn import parallel
    from xfuser.model_executor.layers import usp
    _xdit_setup(rank, world, uly, ring)
    q, k, v = (shard(x, rank, world).transpose(1, 2).contiguous() for x in qkv())
    res = {}
    rec = Recorder()
    try:
        for method in methods:
            stateful = method in STATEFUL
            fn = parallel.XditAttention(
                method, **(dict(layer=LAYER, num_steps=NUM_STEPS, ctx=qvattn_context())
                           if stateful else {}))
            member = parallel.register_xdit(fn)
            for st in STEPS if stateful else (None,):
                fn.step = st
                try:
                    out = usp.USP(q, k, v, backend=member).transpose(1, 2)
                    calls, layers = rec.take()
                    res[(method, st)] = {"out": out, "calls": calls, "layers": layers}
                except Exception as e:  # noqa: BLE001
                    rec.take()
                    res[(method, st)] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        rec.close()
        from xfuser.core.distributed import parallel_state as ps
        from xfuser.core.distributed import runtime_state as rs
        ps.destroy_model_parallel()  # xfuser keeps one parallel state per process
        rs._RUNTIME = None
    return res


def qvattn_context():
    import qvattn
    return qvattn.Context()


def xdit_ulysses(rank, world):
    return _xdit(rank, world, world, 1, ["exact", "sage8", "vc8+expcast"])


def xdit_ring(rank, world):
    return _xdit(rank, world, 1, world, ["exact", "sage8", "vc8+expcast", DRAFT])


SCENARIOS = {f.__name__: f for f in (
    yunchang_ulysses, yunchang_ulysses_class, yunchang_ring, yunchang_hybrid,
    diffusers_ulysses, diffusers_ring, diffusers_unified, diffusers_model_ulysses,
    diffusers_model_ring, xdit_ulysses, xdit_ring)}


# ------------------------------------------------------------------ processes
def _main(rank, world, port, outdir, names):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name in names:
            path = os.path.join(outdir, f"{name}-{rank}")
            try:
                res = SCENARIOS[name](rank, world)
                torch.save(res, path + ".pt")
            except Exception:  # noqa: BLE001 - the test reads and reports it
                with open(path + ".err", "w") as f:
                    f.write(traceback.format_exc())
            dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world, names, outdir):
    """Runs the scenarios `names` in `world` processes; returns
    {name: [per-rank result or error text]}."""
    import torch.multiprocessing as mp
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
    os.environ["OMP_NUM_THREADS"] = "1"  # the library's OpenMP, one core each
    try:
        mp.spawn(_main, args=(world, free_port(), outdir, list(names)), nprocs=world)
    finally:
        for k, val in env.items():
            if val is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = val
    out = {}
    for name in names:
        per = []
        for r in range(world):
            p = os.path.join(outdir, f"{name}-{r}")
            if os.path.exists(p + ".pt"):
                per.append(torch.load(p + ".pt", weights_only=False))
            elif os.path.exists(p + ".err"):
                with open(p + ".err") as f:
                    per.append(f.read())
            else:
                per.append("no result")
        out[name] = per
    return out
