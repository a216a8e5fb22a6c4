/*
 * The pieces of attn_draft_ws_128x128 (draft/attn_draft_ws_128x128.cu
 * holds the kernel and its launcher; its header comment says what the
 * kernel does): the shared-memory layout and rings, the walk of a CTA's
 * route, the producer, the two phases' mainloops and the epilogue; the
 * arithmetic of one block is in attn_draft_ws_math.cuh.  Kernel versions
 * under trial (dev/cuda) build on them.
 */
#ifndef QVATTN_ATTN_DRAFT_WS_CUH
#define QVATTN_ATTN_DRAFT_WS_CUH

#include "common/hopper.cuh"
#include "common/softmax.cuh"

#define DW_ROWS 128
#define DW_STAGES 2
#define DW_HALF 16384                  /* [128 rows][128 B] */
#define DW_Q16_OFF 0                   /* Q16: channels 0-63 | 64-127   */
#define DW_Q8_OFF (2 * DW_HALF)        /* Q8 [128][128 B]               */
#define DW_STAGE0 (3 * DW_HALF)
#define DW_STAGE_BYTES (4 * DW_HALF + 1024) /* K 32 KB | V 32 KB | ones */
#define DW_K_OFF(s) (DW_STAGE0 + (s) * DW_STAGE_BYTES)
#define DW_V_OFF(s) (DW_K_OFF(s) + 2 * DW_HALF)
/* INT8 V^T goes in the high half, so the ones rows follow its D rows
 * (n136; n72 at head dim 64): DW_V8_OFF(s) + D * 128 */
#define DW_V8_OFF(s) (DW_V_OFF(s) + DW_HALF)
#define DW_BAR_OFF (DW_STAGE0 + DW_STAGES * DW_STAGE_BYTES)
/* the mbarriers (64 bytes at most), then a word per stage (DW_VALID_AT) */
#define DW_BAR_BYTES 128
#define DW_VALID_AT 64
#define DW_SMEM_BYTES (DW_BAR_OFF + DW_BAR_BYTES + 1024)
#define DW_THREADS 384
#define DW_PRODUCER_REGS 24
#define DW_GATHER_THREADS 128 /* the producer warpgroup, which gathers a direct Q */
#define DW_CONSUMER_REGS 240

/* The K/V ring of a launch: its depth, where stage s's tiles sit, the
 * mbarriers, the stages' valid-key words and the shared memory.  dw_ring2
 * is the layout above (the Q8
 * tile and each stage's ones rows for the INT8 phase); dw_ring3 is for
 * routes without INT8 blocks: three stages in the room of the Q8 tile and
 * the ones rows, so each 64 KB block load has one more block's time. */
struct dw_ring2 {
    static constexpr int STAGES = DW_STAGES, INT8 = 1;
    static constexpr uint32_t BAR = DW_BAR_OFF, SMEM = DW_SMEM_BYTES;
    static __device__ __forceinline__ uint32_t k(int s) { return DW_K_OFF(s); }
    static __device__ __forceinline__ uint32_t v(int s) { return DW_V_OFF(s); }
    static __device__ __forceinline__ uint32_t valid(int s) { return BAR + DW_VALID_AT + 4 * s; }
};
struct dw_ring3 {
    static constexpr int STAGES = 3, INT8 = 0;
    static constexpr uint32_t STAGE0 = 2 * DW_HALF, STAGE_BYTES = 4 * DW_HALF;
    static constexpr uint32_t BAR = STAGE0 + STAGES * STAGE_BYTES, SMEM = BAR + DW_BAR_BYTES + 1024;
    static __device__ __forceinline__ uint32_t k(int s) { return STAGE0 + s * STAGE_BYTES; }
    static __device__ __forceinline__ uint32_t v(int s) { return k(s) + 2 * DW_HALF; }
    static __device__ __forceinline__ uint32_t valid(int s) { return BAR + DW_VALID_AT + 4 * s; }
};
/* Blocks with at least this many valid keys (a multiple of 8) mask only
 * the column groups at and above it: every region of the Wan2.2 and
 * HunyuanVideo grids holds 124 or 125 tokens. */
#define DW_NEAR_FULL 120

typedef struct dw_params {
    qvc_draft_ws_args w;
    int npre; /* prefix blocks */
} dw_params;

/* The mbarriers: Q8, Q16, then full[s], then empty[s]. */
typedef struct dw_bars {
    uint32_t q8, q16, full, empty;
} dw_bars;

