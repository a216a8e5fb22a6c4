/*
 * attn8_mma_64x128: the correct-first 8-bit attention kernel.
 *
 *   S  = Q K^T   mma.sync m16n8k32 s8 (sage8/vc8) or e4m3 (fp8), per-block
 *                scales applied to the INT32/FP32 accumulator
 *   P  = E4M3 codes: exp2((s-m)+8.807) then cvt.rn.satfinite, or ExpCast
 *                (VC Eq. 7: one FMA + RNE, no exp; its row sum of decoded
 *                codes comes from an extra MMA against a ones column)
 *   O += P V     mma.sync m16n8k32 e4m3 (FP32 accumulate), a fresh partial
 *                per 128-key block (two-level), times the block's V scale,
 *                plus the V-Smooth rank-1 restore r_ij mu_j (VC Eq. 6);
 *                +pblock codes each block against its own row max and
 *                weighs the block's partial and sum by exp2(m_b - m)
 *
 * CTA = 4 warps x 16 query rows = 64 rows; one 128-key block per iteration.
 * The QK accumulator fragment of 32 keys is repacked in registers into the
 * PV A-operand fragment; V was transposed by the prep kernel with the
 * matching key order (qvc_pv_slot_key, DA2 Eq. 22), so no shuffles.
 * mma.sync on Hopper: the path for head dim 64; at 128 attn8_ws_128x128
 * runs.
 */
#include "common/attn_common.cuh"
#include "common/softmax.cuh"

#define ROWS_PER_CTA 64
#define KEYS 128
#define SMEM_PAD 16

template <int D>
struct tiles {
    uint8_t k[KEYS][D + SMEM_PAD];
    uint8_t v[D][KEYS + SMEM_PAD];
};

template <int D>
static __device__ __forceinline__ void load_block(tiles<D> &t, const qvc_ops &ops, int bh,
                                                  int j) {
    const uint8_t *kg = (const uint8_t *)ops.k_i8 + ((size_t)bh * ops.nk_pad + (size_t)j * KEYS) * D;
    const uint8_t *vg = ops.v_t + ((size_t)bh * ops.nblk + j) * (size_t)D * KEYS;
    for (int i = threadIdx.x; i < KEYS * D / 16; i += blockDim.x) {
        int r = i / (D / 16), c = (i % (D / 16)) * 16;
        qvc_cp_async16(&t.k[r][c], kg + (size_t)r * D + c);
    }
    for (int i = threadIdx.x; i < D * KEYS / 16; i += blockDim.x) {
        int r = i / (KEYS / 16), c = (i % (KEYS / 16)) * 16;
        qvc_cp_async16(&t.v[r][c], vg + (size_t)r * KEYS + c);
    }
    qvc_cp_async_wait_all();
}

