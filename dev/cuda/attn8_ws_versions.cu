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
 *   ws9   V-Smooth steps: the restore's FP16 mean tiles prepared in global
 *         memory (one 4 KB tile per 16 key blocks, in the wgmma layout) and
 *         loaded by the producer into a 2-deep ring both consumer warpgroups
 *         read, instead of each warpgroup filling its own tile from the
 *         stage's FP32 means block by block (a 4-way bank-conflicted STS.U16
 *         on the critical path, bench/NOTES.md); the stages carry no means.
 *         The pending sums word-major ([word][thread]), so that the 8
 *         owner threads of a warp storing one block's sums hit 8 banks
 *         (16 bytes per thread put them on 2: 4-way conflicts).  Plain
 *         steps run the library kernel.  Same FP16 values, same wgmma:
 *         bit-identical to the library kernel, sanitizer-clean, and 3-4%
 *         slower on the reuse step at Wan2.2-720p (bench/NOTES.md): not
 *         promoted.
 */
#include "dense/attn8_ws.cuh"

/* ------------------------------------------------------------ shared pieces */
/* The library kernel's frame (attn8_ws_128x128) as functions, for the
 * versions here that write their own kernel. */

/* The dynamic shared memory 1024-byte aligned, as an offset from its start
 * (so that every access through it compiles to LDS/STS). */
static __device__ __forceinline__ uint8_t *dev_smem(uint8_t *smem_raw) {
    return smem_raw + ((1024u - ((uint32_t)(uintptr_t)smem_raw & 1023u)) & 1023u);
}

/* The ring's mbarriers after the stages. */
template <class F>
static __device__ __forceinline__ attn8_bars dev_bars_at(uint32_t base) {
    attn8_bars b;
    b.q = base + A8_BAR_OFF(F::STAGES);
    b.full = b.q + 8, b.empty = b.q + 8 + 8 * F::STAGES;
    return b;
}

/* The ones rows after each V tile and the ring's mbarriers (no means in
 * the stages); with tfull, also a 2-deep tile ring's full and empty
 * mbarriers at tfull and tfull + 16 (ws9). */
template <class F>
static __device__ __forceinline__ void dev_frame_init(uint8_t *sm, attn8_bars b,
                                                      uint32_t tfull = 0) {
    for (int i = threadIdx.x; i < F::STAGES * A8_ONES / 4; i += F::THREADS)
        *(uint32_t *)(sm + A8_ONES_OFF(i / (A8_ONES / 4)) + 4 * (i % (A8_ONES / 4))) = 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(b.q, 1);
        for (int s = 0; s < F::STAGES; ++s) {
            mbar_init(b.full + 8 * s, 1);
            mbar_init(b.empty + 8 * s, F::CONSUMERS * 128);
        }
        for (int s = 0; tfull && s < 2; ++s) {
            mbar_init(tfull + 8 * s, 1);
            mbar_init(tfull + 16 + 8 * s, F::CONSUMERS * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}

/* A consumer thread's place once its warpgroup has the consumers'
 * registers: warpgroup, quad row and column, Q descriptor, the warp's
 * first row and the Q scales of its two rows. */
typedef struct dev_place {
    int cw, g, tig, row0;
    uint64_t qd;
    float dq[2];
} dev_place;

template <class F>
static __device__ __forceinline__ dev_place dev_consumer_place(const qvc_ops &ops, uint32_t base,
                                                               int bh, int tile) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(F::CONSUMER_REGS));
    dev_place c;
    const int ctid = threadIdx.x - 128, warp = (ctid >> 5) & 3, lane = ctid & 31;
    c.cw = ctid >> 7;
    c.g = lane >> 2, c.tig = lane & 3;
    c.qd = sw128_desc(base + A8_Q_OFF + c.cw * 64 * 128);
    c.row0 = tile * F::ROWS + c.cw * 64 + warp * 16;
    qvc_q_scales(ops, bh, c.row0 + c.g, c.dq);
    return c;
}

/* A consumer's fresh state, and QK(0) once Q and the first stage are in. */
static __device__ __forceinline__ void dev_consumer_start(attn8_acc &r, int (&sacc)[64],
                                                          uint64_t qd, uint32_t base,
                                                          attn8_bars b) {
#pragma unroll
    for (int i = 0; i < 64; ++i) r.o[i] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
    mbar_wait(b.q, 0);
    mbar_wait(b.full, 0);
    issue_qk<QVC_QK_INT8>(sacc, qd, base + A8_K_OFF(0));
    wg_wait<0>();
    reg_fence(sacc);
}

/* The start of an INT8 block's softmax: the row scales f0, f1 of block j,
 * its row max raised into the running max, O and l rescaled; alpha for
 * the sums a mainloop keeps elsewhere (1 where no max rose). */
template <class F>
static __device__ __forceinline__ void dev_int8_block_max(attn8_acc &r, int (&sacc)[64],
                                                          const qvc_ops &ops,
                                                          const qvc_attn_args &a,
                                                          const float (&dq)[2], const float *kscale,
                                                          int j, int tig, float &f0, float &f1,
                                                          float (&alpha)[2]) {
    f0 = (dq[0] * kscale[j]) * a.scale_log2, f1 = (dq[1] * kscale[j]) * a.scale_log2;
    float mx[2];
    int_row_max<F::SHORT_CHAINS>(sacc, f0, f1, j * WS_KEYS, ops.nk, tig, mx);
    mx[0] = fmaxf(mx[0], r.m[0]);
    mx[1] = fmaxf(mx[1], r.m[1]);
    qvc_softmax_new_max<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, alpha);
    qvc_softmax_rescale<QVC_SM_SKIP_UNCHANGED>(qvc_rows_of(r.o), alpha);
}

