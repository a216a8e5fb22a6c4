"""Multi-GPU attention through the sequence-parallel engines: per-GPU time and scaling.

qvattn is the attention an engine (yunchang, xDiT, diffusers) calls on each
rank (qvattn.parallel, docs/PYTHON.md "Multi-GPU"); this measures one
attention layer at Wan2.2-720p -- q, k, v [B, S, H, D] = (1, 75600, 40, 128)
in bf16 -- split over a world of ranks, against the same call on one GPU.

Two ways to run it:

* ``--simulate`` (one process, one device): the world's ranks run one after
  another on the one device, each with its own qvattn context, exactly the
  calls the engines make -- Ulysses: one call on the whole sequence of the
  rank's H/P heads; ring: one call per ring step on the rank's query chunk
  and one K/V chunk, merged with yunchang's LSE merge (qvattn.parallel's
  FP64 one without yunchang); hybrid u x r: both.  Reported per world and
  mode: each rank's attention time, the slowest rank against the one-GPU
  call (scaling), and the bytes a rank sends (Ulysses: 4 all-to-alls of
  (P-1)/P of its shard; ring: its K/V chunk P-1 hops) with their time at
  ``--link-gbps`` (default 450 GB/s: one direction of an H200's NVLink,
  900 GB/s bidirectional).
* under ``torchrun --nproc-per-node P`` (NCCL on GPUs, gloo on the CPU):
  the engine's own code (``--engine yunchang|diffusers|xdit``) around qvattn,
  timed per GPU with CUDA events around the engine call (all-to-alls and
  ring included), against the one-GPU call measured on rank 0; plus a bare
  NCCL all-to-all of one shard, timed, for the communication share.

Methods run stateful as in a denoising run: untimed calls at step 0 (the
V-Smooth grouping), then the timed calls at ``--step`` of ``--num-steps``
(default 12 of 40: a plain vc8 step, a sparse draft step).  Draft under
ring is refused by qvattn (the cell says so).  ``--tiny`` is
(1, 512, 4, 64) with the grid 2 x 16 x 16, for the CPU
(``--tiny --device cpu``).

    python bench/multi_gpu.py --simulate                     # H200, one GPU
    python bench/multi_gpu.py --simulate --tiny --device cpu # seconds
    torchrun --nproc-per-node 2 bench/multi_gpu.py --engine yunchang --modes ulysses,ring

Raw JSON + markdown go to --out, else $OUT, else bench/out/ (ignored by
git) as multi_gpu-<UTC>-<device>.{json,md}; curated figures go into
bench/RESULTS.md.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import OUT_HELP, git_rev, out_dir, use_checkout_package  # noqa: E402

WAN720 = dict(B=1, S=75600, H=40, D=128, grid=(21, 45, 80))
TINY = dict(B=1, S=512, H=4, D=64, grid=(2, 16, 16))
DEFAULT_METHODS = "sage8,vc8+expcast,draft@85/0/0/15"


def torch_equal(a, b):
    import torch
    return torch.equal(a, b)


def log(*a):
    print("multi_gpu:", *a, file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulate", action="store_true",
                   help="one process, one device: the ranks run one after another")
    p.add_argument("--engine", choices=("yunchang", "diffusers", "xdit"), default="yunchang",
                   help="under torchrun: the engine whose sequence parallelism runs qvattn")
    p.add_argument("--tiny", action="store_true", help="(1, 512, 4, 64): CPU smoke test")
    p.add_argument("--shape", default=None, help="B,S,H,D (default Wan2.2-720p 1,75600,40,128)")
    p.add_argument("--grid", default=None, help="T,H,W of the latent grid (draft)")
    p.add_argument("--methods", default=DEFAULT_METHODS)
    p.add_argument("--worlds", default="2,4,8", help="simulated world sizes")
    p.add_argument("--modes", default="ulysses,ring,hybrid",
                   help="ulysses, ring, hybrid (Ulysses 2 x ring P/2)")
    p.add_argument("--num-steps", type=int, default=40)
    p.add_argument("--step", type=int, default=12, help="the timed denoising step")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) or float32")
    p.add_argument("--link-gbps", type=float, default=450.0,
                   help="per-direction link bandwidth for the communication estimate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=float, default=540.0)
    p.add_argument("--out", metavar="DIR", default=None, help=OUT_HELP)
    a = p.parse_args(argv)
    base = dict(TINY if a.tiny else WAN720)
    if a.shape:
        base.update(zip("BSHD", (int(x) for x in a.shape.split(","))))
    if a.grid:
        base["grid"] = tuple(int(x) for x in a.grid.split(","))
    a.cfg = base
    a.method_list = [m for m in a.methods.split(",") if m]
    a.world_list = [int(w) for w in a.worlds.split(",") if w]
    a.mode_list = [m for m in a.modes.split(",") if m]
    return a


class Bench:
    def __init__(self, args):
        use_checkout_package()
        import torch
        import qvattn
        from qvattn import parallel
        self.torch, self.qvattn, self.parallel = torch, qvattn, parallel
        self.args = args
        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev == "cuda":
            dev = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        self.device = torch.device(dev)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.dtype = getattr(torch, args.dtype) if args.dtype else (
            torch.bfloat16 if self.cuda else torch.float32)
        self.t0 = time.time()
        self.on_row = None
        c = args.cfg
        self.B, self.S, self.H, self.D, self.grid = c["B"], c["S"], c["H"], c["D"], c["grid"]

    # -- data and timing
    def qkv(self):
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(self.args.seed)
        shape = (self.B, self.S, self.H, self.D)
        out = []
        for i in range(3):  # made on the CPU in float32 (same on every rank)
            x = torch.randn(shape, generator=g)
            if i == 1:
                x += 0.5  # a common key offset, as in DiT keys
            out.append(x.to(self.device, self.dtype))
        return out

    def timed(self, fn):
        """(median ms, all ms, last result) of fn() over --iters after --warmup."""
        torch = self.torch
        res, times = None, []
        for _ in range(self.args.warmup):
            res = fn()
        for _ in range(self.args.iters):
            if self.cuda:
                a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                a.record()
                res = fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                res = fn()
                times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times), times, res

    def call_kw(self, method, ctx):
        """A stateful call at --step (draft: with the grid)."""
        kw = dict(method=method, layer=0, step=self.args.step, num_steps=self.args.num_steps,
                  ctx=ctx, layout="NHD")
        if method.startswith("draft"):
            kw["grid"] = self.grid
        return kw

    def prime(self, q, k, v, method, ctx, ring_step=None):
        """The untimed step-0 call (V-Smooth groups there; later steps reuse)."""
        kw = self.call_kw(method, ctx)
        kw["step"] = 0
        self.parallel.attend(q, k, v, ring_step=ring_step, **kw)

    def one_gpu(self, q, k, v, method):
        """(median ms, output) of the whole call on one device."""
        ctx = self.qvattn.Context(self.qvattn._ffi.QVA_DEVICE_CUDA if self.cuda else 0)
        self.prime(q, k, v, method, ctx)
        kw = self.call_kw(method, ctx)
        ms, times, out = self.timed(lambda: self.parallel.attend(q, k, v, **kw)[0])
        ctx.close()
        return ms, out

    @staticmethod
    def compare(got, ref):
        """rel-L2 of got against ref (float32 sums) and whether equal bit for bit."""
        d = (got.float() - ref.float()).norm() / ref.float().norm()
        return float(d), bool(torch_equal(got, ref))

    def merge(self):
        """The ring's LSE merge: yunchang's (what its ring runs), else ours."""
        try:
            from yunchang.ring.utils import update_out_and_lse
        except ImportError:
            update_out_and_lse = None

        def merge(parts):
            if update_out_and_lse is None:
                o, _ = self.parallel.merge_partials([p[0] for p in parts],
                                                    [p[1] for p in parts], "NHD")
                return o
            out = lse = None
            for o, lse_i in parts:
                out, lse = update_out_and_lse(out, lse, o, lse_i)
            return out
        merge.kind = "yunchang.update_out_and_lse" if update_out_and_lse else \
            "qvattn.parallel.merge_partials (fp64)"
        return merge

    # -- simulation
    def simulate(self):
        a = self.args
        torch = self.torch
        q, k, v = self.qkv()
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        merge = self.merge()
        rows = []
        for method in a.method_list:
            if time.time() - self.t0 > a.time_limit_s:
                log("time limit reached: stopping")
                break
            t1, ref = self.one_gpu(q, k, v, method)
            log(f"{method}: one GPU {t1:.2f} ms")
            rows.append(dict(method=method, mode="one GPU", world=1, one_gpu_ms=t1,
                             rank_ms=[t1], max_ms=t1, mean_ms=t1, scaling=1.0,
                             efficiency=1.0, comm_bytes=0, comm_ms=0.0))
            for world in a.world_list:
                for mode in a.mode_list:
                    if mode == "hybrid" and (world < 4 or world % 2):
                        continue
                    row = self.sim_case(q, k, v, method, mode, world, t1, itemsize, merge,
                                        ref)
                    rows.append(row)
                    if self.on_row is not None:  # rewritten after each case
                        self.on_row(dict(rows=rows, merge=merge.kind))
                    log(f"{method} {mode} x{world}: " + (
                        row["error"] if "error" in row else
                        f"max {row['max_ms']:.2f} ms, scaling {row['scaling']:.2f}, "
                        f"comm {row['comm_ms']:.2f} ms"))
        return dict(rows=rows, merge=merge.kind)

    def sim_case(self, q, k, v, method, mode, world, t1, itemsize, merge, ref):
        torch, parallel = self.torch, self.parallel
        uly = {"ulysses": world, "ring": 1, "hybrid": 2}[mode]
        ring = world // uly
        if self.H % uly or self.S % world:
            return dict(method=method, mode=mode, world=world,
                        error=f"H={self.H} or S={self.S} not divisible")
        ok, why = parallel.is_ring_capable(method)
        if ring > 1 and not ok:
            return dict(method=method, mode=mode, world=world, error="refused: " + why[:60])
        hs, ss = self.H // uly, self.S // ring
        ranks = []
        merge_err = None
        full = torch.empty_like(ref)
        for u in range(uly):
            for r in range(ring):
                # what the rank holds after Ulysses' all-to-all: heads u, all of
                # its ring group's sequence chunk r (chunks of K/V by ring step)
                sl_h = slice(u * hs, (u + 1) * hs)
                ql = q[:, r * ss:(r + 1) * ss, sl_h].contiguous()
                kv = [(k[:, j * ss:(j + 1) * ss, sl_h].contiguous(),
                       v[:, j * ss:(j + 1) * ss, sl_h].contiguous()) for j in range(ring)]
                order = [(r - i) % ring for i in range(ring)]  # yunchang's ring order
                ctx = self.qvattn.Context(self.qvattn._ffi.QVA_DEVICE_CUDA if self.cuda else 0)
                rs = None if ring == 1 else 0
                for i, j in enumerate(order):
                    self.prime(ql, kv[j][0], kv[j][1], method, ctx,
                               None if ring == 1 else i)
                kw = self.call_kw(method, ctx)

                def run(ql=ql, kv=kv, order=order, kw=kw, rs=rs):
                    if rs is None:
                        return parallel.attend(ql, kv[0][0], kv[0][1], **kw)[0]
                    return merge([parallel.attend(ql, kv[j][0], kv[j][1], ring_step=i, **kw)
                                  for i, j in enumerate(order)])
                ms, _, out = self.timed(run)
                full[:, r * ss:(r + 1) * ss, sl_h] = out
                ranks.append(ms)
                if rs is not None and u == 0 and r == 0:
                    # the engine's merge against the FP64 merge of the same parts
                    parts = [parallel.attend(ql, kv[j][0], kv[j][1], ring_step=i, **kw)
                             for i, j in enumerate(order)]
                    m64, _ = parallel.merge_partials([p[0] for p in parts],
                                                     [p[1] for p in parts], "NHD")
                    merge_err, _ = self.compare(merge(parts), m64)
                    del parts, m64
                ctx.close()
                del ql, kv
        # Ulysses: its group spans ss tokens (S / ring), P = uly
        comm = parallel.all_to_all_bytes(self.B, ss, self.H, self.D, uly, itemsize)
        rbytes = parallel.ring_bytes(self.B, self.S, hs, self.D, ring, itemsize)
        comm_ms = parallel.link_seconds(comm, self.args.link_gbps) * 1e3
        ring_ms = parallel.link_seconds(rbytes, self.args.link_gbps) * 1e3
        mx = max(ranks)
        err, same = self.compare(full, ref)
        return dict(method=method, mode=mode, world=world, ulysses=uly, ring=ring,
                    rel_l2_vs_one_gpu=err, bitwise=same, merge_rel_l2_vs_fp64=merge_err,
                    one_gpu_ms=t1, rank_ms=ranks, max_ms=mx, mean_ms=statistics.mean(ranks),
                    imbalance=mx / statistics.mean(ranks), scaling=t1 / mx,
                    efficiency=t1 / mx / world, comm_bytes=comm + rbytes,
                    all_to_all_bytes=comm, ring_bytes=rbytes, comm_ms=comm_ms + ring_ms,
                    all_to_all_ms=comm_ms, ring_p2p_ms=ring_ms,
                    comm_over_attention=(comm_ms + ring_ms) / mx)

    # -- the engines under torchrun
    def distributed(self):
        import torch.distributed as dist
        torch, a = self.torch, self.args
        dist.init_process_group("nccl" if self.cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        q, k, v = self.qkv()
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        rows = []
        for method in a.method_list:
            t1 = ref = None
            if rank == 0:
                t1, ref = self.one_gpu(q, k, v, method)
                log(f"{method}: one GPU {t1:.2f} ms")
            dist.barrier()
            for mode in a.mode_list:
                uly = {"ulysses": world, "ring": 1, "hybrid": 2}[mode]
                if mode == "hybrid" and (world < 4 or world % 2):
                    continue
                ring = world // uly
                row = dict(method=method, mode=mode, world=world, ulysses=uly, ring=ring,
                           engine=a.engine, one_gpu_ms=t1)
                out = None
                try:
                    fn = self.engine_fn(method, uly, ring, rank, world, q, k, v)
                    ms, _, out = self.timed(fn)
                    err = None
                except Exception as e:  # noqa: BLE001 - reported in the table
                    ms, err = float("nan"), f"{type(e).__name__}: {str(e)[:120]}"
                got = [None] * world
                dist.all_gather_object(got, (ms, err))
                if not any(g[1] for g in got):  # every rank's shard to rank 0
                    parts = [torch.empty_like(out) for _ in range(world)]
                    dist.all_gather(parts, out.contiguous())
                    if rank == 0:
                        row["rel_l2_vs_one_gpu"], row["bitwise"] = self.compare(
                            torch.cat(parts, dim=1), ref)
                    del parts
                if rank == 0:
                    ranks = [g[0] for g in got]
                    errs = [g[1] for g in got if g[1]]
                    if errs:
                        row["error"] = errs[0]
                    else:
                        mx = max(ranks)
                        row.update(rank_ms=ranks, max_ms=mx, mean_ms=statistics.mean(ranks),
                                   scaling=t1 / mx, efficiency=t1 / mx / world)
                    log(f"{method} {mode} x{world} ({a.engine}): " + (
                        row.get("error") or f"max {row['max_ms']:.2f} ms, "
                        f"scaling {row['scaling']:.2f}"))
                    rows.append(row)
        # the communication alone: one Ulysses all-to-all of a q shard
        shard = q[:, : self.S // world].reshape(-1)
        shard = shard[: shard.numel() // world * world].contiguous()
        buf = torch.empty_like(shard)
        ms_a2a, _, _ = self.timed(lambda: dist.all_to_all_single(buf, shard))
        got = [None] * world
        dist.all_gather_object(got, ms_a2a)
        res = dict(rows=rows, all_to_all_ms=got, all_to_all_bytes=shard.numel() * itemsize,
                   rank=rank)
        dist.barrier()
        dist.destroy_process_group()
        return res if rank == 0 else None

    def engine_fn(self, method, uly, ring, rank, world, q, k, v):
        """The engine's attention on this rank's sequence shard."""
        parallel, a = self.parallel, self.args
        ss = self.S // world
        ql, kl, vl = (x[:, rank * ss:(rank + 1) * ss].contiguous() for x in (q, k, v))
        kw = dict(layer=0, num_steps=a.num_steps)
        if method.startswith("draft"):
            kw["grid"] = self.grid
        if a.engine == "yunchang":
            import yunchang
            yunchang.set_seq_parallel_pg(uly, ring, rank, world)
            proc = parallel.YunchangAttention(method, step=0, **kw)
            attn = parallel.yunchang_long_context(proc)
            attn(ql, kl, vl)  # the grouping step
            proc.step = a.step
            return lambda: attn(ql, kl, vl)
        if a.engine == "diffusers":
            import qvattn.diffusers as qd
            from diffusers.models._modeling_parallel import (ContextParallelConfig,
                                                             ParallelConfig)
            from diffusers.models.attention_dispatch import dispatch_attention_fn
            from torch.distributed.device_mesh import init_device_mesh
            pc = ParallelConfig(context_parallel_config=ContextParallelConfig(
                ring_degree=ring, ulysses_degree=uly))
            mesh = init_device_mesh(self.device.type, (ring, uly),
                                    mesh_dim_names=("ring", "ulysses"))
            pc.setup(rank, world, self.device, mesh=mesh)
            # the backend without apply() runs BACKEND_METHOD, stateless and
            # without a latent grid (draft runs through apply() on a model)
            if method.startswith("draft"):
                raise ValueError("draft needs qvattn.diffusers.apply() (the latent grid); "
                                 "the bench calls the backend without it")
            qd.BACKEND_METHOD = method
            return lambda: dispatch_attention_fn(ql, kl, vl, backend=qd.BACKEND,
                                                 parallel_config=pc)
        return self.xdit_fn(method, uly, ring, rank, world, ql, kl, vl, kw)

    def xdit_fn(self, method, uly, ring, rank, world, ql, kl, vl, kw):
        """xDiT's USP.  Its parallel state is set up once per process (xfuser
        keeps it global): the first (method, mode) fixes the degrees."""
        parallel = self.parallel
        from xfuser.config.args import xFuserArgs
        from xfuser.core.distributed import parallel_state as ps
        from xfuser.core.distributed import runtime_state as rs
        from xfuser.model_executor.layers import usp
        if getattr(self, "_xdit_degrees", None) is None:
            ps.init_distributed_environment(rank=rank, world_size=world)
            ps.initialize_model_parallel(sequence_parallel_degree=world,
                                         ulysses_degree=uly, ring_degree=ring)
            cfg, _ = xFuserArgs(model="qvattn-bench", ulysses_degree=uly,
                                ring_degree=ring).create_config()
            # xDiT builds its runtime state from a pipeline; without one it
            # takes defaults of one rank (ExternalRuntimeState), so the state
            # is made from this run's config
            rt = rs.ExternalRuntimeState.__new__(rs.ExternalRuntimeState)
            rs.RuntimeState.__init__(rt, cfg)
            rs._RUNTIME = rt
            self._xdit_degrees = (uly, ring)
        if self._xdit_degrees != (uly, ring):
            raise RuntimeError("xDiT's parallel state is per process: one mode per run "
                               f"(this run has Ulysses x ring = {self._xdit_degrees})")
        fn = parallel.XditAttention(method, step=0, **kw)
        member = parallel.register_xdit(fn)
        qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (ql, kl, vl))
        usp.USP(qh, kh, vh, backend=member)  # the grouping step
        fn.step = self.args.step
        return lambda: usp.USP(qh, kh, vh, backend=member).transpose(1, 2)

    # -- output
    def meta(self):
        torch = self.torch
        return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), commit=git_rev(), device=str(self.device),
            device_name=torch.cuda.get_device_name(self.device) if self.cuda else
            platform.processor() or platform.machine(), dtype=str(self.dtype),
            shape=dict(B=self.B, S=self.S, H=self.H, D=self.D), grid=self.grid,
            simulate=self.args.simulate, engine=None if self.args.simulate else
            self.args.engine, link_gbps=self.args.link_gbps, step=self.args.step,
            num_steps=self.args.num_steps, iters=self.args.iters, torch=torch.__version__)


def markdown(res):
    m = res["meta"]
    lines = [f"# multi_gpu {m['date']} {m['device_name']} ({m['dtype']})", "",
             f"q, k, v [B, S, H, D] = ({m['shape']['B']}, {m['shape']['S']}, "
             f"{m['shape']['H']}, {m['shape']['D']}), grid {tuple(m['grid'])}; "
             f"step {m['step']} of {m['num_steps']}; "
             + ("simulated world (ranks in turn on one device), ring merge: "
                f"{res.get('merge')}; links at {m['link_gbps']:.0f} GB/s"
                if m["simulate"] else f"engine {m['engine']} under torchrun"), "",
             "| method | mode | P | one GPU ms | per-rank ms (max / mean) | max/mean | "
             "scaling | efficiency | comm MB/rank | comm ms (est) | comm / attn | "
             "rel-L2 vs one GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['mode']} | {r['world']} | | {r['error']} "
                         "| | | | | | | |")
            continue
        mb = r.get("comm_bytes")
        lines.append(
            f"| {r['method']} | {r['mode']} | {r['world']} | {r['one_gpu_ms']:.2f} | "
            f"{r['max_ms']:.2f} / {r['mean_ms']:.2f} | {r['max_ms'] / r['mean_ms']:.3f} | "
            f"{r['scaling']:.2f} | {r['efficiency']:.2f} | "
            + (f"{mb / 1e6:.1f} | {r['comm_ms']:.2f} | {r['comm_ms'] / r['max_ms']:.2f} |"
               if mb is not None else " | | |")
            + (" |" if "rel_l2_vs_one_gpu" not in r else
               " bitwise |" if r["bitwise"] else f" {r['rel_l2_vs_one_gpu']:.1e}"
               + ("" if r.get("merge_rel_l2_vs_fp64") is None else
                  f" (merge vs FP64: {r['merge_rel_l2_vs_fp64']:.1e})") + " |"))
    if res.get("all_to_all_ms"):
        lines += ["", f"Measured all-to-all of one q shard ({res['all_to_all_bytes'] / 1e6:.1f}"
                  f" MB per rank): " + ", ".join(f"{x:.2f}" for x in res["all_to_all_ms"])
                  + " ms per rank"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    b = Bench(args)
    import torch
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = "tiny" if args.tiny else ("sim" if args.simulate else args.engine)
    base = os.path.join(out_dir(args.out), f"multi_gpu-{stamp}-{b.device.type}-{tag}")

    def write(res):
        res["meta"] = b.meta()
        with open(base + ".json", "w") as f:
            json.dump(res, f, indent=1)
        md = markdown(res)
        with open(base + ".md", "w") as f:
            f.write(md)
        return md

    b.on_row = write
    with torch.inference_mode():
        res = b.simulate() if args.simulate else b.distributed()
    if res is None:  # not rank 0
        return 0
    print(write(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
