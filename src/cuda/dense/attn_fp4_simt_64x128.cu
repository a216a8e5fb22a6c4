/*
 * attn_fp4_simt_64x128: the 4-bit methods sage4 / vc4 on the GPU, with the
 * 4-bit arithmetic EMULATED.  Hopper (sm_90a) has no FP4 tensor cores (FP4
 * MMA and the e2m1 conversions are sm_100+), so this kernel decodes the
 * NVFP4 operands of qvc_prep4 (cuda_internal.h) to FP32 and computes, per
 * query row, what the CPU reference computes (src/cpu/attention.c and row.c,
 * QVI_PATH_FP4: qvi_scores_f32, qvi_row_raise_max, qvi_pv_nvfp4,
 * qvi_row_finish), in the same order of FP32 operations:
 *
 *   S  = (sum_c qf[c] kf[c]) * ((gq gk) sm_scale log2e): FP32 FMAs in
 *        channel order.  qf, kf are sigma*e2m1 (at most 6 significant
 *        bits), so each product is exact and fmaf(q, k, acc) is the CPU's
 *        acc + q*k: the scores are bit-exact.
 *   max, alpha = exp2(m - m'), p = exp2(s - m) (FP32, padding keys 0),
 *        rowsum = sequential FP32 sum of p in key order,
 *        P = NVFP4 per 16 keys (DA2 Eq. 24, qva_nvfp4_quantize_probs16).
 *        exp2 is evaluated in FP64 and rounded once to FP32, i.e. correctly
 *        rounded (the CPU's glibc exp2f is correctly rounded in all but
 *        rare cases); this is the only place the GPU can differ.
 *   part[c] = sum_j P_j V_j[c], separate FP32 multiply and add in key
 *        order (no FMA: the CPU does not contract), then
 *        acc = acc*alpha + part*gv (+ rowsum*mu_j for vc4, VC Eq. 6).
 *   out = acc / l, LSE = ln2 (m + log2 l) (+ the K-smoothing shift).
 *
 * This is a correctness-first SIMT kernel (no tensor cores): the CTA holds
 * 64 query rows; per 128-key block it decodes K (transposed) into shared
 * memory, forms S with 8x8 register tiles, runs the softmax/P step with
 * two threads per row, decodes V into the same buffer and forms PV with
 * 8 x D/16 register tiles.  128 threads: ty = tid/16 owns rows
 * {4ty..4ty+3, 32+4ty..32+4ty+3}; tx = tid%16 owns keys
 * {4tx..4tx+3, 64+4tx..64+4tx+3} of S and channels
 * {4tx..4tx+3 (, 64+4tx..64+4tx+3 for D = 128)} of O.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/device_util.cuh"
#include "common/softmax.cuh"

#define F4_ROWS 64
#define F4_KEYS 128
#define F4_THREADS 128
#define F4_SP (F4_ROWS + 4) /* row stride of the S/P tile */

template <int D>
struct f4_smem {
    float q[D][F4_ROWS];       /* Q^T, decoded sigma*e2m1: [channel][row]         */
    float kv[F4_KEYS * D];     /* K^T [D][128] while forming S, then V [128][D]   */
    float sp[F4_KEYS][F4_SP];  /* S, then P: [key][row]                           */
    float red[2][F4_ROWS];     /* half-row maxima                                 */
    float alpha[F4_ROWS];      /* rescale of this block                           */
    float rowsum[F4_ROWS];     /* FP32 sum of p before the NVFP4 conversion       */
    float l[F4_ROWS];          /* final denominators (epilogue)                   */
    int kind[F4_ROWS];         /* qvc_softmax_row of each row (epilogue)          */
    float mu[D];               /* vc4: FP16-rounded mean of this block            */
};


/* Eight decoded values sigma * e2m1 of the nibbles of w (nibble u = element u). */
static __device__ __forceinline__ float nib_value(uint32_t w, int u, float sigma) {
    return __fmul_rn(sigma, qvc_e2m1_value(w >> (4 * u)));
}

/* Rows [0, nrows) of a row-grouped NVFP4 operand (codes [row][D/2], scales
 * [row][D/16]) decoded and stored transposed: dst[c * nrows + r]. */
