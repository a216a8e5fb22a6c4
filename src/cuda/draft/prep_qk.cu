/*
 * The draft call's Q and K operands (draft_internal.h gives their layout),
 * from one read of the user's Q and K in the packed region order:
 *   dg_pack16_kernel    16-bit rows (a 16-bit input in the operand's
 *                       format: its own bits), with NVFP4 each video
 *                       block's channel amax, and (TILE) the router's
 *                       pooling of the same rows and their INT8 codes with
 *                       one delta per region block (Q: or per row)
 * dg_prep_qk launches them; host.cu runs it on the caller's stream before
 * the router's map (prep.cu has the rest of the preparation).  Every value
 * is the CPU's expression (src/cpu/draft.c), bit for bit.
 */
#include "prep_common.cuh"

/* ---- the tiled pack: the router's pooling and the INT8 codes of Q, K ----
 *
 * The Q and K packs also give what else is made of the same rows, so that
 * Q and K are read once.  The pooling:
 *
 * DA2 Eq. 1 exactly as the CPU computes it (qvi_draft_pool; router_map.cu's
 * dr_pool_kernel): per channel, the FP64 sum of the region's n rows in path
 * order, over n, rounded to FP32, and the max starting at the first row,
 * then m = t > m ? t : m.  The pack's threads hold the region's rows spread
 * over them, so they leave them in shared memory (16-bit inputs as their
 * own bits, f32 as floats: exact) and one thread per channel walks them in
 * path order.  The walk is a chain of FP64 adds; with few registers and a
 * 16-32 KB tile, enough CTAs share an SM for the other CTAs' loads to keep
 * DRAM busy meanwhile. */
typedef struct dg_pool_out {
    float *avg, *max; /* [BH][R][D]; NULL: no pooling */
    int kslots;       /* channels in qvc_dr_kslot order (K's descriptors) */
} dg_pool_out;

/* The INT8 codes (DA2's 8-bit Q and K: draft_internal.h) are those of
 * src/cpu/draft.c: delta = amax/127 + 1e-7 of the row (Q, rows 1) or of
 * the region block, code = the rounded quotient.  A row's delta needs only
 * the lanes that hold the row; a block's needs the block's amax, so those
 * codes come after it, from the rows left in the tile.  Both deltas come
 * from the very values they code, so qvc_int8_codes4_bounded applies. */
typedef struct dg_int8_out {
    int8_t *codes; /* [BH][R][128][D]; NULL: no codes */
    float *delta;  /* [BH][R] or (rows 1) [BH][R][128] */
    int rows;      /* rows per delta: 1 or DG_KEYS */
} dg_int8_out;

/* CTAs per SM the tiled pack asks ptxas for: 4 (64 registers) where the
 * 16-bit vector path fits them without spilling, else 2; 0 (no bound) for
 * the plain pack. */
static constexpr int dg_min_ctas(int dt, bool vec, bool tile) {
    return !tile ? 0 : dt != QVA_F32 && vec ? 4 : 2;
}

/* Bytes of the tiled pack's tile: a region's 128 rows of the input's values. */
static int dg_pool_smem(int dtype, int D) { return DG_KEYS * D * (dtype == QVA_F32 ? 4 : 2); }

template <int DT>
static __device__ __forceinline__ float dg_tile_get(const void *tile, int i) {
    if constexpr (DT == QVA_F32)
        return ((const float *)tile)[i];
    else if constexpr (DT == QVA_F16)
        return __half2float(__ushort_as_half(((const uint16_t *)tile)[i]));
    else
        return __uint_as_float((uint32_t)((const uint16_t *)tile)[i] << 16);
}

