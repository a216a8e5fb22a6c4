/*
 * The pieces of attn8_ws_128x128 (dense/attn8_ws_128x128.cu holds the
 * kernel and its launcher; its header comment says what the kernel does):
 * the flags, the shared-memory layout, the producer, the two mainloops and
 * the epilogue (the V-Smooth restore of the INT8 mainloop is in
 * attn8_restore.cuh).  Kernel versions under trial (dev/cuda) build on them.
 */
#ifndef QVATTN_ATTN8_WS_CUH
#define QVATTN_ATTN8_WS_CUH

#include "common/hopper.cuh"
#include "common/softmax.cuh"

/* ------------------------------------------------------------ flags */
/* The P path of a call: its codes and where its row sum comes from. */
#define A8_P_EXP2 0    /* exp2 codes, FP32 row sum (DA2 C.3)                    */
#define A8_P_EXPCAST 1 /* ExpCast codes, the decoded codes' sum from the ones row */
#define A8_P_CODESUM 2 /* exp2 codes, the decoded codes' sum from the ones row
                          (QVA_P_SUM_CODES)                                     */
#define A8_P_U8 3      /* +i8pv: u8 codes of each block's row max against INT8
                          V, the s32 product and code sums (ones row of 1) */
#define A8_P_EXPCAST5 4 /* +expcast-e5m2: ExpCast's code in E5M2 (E5M2 x E4M3
                           PV), the decoded codes' sum from the ones row */
#define A8_P_U8_FP32SUM 5 /* +i8pv+fp32sum: A8_P_U8's codes and product, l the
                             FP32 sum of the weights before their rounding */
/* A bit beside the path (INT8 loop, E4M3 P): +pblock, the codes of each
 * block's own row max m_b, the block's partial and row sum times
 * w = exp2(m_b - m) */
#define A8_P_BLOCK 8
#define A8_P_PATH(pm) ((pm) & 7)

/* The compile-time shape of the kernel for one QK format; the one place
 * where its options are chosen.  Rejected (dev/cuda/README.md):
 *   two INT8 consumer warpgroups in ping-pong, one issuing PV(j) and
 *   QK(j+1) while the other made its P codes: 9-10% slower on plain steps
 *   than three warpgroups that each run QK, softmax, PV in turn (ws31, ws32)
 *   in that ping-pong, QK(j+1) issued before the softmax of j: spills (ws1,
 *   ws3); or QK(j+1) then PV(j), the codes of j+1 made under PV(j): 5%
 *   slower (ws27: the O update moves onto the path)
 *   the float-score softmax for INT8: I2F/F2I share the MUFU pipe (ws0)
 *   block j+1's K and V scales loaded during block j: 1.5% slower (ws11)
 *   the turn's wgmma descriptors made before its barrier: no change (ws13)
 *   the mean tile filled two blocks per store: 4.5% slower (ws14)
 *   a 5- or 6-stage K/V ring: 0.4-0.8% slower (ws15, ws16)
 *   PV of 2 or 4 key blocks accumulated in the wgmma per O update: no
 *   faster on compare.py's data, rel-L2 +11% (ws17, ws18; bench/NOTES.md)
 *   the mean tile copied per batch by cp.async instead of filled per
 *   block: 1% slower with 3% fewer instructions (ws19)
 *   1, 2 or 3 of every 4 exp2 scores by a polynomial on the FMA pipe:
 *   sage8 6%, 14%, 20% slower; issue, not MUFU, is the limit (ws20-ws22);
 *   on the three-warpgroup kernel 1 of 4: the code sum's path as fast, the
 *   FP32 sum's 9% slower; 2 of 4: 12% slower (ws35, ws36 at 40cc920)
 *   the code sum's exp2 by ex2.approx.f16x2: on sm_90a two MUFU.EX2.F16
 *   and a PRMT per pair, +9.6% instructions; not run (ws42)
 *   Q's INT8 codes made by the consumers from the caller's 16-bit Q: prep
 *   0.28 ms shorter, the kernel as much longer (c1b4176; bench/NOTES.md)
 *   the restore's wgmma in the next batch's first turn or at the batch's
 *   end (SS): 5% slower on the reuse step; left in flight across the batch
 *   loop's back edge, ptxas serializes every wgmma (C7515) (ws24-ws26)
 *   one mean tile per batch shared by the three warpgroups, filled by a
 *   producer warp: 30 instructions per block fewer, 0.5% faster on the
 *   reuse step (ws33, at 0c7dcb4); the tiles now come ready-made from the
 *   preparation instead (attn8_restore.cuh)
 *   V-Smooth's pending row sums one word per block and quad: 17
 *   instructions fewer, no faster (ws44, at 2d64c00)
 *   those sums stored, and rescaled on a rise, under the next block's QK
 *   instead of after the PV wait: 0.2-1.8% slower on the reuse step
 *   (ws49, ws50, ws52, at 3488159) */