template <int D>
static __device__ __forceinline__ void decode_rows_t(float *dst, int nrows, const uint8_t *codes,
                                                     const uint8_t *sc) {
    for (int it = threadIdx.x; it < nrows * (D / 8); it += F4_THREADS) {
        const int r = it % nrows, c0 = (it / nrows) * 8;
        const uint32_t w = *(const uint32_t *)(codes + (size_t)r * (D / 2) + c0 / 2);
        const float sigma = qvc_e4m3_value(sc[(size_t)r * (D / 16) + c0 / 16]);
#pragma unroll
        for (int u = 0; u < 8; ++u) dst[(c0 + u) * nrows + r] = nib_value(w, u, sigma);
    }
}

/* A 128-key block of V (codes [key][D/2], scales [key/16][D]) decoded
 * row-major: dst[key * D + c]. */
template <int D>
static __device__ __forceinline__ void decode_v(float *dst, const uint8_t *codes, const uint8_t *sc) {
    for (int it = threadIdx.x; it < F4_KEYS * (D / 8); it += F4_THREADS) {
        const int j = it / (D / 8), c0 = (it % (D / 8)) * 8;
        const uint32_t w = *(const uint32_t *)(codes + (size_t)j * (D / 2) + c0 / 2);
        const uint2 s8 = *(const uint2 *)(sc + (size_t)(j / 16) * D + c0);
        float4 lo, hi;
        lo.x = nib_value(w, 0, qvc_e4m3_value(s8.x & 0xFFu));
        lo.y = nib_value(w, 1, qvc_e4m3_value((s8.x >> 8) & 0xFFu));
        lo.z = nib_value(w, 2, qvc_e4m3_value((s8.x >> 16) & 0xFFu));
        lo.w = nib_value(w, 3, qvc_e4m3_value(s8.x >> 24));
        hi.x = nib_value(w, 4, qvc_e4m3_value(s8.y & 0xFFu));
        hi.y = nib_value(w, 5, qvc_e4m3_value((s8.y >> 8) & 0xFFu));
        hi.z = nib_value(w, 6, qvc_e4m3_value((s8.y >> 16) & 0xFFu));
        hi.w = nib_value(w, 7, qvc_e4m3_value(s8.y >> 24));
        *(float4 *)(dst + (size_t)j * D + c0) = lo;
        *(float4 *)(dst + (size_t)j * D + c0 + 4) = hi;
    }
}

/* qva_nvfp4_quantize_probs16 on 16 probabilities at p[0], p[F4_SP], ... */
static __device__ __forceinline__ void quant_probs16(float *p) {
    float pmax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) pmax = fmaxf(pmax, fabsf(p[i * F4_SP]));
    const float sigma = qvc_e4m3_value(qvc_e4m3_code(__fmul_rn(448.0f, pmax)));
    const float step = __fdiv_rn(sigma, 2688.0f);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        float x = 0.0f;
        if (sigma != 0.0f) {
            const uint32_t c = qvc_e2m1_code(__fdiv_rn(__fmul_rn(2688.0f, p[i * F4_SP]), sigma));
            x = __fmul_rn(step, qvc_e2m1_value(c));
        }
        p[i * F4_SP] = x;
    }
}

/* Row index of a thread's i-th row (i < 8), key of its k-th key (k < 8)
 * and channel of its c-th channel. */
static __device__ __forceinline__ int tile_row(int ty, int i) { return (i >> 2) * 32 + ty * 4 + (i & 3); }
static __device__ __forceinline__ int tile_key(int tx, int k) { return (k >> 2) * 64 + tx * 4 + (k & 3); }