/* Row `row` of the pooling tile: the 8 values of channels c .. c + 7. */
template <int DT>
static __device__ __forceinline__ void dg_tile_put(const float (&v)[8], int row, int c, int D) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    if constexpr (DT == QVA_F32) {
        float4 *o = (float4 *)((float *)dg_tile + row * D + c);
        o[0] = make_float4(v[0], v[1], v[2], v[3]);
        o[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else { /* the input's 16-bit values, exactly */
        constexpr int F16 = DT == QVA_F16;
        *(uint4 *)((uint16_t *)dg_tile + row * D + c) =
            make_uint4(dg_pair16<F16>(v[0], v[1]), dg_pair16<F16>(v[2], v[3]),
                       dg_pair16<F16>(v[4], v[5]), dg_pair16<F16>(v[6], v[7]));
    }
}

/* Tile row `row`, channels c .. c + 7 (+0 at rows >= n, which the pack
 * did not write). */
template <int DT>
static __device__ __forceinline__ void dg_tile_get8(int row, int n, int c, int D, float (&v)[8]) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    if (row >= n) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    } else if constexpr (DT == QVA_F32) {
        const float4 *t = (const float4 *)((const float *)dg_tile + row * D + c);
        const float4 a = t[0], b = t[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        qvc_widen8<DT>(*(const uint4 *)((const uint16_t *)dg_tile + row * D + c), v);
    }
}

/* Each row's INT8 codes under its own delta (delta[row]).  The rows come
 * back from the tile, where this very thread left them (no barrier), so
 * the pack's loads need not stay in registers; their amax parts too,
 * unless the pack already took them from its registers (HAVE_PM: rowmax,
 * rows as loaded).  A row's 2^LG adjacent
 * lanes (8 channels each) hold its amax in parts; one reduce-scatter
 * (7 shuffles for the 8 rows at 8 lanes a row, 8 at 16; not 8 LG) leaves
 * row q >> (LG - 3) whole on lane q of the group, so each lane divides
 * once (not once per row), and the deltas go back by shuffles.  The max is order-free (values
 * |x| >= 0, never NaN), so the deltas are the row-by-row ones. */
template <int DT, int LG, bool HAVE_PM>
static __device__ __forceinline__ void dg_int8_rows(int D, int n, int c, int r0, float *delta,
                                                    int8_t *q8, const float (&rowmax)[8]) {
    constexpr int G = 1 << LG; /* lanes per row: 16 (D 128) or 8 (D 64) */
    const int lane = threadIdx.x & 31, q = lane & (G - 1);
    float pm[8]; /* this thread's part of each row's amax (HAVE_PM: from the pack's registers) */
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if constexpr (HAVE_PM) {
            pm[k] = rowmax[k];
        } else {
            float v[8];
            dg_tile_get8<DT>(r0 + k * DG_RSTEP, n, c, D, v);
            pm[k] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) pm[k] = fmaxf(pm[k], fabsf(v[e]));
        }
    }
    /* reduce-scatter: at width w (G/2 .. 1) a lane keeps the half of its
     * rows its bit w selects and takes the partner's part of them */
#pragma unroll
    for (int w = G / 2, cnt = 8; w >= 1 && cnt > 1; w >>= 1, cnt >>= 1) {
        const bool hi = (q & w) != 0;
#pragma unroll
        for (int i = 0; i < cnt / 2; ++i) {
            const float keep = hi ? pm[i + cnt / 2] : pm[i], give = hi ? pm[i] : pm[i + cnt / 2];
            pm[i] = fmaxf(keep, __shfl_xor_sync(DG_FULL, give, w));
        }
    }
    if (G == 16) pm[0] = fmaxf(pm[0], __shfl_xor_sync(DG_FULL, pm[0], 1)); /* 2 lanes per row */
    const int mine = q >> (LG - 3); /* the row whose amax this lane now holds */
    const float dl = qvc_int8_delta(pm[0]), rcp = __frcp_rn(dl);
    if ((q & ((G >> 3) - 1)) == 0) delta[r0 + mine * DG_RSTEP] = dl;
    const int src0 = lane & ~(G - 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int from = src0 + (k << (LG - 3));
        const float dk = __shfl_sync(DG_FULL, dl, from), rk = __shfl_sync(DG_FULL, rcp, from);
        float v[8];
        dg_tile_get8<DT>(r0 + k * DG_RSTEP, n, c, D, v);
        *(uint2 *)(q8 + k * DG_RSTEP * D) = make_uint2(qvc_int8_codes4_bounded(v, dk, rk),
                                                       qvc_int8_codes4_bounded(v + 4, dk, rk));
    }
}

/* The block's INT8 codes under one delta: its amax is the max over the
 * CTA's threads of a (a channel's amax, or a thread's part of the block's:
 * the max is order-free); this thread's rows r0 + 16 k come back from the
 * tile (n valid rows, +0 after). */
