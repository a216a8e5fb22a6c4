/*
 * attn_draft_mma_64x128, the phased DraftAttention2 kernel (DA2 §3.3,
 * C.3, C.4; docs/DRAFT.md §4): correct-first (mma.sync, no pipelining),
 * any route at head dim 64 or 128; the chooser sends it the routes with
 * NVFP4 blocks (the others run attn_draft_ws_128x128).  One CTA of 64
 * query rows per (half region, head) walks its route's phases NVFP4 ->
 * INT8 -> 16-bit with ONE online-softmax state, on the operands of prep.cu
 * and the route of router.cu; host.cu launches it through dg_launch_mma.
 *
 * Numerics against the CPU reference (src/cpu/draft.c):
 *   - 16-bit phase: the bf16 kernel's math (P rounded to 16 bits, FP32
 *     partial per block);
 *   - INT8 phase: the dense 8-bit kernel's math (exact INT32 QK, E4M3 P
 *     and V, partial per block rounded to FP16 with saturation, Table 6),
 *     entered and left by Eq. 8;
 *   - NVFP4 phase, emulated (Hopper has no FP4 MMA): QK on the exact BF16
 *     reconstructions (products exact, FP32 accumulation), scores times
 *     (g_Q g_K) scale_log2; p = exp2(s - m) in FP32, l += sum p before the
 *     conversion; P coded per 16 keys by DA2 Eq. 24 with the CPU's
 *     expressions; the FP32 value of each coded p is split exactly into
 *     three BF16 terms (8 + 8 + 8 significant bits) and PV runs as three
 *     BF16 MMAs into one FP32 partial, so the partial is sum p*v with exact
 *     products; U += partial * g_V.
 *   With prep.cu's bit-exact operands, the GPU therefore differs from the
 *   CPU only in summation order (MMA accumulation, row sums) and
 *   exp2f/log2f ulps.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "common/attn_common.cuh"
#include "common/softmax.cuh"
#include "draft_internal.h"

#define DG_ROWS 64     /* query rows per CTA (half a region) */
#define DG_THREADS 128 /* 4 warps x 16 rows */
#define DG_PAD16 8     /* halfwords of row padding */
#define DG_PAD8 16     /* bytes of row padding */

/* One online-softmax state of the thread's two rows (g and g + 8). */
template <int D>
struct dg_acc {
    float o[D / 8][4];
    float m[2], l[2];
};

/* Shared tiles: 16-bit (K [128][D+8], V^T [D][136]) or 8-bit (K
 * [128][D+16], V^T [D][144]) in one dynamic buffer. */
template <int D>
static constexpr int dg_smem16_k(void) { return DG_KEYS * (D + DG_PAD16) * 2; }
template <int D>
static constexpr int dg_smem_bytes(void) {
    return dg_smem16_k<D>() + D * (DG_KEYS + DG_PAD16) * 2;
}

/* Loads a 16-bit K block [128][D] and V^T block [D][128] into the tiles. */
template <int D>
static __device__ __forceinline__ void dg_load16(unsigned char *smem, const uint16_t *kg,
                                                 const uint16_t *vg) {
    uint16_t *kt = (uint16_t *)smem, *vt = (uint16_t *)(smem + dg_smem16_k<D>());
    __syncthreads(); /* every warp is done with the previous tiles */
    for (int i = threadIdx.x; i < DG_KEYS * D / 8; i += DG_THREADS) {
        const int r = i / (D / 8), c = (i % (D / 8)) * 8;
        qvc_cp_async16(kt + r * (D + DG_PAD16) + c, kg + (size_t)r * D + c);
    }
    for (int i = threadIdx.x; i < D * DG_KEYS / 8; i += DG_THREADS) {
        const int r = i / (DG_KEYS / 8), c = (i % (DG_KEYS / 8)) * 8;
        qvc_cp_async16(vt + r * (DG_KEYS + DG_PAD16) + c, vg + (size_t)r * DG_KEYS + c);
    }
    qvc_cp_async_wait_all();
    __syncthreads();
}