/* ------------------------------------------------------------ ws5 */
struct ws5_flags : attn8_ws_flags<QVC_QK_INT8> {
    static constexpr bool SHORT_CHAINS = false;
};

/* The tensor maps and parameters every version launches with. */
static qva_status version_args(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                               CUtensorMap (&maps)[4], attn8_params *p) {
    if (fmt != QVC_QK_INT8)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: INT8 QK only (sage8, vc8)");
    if (ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: not V in two digits (+v2)");
    const qva_status r = attn8_maps(ops, maps);
    if (r != QVA_OK) return r;
    p->ops = *ops;
    p->a = *a;
    return QVA_OK;
}

template <class F>
static qva_status launch_version(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                                 cudaStream_t st) {
    CUtensorMap maps[4];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    return attn8_launch<F>(maps, &p, st);
}

extern "C" qva_status dev_attn8_ws5(const qvc_ops *ops, qvc_qk_format fmt,
                                    const qvc_attn_args *a, cudaStream_t st) {
    return launch_version<ws5_flags>(ops, fmt, a, st);
}

/* ------------------------------------------------------------ ws9 */
struct ws9_flags : attn8_ws_flags<QVC_QK_INT8> {};

/* The tile ring after the pending sums: 2 tiles, then full[2], empty[2]. */
#define WS9_TILE_OFF(S) A8R_TILE_OFF(S)
#define WS9_BAR_OFF(S) (A8R_PEND_OFF(S) + 256 * 16)
#define WS9_SMEM_BYTES(S) (WS9_BAR_OFF(S) + 32 + 1024)

/* tiles[bh][t] (4 KB each): blocks 16t .. 16t + 15 of v_mu as FP16 in the
 * layout of a8r_tile_at; slots past the last block are 0.  One thread per
 * (channel, half of the batch) writes its 16-byte core-matrix row. */
__global__ void ws9_mean_tiles(const float *__restrict__ v_mu, uint4 *__restrict__ tiles,
                               int nblk, int nbatch) {
    const int t = blockIdx.x, bh = blockIdx.y, n = threadIdx.x & 127, kh = threadIdx.x >> 7;
    const float *mu = v_mu + (size_t)bh * nblk * 128;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j0 = t * A8R_BATCH + kh * 8 + 2 * i;
        const float a = j0 < nblk ? mu[(size_t)j0 * 128 + n] : 0.0f;
        const float b = j0 + 1 < nblk ? mu[(size_t)(j0 + 1) * 128 + n] : 0.0f;
        const __half2 h = __floats2half2_rn(a, b); /* exact: v_mu holds FP16 values */
        memcpy(&w[i], &h, sizeof w[i]);
    }
    uint8_t *tile = (uint8_t *)(tiles + ((size_t)bh * nbatch + t) * (A8R_TILE / 16));
    *(uint4 *)(tile + a8r_tile_at(n, kh * 8)) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* The producer: Q, then per block K and V; before the first block of each
 * batch, that batch's mean tile into the tile ring. */
template <class F>
static __device__ __forceinline__ void ws9_producer(const CUtensorMap &tq, const CUtensorMap &tk,
                                                    const CUtensorMap &tv, const qvc_ops &ops,
                                                    uint32_t base, attn8_bars b, uint32_t tfull,
                                                    uint32_t tempty, int bh, int tile,
                                                    const uint8_t *tiles) {
    mbar_expect_tx(b.q, A8_QB);
    tma_load_2d(base + A8_Q_OFF, &tq, 0, bh * ops.nq_pad + tile * F::ROWS, b.q);
    for (int j = 0; j < ops.nblk; ++j) {
        if (j % A8R_BATCH == 0) {
            const int t = j / A8R_BATCH, slot = t & 1;
            mbar_wait(tempty + 8 * slot, ((t >> 1) & 1) ^ 1);
            mbar_expect_tx(tfull + 8 * slot, A8R_TILE);
            bulk_load(base + WS9_TILE_OFF(F::STAGES) + slot * A8R_TILE,
                      tiles + (size_t)t * A8R_TILE, A8R_TILE, tfull + 8 * slot);
        }
        const int s = j % F::STAGES;
        const uint32_t full = b.full + 8 * s;
        mbar_wait(b.empty + 8 * s, ((j / F::STAGES) & 1) ^ 1);
        mbar_expect_tx(full, 2 * A8_TILE);
        tma_load_2d(base + A8_K_OFF(s), &tk, 0, bh * ops.nk_pad + j * WS_KEYS, full);
        tma_load_2d(base + A8_V_OFF(s), &tv, 0, (bh * ops.nblk + j) * 128, full);
    }
}

/* The pending sums, word-major: word i of consumer thread c at
 * PEND_OFF + 1024 i + 4 c (the same 4 KB as the library's 16 B per thread).
 * Word i is the library's ph[i]: A register a_i, rows g (i even) or g + 8. */
static __device__ __forceinline__ uint32_t *ws9_pending(uint8_t *sm, int stages) {
    uint32_t *pw = (uint32_t *)(sm + A8R_PEND_OFF(stages)) + (threadIdx.x - 128);
#pragma unroll
    for (int i = 0; i < 4; ++i) pw[256 * i] = 0u;
    return pw;
}

static __device__ __forceinline__ void ws9_pend(uint32_t *pw, const float *rs, int j, int tig) {
    const int k = j & (A8R_BATCH - 1), owner = (k & 7) >> 1, hi = k >> 3;
    if (tig != owner) return;
    ((__half *)(pw + 256 * (2 * hi)))[k & 1] = __float2half_rn(rs[0]);
    ((__half *)(pw + 256 * (2 * hi + 1)))[k & 1] = __float2half_rn(rs[1]);
}

static __device__ __forceinline__ void ws9_rescale(uint32_t *pw, const float *alpha) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h;
        const uint32_t u = pw[256 * i];
        memcpy(&h, &u, sizeof h);
        const float2 f = __half22float2(h);
        h = __floats2half2_rn(f.x * alpha[i & 1], f.y * alpha[i & 1]);
        uint32_t w;
        memcpy(&w, &h, sizeof w);
        pw[256 * i] = w;
    }
}