template <int QK_FMT, int HEAD_DIM = 128>
struct attn8_ws_flags {
    static constexpr int FMT = QK_FMT;
    /* Head dim 64 runs in the head-dim-128 tiles: Q and K rows of 64
     * bytes fill the first half of each 128-byte tile row (TMA zero-fills
     * the rest), QK takes two k-steps instead of four, PV and the mean
     * restore run at n64 (n72 with the ones rows, which sit at V^T's row
     * 64, written once), and O is 32 registers.  The softmax, which sets
     * the pace, is the same per score. */
    static constexpr int D = HEAD_DIM;
    static constexpr int QK_KSTEPS = D / 32;
    static constexpr int V_BYTES = D * 128; /* V^T's rows of one stage, as loaded */
    static constexpr bool INT8 = FMT == QVC_QK_INT8;
    static constexpr int STAGES = INT8 ? 4 : 2;   /* K/V ring depth */
    static constexpr bool SHORT_CHAINS = true;    /* 4-way row max, 4 partial exp2 sums */
    /* INT8: three warpgroups of 64 query rows, each running QK, softmax and
     * PV of a block in turn, so that every scheduler holds three consumer
     * warps (bench/NOTES.md, "Three consumer warpgroups"); at head dim 64,
     * whose O and PV partial are half as large, four fit the registers
     * (sage8 12% faster, bench/NOTES.md, ws37); E4M3: two. */
    static constexpr int CONSUMERS = INT8 ? (D == 64 ? 4 : 3) : 2;
    static constexpr int ROWS = 64 * CONSUMERS;
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    /* registers per consumer thread after setmaxnreg: what the launch
     * gave the CTA (THREADS x the per-thread cap of __launch_bounds__, in
     * multiples of 8) minus the producer's 128 x 24, in multiples of 8.
     * Asking for more than the CTA holds makes setmaxnreg.inc wait
     * forever (640 threads get 96 each: 61,440, not the whole 64K file). */
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static constexpr int CONSUMER_REGS =
        (LAUNCH_REGS * THREADS - PRODUCER_REGS * 128) / (CONSUMERS * 128) / 8 * 8;
    static constexpr bool VLO = false;            /* V's second digit (below) */
    /* the P paths (bits 1 << A8_P_*) whose INT8 loop carries the
     * shared-memory base and Q's descriptor from block to block instead of
     * rebuilding them from special registers: ExpCast's plain step 2.4%
     * faster, the exp2 path's 1% slower (bench/NOTES.md, ws34) */
    static constexpr int CARRY_PMODES =
        (1 << A8_P_EXPCAST) | (1 << A8_P_CODESUM) | (1 << A8_P_EXPCAST5);
    /* the P paths (bits 1 << PMODE) whose plain-step loop rescales O for
     * a rising row max after the PV issue, under the PV, instead of
     * between the QK wait and the P codes (the PV writes a fresh partial,
     * not O), its factors kept in shared memory meanwhile: the code sum's
     * path (sage8's and vc8's default) 3.3-4.7% faster; the default's
     * ExpCast with +pblock 2.4% slower, so not there (bench/NOTES.md,
     * ws51).  Head dim 128 only, where it was timed. */
    static constexpr int LATE_RESCALE_PMODES = D == 128 ? 1 << A8_P_CODESUM : 0;
};

/* V in two E4M3 digits (QVA_V_E4M3X2, INT8 QK): a third 16 KB tile per
 * stage (v_t_lo), whose PV product adds to the same partial; three
 * stages. */
struct attn8_v2_flags : attn8_ws_flags<QVC_QK_INT8, 128> {
    static constexpr int STAGES = 3;
    static constexpr bool VLO = true;
    static constexpr int LATE_RESCALE_PMODES = 0; /* not timed with V's two digits */
};

#define A8_TILE 16384 /* 128 rows x 128 bytes */
#define A8_ONES 1024  /* 8 rows x 128 bytes of 1.0 (E4M3 0x38; +i8pv INT8 0x01) */
#define A8_STAGE_BYTES (2 * A8_TILE + A8_ONES)

#include "dense/attn8_restore.cuh"

/* Shared memory from a 1024-byte aligned base:
 *   Q (ROWS rows) | stage 0: V^T, ones, K | stage 1 ... | mbarriers
 *   | V-Smooth: two mean tiles (attn8_restore.cuh), pending sums
 *   | +v2: the lo tiles of the stages */
