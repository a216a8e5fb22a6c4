/*
 * attn_qk8_pv8_ws_128x128: the Hopper 8-bit attention kernel (d = 128).
 *
 * Same arithmetic as attn_qk8_pv8_mma_64x128 (the correct-first kernel,
 * attn_qk8_pv8.cu): INT8 (or E4M3) QK with per-block scales, E4M3 P codes
 * from exp2 or ExpCast, a fresh FP32 PV partial per 128-key block, the
 * V-Smooth rank-1 restore, FP32 online softmax.  What changes is how the
 * tensor cores are fed:
 *
 *   warpgroup 0      producer: one thread issues TMA loads of the Q tile
 *                    and of a STAGES-deep ring of K / V^T tiles, each
 *                    completing on an mbarrier; its registers are given
 *                    to the consumers (setmaxnreg)
 *   warpgroups 1, 2  consumers, 64 query rows each:
 *                    S = Q K^T   wgmma m64n128k32, A and B from shared memory
 *                    P codes     built in registers (S accumulator layout)
 *                    O_j = P V   wgmma m64n128k32 (n136 with ExpCast: eight
 *                                ones rows after V give the row sum of the
 *                                decoded codes for free), A from registers
 *
 * Every tile is 128-byte rows with the 128-byte swizzle, written by TMA and
 * read by wgmma through the same layout.  V^T is K-major with the key order
 * of qvc_pv_slot_key(), so the S accumulator fragment is the PV A fragment
 * (the wgmma register fragments match mma.sync's m16n8k32 per warp).
 *
 * Versions, kept side by side (QVA_ATTN_KERNEL=wsN selects one; runtime.cu),
 * each timed by bench/compare.py --kernels (bench/NOTES.md has the numbers):
 *   ws0  2 stages; per block: QK, softmax, PV in sequence
 *   ws1  ws0 + QK of block j+1 issued before the softmax of block j
 *   ws2  4 stages; V-Smooth means arrive by bulk copy with the tile; no
 *        I2F / F2I / FRND on the softmax path (those share the 16/clk/SM
 *        pipe with MUFU): INT32 -> FP32 by the 1.5*2^23 magic add, the row
 *        max on the integers, ExpCast rounded by the magic add and packed
 *        with PRMT, exp2 by ex2.approx.ftz; O is rescaled only when a row
 *        max of the warp rose
 *   ws3  ws2 + the QK/softmax overlap of ws1, with PV in two halves of 64
 *        channels so the second S accumulator fits in registers
 *   ws4  ws2 with the score arithmetic fused: the ExpCast argument is one
 *        FMA from the integer score, t = x * 8f + (119.65 - 8m), and the
 *        exp2 argument x * f + (8.807 - m); the last (masked) block has its
 *        own copy, so full blocks pay no mask test.  Fusing changes the
 *        rounding of t by about 1e-4 of a code step, so a code can differ
 *        by one step from the reference's three-rounding form.
 *   ws5  ws4 with the two consumer warpgroups in ping-pong: named barriers
 *        make one warpgroup issue its GEMMs (PV of block j, then QK of
 *        j+1) while the other makes its P codes; the O update of block j
 *        runs under the QK of j+1.
 *   ws6  ws5 with shorter dependency chains in the softmax (profile of ws5:
 *        issue slots 48% busy, tensor pipe 34%, 0.7 eligible warps per
 *        scheduler: latency-bound): the row max as a 4-way tree and the
 *        exp2 row sum in 4 partial sums (FP32 order differs from ws5).
 *   ws7  three consumer warpgroups (192-row tiles: more warps per scheduler
 *        to hide latency, 1.5x less K/V traffic per FLOP) at 160 registers
 *        each, ws4's fused softmax, PV in halves, no ping-pong.  At 160
 *        registers ptxas spills ~600 B per thread (o and the S tile alone
 *        are 128).  Written after the last H200 run of its session: not
 *        yet measured or checked on the GPU.
 * ws2/ws3 are INT8-QK only (sage8/vc8); the fp8 method runs ws0.
 */
#include <type_traits>

#include "ws_common.cuh"

#define WS_TILE 16384 /* 128 rows x 128 bytes */
#define WS_ONES 1024  /* 8 rows x 128 bytes of E4M3 1.0 */
#define WS_MU 1024    /* the block's V-Smooth means, 128 f32 (512 B used) */
#define WS_STAGE_BYTES (2 * WS_TILE + WS_ONES + WS_MU)
/* Shared memory, from a 1024-byte aligned base, for n consumer warpgroups
 * (64 query rows each) and S stages:
 *   Q (n x 64 rows) | stage 0: V^T, ones, K, mu | stage 1 ... | mbarriers */