/* The library's ping-pong mainloop with means (attn8_mainloop_pingpong),
 * its tile from the ring instead of filled here. */
template <class F, int EXPCAST>
static __device__ __forceinline__ void ws9_mainloop(attn8_acc &r, int (&sacc)[64],
                                                    const qvc_ops &ops, const qvc_attn_args &a,
                                                    uint32_t base, uint8_t *sm, attn8_bars b,
                                                    uint32_t tfull, uint32_t tempty, uint64_t qd,
                                                    const float (&dq)[2], const float *kscale,
                                                    const float *vblk, int cw, int tig) {
    uint32_t *pw = ws9_pending(sm, F::STAGES);
    if (cw == 1) named_arrive(1, 256);
    for (int j0 = 0; j0 < ops.nblk; j0 += A8R_BATCH) {
        const int j1 = min(j0 + A8R_BATCH, ops.nblk);
        for (int j = j0; j < j1; ++j) {
            const int s = j % F::STAGES, sn = (j + 1) % F::STAGES, more = j + 1 < ops.nblk;
            const float vb = vblk[j];
            uint32_t pa[4][4];
            float rs[2] = {0.0f, 0.0f};
            float f0, f1, alpha[2];
            dev_int8_block_max<F>(r, sacc, ops, a, dq, kscale, j, tig, f0, f1, alpha);
            if (alpha[0] != 1.0f || alpha[1] != 1.0f) ws9_rescale(pw, alpha);
            if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, F::SHORT_CHAINS>(sacc, f0, f1, r.m[0], r.m[1], a.expcast_add,
                                                          j * WS_KEYS, ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, F::SHORT_CHAINS>(sacc, f0, f1, r.m[0], r.m[1], a.expcast_add,
                                                          j * WS_KEYS, ops.nk, tig, rs, pa);
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

            wg_wait<1>();
            reg_fence(part);
            if (EXPCAST) rs[0] = part[64], rs[1] = part[66];
            add_part<16>(r.o, part, 0, vb);
            ws9_pend(pw, rs, j, tig);
            mbar_arrive(b.empty + 8 * s);
            r.l[0] += rs[0];
            r.l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
        /* the batch's restore: the tile came by TMA (the mbarrier makes it
         * visible to the wgmma), the pending sums are this thread's */
        const int t = j0 / A8R_BATCH, slot = t & 1;
        mbar_wait(tfull + 8 * slot, (t >> 1) & 1);
        const uint32_t pend[4] = {pw[0], pw[256], pw[512], pw[768]};
        wg_fence();
        a8r_wgmma(r.o, pend, a8r_tile_desc(base + WS9_TILE_OFF(F::STAGES) + slot * A8R_TILE));
        wg_commit();
#pragma unroll
        for (int i = 0; i < 4; ++i) pw[256 * i] = 0u;
        wg_wait<0>();
        reg_fence(r.o);
        mbar_arrive(tempty + 8 * slot);
    }
    if (cw == 0) named_sync(1, 256);
}

template <class F, int EXPCAST>
__global__ void __launch_bounds__(F::THREADS, 1)
ws9_attn8(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
          const __grid_constant__ CUtensorMap tv, const attn8_params p, const uint8_t *tiles) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = dev_smem(smem_raw);
    const uint32_t base = smem_addr(sm);
    const attn8_bars b = dev_bars_at<F>(base);
    const uint32_t tfull = base + WS9_BAR_OFF(F::STAGES), tempty = tfull + 16;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;

    dev_frame_init<F>(sm, b, tfull);

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(F::PRODUCER_REGS));
        const int nbatch = (nblk + A8R_BATCH - 1) / A8R_BATCH;
        if (threadIdx.x == 0)
            ws9_producer<F>(tq, tk, tv, ops, base, b, tfull, tempty, bh, tile,
                            tiles + (size_t)bh * nbatch * A8R_TILE);
        return;
    }

    const dev_place c = dev_consumer_place<F>(ops, base, bh, tile);
    attn8_acc r;
    int sacc[64];
    dev_consumer_start(r, sacc, c.qd, base, b);
    ws9_mainloop<F, EXPCAST>(r, sacc, ops, p.a, base, sm, b, tfull, tempty, c.qd, c.dq,
                             ops.k_scale + (size_t)bh * nblk, ops.v_blk + (size_t)bh * nblk,
                             c.cw, c.tig);
    attn8_epilogue<EXPCAST>(r, ops, p.a, bh, c.row0, c.g, c.tig);
}

/* The tiles are built and freed here on every call (stream-ordered), which
 * a trial can afford; promoted, they would be an output of the V prep
 * (prep/v.cu), written where v_mu is. */