template <class F>
struct attn8_layout {
    static constexpr int Q = 0;
    static constexpr int QB = F::ROWS * 128;
    static constexpr int v(int s) { return QB + s * A8_STAGE_BYTES; }
    /* the ones rows' room at head dim 128; at 64 they sit at v(s) +
     * F::V_BYTES, inside the V^T tile's room (its rows 64..127 are never
     * loaded), and this room stays unused */
    static constexpr int ones(int s) { return v(s) + A8_TILE; }
    static constexpr int k(int s) { return ones(s) + A8_ONES; }
    static constexpr int BARS = QB + F::STAGES * A8_STAGE_BYTES;
    /* Q, full[S], empty[S], the mean tiles' full[2] and empty[2] */
    static constexpr int BARS_END = BARS + 8 * (1 + 2 * F::STAGES + 4);
    /* INT8 QK: block j's K scale and V block scale, two floats a stage,
     * handed over by the producer (read with one LDS each after the stage
     * wait, where two global loads and their addressing sat on the
     * consumers' path: sage8 2.7-3.2% faster, the default's plain step
     * 0.2-1.0%, bench/NOTES.md, ws43); the E4M3 QK loop reads them from
     * global memory */
    static constexpr int SCAL = BARS_END;
    static constexpr int SCAL_END = SCAL + (F::INT8 ? 8 * F::STAGES : 0);
    static constexpr int TILES = (SCAL_END + 1023) & ~1023;
    /* LATE_RESCALE_PMODES (plain steps): each consumer thread's two
     * rescale factors, from the block whose max rose to their use, in the
     * room that V-Smooth's steps give the mean tiles */
    static constexpr int ALPHA = TILES;
    static constexpr int ALPHA_END =
        F::LATE_RESCALE_PMODES ? ALPHA + F::CONSUMERS * 128 * 8 : SCAL_END;
    static constexpr int PEND = TILES + 2 * QVC_MU_TILE_BYTES;
    static constexpr int PEND_END = PEND + F::CONSUMERS * 128 * 16;
    static constexpr int VLO = (PEND_END + 1023) & ~1023;
    static constexpr int vlo(int s) { return VLO + s * A8_TILE; }
    /* dynamic shared memory, with 1024 bytes for the alignment */
    static constexpr int bytes(bool means) {
        return (F::VLO ? VLO + F::STAGES * A8_TILE : means ? PEND_END : ALPHA_END) + 1024;
    }
};

typedef struct attn8_params {
    qvc_ops ops;
    qvc_attn_args a;
} attn8_params;

/* The mbarriers: Q, the ring's full[s] and empty[s], the mean tiles'
 * mt_full[2] and mt_empty[2]. */
typedef struct attn8_bars {
    uint32_t q, full, empty, mt_full, mt_empty;
} attn8_bars;

/* ------------------------------------------------------------ producer */
template <class F>
static __device__ __forceinline__ void attn8_producer(const CUtensorMap &tq, const CUtensorMap &tk,
                                                      const CUtensorMap &tv, const CUtensorMap &tvl,
                                                      const qvc_ops &ops, uint32_t base,
                                                      attn8_bars b, int bh, int tile,
                                                      const uint16_t *mtiles) {
    typedef attn8_layout<F> L;
    mbar_expect_tx(b.q, L::QB);
    tma_load_2d(base + L::Q, &tq, 0, bh * ops.nq_pad + tile * F::ROWS, b.q);
    const float *kscale = ops.k_scale + (size_t)bh * ops.nblk;
    const float *vblk = ops.v_blk + (size_t)bh * ops.nblk;
    float ks_n = 0.0f, vb_n = 0.0f; /* block j + 1's, loaded before block j's wait */
    if constexpr (F::INT8) ks_n = kscale[0], vb_n = vblk[0];
    for (int j = 0; j < ops.nblk; ++j) {
        const int s = j % F::STAGES;
        const uint32_t full = b.full + 8 * s;
        const float ks = ks_n, vb = vb_n;
        if constexpr (F::INT8)
            if (j + 1 < ops.nblk) ks_n = kscale[j + 1], vb_n = vblk[j + 1];
        if (mtiles && j % QVC_MU_BATCH == 0) { /* batch t's mean tile into buffer t mod 2 */
            const int t = j / QVC_MU_BATCH, u = t & 1;
            mbar_wait(b.mt_empty + 8 * u, ((t >> 1) & 1) ^ 1);
            mbar_expect_tx(b.mt_full + 8 * u, QVC_MU_TILE_BYTES);
            bulk_load(base + L::TILES + u * QVC_MU_TILE_BYTES,
                      mtiles + (size_t)t * (QVC_MU_TILE_BYTES / 2), QVC_MU_TILE_BYTES,
                      b.mt_full + 8 * u);
        }
        mbar_wait(b.empty + 8 * s, ((j / F::STAGES) & 1) ^ 1);
        if constexpr (F::INT8) { /* before the arrive, which releases them */
            st_shared_u32(base + L::SCAL + 8 * s, __float_as_uint(ks));
            st_shared_u32(base + L::SCAL + 8 * s + 4, __float_as_uint(vb));
        }
        mbar_expect_tx(full, A8_TILE + (F::VLO ? 2 : 1) * F::V_BYTES);
        tma_load_2d(base + L::k(s), &tk, 0, bh * ops.nk_pad + j * WS_KEYS, full);
        tma_load_2d(base + L::v(s), &tv, 0, (bh * ops.nblk + j) * F::D, full);
        if (F::VLO) tma_load_2d(base + L::vlo(s), &tvl, 0, (bh * ops.nblk + j) * F::D, full);
    }
}

/* ------------------------------------------------------------ mainloops */
/* The per-consumer state: O, the running max m and the row sum l of the
 * thread's two rows (g and g + 8 of its warp's 16). */
template <int D>
struct attn8_acc {
    float o[D / 2];
    float m[2], l[2];
};

