/*
 * Operand preparation on the device: load the strided user Q, K, V, apply
 * the permutation, K smoothing, the Hadamard rotation and V-Smooth block
 * demeaning, and quantize into the layouts of cuda_internal.h.
 *
 * The values are those of the CPU reference (src/cpu/attention.c,
 * prepare_head / qvi_v8_prepare / quantize_ops, and the quantizers of
 * src/cpu/formats.c), bit for bit:
 *   - every float operation is written with an explicit _rn intrinsic, so
 *     nvcc can never contract a multiply and an add into an FMA the CPU
 *     does not form (the CPU is built -std=c11, which does not contract);
 *   - the FP64 sums (K channel mean, V block means) give the CPU's
 *     sequential sums exactly: V block means (128 rows) are summed
 *     sequentially in row order; the K mean is summed in parallel when
 *     the data certify that no partial sum can round (then every order is
 *     exact), and sequentially in the CPU's order otherwise (see the
 *     column sums section);
 *   - maxima are order-independent, so they use ordinary tree reductions.
 *
 * Kernels (the input dtype is a template parameter everywhere, so unrolled
 * loops issue their loads back to back):
 *   qk_quant_kernel<DT,NC>  one CTA per (128-row block, bh) of Q or K:
 *                           8 warps x 16 rows, lane = channel (c = lane +
 *                           32 j, j < NC); gather, smooth, Hadamard
 *                           (shuffles for strides < 32, in registers for
 *                           32 and 64); pass 1 the block amax, pass 2
 *                           (rows re-read) the codes.
 *   colsum_*                FP64 means of row lists equal to the CPU's
 *                           sequential sums: a certified parallel pass and
 *                           a sequential fallback.  Used for the K channel
 *                           mean here and the k-means update (kmeans.cu,
 *                           through qvc_colsum_mean).
 *   v_stats_kernel<DT>      one CTA per (block, bh), thread = channel:
 *                           block mean (if demean), residual amax.
 *   v_scale_kernel          thread per (bh, channel): per-channel scale and
 *                           the FP16-rounded mean / scale.
 *   v_encode_kernel<DT>     one CTA per (block, bh): E4M3 codes of the block
 *                           into shared memory, written transposed [D][128]
 *                           with the PV slot order of qvc_pv_slot_key().
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "device_util.cuh"

#define PREP_THREADS 256
#define PREP_WARPS (PREP_THREADS / 32)
#define ROWS_PER_WARP (QVI_BLOCK / PREP_WARPS) /* 16 */
#define FULL_MASK 0xffffffffu
#define MAX_D 128
#define MAX_NC (MAX_D / 32)

/* Source row of logical row i (perm: [BH][n] or NULL). */
static __device__ __forceinline__ int64_t src_row(const int32_t *perm, int bh,
                                                  int n, int i) {
    return perm ? (int64_t)__ldg(perm + (int64_t)bh * n + i) : (int64_t)i;
}

/* qva_int8_round: clamp first, then round half away from zero (roundf). */
static __device__ __forceinline__ int8_t int8_round(float y) {
    if (isnan(y)) return 0;
    if (y >= 127.0f) return 127;
    if (y <= -127.0f) return -127;
    return (int8_t)(int)roundf(y);
}

/* qva_e4m3_encode for finite inputs: RNE, saturating to +-448 (the
 * hardware cvt.rn.satfinite.e4m3x2.f32 on sm_89+). */
static __device__ __forceinline__ uint8_t e4m3(float y) {
    return (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

static __device__ __forceinline__ float round_f16(float y) {
    return __half2float(__float2half_rn(y));
}

static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

/* Block-wide max of a PREP_THREADS CTA; every thread gets the result. */
static __device__ float block_max(float x, float *red /* [PREP_WARPS] */) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    x = warp_max(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < PREP_WARPS; ++w) m = fmaxf(m, red[w]);
    return m;
}

/* ------------------------------------------------------------ Q and K */

typedef struct qk_params {
    qvc_view x;
    const int32_t *perm;  /* [BH][n] or NULL                   */
    const float *mean;    /* [BH][D] subtracted, or NULL       */
    const float *signs;   /* [D] +-1 or NULL                   */
    int hadamard;
    float had_scale;      /* (float)(1/sqrt((double)D))        */
    int fmt;              /* qvc_qk_format                     */
    int n, n_pad;
    int8_t *codes;        /* [BH][n_pad][D]                    */
    float *scale;         /* [BH][n_pad/128]                   */
} qk_params;

/* The pair (a, b) -> (a + b, a - b) of qva_hadamard. */
static __device__ __forceinline__ void butterfly(float &a, float &b) {
    float s = __fadd_rn(a, b), d = __fsub_rn(a, b);
    a = s;
    b = d;
}

/*
 * Row i of the block, as the CPU has it just before quantization: loaded,
 * smoothed (K), rotated (if hadamard).  Deterministic, so the two passes
 * of qk_quant_kernel see identical values.  Lane = channel lane + 32 j.
 */
template <int DT, int NC>
static __device__ __forceinline__ void qk_row(const qk_params &p, int64_t base, int bh, int i,
                                              const float *mu, const float *sg, float *x) {
    const int lane = threadIdx.x & 31, D = (int)p.x.D;
    const bool valid = i < p.n; /* warp-uniform */
    const int64_t row = valid ? base + src_row(p.perm, bh, p.n, i) * p.x.sn : 0;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int c = lane + 32 * j;
        x[j] = (valid && c < D) ? qvc_ld<DT>(p.x.data, row + c) : 0.0f;
    }
    if (!valid) return; /* padding rows stay +0 (a sign flip would give -0) */
    if (p.mean) {
#pragma unroll
        for (int j = 0; j < NC; ++j)
            if (lane + 32 * j < D) x[j] = __fsub_rn(x[j], mu[j]);
    }
    if (p.hadamard) {
#pragma unroll
        for (int j = 0; j < NC; ++j) x[j] = __fmul_rn(x[j], sg[j]);
        /* Strides 1..16 live across lanes: the lane without bit h holds a
         * (gets a + b), its partner holds b (gets a - b). */
        for (int h = 1; h < 32 && h < D; h <<= 1) {
#pragma unroll
            for (int j = 0; j < NC; ++j) {
                const float o = __shfl_xor_sync(FULL_MASK, x[j], h);
                x[j] = (lane & h) ? __fsub_rn(o, x[j]) : __fadd_rn(x[j], o);
            }
        }
        /* Strides 32 and 64 pair registers j and j + h/32. */
        if (D > 32) {
#pragma unroll
            for (int j = 0; j + 1 < NC; ++j)
                if (!(j & 1)) butterfly(x[j], x[j + 1]);
        }
        if (D > 64) {
#pragma unroll
            for (int j = 0; j + 2 < NC; ++j)
                if (!(j & 2)) butterfly(x[j], x[j + 2]);
        }
#pragma unroll
        for (int j = 0; j < NC; ++j) x[j] = __fmul_rn(x[j], p.had_scale);
    }
}