template <int EXPCAST>
static qva_status ws9_launch_means(const CUtensorMap *m, const attn8_params *p, cudaStream_t st) {
    typedef ws9_flags F;
    const qvc_ops &ops = p->ops;
    const int nbatch = (ops.nblk + A8R_BATCH - 1) / A8R_BATCH;
    const size_t bytes = (size_t)ops.BH * nbatch * A8R_TILE;
    uint8_t *tiles = NULL;
    cudaError_t e = cudaMallocAsync((void **)&tiles, bytes, st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "ws9 mean tiles");
    ws9_mean_tiles<<<dim3((unsigned)nbatch, (unsigned)ops.BH), 256, 0, st>>>(ops.v_mu, (uint4 *)tiles,
                                                                            ops.nblk, nbatch);
    qva_status r = qvc_launch_check("ws9_mean_tiles");
    if (r == QVA_OK) {
        const int smem = WS9_SMEM_BYTES(F::STAGES);
        void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const attn8_params,
                  const uint8_t *) = ws9_attn8<F, EXPCAST>;
        e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) {
            r = qvc_cuda_fail(e, "ws9 smem attribute");
        } else {
            dim3 grid((unsigned)((ops.nq_pad + F::ROWS - 1) / F::ROWS), (unsigned)ops.BH);
            k<<<grid, F::THREADS, smem, st>>>(m[0], m[1], m[2], *p, tiles);
            r = qvc_launch_check("ws9_attn8");
        }
    }
    e = cudaFreeAsync(tiles, st); /* stream-ordered: after the kernel */
    if (r == QVA_OK && e != cudaSuccess) r = qvc_cuda_fail(e, "ws9 mean tiles free");
    return r;
}

extern "C" qva_status dev_attn8_ws9(const qvc_ops *ops, qvc_qk_format fmt,
                                    const qvc_attn_args *a, cudaStream_t st) {
    if (!ops->v_mu) return launch_version<ws9_flags>(ops, fmt, a, st);
    CUtensorMap maps[4];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    return a->expcast ? ws9_launch_means<1>(maps, &p, st) : ws9_launch_means<0>(maps, &p, st);
}

/* ------------------------------------------------------------ ws27 */
/* The plain step's ping-pong with each warpgroup's own PV under its next
 * softmax (FlashAttention-3's intra-warpgroup overlap, in the form that
 * fits the two-level accumulation): in its turn a warpgroup issues
 * QK(j+1) and then PV(j); it waits for QK(j+1) alone, computes block
 * j+1's row max and P codes while PV(j) still runs, and only then waits
 * for PV(j) and adds its partial into O.  The library waits for PV(j),
 * then for QK(j+1), before the softmax: its own 272 tensor clocks of PV
 * sit on its path.  The codes of j+1 go to a second fragment (PV(j) still
 * reads the first), copied over after the wait.  Same arithmetic in the
 * same order as the library (O: + part_j, x alpha_{j+1}; l: x alpha_j,
 * + the row sum of j), so the outputs should be bit-identical.  Plain
 * steps and one V digit only; the launcher runs the library kernel for
 * the others. */
struct ws27_flags : attn8_ws_flags<QVC_QK_INT8> {};

/* Block j's softmax from its INT32 scores: the running max raised (alpha:
 * the factor of O and of the sums before j; 1 where no max rose), the P
 * codes into pa; the exp2 path's row sum (no ones rows) added into l here,
 * as the library does, the ones rows' sums after PV(j) by the caller. */
template <class F, int PMODE>
static __device__ __forceinline__ void ws27_softmax(attn8_acc &r, int (&sacc)[64],
                                                    const qvc_ops &ops, const qvc_attn_args &a,
                                                    const float (&dq)[2], const float *kscale,
                                                    int j, int tig, uint32_t (&pa)[4][4],
                                                    float (&alpha)[2]) {
    constexpr int EXPCAST = PMODE == A8_P_EXPCAST, ONES = PMODE != A8_P_EXP2;
    const float f0 = (dq[0] * kscale[j]) * a.scale_log2, f1 = (dq[1] * kscale[j]) * a.scale_log2;
    float mx[2], rs[2] = {0.0f, 0.0f};
    int_row_max<F::SHORT_CHAINS>(sacc, f0, f1, j * WS_KEYS, ops.nk, tig, mx);
    mx[0] = fmaxf(mx[0], r.m[0]);
    mx[1] = fmaxf(mx[1], r.m[1]);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        alpha[i] = qvc_softmax_alpha<QVC_SM_SKIP_UNCHANGED>(r.m[i], mx[i]);
        if (!ONES) r.l[i] = r.l[i] * alpha[i]; /* the ones rows' l is rescaled with O */
        r.m[i] = fmaxf(r.m[i], mx[i]);
    }
    if ((j + 1) * WS_KEYS > ops.nk)
        make_p_fused<EXPCAST, 1, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, r.m[0], r.m[1],
                                                         a.expcast_add, j * WS_KEYS, ops.nk, tig,
                                                         rs, pa);
    else
        make_p_fused<EXPCAST, 0, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, r.m[0], r.m[1],
                                                         a.expcast_add, j * WS_KEYS, ops.nk, tig,
                                                         rs, pa);
    if (!ONES) {
        r.l[0] += qvc_quad_sum(rs[0]);
        r.l[1] += qvc_quad_sum(rs[1]);
    }
}