/* Loads an INT8 K block [128][D] and E4M3 V^T block [D][128]. */
template <int D>
static __device__ __forceinline__ void dg_load8(unsigned char *smem, const int8_t *kg,
                                                const uint8_t *vg) {
    uint8_t *kt = smem, *vt = smem + DG_KEYS * (D + DG_PAD8);
    __syncthreads();
    for (int i = threadIdx.x; i < DG_KEYS * D / 16; i += DG_THREADS) {
        const int r = i / (D / 16), c = (i % (D / 16)) * 16;
        qvc_cp_async16(kt + r * (D + DG_PAD8) + c, (const uint8_t *)kg + (size_t)r * D + c);
    }
    for (int i = threadIdx.x; i < D * DG_KEYS / 16; i += DG_THREADS) {
        const int r = i / (DG_KEYS / 16), c = (i % (DG_KEYS / 16)) * 16;
        qvc_cp_async16(vt + r * (DG_KEYS + DG_PAD8) + c, vg + (size_t)r * DG_KEYS + c);
    }
    qvc_cp_async_wait_all();
    __syncthreads();
}

/* Keys at or past `valid` of the block score -inf (padding slots). */
static __device__ __forceinline__ void dg_mask(float (&s)[DG_KEYS / 8][4], int valid) {
    if (valid >= DG_KEYS) return;
    const int tig = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt) {
        const int key = nt * 8 + 2 * tig;
        if (key >= valid) s[nt][0] = s[nt][2] = -INFINITY;
        if (key + 1 >= valid) s[nt][1] = s[nt][3] = -INFINITY;
    }
}

/* qvi_row_raise_max for both rows. */
template <int D>
static __device__ __forceinline__ void dg_raise(dg_acc<D> &r, const float (&s)[DG_KEYS / 8][4]) {
    float mx[2];
    qvc_softmax_row_max(s, r.m, mx);
    qvc_softmax_raise<QVC_SM_EXACT_MUL>(mx, r.m, r.l, r.o);
}

/* Q rows (g, g+8) of a 16-bit [rows][D] operand as m16n8k16 A fragments. */
template <int D>
static __device__ __forceinline__ void dg_qfrag16(uint32_t (&qf)[D / 16][4], const uint16_t *rowg) {
    const int tig = threadIdx.x & 3;
    const uint16_t *qg = rowg + 2 * tig;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
        qf[kc][0] = __ldg((const uint32_t *)(qg + kc * 16));
        qf[kc][1] = __ldg((const uint32_t *)(qg + 8 * D + kc * 16));
        qf[kc][2] = __ldg((const uint32_t *)(qg + kc * 16 + 8));
        qf[kc][3] = __ldg((const uint32_t *)(qg + 8 * D + kc * 16 + 8));
    }
}

/* S = (Q K^T) * f on a 16-bit K tile, padding masked. */
template <int D, int F16>
static __device__ __forceinline__ void dg_scores16(float (&s)[DG_KEYS / 8][4],
                                                   const uint32_t (&qf)[D / 16][4],
                                                   const unsigned char *smem, float f, int valid) {
    const uint16_t *kt = (const uint16_t *)smem;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *kr = kt + (nt * 8 + g) * (D + DG_PAD16) + 2 * tig;
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc)
            qvc_mma16<F16>(acc, qf[kc], qvc_lds32(kr + kc * 16), qvc_lds32(kr + kc * 16 + 8));
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = __fmul_rn(acc[e], f);
    }
    dg_mask(s, valid);
}

