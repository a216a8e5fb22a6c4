/*
 * The V-Smooth mean restore of attn8_ws_128x128's INT8 path, O += r_j mu_j^T
 * for every key block j, as one FP16 wgmma per QVC_MU_BATCH (16) blocks
 * instead of 64 FFMAs and 16 shared loads per block and thread (bench/NOTES.md,
 * "The V-Smooth restore as one FP16 wgmma per 16 blocks").
 *
 * The B operand, a batch's 16 x 128 FP16 tile of means, comes ready from
 * the preparation (ops.v_mu_tile, laid out by qvc_mu_tile_at: K-major
 * without swizzle, 8 x 16-byte core matrices 128 B apart along k and 256 B
 * along the channels; slots past the last block +0); the producer copies
 * each batch's tile into one of two buffers that the three consumer
 * warpgroups share (full and empty mbarriers per buffer).  Filling the tile
 * in the consumers cost each thread a conversion, a 4-way conflicted
 * 2-byte store and its addressing every block.
 *
 * Each consumer thread keeps the pending row sums r_j as its m64k16 FP16 A
 * fragment (rows g, g + 8 at k = 2tig, 2tig+1, 2tig+8, 2tig+9; block j at
 * k = j mod 16) in four words of shared memory, word i of consumer thread
 * t at PEND + 4 (i NT + t) so that a warp's accesses to one word fall in 32
 * banks (kept in registers they made ptxas serialize the ExpCast kernel's
 * wgmmas, C7512).  r_j is rounded to FP16 when stored and again after each
 * rescale (in FP32) when a row max rises, as O is rescaled.
 * After every 16 blocks and after the last, one wgmma.m64n128k16 computes
 * the batch's term into a fresh FP32 accumulator, added into O by the
 * thread (accumulating into O itself would pin O to one block of 64
 * registers, which the three consumer warpgroups' 160 cannot spare:
 * ptxas serialized the wgmmas, C7512).  FP16 holds any r_j: at most 128
 * keys x 448 (exp2 with the 8.807 offset; ExpCast's codes stop at 256) =
 * 57,344 < 65,504, and the rescales only shrink it.  The roundings of r_j
 * change the restore term by about 2^-11 relative per rounding
 * (docs/NUMERICS.md §6).  E5M2 P (+expcast-e5m2) puts the row max at 2^15,
 * so its sums reach 128 x 2^15: DOWN = 1 stores r_j 2^-7 (exact) and the
 * flush adds the term times 2^7, the same FP16 range as E4M3's.
 */
#ifndef QVATTN_ATTN8_RESTORE_CUH
#define QVATTN_ATTN8_RESTORE_CUH

#include <cuda_fp16.h>

#include "common/hopper.cuh"

/* No-swizzle K-major descriptor of a mean tile: LBO (k) 128 B, SBO (n) 256 B. */
static __device__ __forceinline__ uint64_t a8r_tile_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(128 >> 4) << 16) |
           ((uint64_t)(256 >> 4) << 32);
}

#define W8(d, i)                                                                          \
    "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]),          \
        "=f"(d[i + 5]), "=f"(d[i + 6]), "=f"(d[i + 7])
/* D (64x128, fresh) = R (64x16, FP16 registers) M (16x128, FP16 shared memory). */
static __device__ __forceinline__ void a8r_wgmma(float (&d)[64], const uint32_t (&a)[4],
                                                 uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64
        ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : W8(d, 0), W8(d, 8), W8(d, 16), W8(d, 24), W8(d, 32), W8(d, 40), W8(d, 48), W8(d, 56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
/* Head dim 64: the tile's first 64 channels, D (64x64). */
static __device__ __forceinline__ void a8r_wgmma(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " ACC32
        ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : W8(d, 0), W8(d, 8), W8(d, 16), W8(d, 24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef W8

/* This thread's pending sums: word i at ph[i * NT] (NT consumer threads),
 * zeroed. */
template <int NT>
static __device__ __forceinline__ uint32_t *a8r_pending(uint8_t *sm, int pend_off) {
    uint32_t *ph = (uint32_t *)(sm + pend_off) + (threadIdx.x - 128);
#pragma unroll
    for (int i = 0; i < 4; ++i) ph[i * NT] = 0u;
    return ph;
}

/* Block j's row sums into the pending fragment, stored by the owning
 * thread of each quad (tig == (k mod 8) / 2): word 2 hi + row (A register
 * a[2 hi + row]: hi = k >= 8, row 0 = g, 1 = g + 8) holds k = 2tig (+8) in
 * its low half, 2tig + 1 (+8) in its high half.  ph_s: the shared address
 * of ph.  Predicated stores, not a branch: every quad has an owner, so a
 * branch only added its reconvergence to every block. */
template <int NT, int DOWN = 0>
static __device__ __forceinline__ void a8r_pend(uint32_t ph_s, const float *rs, int j, int tig) {
    const int k = j & (QVC_MU_BATCH - 1), owner = (k & 7) >> 1, hi = k >> 3;
    const uint32_t a0 = ph_s + 4u * (uint32_t)(2 * hi * NT) + 2u * (uint32_t)(k & 1);
    const float down = DOWN ? 0.0078125f : 1.0f;
    const unsigned short h0 = __half_as_ushort(__float2half_rn(DOWN ? rs[0] * down : rs[0]));
    const unsigned short h1 = __half_as_ushort(__float2half_rn(DOWN ? rs[1] * down : rs[1]));
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.s32 p, %0, %1;\n"
        "@p st.shared.b16 [%2], %3;\n@p st.shared.b16 [%4], %5;\n}\n" ::"r"(tig),
        "r"(owner), "r"(a0), "h"(h0), "r"(a0 + 4u * NT), "h"(h1)
        : "memory");
}

/* A row max rose: the pending sums of row r take alpha[r], as O does. */
template <int NT>
static __device__ __forceinline__ void a8r_rescale(uint32_t *ph, const float *alpha) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h;
        const uint32_t u = ph[i * NT];
        memcpy(&h, &u, sizeof h);
        const float2 f = __half22float2(h);
        h = __floats2half2_rn(f.x * alpha[i & 1], f.y * alpha[i & 1]);
        uint32_t w;
        memcpy(&w, &h, sizeof w);
        ph[i * NT] = w;
    }
}

/* The batch's restore, O += R M, from the mean tile at tile_addr once its
 * copy has landed (full, phase parity); the pending sums cleared, and the
 * tile's buffer released (empty) when the wgmma has read it. */
template <int NT, int DOWN = 0, int NO>
static __device__ __forceinline__ void a8r_flush(float (&o)[NO], uint32_t *ph, uint32_t tile_addr,
                                                 uint32_t full, uint32_t parity, uint32_t empty) {
    uint32_t a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = ph[i * NT];
    mbar_wait(full, parity);
    float d[NO]; /* NO = 64 at head dim 128, 32 at 64 (the n64 form) */
    wg_fence();
    a8r_wgmma(d, a, a8r_tile_desc(tile_addr));
    wg_commit();
#pragma unroll
    for (int i = 0; i < 4; ++i) ph[i * NT] = 0u;
    wg_wait<0>();
    reg_fence(d);
    mbar_arrive(empty);
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = DOWN ? __fmaf_rn(d[i], 128.0f, o[i]) : o[i] + d[i];
}

#endif