/* Two passes over the block: the amax, then the codes.  The second pass
 * re-reads the rows (from L2) and recomputes them instead of holding the
 * block in registers, which keeps the kernel small enough for the
 * occupancy that hides the memory latency. */
template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
qk_quant_kernel(qk_params p) {
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.x.D;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;

    float mu[NC], sg[NC];
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int c = lane + 32 * j;
        mu[j] = (p.mean && c < D) ? p.mean[(int64_t)bh * D + c] : 0.0f;
        sg[j] = (p.signs && c < D) ? p.signs[c] : 1.0f;
    }

    float amax = 0.0f;
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
#pragma unroll
        for (int j = 0; j < NC; ++j) amax = fmaxf(amax, fabsf(x[j]));
    }
    amax = block_max(amax, red);

    float scale;
    if (p.fmt == QVC_QK_INT8) {
        scale = __fadd_rn(__fdiv_rn(amax, 127.0f), 1e-7f); /* DA2 C.3 delta */
    } else {
        scale = __fdiv_rn(amax, 448.0f);
        if (!(scale > 0.0f) || !isfinite(scale)) scale = 1.0f;
    }
    if (threadIdx.x == 0)
        p.scale[(int64_t)bh * (p.n_pad / QVI_BLOCK) + blk] = scale;

#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
        int8_t *dst = p.codes + ((int64_t)bh * p.n_pad + r0 + r) * D;
#pragma unroll
        for (int j = 0; j < NC; ++j) {
            const int c = lane + 32 * j;
            if (c >= D) continue;
            const float y = __fdiv_rn(x[j], scale);
            dst[c] = p.fmt == QVC_QK_INT8 ? int8_round(y) : (int8_t)e4m3(y);
        }
    }
}

/* ------------------------------------------------------------ column sums */

/*
 * Means of row lists in FP64 that equal the CPU's sequential sums bit for
 * bit (qvi_channel_mean: K mean; update_centroids: k-means).
 *
 * Head bh has npos positions; position p names row rows[bh*npos + p]
 * (rows NULL: row p) and belongs to segment pos_seg[bh*npos + p] (NULL:
 * segment bh).  Segment g's positions are seg_start[g] .. + seg_len[g]
 * within its head (NULL: 0 and npos); out[g][c] = (float)(sum / len) for
 * len > 0, untouched for len == 0.
 *
 * 1. Parallel pass (colsum_exact_kernel): per (segment, channel) the FP64
 *    sum in any order, the FP64 sum of |x| and q = the lowest set bit
 *    exponent of any nonzero x.  If sum|x| < 2^(q+52) then every partial
 *    sum of any subset, in any order, is a multiple of 2^q below 2^(q+53)
 *    in magnitude, hence exact in FP64: the CPU's sequential sum and ours
 *    are both the exact sum.  This holds for practically all bf16/f16
 *    data (8 or 11 significant bits) and for most f32 data.
 * 2. colsum_finalize_kernel writes those means and flags the others.
 * 3. colsum_kernel redoes only flagged channels sequentially, in list
 *    order (so even their roundings match the CPU): one warp adds, the 7
 *    other warps fill the next 128-row tile of a double buffer.
 */
#define CS_THREADS 256
#define CS_ROWS 128
#define CS_LOADERS (CS_THREADS / 32 - 1)                       /* 7  */
#define CS_PER_LOADER ((CS_ROWS + CS_LOADERS - 1) / CS_LOADERS) /* 19 */
#define XP_WARP_POS 256                       /* positions per warp, exact pass */
#define XP_QNONE 0x7F7F7F7F                   /* q of an all-zero channel (memset 0x7F) */

typedef struct colsum_params {
    qvc_view v;
    const int32_t *rows;     /* [BH][npos] or NULL                          */
    const uint32_t *pos_seg; /* [BH][npos] or NULL                          */
    int npos;
    const int *seg_start;    /* [nseg] or NULL (0)                          */
    const int *seg_len;      /* [nseg] or NULL (npos)                       */
    int seg_per_bh, nseg;
    float *out;              /* [nseg][D]                                   */
    double *sum, *asum;      /* [nseg][D] exact-pass accumulators           */
    int *qmin, *exact;       /* [nseg][D]                                   */
} colsum_params;

/* Exponent of the lowest set bit of a finite nonzero float. */
static __device__ __forceinline__ int lowbit_exp(float x) {
    const uint32_t b = __float_as_uint(x) & 0x7FFFFFFFu, E = b >> 23;
    uint32_t m = b & 0x7FFFFFu;
    int e = -149;
    if (E) {
        m |= 0x800000u;
        e = (int)E - 150;
    }
    return e + __ffs((int)m) - 1;
}

static __device__ __forceinline__ void colsum_flush(const colsum_params &p, int g, int c, double s,
                                                    double a, int q) {
    const int64_t o = (int64_t)g * p.v.D + c;
    atomicAdd(p.sum + o, s);
    atomicAdd(p.asum + o, a);
    if (q != XP_QNONE) atomicMin(p.qmin + o, q);
}

/* Each warp takes XP_WARP_POS consecutive positions (lane = channel) and
 * flushes its partials with atomics whenever the segment changes. */
template <int DT>
__global__ void __launch_bounds__(CS_THREADS)
colsum_exact_kernel(colsum_params p) {
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.v.D, c = blockIdx.z * 32 + lane;
    const int p0 = (blockIdx.x * (CS_THREADS / 32) + warp) * XP_WARP_POS;
    if (p0 >= p.npos) return;
    const int p1 = min(p0 + XP_WARP_POS, p.npos);
    const int64_t base = qvc_head_base(p.v, bh), lb = (int64_t)bh * p.npos;
    int cur = -1, q = XP_QNONE;
    double s = 0.0, a = 0.0;
    for (int pos = p0; pos < p1; pos += 8) {
        int g[8];
        int64_t ro[8];
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int pp = pos + u;
            const bool in = pp < p1;
            g[u] = !in ? -1 : p.pos_seg ? (int)__ldg(p.pos_seg + lb + pp) : bh;
            ro[u] = !in ? -1 : p.rows ? (int64_t)__ldg(p.rows + lb + pp) : (int64_t)pp;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
            x[u] = (ro[u] >= 0 && c < D) ? qvc_ld<DT>(p.v.data, base + ro[u] * p.v.sn + c) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (g[u] < 0) continue;
            if (g[u] != cur) { /* warp-uniform: every lane sees the same position */
                if (cur >= 0 && c < D) colsum_flush(p, cur, c, s, a, q);
                cur = g[u];
                s = a = 0.0;
                q = XP_QNONE;
            }
            s += (double)x[u];
            a += (double)fabsf(x[u]);
            if (x[u] != 0.0f) q = min(q, lowbit_exp(x[u]));
        }
    }
    if (cur >= 0 && c < D) colsum_flush(p, cur, c, s, a, q);
}

