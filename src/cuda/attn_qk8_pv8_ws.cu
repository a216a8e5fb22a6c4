/*
 * attn_qk8_pv8_ws_128x128: the Hopper 8-bit attention kernel (d = 128).
 *
 * Same arithmetic as attn_qk8_pv8_mma_64x128 (the correct-first kernel,
 * attn_qk8_pv8.cu): INT8 (or E4M3) QK with per-block scales, E4M3 P codes
 * from exp2 or ExpCast, a fresh FP32 PV partial per 128-key block, the
 * V-Smooth rank-1 restore, FP32 online softmax.  What changes is how the
 * tensor cores are fed:
 *
 *   warpgroup 0      producer: one thread issues TMA loads of the Q tile
 *                    and of a STAGES-deep ring of K / V^T tiles, each
 *                    completing on an mbarrier; its registers are given
 *                    to the consumers (setmaxnreg)
 *   warpgroups 1, 2  consumers, 64 query rows each:
 *                    S = Q K^T   wgmma m64n128k32, A and B from shared memory
 *                    P codes     built in registers (S accumulator layout)
 *                    O_j = P V   wgmma m64n128k32 (n136 with ExpCast: eight
 *                                ones rows after V give the row sum of the
 *                                decoded codes for free), A from registers
 *
 * Every tile is 128-byte rows with the 128-byte swizzle, written by TMA and
 * read by wgmma through the same layout.  V^T is K-major with the key order
 * of qvc_pv_slot_key(), so the S accumulator fragment is the PV A fragment
 * (the wgmma register fragments match mma.sync's m16n8k32 per warp).
 *
 * Versions, kept side by side (QVA_ATTN_KERNEL=wsN selects one; runtime.cu),
 * each timed by bench/compare.py --kernels (bench/NOTES.md has the numbers):
 *   ws0  2 stages; per block: QK, softmax, PV in sequence
 *   ws1  ws0 + QK of block j+1 issued before the softmax of block j
 *   ws2  4 stages; V-Smooth means arrive by bulk copy with the tile; no
 *        I2F / F2I / FRND on the softmax path (those share the 16/clk/SM
 *        pipe with MUFU): INT32 -> FP32 by the 1.5*2^23 magic add, the row
 *        max on the integers, ExpCast rounded by the magic add and packed
 *        with PRMT, exp2 by ex2.approx.ftz; O is rescaled only when a row
 *        max of the warp rose
 *   ws3  ws2 + the QK/softmax overlap of ws1, with PV in two halves of 64
 *        channels so the second S accumulator fits in registers
 *   ws4  ws2 with the score arithmetic fused: the ExpCast argument is one
 *        FMA from the integer score, t = x * 8f + (119.65 - 8m), and the
 *        exp2 argument x * f + (8.807 - m); the last (masked) block has its
 *        own copy, so full blocks pay no mask test.  Fusing changes the
 *        rounding of t by about 1e-4 of a code step, so a code can differ
 *        by one step from the reference's three-rounding form.
 *   ws5  ws4 with the two consumer warpgroups in ping-pong: named barriers
 *        make one warpgroup issue its GEMMs (PV of block j, then QK of
 *        j+1) while the other makes its P codes; the O update of block j
 *        runs under the QK of j+1.
 *   ws6  ws5 with shorter dependency chains in the softmax (profile of ws5:
 *        issue slots 48% busy, tensor pipe 34%, 0.7 eligible warps per
 *        scheduler: latency-bound): the row max as a 4-way tree and the
 *        exp2 row sum in 4 partial sums (FP32 order differs from ws5).
 *   ws7  three consumer warpgroups (192-row tiles: more warps per scheduler
 *        to hide latency, 1.5x less K/V traffic per FLOP) at 160 registers
 *        each, ws4's fused softmax, PV in halves, no ping-pong.  At 160
 *        registers ptxas spills ~600 B per thread (o and the S tile alone
 *        are 128).  Written after the last H200 run of its session: not
 *        yet measured or checked on the GPU.
 * ws2/ws3 are INT8-QK only (sage8/vc8); the fp8 method runs ws0.
 */
#include <cuda.h>

#include <type_traits>

#include "attn_common.cuh"
#include "expcast_magic.h"

#define WS_KEYS 128   /* keys per block */
#define WS_TILE 16384 /* 128 rows x 128 bytes */
#define WS_ONES 1024  /* 8 rows x 128 bytes of E4M3 1.0 */
#define WS_MU 1024    /* the block's V-Smooth means, 128 f32 (512 B used) */
#define WS_STAGE_BYTES (2 * WS_TILE + WS_ONES + WS_MU)
/* Shared memory, from a 1024-byte aligned base, for n consumer warpgroups
 * (64 query rows each) and S stages:
 *   Q (n x 64 rows) | stage 0: V^T, ones, K, mu | stage 1 ... | mbarriers */
