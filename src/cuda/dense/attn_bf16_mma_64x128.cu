/*
 * attn_bf16_mma_64x128: the `bf16` method on the GPU (correct-first).
 * BF16 (FP16 for f16 inputs) Q, K, V; mma.sync m16n8k16 with FP32
 * accumulation; FP32 online softmax in the log2 domain per 128-key block,
 * P rounded to 16 bits as the A operand of the PV MMA (the S accumulator
 * fragment of two 8-key n-tiles is exactly that operand).  Numerics as the
 * CPU reference (src/cpu/attention.c, QVI_PATH_16; docs/NUMERICS.md).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "common/device_util.cuh"
#include "common/mma_sync.cuh"
#include "common/softmax.cuh"


#define B16_ROWS 64    /* query rows per CTA            */
#define B16_KEYS 128   /* keys per block (QVI_BLOCK)    */
#define B16_PAD 8      /* halfwords of row padding      */
#define B16_THREADS 128

template <int D>
struct tiles16 {
    uint16_t k[B16_KEYS][D + B16_PAD]; /* block of K, [key][channel]   */
    uint16_t v[D][B16_KEYS + B16_PAD]; /* block of V^T, [channel][key] */
};

/* Issues (and commits as one group) the copies of a K block: thread
 * (row r, 16-byte chunk c) of each pass of B16_THREADS chunks, rows
 * advancing by a constant per pass (so the addresses are base + imm). */
template <int D>
static __device__ __forceinline__ void issue_k(tiles16<D> &t, const uint16_t *kg) {
    constexpr int CPR = D / 8, RPP = B16_THREADS / CPR; /* chunks per row, rows per pass */
    const int r = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 8;
    uint16_t *sd = &t.k[r][c];
    const uint16_t *gs = kg + (size_t)r * D + c;
#pragma unroll
    for (int u = 0; u < B16_KEYS / RPP; ++u)
        qvc_cp_async16(sd + u * RPP * (D + B16_PAD), gs + u * RPP * D);
    qvc_cp_async_commit();
}

/* Issues (and commits as one group) the copies of a V^T block. */
template <int D>
static __device__ __forceinline__ void issue_v(tiles16<D> &t, const uint16_t *vg) {
    constexpr int CPR = B16_KEYS / 8, RPP = B16_THREADS / CPR;
    const int r = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 8;
    uint16_t *sd = &t.v[r][c];
    const uint16_t *gs = vg + (size_t)r * B16_KEYS + c;
#pragma unroll
    for (int u = 0; u < D / RPP; ++u)
        qvc_cp_async16(sd + u * RPP * (B16_KEYS + B16_PAD), gs + u * RPP * B16_KEYS);
    qvc_cp_async_commit();
}