/* INT8 QK: each consumer warpgroup runs a block's QK, softmax, PV and O
 * update in turn, waiting for each GEMM (three warpgroups keep the tensor
 * pipe fed; at 160 registers a warpgroup holds O, then S or the partial,
 * and the P fragment, never two accumulators in flight).
 * MEANS (V-Smooth's demeaned steps): the restore O += r_j mu_j^T is
 * batched, one FP16 wgmma per QVC_MU_BATCH blocks (attn8_restore.cuh); the
 * batches are the outer loop, so that the restore's wgmma sits on every
 * path through it (ptxas serializes wgmmas it finds on a conditional one).
 * Without MEANS one batch holds every block. */
template <class F, int PMODE, int MEANS>
static __device__ __forceinline__ void attn8_mainloop_int8(attn8_acc<F::D> &r, const qvc_ops &ops,
                                                           const qvc_attn_args &a, uint32_t base,
                                                           uint8_t *sm, attn8_bars b, uint64_t qd,
                                                           const float (&dq)[2], int tig) {
    typedef attn8_layout<F> L;
    /* EXPCAST: 1 ExpCast's E4M3 code, 2 its E5M2 code (make_p_fused) */
    constexpr int PM = A8_P_PATH(PMODE), PBLK = (PMODE & A8_P_BLOCK) != 0;
    constexpr int EXPCAST = PM == A8_P_EXPCAST ? 1 : PM == A8_P_EXPCAST5 ? 2 : 0;
    constexpr int P5 = PM == A8_P_EXPCAST5, ONES = PM != A8_P_EXP2;
    constexpr int U8 = PM == A8_P_U8 || PM == A8_P_U8_FP32SUM;
    constexpr int U8_SUM32 = PM == A8_P_U8_FP32SUM;
    static_assert(!PBLK || (!U8 && !P5 && !F::VLO), "+pblock: E4M3 P, one V code");
    static_assert(!P5 || !F::VLO, "+expcast-e5m2 has one V code");
    static_assert(!U8 || !F::VLO, "+i8pv has one V code");
    constexpr int NT = F::CONSUMERS * 128;
    uint32_t *ph = MEANS ? a8r_pending<NT>(sm, L::PEND) : NULL;
    const uint32_t ph_s = MEANS ? smem_addr(ph) : 0u;
    const int batch = MEANS ? QVC_MU_BATCH : ops.nblk;
    /* The shared-memory base and Q's descriptor (its high word is a
     * constant) carried through the loop as values the compiler cannot
     * recompute: at 160 registers it otherwise rebuilt both from the
     * special registers every block (about 30 instructions). */
    uint32_t base_c = base, qd_lo = (uint32_t)qd;
    /* LATE: O rescaled after the PV issue (LATE_RESCALE_PMODES); this
     * thread's factors held in shared memory meanwhile (in registers they
     * cost spills on the path after the QK wait) */
    constexpr bool LATE = !MEANS && !U8 && ((F::LATE_RESCALE_PMODES >> PMODE) & 1);
    const auto alpha_at = [&](uint32_t sb) { return sb + L::ALPHA + 8u * (threadIdx.x - 128); };
    for (int j0 = 0; j0 < ops.nblk; j0 += batch) {
        const int j1 = min(j0 + batch, ops.nblk);
        for (int j = j0; j < j1; ++j) {
            if ((F::CARRY_PMODES >> PM) & 1) asm volatile("" : "+r"(base_c), "+r"(qd_lo));
            const uint32_t sb = base_c; /* the shared-memory base, as carried */
            const uint64_t qdj = (qd & 0xFFFFFFFF00000000ull) | qd_lo;
            const int s = j % F::STAGES;
            int sacc[64];
            mbar_wait(b.full + 8 * s, (j / F::STAGES) & 1);
            issue_qk<QVC_QK_INT8, F::QK_KSTEPS>(sacc, qdj, sb + L::k(s));
            const float ksj = __uint_as_float(ld_shared_u32(sb + L::SCAL + 8 * s));
            const float f0 = (dq[0] * ksj) * a.scale_log2, f1 = (dq[1] * ksj) * a.scale_log2;
            const float vb = __uint_as_float(ld_shared_u32(sb + L::SCAL + 8 * s + 4));
            wg_wait<0>();
            reg_fence(sacc);
            uint32_t pa[4][4];
            float rs[2] = {0.0f, 0.0f};
            float mx[2];
            int_row_max<F::SHORT_CHAINS>(sacc, f0, f1, j * WS_KEYS, ops.nk, tig, mx);
            const float mb[2] = {mx[0], mx[1]}; /* the block's own row max (+i8pv) */
            (void)mb;
            mx[0] = fmaxf(mx[0], r.m[0]);
            mx[1] = fmaxf(mx[1], r.m[1]);
            if (MEANS) { /* the pending row sums are rescaled as O is, both
                          * where some row of the warp rose (x 1 is exact) */
                float alpha[2];
                qvc_softmax_new_max<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, alpha);
                if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
                    qvc_softmax_rescale<0>(qvc_rows_of(r.o), alpha);
                    a8r_rescale<NT>(ph, alpha);
                }
            } else if constexpr (LATE) { /* the factors stored every block */
                float alpha[2];
                qvc_softmax_new_max<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, alpha);
                st_shared_u32(alpha_at(sb), __float_as_uint(alpha[0]));
                st_shared_u32(alpha_at(sb) + 4, __float_as_uint(alpha[1]));
            } else {
                qvc_softmax_raise<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, qvc_rows_of(r.o));
            }
            if constexpr (U8) { /* +i8pv: the block's weight w = exp2(m_b - m) per row */
                if ((j + 1) * WS_KEYS > ops.nk)
                    make_p_u8<1, U8_SUM32>(sacc, f0, f1, mb[0], mb[1], j * WS_KEYS, ops.nk, tig,
                                           rs, pa);
                else
                    make_p_u8<0, U8_SUM32>(sacc, f0, f1, mb[0], mb[1], j * WS_KEYS, ops.nk, tig,
                                           rs, pa);
                if (U8_SUM32) { /* the row's sum of this block, times 255 as the codes */
                    rs[0] = qvc_quad_sum(rs[0]) * 255.0f;
                    rs[1] = qvc_quad_sum(rs[1]) * 255.0f;
                }
                int ip[72];
                issue_pv_u8(ip, pa, sw128_desc(sb + L::v(s)));
                wg_wait<0>();
                reg_fence(ip);
#pragma unroll
                for (int c = 0; c < 4; ++c) reg_fence(pa[c]);
                const float w0 = ex2_ftz(mb[0] - r.m[0]), w1 = ex2_ftz(mb[1] - r.m[1]);
                if (U8_SUM32) /* the weights' sum: keys coded 0 stay in l */
                    rs[0] *= w0, rs[1] *= w1;
                else /* the codes' sum, from the ones rows */
                    rs[0] = __int2float_rn(ip[64]) * w0, rs[1] = __int2float_rn(ip[66]) * w1;
                const float wv0 = w0 * vb, wv1 = w1 * vb;
#pragma unroll
                for (int n = 0; n < 16; ++n) { /* |s32| < 2^24: exact floats */
                    r.o[n * 4 + 0] = __fmaf_rn(__int2float_rn(ip[n * 4 + 0]), wv0, r.o[n * 4 + 0]);
                    r.o[n * 4 + 1] = __fmaf_rn(__int2float_rn(ip[n * 4 + 1]), wv0, r.o[n * 4 + 1]);
                    r.o[n * 4 + 2] = __fmaf_rn(__int2float_rn(ip[n * 4 + 2]), wv1, r.o[n * 4 + 2]);
                    r.o[n * 4 + 3] = __fmaf_rn(__int2float_rn(ip[n * 4 + 3]), wv1, r.o[n * 4 + 3]);
                }
            } else {
                /* the max the codes are taken against: the row's, or (+pblock) the block's */
                const float mc0 = PBLK ? mb[0] : r.m[0], mc1 = PBLK ? mb[1] : r.m[1];
                if ((j + 1) * WS_KEYS > ops.nk)
                    make_p_fused<EXPCAST, 1, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, mc0, mc1,
                                                                     a.expcast_add, j * WS_KEYS,
                                                                     ops.nk, tig, rs, pa);
                else
                    make_p_fused<EXPCAST, 0, F::SHORT_CHAINS, !ONES>(sacc, f0, f1, mc0, mc1,
                                                                     a.expcast_add, j * WS_KEYS,
                                                                     ops.nk, tig, rs, pa);
                if (!ONES) {
                    rs[0] = qvc_quad_sum(rs[0]);
                    rs[1] = qvc_quad_sum(rs[1]);
                }
                float part[PV_REGS(F::D, ONES)];
                if constexpr (F::VLO)
                    issue_pv_digits<ONES>(part, pa, sw128_desc(sb + L::v(s)),
                                          sw128_desc(sb + L::vlo(s)));
                else
                    issue_pv<ONES, P5, F::D>(part, pa, sw128_desc(sb + L::v(s)));
                if constexpr (LATE) { /* the factors read back and the warp's
                                       * vote taken again here, so that nothing
                                       * stays live across the P codes */
                    const float al[2] = {__uint_as_float(ld_shared_u32(alpha_at(sb))),
                                         __uint_as_float(ld_shared_u32(alpha_at(sb) + 4))};
                    qvc_softmax_rescale<QVC_SM_SKIP_UNCHANGED>(qvc_rows_of(r.o), al);
                }
                wg_wait<0>();
                reg_fence(part);
                /* the wgmma reads pa until the wait; to the compiler it took
                 * pa at issue, so this use keeps pa's registers from reuse */
