/*
 * Versions of the 8-bit Hopper kernel under trial.  Each is the library's
 * attn8_ws_128x128 (src/cuda/dense/attn8_ws.cuh) with other flags, or a
 * kernel of its own built from the same pieces; the driver (driver.c) runs
 * it through the library's preparation and checks it against the CPU
 * reference.  README.md says how to add one and how to promote it.
 *
 *   ws5   the library kernel without the short softmax chains: the row max
 *         as one chain and the exp2 row sum in one accumulator per row
 *         (measured as fast as the default on sage8, 1% slower on vc8)
 *   ws8   the V-Smooth restore as one FP16 wgmma per 16 key blocks (below;
 *         not yet run)
 */
#include "dense/attn8_ws.cuh"

struct ws5_flags : attn8_ws_flags<QVC_QK_INT8> {
    static constexpr bool SHORT_CHAINS = false;
};

/* The tensor maps and parameters every version launches with. */
static qva_status version_args(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                               CUtensorMap *maps, attn8_params *p) {
    if (fmt != QVC_QK_INT8)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: INT8 QK only (sage8, vc8)");
    const qva_status r = attn8_maps(ops, maps);
    if (r != QVA_OK) return r;
    p->ops = *ops;
    p->a = *a;
    return QVA_OK;
}

template <class F>
static qva_status launch_version(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                                 cudaStream_t st) {
    CUtensorMap maps[3];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    return a->expcast ? attn8_launch<F, 1>(maps, &p, st) : attn8_launch<F, 0>(maps, &p, st);
}

extern "C" qva_status dev_attn8_ws5(const qvc_ops *ops, qvc_qk_format fmt,
                                    const qvc_attn_args *a, cudaStream_t st) {
    return launch_version<ws5_flags>(ops, fmt, a, st);
}

/* ------------------------------------------------------------------ ws8
 * ws8: the V-Smooth restore O += r_j mu_j^T as one FP16 wgmma per 16 key
 * blocks (bench/NOTES.md, "The V-Smooth restore as one FP16 wgmma per 16
 * blocks") instead of 64 FFMA and 16 shared loads per block and thread.
 * Each consumer warpgroup keeps:
 *   - the pending row sums as the m64k16 FP16 A fragment (rows g, g + 8 at
 *     k = 2tig, 2tig+1, 2tig+8, 2tig+9; block j sits at k = j mod 16), in
 *     16 bytes of shared memory private to the thread: in registers, even
 *     4 more of them made ptxas serialize the ExpCast kernel's wgmmas;
 *     each r_j is rounded to FP16 when stored and again after each
 *     rescale (in FP32) when a row max rises;
 *   - its 16 x 128 FP16 tile of the batch's means in shared memory,
 *     K-major without swizzle (8 x 16-byte core matrices: 128 B apart
 *     along k, 256 B along the channels), filled one block at a time from
 *     the stage's FP32 means (already FP16 values: v_mu = fp16(mu / s)).
 * Every 16 blocks and after the last: one wgmma.m64n128k16 into O.  The
 * FP16 roundings change the restore term by about 2^-11 relative per
 * rounding (within the library's tolerances; the reference is unchanged
 * until a promotion defines it).
 * INT8 QK only (sage8, vc8); calls without means run the library kernel.
 * Not yet run on a GPU (written 2026-12-02 without device time left).
 */
#define WS8_MU_TILE 4096 /* 16 blocks x 128 channels x 2 bytes */
#define WS8_MU_OFF(S) ((A8_BAR_OFF(S) + 8 * (1 + 2 * (S)) + 1023) & ~1023)
#define WS8_PH_OFF(S) (WS8_MU_OFF(S) + 2 * WS8_MU_TILE) /* 16 B per consumer thread */
#define WS8_SMEM_BYTES(S) (WS8_PH_OFF(S) + 256 * 16 + 1024)

/* No-swizzle K-major descriptor: LBO (k) 128 B, SBO (n) 256 B. */
static __device__ __forceinline__ uint64_t ws8_mu_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(128 >> 4) << 16) |
           ((uint64_t)(256 >> 4) << 32);
}

/* Byte offset of (channel n, block slot k) in the tile. */
static __device__ __forceinline__ uint32_t ws8_mu_at(int n, int k) {
    return (uint32_t)((((n >> 3) * 2 + (k >> 3)) * 128) + (n & 7) * 16 + (k & 7) * 2);
}