template <int DT>
static __device__ void dg_int8_block(float a, int D, int n, int c, int r0, float *delta,
                                     int8_t *q8) {
    __shared__ float wmax[DG_PREP_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(DG_FULL, a, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = a;
    __syncthreads();
    float bm = wmax[0];
    for (int w = 1; w < D / 16; ++w) bm = fmaxf(bm, wmax[w]); /* 2D threads, D/16 warps */
    const float dl = qvc_int8_delta(bm), rcp = __frcp_rn(dl);
    if (threadIdx.x == 0) *delta = dl;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float v[8];
        dg_tile_get8<DT>(r0 + k * DG_RSTEP, n, c, D, v);
        *(uint2 *)(q8 + k * DG_RSTEP * D) = make_uint2(qvc_int8_codes4_bounded(v, dl, rcp),
                                                       qvc_int8_codes4_bounded(v + 4, dl, rcp));
    }
}

/* Channel t's walk over the tile's n rows in path order: the FP64 sum and
 * the max from the first row.  D at compile time, so that each row's
 * shared load takes its offset as an immediate. */
template <int DT, int D>
static __device__ __forceinline__ void dg_pool_walk(int n, int t, double &sum, float &m) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    m = dg_tile_get<DT>(dg_tile, t);
    for (int i = 0; i < n; ++i) {
        const float x = dg_tile_get<DT>(dg_tile, i * D + t);
        sum = __dadd_rn(sum, (double)x);
        m = x > m ? x : m;
    }
}

/* The pooled avg and max of this CTA's region (n rows) from the tile, at
 * the channel's slot (kslots: qvc_dr_kslot's). */
template <int DT>
static __device__ void dg_pool_store(int D, int n, float *avg, float *mx, int kslots) {
    __syncthreads();
    const int t = (int)threadIdx.x;
    if (t >= D) return;
    double sum = 0.0;
    float m;
    if (D == 128)
        dg_pool_walk<DT, 128>(n, t, sum, m);
    else
        dg_pool_walk<DT, 64>(n, t, sum, m);
    const int at = kslots ? qvc_dr_kslot(t, D) : t;
    avg[at] = __double2float_rn(__ddiv_rn(sum, (double)n));
    mx[at] = m;
}

/* Whether the pack's 16-bit rows are the input's own bits: a 16-bit input
 * in the operand's format (RNE of a value the format holds is the value),
 * loaded as vectors.  The rows then go out as loaded, with no widening
 * and no rounding; only a NaN's payload may differ from the rounded
 * path's, and a NaN stays a NaN. */
template <int DT, int F16, bool VEC>
static constexpr bool dg_raw16() {
    return VEC && DT != QVA_F32 && (DT == QVA_F16) == (F16 != 0);
}

/* Tile row `row`, channels c .. c + 7, as the input's 16-bit bits. */
static __device__ __forceinline__ void dg_tile_put_raw(const uint4 &u, int row, int c, int D) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    *(uint4 *)((uint16_t *)dg_tile + row * D + c) = u;
}

/* max(+0, |x|) over a row's 8 channels u, as a float: the packed max of
 * the four words, then of the two halves widened, from +0 as the float
 * loop over the widened values starts (so an all-NaN row gives +0). */
template <int DT>
static __device__ __forceinline__ float dg_row_amax16(const uint4 &u) {
    const uint32_t h = qvc_hmax2<DT>(qvc_hmax2<DT>(u.x & 0x7fff7fffu, u.y & 0x7fff7fffu),
                                     qvc_hmax2<DT>(u.z & 0x7fff7fffu, u.w & 0x7fff7fffu));
    float w[8];
    qvc_widen8<DT>(make_uint4(h, 0u, 0u, 0u), w);
    return fmaxf(fmaxf(0.0f, w[0]), w[1]);
}

/* This thread's 8 rows (r0 + 16 k; bit k of valid: a token, else +0) into
 * the 16-bit operand o (NULL: none), the first n_tile of them into the
 * tile, and their |x| into the running channel max m; with row_amax (the
 * rows as loaded only) each row's max(+0, |x|) over the 8 channels into
 * rowmax. */