#define WS_Q_OFF 0
#define WS_QB(n) ((n) * 64 * 128)
#define WS_V_OFF(n, s) (WS_QB(n) + (s) * WS_STAGE_BYTES)
#define WS_ONES_OFF(n, s) (WS_V_OFF(n, s) + WS_TILE)
#define WS_K_OFF(n, s) (WS_ONES_OFF(n, s) + WS_ONES)
#define WS_MU_OFF(n, s) (WS_K_OFF(n, s) + WS_TILE)
#define WS_BAR_OFF(n, S) (WS_QB(n) + (S) * WS_STAGE_BYTES)
#define WS_SMEM_BYTES(n, S) (WS_BAR_OFF(n, S) + 8 * (1 + 2 * (S)) + 1024)
#define WS_PRODUCER_REGS 24


/* ------------------------------------------------------------ versions */
template <int VER>
struct ws_ver {
    enum {
        STAGES = VER >= 2 ? 4 : 2,
        OVERLAP = VER == 1 || VER == 3,
        FAST = VER >= 2, /* the conversion-free softmax, mu in shared memory */
        FUSED = VER >= 4, /* one FMA per score before the rounding */
        PINGPONG = VER == 5 || VER == 6,
        SHORT_CHAINS = VER >= 6,
        NCW = VER == 7 ? 3 : 2, /* consumer warpgroups of 64 query rows */
        HALVES = VER == 3 || VER == 7, /* PV in two 64-channel halves */
        ROWS = 64 * NCW,
        THREADS = 128 * (NCW + 1),
        /* registers per consumer thread after setmaxnreg: all of the file
         * (64K) minus the producer's 128 x 24, in multiples of 8 */
        CREGS = NCW == 2 ? 240 : 160,
    };
};

/* ------------------------------------------------------------ consumer */
typedef struct ws_params {
    qvc_ops ops;
    qvc_attn_args a;
} ws_params;

/* Issue S = Q K^T of the tile at k_addr (4 k-steps of 32 channels). */