template <class F, int PMODE>
static __device__ __forceinline__ void ws27_mainloop(attn8_acc &r, int (&sacc)[64],
                                                     const qvc_ops &ops, const qvc_attn_args &a,
                                                     uint32_t base, attn8_bars b, uint64_t qd,
                                                     const float (&dq)[2], const float *kscale,
                                                     const float *vblk, int cw, int tig) {
    constexpr int ONES = PMODE != A8_P_EXP2;
    uint32_t pa[4][4], pn[4][4];
    float al[2]; /* block 0's: 1, O and l are still zero */
    ws27_softmax<F, PMODE>(r, sacc, ops, a, dq, kscale, 0, tig, pa, al);
    if (cw == 1) named_arrive(1, 256);
    for (int j = 0; j < ops.nblk; ++j) {
        const int s = j % F::STAGES, sn = (j + 1) % F::STAGES, more = j + 1 < ops.nblk;
        const float vb = vblk[j];
        if (more) mbar_wait(b.full + 8 * sn, ((j + 1) / F::STAGES) & 1);

        named_sync(1 + cw, 256);
        /* QK first: wait_group 1 then means QK(j+1) is done, PV(j) maybe not.
         * Always issued (no wgmma on a divergent path); after the last
         * block it re-reads this block's K tile and the result is dropped. */
        issue_qk<QVC_QK_INT8>(sacc, qd, base + A8_K_OFF(more ? sn : s));
        float part[ONES ? 68 : 64];
        issue_pv<ONES>(part, pa, sw128_desc(base + A8_V_OFF(s)));
        named_arrive(2 - cw, 256);

        wg_wait<1>();
        reg_fence(sacc);
        float alpha[2] = {1.0f, 1.0f};
        if (more) ws27_softmax<F, PMODE>(r, sacc, ops, a, dq, kscale, j + 1, tig, pn, alpha);

        wg_wait<0>();
        reg_fence(part);
        /* pa is read by PV(j) until here: to the compiler the wgmma took it
         * at issue, and it put pn's codes in pa's registers */
#pragma unroll
        for (int c = 0; c < 4; ++c) reg_fence(pa[c]);
        add_part<16>(r.o, part, 0, vb);
        if (ONES) { /* l as O: + the sum of j, then x alpha_{j+1}; the library's
                       x alpha_j, + the sum of j in the same sequence */
            r.l[0] = (r.l[0] + part[64]) * alpha[0];
            r.l[1] = (r.l[1] + part[66]) * alpha[1];
        }
        qvc_softmax_rescale<QVC_SM_SKIP_UNCHANGED>(qvc_rows_of(r.o), alpha);
        mbar_arrive(b.empty + 8 * s);
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) pa[c][i] = pn[c][i];
    }
    if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
}

template <class F, int PMODE>
__global__ void __launch_bounds__(F::THREADS, 1)
ws27_attn8(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
           const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tvl,
           const attn8_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = dev_smem(smem_raw);
    const uint32_t base = smem_addr(sm);
    const attn8_bars b = dev_bars_at<F>(base);
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;

    dev_frame_init<F>(sm, b);

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(F::PRODUCER_REGS));
        if (threadIdx.x == 0) attn8_producer<F>(tq, tk, tv, tvl, ops, base, b, bh, tile, NULL, 0);
        return;
    }

    const dev_place c = dev_consumer_place<F>(ops, base, bh, tile);
    attn8_acc r;
    int sacc[64];
    dev_consumer_start(r, sacc, c.qd, base, b);
    ws27_mainloop<F, PMODE>(r, sacc, ops, p.a, base, b, c.qd, c.dq,
                            ops.k_scale + (size_t)bh * nblk, ops.v_blk + (size_t)bh * nblk, c.cw,
                            c.tig);
    attn8_epilogue<PMODE == A8_P_EXPCAST>(r, ops, p.a, bh, c.row0, c.g, c.tig);
}

template <int PMODE>
static qva_status ws27_launch_p(const CUtensorMap *m, const attn8_params *p, cudaStream_t st) {
    typedef ws27_flags F;
    const int smem = A8_SMEM_BYTES(F::STAGES);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
              const attn8_params) = ws27_attn8<F, PMODE>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "ws27 smem attribute");
    dim3 grid((unsigned)((p->ops.nq_pad + F::ROWS - 1) / F::ROWS), (unsigned)p->ops.BH);
    k<<<grid, F::THREADS, smem, st>>>(m[0], m[1], m[2], m[3], *p);
    return qvc_launch_check("ws27_attn8");
}

extern "C" qva_status dev_attn8_ws27(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (ops->v_mu || ops->v_t_lo) return launch_version<ws27_flags>(ops, fmt, a, st);
    CUtensorMap maps[4];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    if (a->expcast) return ws27_launch_p<A8_P_EXPCAST>(maps, &p, st);
    if (a->sum_codes) return ws27_launch_p<A8_P_CODESUM>(maps, &p, st);
    return ws27_launch_p<A8_P_EXP2>(maps, &p, st);
}

/* ------------------------------------------------------------ ws28-ws30 */
/* Diagnostic versions (wrong outputs; `perf` only): the library's plain
 * ping-pong loop with parts removed, to see which part the tensor pipe
 * waits for.  DIAG bit 0: no softmax (no row max, the P codes a constant
 * 1.0); bit 1: no O update (the partial's registers are only fenced). */