#pragma unroll
                for (int c = 0; c < 4; ++c) reg_fence(pa[c]);
                if (ONES) rs[0] = part[F::D / 2], rs[1] = part[F::D / 2 + 2];
                if (PBLK) { /* the block's weight per row, as +i8pv's */
                    const float w0 = ex2_ftz(mb[0] - r.m[0]), w1 = ex2_ftz(mb[1] - r.m[1]);
                    rs[0] *= w0, rs[1] *= w1;
                    add_part<F::D / 8>(r.o, part, w0 * vb, w1 * vb);
                } else {
                    add_part<F::D / 8>(r.o, part, vb, vb);
                }
            }
            if (MEANS) a8r_pend<NT, P5>(ph_s, rs, j, tig);
            r.l[0] += rs[0];
            r.l[1] += rs[1];
            mbar_arrive(b.empty + 8 * s);
        }
        if (MEANS) {
            const int t = j0 / QVC_MU_BATCH, u = t & 1;
            a8r_flush<NT, P5>(r.o, ph, base_c + L::TILES + u * QVC_MU_TILE_BYTES,
                              b.mt_full + 8 * u, (t >> 1) & 1, b.mt_empty + 8 * u);
        }
    }
}

/* E4M3 QK (fp8, which has no V-Smooth means): per block QK, float-score
 * softmax, PV in sequence.  sacc holds QK(0). */