template <int FMT, int EXPCAST, int VER>
__global__ void __launch_bounds__(ws_ver<VER>::THREADS, 1)
attn_qk8_pv8_ws_128x128(const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const ws_params p) {
    typedef ws_ver<VER> V;
    const int STAGES = V::STAGES, NCW = V::NCW, ROWS = V::ROWS;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const uint32_t bar_q = base + WS_BAR_OFF(NCW, STAGES);
    const uint32_t bar_full = bar_q + 8, bar_empty = bar_q + 8 + 8 * STAGES;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;
    const float *vmu = ops.v_mu ? ops.v_mu + (size_t)bh * nblk * 128 : NULL;
    const int mu_smem = V::FAST && vmu;

    /* The ones rows after each V tile never change: write them once. */
    for (int i = threadIdx.x; i < STAGES * WS_ONES / 4; i += V::THREADS)
        *(uint32_t *)(sm + WS_ONES_OFF(NCW, i / (WS_ONES / 4)) + 4 * (i % (WS_ONES / 4))) = 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bar_full + 8 * s, 1);
            mbar_init(bar_empty + 8 * s, NCW * 128); /* every consumer thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
        if (threadIdx.x == 0) {
            mbar_expect_tx(bar_q, WS_QB(NCW));
            tma_load_2d(base + WS_Q_OFF, &tq, 0, bh * ops.nq_pad + tile * ROWS, bar_q);
            for (int j = 0; j < nblk; ++j) {
                const int s = j % STAGES;
                const uint32_t full = bar_full + 8 * s;
                mbar_wait(bar_empty + 8 * s, ((j / STAGES) & 1) ^ 1);
                mbar_expect_tx(full, 2 * WS_TILE + (mu_smem ? 512 : 0));
                tma_load_2d(base + WS_K_OFF(NCW, s), &tk, 0, bh * ops.nk_pad + j * WS_KEYS, full);
                tma_load_2d(base + WS_V_OFF(NCW, s), &tv, 0, (bh * nblk + j) * 128, full);
                if (mu_smem) bulk_load(base + WS_MU_OFF(NCW, s), vmu + (size_t)j * 128, 512, full);
            }
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)ws_ver<VER>::CREGS));
    typedef typename std::conditional<FMT == QVC_QK_INT8, int, float>::type sacc_t;
    const int ctid = threadIdx.x - 128, cw = ctid >> 7; /* consumer warpgroup 0..NCW-1 */
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    const qvc_attn_args &a = p.a;
    const uint64_t qd = sw128_desc(base + WS_Q_OFF + cw * 64 * 128);
    /* INT8 Q scales are per 128 rows; a 192-row tile spans two blocks, and
     * its last warpgroup can lie past nq_pad (computed, never stored) */
    const int qblocks = ops.nq_pad / 128;
    const float dq = ops.q_scale[(size_t)bh * qblocks + min((tile * ROWS + cw * 64) / 128, qblocks - 1)];
    const float *kscale = ops.k_scale + (size_t)bh * nblk;
    const float *vblk = ops.v_blk + (size_t)bh * nblk;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    sacc_t sacc[64], snext[V::OVERLAP ? 64 : 1];

    mbar_wait(bar_q, 0);
    mbar_wait(bar_full, 0);
    issue_qk<FMT>(sacc, qd, base + WS_K_OFF(NCW, 0));
    wg_wait<0>();
    reg_fence(sacc);

    if (V::PINGPONG && FMT == QVC_QK_INT8) {
        /* ping-pong: warpgroup cw issues its GEMMs after barrier 1 + cw and
         * then lets the other one go (barrier 2 - cw); warpgroup 0 first */
        if (cw == 1) named_arrive(1, 256);
        for (int j = 0; j < nblk; ++j) {
            const int s = j % STAGES, sn = (j + 1) % STAGES, more = j + 1 < nblk;
            const float f = (dq * kscale[j]) * a.scale_log2;
            const float vb = vblk[j];
            int(&ia)[64] = *(int(*)[64])sacc;
            uint32_t pa[4][4];
            float rs[2] = {0.0f, 0.0f};
            float mx[2];
            int_row_max<V::SHORT_CHAINS>(ia, f, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], m[0]);
            mx[1] = fmaxf(mx[1], m[1]);
            raise_max(mx, m, l, o, 1);
            if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            if (!EXPCAST) {
                rs[0] = qvc_quad_sum(rs[0]);
                rs[1] = qvc_quad_sum(rs[1]);
            }
            if (more) mbar_wait(bar_full + 8 * sn, ((j + 1) / STAGES) & 1);

            named_sync(1 + cw, 256);
            float part[EXPCAST ? 68 : 64];
            const uint64_t vd = sw128_desc(base + WS_V_OFF(NCW, s));
            issue_pv<EXPCAST>(part, pa, vd);
            /* Always issued, so that no wgmma sits on a divergent path (ptxas
             * would serialize them); after the last block it re-reads this
             * block's K tile and the result is dropped. */
            issue_qk<FMT>(sacc, qd, base + WS_K_OFF(NCW, more ? sn : s));
            named_arrive(2 - cw, 256);

            wg_wait<1>(); /* PV of block j; QK of j+1 still running */
            reg_fence(part);
            if (EXPCAST) rs[0] = part[64], rs[1] = part[66];
            add_part<16>(o, part, 0, vb);
            if (mu_smem) restore_mu(o, rs, (const float *)(sm + WS_MU_OFF(NCW, s)), tig);
            mbar_arrive(bar_empty + 8 * s);
            l[0] += rs[0];
            l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
        if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
    } else
    for (int j = 0; j < nblk; ++j) {
        const int s = j % STAGES;
        const int sn = (j + 1) % STAGES;
        if (V::OVERLAP && j + 1 < nblk) {
            /* QK of the next block runs while this block's P is made */
            mbar_wait(bar_full + 8 * sn, ((j + 1) / STAGES) & 1);
            issue_qk<FMT>(*(sacc_t(*)[64])snext, qd, base + WS_K_OFF(NCW, sn));
        }
        const float f = (dq * kscale[j]) * a.scale_log2;
        const float vb = vblk[j];
        uint32_t pa[4][4];
        float rs[2] = {0.0f, 0.0f};
        if (V::FAST && FMT == QVC_QK_INT8) {
            float mx[2];
            int_row_max<0>(*(int(*)[64])sacc, f, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], m[0]);
            mx[1] = fmaxf(mx[1], m[1]);
            raise_max(mx, m, l, o, 1);
            int(&ia)[64] = *(int(*)[64])sacc;
            if (!V::FUSED)
                make_p<EXPCAST>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            else if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
        } else {
            float sc[16][4];
            scale_scores<FMT>(sacc, sc, f, j * WS_KEYS, ops.nk, tig);
            online_max(sc, m, l, o);
            const float mr0 = m[0] == -INFINITY ? 0.0f : m[0];
            const float mr1 = m[1] == -INFINITY ? 0.0f : m[1];
#pragma unroll
            for (int c = 0; c < 4; ++c) qvc_pack_p32(&sc[4 * c], mr0, mr1, EXPCAST, rs, pa[c]);
        }

        if (!EXPCAST) {
            rs[0] = qvc_quad_sum(rs[0]);
            rs[1] = qvc_quad_sum(rs[1]);
        }
        const uint32_t v_addr = base + WS_V_OFF(NCW, s);
        const float *mu_s = (const float *)(sm + WS_MU_OFF(NCW, s));
        if (V::HALVES) {
            /* PV in two channel halves: 36 accumulators live, not 68 */
            float part[36];
            const uint64_t vlo = sw128_desc(v_addr), vhi = sw128_desc(v_addr + 64 * 128);
            wg_fence();
#pragma unroll
            for (int c = 0; c < 4; ++c) wgmma_pv64(part, pa[c], vlo + 2 * c, c);
            wg_commit();
            wg_wait<0>(); /* this half, and QK of the next block */
            reg_fence(part);
            add_part<8>(o, part, 0, vb);
            wg_fence();
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                if (EXPCAST)
                    wgmma_pv72(part, pa[c], vhi + 2 * c, c);
                else
                    wgmma_pv64(part, pa[c], vhi + 2 * c, c);
            }
            wg_commit();
            wg_wait<0>();
            reg_fence(part);
            if (EXPCAST) rs[0] = part[32], rs[1] = part[34];
            add_part<8>(o, part, 8, vb);
            if (mu_smem) restore_mu(o, rs, mu_s, tig);
            /* mu and the tiles are read: the producer may refill the stage */
            mbar_arrive(bar_empty + 8 * s);
        } else {
            float part[EXPCAST ? 68 : 64];
            const uint64_t vd = sw128_desc(v_addr);
            issue_pv<EXPCAST>(part, pa, vd);
            wg_wait<0>(); /* PV of this block, and QK of the next if issued */
            reg_fence(part);
            if (EXPCAST) rs[0] = part[64], rs[1] = part[66]; /* any column: the same sum */
            if (V::FAST) {
                add_part<16>(o, part, 0, vb);
                if (mu_smem) restore_mu(o, rs, mu_s, tig);
                mbar_arrive(bar_empty + 8 * s);
            } else {
                mbar_arrive(bar_empty + 8 * s);
                const float *mu = vmu ? vmu + (size_t)j * 128 : NULL;
#pragma unroll
                for (int n = 0; n < 16; ++n) {
                    const int col = n * 8 + 2 * tig;
                    const float mu0 = mu ? __ldg(mu + col) : 0.0f;
                    const float mu1 = mu ? __ldg(mu + col + 1) : 0.0f;
                    o[n * 4 + 0] += part[n * 4 + 0] * vb;
                    o[n * 4 + 1] += part[n * 4 + 1] * vb;
                    o[n * 4 + 2] += part[n * 4 + 2] * vb;
                    o[n * 4 + 3] += part[n * 4 + 3] * vb;
                    if (mu) {
                        o[n * 4 + 0] += rs[0] * mu0;
                        o[n * 4 + 1] += rs[0] * mu1;
                        o[n * 4 + 2] += rs[1] * mu0;
                        o[n * 4 + 3] += rs[1] * mu1;
                    }
                }
            }
        }
        l[0] += rs[0];
        l[1] += rs[1];

        if (j + 1 < nblk) {
            if (V::OVERLAP) {
                reg_fence(snext);
#pragma unroll
                for (int i = 0; i < 64; ++i) sacc[i] = snext[V::OVERLAP ? i : 0];
            } else {
                mbar_wait(bar_full + 8 * sn, ((j + 1) / STAGES) & 1);
                issue_qk<FMT>(sacc, qd, base + WS_K_OFF(NCW, sn));
                wg_wait<0>();
                reg_fence(sacc);
            }
        }
    }

    /* ---- epilogue: out = O * chan_scale / l, LSE ---- */
    const int b = bh / a.H, h = bh % a.H;
    const float amp = EXPCAST ? 8.0f : QVC_P_AMP;
    const float *cs = ops.v_chan + (size_t)bh * 128;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = tile * ROWS + cw * 64 + warp * 16 + g + 8 * r;
        if (row >= ops.nq) continue;
        const int empty = m[r] == -INFINITY || !(l[r] > 0.0f);
        const float inv = empty ? 0.0f : 1.0f / l[r];
        const int64_t ob = b * a.osb + h * a.osh + (int64_t)row * a.osn;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = n * 8 + 2 * tig;
            const float2 c2 = __ldg((const float2 *)(cs + col));
            qvc_store_out2(a.out, a.out_dtype, ob + col, o[n * 4 + 2 * r] * c2.x * inv,
                           o[n * 4 + 2 * r + 1] * c2.y * inv);
        }
        if (a.lse && tig == 0) {
            float lse = empty ? -INFINITY : (m[r] + log2f(l[r]) - amp) * 0.69314718055994531f;
            /* K smoothing shifted every score of the row by q.kmean*sm_scale:
             * add it back, as the CPU does (-inf stays -inf) */
            if (a.lse_shift) lse = __fadd_rn(lse, a.lse_shift[(size_t)bh * ops.nq + row]);
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] = lse;
        }
    }
}