template <int DT, int F16, bool VEC>
static __device__ __forceinline__ void dg_put_rows(const dg_chunk<DT, VEC> (&rows)[8],
                                                   uint32_t valid, int r0, int c, int D,
                                                   int n_tile, uint16_t *o, float (&m)[8],
                                                   bool row_amax, float (&rowmax)[8]) {
    if constexpr (dg_raw16<DT, F16, VEC>()) {
        uint4 mh = make_uint4(0u, 0u, 0u, 0u); /* the |x| max, two channels a word */
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint4 u = (valid >> k) & 1u ? rows[k].u : make_uint4(0u, 0u, 0u, 0u);
            if (r0 + k * DG_RSTEP < n_tile) dg_tile_put_raw(u, r0 + k * DG_RSTEP, c, D);
            if (o) *(uint4 *)(o + k * DG_RSTEP * D) = u;
            qvc_amax16<DT>(mh, u);
            rowmax[k] = row_amax ? dg_row_amax16<DT>(u) : 0.0f;
        }
        qvc_widen8<DT>(mh, m);
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            float v[8];
            rows[k].get(v);
            dg_mask8(v, (valid >> k) & 1u);
            if (r0 + k * DG_RSTEP < n_tile) dg_tile_put<DT>(v, r0 + k * DG_RSTEP, c, D);
            if (o)
                *(uint4 *)(o + k * DG_RSTEP * D) =
                    make_uint4(dg_pair16<F16>(v[0], v[1]), dg_pair16<F16>(v[2], v[3]),
                               dg_pair16<F16>(v[4], v[5]), dg_pair16<F16>(v[6], v[7]));
#pragma unroll
            for (int e = 0; e < 8; ++e) m[e] = fmaxf(m[e], fabsf(v[e]));
        }
    }
}

/* Q, K 16-bit rows [slot][D] of block blockIdx.x + blk0 (TILE: dst may be
 * NULL, none written).  amax (NVFP4 calls): the channel amax of each
 * video block (blk >= pblk) into amax[bh][blk - pblk][D].  TILE, for each
 * video block: the router's pooling into pool, the INT8 codes into i8
 * (above; either may be absent), with dg_pool_smem bytes of dynamic shared
 * memory.  Padding slots (pack -1) give +0, which leaves the amax alone;
 * partition.c puts a region's count cells first, so the rest are exactly
 * its valid tokens. */
template <int DT, int F16, bool VEC, bool TILE>
__global__ void __launch_bounds__(DG_PREP_THREADS, dg_min_ctas(DT, VEC, TILE))
dg_pack16_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t n_pack, int pblk,
                 int blk0, int R, uint16_t *dst, float *amax, dg_pool_out pool, dg_int8_out i8) {
    const int blk = blockIdx.x + blk0, bh = blockIdx.y, D = (int)x.D, lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, r0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh), vb = (int64_t)bh * R + (blk - pblk);
    const int32_t *pk = pack + (int64_t)blk * DG_KEYS + r0;
    const bool video = TILE && blk >= pblk;
    const bool pooling = video && pool.avg, quant = video && i8.codes;
    const bool block_delta = quant && i8.rows != 1;
    int32_t orig[8];
    dg_chunk<DT, VEC> rows[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) orig[k] = __ldg(pk + k * DG_RSTEP);
#pragma unroll
    for (int k = 0; k < 8; ++k) rows[k].load(x.data, base + (int64_t)max(orig[k], 0) * x.sn + c);
    uint32_t valid = 0u; /* bit k: row r0 + 16 k is a token (one register, not eight) */