/* ---- 16-bit phase: one block (qvi_pv_16) ---- */
template <int D, int F16>
static __device__ __forceinline__ void dg_block16(dg_acc<D> &r, const uint32_t (&qf)[D / 16][4],
                                                  unsigned char *smem, const uint16_t *kg,
                                                  const uint16_t *vg, int valid, float f) {
    dg_load16<D>(smem, kg, vg);
    float s[DG_KEYS / 8][4];
    dg_scores16<D, F16>(s, qf, smem, f, valid);
    dg_raise<D>(r, s);
    uint32_t pa[DG_KEYS / 16][4];
    float rs[2] = {0.0f, 0.0f};
    qvc_softmax_probs16<F16>(s, r.m, rs, pa);
    r.l[0] = __fadd_rn(r.l[0], qvc_quad_sum(rs[0]));
    r.l[1] = __fadd_rn(r.l[1], qvc_quad_sum(rs[1]));
    const uint16_t *vt = (const uint16_t *)(smem + dg_smem16_k<D>());
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *vr = vt + (n * 8 + g) * (DG_KEYS + DG_PAD16) + 2 * tig;
#pragma unroll
        for (int c = 0; c < DG_KEYS / 16; ++c)
            qvc_mma16<F16>(part, pa[c], qvc_lds32(vr + c * 16), qvc_lds32(vr + c * 16 + 8));
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[n][e] = __fadd_rn(r.o[n][e], part[e]);
    }
}

/* ---- NVFP4 phase: one block (qvi_scores_f32 on the reconstructions,
 * qvi_pv_nvfp4 with vscale = g_V) ---- */

/* Piece k (0, 1, 2) of the exact split x = hi + mid + lo into BF16 values
 * (truncations: each piece carries the next 8 significant bits). */
static __device__ __forceinline__ float dg_split(float x, int k) {
    const float hi = __uint_as_float(__float_as_uint(x) & 0xFFFF0000u);
    if (k == 0) return hi;
    const float r = __fsub_rn(x, hi); /* exact */
    const float mid = __uint_as_float(__float_as_uint(r) & 0xFFFF0000u);
    return k == 1 ? mid : __fsub_rn(r, mid); /* exact, <= 8 bits */
}
static __device__ __forceinline__ uint32_t dg_pack_split(float a, float b, int k) {
    return (__float_as_uint(dg_split(a, k)) >> 16) | (__float_as_uint(dg_split(b, k)) & 0xFFFF0000u);
}

/* DA2 Eq. 24 on one 16-key group of one row held by a quad (4 values per
 * thread): sigma = e4m3(448 max p), p = (sigma/2688) e2m1(2688 p / sigma). */
static __device__ __forceinline__ float dg_prob4(float p, float sigma, float step) {
    return sigma == 0.0f
               ? 0.0f
               : __fmul_rn(step, dg_e2m1_decode(dg_e2m1(__fdiv_rn(__fmul_rn(2688.0f, p), sigma))));
}
static __device__ __forceinline__ void dg_probs16(float &p0, float &p1, float &p2, float &p3) {
    const float pm = qvc_quad_max(fmaxf(fmaxf(p0, p1), fmaxf(p2, p3))); /* p >= 0 */
    const float sigma = dg_e4m3_decode(dg_e4m3(__fmul_rn(448.0f, pm)));
    const float step = __fdiv_rn(sigma, 2688.0f);
    p0 = dg_prob4(p0, sigma, step);
    p1 = dg_prob4(p1, sigma, step);
    p2 = dg_prob4(p2, sigma, step);
    p3 = dg_prob4(p3, sigma, step);
}

template <int D>
static __device__ __forceinline__ void dg_block4(dg_acc<D> &r, const uint32_t (&qf)[D / 16][4],
                                                 unsigned char *smem, const uint16_t *kg,
                                                 const uint16_t *vg, int valid, float f, float gv) {
    dg_load16<D>(smem, kg, vg);
    float s[DG_KEYS / 8][4];
    dg_scores16<D, 0>(s, qf, smem, f, valid);
    dg_raise<D>(r, s);
    const float mr[2] = {qvc_softmax_shift(r.m[0]), qvc_softmax_shift(r.m[1])};
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[nt][e] = exp2f(__fsub_rn(s[nt][e], mr[e >> 1])); /* -inf -> 0 */
            rs[e >> 1] = __fadd_rn(rs[e >> 1], s[nt][e]);
        }
    r.l[0] = __fadd_rn(r.l[0], qvc_quad_sum(rs[0])); /* before the conversion */
    r.l[1] = __fadd_rn(r.l[1], qvc_quad_sum(rs[1]));