/* The mbarriers of ring L in the shared memory at base. */
template <class L>
static __device__ __forceinline__ dw_bars dw_bars_at(uint32_t base) {
    dw_bars b;
    b.q8 = base + L::BAR, b.q16 = b.q8 + 8;
    b.full = b.q8 + 16, b.empty = b.full + 8 * L::STAGES;
    return b;
}

/* What every thread of the CTA does first: the ones rows after each INT8
 * V^T tile's D rows (ExpCast's row sum; they never change: at head dim 64
 * they sit where the tile's rows 64..71 would, which no load writes), the
 * mbarriers (and, when extra is nonzero, one more of every consumer
 * thread at that address), made visible to the async proxy before anyone
 * uses them.  gather_q: Q16's barrier takes one arrival of each producer
 * thread (dw_gather_q) instead of the TMA's. */
template <class L, int EXPCAST, int D = 128>
static __device__ __forceinline__ void dw_cta_init(uint8_t *sm, dw_bars b, uint32_t extra,
                                                   int gather_q = 0) {
    if (EXPCAST && L::INT8)
        for (int i = threadIdx.x; i < DW_STAGES * 256; i += DW_THREADS)
            *(uint32_t *)(sm + DW_V8_OFF(i / 256) + D * 128 + 4 * (i % 256)) = 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(b.q8, 1);
        mbar_init(b.q16, gather_q ? DW_GATHER_THREADS : 1);
        for (int s = 0; s < L::STAGES; ++s) {
            mbar_init(b.full + 8 * s, 1);
            mbar_init(b.empty + 8 * s, 256); /* every consumer thread */
        }
        if (extra) mbar_init(extra, 256);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}

#include "draft/attn_draft_ws_math.cuh" /* wgmma forms, softmax pieces */

/* ------------------------------------------------------------ the walk */
/* Block i of the CTA's walk: INT8 regions first, then the prefix blocks,
 * then the 16-bit regions.  A prefix-query CTA (dense) walks every prefix
 * block and then every video region, all in 16 bits (docs/DRAFT.md §5:
 * prefix queries attend to all valid keys). */
typedef struct dw_walk {
    int e1, nb8, npre, e2, total, dense;
} dw_walk;

/* Work item idx.  The first npre * BH items are the prefix-query rows
 * (each walks R + npre blocks, about R / 16 times a video item's list), so
 * the block scheduler starts them first and they cannot form a tail; then
 * one item per (video region, head). */
static __device__ __forceinline__ void dw_work_at(const qvc_draft_ws_args &w, int npre,
                                                  int64_t idx, int &a, int &bh, dw_walk &wk) {
    const int64_t nd = (int64_t)npre * w.BH;
    wk.npre = npre;
    if (idx < nd) {
        bh = (int)(idx % w.BH), a = (int)(idx / w.BH);
        wk.dense = 1, wk.e1 = wk.e2 = 0, wk.nb8 = 0;
        wk.total = npre + w.R;
        return;
    }
    bh = (int)((idx - nd) / w.R), a = (int)((idx - nd) % w.R);
    const int32_t *off = w.offsets + ((int64_t)bh * w.R + a) * 3;
    wk.dense = 0;
    wk.e1 = off[1];
    wk.nb8 = off[2] - off[1];
    wk.e2 = off[2];
    wk.total = wk.nb8 + npre + (off[3] - off[2]);
}
/* The CTA's work item: its linear block index. */
static __device__ __forceinline__ void dw_work(const qvc_draft_ws_args &w, int npre, int &a,
                                               int &bh, dw_walk &wk) {
    dw_work_at(w, npre, (int64_t)blockIdx.y * gridDim.x + blockIdx.x, a, bh, wk);
}

/* The video region of 16-bit block i >= npre. */
static __device__ __forceinline__ int video_block(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                  int i) {
    return wk.dense ? i - wk.npre : w.cols[wk.e2 + i - wk.npre];
}

/* The valid keys of 16-bit block i in two steps, so that a loop can issue
 * them blocks apart: the block's code (a load from cols for a video region;
 * prefix block i is -1 - i), then its valid keys (a load from count). */
static __device__ __forceinline__ int block_code(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                 int i) {
    return i < wk.npre ? -1 - i : video_block(w, wk, i);
}
static __device__ __forceinline__ int code_valid(const qvc_draft_ws_args &w, int c) {
    return c < 0 ? min(w.prefix - (-1 - c) * DW_ROWS, DW_ROWS) : w.count[c];
}