__global__ void colsum_finalize_kernel(colsum_params p) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)p.nseg * p.v.D) return;
    const int g = (int)(t / p.v.D);
    const int len = p.seg_len ? p.seg_len[g] : p.npos;
    const int q = p.qmin[t];
    /* NaN or Inf make asum non-finite: the comparison fails, and the
     * sequential path reproduces the CPU's result for them too. */
    const int ok = q == XP_QNONE || p.asum[t] < ldexp(1.0, q + 52);
    p.exact[t] = ok;
    if (ok && len > 0) p.out[t] = (float)(p.sum[t] / (double)len);
}

/* Row offsets (in elements, -1 past the end) of the rows this loader
 * fetches for tile t: rows loader, loader + 7, ... of the tile. */
static __device__ __forceinline__ void colsum_rows(const colsum_params &p, const int32_t *rows,
                                                   int start, int len, int t, int loader,
                                                   int64_t *ro) {
#pragma unroll
    for (int m = 0; m < CS_PER_LOADER; ++m) {
        const int rr = loader + CS_LOADERS * m, r = t * CS_ROWS + rr;
        ro[m] = (rr < CS_ROWS && r < len)
                    ? (rows ? (int64_t)__ldg(rows + r) : (int64_t)(start + r)) * p.v.sn
                    : -1;
    }
}

/* Loads the rows at ro (channel c of head base) into a tile. */
template <int DT>
static __device__ __forceinline__ void colsum_data(const colsum_params &p, const int64_t *ro,
                                                   int64_t base, int c, int loader, float *dst) {
    const int D = (int)p.v.D, lane = threadIdx.x & 31;
    float vals[CS_PER_LOADER];
#pragma unroll
    for (int m = 0; m < CS_PER_LOADER; ++m)
        vals[m] = (ro[m] >= 0 && c < D) ? qvc_ld<DT>(p.v.data, base + ro[m] + c) : 0.0f;
#pragma unroll
    for (int m = 0; m < CS_PER_LOADER; ++m) {
        const int rr = loader + CS_LOADERS * m;
        if (rr < CS_ROWS) dst[rr * 33 + lane] = vals[m];
    }
}

/* The sequential path for the channels the exact pass could not certify;
 * a CTA whose 32 channels are all certified returns at once. */
template <int DT>
__global__ void __launch_bounds__(CS_THREADS)
colsum_kernel(colsum_params p) {
    __shared__ float tile[2][CS_ROWS * 33];
    const int seg = blockIdx.x, bh = seg / p.seg_per_bh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.v.D, c = blockIdx.y * 32 + lane;
    const int start = p.seg_start ? p.seg_start[seg] : 0;
    const int len = p.seg_len ? p.seg_len[seg] : p.npos;
    const bool need = c < D && len > 0 && !p.exact[(int64_t)seg * D + c];
    if (!__syncthreads_or(need)) return;
    const int ntiles = (len + CS_ROWS - 1) / CS_ROWS;
    const int64_t base = qvc_head_base(p.v, bh);
    const int32_t *rows = p.rows ? p.rows + (int64_t)bh * p.npos + start : NULL;

    /* Loaders keep the row offsets of the next tile in registers, fetched
     * one tile ahead, so each tile costs them a single memory round trip. */
    int64_t ro[CS_PER_LOADER];
    if (warp > 0 && ntiles > 0) {
        colsum_rows(p, rows, start, len, 0, warp - 1, ro);
        colsum_data<DT>(p, ro, base, c, warp - 1, tile[0]);
        colsum_rows(p, rows, start, len, 1, warp - 1, ro);
    }
    __syncthreads();
    double s = 0.0;
    for (int t = 0; t < ntiles; ++t) {
        if (warp > 0) {
            if (t + 1 < ntiles) {
                colsum_data<DT>(p, ro, base, c, warp - 1, tile[(t + 1) & 1]);
                colsum_rows(p, rows, start, len, t + 2, warp - 1, ro);
            }
        } else {
            /* Shared loads 16 ahead so the chain is only the DADDs. */
            const float *src = tile[t & 1] + lane;
            const int nr = min(CS_ROWS, len - t * CS_ROWS);
            int rr = 0;
            for (; rr + 16 <= nr; rr += 16) {
                float u[16];
#pragma unroll
                for (int m = 0; m < 16; ++m) u[m] = src[(rr + m) * 33];
#pragma unroll
                for (int m = 0; m < 16; ++m) s += (double)u[m];
            }
            for (; rr < nr; ++rr) s += (double)src[rr * 33];
        }
        __syncthreads();
    }
    if (warp == 0 && need) p.out[(int64_t)seg * D + c] = (float)(s / (double)len);
}