#pragma unroll
    for (int k = 0; k < 8; ++k) valid |= (uint32_t)(orig[k] >= 0) << k;
    uint16_t *o = !TILE || dst ? dst + ((int64_t)bh * n_pack + (int64_t)blk * DG_KEYS + r0) * D + c
                               : NULL;
    float m[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int n = video ? count[blk - pblk] : 0;
    const int n_tile = pooling || quant ? n : 0; /* rows the tile keeps */
    constexpr bool raw = dg_raw16<DT, F16, VEC>();
    const bool row_delta = quant && !block_delta;
    float rowmax[8];
    dg_put_rows<DT, F16, VEC>(rows, valid, r0, c, D, n_tile, o, m, raw && row_delta, rowmax);
    int8_t *q8 = quant ? i8.codes + (vb * DG_KEYS + r0) * D + c : NULL;
    if (row_delta && lg == 4)
        dg_int8_rows<DT, 4, raw>(D, n, c, r0, i8.delta + vb * DG_KEYS, q8, rowmax);
    else if (row_delta)
        dg_int8_rows<DT, 3, raw>(D, n, c, r0, i8.delta + vb * DG_KEYS, q8, rowmax);
    const bool store_amax = amax && blk >= pblk;
    if (store_amax || block_delta) { /* CTA-uniform: the reductions hold barriers */
        float a = 0.0f; /* the channel amax, or only this thread's part of the block's */
        if (store_amax)
            a = dg_amax_reduce(m, D, lg);
        else
#pragma unroll
            for (int e = 0; e < 8; ++e) a = fmaxf(a, m[e]);
        if (store_amax && (int)threadIdx.x < D) amax[vb * D + threadIdx.x] = a;
        if (block_delta) dg_int8_block<DT>(a, D, n, c, r0, i8.delta + vb, q8);
    }
    if (pooling) dg_pool_store<DT>(D, n, pool.avg + vb * D, pool.max + vb * D, pool.kslots);
}

/* ================================================================ launchers */

/* The tiled pack of one instance: its tile in dynamic shared memory
 * (64 KB for f32 rows at D 128, above the default 48 KB). */
template <int DT, int F16, bool VEC>
static void dg_launch_tiled_pack(dim3 grid, unsigned nt, const qvc_view &x,
                                 const qvc_draft_layout *L, int blk0, int R, uint16_t *dst,
                                 float *amax, dg_pool_out pool, dg_int8_out i8, cudaStream_t st) {
    const int smem = dg_pool_smem(DT, (int)x.D);
    void (*k)(qvc_view, const int32_t *, const int32_t *, int64_t, int, int, int, uint16_t *,
              float *, dg_pool_out, dg_int8_out) = dg_pack16_kernel<DT, F16, VEC, true>;
    if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k<<<grid, nt, smem, st>>>(x, L->pack_to_orig, L->count, L->n_pack,
                              (int)(L->prefix_pad / DG_KEYS), blk0, R, dst, amax, pool, i8);
}

/* The video blocks' pooling and INT8 codes alone (no 16-bit rows
 * written): the standalone pooling, and a Q that the kernel reads in
 * place. */
template <int DT, int F16>
static void dg_launch_video_tiles(const qvc_view &x, const qvc_draft_layout *L, int BH,
                                  dg_pool_out pool, dg_int8_out i8, cudaStream_t st) {
    const int pblk = (int)(L->prefix_pad / DG_KEYS);
    const dim3 grid((unsigned)L->regions, (unsigned)BH);
    const unsigned nt = 2 * (unsigned)x.D;
    if (qvc_view_vec_ok(&x, 8))
        dg_launch_tiled_pack<DT, F16, true>(grid, nt, x, L, pblk, L->regions, NULL, NULL, pool,
                                            i8, st);
    else
        dg_launch_tiled_pack<DT, F16, false>(grid, nt, x, L, pblk, L->regions, NULL, NULL, pool,
                                             i8, st);
}

/* Q or K 16-bit rows and, with amax, the channel amax; the pooling and
 * INT8 codes that pool and i8 ask for. */
template <int DT, int F16>
static void dg_launch_pack_qk(const qvc_view &x, const qvc_draft_layout *L, int R, int BH,
                              uint16_t *dst, float *amax, dg_pool_out pool, dg_int8_out i8,
                              cudaStream_t st) {
    const dim3 grid((unsigned)(L->n_pack / DG_KEYS), (unsigned)BH);
    const int pblk = (int)(L->prefix_pad / DG_KEYS);
    const int32_t *pk = L->pack_to_orig;
    const int64_t np = L->n_pack;
    const unsigned nt = 2 * (unsigned)x.D;
    const bool vec = qvc_view_vec_ok(&x, 8), tiled = pool.avg || i8.codes;
    if (!dst && !amax) { /* a direct Q: the video blocks' pooling and codes only */
        if (tiled) dg_launch_video_tiles<DT, F16>(x, L, BH, pool, i8, st);
        return;
    }
    if (vec && tiled)
        dg_launch_tiled_pack<DT, F16, true>(grid, nt, x, L, 0, R, dst, amax, pool, i8, st);
    else if (tiled)
        dg_launch_tiled_pack<DT, F16, false>(grid, nt, x, L, 0, R, dst, amax, pool, i8, st);
    else if (vec)
        dg_pack16_kernel<DT, F16, true, false><<<grid, nt, 0, st>>>(x, pk, NULL, np, pblk, 0, R,
                                                                    dst, amax, pool, i8);
    else
        dg_pack16_kernel<DT, F16, false, false><<<grid, nt, 0, st>>>(x, pk, NULL, np, pblk, 0, R,
                                                                     dst, amax, pool, i8);
}