/* First packed row of the CTA's query block (in one head's n_pack rows)
 * and its valid rows. */
static __device__ __forceinline__ int64_t query_row0(const qvc_draft_ws_args &w,
                                                     const dw_walk &wk, int a) {
    return wk.dense ? (int64_t)a * DW_ROWS : w.prefix_pad + (int64_t)a * DW_ROWS;
}
static __device__ __forceinline__ int query_valid(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                  int a) {
    return wk.dense ? min(w.prefix - a * DW_ROWS, DW_ROWS) : w.count[a];
}

/* ------------------------------------------------------------ producer */
/* A direct Q16 tile (w.direct_q): the 128 rows of item (a, bh) from the
 * caller's Q, row pack[slot] of the head (a padding slot, -1: zeros), into
 * the layout TMA gives the packed tile (D / 64 halves of [128 rows][128
 * B], the 16-byte chunk c of row r at c ^ (r & 7)), so that the consumers
 * read it alike.  The producer warpgroup's 128 threads share it: warp wp
 * takes rows 32 wp .. 32 wp + 31, each lane reads one of their pack
 * entries, and a pass copies 32 / (D / 8) whole rows, a 16-byte chunk a
 * lane (a row's chunks on adjacent lanes: whole lines per request).  Each
 * thread's arrival on Q16's barrier waits for its copies; every thread but
 * the walk's waits for them too before it leaves.  Thread 0 takes part
 * before it walks the route, so that Q's requests go out ahead of the
 * ring's (warps 1-3 alone, with the walk's first K/V stages ahead of Q,
 * cost the kernel 2.5%: bench/NOTES.md, "Q read in place"). */