template <int D>
__global__ void __launch_bounds__(F4_THREADS)
attn_fp4_simt_64x128(qvc_ops4 ops, qvc_attn_args a) {
    extern __shared__ __align__(16) unsigned char f4_raw[];
    f4_smem<D> &sm = *reinterpret_cast<f4_smem<D> *>(f4_raw);
    constexpr int CPT = D / 16; /* output channels per thread */
    const int bh = blockIdx.y, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int row_base = blockIdx.x * F4_ROWS;
    const float gq = ops.g[bh * 3 + 0], gk = ops.g[bh * 3 + 1], gv = ops.g[bh * 3 + 2];
    const float f = __fmul_rn(__fmul_rn(gq, gk), a.scale_log2); /* (gq gk) scale_log2 */

    {
        const size_t r0 = (size_t)bh * ops.nq_pad + row_base;
        decode_rows_t<D>(&sm.q[0][0], F4_ROWS, ops.q + r0 * (D / 2), ops.q_sc + r0 * (D / 16));
    }

    /* Softmax state of row pr = tid % 64, held by both threads of the row
     * (h = tid / 64 takes keys 64h .. 64h + 63); l only by h == 0. */
    const int pr = tid & (F4_ROWS - 1), ph = tid >> 6;
    float m_row = -INFINITY, l_row = 0.0f;

    float o[8][CPT];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int c = 0; c < CPT; ++c) o[i][c] = 0.0f;

    for (int j = 0; j < ops.nblk; ++j) {
        const size_t k0 = (size_t)bh * ops.nk_pad + (size_t)j * F4_KEYS;
        decode_rows_t<D>(sm.kv, F4_KEYS, ops.k + k0 * (D / 2), ops.k_sc + k0 * (D / 16));
        __syncthreads(); /* K^T and (first block) Q^T are in */

        /* ---- S: FP32 FMAs in channel order (bit-exact, see header) ---- */
        {
            float acc[8][8];
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int k = 0; k < 8; ++k) acc[i][k] = 0.0f;
#pragma unroll 2
            for (int c = 0; c < D; ++c) {
                const float4 qa = *(const float4 *)&sm.q[c][ty * 4];
                const float4 qb = *(const float4 *)&sm.q[c][32 + ty * 4];
                const float4 ka = *(const float4 *)&sm.kv[c * F4_KEYS + tx * 4];
                const float4 kb = *(const float4 *)&sm.kv[c * F4_KEYS + 64 + tx * 4];
                const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
                const float kv[8] = {ka.x, ka.y, ka.z, ka.w, kb.x, kb.y, kb.z, kb.w};
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int k = 0; k < 8; ++k) acc[i][k] = __fmaf_rn(qv[i], kv[k], acc[i][k]);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int key = tile_key(tx, k);
                const bool pad = j * F4_KEYS + key >= ops.nk;
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    sm.sp[key][tile_row(ty, i)] = pad ? -INFINITY : __fmul_rn(acc[i][k], f);
            }
        }
        __syncthreads(); /* S is in; the K buffer is free */

        /* V of this block (and its vc4 mean) into the freed buffer; read
         * after the syncs of the softmax step below. */
        {
            const size_t v0 = (size_t)bh * ops.nk_pad + (size_t)j * F4_KEYS;
            decode_v<D>(sm.kv, ops.v + v0 * (D / 2), ops.v_sc + (v0 / 16) * D);
            if (ops.mu)
                for (int c = tid; c < D; c += F4_THREADS)
                    sm.mu[c] = ops.mu[((size_t)bh * ops.nblk + j) * D + c];
        }

        /* ---- softmax step, two threads per row (qvi_row_raise_max and
         *      the first half of qvi_pv_nvfp4) ---- */
        {
            float hm = -INFINITY;
            for (int k = 0; k < 64; ++k) hm = fmaxf(hm, sm.sp[64 * ph + k][pr]);
            sm.red[ph][pr] = hm;
        }
        __syncthreads();
        {
            const float mx = fmaxf(m_row, fmaxf(sm.red[0][pr], sm.red[1][pr]));
            const float alpha = qvc_softmax_alpha<QVC_SM_EXP2_RN>(m_row, mx);
            m_row = fmaxf(m_row, mx);
            if (ph == 0) {
                l_row = __fmul_rn(l_row, alpha);
                sm.alpha[pr] = alpha;
            }
            for (int k = 0; k < 64; ++k) {
                float *sp = &sm.sp[64 * ph + k][pr];
                const float s = *sp;
                *sp = (m_row == -INFINITY || s == -INFINITY) ? 0.0f : exp2_rn(__fsub_rn(s, m_row));
            }
        }
        __syncthreads();
        if (ph == 0) { /* the denominator: FP32 p before conversion, key order */
            float rs = 0.0f;
            for (int k = 0; k < F4_KEYS; ++k) rs = __fadd_rn(rs, sm.sp[k][pr]);
            sm.rowsum[pr] = rs;
            l_row = __fadd_rn(l_row, rs);
        }
        __syncthreads();