extern "C" qva_status qvc_draft_pool16(const qvc_view *x, const qvc_draft_layout *L, int BH,
                                       float *avg, float *max, int kslots, cudaStream_t st) {
    if (!x || !L || !L->pack_to_orig || !L->count || !avg || !max)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_pool16: NULL argument");
    if ((x->D != 64 && x->D != 128) || L->c != DG_KEYS || L->prefix_pad % DG_KEYS != 0 ||
        x->N != L->n || x->B * x->H != BH)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_draft_pool16: D %lld (64 or 128), region capacity %d (%d), "
                        "N %lld (layout %lld), B*H %lld (%d)",
                        (long long)x->D, L->c, DG_KEYS, (long long)x->N, (long long)L->n,
                        (long long)(x->B * x->H), BH);
    const dg_pool_out pool = {avg, max, kslots};
    const dg_int8_out none = {NULL, NULL, 0};
    QVC_DISPATCH_DTYPE(x->dtype, (dg_launch_video_tiles<DT_, 0>(*x, L, BH, pool, none, st)));
    return qvc_launch_check("qvc_draft_pool16");
}

/* The 16-bit operand of tensor w (0 Q, 1 K; no Q when the kernel reads it
 * in place, o->direct_q) and, with amax, each region's channel amax into
 * amax [3][BH][R][D]; pool and i8: the router's pooling and the INT8 codes
 * of the same reads. */
static qva_status dg_prep16_qk(const qvi_draft_plan *pl, const qvc_draft_layout *L,
                               const qvc_view &x, int w, dg_ops *o, float *amax, dg_pool_out pool,
                               dg_int8_out i8, cudaStream_t st) {
    const int BH = o->BH, R = o->R;
    uint16_t *dst = w ? o->k16 : o->direct_q ? NULL : o->q16;
    float *am = amax ? amax + (size_t)w * BH * R * o->D : NULL;
    if (pl->use_f16)
        QVC_DISPATCH_DTYPE(x.dtype,
                           (dg_launch_pack_qk<DT_, 1>(x, L, R, BH, dst, am, pool, i8, st)));
    else
        QVC_DISPATCH_DTYPE(x.dtype,
                           (dg_launch_pack_qk<DT_, 0>(x, L, R, BH, dst, am, pool, i8, st)));
    return qvc_launch_check("draft prep: 16-bit operands");
}

qva_status dg_prep_qk(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                      const qvc_view *kv, dg_ops *o, const qvc_draft_route_buf *pool,
                      cudaStream_t st) {
    /* Q's and K's region amax feed only the NVFP4 tensor scales
     * (dg_scale_kernel); V's channel scales come from V's own. */
    float *amax = pl->with4 ? o->amax : NULL;
    const dg_pool_out none = {NULL, NULL, 0};
    const dg_pool_out pq = pool ? dg_pool_out{pool->qavg, pool->qmax, 0} : none;
    const dg_pool_out pk = pool ? dg_pool_out{pool->kavg, pool->kmax, 1} : none;
    const dg_int8_out no8 = {NULL, NULL, 0};
    o->q_rows_per_scale = pl->q_rows_per_scale;
    const dg_int8_out q8 = pl->with8 ? dg_int8_out{o->q8, o->q8s, o->q_rows_per_scale} : no8;
    const dg_int8_out k8 = pl->with8 ? dg_int8_out{o->k8, o->k8s, DG_KEYS} : no8;
    const qva_status r = dg_prep16_qk(pl, L, *qv, 0, o, amax, pq, q8, st);
    return r != QVA_OK ? r : dg_prep16_qk(pl, L, *kv, 1, o, amax, pk, k8, st);
}