template <int D>
static __device__ __forceinline__ void dw_gather_q(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                   int a, int bh, uint32_t base, dw_bars b) {
    constexpr int CPR = D / 8, RPP = 32 / CPR; /* 16-byte chunks a row, rows a pass */
    const int wp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int mine = __ldg(w.pack + query_row0(w, wk, a) + 32 * wp + lane);
    const uint16_t *src = (const uint16_t *)w.qv.data + qvc_head_base(w.qv, bh) + (lane % CPR) * 8;
    const uint32_t dst = base + DW_Q16_OFF + (uint32_t)(lane % CPR / 8) * DW_HALF;
    const uint32_t c = (uint32_t)(lane % 8);
#pragma unroll 4
    for (int p = 0; p < 32 / RPP; ++p) {
        const int rr = p * RPP + lane / CPR, r = 32 * wp + rr;
        const int orig = __shfl_sync(0xffffffffu, mine, rr);
        cp_async16(dst + (uint32_t)r * 128 + ((c ^ (uint32_t)(r & 7)) << 4),
                   src + (int64_t)max(orig, 0) * w.qv.sn, orig >= 0);
    }
    cp_async_arrive(b.q16);
    if (threadIdx.x != 0) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* The Q tiles of item (a, bh): Q8 when the walk has INT8 blocks (at head
 * dim 64 a 64-byte row in a 128-byte box, TMA zero-filling the rest and
 * counting it in the transaction), Q16 (head dim 64: the first half)
 * unless the warpgroup gathers it (dw_gather_q). */
template <class L, int D = 128>
static __device__ __forceinline__ void dw_load_q(const CUtensorMap &tq16, const CUtensorMap &tq8,
                                                 const qvc_draft_ws_args &w, const dw_walk &wk,
                                                 int a, int bh, uint32_t base, dw_bars b) {
    const int64_t nv = (int64_t)w.R * DW_ROWS;
    const int qrow16 = (int)((int64_t)bh * w.n_pack + query_row0(w, wk, a));
    if (L::INT8 && wk.nb8) {
        mbar_expect_tx(b.q8, DW_HALF);
        tma_load_2d(base + DW_Q8_OFF, &tq8, 0, (int)((int64_t)bh * nv + (int64_t)a * DW_ROWS), b.q8);
    }
    if (w.direct_q) return;
    mbar_expect_tx(b.q16, D / 64 * DW_HALF);
    tma_load_2d(base + DW_Q16_OFF, &tq16, 0, qrow16, b.q16);
    if (D == 128) tma_load_2d(base + DW_Q16_OFF + DW_HALF, &tq16, 64, qrow16, b.q16);
}

/* Block j's code: its INT8 key region (j < nb8), else block_code. */
static __device__ __forceinline__ int walk_code(const qvc_draft_ws_args &w, const dw_walk &wk, int j) {
    return j < wk.nb8 ? w.cols[wk.e1 + j] : block_code(w, wk, j - wk.nb8);
}

/* Block j of the walk (INT8 blocks first: ring2 only), whose code is c,
 * into stage s, its arrival on mbarrier full.  V^T tiles hold D rows
 * (channels) of 128 keys; K tiles at head dim 64 as Q's. */
template <class L, int D = 128>
static __device__ __forceinline__ void dw_load_block(const CUtensorMap &tk16, const CUtensorMap &tv16,
                                                     const CUtensorMap &tk8, const CUtensorMap &tv8,
                                                     const qvc_draft_ws_args &w, const dw_walk &wk,
                                                     int bh, int j, int c, int s, uint32_t base,
                                                     uint32_t full) {
    if (L::INT8 && j < wk.nb8) {
        const int64_t blk = (int64_t)bh * w.R + c;
        mbar_expect_tx(full, DW_HALF + D * 128);
        tma_load_2d(base + DW_K_OFF(s), &tk8, 0, (int)(blk * DW_ROWS), full);
        tma_load_2d(base + DW_V8_OFF(s), &tv8, 0, (int)(blk * D), full);
    } else {
        const int64_t k0 = c < 0 ? (int64_t)(-1 - c) * DW_ROWS : w.prefix_pad + (int64_t)c * DW_ROWS;
        const int64_t row = (int64_t)bh * w.n_pack + k0; /* a multiple of 128 */
        const int vrow = (int)(row / DW_ROWS * D);
        mbar_expect_tx(full, D / 64 * DW_HALF + 2 * D * 128);
        tma_load_2d(base + L::k(s), &tk16, 0, (int)row, full);
        if (D == 128) tma_load_2d(base + L::k(s) + DW_HALF, &tk16, 64, (int)row, full);
        tma_load_2d(base + L::v(s), &tv16, 0, vrow, full);
        tma_load_2d(base + L::v(s) + DW_HALF, &tv16, 64, vrow, full);
    }
}

/* The walk's blocks into ring L from ring position j0 on.  The route's
 * global loads run ahead of the stage waits (the code of block j + 2, the
 * valid keys of block j + 1), so neither a TMA issue nor a consumer waits
 * on one; each 16-bit block's valid keys go to its stage's word before the
 * stage's arrive, whose release the consumers' wait acquires (they read it
 * there instead of loading the route themselves). */
template <class L, int D = 128>
static __device__ __forceinline__ void dw_load_walk(const CUtensorMap &tk16, const CUtensorMap &tv16,
                                                    const CUtensorMap &tk8, const CUtensorMap &tv8,
                                                    const qvc_draft_ws_args &w, const dw_walk &wk,
                                                    int bh, uint32_t base, dw_bars b, int64_t j0) {
    const int n = wk.total;
    int c0 = n > 0 ? walk_code(w, wk, 0) : 0, c1 = n > 1 ? walk_code(w, wk, 1) : 0;
    int v0 = n > 0 && wk.nb8 == 0 ? code_valid(w, c0) : 0;
    for (int j = 0; j < n; ++j) {
        const int64_t jr = j0 + j;
        const int s = (int)(jr % L::STAGES);
        const int c2 = j + 2 < n ? walk_code(w, wk, j + 2) : 0;
        const int v1 = j + 1 < n && j + 1 >= wk.nb8 ? code_valid(w, c1) : 0;
        mbar_wait(b.empty + 8 * s, (uint32_t)((jr / L::STAGES) & 1) ^ 1);
        if (j >= wk.nb8) st_shared_u32(base + L::valid(s), (uint32_t)v0);
        dw_load_block<L, D>(tk16, tv16, tk8, tv8, w, wk, bh, j, c0, s, base, b.full + 8 * s);
        c0 = c1, c1 = c2, v0 = v1;
    }
}

/* One thread walks the CTA's route and TMA-loads Q and each block's K and
 * V^T into ring L. */
template <class L, int D = 128>
static __device__ __forceinline__ void dw_producer(const CUtensorMap &tq16, const CUtensorMap &tk16,
                                                   const CUtensorMap &tv16, const CUtensorMap &tq8,
                                                   const CUtensorMap &tk8, const CUtensorMap &tv8,
                                                   const qvc_draft_ws_args &w, const dw_walk &wk,
                                                   int a, int bh, uint32_t base, dw_bars b) {
    dw_load_q<L, D>(tq16, tq8, w, wk, a, bh, base, b);
    dw_load_walk<L, D>(tk16, tv16, tk8, tv8, w, wk, bh, base, b, 0);
}

/* ------------------------------------------------------------ mainloop */
/* The consumer state: O (D / 2 columns of the thread's two rows), the
 * running max m and row sum l of those rows, and j, the blocks consumed so
 * far (the ring position). */
template <int D>
struct dw_accd {
    float o[D / 2];
    float m[2], l[2];
    int j;
};
typedef dw_accd<128> dw_acc;

/* A fresh item: O and l zero, no max yet (the ring position j stays). */
template <int D>
static __device__ __forceinline__ void dw_acc_reset(dw_accd<D> &r) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) r.o[i] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
}