template <class F, int PMODE, int DIAG>
static __device__ __forceinline__ void diag_mainloop(attn8_acc &r, int (&sacc)[64],
                                                     const qvc_ops &ops, const qvc_attn_args &a,
                                                     uint32_t base, attn8_bars b, uint64_t qd,
                                                     const float (&dq)[2], const float *kscale,
                                                     const float *vblk, int cw, int tig) {
    constexpr int EXPCAST = PMODE == A8_P_EXPCAST, ONES = PMODE != A8_P_EXP2;
    if (cw == 1) named_arrive(1, 256);
    for (int j = 0; j < ops.nblk; ++j) {
        const int s = j % F::STAGES, sn = (j + 1) % F::STAGES, more = j + 1 < ops.nblk;
        const float f0 = (dq[0] * kscale[j]) * a.scale_log2, f1 = (dq[1] * kscale[j]) * a.scale_log2;
        const float vb = vblk[j];
        uint32_t pa[4][4];
        float rs[2] = {0.0f, 0.0f};
        if (DIAG & 1) {
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int i = 0; i < 4; ++i) pa[c][i] = 0x38383838u ^ (uint32_t)(sacc[16 * c + i] & 1);
        } else {
            float mx[2];
            int_row_max<F::SHORT_CHAINS>(sacc, f0, f1, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], r.m[0]);
            mx[1] = fmaxf(mx[1], r.m[1]);
            qvc_softmax_raise<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, qvc_rows_of(r.o));
            make_p_fused<EXPCAST, 0, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, r.m[0], r.m[1],
                                                             a.expcast_add, j * WS_KEYS, ops.nk,
                                                             tig, rs, pa);
            if (!ONES) {
                rs[0] = qvc_quad_sum(rs[0]);
                rs[1] = qvc_quad_sum(rs[1]);
            }
        }
        if (more) mbar_wait(b.full + 8 * sn, ((j + 1) / F::STAGES) & 1);
        named_sync(1 + cw, 256);
        float part[ONES ? 68 : 64];
        issue_pv<ONES>(part, pa, sw128_desc(base + A8_V_OFF(s)));
        issue_qk<QVC_QK_INT8>(sacc, qd, base + A8_K_OFF(more ? sn : s));
        named_arrive(2 - cw, 256);
        wg_wait<1>();
        reg_fence(part);
        if (ONES) rs[0] = part[64], rs[1] = part[66];
        if (DIAG & 2) {
            r.o[0] += part[0] * vb, r.o[63] += part[63];
        } else {
            add_part<16>(r.o, part, 0, vb);
        }
        mbar_arrive(b.empty + 8 * s);
        r.l[0] += rs[0];
        r.l[1] += rs[1];
        wg_wait<0>();
        reg_fence(sacc);
    }
    if (cw == 0) named_sync(1, 256);
}

template <class F, int PMODE, int DIAG>
__global__ void __launch_bounds__(F::THREADS, 1)
diag_attn8(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
           const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tvl,
           const attn8_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = dev_smem(smem_raw);
    const uint32_t base = smem_addr(sm);
    const attn8_bars b = dev_bars_at<F>(base);
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    dev_frame_init<F>(sm, b);
    if ((threadIdx.x >> 7) == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(F::PRODUCER_REGS));
        if (threadIdx.x == 0) attn8_producer<F>(tq, tk, tv, tvl, ops, base, b, bh, tile, NULL, 0);
        return;
    }
    const dev_place c = dev_consumer_place<F>(ops, base, bh, tile);
    attn8_acc r;
    int sacc[64];
    dev_consumer_start(r, sacc, c.qd, base, b);
    diag_mainloop<F, PMODE, DIAG>(r, sacc, ops, p.a, base, b, c.qd, c.dq,
                                  ops.k_scale + (size_t)bh * nblk, ops.v_blk + (size_t)bh * nblk,
                                  c.cw, c.tig);
    attn8_epilogue<PMODE == A8_P_EXPCAST>(r, ops, p.a, bh, c.row0, c.g, c.tig);
}

template <int PMODE, int DIAG>
static qva_status diag_launch_p(const CUtensorMap *m, const attn8_params *p, cudaStream_t st) {
    typedef ws27_flags F;
    const int smem = A8_SMEM_BYTES(F::STAGES);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
              const attn8_params) = diag_attn8<F, PMODE, DIAG>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "diag smem attribute");
    dim3 grid((unsigned)((p->ops.nq_pad + F::ROWS - 1) / F::ROWS), (unsigned)p->ops.BH);
    k<<<grid, F::THREADS, smem, st>>>(m[0], m[1], m[2], m[3], *p);
    return qvc_launch_check("diag_attn8");
}

template <int DIAG>
static qva_status diag_launch(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                              cudaStream_t st) {
    if (ops->v_mu || ops->v_t_lo) return launch_version<ws27_flags>(ops, fmt, a, st);
    CUtensorMap maps[4];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    if (a->expcast) return diag_launch_p<A8_P_EXPCAST, DIAG>(maps, &p, st);
    if (a->sum_codes) return diag_launch_p<A8_P_CODESUM, DIAG>(maps, &p, st);
    return diag_launch_p<A8_P_EXP2, DIAG>(maps, &p, st);
}

extern "C" qva_status dev_attn8_ws28(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    return diag_launch<1>(ops, fmt, a, st);
}
extern "C" qva_status dev_attn8_ws29(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    return diag_launch<2>(ops, fmt, a, st);
}
extern "C" qva_status dev_attn8_ws30(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    return diag_launch<3>(ops, fmt, a, st);
}

/* ------------------------------------------------------------ ws31 */
/* Three consumer warpgroups of 64 query rows (192 per CTA), so that each
 * scheduler holds three consumer warps: the diagnostic versions above
 * say the tensor pipe waits for the softmax and the O update, whose
 * instructions issue at about half the slots a scheduler has
 * (bench/NOTES.md, "ws27-ws30").  160 registers per consumer thread: a
 * warpgroup no longer has QK(j+1) in flight while PV(j)'s partial is live
 * (the library's 64 + 68 + 64 + 16), it issues PV(j), adds the partial,
 * then issues QK(j+1): at most O 64 + the partial 68 + the P fragment 16.
 * No turns: three warpgroups keep the tensor queue fed.  Plain steps, one V
 * digit; the library kernel runs the others. */
struct ws31_flags : attn8_ws_flags<QVC_QK_INT8> {
    static constexpr int CONSUMERS = 3;
    static constexpr int ROWS = 64 * CONSUMERS;
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    static constexpr int CONSUMER_REGS = 160; /* (64K - 128 x 24) / 384, in multiples of 8 */
    static constexpr int PRODUCER_REGS = 24;
};