extern "C" qva_status qvc_colsum_mean(const qvc_view *v, const int32_t *rows,
                                      const uint32_t *pos_seg, int npos,
                                      const int *seg_start, const int *seg_len,
                                      int seg_per_bh, int nseg, float *out,
                                      cudaStream_t st) {
    if (nseg <= 0 || npos <= 0) return QVA_OK;
    const int D = (int)v->D, BH = (int)(v->B * v->H), ncg = qvi_cdiv(D, 32);
    const size_t cells = (size_t)nseg * D;
    const size_t b8 = (cells * 8 + 255) & ~(size_t)255, b4 = (cells * 4 + 255) & ~(size_t)255;
    char *tmp = NULL;
    cudaError_t e = cudaMallocAsync((void **)&tmp, 2 * b8 + 2 * b4, st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "column mean: cudaMallocAsync");
    colsum_params p;
    p.v = *v;
    p.rows = rows;
    p.pos_seg = pos_seg;
    p.npos = npos;
    p.seg_start = seg_start;
    p.seg_len = seg_len;
    p.seg_per_bh = seg_per_bh;
    p.nseg = nseg;
    p.out = out;
    p.sum = (double *)tmp;
    p.asum = (double *)(tmp + b8);
    p.qmin = (int *)(tmp + 2 * b8);
    p.exact = (int *)(tmp + 2 * b8 + b4);
    qva_status s = QVA_OK;
    if ((e = cudaMemsetAsync(tmp, 0, 2 * b8, st)) != cudaSuccess ||
        (e = cudaMemsetAsync(p.qmin, 0x7F, b4, st)) != cudaSuccess)
        s = qvc_cuda_fail(e, "column mean: cudaMemsetAsync");
    if (s == QVA_OK) {
        const int per_cta = (CS_THREADS / 32) * XP_WARP_POS;
        dim3 grid((unsigned)qvi_cdiv(npos, per_cta), (unsigned)BH, (unsigned)ncg);
        QVC_DISPATCH_DTYPE(v->dtype, (colsum_exact_kernel<DT_><<<grid, CS_THREADS, 0, st>>>(p)));
        s = qvc_launch_check("column mean: exact pass");
    }
    if (s == QVA_OK) {
        colsum_finalize_kernel<<<(unsigned)((cells + 255) / 256), 256, 0, st>>>(p);
        s = qvc_launch_check("column mean: finalize");
    }
    if (s == QVA_OK) {
        dim3 grid((unsigned)nseg, (unsigned)ncg);
        QVC_DISPATCH_DTYPE(v->dtype, (colsum_kernel<DT_><<<grid, CS_THREADS, 0, st>>>(p)));
        s = qvc_launch_check("column mean: sequential pass");
    }
    if ((e = cudaFreeAsync(tmp, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "column mean: cudaFreeAsync");
    return s;
}

/* ------------------------------------------------------------ V */

/* block_demean + the per-block part of v_channel_scale: the raw block mean
 * (0 without demeaning) and the amax of the residual over the valid rows.
 * A block has at most 128 rows and there are nblk x BH CTAs, so the
 * plain per-thread chain is short and well hidden. */
template <int DT>
__global__ void __launch_bounds__(MAX_D)
v_stats_kernel(qvc_view v, const int32_t *perm, int n, int nblk, int demean,
               float *bmu, float *bamax) {
    const int blk = blockIdx.x, bh = blockIdx.y, c = threadIdx.x, D = (int)v.D;
    if (c >= D) return;
    const int64_t base = qvc_head_base(v, bh);
    const int r0 = blk * QVI_BLOCK, len = min(QVI_BLOCK, n - r0);
    float m = 0.0f;
    if (demean) {
        double s = 0.0;
        int i = 0;
        for (; i + 16 <= len; i += 16) { /* loads ahead, adds in row order */
            float t[16];
#pragma unroll
            for (int u = 0; u < 16; ++u)
                t[u] = qvc_ld<DT>(v.data, base + src_row(perm, bh, n, r0 + i + u) * v.sn + c);
#pragma unroll
            for (int u = 0; u < 16; ++u) s += (double)t[u];
        }
        for (; i < len; ++i) s += (double)qvc_ld<DT>(v.data, base + src_row(perm, bh, n, r0 + i) * v.sn + c);
        m = (float)(s / (double)len);
    }
    float amax = 0.0f;
#pragma unroll 16
    for (int i = 0; i < len; ++i) {
        float x = qvc_ld<DT>(v.data, base + src_row(perm, bh, n, r0 + i) * v.sn + c);
        if (demean) x = __fsub_rn(x, m);
        amax = fmaxf(amax, fabsf(x));
    }
    const int64_t o = ((int64_t)bh * nblk + blk) * D + c;
    bmu[o] = m;
    bamax[o] = amax;
}

/* v_channel_scale, then mu_hat = fp16(mu / scale) (VC App. B). */
__global__ void v_scale_kernel(int BH, int D, int nblk, int demean,
                               const float *bmu, const float *bamax,
                               float *v_chan, float *v_mu) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)BH * D) return;
    const int bh = (int)(t / D), c = (int)(t % D);
    const int64_t o0 = (int64_t)bh * nblk * D + c;
    float amax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < nblk; ++j) {
        amax = fmaxf(amax, bamax[o0 + (int64_t)j * D]);
        if (demean) mmax = fmaxf(mmax, fabsf(bmu[o0 + (int64_t)j * D]));
    }
    float s = fmaxf(__fdiv_rn(amax, QVI_V_E4M3_RANGE), __fdiv_rn(mmax, 32768.0f));
    s = s > 0.0f ? s : 1.0f;
    v_chan[t] = s;
    if (v_mu)
        for (int j = 0; j < nblk; ++j)
            v_mu[o0 + (int64_t)j * D] = demean ? round_f16(__fdiv_rn(bmu[o0 + (int64_t)j * D], s)) : 0.0f;
}

typedef struct v_params {
    qvc_view v;
    const int32_t *perm;
    int n, nblk;
    int mode;            /* 0: per-channel (sage/vc); 1: per-block (fp8) */
    int demean;          /* mode 0 */
    const float *bmu;    /* mode 0 with demean: [BH][nblk][D] raw means */
    const float *chan;   /* mode 0: [BH][D] scales                      */
    uint8_t *v_t;        /* [BH][nblk][D][128]                          */
    float *v_blk;        /* [BH][nblk]                                  */
    float *v_chan;       /* [BH][D]: mode 1 writes 1                    */
} v_params;

/* Shared-memory row stride of the code tile: 132 makes the transposed
 * read (fixed channel, 32 different keys) hit 32 different banks. */
#define TILE_STRIDE (MAX_D + 4)

template <int DT>
__global__ void __launch_bounds__(PREP_THREADS)
v_encode_kernel(v_params p) {
    __shared__ uint8_t tile[QVI_BLOCK * TILE_STRIDE];
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.v.D;
    const int64_t base = qvc_head_base(p.v, bh);

    float bscale = 1.0f;
    if (p.mode == 1) { /* qvi_quant_e4m3_blocks: amax over the block (pads are 0) */
        float amax = 0.0f;
#pragma unroll 4
        for (int r = 0; r < ROWS_PER_WARP; ++r) {
            const int i = blk * QVI_BLOCK + warp * ROWS_PER_WARP + r;
            if (i >= p.n) break; /* warp-uniform */
            const int64_t row = base + src_row(p.perm, bh, p.n, i) * p.v.sn;
#pragma unroll
            for (int j = 0; j < MAX_NC; ++j) {
                const int c = lane + 32 * j;
                if (c < D) amax = fmaxf(amax, fabsf(qvc_ld<DT>(p.v.data, row + c)));
            }
        }
        amax = block_max(amax, red);
        bscale = __fdiv_rn(amax, 448.0f);
        if (!(bscale > 0.0f) || !isfinite(bscale)) bscale = 1.0f;
    }

    float mu[MAX_NC], cs[MAX_NC];
#pragma unroll
    for (int j = 0; j < MAX_NC; ++j) {
        const int c = lane + 32 * j;
        const bool in = p.mode == 0 && c < D;
        mu[j] = in && p.demean ? p.bmu[((int64_t)bh * p.nblk + blk) * D + c] : 0.0f;
        cs[j] = in ? p.chan[(int64_t)bh * D + c] : 1.0f;
    }
    /* Codes of the warp's 16 keys into the tile (re-reading the rows the
     * amax pass touched: L2 hits, and a small kernel). */
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const int key = warp * ROWS_PER_WARP + r, i = blk * QVI_BLOCK + key;
        const bool valid = i < p.n;
        const int64_t row = valid ? base + src_row(p.perm, bh, p.n, i) * p.v.sn : 0;
        uint8_t *trow = tile + key * TILE_STRIDE;
#pragma unroll
        for (int j = 0; j < MAX_NC; ++j) {
            const int c = lane + 32 * j;
            if (c >= D) continue;
            uint8_t code = 0; /* padding keys: code 0 */
            if (valid) {
                const float x = qvc_ld<DT>(p.v.data, row + c);
                float y;
                if (p.mode == 1) {
                    y = __fdiv_rn(x, bscale);
                } else {
                    const float res = p.demean ? __fsub_rn(x, mu[j]) : x;
                    y = __fdiv_rn(res, cs[j]);
                }
                code = e4m3(y);
            }
            trow[c] = code;
        }
    }
    __syncthreads();

    /* Transposed write-out: word w holds slots 4(w%32)..+3 of channel w/32,
     * so each warp stores one channel's 128 contiguous bytes. */
    uint32_t *dst = (uint32_t *)(p.v_t + ((int64_t)bh * p.nblk + blk) * D * QVI_BLOCK);
    for (int w = threadIdx.x; w < D * (QVI_BLOCK / 4); w += PREP_THREADS) {
        const int c = w >> 5, s0 = (w & 31) * 4;
        uint32_t word = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int s = s0 + q, key = (s & ~31) + qvc_pv_slot_key(s & 31);
            word |= (uint32_t)tile[key * TILE_STRIDE + c] << (8 * q);
        }
        dst[w] = word;
    }

    if (threadIdx.x == 0) p.v_blk[(int64_t)bh * p.nblk + blk] = bscale;
    if (p.mode == 1 && blk == 0)
        for (int c = threadIdx.x; c < D; c += PREP_THREADS) p.v_chan[(int64_t)bh * D + c] = 1.0f;
}