/* The INT8 query deltas of the calling consumer thread's rows g and g + 8
 * of region block a (per row, or the block's one delta). */
static __device__ __forceinline__ void dw_q_deltas(const qvc_draft_ws_args &w, int64_t hr, int a,
                                                   float (&dq)[2]) {
    if (w.q_rows_per_scale == 1) {
        const int ctid = threadIdx.x - 128, lane = ctid & 31;
        const int row = (ctid >> 7) * 64 + ((ctid >> 5) & 3) * 16 + (lane >> 2);
        const float *d = w.q8s + (hr + a) * WS_KEYS + row; /* 128 rows per region block */
        dq[0] = d[0], dq[1] = d[8];
    } else {
        dq[0] = dq[1] = w.q8s[hr + a];
    }
}

/* The score scales of rows g and g + 8 against key block kb. */
static __device__ __forceinline__ void dw_score_scales(const float (&dq)[2], float dk,
                                                       float scale_log2, float (&f)[2]) {
    f[0] = __fmul_rn(__fmul_rn(dq[0], dk), scale_log2);
    f[1] = __fmul_rn(__fmul_rn(dq[1], dk), scale_log2);
}

/* 1. The INT8 blocks (ring2 only; the walk's first phase, so r is fresh),
 * inside the Eq. 8 unit change; the two consumer warpgroups in ping-pong
 * as in the 16-bit phase: one issues PV(i) into a fresh partial and
 * QK(i+1) while the other makes its P codes.  The route's scalars are
 * loaded ahead, off the block's serial path: the key region two blocks
 * ahead, its valid keys and scale one block ahead. */
template <int EXPCAST, int D>
static __device__ __forceinline__ void dw_int8_phase(dw_accd<D> &r, const qvc_draft_ws_args &w,
                                                     const dw_walk &wk, int a, int bh,
                                                     uint32_t base, dw_bars b, int cw, int tig,
                                                     uint32_t q8par = 0) {
    const int64_t hr = (int64_t)bh * w.R;
    const float *dv = w.dv + (int64_t)bh * D;
    /* entry's unit change: the identity on the zero O and l (phase_exit) */
    const uint64_t qd = sw128_desc(base + DW_Q8_OFF + cw * 64 * 128);
    float dq[2], f[2];
    dw_q_deltas(w, hr, a, dq);
    const int *cols = w.cols + wk.e1;
    int kb_n = wk.nb8 > 1 ? cols[1] : cols[0];
    int cnt = w.count[cols[0]];
    float dk = w.k8s[hr + cols[0]];
    mbar_wait(b.q8, q8par);
    int sacc[64];
    int s = r.j % DW_STAGES;
    mbar_wait(b.full + 8 * s, (r.j / DW_STAGES) & 1);
    issue_qk<QVC_QK_INT8, D / 32>(sacc, qd, base + DW_K_OFF(s));
    wg_wait<0>();
    reg_fence(sacc);
    if (cw == 1) named_arrive(1, 256);
    for (int i = 0; i < wk.nb8; ++i, ++r.j) {
        s = r.j % DW_STAGES;
        const int sn = (r.j + 1) % DW_STAGES, more = i + 1 < wk.nb8;
        const int kb_2 = i + 2 < wk.nb8 ? cols[i + 2] : kb_n;
        const int cnt_n = w.count[kb_n];
        const float dk_n = w.k8s[hr + kb_n];
        dw_score_scales(dq, dk, w.scale_log2, f);
        float rs[2];
        uint32_t pa[4][4];
        softmax8<EXPCAST>(sacc, f, cnt, w.a.expcast_add, tig, r.m, r.l, r.o, rs, pa);
        if (more) mbar_wait(b.full + 8 * sn, ((r.j + 1) / DW_STAGES) & 1);
        named_sync(1 + cw, 256);
        float part[PV_REGS(D, EXPCAST)];
        issue_pv<EXPCAST, 0, D>(part, pa, sw128_desc(base + DW_V8_OFF(s)));
        /* always issued (no wgmma on a divergent path); after the last INT8
         * block it re-reads this K tile, unused */
        issue_qk<QVC_QK_INT8, D / 32>(sacc, qd, base + DW_K_OFF(more ? sn : s));
        named_arrive(2 - cw, 256);
        wg_wait<1>(); /* PV of block i; QK of i+1 may still run */
        reg_fence(part);
        mbar_arrive(b.empty + 8 * s);
        add_part8<EXPCAST, D>(r.o, r.l, part, rs, w.int8_acc16);
        wg_wait<0>();
        reg_fence(sacc);
        cnt = cnt_n, dk = dk_n, kb_n = kb_2;
    }
    if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
    phase_exit(r.o, r.l, dv, w.eta, tig);
}

