/*
 * Operand preparation of the 16-bit method (bf16) on the device: the
 * strided user Q, K, V are rounded to BF16 (FP16 when use_f16; the CPU
 * reference takes that from the dtype of q) and laid out for
 * attn_bf16_mma_64x128 (src/cuda/dense/attn_bf16_mma_64x128.cu):
 *   q   [BH][nq_pad][D]       rows >= nq are +0
 *   k   [BH][nk_pad][D]       rows >= nk are +0
 *   v_t [BH][nblk][D][128]    V transposed per 128-key block, keys >= nk +0
 * The values are those of the CPU reference (round_rows16 in
 * src/cpu/head_ops.c): the element is widened to f32 exactly and rounded
 * once to nearest even (cvt.rn, which is qva_round_bf16 / qva_round_f16 for
 * every non-NaN input, overflow to Inf included).  No permutation,
 * smoothing or rotation: the bf16 method has none.
 *
 * Kernels (input dtype, output format and vector loads are template
 * parameters):
 *   qk16_kernel  thread per 8 channels of a row: 8 elements widened, one
 *                16-byte store of the packed values; grid row y = bh.
 *   v16_kernel   one CTA per (128-key block, bh): lane = key, so each
 *                thread widens 8 channels of its own row and scatters them
 *                into a transposed shared tile [D][128 + 8] (consecutive
 *                lanes hit consecutive halfwords: no bank conflicts), then
 *                16-byte rows of the tile go out coalesced.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "common/device_util.cuh"


#define P16_THREADS 256
#define P16_MAX_D 128
#define VT_STRIDE (QVI_BLOCK + 8) /* halfwords per row of the transposed tile */

/* ------------------------------------------------------------ device helpers */

template <int F16>
static __device__ __forceinline__ unsigned short round16(float a) {
    if constexpr (F16)
        return __half_as_ushort(__float2half_rn(a));
    else
        return __bfloat16_as_ushort(__float2bfloat16_rn(a));
}

/* Offset of row 0, channel 0 of head bh. */
static __device__ __forceinline__ int64_t p16_head_base(const qvc_view &v, int bh) {
    return qvc_head_base(v, bh);
}

/* ------------------------------------------------------------ Q and K */

/* grid (ceil(n_pad * D/8 / P16_THREADS), BH): thread per 8 channels. */
template <int DT, int F16, bool VEC>
__global__ void __launch_bounds__(P16_THREADS)
qk16_kernel(qvc_view x, int n, int n_pad, uint16_t *dst) {
    const int bh = blockIdx.y, D = (int)x.D, cpr = D / 8; /* chunks per row */
    const int64_t i = (int64_t)blockIdx.x * P16_THREADS + threadIdx.x;
    if (i >= (int64_t)n_pad * cpr) return;
    const int row = (int)(i / cpr), c = (int)(i - (int64_t)row * cpr) * 8;
    uint4 w = make_uint4(0u, 0u, 0u, 0u); /* padding rows: +0 */
    if (row < n) {
        float v[8];
        qvc_ld8<DT, VEC>(x.data, p16_head_base(x, bh) + (int64_t)row * x.sn + c, v);
        w.x = qvc_pack2<F16>(v[0], v[1]);
        w.y = qvc_pack2<F16>(v[2], v[3]);
        w.z = qvc_pack2<F16>(v[4], v[5]);
        w.w = qvc_pack2<F16>(v[6], v[7]);
    }
    *(uint4 *)(dst + ((size_t)bh * n_pad + row) * D + c) = w;
}

/* ------------------------------------------------------------ V */

/* grid (nblk, BH), P16_THREADS threads.  Load phase: warp w takes key
 * 32 (w % 4) + lane and channel half w / 4, 8 channels (16 or 32 bytes of
 * its row) at a time; it writes tile[c][key] (halfwords, consecutive lanes
 * adjacent).
 * Store phase: 16-byte pieces of the tile rows to v_t, coalesced. */
template <int DT, int F16, bool VEC>
__global__ void __launch_bounds__(P16_THREADS)
v16_kernel(qvc_view v, int n, int nblk, uint16_t *v_t) {
    __shared__ __align__(16) unsigned short tile[P16_MAX_D * VT_STRIDE];
    const int blk = blockIdx.x, bh = blockIdx.y, D = (int)v.D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int key = (warp & 3) * 32 + lane, i = blk * QVI_BLOCK + key;
    const bool valid = i < n;
    const int64_t row = p16_head_base(v, bh) + (int64_t)(valid ? i : 0) * v.sn;
    const int c0 = (warp >> 2) * (D / 2); /* this warp's half of the channels */
    for (int c = c0; c < c0 + D / 2; c += 8) {
        float x[8];
        if (valid) {
            qvc_ld8<DT, VEC>(v.data, row + c, x);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) tile[(c + e) * VT_STRIDE + key] = round16<F16>(x[e]);
    }
    __syncthreads();
    uint4 *dst = (uint4 *)(v_t + ((size_t)bh * nblk + blk) * (size_t)D * QVI_BLOCK);
    for (int w = threadIdx.x; w < D * (QVI_BLOCK / 8); w += P16_THREADS) {
        const int c = w / (QVI_BLOCK / 8), k0 = (w % (QVI_BLOCK / 8)) * 8;
        dst[w] = *(const uint4 *)&tile[c * VT_STRIDE + k0];
    }
}