template <class F, int PMODE>
static __device__ __forceinline__ void attn8_mainloop_sequential(
    attn8_acc<F::D> &r, float (&sacc)[64], const qvc_ops &ops, const qvc_attn_args &a, uint32_t base,
    attn8_bars b, uint64_t qd, const float (&dq)[2], const float *kscale, const float *vblk,
    int tig) {
    typedef attn8_layout<F> L;
    constexpr int EXPCAST = PMODE == A8_P_EXPCAST, ONES = PMODE != A8_P_EXP2;
    for (int j = 0; j < ops.nblk; ++j) {
        const int s = j % F::STAGES, sn = (j + 1) % F::STAGES;
        const float f0 = (dq[0] * kscale[j]) * a.scale_log2, f1 = (dq[1] * kscale[j]) * a.scale_log2;
        const float vb = vblk[j];
        uint32_t pa[4][4];
        float rs[2] = {0.0f, 0.0f};
        float sc[16][4];
        scale_scores<QVC_QK_E4M3>(sacc, sc, f0, f1, j * WS_KEYS, ops.nk, tig);
        float mx[2];
        qvc_softmax_row_max(sc, r.m, mx);
        qvc_softmax_raise<0>(mx, r.m, r.l, qvc_rows_of(r.o));
        const float mr0 = qvc_softmax_shift(r.m[0]), mr1 = qvc_softmax_shift(r.m[1]);
#pragma unroll
        for (int c = 0; c < 4; ++c) qvc_pack_p32(&sc[4 * c], mr0, mr1, EXPCAST, a.expcast_add, rs, pa[c]);
        if (!ONES) {
            rs[0] = qvc_quad_sum(rs[0]);
            rs[1] = qvc_quad_sum(rs[1]);
        }
        float part[PV_REGS(F::D, ONES)];
        issue_pv<ONES, 0, F::D>(part, pa, sw128_desc(base + L::v(s)));
        wg_wait<0>();
        reg_fence(part);
        if (ONES) rs[0] = part[F::D / 2], rs[1] = part[F::D / 2 + 2]; /* any column: the same sum */
        mbar_arrive(b.empty + 8 * s);
#pragma unroll
        for (int n = 0; n < F::D / 8; ++n) {
            r.o[n * 4 + 0] += part[n * 4 + 0] * vb;
            r.o[n * 4 + 1] += part[n * 4 + 1] * vb;
            r.o[n * 4 + 2] += part[n * 4 + 2] * vb;
            r.o[n * 4 + 3] += part[n * 4 + 3] * vb;
        }
        r.l[0] += rs[0];
        r.l[1] += rs[1];
        if (j + 1 < ops.nblk) {
            mbar_wait(b.full + 8 * sn, ((j + 1) / F::STAGES) & 1);
            issue_qk<QVC_QK_E4M3, F::QK_KSTEPS>(sacc, qd, base + L::k(sn));
            wg_wait<0>();
            reg_fence(sacc);
        }
    }
}

/* ------------------------------------------------------------ epilogue */
template <int PMODE_BITS, int D>
static __device__ __forceinline__ void attn8_epilogue(const attn8_acc<D> &r, const qvc_ops &ops,
                                                      const qvc_attn_args &a, int bh, int row0,
                                                      int g, int tig) {
    constexpr int PMODE = A8_P_PATH(PMODE_BITS);
    const int b = bh / a.H, h = bh % a.H;
    /* log2 of the P codes' scale: ExpCast's 2^8 (E5M2: 2^15), +i8pv's 255 */
    const float amp = PMODE == A8_P_EXPCAST    ? 8.0f
                      : PMODE == A8_P_EXPCAST5 ? QVI_EXPCAST5_LOG2_AMP
                      : PMODE == A8_P_U8 || PMODE == A8_P_U8_FP32SUM ? QVI_U8_LOG2_AMP
                                               : QVC_P_AMP;
    const float *cs = ops.v_chan + (size_t)bh * D;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = row0 + g + 8 * i;
        if (row >= ops.nq) continue;
        const int kind = qvc_softmax_row(r.m[i], r.l[i], true); /* a dense row retains every key */
        const float inv = kind ? qvc_softmax_fill(kind) : 1.0f / r.l[i]; /* NaN, or 0 times O = 0 */
        const int64_t ob = b * a.osb + h * a.osh + (int64_t)row * a.osn;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * tig;
            const float2 c2 = __ldg((const float2 *)(cs + col));
            qvc_store_out2(a.out, a.out_dtype, ob + col, r.o[n * 4 + 2 * i] * c2.x * inv,
                           r.o[n * 4 + 2 * i + 1] * c2.y * inv);
        }
        if (a.lse && tig == 0) {
            float lse = kind ? qvc_softmax_lse_fill(kind) : (r.m[i] + log2f(r.l[i]) - amp) * 0.69314718055994531f;
            /* K smoothing shifted every score of the row by q.kmean*sm_scale:
             * add it back, as the CPU does (-inf and NaN stay) */
            if (a.lse_shift) lse = __fadd_rn(lse, a.lse_shift[(size_t)bh * ops.nq + row]);
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] = lse;
        }
    }
}