/* The softmax of one 16-bit block: the row max, the new running max (O
 * and l rescaled), the probabilities and this thread's part of their row
 * sums; keys of column groups >= FROM masked by valid. */
template <int F16, int FROM, int D>
static __device__ __forceinline__ void softmax16(dw_accd<D> &r, const float (&sacc)[64], float f,
                                                 int valid, int tig, float (&rs)[2],
                                                 uint32_t (&pa)[8][4]) {
    float mx[2];
    raw_max16<FROM>(sacc, f, valid, tig, r.m, mx);
    qvc_softmax_raise<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, qvc_rows_of(r.o));
    probs16_fused<F16, FROM>(sacc, f, r.m, valid, tig, rs, pa);
}

/* 2. The 16-bit blocks (every prefix block, then the 16-bit regions), the
 * two consumer warpgroups in ping-pong: one issues PV(i) into O and
 * QK(i+1) while the other makes its P; warpgroup 0 first.  Each block's
 * valid keys come from its stage's word (the producer's, dw_load_walk),
 * read during the block before, right after its stage's wait: the
 * route's dependent global loads and their branches were 40 instructions
 * of every block's serial path (dev/cuda README, dw25).  Through the
 * loop l holds each thread's part of its rows' sums (the quad's lane 0
 * also what the INT8 phase summed), added over the quad at the end: the
 * two shuffle-add steps per row and block would otherwise sit between the
 * P packing and the PV issue.  The rescales multiply every part alike
 * (the max is the quad's).  Q's A fragments are loaded once
 * (load_q16_frags), so each block's QK reads only K from shared memory. */
template <int F16, class L, int D>
static __device__ __forceinline__ void dw_16bit_phase(dw_accd<D> &r, const qvc_draft_ws_args &w,
                                                      const dw_walk &wk, uint32_t base, dw_bars b,
                                                      int cw, int tig, uint32_t q16par = 0) {
    const int nb16 = wk.total - wk.nb8;
    mbar_wait(b.q16, q16par);
    if (nb16 <= 0) return;
    /* rows cw * 64 + warp * 16 + g and 8 below it */
    const int ctid = threadIdx.x - 128;
    uint32_t qf[D / 16][4];
    load_q16_frags<D>(base + DW_Q16_OFF, (ctid >> 5) * 16 + ((ctid & 31) >> 2), tig, qf);
    if (tig != 0) r.l[0] = r.l[1] = 0.0f; /* the whole sums on lane 0 */
    float sacc[64];
    int s = r.j % L::STAGES;
    mbar_wait(b.full + 8 * s, (r.j / L::STAGES) & 1);
    int valid = (int)ld_shared_u32(base + L::valid(s));
    issue_qk16<F16, D>(sacc, qf, base + L::k(s));
    wg_wait<0>();
    reg_fence(sacc);
    if (cw == 1) named_arrive(1, 256);
    for (int i = 0; i < nb16; ++i, ++r.j) {
        s = r.j % L::STAGES;
        const int sn = (r.j + 1) % L::STAGES, more = i + 1 < nb16;
        float rs[2];
        uint32_t pa[8][4];
        if (valid >= DW_NEAR_FULL)
            softmax16<F16, DW_NEAR_FULL / 8>(r, sacc, w.scale_log2, valid, tig, rs, pa);
        else
            softmax16<F16, 0>(r, sacc, w.scale_log2, valid, tig, rs, pa);
        int valid_n = 0;
        if (more) {
            mbar_wait(b.full + 8 * sn, ((r.j + 1) / L::STAGES) & 1);
            valid_n = (int)ld_shared_u32(base + L::valid(sn));
        }
        named_sync(1 + cw, 256);
        issue_pv16<F16, D>(r.o, pa, base + L::v(s));
        /* always issued (no wgmma on a divergent path); after the last
         * block it re-reads this K tile, unused */
        issue_qk16<F16, D>(sacc, qf, base + L::k(more ? sn : s));
        named_arrive(2 - cw, 256);
        wg_wait<1>(); /* PV of block i; QK of i+1 may still run */
        reg_fence(r.o);
        mbar_arrive(b.empty + 8 * s);
        r.l[0] += rs[0];
        r.l[1] += rs[1];
        wg_wait<0>();
        reg_fence(sacc);
        valid = valid_n;
    }
    r.l[0] = qvc_quad_sum(r.l[0]);
    r.l[1] = qvc_quad_sum(r.l[1]);
    if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
}