#pragma unroll
    for (int c = 0; c < DG_KEYS / 16; ++c) {
        dg_probs16(s[2 * c][0], s[2 * c][1], s[2 * c + 1][0], s[2 * c + 1][1]); /* row g */
        dg_probs16(s[2 * c][2], s[2 * c][3], s[2 * c + 1][2], s[2 * c + 1][3]); /* row g + 8 */
    }
    uint32_t pa[3][DG_KEYS / 16][4];
#pragma unroll
    for (int k = 0; k < 3; ++k)
#pragma unroll
        for (int c = 0; c < DG_KEYS / 16; ++c) {
            const float *lo = s[2 * c], *hi = s[2 * c + 1];
            pa[k][c][0] = dg_pack_split(lo[0], lo[1], k);
            pa[k][c][1] = dg_pack_split(lo[2], lo[3], k);
            pa[k][c][2] = dg_pack_split(hi[0], hi[1], k);
            pa[k][c][3] = dg_pack_split(hi[2], hi[3], k);
        }
    const uint16_t *vt = (const uint16_t *)(smem + dg_smem16_k<D>());
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *vr = vt + (n * 8 + g) * (DG_KEYS + DG_PAD16) + 2 * tig;
#pragma unroll
        for (int c = 0; c < DG_KEYS / 16; ++c) {
            const uint32_t b0 = qvc_lds32(vr + c * 16), b1 = qvc_lds32(vr + c * 16 + 8);
#pragma unroll
            for (int k = 0; k < 3; ++k) qvc_mma_bf16(part, pa[k][c], b0, b1);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[n][e] = __fadd_rn(r.o[n][e], __fmul_rn(part[e], gv));
    }
}

/* ---- INT8 phase: one block (qvi_scores_i8, qvi_pv_e4m3: FP32 partials,
 * or rounded to FP16 with acc16) ---- */

/* Two scores -> two E4M3 P codes (low byte first); the exp path adds the
 * FP32 amplified weights to *rowsum. */
static __device__ __forceinline__ uint32_t dg_pcodes2(float s0, float s1, float m, int expcast,
                                                      float ec_add, float *rowsum) {
    if (expcast)
        return qvc_expcast_code(__fsub_rn(s0, m), ec_add) |
               (qvc_expcast_code(__fsub_rn(s1, m), ec_add) << 8);
    const float p0 = exp2f(__fadd_rn(__fsub_rn(s0, m), QVI_SAGE_P_OFFSET));
    const float p1 = exp2f(__fadd_rn(__fsub_rn(s1, m), QVI_SAGE_P_OFFSET));
    *rowsum = __fadd_rn(__fadd_rn(*rowsum, p0), p1);
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(p0, p1), __NV_SATFINITE, __NV_E4M3);
}