#pragma unroll 1
        for (int gidx = 0; gidx < 4; ++gidx) quant_probs16(&sm.sp[64 * ph + 16 * gidx][pr]);
        __syncthreads(); /* P and V are in */

        /* ---- O = O alpha + (P V) gv (+ rowsum mu): key-order FP32 ---- */
        {
            float part[8][CPT];
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int c = 0; c < CPT; ++c) part[i][c] = 0.0f;
#pragma unroll 2
            for (int k = 0; k < F4_KEYS; ++k) {
                const float4 pa = *(const float4 *)&sm.sp[k][ty * 4];
                const float4 pb = *(const float4 *)&sm.sp[k][32 + ty * 4];
                const float pv[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
                float vv[CPT];
#pragma unroll
                for (int c4 = 0; c4 < CPT / 4; ++c4) {
                    const float4 v4 = *(const float4 *)&sm.kv[k * D + c4 * 64 + tx * 4];
                    vv[4 * c4] = v4.x, vv[4 * c4 + 1] = v4.y, vv[4 * c4 + 2] = v4.z,
                            vv[4 * c4 + 3] = v4.w;
                }
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int c = 0; c < CPT; ++c)
                        part[i][c] = __fadd_rn(part[i][c], __fmul_rn(pv[i], vv[c]));
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int r = tile_row(ty, i);
                const float alpha = sm.alpha[r], rs = sm.rowsum[r];
#pragma unroll
                for (int c = 0; c < CPT; ++c) {
                    float x = __fmul_rn(o[i][c], alpha);
                    x = __fadd_rn(x, __fmul_rn(part[i][c], gv));
                    if (ops.mu) x = __fadd_rn(x, __fmul_rn(rs, sm.mu[(c >> 2) * 64 + tx * 4 + (c & 3)]));
                    o[i][c] = x;
                }
            }
        }
        __syncthreads(); /* every thread is past PV: the tiles are free */
    }

    /* ---- epilogue (qvi_row_finish): out = acc / l, LSE ---- */
    const int b = bh / a.H, h = bh % a.H;
    if (ph == 0) {
        const int kind = qvc_softmax_row(m_row, l_row, true); /* a dense row retains every key */
        sm.l[pr] = l_row;
        sm.kind[pr] = kind;
        const int row = row_base + pr;
        if (a.lse && row < ops.nq) {
            float lse = kind ? qvc_softmax_lse_fill(kind)
                             : __fmul_rn(__fadd_rn(m_row, log2f(l_row)), 0.69314718055994531f);
            if (a.lse_shift) lse = __fadd_rn(lse, a.lse_shift[(size_t)bh * ops.nq + row]);
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] = lse;
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = tile_row(ty, i), row = row_base + r;
        if (row >= ops.nq) continue;
        const int kind = sm.kind[r];
        const float l = sm.l[r], fill = qvc_softmax_fill(kind);
        const int64_t base = b * a.osb + h * a.osh + (int64_t)row * a.osn;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            const int col = (c >> 2) * 64 + tx * 4 + (c & 3);
            qvc_store_out(a.out, a.out_dtype, base + col, kind ? fill : __fdiv_rn(o[i][c], l));
        }
    }
}

template <int D>
static qva_status launch4(const qvc_ops4 *ops, const qvc_attn_args *a, cudaStream_t st) {
    const int smem = (int)sizeof(f4_smem<D>); /* 135168 (D 128) or 85760 (D 64) bytes */
    cudaError_t e = cudaFuncSetAttribute(attn_fp4_simt_64x128<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return qvi_fail(QVA_ERR_DEVICE, "attn_fp4: shared memory attribute: %s",
                        cudaGetErrorString(e));
    }
    dim3 grid((unsigned)(ops->nq_pad / F4_ROWS), (unsigned)ops->BH);
    attn_fp4_simt_64x128<D><<<grid, F4_THREADS, smem, st>>>(*ops, *a);
    return qvc_launch_check("attn_fp4");
}

extern "C" qva_status qvc_attn_fp4(const qvc_ops4 *ops, const qvc_attn_args *a, cudaStream_t st) {
    if (!ops || !a || !ops->q || !ops->k || !ops->v || !ops->g || !a->out)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn_fp4: NULL operands or output");
    if (ops->BH < 1 || ops->BH > 65535 || ops->nq < 1 || ops->nk < 1 ||
        ops->nq_pad % F4_ROWS != 0 || ops->nblk * F4_KEYS != ops->nk_pad || a->H < 1)
        return qvi_fail(QVA_ERR_SHAPE, "attn_fp4: bad operand shape BH=%d nq=%d nk=%d", ops->BH,
                        ops->nq, ops->nk);
    if (ops->D == 128) return launch4<128>(ops, a, st);
    if (ops->D == 64) return launch4<64>(ops, a, st);
    return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_fp4: head dim %d", ops->D);
}