/* O (64x128) += R (64x16, FP16 registers) M (16x128, FP16 smem). */
static __device__ __forceinline__ void ws8_wgmma_mu(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64
        ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : F64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* Block j's row sums into the pending fragment (the owning thread only):
 * ph[2 hi + row] (the A registers a0..a3: hi = k >= 8, row 0 = g, 1 =
 * g + 8) holds k = 2tig (+8) in its low half, 2tig + 1 (+8) in its high
 * half. */
static __device__ __forceinline__ void ws8_pend(uint32_t *ph, const float *rs, int j, int tig) {
    const int k = j & 15, owner = (k & 7) >> 1, hi = k >> 3;
    if (tig != owner) return;
    __half *h = (__half *)(ph + 2 * hi) + (k & 1); /* ph[2hi] row g, ph[2hi+1] row g+8 */
    h[0] = __float2half_rn(rs[0]);
    h[2] = __float2half_rn(rs[1]);
}

/* A row max rose: the pending sums of row r take alpha[r], as O does. */
static __device__ __forceinline__ void ws8_rescale(uint32_t *ph, const float *alpha) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h;
        const uint32_t u = ph[i];
        memcpy(&h, &u, sizeof h);
        float2 f = __half22float2(h);
        h = __floats2half2_rn(f.x * alpha[i & 1], f.y * alpha[i & 1]);
        uint32_t w;
        memcpy(&w, &h, sizeof w);
        ph[i] = w;
    }
}

/* Channel t of block j's means (stage slot, FP32) into the tile. */
static __device__ __forceinline__ void ws8_fill(uint8_t *tile, const float *mu, int j, int t) {
    *(__half *)(tile + ws8_mu_at(t, j & 15)) = __float2half_rn(mu[t]);
}

/* Issue the batch's restore into O; the caller waits with its QK. */
static __device__ __forceinline__ void ws8_flush(attn8_acc &r, uint32_t *ph, uint32_t tile_addr,
                                                 int cw) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync(3 + cw, 128); /* the warpgroup's tile writes are all in */
    const uint4 v = *(const uint4 *)ph;
    const uint32_t a[4] = {v.x, v.y, v.z, v.w};
    wg_fence();
    ws8_wgmma_mu(r.o, a, ws8_mu_desc(tile_addr));
    wg_commit();
    *(uint4 *)ph = make_uint4(0u, 0u, 0u, 0u);
}

/* The library's ping-pong mainloop with the batched restore, as batches of
 * 16 blocks so that the restore's wgmma is issued on every path through
 * the loop (ptxas serializes wgmmas it finds on a conditional one).  Only
 * calls with means come here (dev_attn8_ws8 sends the others to the
 * library kernel). */
template <class F, int EXPCAST>
static __device__ __forceinline__ void ws8_mainloop(
    attn8_acc &r, int (&sacc)[64], const qvc_ops &ops, const qvc_attn_args &a, uint32_t base,
    uint8_t *sm, attn8_bars b, uint64_t qd, const float (&dq)[2], const float *kscale,
    const float *vblk, int cw, int tig) {
    uint32_t *ph = (uint32_t *)(sm + WS8_PH_OFF(F::STAGES) + 16 * (threadIdx.x - 128));
    *(uint4 *)ph = make_uint4(0u, 0u, 0u, 0u);
    if (cw == 1) named_arrive(1, 256);
    for (int j0 = 0; j0 < ops.nblk; j0 += 16) {
        const int j1 = min(j0 + 16, ops.nblk);
        for (int j = j0; j < j1; ++j) {
            const int s = j % F::STAGES, sn = (j + 1) % F::STAGES, more = j + 1 < ops.nblk;
            const float f0 = (dq[0] * kscale[j]) * a.scale_log2, f1 = (dq[1] * kscale[j]) * a.scale_log2;
            const float vb = vblk[j];
            uint32_t pa[4][4];
            float rs[2] = {0.0f, 0.0f};
            float mx[2], alpha[2];
            int_row_max<F::SHORT_CHAINS>(sacc, f0, f1, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], r.m[0]);
            mx[1] = fmaxf(mx[1], r.m[1]);
            qvc_softmax_new_max<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, alpha);
            qvc_softmax_rescale<QVC_SM_SKIP_UNCHANGED>(qvc_rows_of(r.o), alpha);
            if (alpha[0] != 1.0f || alpha[1] != 1.0f) ws8_rescale(ph, alpha);
            if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, F::SHORT_CHAINS>(sacc, f0, f1, r.m[0], r.m[1], a.expcast_add, j * WS_KEYS, ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, F::SHORT_CHAINS>(sacc, f0, f1, r.m[0], r.m[1], a.expcast_add, j * WS_KEYS, ops.nk, tig, rs, pa);
            if (!EXPCAST) {
                rs[0] = qvc_quad_sum(rs[0]);
                rs[1] = qvc_quad_sum(rs[1]);
            }
            if (more) mbar_wait(b.full + 8 * sn, ((j + 1) / F::STAGES) & 1);

            named_sync(1 + cw, 256);
            float part[EXPCAST ? 68 : 64];
            issue_pv<EXPCAST>(part, pa, sw128_desc(base + A8_V_OFF(s)));
            issue_qk<QVC_QK_INT8>(sacc, qd, base + A8_K_OFF(more ? sn : s));
            named_arrive(2 - cw, 256);

            wg_wait<1>(); /* PV of block j; QK of j+1 still running */
            reg_fence(part);
            if (EXPCAST) rs[0] = part[64], rs[1] = part[66];
            add_part<16>(r.o, part, 0, vb);
            ws8_fill(sm + WS8_MU_OFF(F::STAGES) + cw * WS8_MU_TILE,
                     (const float *)(sm + A8_MU_OFF(s)), j, (threadIdx.x - 128) & 127);
            ws8_pend(ph, rs, j, tig);
            mbar_arrive(b.empty + 8 * s);
            r.l[0] += rs[0];
            r.l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
        ws8_flush(r, ph, base + WS8_MU_OFF(F::STAGES) + cw * WS8_MU_TILE, cw);
        wg_wait<0>();
        reg_fence(r.o);
    }
    if (cw == 0) named_sync(1, 256);
}