/* ------------------------------------------------------------ kernel */
/* F: the flags (attn8_ws_flags or a dev/cuda variant of them).  MEANS:
 * the call has V-Smooth means (INT8 QK only), restored in batches from
 * shared memory.  PMODE: A8_P_*. */
template <class F, int PMODE, int MEANS>
__global__ void __launch_bounds__(F::THREADS, 1)
attn8_ws_128x128(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tvl,
                 const attn8_params p) {
    typedef attn8_layout<F> L;
    extern __shared__ uint8_t smem_raw[];
    /* 1024-byte aligned, as an offset from smem_raw rather than an integer
     * cast, so that the compiler knows every access through sm is shared
     * memory (LDS/STS, not generic LD/ST) */
    uint8_t *sm = smem_raw + ((1024u - ((uint32_t)(uintptr_t)smem_raw & 1023u)) & 1023u);
    const uint32_t base = smem_addr(sm);
    attn8_bars b;
    b.q = base + L::BARS;
    b.full = b.q + 8, b.empty = b.q + 8 + 8 * F::STAGES;
    b.mt_full = b.empty + 8 * F::STAGES, b.mt_empty = b.mt_full + 16;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;
    static_assert(!MEANS || F::INT8, "means ride with the INT8 path only");
    const uint16_t *mtiles = MEANS ? ops.v_mu_tile + bh * (qvc_mu_head_bytes(nblk) / 2) : NULL;

    static_assert(F::D == 128 || (F::D == 64 && !F::VLO), "head dim 64 or 128; +v2 at 128");
    /* The ones rows after each V tile's D rows never change: write them
     * once (at head dim 64 into the tile's row 64, which TMA never loads). */
    for (int i = threadIdx.x; i < F::STAGES * A8_ONES / 4; i += F::THREADS)
        *(uint32_t *)(sm + L::v(i / (A8_ONES / 4)) + F::V_BYTES + 4 * (i % (A8_ONES / 4))) =
            (A8_P_PATH(PMODE) == A8_P_U8 || A8_P_PATH(PMODE) == A8_P_U8_FP32SUM) ? 0x01010101u
                                                                                 : 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(b.q, 1);
        for (int s = 0; s < F::STAGES; ++s) {
            mbar_init(b.full + 8 * s, 1);
            mbar_init(b.empty + 8 * s, F::CONSUMERS * 128); /* every consumer thread */
        }
        for (int u = 0; u < 2; ++u) {
            mbar_init(b.mt_full + 8 * u, 1);
            mbar_init(b.mt_empty + 8 * u, F::CONSUMERS * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(F::PRODUCER_REGS));
        if (threadIdx.x == 0) attn8_producer<F>(tq, tk, tv, tvl, ops, base, b, bh, tile, mtiles);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(F::CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7; /* consumer warpgroup */
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    const uint64_t qd = sw128_desc(base + L::Q + cw * 64 * 128);
    const int row0 = tile * F::ROWS + cw * 64 + warp * 16; /* the warp's first row */
    float dq[2];
    /* A tile of 192 rows can end past the head's padded rows (nq_pad is a
     * multiple of 128): those rows are never stored, and their scales are
     * read at the head's last rows instead of past the array. */
    qvc_q_scales(ops, bh, min(row0, ops.nq_pad - 16) + g, dq);

    attn8_acc<F::D> r;
#pragma unroll
    for (int i = 0; i < F::D / 2; ++i) r.o[i] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
    mbar_wait(b.q, 0);
    if constexpr (F::INT8) {
        attn8_mainloop_int8<F, PMODE, MEANS>(r, ops, p.a, base, sm, b, qd, dq, tig);
    } else {
        float sacc[64];
        mbar_wait(b.full, 0);
        issue_qk<QVC_QK_E4M3, F::QK_KSTEPS>(sacc, qd, base + L::k(0));
        wg_wait<0>();
        reg_fence(sacc);
        const float *kscale = ops.k_scale + (size_t)bh * nblk;
        const float *vblk = ops.v_blk + (size_t)bh * nblk;
        attn8_mainloop_sequential<F, PMODE>(r, sacc, ops, p.a, base, b, qd, dq, kscale, vblk, tig);
    }
    attn8_epilogue<PMODE, F::D>(r, ops, p.a, bh, row0, g, tig);
}

/* The tensor maps of the operands: Q (in boxes of the kernel's rows), K,
 * V^T and V^T's second digit (V^T again where the call has none, so that
 * the parameter is a valid map).  Q and K rows are D bytes (a 64-byte row
 * fills half a tile row); V^T has D rows of 128 keys per block. */
template <class F>
static qva_status attn8_maps(const qvc_ops *ops, CUtensorMap (&maps)[4]) {
    if (ops->D != F::D)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_ws_128x128: head dim %d in a head-dim-%d kernel",
                        ops->D, F::D);
    const uint64_t vrows = (uint64_t)ops->BH * ops->nblk * F::D;
    qva_status r;
    if ((r = make_map_w(&maps[0], ops->q_i8, (uint64_t)ops->BH * ops->nq_pad, F::ROWS, F::D)) !=
            QVA_OK ||
        (r = make_map_w(&maps[1], ops->k_i8, (uint64_t)ops->BH * ops->nk_pad, 128, F::D)) !=
            QVA_OK ||
        (r = make_map(&maps[2], ops->v_t, vrows, F::D)) != QVA_OK ||
        (r = make_map(&maps[3], ops->v_t_lo ? ops->v_t_lo : ops->v_t, vrows, F::D)) != QVA_OK)
        return r;
    return QVA_OK;
}

/* The launch of one flags variant. */
template <class F, int PMODE, int MEANS>
static qva_status attn8_launch_one(const CUtensorMap *m, const attn8_params *p, cudaStream_t st) {
    const int smem = attn8_layout<F>::bytes(MEANS);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
              const attn8_params) = attn8_ws_128x128<F, PMODE, MEANS>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn8_ws_128x128 smem attribute");
    dim3 grid((unsigned)((p->ops.nq_pad + F::ROWS - 1) / F::ROWS), (unsigned)p->ops.BH);
    k<<<grid, F::THREADS, smem, st>>>(m[0], m[1], m[2], m[3], *p);
    return qvc_launch_check("attn8_ws_128x128");
}