/* ------------------------------------------------------------ LSE shift */

/* smooth_k() of the CPU: lse_shift[bh][i] = (float)(dot * sm_scale) with
 * dot the FP64 sum, in channel order, of q_i[c] * mean[c] (each product of
 * two floats is exact in FP64, so the rounding is the CPU's), q_i the
 * loaded (unrotated) query row and mean the K' channel mean. */
template <int DT>
__global__ void lse_shift_kernel(qvc_view q, const float *kmean, float sm_scale, float *out) {
    const int bh = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x, D = (int)q.D;
    if (i >= q.N) return;
    const int64_t row = qvc_head_base(q, bh) + (int64_t)i * q.sn;
    const float *mean = kmean + (int64_t)bh * D;
    double dot = 0.0;
    for (int c = 0; c < D; ++c)
        dot = __dadd_rn(dot, __dmul_rn((double)qvc_ld<DT>(q.data, row + c), (double)mean[c]));
    out[(int64_t)bh * q.N + i] = __double2float_rn(__dmul_rn(dot, (double)sm_scale));
}

static qva_status launch_lse_shift(const qvc_view *q, const float *kmean, float sm_scale,
                                   float *out, int BH, cudaStream_t st) {
    dim3 grid((unsigned)qvi_cdiv((int)q->N, 128), (unsigned)BH);
    QVC_DISPATCH_DTYPE(q->dtype, (lse_shift_kernel<DT_><<<grid, 128, 0, st>>>(*q, kmean, sm_scale, out)));
    return qvc_launch_check("qvc_prep: LSE shift");
}

/* ------------------------------------------------------------ NVFP4 (sage4 / vc4) */

/*
 * qvi_quant_nvfp4_rows / _cols of the CPU, bit for bit.  The per-head
 * tensor scale g needs the amax of the whole prepared head first, so each
 * operand takes two launches: an amax pass (atomicMax of the float bits:
 * non-negative floats order like their bit patterns) and an encode pass.
 * The rows are the ones qk_row() gives the INT8 path (gathered, smoothed,
 * rotated); V reuses v_stats_kernel (block means, residual amax).
 * amax[bh*3 + slot], slot 0/1/2 = Q/K/V; g likewise.
 */

/* The per-lane channel constants of qk_row (K mean, Hadamard signs). */
template <int NC>
static __device__ __forceinline__ void qk_lane_consts(const qk_params &p, int bh, float *mu,
                                                      float *sg) {
    const int lane = threadIdx.x & 31, D = (int)p.x.D;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int c = lane + 32 * j;
        mu[j] = (p.mean && c < D) ? p.mean[(int64_t)bh * D + c] : 0.0f;
        sg[j] = (p.signs && c < D) ? p.signs[c] : 1.0f;
    }
}

template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
nvfp4_qk_amax_kernel(qk_params p, unsigned *amax, int slot) {
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x >> 5;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;
    float mu[NC], sg[NC];
    qk_lane_consts<NC>(p, bh, mu, sg);
    float m = 0.0f;
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
#pragma unroll
        for (int j = 0; j < NC; ++j) m = fmaxf(m, fabsf(x[j])); /* fmaxf skips NaN, as the CPU */
    }
    m = block_max(m, red);
    if (threadIdx.x == 0) atomicMax(amax + bh * 3 + slot, __float_as_uint(m));
}

/* One group of 16 (amax ga, over the lanes or rows of the group) given g,
 * as nvfp4_group() of the CPU: the scale code sc = e4m3(ga / (6.0f*g)),
 * sigma = its value, and the divisor g*sigma; *zero when sigma == 0, which
 * zeroes the group's codes. */
static __device__ __forceinline__ float nvfp4_group_scale(float ga, float g, uint32_t *sc,
                                                          bool *zero) {
    *sc = qvc_e4m3_code(__fdiv_rn(ga, __fmul_rn(6.0f, g)));
    const float sigma = qvc_e4m3_value(*sc);
    *zero = sigma == 0.0f;
    return __fmul_rn(g, sigma);
}

static __device__ __forceinline__ uint32_t nvfp4_code(float x, float denom, bool zero) {
    return zero ? 0u : qvc_e2m1_code(__fdiv_rn(x, denom));
}

/* Groups of 16 channels of each row: lanes 0-15 / 16-31 of register j form
 * one group (D is a multiple of 32). */
template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
nvfp4_qk_encode_kernel(qk_params p, const unsigned *amax, int slot, float *g_out,
                       uint8_t *codes, uint8_t *scodes) {
    const int blk = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.x.D;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;
    const float g = qvc_nvfp4_tensor_scale(__uint_as_float(amax[bh * 3 + slot]));
    if (blk == 0 && threadIdx.x == 0) g_out[bh * 3 + slot] = g;
    float mu[NC], sg[NC];
    qk_lane_consts<NC>(p, bh, mu, sg);
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
        const int64_t row = (int64_t)bh * p.n_pad + r0 + r;
        uint8_t *crow = codes + row * (D / 2), *srow = scodes + row * (D / 16);
#pragma unroll
        for (int j = 0; j < NC; ++j) {
            const int c = lane + 32 * j;
            float ga = fabsf(x[j]);
#pragma unroll
            for (int o = 1; o < 16; o <<= 1) ga = fmaxf(ga, __shfl_xor_sync(FULL_MASK, ga, o));
            uint32_t sc;
            bool zero;
            const float denom = nvfp4_group_scale(ga, g, &sc, &zero);
            const uint32_t code = nvfp4_code(x[j], denom, zero);
            const uint32_t hi = __shfl_down_sync(FULL_MASK, code, 1);
            if (!(lane & 1)) crow[c >> 1] = (uint8_t)(code | (hi << 4));
            if (!(lane & 15)) srow[c >> 4] = (uint8_t)sc;
        }
    }
}

/* V: head amax from the per-block residual amax of v_stats_kernel, and
 * the vc4 means fp16(mu) (raw, not divided by a scale). Thread per (bh, c). */