template <int FMT, int EXPCAST, int VER>
static qva_status launch_ws(const CUtensorMap *m, const ws_params *p, cudaStream_t st) {
    typedef ws_ver<VER> V;
    const int smem = WS_SMEM_BYTES(V::NCW, V::STAGES);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const ws_params) =
        attn_qk8_pv8_ws_128x128<FMT, EXPCAST, VER>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn_qk8_pv8_ws smem attribute");
    dim3 grid((unsigned)((p->ops.nq_pad + V::ROWS - 1) / V::ROWS), (unsigned)p->ops.BH);
    k<<<grid, V::THREADS, smem, st>>>(m[0], m[1], m[2], *p);
    return qvc_launch_check("attn_qk8_pv8_ws");
}

template <int VER>
static qva_status launch_int8(const CUtensorMap *m, const ws_params *p, int expcast,
                              cudaStream_t st) {
    return expcast ? launch_ws<QVC_QK_INT8, 1, VER>(m, p, st)
                   : launch_ws<QVC_QK_INT8, 0, VER>(m, p, st);
}

extern "C" qva_status qvc_attn_qk8_pv8_ws(const qvc_ops *ops, qvc_qk_format fmt,
                                          const qvc_attn_args *a, int version, cudaStream_t st) {
    if (ops->D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_qk8_pv8_ws: head dim %d (128 only)", ops->D);
    if (version < 0 || version > 7)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn_qk8_pv8_ws: no version %d", version);
    CUtensorMap maps[3];
    qva_status r;
    const uint32_t q_box = fmt == QVC_QK_INT8 && version == 7 ? 192 : 128; /* ws_ver::ROWS */
    if ((r = make_map(&maps[0], ops->q_i8, (uint64_t)ops->BH * ops->nq_pad, q_box)) != QVA_OK ||
        (r = make_map(&maps[1], ops->k_i8, (uint64_t)ops->BH * ops->nk_pad, 128)) != QVA_OK ||
        (r = make_map(&maps[2], ops->v_t, (uint64_t)ops->BH * ops->nblk * 128, 128)) != QVA_OK)
        return r;
    ws_params p;
    p.ops = *ops;
    p.a = *a;
    const int ec = a->expcast != 0;
    if (fmt == QVC_QK_E4M3) /* the fp8 method: ws0 only */
        return ec ? launch_ws<QVC_QK_E4M3, 1, 0>(maps, &p, st)
                  : launch_ws<QVC_QK_E4M3, 0, 0>(maps, &p, st);
    switch (version) {
    case 0: return launch_int8<0>(maps, &p, ec, st);
    case 1: return launch_int8<1>(maps, &p, ec, st);
    case 2: return launch_int8<2>(maps, &p, ec, st);
    case 3: return launch_int8<3>(maps, &p, ec, st);
    case 4: return launch_int8<4>(maps, &p, ec, st);
    case 5: return launch_int8<5>(maps, &p, ec, st);
    case 6: return launch_int8<6>(maps, &p, ec, st);
    default: return launch_int8<7>(maps, &p, ec, st);
    }
}