/* ------------------------------------------------------------ host side */

extern "C" qva_status qvc_ops16_alloc(qvc_ops16 *ops, int BH, int nq, int nk, int D) {
    if (!ops) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_ops16_alloc: ops is NULL");
    memset(ops, 0, sizeof *ops);
    if (BH < 1 || nq < 1 || nk < 1 || (D != 64 && D != 128))
        return qvi_fail(QVA_ERR_SHAPE, "qvc_ops16_alloc: bad shape BH=%d nq=%d nk=%d D=%d", BH,
                        nq, nk, D);
    ops->BH = BH;
    ops->nq = nq;
    ops->nk = nk;
    ops->D = D;
    ops->nq_pad = qvi_cdiv(nq, QVI_BLOCK) * QVI_BLOCK;
    ops->nk_pad = qvi_cdiv(nk, QVI_BLOCK) * QVI_BLOCK;
    ops->nblk = ops->nk_pad / QVI_BLOCK;
    const size_t bh = (size_t)BH, d = (size_t)D, e = sizeof(uint16_t);
    const qvc_alloc req[] = {
        {(void **)&ops->q, bh * (size_t)ops->nq_pad * d * e},
        {(void **)&ops->k, bh * (size_t)ops->nk_pad * d * e},
        {(void **)&ops->v_t, bh * (size_t)ops->nk_pad * d * e},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_ops16_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_ops16_free(ops);
    return st;
}

extern "C" void qvc_ops16_free(qvc_ops16 *ops) {
    if (!ops) return;
    void *ptrs[] = {ops->q, ops->k, ops->v_t};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(ops, 0, sizeof *ops);
}

template <int DT, int F16>
static void launch_qk16_dt(const qvc_view &x, int n, int n_pad, int BH, uint16_t *dst,
                           cudaStream_t st) {
    const int64_t work = (int64_t)n_pad * (x.D / 8);
    dim3 grid((unsigned)((work + P16_THREADS - 1) / P16_THREADS), (unsigned)BH);
    if (qvc_view_vec_ok(&x, 8))
        qk16_kernel<DT, F16, true><<<grid, P16_THREADS, 0, st>>>(x, n, n_pad, dst);
    else
        qk16_kernel<DT, F16, false><<<grid, P16_THREADS, 0, st>>>(x, n, n_pad, dst);
}

template <int DT, int F16>
static void launch_v16_dt(const qvc_view &x, int n, int nblk, int BH, uint16_t *dst,
                          cudaStream_t st) {
    dim3 grid((unsigned)nblk, (unsigned)BH);
    if (qvc_view_vec_ok(&x, 8))
        v16_kernel<DT, F16, true><<<grid, P16_THREADS, 0, st>>>(x, n, nblk, dst);
    else
        v16_kernel<DT, F16, false><<<grid, P16_THREADS, 0, st>>>(x, n, nblk, dst);
}

/* Runtime dtype x format -> template instance. */
#define P16_DISPATCH(dtype, f16, FN, ...)                                             \
    do {                                                                              \
        if ((dtype) == QVA_F32)                                                       \
            (f16) ? FN<QVA_F32, 1>(__VA_ARGS__) : FN<QVA_F32, 0>(__VA_ARGS__);        \
        else if ((dtype) == QVA_BF16)                                                 \
            (f16) ? FN<QVA_BF16, 1>(__VA_ARGS__) : FN<QVA_BF16, 0>(__VA_ARGS__);      \
        else                                                                          \
            (f16) ? FN<QVA_F16, 1>(__VA_ARGS__) : FN<QVA_F16, 0>(__VA_ARGS__);        \
    } while (0)

extern "C" qva_status qvc_prep16(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                                 int use_f16, qvc_ops16 *ops, cudaStream_t st) {
    qva_status s;
    if ((s = qvc_check_view("qvc_prep16", q, "q")) || (s = qvc_check_view("qvc_prep16", k, "k")) ||
        (s = qvc_check_view("qvc_prep16", v, "v")))
        return s;
    if (!ops || !ops->q || !ops->k || !ops->v_t)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep16: NULL or unallocated ops");
    const int D = ops->D, BH = ops->BH, nq = ops->nq, nk = ops->nk;
    if (q->B * q->H != BH || k->B != q->B || k->H != q->H || v->B != q->B || v->H != q->H ||
        q->D != D || k->D != D || v->D != D || q->N != nq || k->N != nk || v->N != nk)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_prep16: views do not match ops (BH=%d nq=%d nk=%d D=%d)", BH, nq,
                        nk, D);
    if (D != 64 && D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep16: head dim %d (64 or 128)", D);
    if (BH > 65535)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep16: B*H = %d exceeds 65535", BH);
    const int f16 = use_f16 != 0;

    P16_DISPATCH(q->dtype, f16, launch_qk16_dt, *q, nq, ops->nq_pad, BH, ops->q, st);
    if ((s = qvc_launch_check("qvc_prep16: Q")) != QVA_OK) return s;
    P16_DISPATCH(k->dtype, f16, launch_qk16_dt, *k, nk, ops->nk_pad, BH, ops->k, st);
    if ((s = qvc_launch_check("qvc_prep16: K")) != QVA_OK) return s;
    P16_DISPATCH(v->dtype, f16, launch_v16_dt, *v, nk, ops->nblk, BH, ops->v_t, st);
    return qvc_launch_check("qvc_prep16: V");
}