/* ------------------------------------------------------------ epilogue */
/* qvi_row_finish, scattered back to the sequence order. */
template <int D>
static __device__ __forceinline__ void dw_epilogue(const dw_accd<D> &r, const qvc_draft_ws_args &w,
                                                   const dw_walk &wk, int a, int bh, int lr0,
                                                   int tig) {
    const qvc_attn_args &A = w.a;
    const int b = bh / A.H, h = bh % A.H, cnt = query_valid(w, wk, a);
    const int64_t row0 = query_row0(w, wk, a);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int lr = lr0 + 8 * i;
        if (lr >= cnt) continue;
        const int64_t orig = w.pack[row0 + lr];
        /* retained: the walk has a block (a kept region or the prefix) */
        const int kind = qvc_softmax_row(r.m[i], r.l[i], wk.total > 0);
        const float fill = qvc_softmax_fill(kind);
        const int64_t ob = b * A.osb + h * A.osh + orig * A.osn;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * tig;
            qvc_store_out2(A.out, A.out_dtype, ob + col,
                           kind ? fill : __fdiv_rn(r.o[n * 4 + 2 * i], r.l[i]),
                           kind ? fill : __fdiv_rn(r.o[n * 4 + 2 * i + 1], r.l[i]));
        }
        if (A.lse && tig == 0)
            A.lse[b * A.lsb + h * A.lsh + orig * A.lsn] =
                kind ? qvc_softmax_lse_fill(kind)
                     : __fmul_rn(__fadd_rn(r.m[i], log2f(r.l[i])), 0.69314718055994531f);
    }
}

/* ------------------------------------------------------------ host */
/* A [rows][width] 16-bit matrix (width 64 or 128) read as box_rows x 64
 * tiles (128 bytes wide, the swizzle span), 128-byte swizzle. */
static qva_status make_map16(CUtensorMap *map, const void *data, uint64_t rows, uint32_t box_rows,
                             uint64_t width) {
    encode_tiled_fn enc = get_encode_tiled();
    if (!enc) return qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled is not available");
    const cuuint64_t dims[2] = {width, rows}, strides[1] = {2 * width};
    const cuuint32_t box[2] = {64, box_rows}, estr[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)data, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? QVA_OK
                             : qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled failed (%d)", (int)r);
}

/* The layout checks, the six tensor maps and the launch parameters: Q and
 * K rows of D channels, V^T tiles of D rows of 128 keys. */