#define WS_Q_OFF 0
#define WS_QB(n) ((n) * 64 * 128)
#define WS_V_OFF(n, s) (WS_QB(n) + (s) * WS_STAGE_BYTES)
#define WS_ONES_OFF(n, s) (WS_V_OFF(n, s) + WS_TILE)
#define WS_K_OFF(n, s) (WS_ONES_OFF(n, s) + WS_ONES)
#define WS_MU_OFF(n, s) (WS_K_OFF(n, s) + WS_TILE)
#define WS_BAR_OFF(n, S) (WS_QB(n) + (S) * WS_STAGE_BYTES)
#define WS_SMEM_BYTES(n, S) (WS_BAR_OFF(n, S) + 8 * (1 + 2 * (S)) + 1024)
#define WS_PRODUCER_REGS 24

/* ------------------------------------------------------------ PTX wrappers */
static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
static __device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int x,
                                                   int y, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}
static __device__ __forceinline__ void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wg_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Named barriers between the two consumer warpgroups (ids 1, 2; 0 is
 * __syncthreads). */
static __device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void named_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* Keep the compiler from moving accumulator registers across the
 * asynchronous wgmma window. */
template <typename T, int N>
static __device__ __forceinline__ void reg_fence(T (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(*(uint32_t *)&r[i])::"memory");
}

/* Shared-memory matrix descriptor: K-major rows of 128 bytes, 128-byte
 * swizzle, 8-row groups 1024 bytes apart (SBO); LBO is unused. */
static __device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

#define R8(d, i)                                                                          \
    "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]),          \
        "+r"(d[i + 5]), "+r"(d[i + 6]), "+r"(d[i + 7])
#define F8(d, i)                                                                          \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),          \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define R64(d) R8(d, 0), R8(d, 8), R8(d, 16), R8(d, 24), R8(d, 32), R8(d, 40), R8(d, 48), R8(d, 56)
#define F64(d) F8(d, 0), F8(d, 8), F8(d, 16), F8(d, 24), F8(d, 32), F8(d, 40), F8(d, 48), F8(d, 56)
#define ACC64                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43," \
    "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define ACC68                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43," \
    "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64," \
    "%65,%66,%67}"

/* S (64x128) += Q (64x32, smem) K^T (32x128, smem). INT8: s32 accumulators. */
static __device__ __forceinline__ void wgmma_qk_s8(int (&d)[64], uint64_t da, uint64_t db,
                                                   int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " ACC64 ", %64, %65, p;\n}\n"
        : R64(d)
        : "l"(da), "l"(db), "r"(acc));
}
/* The same with E4M3 codes (fp8 method): f32 accumulators. */
static __device__ __forceinline__ void wgmma_qk_e4m3(float (&d)[64], uint64_t da, uint64_t db,
                                                     int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ACC64 ", %64, %65, p, 1, 1;\n}\n"
        : F64(d)
        : "l"(da), "l"(db), "r"(acc));
}
/* O_j (64x128) += P (64x32, registers) V (32x128, smem V^T). */
static __device__ __forceinline__ void wgmma_pv(float (&d)[64], const uint32_t *a, uint64_t db,
                                                int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ACC64
        ", {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
        : F64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
/* The same with eight more B rows (the ones block): columns 128..135 hold
 * the row sums of the decoded P codes. */
static __device__ __forceinline__ void wgmma_pv_ones(float (&d)[68], const uint32_t *a,
                                                     uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %73, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n136k32.f32.e4m3.e4m3 " ACC68
        ", {%68,%69,%70,%71}, %72, p, 1, 1;\n}\n"
        : F64(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* The PV product for one half of the channels (64) and, for the high half
 * with ExpCast, the eight ones rows after it (n72). */
#define ACC32                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define ACC36                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}"
#define F32(d) F8(d, 0), F8(d, 8), F8(d, 16), F8(d, 24)
static __device__ __forceinline__ void wgmma_pv64(float (&d)[36], const uint32_t *a, uint64_t db,
                                                  int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " ACC32
        ", {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
        : F32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
static __device__ __forceinline__ void wgmma_pv72(float (&d)[36], const uint32_t *a, uint64_t db,
                                                  int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 " ACC36
        ", {%36,%37,%38,%39}, %40, p, 1, 1;\n}\n"
        : F32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
static __device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                                 uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

/* ------------------------------------------------------------ versions */
template <int VER>
struct ws_ver {
    enum {
        STAGES = VER >= 2 ? 4 : 2,
        OVERLAP = VER == 1 || VER == 3,
        FAST = VER >= 2, /* the conversion-free softmax, mu in shared memory */
        FUSED = VER >= 4, /* one FMA per score before the rounding */
        PINGPONG = VER == 5 || VER == 6,
        SHORT_CHAINS = VER >= 6,
        NCW = VER == 7 ? 3 : 2, /* consumer warpgroups of 64 query rows */
        HALVES = VER == 3 || VER == 7, /* PV in two 64-channel halves */
        ROWS = 64 * NCW,
        THREADS = 128 * (NCW + 1),
        /* registers per consumer thread after setmaxnreg: all of the file
         * (64K) minus the producer's 128 x 24, in multiples of 8 */
        CREGS = NCW == 2 ? 240 : 160,
    };
};

/* ------------------------------------------------------------ consumer */
typedef struct ws_params {
    qvc_ops ops;
    qvc_attn_args a;
} ws_params;

/* Issue S = Q K^T of the tile at k_addr (4 k-steps of 32 channels). */
template <int FMT, typename SACC>
static __device__ __forceinline__ void issue_qk(SACC (&s)[64], uint64_t qd, uint32_t k_addr) {
    const uint64_t kd = sw128_desc(k_addr);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        /* +32 bytes per k-step inside the swizzled 128-byte row */
        if (FMT == QVC_QK_INT8)
            wgmma_qk_s8(*(int(*)[64])s, qd + 2 * kk, kd + 2 * kk, kk);
        else
            wgmma_qk_e4m3(*(float(*)[64])s, qd + 2 * kk, kd + 2 * kk, kk);
    }
    wg_commit();
}

/* Issue O_j = P V of the tile at descriptor vd (4 k-steps of 32 keys); with
 * ExpCast the n136 form whose columns 128..135 are the decoded row sums. */
template <int EXPCAST>
static __device__ __forceinline__ void issue_pv(float (&part)[EXPCAST ? 68 : 64],
                                                const uint32_t (&pa)[4][4], uint64_t vd) {
    wg_fence();
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        if (EXPCAST)
            wgmma_pv_ones(*(float(*)[68])part, pa[c], vd + 2 * c, c);
        else
            wgmma_pv(*(float(*)[64])part, pa[c], vd + 2 * c, c);
    }
    wg_commit();
}

/* ---- ws0/ws1 softmax: float scores, then float max ---- */
template <int FMT, typename SACC>
static __device__ __forceinline__ void scale_scores(const SACC (&acc)[64], float (&s)[16][4],
                                                    float f, int key0, int nk, int tig) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = (float)acc[nt * 4 + e] * f;
    if (key0 + WS_KEYS > nk) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
            const int key = key0 + nt * 8 + 2 * tig;
            if (key >= nk) s[nt][0] = s[nt][2] = -INFINITY;
            if (key + 1 >= nk) s[nt][1] = s[nt][3] = -INFINITY;
        }
    }
}