template <int D, int FMT>
__global__ void __launch_bounds__(128)
attn8_mma_64x128(qvc_ops ops, qvc_attn_args a) {
    __shared__ __align__(16) tiles<D> t;
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int row0 = blockIdx.x * ROWS_PER_CTA + warp * 16 + g; /* and row0 + 8 */

    uint32_t qf[D / 32][4];
    const uint8_t *qg = (const uint8_t *)ops.q_i8 + (size_t)bh * ops.nq_pad * D;
#pragma unroll
    for (int kc = 0; kc < D / 32; ++kc) {
        qf[kc][0] = *(const uint32_t *)(qg + (size_t)row0 * D + kc * 32 + tig * 4);
        qf[kc][1] = *(const uint32_t *)(qg + (size_t)(row0 + 8) * D + kc * 32 + tig * 4);
        qf[kc][2] = *(const uint32_t *)(qg + (size_t)row0 * D + kc * 32 + 16 + tig * 4);
        qf[kc][3] = *(const uint32_t *)(qg + (size_t)(row0 + 8) * D + kc * 32 + 16 + tig * 4);
    }
    float dq[2];
    qvc_q_scales(ops, bh, row0, dq);

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int j = 0; j < ops.nblk; ++j) {
        __syncthreads(); /* the previous block's tiles are consumed */
        load_block<D>(t, ops, bh, j);
        __syncthreads();

        /* ---- S = Q K^T, scaled into the log2 domain ---- */
        float s[KEYS / 8][4];
        const float dk = ops.k_scale[(size_t)bh * ops.nblk + j];
        const float f[2] = {(dq[0] * dk) * a.scale_log2, (dq[1] * dk) * a.scale_log2};
#pragma unroll
        for (int nt = 0; nt < KEYS / 8; ++nt) {
            if (FMT == QVC_QK_INT8) {
                int acc[4] = {0, 0, 0, 0};
#pragma unroll
                for (int kc = 0; kc < D / 32; ++kc) {
                    const uint8_t *kr = &t.k[nt * 8 + g][kc * 32 + tig * 4];
                    qvc_mma_s8(acc, qf[kc], *(const uint32_t *)kr, *(const uint32_t *)(kr + 16));
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = (float)acc[e] * f[e >> 1];
            } else {
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kc = 0; kc < D / 32; ++kc) {
                    const uint8_t *kr = &t.k[nt * 8 + g][kc * 32 + tig * 4];
                    qvc_mma_e4m3(acc, qf[kc], *(const uint32_t *)kr, *(const uint32_t *)(kr + 16));
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = acc[e] * f[e >> 1];
            }
            const int key = j * KEYS + nt * 8 + 2 * tig;
            if (key >= ops.nk) s[nt][0] = s[nt][2] = -INFINITY;
            if (key + 1 >= ops.nk) s[nt][1] = s[nt][3] = -INFINITY;
        }

        /* ---- online softmax: raise the max, rescale (VC Eq. 1) ---- */
        const float none[2] = {-INFINITY, -INFINITY};
        float mb[2], mx[2];
        qvc_softmax_row_max(s, none, mb); /* the block's own row max */
        mx[0] = fmaxf(mb[0], m[0]);
        mx[1] = fmaxf(mb[1], m[1]);
        /* exact multiplies: O and l then meet the block's partial unfused */
        qvc_softmax_raise<QVC_SM_EXACT_MUL>(mx, m, l, o);

        /* ---- P codes, packed straight into PV A fragments: against the
         * row's max, or (+pblock) the block's, then weighted by
         * w = exp2(m_b - m), 0 for a block without keys (the CPU's
         * probs_e4m3_at) ---- */
        const float mc0 = a.p_block ? mb[0] : m[0], mc1 = a.p_block ? mb[1] : m[1];
        float w[2] = {1.0f, 1.0f};
        if (a.p_block) {
            w[0] = mb[0] == -INFINITY ? 0.0f : exp2f(mb[0] - m[0]);
            w[1] = mb[1] == -INFINITY ? 0.0f : exp2f(mb[1] - m[1]);
        }
        uint32_t pa[KEYS / 32][4];
        float rs[2] = {0.0f, 0.0f};
        const float mr0 = qvc_softmax_shift(mc0), mr1 = qvc_softmax_shift(mc1);
#pragma unroll
        for (int c = 0; c < KEYS / 32; ++c)
            qvc_pack_p32(&s[4 * c], mr0, mr1, a.expcast, a.expcast_add, rs, pa[c]);
        qvc_softmax_code_sums(pa, a.expcast || a.sum_codes, rs); /* the FP32 sums are dropped */
        rs[0] *= w[0];
        rs[1] *= w[1];
        l[0] += rs[0];
        l[1] += rs[1];

        /* ---- O += (P V) * w * v_blk + r mu (VC Eq. 6) ---- */
        const float vb = ops.v_blk[(size_t)bh * ops.nblk + j];
        const float wv0 = w[0] * vb, wv1 = w[1] * vb;
        const float *mu = ops.v_mu ? ops.v_mu + ((size_t)bh * ops.nblk + j) * D : NULL;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int c = 0; c < KEYS / 32; ++c) {
                const uint8_t *vr = &t.v[n * 8 + g][c * 32 + tig * 4];
                qvc_mma_e4m3(part, pa[c], *(const uint32_t *)vr, *(const uint32_t *)(vr + 16));
            }
            const int col = n * 8 + 2 * tig;
            const float mu0 = mu ? mu[col] : 0.0f, mu1 = mu ? mu[col + 1] : 0.0f;
            o[n][0] += part[0] * wv0;
            o[n][1] += part[1] * wv0;
            o[n][2] += part[2] * wv1;
            o[n][3] += part[3] * wv1;
            if (mu) {
                o[n][0] += rs[0] * mu0;
                o[n][1] += rs[0] * mu1;
                o[n][2] += rs[1] * mu0;
                o[n][3] += rs[1] * mu1;
            }
        }
    }

    /* ---- epilogue: out = O * chan_scale / l, LSE ---- */
    const int b = bh / a.H, h = bh % a.H;
    const float amp = a.expcast ? 8.0f : QVC_P_AMP;
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
            const float *cs = ops.v_chan + (size_t)bh * D;
            qvc_store_out(a.out, a.out_dtype, base + col, kind ? fill : (o[n][2 * r] * cs[col]) / l[r]);
            qvc_store_out(a.out, a.out_dtype, base + col + 1, kind ? fill : (o[n][2 * r + 1] * cs[col + 1]) / l[r]);
        }
        if (a.lse && tig == 0) {
            float lse = kind ? qvc_softmax_lse_fill(kind) : (m[r] + log2f(l[r]) - amp) * 0.69314718055994531f;
            /* K smoothing shifted every score of the row by q.mean(K) sm_scale:
             * add it back (the CPU's lb[i] += lse_shift[i]; -inf and NaN stay). */
            if (a.lse_shift) lse = __fadd_rn(lse, a.lse_shift[(size_t)bh * ops.nq + row]);
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] = lse;
        }
    }
}

template <int D, int FMT>
static qva_status launch(const qvc_ops *ops, const qvc_attn_args *a, cudaStream_t st) {
    dim3 grid((unsigned)(ops->nq_pad / ROWS_PER_CTA), (unsigned)ops->BH);
    attn8_mma_64x128<D, FMT><<<grid, 128, 0, st>>>(*ops, *a);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? QVA_OK
                            : qvi_fail(QVA_ERR_DEVICE, "attn8_mma_64x128 launch: %s", cudaGetErrorString(e));
}

/* Head dim 64 only: at 128 the chooser runs attn8_ws_128x128. */
extern "C" qva_status qvc_attn8_mma_64x128(const qvc_ops *ops, qvc_qk_format fmt,
                                           const qvc_attn_args *a, cudaStream_t st) {
    if (ops->D == 64)
        return fmt == QVC_QK_INT8 ? launch<64, QVC_QK_INT8>(ops, a, st)
                                  : launch<64, QVC_QK_E4M3>(ops, a, st);
    return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_mma_64x128: head dim %d (64 only)", ops->D);
}