#define W31_QB (192 * 128)
#define W31_V_OFF(s) (W31_QB + (s) * A8_STAGE_BYTES)
#define W31_ONES_OFF(s) (W31_V_OFF(s) + A8_TILE)
#define W31_K_OFF(s) (W31_ONES_OFF(s) + A8_ONES)
#define W31_MU_OFF(s) (W31_K_OFF(s) + A8_TILE)
#define W31_BAR_OFF(S) (W31_QB + (S) * A8_STAGE_BYTES)
#define W31_SMEM_BYTES(S) (W31_BAR_OFF(S) + 8 * (1 + 2 * (S)) + 1024)

template <class F>
static __device__ __forceinline__ void ws31_producer(const CUtensorMap &tq, const CUtensorMap &tk,
                                                     const CUtensorMap &tv, const qvc_ops &ops,
                                                     uint32_t base, attn8_bars b, int bh,
                                                     int tile, const float *vmu) {
    mbar_expect_tx(b.q, W31_QB);
    tma_load_2d(base, &tq, 0, bh * ops.nq_pad + tile * F::ROWS, b.q);
    for (int j = 0; j < ops.nblk; ++j) {
        const int s = j % F::STAGES;
        const uint32_t full = b.full + 8 * s;
        mbar_wait(b.empty + 8 * s, ((j / F::STAGES) & 1) ^ 1);
        mbar_expect_tx(full, 2 * A8_TILE + (vmu ? 512 : 0));
        tma_load_2d(base + W31_K_OFF(s), &tk, 0, bh * ops.nk_pad + j * WS_KEYS, full);
        tma_load_2d(base + W31_V_OFF(s), &tv, 0, (bh * ops.nblk + j) * 128, full);
        if (vmu) bulk_load(base + W31_MU_OFF(s), vmu + (size_t)j * 128, 512, full);
    }
}

/* The V-Smooth restore's shared memory after the ring's mbarriers: one
 * mean tile per consumer warpgroup, then 16 bytes of pending sums per
 * consumer thread (attn8_restore.cuh). */
#define W32_TILE_OFF(S) ((W31_BAR_OFF(S) + 8 * (1 + 2 * (S)) + 1023) & ~1023)
#define W32_PEND_OFF(S) (W32_TILE_OFF(S) + 3 * A8R_TILE)
#define W32_SMEM_BYTES(S) (W32_PEND_OFF(S) + 384 * 16 + 1024)

template <class F, int PMODE, int MEANS>
static __device__ __forceinline__ void ws31_mainloop(attn8_acc &r, const qvc_ops &ops,
                                                     const qvc_attn_args &a, uint32_t base,
                                                     uint8_t *sm, attn8_bars b, uint64_t qd,
                                                     const float (&dq)[2], const float *kscale,
                                                     const float *vblk, int cw, int tig) {
    constexpr int EXPCAST = PMODE == A8_P_EXPCAST, ONES = PMODE != A8_P_EXP2;
    uint32_t *ph = NULL;
    if (MEANS) {
        ph = (uint32_t *)(sm + W32_PEND_OFF(F::STAGES) + 16 * (threadIdx.x - 128));
        *(uint4 *)ph = make_uint4(0u, 0u, 0u, 0u);
    }
    uint8_t *tile = sm + W32_TILE_OFF(F::STAGES) + cw * A8R_TILE;
    const int batch = MEANS ? A8R_BATCH : ops.nblk;
    /* Per block, in one warpgroup: QK(j), the softmax, PV(j), the partial
     * into O; the batch's restore after its last block, when only O is
     * live (the restore accumulates into O: ptxas keeps it in one block
     * of 64 registers beside the 68 that S and the partial share). */
    for (int j0 = 0; j0 < ops.nblk; j0 += batch) {
        const int j1 = min(j0 + batch, ops.nblk);
        for (int j = j0; j < j1; ++j) {
            const int s = j % F::STAGES;
            int sacc[64];
            mbar_wait(b.full + 8 * s, (j / F::STAGES) & 1);
            issue_qk<QVC_QK_INT8>(sacc, qd, base + W31_K_OFF(s));
            const float f0 = (dq[0] * kscale[j]) * a.scale_log2,
                        f1 = (dq[1] * kscale[j]) * a.scale_log2;
            const float vb = vblk[j];
            wg_wait<0>();
            reg_fence(sacc);
            uint32_t pa[4][4];
            float rs[2] = {0.0f, 0.0f};
            float mx[2];
            int_row_max<F::SHORT_CHAINS>(sacc, f0, f1, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], r.m[0]);
            mx[1] = fmaxf(mx[1], r.m[1]);
            if (MEANS) { /* the pending row sums are rescaled as O is */
                float alpha[2];
                qvc_softmax_new_max<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, alpha);
                qvc_softmax_rescale<QVC_SM_SKIP_UNCHANGED>(qvc_rows_of(r.o), alpha);
                if (alpha[0] != 1.0f || alpha[1] != 1.0f) a8r_rescale(ph, alpha);
            } else {
                qvc_softmax_raise<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, qvc_rows_of(r.o));
            }
            if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, r.m[0], r.m[1],
                                                                 a.expcast_add, j * WS_KEYS,
                                                                 ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, r.m[0], r.m[1],
                                                                 a.expcast_add, j * WS_KEYS,
                                                                 ops.nk, tig, rs, pa);
            if (!ONES) {
                rs[0] = qvc_quad_sum(rs[0]);
                rs[1] = qvc_quad_sum(rs[1]);
            }
            float part[ONES ? 68 : 64];
            issue_pv<ONES>(part, pa, sw128_desc(base + W31_V_OFF(s)));
            wg_wait<0>();
            reg_fence(part);