/* Raise the running max of both rows to mx; rescale O and l (VC Eq. 1).
 * skip_same: leave O alone when no row of the warp moved (alpha == 1
 * exactly, so the result is the same). */
static __device__ __forceinline__ void raise_max(float *mx, float *m, float *l, float (&o)[64],
                                                 int skip_same) {
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        alpha[r] = (mx[r] > m[r] && m[r] != -INFINITY) ? exp2f(m[r] - mx[r]) : 1.0f;
        l[r] *= alpha[r];
        m[r] = fmaxf(m[r], mx[r]);
    }
    if (skip_same && !__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        o[n * 4 + 0] *= alpha[0], o[n * 4 + 1] *= alpha[0];
        o[n * 4 + 2] *= alpha[1], o[n * 4 + 3] *= alpha[1];
    }
}

static __device__ __forceinline__ void online_max(const float (&s)[16][4], float *m, float *l,
                                                  float (&o)[64]) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    mx[0] = qvc_quad_max(mx[0]);
    mx[1] = qvc_quad_max(mx[1]);
    raise_max(mx, m, l, o, 0);
}

/* ---- ws2/ws3 softmax: integers until the max is known ---- */
/* The conversion-free pieces (INT32 -> FP32 by the magic add, ExpCast
 * rounded by the magic add) live in src/expcast_magic.h, shared with their
 * CPU test tests/test_expcast_magic.c. */
static __device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
/* ExpCast (VC Eq. 7) of u = s - m as float bits whose low byte is the
 * E4M3 code: the reference's t = fma(8, u, 119.65), rounded by the magic
 * add (equal to qvc_expcast_code on every u <= 0: tests/test_expcast_magic.c). */