/* The kernel of a flags variant for this call with means or not (INT8 QK
 * only: V-Smooth is vc8's; fp8, the E4M3 path, has none). */
template <class F, int PMODE>
static qva_status attn8_launch_p(const CUtensorMap *m, const attn8_params *p, cudaStream_t st) {
    if (!p->ops.v_mu) return attn8_launch_one<F, PMODE, 0>(m, p, st);
    if (!p->ops.v_mu_tile)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn8_ws_128x128: V-Smooth means without their tiles");
    if constexpr (F::INT8) return attn8_launch_one<F, PMODE, 1>(m, p, st);
    return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_ws_128x128: V-Smooth means with E4M3 QK");
}

/* ... its P path (ExpCast, exp2 with the codes' sum, or exp2), with the
 * operands' tensor maps. */
template <class F>
static qva_status attn8_launch(const qvc_ops *ops, const qvc_attn_args *a, cudaStream_t st) {
    CUtensorMap m[4];
    const qva_status r = attn8_maps<F>(ops, m);
    if (r != QVA_OK) return r;
    attn8_params p;
    p.ops = *ops;
    p.a = *a;
    if (a->p_block) {
        if constexpr (F::INT8 && !F::VLO) {
            if (a->expcast == QVA_EXPCAST_E5M2)
                return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_ws_128x128: +pblock with E5M2 codes");
            if (a->expcast) return attn8_launch_p<F, A8_P_EXPCAST | A8_P_BLOCK>(m, &p, st);
            if (a->sum_codes) return attn8_launch_p<F, A8_P_CODESUM | A8_P_BLOCK>(m, &p, st);
            return attn8_launch_p<F, A8_P_EXP2 | A8_P_BLOCK>(m, &p, st);
        }
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_ws_128x128: +pblock needs INT8 QK and one V code");
    }
    /* +i8pv and +expcast-e5m2 run at head dim 128 (the chooser's rule:
     * their preparation is not built at 64) */
    if (a->u8_pv) {
        if constexpr (F::INT8 && !F::VLO && F::D == 128)
            return a->sum_codes ? attn8_launch_p<F, A8_P_U8>(m, &p, st)
                                : attn8_launch_p<F, A8_P_U8_FP32SUM>(m, &p, st);
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "attn8_ws_128x128: +i8pv needs INT8 QK, one V code and head dim 128");
    }
    if (a->expcast == QVA_EXPCAST_E5M2) {
        if constexpr (F::INT8 && !F::VLO && F::D == 128)
            return attn8_launch_p<F, A8_P_EXPCAST5>(m, &p, st);
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "attn8_ws_128x128: +expcast-e5m2 needs INT8 QK, one V code and head dim 128");
    }
    if (a->expcast) return attn8_launch_p<F, A8_P_EXPCAST>(m, &p, st);
    if (a->sum_codes) return attn8_launch_p<F, A8_P_CODESUM>(m, &p, st);
    return attn8_launch_p<F, A8_P_EXP2>(m, &p, st);
}

#endif