__global__ void nvfp4_v_amax_kernel(int BH, int D, int nblk, const float *bmu, const float *bamax,
                                    unsigned *amax, float *mu) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)BH * D) return;
    const int bh = (int)(t / D), c = (int)(t % D);
    const int64_t o0 = (int64_t)bh * nblk * D + c;
    float m = 0.0f;
    for (int j = 0; j < nblk; ++j) {
        m = fmaxf(m, bamax[o0 + (int64_t)j * D]);
        if (mu) mu[o0 + (int64_t)j * D] = round_f16(bmu[o0 + (int64_t)j * D]);
    }
    atomicMax(amax + bh * 3 + 2, __float_as_uint(m));
}

/* V codes: one CTA per (128-key block, bh); a task is a pair of channels
 * (c, c+1) over a group of 16 keys, so it writes whole code bytes. */
template <int DT>
__global__ void __launch_bounds__(PREP_THREADS)
nvfp4_v_encode_kernel(qvc_view v, const int32_t *perm, int n, int nk_pad, int nblk, int demean,
                      const float *bmu, const unsigned *amax, float *g_out, uint8_t *codes,
                      uint8_t *scodes) {
    const int blk = blockIdx.x, bh = blockIdx.y, D = (int)v.D;
    const int64_t base = qvc_head_base(v, bh);
    const float g = qvc_nvfp4_tensor_scale(__uint_as_float(amax[bh * 3 + 2]));
    if (blk == 0 && threadIdx.x == 0) g_out[bh * 3 + 2] = g;
    const int pairs = D / 2;
    for (int t = threadIdx.x; t < (QVI_BLOCK / 16) * pairs; t += PREP_THREADS) {
        const int cp = t % pairs, grp = t / pairs, c = 2 * cp;
        const int i0 = blk * QVI_BLOCK + grp * 16;
        const float *m = bmu + ((int64_t)bh * nblk + blk) * D + c;
        const float m0 = demean ? m[0] : 0.0f, m1 = demean ? m[1] : 0.0f;
        float x0[16], x1[16];
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const int i = i0 + u;
            x0[u] = x1[u] = 0.0f; /* padding keys stay +0, never demeaned */
            if (i < n) {
                const int64_t row = base + src_row(perm, bh, n, i) * v.sn;
                x0[u] = qvc_ld<DT>(v.data, row + c);
                x1[u] = qvc_ld<DT>(v.data, row + c + 1);
                if (demean) x0[u] = __fsub_rn(x0[u], m0), x1[u] = __fsub_rn(x1[u], m1);
            }
            a0 = fmaxf(a0, fabsf(x0[u]));
            a1 = fmaxf(a1, fabsf(x1[u]));
        }
        uint32_t s0, s1;
        bool z0, z1;
        const float d0 = nvfp4_group_scale(a0, g, &s0, &z0), d1 = nvfp4_group_scale(a1, g, &s1, &z1);
        uint8_t *crow = codes + ((int64_t)bh * nk_pad + i0) * (D / 2) + cp;
#pragma unroll
        for (int u = 0; u < 16; ++u)
            crow[(int64_t)u * (D / 2)] =
                (uint8_t)(nvfp4_code(x0[u], d0, z0) | (nvfp4_code(x1[u], d1, z1) << 4));
        uint8_t *srow = scodes + ((int64_t)bh * (nk_pad / 16) + blk * (QVI_BLOCK / 16) + grp) * D + c;
        srow[0] = (uint8_t)s0;
        srow[1] = (uint8_t)s1;
    }
}

/* ------------------------------------------------------------ host side */