static __device__ __forceinline__ uint32_t expcast_bits(float u) {
    return qvi_expcast_bits(qvi_expcast_t(u));
}
/* Low bytes of four words -> one word (3 PRMT). */
static __device__ __forceinline__ uint32_t pack_low_bytes(uint32_t a, uint32_t b, uint32_t c,
                                                          uint32_t d) {
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

/* Row max of the raw INT32 scores (masked keys pushed below any real
 * score), times f: equal to the max of the scaled floats, since x -> x*f is
 * monotone for f > 0. */
template <int TREE>
static __device__ __forceinline__ void int_row_max(int (&acc)[64], float f, int key0, int nk,
                                                   int tig, float *mx) {
    if (key0 + WS_KEYS > nk) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
            const int key = key0 + nt * 8 + 2 * tig;
            if (key >= nk) acc[nt * 4 + 0] = acc[nt * 4 + 2] = -(1 << 22) + 1;
            if (key + 1 >= nk) acc[nt * 4 + 1] = acc[nt * 4 + 3] = -(1 << 22) + 1;
        }
    }
    int m0, m1;
    if (TREE) {
        int a0[4], a1[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            a0[q] = max(acc[q * 4 + 0], acc[q * 4 + 1]);
            a1[q] = max(acc[q * 4 + 2], acc[q * 4 + 3]);
        }
#pragma unroll
        for (int nt = 4; nt < 16; ++nt) {
            a0[nt & 3] = max(a0[nt & 3], max(acc[nt * 4 + 0], acc[nt * 4 + 1]));
            a1[nt & 3] = max(a1[nt & 3], max(acc[nt * 4 + 2], acc[nt * 4 + 3]));
        }
        m0 = max(max(a0[0], a0[1]), max(a0[2], a0[3]));
        m1 = max(max(a1[0], a1[1]), max(a1[2], a1[3]));
    } else {
        m0 = acc[0], m1 = acc[2];
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
            m0 = max(m0, max(acc[nt * 4 + 0], acc[nt * 4 + 1]));
            m1 = max(m1, max(acc[nt * 4 + 2], acc[nt * 4 + 3]));
        }
    }
    m0 = max(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = max(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = max(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = max(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    mx[0] = (float)m0 * f;
    mx[1] = (float)m1 * f;
}

/* P codes of one block from the raw scores: pa[c] is the A fragment of
 * keys 32c..32c+31 (qvc_pack_p32's order). */
template <int EXPCAST>
static __device__ __forceinline__ void make_p(const int (&acc)[64], float f, float m0, float m1,
                                              int key0, int nk, int tig, float *rs,
                                              uint32_t (&pa)[4][4]) {
    const int masked = key0 + WS_KEYS > nk;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        float sv[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int nt = 4 * c + i;
                float x = __fmul_rn(qvi_i2f_magic(acc[nt * 4 + e]), f);
                if (masked && key0 + nt * 8 + 2 * tig + (e & 1) >= nk) x = -INFINITY;
                sv[i][e] = __fsub_rn(x, (e < 2) ? m0 : m1);
            }
        if (EXPCAST) {
            pa[c][0] = pack_low_bytes(expcast_bits(sv[0][0]), expcast_bits(sv[0][1]),
                                      expcast_bits(sv[1][0]), expcast_bits(sv[1][1]));
            pa[c][1] = pack_low_bytes(expcast_bits(sv[0][2]), expcast_bits(sv[0][3]),
                                      expcast_bits(sv[1][2]), expcast_bits(sv[1][3]));
            pa[c][2] = pack_low_bytes(expcast_bits(sv[2][0]), expcast_bits(sv[2][1]),
                                      expcast_bits(sv[3][0]), expcast_bits(sv[3][1]));
            pa[c][3] = pack_low_bytes(expcast_bits(sv[2][2]), expcast_bits(sv[2][3]),
                                      expcast_bits(sv[3][2]), expcast_bits(sv[3][3]));
        } else {
            float p[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    p[i][e] = ex2_ftz(__fadd_rn(sv[i][e], QVC_P_AMP));
                    rs[e >> 1] += p[i][e];
                }
#define CVT2(x, y) \
    ((uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3))
            pa[c][0] = CVT2(p[0][0], p[0][1]) | (CVT2(p[1][0], p[1][1]) << 16);
            pa[c][1] = CVT2(p[0][2], p[0][3]) | (CVT2(p[1][2], p[1][3]) << 16);
            pa[c][2] = CVT2(p[2][0], p[2][1]) | (CVT2(p[3][0], p[3][1]) << 16);
            pa[c][3] = CVT2(p[2][2], p[2][3]) | (CVT2(p[3][2], p[3][3]) << 16);
#undef CVT2
        }
    }
}

/* ws4: the same codes from one FMA per score (see the header).  MASK: the
 * block holds padding keys (only the last one can). */
template <int EXPCAST, int MASK, int SPLIT_SUM>
static __device__ __forceinline__ void make_p_fused(const int (&acc)[64], float f, float m0,
                                                    float m1, int key0, int nk, int tig,
                                                    float *rs, uint32_t (&pa)[4][4]) {
    const float fm = EXPCAST ? 8.0f * f : f;
    const float c0 = EXPCAST ? qvi_expcast_c(m0) : __fsub_rn(QVC_P_AMP, m0);
    const float c1 = EXPCAST ? qvi_expcast_c(m1) : __fsub_rn(QVC_P_AMP, m1);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        float t[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int nt = 4 * c + i;
                float x = qvi_i2f_magic(acc[nt * 4 + e]);
                if (MASK && key0 + nt * 8 + 2 * tig + (e & 1) >= nk) x = -INFINITY;
                t[i][e] = __fmaf_rn(x, fm, (e < 2) ? c0 : c1);
            }
        if (EXPCAST) {
#define EB(i, e) qvi_expcast_bits(t[i][e])
            pa[c][0] = pack_low_bytes(EB(0, 0), EB(0, 1), EB(1, 0), EB(1, 1));
            pa[c][1] = pack_low_bytes(EB(0, 2), EB(0, 3), EB(1, 2), EB(1, 3));
            pa[c][2] = pack_low_bytes(EB(2, 0), EB(2, 1), EB(3, 0), EB(3, 1));
            pa[c][3] = pack_low_bytes(EB(2, 2), EB(2, 3), EB(3, 2), EB(3, 3));
#undef EB
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) t[i][e] = ex2_ftz(t[i][e]);
            if (SPLIT_SUM) { /* 4 independent adds per row, then 2 levels */
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    rs[r] += (t[0][2 * r] + t[0][2 * r + 1]) + (t[1][2 * r] + t[1][2 * r + 1]) +
                             ((t[2][2 * r] + t[2][2 * r + 1]) + (t[3][2 * r] + t[3][2 * r + 1]));
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) rs[e >> 1] += t[i][e];
            }
#define CVT2(x, y) \
    ((uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3))
            pa[c][0] = CVT2(t[0][0], t[0][1]) | (CVT2(t[1][0], t[1][1]) << 16);
            pa[c][1] = CVT2(t[0][2], t[0][3]) | (CVT2(t[1][2], t[1][3]) << 16);
            pa[c][2] = CVT2(t[2][0], t[2][1]) | (CVT2(t[3][0], t[3][1]) << 16);
            pa[c][3] = CVT2(t[2][2], t[2][3]) | (CVT2(t[3][2], t[3][3]) << 16);
#undef CVT2
        }
    }
}