template <int D>
static __device__ __forceinline__ void dg_block8(dg_acc<D> &r, const uint32_t (&qf)[D / 32][4],
                                                 unsigned char *smem, const int8_t *kg,
                                                 const uint8_t *vg, int valid,
                                                 const float (&f)[2], int expcast,
                                                 float ec_add, int acc16) {
    dg_load8<D>(smem, kg, vg);
    const uint8_t *kt = smem, *vt = smem + DG_KEYS * (D + DG_PAD8);
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    float s[DG_KEYS / 8][4];
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt) {
        int acc[4] = {0, 0, 0, 0};
#pragma unroll
        for (int kc = 0; kc < D / 32; ++kc) {
            const uint8_t *kr = kt + (nt * 8 + g) * (D + DG_PAD8) + kc * 32 + tig * 4;
            qvc_mma_s8(acc, qf[kc], qvc_lds32(kr), qvc_lds32(kr + 16));
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = __fmul_rn((float)acc[e], f[e >> 1]);
    }
    dg_mask(s, valid);
    dg_raise<D>(r, s);
    const float mr0 = qvc_softmax_shift(r.m[0]), mr1 = qvc_softmax_shift(r.m[1]);
    uint32_t pa[DG_KEYS / 32][4];
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < DG_KEYS / 32; ++c) {
        const uint32_t lo0 = dg_pcodes2(s[4 * c][0], s[4 * c][1], mr0, expcast, ec_add, &rs[0]);
        const uint32_t hi0 = dg_pcodes2(s[4 * c + 1][0], s[4 * c + 1][1], mr0, expcast, ec_add, &rs[0]);
        const uint32_t lo1 = dg_pcodes2(s[4 * c][2], s[4 * c][3], mr1, expcast, ec_add, &rs[1]);
        const uint32_t hi1 = dg_pcodes2(s[4 * c + 1][2], s[4 * c + 1][3], mr1, expcast, ec_add, &rs[1]);
        const uint32_t lo2 = dg_pcodes2(s[4 * c + 2][0], s[4 * c + 2][1], mr0, expcast, ec_add, &rs[0]);
        const uint32_t hi2 = dg_pcodes2(s[4 * c + 3][0], s[4 * c + 3][1], mr0, expcast, ec_add, &rs[0]);
        const uint32_t lo3 = dg_pcodes2(s[4 * c + 2][2], s[4 * c + 2][3], mr1, expcast, ec_add, &rs[1]);
        const uint32_t hi3 = dg_pcodes2(s[4 * c + 3][2], s[4 * c + 3][3], mr1, expcast, ec_add, &rs[1]);
        pa[c][0] = lo0 | (hi0 << 16);
        pa[c][1] = lo1 | (hi1 << 16);
        pa[c][2] = lo2 | (hi2 << 16);
        pa[c][3] = lo3 | (hi3 << 16);
    }
    qvc_softmax_code_sums(pa, expcast, rs);
    r.l[0] = __fadd_rn(r.l[0], rs[0]);
    r.l[1] = __fadd_rn(r.l[1], rs[1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < DG_KEYS / 32; ++c) {
            const uint8_t *vr = vt + (n * 8 + g) * (DG_KEYS + DG_PAD8) + c * 32 + tig * 4;
            qvc_mma_e4m3(part, pa[c], qvc_lds32(vr), qvc_lds32(vr + 16));
        }
#pragma unroll
        for (int e = 0; e < 4; ++e)
            r.o[n][e] = __fadd_rn(r.o[n][e], acc16 ? qvc_f16_sat(part[e]) : part[e]);
    }
}

/* Eq. 8 unit change: enter (dir 0) divides by eta*delta_c, exit multiplies. */
template <int D>
static __device__ __forceinline__ void dg_phase_scale(dg_acc<D> &r, const float *dv, float eta,
                                                      int enter) {
    const int tig = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float sc = __fmul_rn(eta, dv[n * 8 + 2 * tig + (e & 1)]);
            r.o[n][e] = enter ? __fdiv_rn(r.o[n][e], sc) : __fmul_rn(r.o[n][e], sc);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) r.l[h] = enter ? __fdiv_rn(r.l[h], eta) : __fmul_rn(r.l[h], eta);
}

/*
 * grid (2 R, BH): CTA x covers rows [64 (x & 1), +64) of video region
 * a = x >> 1 of head bh; warp w rows 16 w + g and + 8 of that half.
 */
/* The kernel's dynamic shared memory: the K and V^T tiles of one block. */
extern __shared__ __align__(16) unsigned char dg_smem[];

/* The 16-bit phase of one CTA: every prefix block, then the 16-bit video
 * blocks cols[e2 .. e3). */