extern "C" qva_status qvc_ops_alloc(qvc_ops *ops, int BH, int nq, int nk,
                                    int D, int with_mu) {
    if (!ops) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_ops_alloc: ops is NULL");
    memset(ops, 0, sizeof *ops);
    if (BH < 1 || nq < 1 || nk < 1 || D < 1 || D > MAX_D)
        return qvi_fail(QVA_ERR_SHAPE, "qvc_ops_alloc: bad shape BH=%d nq=%d nk=%d D=%d",
                        BH, nq, nk, D);
    ops->BH = BH;
    ops->nq = nq;
    ops->nk = nk;
    ops->D = D;
    ops->nq_pad = qvi_cdiv(nq, QVI_BLOCK) * QVI_BLOCK;
    ops->nk_pad = qvi_cdiv(nk, QVI_BLOCK) * QVI_BLOCK;
    ops->nblk = ops->nk_pad / QVI_BLOCK;
    const size_t bh = (size_t)BH, d = (size_t)D, nqb = (size_t)ops->nq_pad / QVI_BLOCK,
                 nkb = (size_t)ops->nblk;
    const qvc_alloc req[] = {
        {(void **)&ops->q_i8, bh * (size_t)ops->nq_pad * d},
        {(void **)&ops->q_scale, bh * nqb * sizeof(float)},
        {(void **)&ops->k_i8, bh * (size_t)ops->nk_pad * d},
        {(void **)&ops->k_scale, bh * nkb * sizeof(float)},
        {(void **)&ops->v_t, bh * nkb * d * QVI_BLOCK},
        {(void **)&ops->v_chan, bh * d * sizeof(float)},
        {(void **)&ops->v_blk, bh * nkb * sizeof(float)},
        {(void **)&ops->v_mu, with_mu ? bh * nkb * d * sizeof(float) : 0},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_ops_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_ops_free(ops);
    return st;
}

extern "C" void qvc_ops_free(qvc_ops *ops) {
    if (!ops) return;
    void *ptrs[] = {ops->q_i8, ops->q_scale, ops->k_i8, ops->k_scale,
                    ops->v_t, ops->v_chan, ops->v_blk, ops->v_mu};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(ops, 0, sizeof *ops);
}

template <int DT>
static void launch_qk_dt(const qk_params &p, dim3 grid, int D, cudaStream_t st) {
    switch (qvi_cdiv(D, 32)) {
    case 1: qk_quant_kernel<DT, 1><<<grid, PREP_THREADS, 0, st>>>(p); break;
    case 2: qk_quant_kernel<DT, 2><<<grid, PREP_THREADS, 0, st>>>(p); break;
    case 3: qk_quant_kernel<DT, 3><<<grid, PREP_THREADS, 0, st>>>(p); break;
    default: qk_quant_kernel<DT, 4><<<grid, PREP_THREADS, 0, st>>>(p); break;
    }
}

static qva_status launch_qk(const qk_params &p, int BH, int D, cudaStream_t st,
                            const char *what) {
    dim3 grid(p.n_pad / QVI_BLOCK, BH);
    QVC_DISPATCH_DTYPE(p.x.dtype, launch_qk_dt<DT_>(p, grid, D, st));
    return qvc_launch_check(what);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* What qvc_prep and qvc_prep4 both require of their views and arguments. */
static qva_status check_prep_views(const char *who, const qvc_view *q, const qvc_view *k,
                                   const qvc_view *v, const qvc_prep_args *a, int BH, int nq,
                                   int nk, int D) {
    qva_status s;
    if ((s = qvc_check_view(who, q, "q")) || (s = qvc_check_view(who, k, "k")) ||
        (s = qvc_check_view(who, v, "v")))
        return s;
    if (!a) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s: NULL args", who);
    if (q->B * q->H != BH || k->B != q->B || k->H != q->H || v->B != q->B || v->H != q->H ||
        q->D != D || k->D != D || v->D != D || q->N != nq || k->N != nk || v->N != nk)
        return qvi_fail(QVA_ERR_SHAPE, "%s: views do not match ops (BH=%d nq=%d nk=%d D=%d)", who,
                        BH, nq, nk, D);
    if (BH > 65535) return qvi_fail(QVA_ERR_UNSUPPORTED, "%s: B*H = %d exceeds 65535", who, BH);
    return QVA_OK;
}

extern "C" qva_status qvc_prep(const qvc_view *q, const qvc_view *k,
                               const qvc_view *v, const qvc_prep_args *a,
                               qvc_ops *ops, cudaStream_t st) {
    qva_status s;
    if (!ops || !ops->q_i8)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: NULL or unallocated ops");
    if ((s = check_prep_views("qvc_prep", q, k, v, a, ops->BH, ops->nq, ops->nk, ops->D)))
        return s;
    const int D = ops->D, BH = ops->BH, nq = ops->nq, nk = ops->nk, nblk = ops->nblk;
    if (a->qk_format != QVC_QK_INT8 && a->qk_format != QVC_QK_E4M3)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: bad qk_format %d", (int)a->qk_format);
    if (a->v_mode != 0 && a->v_mode != 1)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: bad v_mode %d", a->v_mode);
    const int demean = a->v_mode == 0 && a->demean;
    if (demean && !ops->v_mu)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: demean needs ops allocated with_mu");
    if (a->hadamard && (D & (D - 1)) != 0)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep: Hadamard needs a power-of-two D, got %d", D);
    if (a->lse_shift && !a->smooth_k)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: lse_shift needs smooth_k");

    /* Temporaries: K channel mean [BH][D]; V block means and residual
     * amax [BH][nblk][D] (v_mode 0). One stream-ordered allocation. */
    const size_t mean_b = a->smooth_k ? align256((size_t)BH * D * sizeof(float)) : 0;
    const size_t stat_b = a->v_mode == 0 ? align256((size_t)BH * nblk * D * sizeof(float)) : 0;
    const size_t tmp_b = mean_b + 2 * stat_b;
    char *tmp = NULL;
    cudaError_t e;
    if (tmp_b && (e = cudaMallocAsync((void **)&tmp, tmp_b, st)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_prep: cudaMallocAsync");
    float *kmean = mean_b ? (float *)tmp : NULL;
    float *bmu = stat_b ? (float *)(tmp + mean_b) : NULL;
    float *bamax = stat_b ? (float *)(tmp + mean_b + stat_b) : NULL;

    qk_params p;
    memset(&p, 0, sizeof p);
    p.signs = a->had_signs;
    p.hadamard = a->hadamard;
    p.had_scale = (float)(1.0 / sqrt((double)D));
    p.fmt = (int)a->qk_format;

    /* Q: no permutation, no smoothing. */
    p.x = *q;
    p.n = nq;
    p.n_pad = ops->nq_pad;
    p.codes = ops->q_i8;
    p.scale = ops->q_scale;
    s = launch_qk(p, BH, D, st, "qvc_prep: Q quantize");

    /* K' = K[perm], smoothed by its own channel mean (summed in K' order,
     * as the CPU does), then rotated. */
    if (s == QVA_OK && kmean)
        s = qvc_colsum_mean(k, a->perm, NULL, nk, NULL, NULL, 1, BH, kmean, st);
    if (s == QVA_OK && a->lse_shift)
        s = launch_lse_shift(q, kmean, a->sm_scale, a->lse_shift, BH, st);
    if (s == QVA_OK) {
        p.x = *k;
        p.perm = a->perm;
        p.mean = kmean;
        p.n = nk;
        p.n_pad = ops->nk_pad;
        p.codes = ops->k_i8;
        p.scale = ops->k_scale;
        s = launch_qk(p, BH, D, st, "qvc_prep: K quantize");
    }

    /* V' = V[perm]. */
    v_params vp;
    memset(&vp, 0, sizeof vp);
    vp.v = *v;
    vp.perm = a->perm;
    vp.n = nk;
    vp.nblk = nblk;
    vp.mode = a->v_mode;
    vp.demean = demean;
    vp.bmu = bmu;
    vp.chan = ops->v_chan;
    vp.v_t = ops->v_t;
    vp.v_blk = ops->v_blk;
    vp.v_chan = ops->v_chan;
    if (s == QVA_OK && a->v_mode == 0) {
        QVC_DISPATCH_DTYPE(v->dtype, (v_stats_kernel<DT_><<<dim3(nblk, BH), MAX_D, 0, st>>>(
                                     *v, a->perm, nk, nblk, demean, bmu, bamax)));
        s = qvc_launch_check("qvc_prep: V stats");
        if (s == QVA_OK) {
            const int64_t t = (int64_t)BH * D;
            v_scale_kernel<<<(unsigned)((t + 127) / 128), 128, 0, st>>>(BH, D, nblk, demean, bmu, bamax,
                                                                         ops->v_chan, ops->v_mu);
            s = qvc_launch_check("qvc_prep: V scale");
        }
    } else if (s == QVA_OK && ops->v_mu) { /* fp8 has no means: keep them 0 */
        e = cudaMemsetAsync(ops->v_mu, 0, (size_t)BH * nblk * D * sizeof(float), st);
        if (e != cudaSuccess) s = qvc_cuda_fail(e, "qvc_prep: cudaMemsetAsync");
    }
    if (s == QVA_OK) {
        QVC_DISPATCH_DTYPE(v->dtype, (v_encode_kernel<DT_><<<dim3(nblk, BH), PREP_THREADS, 0, st>>>(vp)));
        s = qvc_launch_check("qvc_prep: V encode");
    }

    if (tmp && (e = cudaFreeAsync(tmp, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "qvc_prep: cudaFreeAsync");
    return s;
}

/* ------------------------------------------------------------ host side: NVFP4 */

extern "C" qva_status qvc_ops4_alloc(qvc_ops4 *ops, int BH, int nq, int nk, int D, int with_mu) {
    if (!ops) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_ops4_alloc: ops is NULL");
    memset(ops, 0, sizeof *ops);
    if (BH < 1 || nq < 1 || nk < 1 || (D != 64 && D != 128))
        return qvi_fail(QVA_ERR_SHAPE, "qvc_ops4_alloc: bad shape BH=%d nq=%d nk=%d D=%d", BH, nq,
                        nk, D);
    ops->BH = BH;
    ops->nq = nq;
    ops->nk = nk;
    ops->D = D;
    ops->nq_pad = qvi_cdiv(nq, QVI_BLOCK) * QVI_BLOCK;
    ops->nk_pad = qvi_cdiv(nk, QVI_BLOCK) * QVI_BLOCK;
    ops->nblk = ops->nk_pad / QVI_BLOCK;
    const size_t bh = (size_t)BH, d = (size_t)D, nqp = (size_t)ops->nq_pad,
                 nkp = (size_t)ops->nk_pad;
    const qvc_alloc req[] = {
        {(void **)&ops->q, bh * nqp * d / 2},
        {(void **)&ops->q_sc, bh * nqp * d / 16},
        {(void **)&ops->k, bh * nkp * d / 2},
        {(void **)&ops->k_sc, bh * nkp * d / 16},
        {(void **)&ops->v, bh * nkp * d / 2},
        {(void **)&ops->v_sc, bh * (nkp / 16) * d},
        {(void **)&ops->g, bh * 3 * sizeof(float)},
        {(void **)&ops->mu, with_mu ? bh * (size_t)ops->nblk * d * sizeof(float) : 0},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_ops4_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_ops4_free(ops);
    return st;
}

extern "C" void qvc_ops4_free(qvc_ops4 *ops) {
    if (!ops) return;
    void *ptrs[] = {ops->q, ops->q_sc, ops->k, ops->k_sc, ops->v, ops->v_sc, ops->g, ops->mu};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(ops, 0, sizeof *ops);
}

template <int DT>
static void launch_nvfp4_qk_dt(const qk_params &p, dim3 grid, int D, unsigned *amax, int slot,
                               float *g, uint8_t *codes, uint8_t *scodes, cudaStream_t st) {
    if (D == 64) {
        nvfp4_qk_amax_kernel<DT, 2><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot);
        nvfp4_qk_encode_kernel<DT, 2><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot, g, codes, scodes);
    } else {
        nvfp4_qk_amax_kernel<DT, 4><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot);
        nvfp4_qk_encode_kernel<DT, 4><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot, g, codes, scodes);
    }
}

/* Both passes of one Q or K operand (amax[bh*3 + slot] must be 0). */
static qva_status launch_nvfp4_qk(const qk_params &p, int BH, int D, unsigned *amax, int slot,
                                  float *g, uint8_t *codes, uint8_t *scodes, cudaStream_t st,
                                  const char *what) {
    dim3 grid(p.n_pad / QVI_BLOCK, BH);
    QVC_DISPATCH_DTYPE(p.x.dtype, launch_nvfp4_qk_dt<DT_>(p, grid, D, amax, slot, g, codes, scodes, st));
    return qvc_launch_check(what);
}

extern "C" qva_status qvc_prep4(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                                const qvc_prep_args *a, qvc_ops4 *ops, cudaStream_t st) {
    qva_status s;
    if (!ops || !ops->q)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep4: NULL or unallocated ops");
    if ((s = check_prep_views("qvc_prep4", q, k, v, a, ops->BH, ops->nq, ops->nk, ops->D)))
        return s;
    const int D = ops->D, BH = ops->BH, nq = ops->nq, nk = ops->nk, nblk = ops->nblk;
    if (D != 64 && D != 128) return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep4: head dim %d", D);
    if (a->demean && !ops->mu)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep4: demean needs ops allocated with_mu");
    if (a->lse_shift && !a->smooth_k)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep4: lse_shift needs smooth_k");

    /* Temporaries: K channel mean [BH][D], V block means and residual
     * amax [BH][nblk][D], head amax [BH][3]; one stream-ordered block. */
    const size_t mean_b = align256((size_t)BH * D * sizeof(float));
    const size_t stat_b = align256((size_t)BH * nblk * D * sizeof(float));
    const size_t amax_b = align256((size_t)BH * 3 * sizeof(unsigned));
    char *tmp = NULL;
    cudaError_t e = cudaMallocAsync((void **)&tmp, mean_b + 2 * stat_b + amax_b, st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_prep4: cudaMallocAsync");
    float *kmean = a->smooth_k ? (float *)tmp : NULL;
    float *bmu = (float *)(tmp + mean_b), *bamax = (float *)(tmp + mean_b + stat_b);
    unsigned *amax = (unsigned *)(tmp + mean_b + 2 * stat_b);
    s = QVA_OK;
    if ((e = cudaMemsetAsync(amax, 0, (size_t)BH * 3 * sizeof(unsigned), st)) != cudaSuccess)
        s = qvc_cuda_fail(e, "qvc_prep4: cudaMemsetAsync");

    qk_params p;
    memset(&p, 0, sizeof p);
    p.signs = a->had_signs;
    p.hadamard = a->hadamard;
    p.had_scale = (float)(1.0 / sqrt((double)D));

    /* Q: loaded (and rotated), no permutation, no smoothing. */
    p.x = *q;
    p.n = nq;
    p.n_pad = ops->nq_pad;
    if (s == QVA_OK)
        s = launch_nvfp4_qk(p, BH, D, amax, 0, ops->g, ops->q, ops->q_sc, st, "qvc_prep4: Q");

    /* K' = K[perm] minus its channel mean (and the LSE shift it causes),
     * then rotated. */
    if (s == QVA_OK && kmean)
        s = qvc_colsum_mean(k, a->perm, NULL, nk, NULL, NULL, 1, BH, kmean, st);
    if (s == QVA_OK && a->lse_shift)
        s = launch_lse_shift(q, kmean, a->sm_scale, a->lse_shift, BH, st);
    if (s == QVA_OK) {
        p.x = *k;
        p.perm = a->perm;
        p.mean = kmean;
        p.n = nk;
        p.n_pad = ops->nk_pad;
        s = launch_nvfp4_qk(p, BH, D, amax, 1, ops->g, ops->k, ops->k_sc, st, "qvc_prep4: K");
    }

    /* V' = V[perm], block-demeaned for vc4; groups of 16 keys per channel. */
    if (s == QVA_OK) {
        QVC_DISPATCH_DTYPE(v->dtype, (v_stats_kernel<DT_><<<dim3(nblk, BH), MAX_D, 0, st>>>(
                                     *v, a->perm, nk, nblk, a->demean, bmu, bamax)));
        s = qvc_launch_check("qvc_prep4: V stats");
    }
    if (s == QVA_OK) {
        const int64_t t = (int64_t)BH * D;
        nvfp4_v_amax_kernel<<<(unsigned)((t + 127) / 128), 128, 0, st>>>(
            BH, D, nblk, bmu, bamax, amax, a->demean ? ops->mu : NULL);
        s = qvc_launch_check("qvc_prep4: V amax");
    }
    if (s == QVA_OK) {
        QVC_DISPATCH_DTYPE(v->dtype, (nvfp4_v_encode_kernel<DT_><<<dim3(nblk, BH), PREP_THREADS, 0, st>>>(
                                     *v, a->perm, nk, ops->nk_pad, nblk, a->demean, bmu, amax,
                                     ops->g, ops->v, ops->v_sc)));
        s = qvc_launch_check("qvc_prep4: V encode");
    }

    if ((e = cudaFreeAsync(tmp, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "qvc_prep4: cudaFreeAsync");
    return s;
}