/* O += part * vb for the 16-column slice n0..n0+NN of O. */
template <int NN, int N>
static __device__ __forceinline__ void add_part(float (&o)[64], const float (&part)[N], int n0,
                                                float vb) {
#pragma unroll
    for (int n = 0; n < NN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[(n0 + n) * 4 + e] = __fmaf_rn(part[n * 4 + e], vb, o[(n0 + n) * 4 + e]);
}

/* V-Smooth rank-1 restore r_ij mu_j (VC Eq. 6), mu from the stage in
 * shared memory (a quad reads 4 distinct float2: no bank conflict). */
static __device__ __forceinline__ void restore_mu(float (&o)[64], const float *rs,
                                                  const float *mu, int tig) {
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        const float2 mu2 = *(const float2 *)(mu + n * 8 + 2 * tig);
        o[n * 4 + 0] = __fmaf_rn(rs[0], mu2.x, o[n * 4 + 0]);
        o[n * 4 + 1] = __fmaf_rn(rs[0], mu2.y, o[n * 4 + 1]);
        o[n * 4 + 2] = __fmaf_rn(rs[1], mu2.x, o[n * 4 + 2]);
        o[n * 4 + 3] = __fmaf_rn(rs[1], mu2.y, o[n * 4 + 3]);
    }
}