template <int D, int F16>
static __device__ __forceinline__ void dg_phase16(dg_acc<D> &r, const dg_params &p, int a, int bh,
                                                  int lr0, int e2, int e3) {
    const dg_ops &op = p.ops;
    uint32_t qf[D / 16][4];
    const int64_t hp = (int64_t)bh * p.n_pack;
    dg_qfrag16<D>(qf, op.q16 + (hp + p.prefix_pad + (int64_t)a * DG_KEYS + lr0) * D);
    for (int64_t k0 = 0; k0 < p.prefix_pad; k0 += DG_KEYS) {
        const int64_t left = (int64_t)p.prefix - k0;
        dg_block16<D, F16>(r, qf, dg_smem, op.k16 + (hp + k0) * D, op.v16t + (hp + k0) * D,
                           (int)(left < DG_KEYS ? left : DG_KEYS), p.scale_log2);
    }
    for (int i = e2; i < e3; ++i) {
        const int b = p.cols[i];
        const int64_t k0 = p.prefix_pad + (int64_t)b * DG_KEYS;
        dg_block16<D, F16>(r, qf, dg_smem, op.k16 + (hp + k0) * D, op.v16t + (hp + k0) * D,
                           p.count[b], p.scale_log2);
    }
}

template <int D>
__global__ void __launch_bounds__(DG_THREADS)
attn_draft_mma_64x128(dg_params p) {
    const int bh = blockIdx.y, a = blockIdx.x >> 1, half = blockIdx.x & 1;
    const int cnt = p.count[a];
    if (half * DG_ROWS >= cnt) return; /* only padding rows: uniform exit */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int lr0 = half * DG_ROWS + warp * 16 + g; /* row in the region; and lr0 + 8 */
    const dg_ops &op = p.ops;
    const int R = p.R;
    const int64_t nv = (int64_t)R * DG_KEYS, hr = (int64_t)bh * R;

    dg_acc<D> r;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) r.o[n][0] = r.o[n][1] = r.o[n][2] = r.o[n][3] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;

    const int32_t *off = p.offsets + (hr + a) * 3;
    const int32_t e0 = off[0], e1 = off[1], e2 = off[2], e3 = off[3];

    /* 1. NVFP4 blocks */
    if (e1 > e0) {
        uint32_t qf[D / 16][4];
        dg_qfrag16<D>(qf, op.q4 + ((int64_t)bh * nv + (int64_t)a * DG_KEYS + lr0) * D);
        const float f = __fmul_rn(__fmul_rn(op.g4[bh * 3 + 0], op.g4[bh * 3 + 1]), p.scale_log2);
        const float gv = op.g4[bh * 3 + 2];
        for (int i = e0; i < e1; ++i) {
            const int b = p.cols[i];
            dg_block4<D>(r, qf, dg_smem, op.k4 + ((int64_t)bh * nv + (int64_t)b * DG_KEYS) * D,
                         op.v4t + (hr + b) * D * DG_KEYS, p.count[b], f, gv);
        }
    }

    /* 2. INT8 blocks, inside the Eq. 8 unit change (an empty phase has none) */
    if (e2 > e1) {
        const float *dv = op.dv + (int64_t)bh * D;
        /* after an empty NVFP4 phase O and l are +0, and so is every
         * quotient (eta * delta_c > 0): the entry is skipped, not computed
         * (a division of zero is not free: __fdiv_rn's range check) */
        if (e1 > e0) dg_phase_scale<D>(r, dv, p.eta, 1);
        uint32_t qf[D / 32][4];
        const uint8_t *qg = (const uint8_t *)op.q8 + ((int64_t)bh * nv + (int64_t)a * DG_KEYS) * D;
#pragma unroll
        for (int kc = 0; kc < D / 32; ++kc) {
            qf[kc][0] = __ldg((const uint32_t *)(qg + (size_t)lr0 * D + kc * 32 + tig * 4));
            qf[kc][1] = __ldg((const uint32_t *)(qg + (size_t)(lr0 + 8) * D + kc * 32 + tig * 4));
            qf[kc][2] = __ldg((const uint32_t *)(qg + (size_t)lr0 * D + kc * 32 + 16 + tig * 4));
            qf[kc][3] = __ldg((const uint32_t *)(qg + (size_t)(lr0 + 8) * D + kc * 32 + 16 + tig * 4));
        }
        /* the deltas of rows lr0 and lr0 + 8 (per row, or the block's) */
        const float *dqs = op.q8s + (op.q_rows_per_scale == 1 ? (hr + a) * DG_KEYS + lr0 : hr + a);
        const float dq[2] = {dqs[0], op.q_rows_per_scale == 1 ? dqs[8] : dqs[0]};
        for (int i = e1; i < e2; ++i) {
            const int b = p.cols[i];
            const float f[2] = {__fmul_rn(__fmul_rn(dq[0], op.k8s[hr + b]), p.scale_log2),
                                __fmul_rn(__fmul_rn(dq[1], op.k8s[hr + b]), p.scale_log2)};
            dg_block8<D>(r, qf, dg_smem, op.k8 + ((int64_t)bh * nv + (int64_t)b * DG_KEYS) * D,
                         op.v8t + (hr + b) * D * DG_KEYS, p.count[b], f, p.expcast, p.a.expcast_add,
                         p.int8_acc16);
        }
        dg_phase_scale<D>(r, dv, p.eta, 0);
    }

    /* 3. 16-bit: every prefix block, then the 16-bit video blocks; the
     * format is a runtime choice so that the NVFP4 and INT8 phases are
     * compiled once per head dim */
    if (p.f16)
        dg_phase16<D, 1>(r, p, a, bh, lr0, e2, e3);
    else
        dg_phase16<D, 0>(r, p, a, bh, lr0, e2, e3);

    /* qvi_row_finish, scattered back to the sequence order */
    const qvc_attn_args &A = p.a;
    const int b = bh / A.H, h = bh % A.H;
    const bool retained = e3 > e0 || p.prefix_pad > 0; /* a kept block, or the prefix */
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int lr = lr0 + 8 * rr;
        if (lr >= cnt) continue;
        const int64_t orig = p.pack[p.prefix_pad + (int64_t)a * DG_KEYS + lr];
        const int kind = qvc_softmax_row(r.m[rr], r.l[rr], retained);
        const float fill = qvc_softmax_fill(kind);
        const int64_t base = b * A.osb + h * A.osh + orig * A.osn;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * tig;
            qvc_store_out(A.out, A.out_dtype, base + col, kind ? fill : __fdiv_rn(r.o[n][2 * rr], r.l[rr]));
            qvc_store_out(A.out, A.out_dtype, base + col + 1, kind ? fill : __fdiv_rn(r.o[n][2 * rr + 1], r.l[rr]));
        }
        if (A.lse && tig == 0)
            A.lse[b * A.lsb + h * A.lsh + orig * A.lsn] =
                kind ? qvc_softmax_lse_fill(kind)
                     : __fmul_rn(__fadd_rn(r.m[rr], log2f(r.l[rr])), 0.69314718055994531f);
    }
}

/* ================================================================ launcher */

template <int D>
static qva_status dg_launch_attn(const dg_params &p, int BH, cudaStream_t st) {
    const int smem = dg_smem_bytes<D>(); /* 69632 (D 128) or 35840 (D 64) bytes */
    cudaError_t e = cudaFuncSetAttribute(attn_draft_mma_64x128<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn_draft: shared memory attribute");
    const dim3 grid((unsigned)(2 * p.R), (unsigned)BH);
    attn_draft_mma_64x128<D><<<grid, DG_THREADS, smem, st>>>(p);
    return qvc_launch_check("attn_draft");
}

qva_status dg_launch_mma(const dg_params *p, int BH, int D, int f16, cudaStream_t st) {
    dg_params q = *p;
    q.f16 = f16 != 0;
    return D == 128 ? dg_launch_attn<128>(q, BH, st) : dg_launch_attn<64>(q, BH, st);
}