#pragma unroll
            for (int c = 0; c < 4; ++c) reg_fence(pa[c]);
            if (ONES) rs[0] = part[64], rs[1] = part[66];
            add_part<16>(r.o, part, 0, vb);
            if (MEANS) {
                a8r_fill(tile, (const float *)(sm + W31_MU_OFF(s)), j, (threadIdx.x - 128) & 127);
                a8r_pend(ph, rs, j, tig);
            }
            r.l[0] += rs[0];
            r.l[1] += rs[1];
            mbar_arrive(b.empty + 8 * s);
        }
        if (MEANS) { /* into a fresh accumulator, then added: O needs no fixed registers */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            named_sync(3 + cw, 128);
            const uint4 v = *(const uint4 *)ph;
            const uint32_t pend[4] = {v.x, v.y, v.z, v.w};
            float rst[64];
#pragma unroll
            for (int i = 0; i < 64; ++i) rst[i] = 0.0f; /* not read: the wgmma's scale-d is 0 */
            wg_fence();
            asm volatile(
                "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64
                ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                : F64(rst)
                : "r"(pend[0]), "r"(pend[1]), "r"(pend[2]), "r"(pend[3]),
                  "l"(a8r_tile_desc(smem_addr(tile))));
            wg_commit();
            *(uint4 *)ph = make_uint4(0u, 0u, 0u, 0u);
            wg_wait<0>();
            reg_fence(rst);
#pragma unroll
            for (int i = 0; i < 64; ++i) r.o[i] += rst[i];
        }
    }
}

template <class F, int PMODE, int MEANS>
__global__ void __launch_bounds__(F::THREADS, 1)
ws31_attn8(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
           const __grid_constant__ CUtensorMap tv, const attn8_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = dev_smem(smem_raw);
    const uint32_t base = smem_addr(sm);
    attn8_bars b;
    b.q = base + W31_BAR_OFF(F::STAGES);
    b.full = b.q + 8, b.empty = b.q + 8 + 8 * F::STAGES;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    for (int i = threadIdx.x; i < F::STAGES * A8_ONES / 4; i += F::THREADS)
        *(uint32_t *)(sm + W31_ONES_OFF(i / (A8_ONES / 4)) + 4 * (i % (A8_ONES / 4))) = 0x38383838u;
    if (MEANS) /* a short last batch's unwritten slots meet zero sums: keep them finite */
        for (int i = threadIdx.x; i < 3 * A8R_TILE / 4; i += F::THREADS)
            *(uint32_t *)(sm + W32_TILE_OFF(F::STAGES) + 4 * i) = 0u;
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
    if ((threadIdx.x >> 7) == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(F::PRODUCER_REGS));
        if (threadIdx.x == 0)
            ws31_producer<F>(tq, tk, tv, ops, base, b, bh, tile,
                             MEANS ? ops.v_mu + (size_t)bh * nblk * 128 : NULL);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(F::CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const uint64_t qd = sw128_desc(base + cw * 64 * 128);
    const int row0 = tile * F::ROWS + cw * 64 + warp * 16;
    float dq[2];
    qvc_q_scales(ops, bh, row0 + g, dq);
    attn8_acc r;
#pragma unroll
    for (int i = 0; i < 64; ++i) r.o[i] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
    mbar_wait(b.q, 0);
    ws31_mainloop<F, PMODE, MEANS>(r, ops, p.a, base, sm, b, qd, dq,
                                   ops.k_scale + (size_t)bh * nblk, ops.v_blk + (size_t)bh * nblk,
                                   cw, tig);
    attn8_epilogue<PMODE == A8_P_EXPCAST>(r, ops, p.a, bh, row0, g, tig);
}

template <int PMODE, int MEANS>
static qva_status ws31_launch_p(const qvc_ops *ops, const CUtensorMap *m, const attn8_params *p,
                                cudaStream_t st) {
    typedef ws31_flags F;
    CUtensorMap tq; /* Q in boxes of 192 rows */
    qva_status r = make_map(&tq, ops->q_i8, (uint64_t)ops->BH * ops->nq_pad, F::ROWS);
    if (r != QVA_OK) return r;
    const int smem = MEANS ? W32_SMEM_BYTES(F::STAGES) : W31_SMEM_BYTES(F::STAGES);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const attn8_params) =
        ws31_attn8<F, PMODE, MEANS>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "ws31 smem attribute");
    dim3 grid((unsigned)((ops->nq_pad + F::ROWS - 1) / F::ROWS), (unsigned)ops->BH);
    k<<<grid, F::THREADS, smem, st>>>(tq, m[1], m[2], *p);
    return qvc_launch_check("ws31_attn8");
}

template <int MEANS>
static qva_status ws31_launch(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                              cudaStream_t st) {
    CUtensorMap maps[4];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    if (a->expcast) return ws31_launch_p<A8_P_EXPCAST, MEANS>(ops, maps, &p, st);
    if (a->sum_codes) return ws31_launch_p<A8_P_CODESUM, MEANS>(ops, maps, &p, st);
    return ws31_launch_p<A8_P_EXP2, MEANS>(ops, maps, &p, st);
}

/* ws31: plain steps (the library kernel on V-Smooth steps); ws32: ws31
 * with the V-Smooth steps too, the restore batched as the library's. */
extern "C" qva_status dev_attn8_ws31(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (ops->v_mu || ops->v_t_lo) return launch_version<ws27_flags>(ops, fmt, a, st);
    return ws31_launch<0>(ops, fmt, a, st);
}
extern "C" qva_status dev_attn8_ws32(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (ops->v_t_lo) return launch_version<ws27_flags>(ops, fmt, a, st);
    return ops->v_mu ? ws31_launch<1>(ops, fmt, a, st) : ws31_launch<0>(ops, fmt, a, st);
}