template <class F, int EXPCAST>
__global__ void __launch_bounds__(F::THREADS, 1)
ws8_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
           const __grid_constant__ CUtensorMap tv, const attn8_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    attn8_bars b;
    b.q = base + A8_BAR_OFF(F::STAGES);
    b.full = b.q + 8, b.empty = b.q + 8 + 8 * F::STAGES;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;
    const float *vmu = ops.v_mu + (size_t)bh * nblk * 128; /* never NULL here */

    for (int i = threadIdx.x; i < F::STAGES * A8_ONES / 4; i += F::THREADS)
        *(uint32_t *)(sm + A8_ONES_OFF(i / (A8_ONES / 4)) + 4 * (i % (A8_ONES / 4))) = 0x38383838u;
    /* zero mean tiles: slots a short last batch leaves unwritten meet
     * zero pending sums, and 0 x (stale garbage) could be NaN */
    for (int i = threadIdx.x; i < 2 * WS8_MU_TILE / 4; i += F::THREADS)
        *(uint32_t *)(sm + WS8_MU_OFF(F::STAGES) + 4 * i) = 0u;
    if (threadIdx.x == 0) {
        mbar_init(b.q, 1);
        for (int s = 0; s < F::STAGES; ++s) {
            mbar_init(b.full + 8 * s, 1);
            mbar_init(b.empty + 8 * s, F::CONSUMERS * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(F::PRODUCER_REGS));
        if (threadIdx.x == 0) attn8_producer<F>(tq, tk, tv, ops, base, b, bh, tile, vmu, 1);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(F::CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7;
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    const uint64_t qd = sw128_desc(base + A8_Q_OFF + cw * 64 * 128);
    const int row0 = tile * F::ROWS + cw * 64 + warp * 16;
    float dq[2];
    qvc_q_scales(ops, bh, row0 + g, dq);
    const float *kscale = ops.k_scale + (size_t)bh * nblk;
    const float *vblk = ops.v_blk + (size_t)bh * nblk;

    attn8_acc r;
#pragma unroll
    for (int i = 0; i < 64; ++i) r.o[i] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
    int sacc[64];
    mbar_wait(b.q, 0);
    mbar_wait(b.full, 0);
    issue_qk<QVC_QK_INT8>(sacc, qd, base + A8_K_OFF(0));
    wg_wait<0>();
    reg_fence(sacc);
    ws8_mainloop<F, EXPCAST>(r, sacc, ops, p.a, base, sm, b, qd, dq, kscale, vblk, cw, tig);
    attn8_epilogue<EXPCAST>(r, ops, p.a, bh, row0, g, tig);
}

template <int EXPCAST>
static qva_status ws8_launch(const CUtensorMap *m, const attn8_params *p, cudaStream_t st) {
    typedef attn8_ws_flags<QVC_QK_INT8> F;
    const int smem = WS8_SMEM_BYTES(F::STAGES);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const attn8_params) =
        ws8_kernel<F, EXPCAST>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "ws8 smem attribute");
    dim3 grid((unsigned)((p->ops.nq_pad + F::ROWS - 1) / F::ROWS), (unsigned)p->ops.BH);
    k<<<grid, F::THREADS, smem, st>>>(m[0], m[1], m[2], *p);
    return qvc_launch_check("ws8");
}

extern "C" qva_status dev_attn8_ws8(const qvc_ops *ops, qvc_qk_format fmt,
                                    const qvc_attn_args *a, cudaStream_t st) {
    if (!ops->v_mu) /* no means (sage8, plain steps): the library kernel */
        return launch_version<attn8_ws_flags<QVC_QK_INT8>>(ops, fmt, a, st);
    CUtensorMap maps[3];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    return a->expcast ? ws8_launch<1>(maps, &p, st) : ws8_launch<0>(maps, &p, st);
}