template <int D, int F16>
__global__ void __launch_bounds__(B16_THREADS)
attn_bf16_mma_64x128(qvc_ops16 ops, qvc_attn_args a) {
    extern __shared__ __align__(16) unsigned char b16_smem[];
    tiles16<D> &t = *reinterpret_cast<tiles16<D> *>(b16_smem);
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int row0 = blockIdx.x * B16_ROWS + warp * 16 + g; /* and row0 + 8 */

    const uint16_t *kg = ops.k + (size_t)bh * ops.nk_pad * D;
    const uint16_t *vg = ops.v_t + (size_t)bh * ops.nblk * D * B16_KEYS;
    issue_k<D>(t, kg); /* block 0 */
    issue_v<D>(t, vg);

    /* Q as A fragments of S: rows row0 / row0 + 8, channels 16 kc + 2 tig
     * (+ 8).  Loaded once, kept in registers. */
    uint32_t qf[D / 16][4];
    const uint16_t *qg = ops.q + ((size_t)bh * ops.nq_pad + row0) * D + 2 * tig;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
        qf[kc][0] = __ldg((const uint32_t *)(qg + kc * 16));
        qf[kc][1] = __ldg((const uint32_t *)(qg + 8 * D + kc * 16));
        qf[kc][2] = __ldg((const uint32_t *)(qg + kc * 16 + 8));
        qf[kc][3] = __ldg((const uint32_t *)(qg + 8 * D + kc * 16 + 8));
    }

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int j = 0; j < ops.nblk; ++j) {
        qvc_cp_async_wait<1>(); /* K(j) landed; V(j) may still be in flight */
        __syncthreads();

        /* ---- S = Q K^T, FP32, times sm_scale log2(e) ---- */
        float s[B16_KEYS / 8][4];
#pragma unroll
        for (int nt = 0; nt < B16_KEYS / 8; ++nt) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint16_t *kr = &t.k[nt * 8 + g][2 * tig];
#pragma unroll
            for (int kc = 0; kc < D / 16; ++kc)
                qvc_mma16<F16>(acc, qf[kc], qvc_lds32(kr + kc * 16), qvc_lds32(kr + kc * 16 + 8));
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = __fmul_rn(acc[e], a.scale_log2);
        }
        if ((j + 1) * B16_KEYS > ops.nk) { /* the last block: mask padding keys */
#pragma unroll
            for (int nt = 0; nt < B16_KEYS / 8; ++nt) {
                const int key = j * B16_KEYS + nt * 8 + 2 * tig;
                if (key >= ops.nk) s[nt][0] = s[nt][2] = -INFINITY;
                if (key + 1 >= ops.nk) s[nt][1] = s[nt][3] = -INFINITY;
            }
        }

        /* ---- online softmax: raise the max, rescale l and O ---- */
        float mx[2];
        qvc_softmax_row_max(s, m, mx);
        qvc_softmax_raise<QVC_SM_EXACT_MUL>(mx, m, l, o);

        /* ---- P: FP32 weights into l, 16-bit into the PV A fragments ---- */
        uint32_t pa[B16_KEYS / 16][4];
        float rs[2] = {0.0f, 0.0f};
        qvc_softmax_probs16<F16>(s, m, rs, pa);
        l[0] = __fadd_rn(l[0], qvc_quad_sum(rs[0]));
        l[1] = __fadd_rn(l[1], qvc_quad_sum(rs[1]));

        qvc_cp_async_wait<0>(); /* V(j) landed */
        __syncthreads();    /* ... for every thread; and every warp is past S(j) */
        if (j + 1 < ops.nblk) issue_k<D>(t, kg + (size_t)(j + 1) * B16_KEYS * D);

        /* ---- O += P V(j): a fresh FP32 partial per block ---- */
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint16_t *vr = &t.v[n * 8 + g][2 * tig];
#pragma unroll
            for (int c = 0; c < B16_KEYS / 16; ++c)
                qvc_mma16<F16>(part, pa[c], qvc_lds32(vr + c * 16), qvc_lds32(vr + c * 16 + 8));
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] = __fadd_rn(o[n][e], part[e]);
        }

        __syncthreads(); /* every warp is past PV(j): the V tile is free */
        if (j + 1 < ops.nblk) issue_v<D>(t, vg + (size_t)(j + 1) * D * B16_KEYS);
    }

    /* ---- epilogue: out = O / l, LSE (natural log) ---- */
    const int b = bh / a.H, h = bh % a.H;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        if (row >= ops.nq) continue;
        const int kind = qvc_softmax_row(m[r], l[r], true); /* a dense row retains every key */
        const float fill = qvc_softmax_fill(kind);
        const int64_t base = b * a.osb + h * a.osh + (int64_t)row * a.osn;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * tig;
            qvc_store_out(a.out, a.out_dtype, base + col, kind ? fill : __fdiv_rn(o[n][2 * r], l[r]));
            qvc_store_out(a.out, a.out_dtype, base + col + 1, kind ? fill : __fdiv_rn(o[n][2 * r + 1], l[r]));
        }
        if (a.lse && tig == 0)
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] =
                kind ? qvc_softmax_lse_fill(kind)
                     : __fmul_rn(__fadd_rn(m[r], log2f(l[r])), 0.69314718055994531f);
    }
}

template <int D, int F16>
static qva_status launch16(const qvc_ops16 *ops, const qvc_attn_args *a, cudaStream_t st) {
    const int smem = (int)sizeof(tiles16<D>); /* 69632 (D 128) or 35840 (D 64) bytes */
    cudaError_t e = cudaFuncSetAttribute(attn_bf16_mma_64x128<D, F16>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return qvi_fail(QVA_ERR_DEVICE, "attn_bf16: shared memory attribute: %s",
                        cudaGetErrorString(e));
    }
    dim3 grid((unsigned)(ops->nq_pad / B16_ROWS), (unsigned)ops->BH);
    attn_bf16_mma_64x128<D, F16><<<grid, B16_THREADS, smem, st>>>(*ops, *a);
    e = cudaGetLastError();
    return e == cudaSuccess ? QVA_OK
                            : qvi_fail(QVA_ERR_DEVICE, "attn_bf16 launch: %s", cudaGetErrorString(e));
}

extern "C" qva_status qvc_attn_bf16(const qvc_ops16 *ops, int use_f16, const qvc_attn_args *a,
                                    cudaStream_t st) {
    if (!ops || !a || !ops->q || !ops->k || !ops->v_t || !a->out)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn_bf16: NULL operands or output");
    if (ops->BH < 1 || ops->BH > 65535 || ops->nq < 1 || ops->nk < 1 ||
        ops->nq_pad % B16_ROWS != 0 || ops->nblk * B16_KEYS != ops->nk_pad || a->H < 1)
        return qvi_fail(QVA_ERR_SHAPE, "attn_bf16: bad operand shape BH=%d nq=%d nk=%d", ops->BH,
                        ops->nq, ops->nk);
    if (ops->D == 128)
        return use_f16 ? launch16<128, 1>(ops, a, st) : launch16<128, 0>(ops, a, st);
    if (ops->D == 64)
        return use_f16 ? launch16<64, 1>(ops, a, st) : launch16<64, 0>(ops, a, st);
    return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_bf16: head dim %d", ops->D);
}