template <int FMT, int EXPCAST, int VER>
__global__ void __launch_bounds__(ws_ver<VER>::THREADS, 1)
attn_qk8_pv8_ws_128x128(const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const ws_params p) {
    typedef ws_ver<VER> V;
    const int STAGES = V::STAGES, NCW = V::NCW, ROWS = V::ROWS;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const uint32_t bar_q = base + WS_BAR_OFF(NCW, STAGES);
    const uint32_t bar_full = bar_q + 8, bar_empty = bar_q + 8 + 8 * STAGES;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;
    const float *vmu = ops.v_mu ? ops.v_mu + (size_t)bh * nblk * 128 : NULL;
    const int mu_smem = V::FAST && vmu;

    /* The ones rows after each V tile never change: write them once. */
    for (int i = threadIdx.x; i < STAGES * WS_ONES / 4; i += V::THREADS)
        *(uint32_t *)(sm + WS_ONES_OFF(NCW, i / (WS_ONES / 4)) + 4 * (i % (WS_ONES / 4))) = 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bar_full + 8 * s, 1);
            mbar_init(bar_empty + 8 * s, NCW * 128); /* every consumer thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
        if (threadIdx.x == 0) {
            mbar_expect_tx(bar_q, WS_QB(NCW));
            tma_load_2d(base + WS_Q_OFF, &tq, 0, bh * ops.nq_pad + tile * ROWS, bar_q);
            for (int j = 0; j < nblk; ++j) {
                const int s = j % STAGES;
                const uint32_t full = bar_full + 8 * s;
                mbar_wait(bar_empty + 8 * s, ((j / STAGES) & 1) ^ 1);
                mbar_expect_tx(full, 2 * WS_TILE + (mu_smem ? 512 : 0));
                tma_load_2d(base + WS_K_OFF(NCW, s), &tk, 0, bh * ops.nk_pad + j * WS_KEYS, full);
                tma_load_2d(base + WS_V_OFF(NCW, s), &tv, 0, (bh * nblk + j) * 128, full);
                if (mu_smem) bulk_load(base + WS_MU_OFF(NCW, s), vmu + (size_t)j * 128, 512, full);
            }
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)ws_ver<VER>::CREGS));
    typedef typename std::conditional<FMT == QVC_QK_INT8, int, float>::type sacc_t;
    const int ctid = threadIdx.x - 128, cw = ctid >> 7; /* consumer warpgroup 0..NCW-1 */
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    const qvc_attn_args &a = p.a;
    const uint64_t qd = sw128_desc(base + WS_Q_OFF + cw * 64 * 128);
    /* INT8 Q scales are per 128 rows; a 192-row tile spans two blocks, and
     * its last warpgroup can lie past nq_pad (computed, never stored) */
    const int qblocks = ops.nq_pad / 128;
    const float dq = ops.q_scale[(size_t)bh * qblocks + min((tile * ROWS + cw * 64) / 128, qblocks - 1)];
    const float *kscale = ops.k_scale + (size_t)bh * nblk;
    const float *vblk = ops.v_blk + (size_t)bh * nblk;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    sacc_t sacc[64], snext[V::OVERLAP ? 64 : 1];

    mbar_wait(bar_q, 0);
    mbar_wait(bar_full, 0);
    issue_qk<FMT>(sacc, qd, base + WS_K_OFF(NCW, 0));
    wg_wait<0>();
    reg_fence(sacc);

    if (V::PINGPONG && FMT == QVC_QK_INT8) {
        /* ping-pong: warpgroup cw issues its GEMMs after barrier 1 + cw and
         * then lets the other one go (barrier 2 - cw); warpgroup 0 first */
        if (cw == 1) named_arrive(1, 256);
        for (int j = 0; j < nblk; ++j) {
            const int s = j % STAGES, sn = (j + 1) % STAGES, more = j + 1 < nblk;
            const float f = (dq * kscale[j]) * a.scale_log2;
            const float vb = vblk[j];
            int(&ia)[64] = *(int(*)[64])sacc;
            uint32_t pa[4][4];
            float rs[2] = {0.0f, 0.0f};
            float mx[2];
            int_row_max<V::SHORT_CHAINS>(ia, f, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], m[0]);
            mx[1] = fmaxf(mx[1], m[1]);
            raise_max(mx, m, l, o, 1);
            if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            if (!EXPCAST) {
                rs[0] = qvc_quad_sum(rs[0]);
                rs[1] = qvc_quad_sum(rs[1]);
            }
            if (more) mbar_wait(bar_full + 8 * sn, ((j + 1) / STAGES) & 1);

            named_sync(1 + cw, 256);
            float part[EXPCAST ? 68 : 64];
            const uint64_t vd = sw128_desc(base + WS_V_OFF(NCW, s));
            issue_pv<EXPCAST>(part, pa, vd);
            /* Always issued, so that no wgmma sits on a divergent path (ptxas
             * would serialize them); after the last block it re-reads this
             * block's K tile and the result is dropped. */
            issue_qk<FMT>(sacc, qd, base + WS_K_OFF(NCW, more ? sn : s));
            named_arrive(2 - cw, 256);

            wg_wait<1>(); /* PV of block j; QK of j+1 still running */
            reg_fence(part);
            if (EXPCAST) rs[0] = part[64], rs[1] = part[66];
            add_part<16>(o, part, 0, vb);
            if (mu_smem) restore_mu(o, rs, (const float *)(sm + WS_MU_OFF(NCW, s)), tig);
            mbar_arrive(bar_empty + 8 * s);
            l[0] += rs[0];
            l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
        if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
    } else
    for (int j = 0; j < nblk; ++j) {
        const int s = j % STAGES;
        const int sn = (j + 1) % STAGES;
        if (V::OVERLAP && j + 1 < nblk) {
            /* QK of the next block runs while this block's P is made */
            mbar_wait(bar_full + 8 * sn, ((j + 1) / STAGES) & 1);
            issue_qk<FMT>(*(sacc_t(*)[64])snext, qd, base + WS_K_OFF(NCW, sn));
        }
        const float f = (dq * kscale[j]) * a.scale_log2;
        const float vb = vblk[j];
        uint32_t pa[4][4];
        float rs[2] = {0.0f, 0.0f};
        if (V::FAST && FMT == QVC_QK_INT8) {
            float mx[2];
            int_row_max<0>(*(int(*)[64])sacc, f, j * WS_KEYS, ops.nk, tig, mx);
            mx[0] = fmaxf(mx[0], m[0]);
            mx[1] = fmaxf(mx[1], m[1]);
            raise_max(mx, m, l, o, 1);
            int(&ia)[64] = *(int(*)[64])sacc;
            if (!V::FUSED)
                make_p<EXPCAST>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            else if ((j + 1) * WS_KEYS > ops.nk)
                make_p_fused<EXPCAST, 1, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
            else
                make_p_fused<EXPCAST, 0, V::SHORT_CHAINS>(ia, f, m[0], m[1], j * WS_KEYS, ops.nk, tig, rs, pa);
        } else {
            float sc[16][4];
            scale_scores<FMT>(sacc, sc, f, j * WS_KEYS, ops.nk, tig);
            online_max(sc, m, l, o);
            const float mr0 = m[0] == -INFINITY ? 0.0f : m[0];
            const float mr1 = m[1] == -INFINITY ? 0.0f : m[1];
#pragma unroll
            for (int c = 0; c < 4; ++c) qvc_pack_p32(&sc[4 * c], mr0, mr1, EXPCAST, rs, pa[c]);
        }

        if (!EXPCAST) {
            rs[0] = qvc_quad_sum(rs[0]);
            rs[1] = qvc_quad_sum(rs[1]);
        }
        const uint32_t v_addr = base + WS_V_OFF(NCW, s);
        const float *mu_s = (const float *)(sm + WS_MU_OFF(NCW, s));
        if (V::HALVES) {
            /* PV in two channel halves: 36 accumulators live, not 68 */
            float part[36];
            const uint64_t vlo = sw128_desc(v_addr), vhi = sw128_desc(v_addr + 64 * 128);
            wg_fence();
#pragma unroll
            for (int c = 0; c < 4; ++c) wgmma_pv64(part, pa[c], vlo + 2 * c, c);
            wg_commit();
            wg_wait<0>(); /* this half, and QK of the next block */
            reg_fence(part);
            add_part<8>(o, part, 0, vb);
            wg_fence();
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                if (EXPCAST)
                    wgmma_pv72(part, pa[c], vhi + 2 * c, c);
                else
                    wgmma_pv64(part, pa[c], vhi + 2 * c, c);
            }
            wg_commit();
            wg_wait<0>();
            reg_fence(part);
            if (EXPCAST) rs[0] = part[32], rs[1] = part[34];
            add_part<8>(o, part, 8, vb);
            if (mu_smem) restore_mu(o, rs, mu_s, tig);
            /* mu and the tiles are read: the producer may refill the stage */
            mbar_arrive(bar_empty + 8 * s);
        } else {
            float part[EXPCAST ? 68 : 64];
            const uint64_t vd = sw128_desc(v_addr);
            issue_pv<EXPCAST>(part, pa, vd);
            wg_wait<0>(); /* PV of this block, and QK of the next if issued */
            reg_fence(part);
            if (EXPCAST) rs[0] = part[64], rs[1] = part[66]; /* any column: the same sum */
            if (V::FAST) {
                add_part<16>(o, part, 0, vb);
                if (mu_smem) restore_mu(o, rs, mu_s, tig);
                mbar_arrive(bar_empty + 8 * s);
            } else {
                mbar_arrive(bar_empty + 8 * s);
                const float *mu = vmu ? vmu + (size_t)j * 128 : NULL;
#pragma unroll
                for (int n = 0; n < 16; ++n) {
                    const int col = n * 8 + 2 * tig;
                    const float mu0 = mu ? __ldg(mu + col) : 0.0f;
                    const float mu1 = mu ? __ldg(mu + col + 1) : 0.0f;
                    o[n * 4 + 0] += part[n * 4 + 0] * vb;
                    o[n * 4 + 1] += part[n * 4 + 1] * vb;
                    o[n * 4 + 2] += part[n * 4 + 2] * vb;
                    o[n * 4 + 3] += part[n * 4 + 3] * vb;
                    if (mu) {
                        o[n * 4 + 0] += rs[0] * mu0;
                        o[n * 4 + 1] += rs[0] * mu1;
                        o[n * 4 + 2] += rs[1] * mu0;
                        o[n * 4 + 3] += rs[1] * mu1;
                    }
                }
            }
        }
        l[0] += rs[0];
        l[1] += rs[1];

        if (j + 1 < nblk) {
            if (V::OVERLAP) {
                reg_fence(snext);
#pragma unroll
                for (int i = 0; i < 64; ++i) sacc[i] = snext[V::OVERLAP ? i : 0];
            } else {
                mbar_wait(bar_full + 8 * sn, ((j + 1) / STAGES) & 1);
                issue_qk<FMT>(sacc, qd, base + WS_K_OFF(NCW, sn));
                wg_wait<0>();
                reg_fence(sacc);
            }
        }
    }

    /* ---- epilogue: out = O * chan_scale / l, LSE ---- */
    const int b = bh / a.H, h = bh % a.H;
    const float amp = EXPCAST ? 8.0f : QVC_P_AMP;
    const float *cs = ops.v_chan + (size_t)bh * 128;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = tile * ROWS + cw * 64 + warp * 16 + g + 8 * r;
        if (row >= ops.nq) continue;
        const int empty = m[r] == -INFINITY || !(l[r] > 0.0f);
        const float inv = empty ? 0.0f : 1.0f / l[r];
        const int64_t ob = b * a.osb + h * a.osh + (int64_t)row * a.osn;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = n * 8 + 2 * tig;
            const float2 c2 = __ldg((const float2 *)(cs + col));
            qvc_store_out2(a.out, a.out_dtype, ob + col, o[n * 4 + 2 * r] * c2.x * inv,
                           o[n * 4 + 2 * r + 1] * c2.y * inv);
        }
        if (a.lse && tig == 0) {
            float lse = empty ? -INFINITY : (m[r] + log2f(l[r]) - amp) * 0.69314718055994531f;
            /* K smoothing shifted every score of the row by q.kmean*sm_scale:
             * add it back, as the CPU does (-inf stays -inf) */
            if (a.lse_shift) lse = __fadd_rn(lse, a.lse_shift[(size_t)bh * ops.nq + row]);
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] = lse;
        }
    }
}