template <int D>
static qva_status dw_setup(const qvc_draft_ws_args *w, CUtensorMap *maps, dw_params *p) {
    if (w->prefix_pad % DW_ROWS || w->n_pack != w->prefix_pad + (int64_t)w->R * DW_ROWS ||
        (int64_t)w->BH * w->n_pack > INT32_MAX)
        return qvi_fail(QVA_ERR_SHAPE, "attn_draft_ws_128x128: layout (n_pack %lld, prefix_pad %lld, R %d, BH %d)",
                        (long long)w->n_pack, (long long)w->prefix_pad, w->R, w->BH);
    const uint64_t rows16 = (uint64_t)w->BH * w->n_pack, rows8 = (uint64_t)w->BH * w->R * DW_ROWS;
    const uint64_t vrows16 = rows16 / DW_ROWS * D, vrows8 = rows8 / DW_ROWS * D;
    if (!w->v16t || !w->k16 || !w->pack || (!w->q16 && !w->direct_q))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn_draft_ws_128x128: NULL operand");
    if (w->direct_q && (w->qv.D != D || w->qv.B * w->qv.H != w->BH ||
                        w->qv.dtype != (w->f16 ? QVA_F16 : QVA_BF16) || !qvc_view_vec_ok(&w->qv, 8)))
        return qvi_fail(QVA_ERR_SHAPE, "attn_draft_ws_128x128: direct Q view (D %lld, dtype %d)",
                        (long long)w->qv.D, w->qv.dtype);
    /* Without an INT8 phase the 8-bit maps are never read, nor Q16's
     * with a direct Q: point them at a valid 16-bit buffer (V^T's holds
     * as many 16-bit values as Q's). */
    const void *q16 = w->direct_q ? (const void *)w->v16t : (const void *)w->q16;
    const void *q8 = w->q8 ? (const void *)w->q8 : (const void *)w->v16t;
    const void *k8 = w->k8 ? (const void *)w->k8 : (const void *)w->k16;
    const void *v8 = w->v8t ? (const void *)w->v8t : (const void *)w->v16t;
    qva_status r;
    if ((r = make_map16(&maps[0], q16, rows16, DW_ROWS, D)) != QVA_OK ||
        (r = make_map16(&maps[1], w->k16, rows16, DW_ROWS, D)) != QVA_OK ||
        (r = make_map16(&maps[2], w->v16t, vrows16, D, 128)) != QVA_OK ||
        (r = make_map_w(&maps[3], q8, w->q8 ? rows8 : DW_ROWS, DW_ROWS, D)) != QVA_OK ||
        (r = make_map_w(&maps[4], k8, w->k8 ? rows8 : DW_ROWS, DW_ROWS, D)) != QVA_OK ||
        (r = make_map(&maps[5], v8, w->v8t ? vrows8 : D, D)) != QVA_OK)
        return r;
    p->w = *w;
    p->npre = (int)(w->prefix_pad / DW_ROWS);
    return QVA_OK;
}

/* A kernel of this file's signature (the six maps, the parameters). */
typedef void (*dw_kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                             const CUtensorMap, const CUtensorMap, const CUtensorMap,
                             const dw_params);

/* Launch k on `grid` CTAs with `smem` bytes of dynamic shared memory. */
static qva_status dw_launch_kernel(dw_kernel_fn k, dim3 grid, int smem, const CUtensorMap *m,
                                   const dw_params *p, cudaStream_t st, const char *name) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, name);
    k<<<grid, DW_THREADS, smem, st>>>(m[0], m[1], m[2], m[3], m[4], m[5], *p);
    return qvc_launch_check(name);
}

/* The instance a call runs, chosen here for the library and dev/cuda's
 * versions alike: the 3-stage ring when the plan has no INT8 blocks
 * (ExpCast is the INT8 phase's, so it changes nothing there), else the
 * 2-stage ring; the 16-bit format and ExpCast as template flags, the head
 * dim D as RUN's.  RUN::go<F16, EXPCAST, L>(maps, params, stream)
 * launches one instance. */
template <class RUN, int D = 128>
static qva_status dw_dispatch(const qvc_draft_ws_args *w, cudaStream_t st) {
    if (w->D != D)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_draft_ws_128x128: head dim %d (this instance: %d)",
                        w->D, D);
    CUtensorMap maps[6];
    dw_params p;
    const qva_status r = dw_setup<D>(w, maps, &p);
    if (r != QVA_OK) return r;
    const int f16 = w->f16 != 0, ec = w->expcast != 0;
    if (!w->with8)
        return f16 ? RUN::template go<1, 0, dw_ring3>(maps, &p, st)
                   : RUN::template go<0, 0, dw_ring3>(maps, &p, st);
    if (f16)
        return ec ? RUN::template go<1, 1, dw_ring2>(maps, &p, st)
                  : RUN::template go<1, 0, dw_ring2>(maps, &p, st);
    return ec ? RUN::template go<0, 1, dw_ring2>(maps, &p, st)
              : RUN::template go<0, 0, dw_ring2>(maps, &p, st);
}

#endif