/* ------------------------------------------------------------ host */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static encode_tiled_fn get_encode_tiled(void) {
    static encode_tiled_fn fn = NULL;
    if (!fn) {
        void *ptr = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (encode_tiled_fn)ptr;
        else
            cudaGetLastError();
    }
    return fn;
}

/* A [rows][128] byte matrix read as box_rows x 128 tiles, 128-byte swizzle. */
static qva_status make_map(CUtensorMap *map, const void *data, uint64_t rows, uint32_t box_rows) {
    encode_tiled_fn enc = get_encode_tiled();
    if (!enc) return qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled is not available");
    const cuuint64_t dims[2] = {128, rows}, strides[1] = {128};
    const cuuint32_t box[2] = {128, box_rows}, estr[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)data, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? QVA_OK
                             : qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled failed (%d)", (int)r);
}

template <int FMT, int EXPCAST, int VER>
static qva_status launch_ws(const CUtensorMap *m, const ws_params *p, cudaStream_t st) {
    typedef ws_ver<VER> V;
    const int smem = WS_SMEM_BYTES(V::NCW, V::STAGES);
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const ws_params) =
        attn_qk8_pv8_ws_128x128<FMT, EXPCAST, VER>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn_qk8_pv8_ws smem attribute");
    dim3 grid((unsigned)((p->ops.nq_pad + V::ROWS - 1) / V::ROWS), (unsigned)p->ops.BH);
    k<<<grid, V::THREADS, smem, st>>>(m[0], m[1], m[2], *p);
    return qvc_launch_check("attn_qk8_pv8_ws");
}

template <int VER>
static qva_status launch_int8(const CUtensorMap *m, const ws_params *p, int expcast,
                              cudaStream_t st) {
    return expcast ? launch_ws<QVC_QK_INT8, 1, VER>(m, p, st)
                   : launch_ws<QVC_QK_INT8, 0, VER>(m, p, st);
}

extern "C" qva_status qvc_attn_qk8_pv8_ws(const qvc_ops *ops, qvc_qk_format fmt,
                                          const qvc_attn_args *a, int version, cudaStream_t st) {
    if (ops->D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_qk8_pv8_ws: head dim %d (128 only)", ops->D);
    if (version < 0 || version > 7)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn_qk8_pv8_ws: no version %d", version);
    CUtensorMap maps[3];
    qva_status r;
    const uint32_t q_box = fmt == QVC_QK_INT8 && version == 7 ? 192 : 128; /* ws_ver::ROWS */
    if ((r = make_map(&maps[0], ops->q_i8, (uint64_t)ops->BH * ops->nq_pad, q_box)) != QVA_OK ||
        (r = make_map(&maps[1], ops->k_i8, (uint64_t)ops->BH * ops->nk_pad, 128)) != QVA_OK ||
        (r = make_map(&maps[2], ops->v_t, (uint64_t)ops->BH * ops->nblk * 128, 128)) != QVA_OK)
        return r;
    ws_params p;
    p.ops = *ops;
    p.a = *a;
    const int ec = a->expcast != 0;
    if (fmt == QVC_QK_E4M3) /* the fp8 method: ws0 only */
        return ec ? launch_ws<QVC_QK_E4M3, 1, 0>(maps, &p, st)
                  : launch_ws<QVC_QK_E4M3, 0, 0>(maps, &p, st);
    switch (version) {
    case 0: return launch_int8<0>(maps, &p, ec, st);
    case 1: return launch_int8<1>(maps, &p, ec, st);
    case 2: return launch_int8<2>(maps, &p, ec, st);
    case 3: return launch_int8<3>(maps, &p, ec, st);
    case 4: return launch_int8<4>(maps, &p, ec, st);
    case 5: return launch_int8<5>(maps, &p, ec, st);
    case 6: return launch_int8<6>(maps, &p, ec, st);
    default: return launch_int8<7>(maps, &p, ec, st);
    }
}
