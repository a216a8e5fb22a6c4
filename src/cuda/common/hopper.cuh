/*
 * Hopper building blocks shared by the warp-specialized kernels
 * (dense/attn8_ws_128x128.cu, draft/attn_draft_ws_128x128.cu, and the
 * versions in dev/cuda): mbarrier / TMA / wgmma PTX wrappers, the
 * 128-byte-swizzle descriptors, the INT8 QK and E4M3 PV wgmma forms, the
 * 8-bit P codes from the S accumulators, and the host tensor-map encoder.
 */
#ifndef QVATTN_HOPPER_CUH
#define QVATTN_HOPPER_CUH

#include <cuda.h>

#include "attn_common.cuh"
#include "softmax.cuh"
#include "expcast_magic.h"

#define WS_KEYS 128   /* keys per block */

/* ------------------------------------------------------------ PTX wrappers */
static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* A word of shared memory by its address; asm volatile with a memory
 * clobber, so neither moves across an mbarrier arrive or wait. */
static __device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
static __device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
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
/* 16 bytes from global to shared memory through L2 (cp.async.cg), zeros
 * when !valid (no byte is read then). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
/* One arrival on bar once every earlier cp.async of this thread has
 * landed; it is one of the arrivals bar was initialized to expect. */
static __device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
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
 * asynchronous wgmma window.  Each type keeps its own register class: a
 * "+r" fence on a float made NVVM emit f32<->b32 movs, which it was free
 * to hoist above the wgmma.wait_group -- non-wgmma reads of accumulators
 * inside the pipeline stage, which is what made ptxas serialize the
 * wgmmas (C7514) of the overlapped draft versions. */
static __device__ __forceinline__ void reg_fence1(float &x) {
    asm volatile("" : "+f"(x)::"memory");
}
static __device__ __forceinline__ void reg_fence1(uint32_t &x) {
    asm volatile("" : "+r"(x)::"memory");
}
static __device__ __forceinline__ void reg_fence1(int &x) {
    asm volatile("" : "+r"(x)::"memory");
}
template <typename T, int N>
static __device__ __forceinline__ void reg_fence(T (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence1(r[i]);
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

#define F32(d) F8(d, 0), F8(d, 8), F8(d, 16), F8(d, 24)
#define ACC32                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define ACC36                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}"

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

/* Head dim 64: O_j (64x64) += P (64x32) V (32x64), and the n72 form
 * whose columns 64..71 are the row sums (the ones rows at B row 64). */
static __device__ __forceinline__ void wgmma_pv_n64(float (&d)[32], const uint32_t *a, uint64_t db,
                                                    int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " ACC32
        ", {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
        : F32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
static __device__ __forceinline__ void wgmma_pv_ones_n72(float (&d)[36], const uint32_t *a,
                                                         uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 " ACC36
        ", {%36,%37,%38,%39}, %40, p, 1, 1;\n}\n"
        : F32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* The same with P in E5M2 (+expcast-e5m2): V and its ones rows stay E4M3. */
static __device__ __forceinline__ void wgmma_pv_ones_p5(float (&d)[68], const uint32_t *a,
                                                        uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %73, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n136k32.f32.e5m2.e4m3 " ACC68
        ", {%68,%69,%70,%71}, %72, p, 1, 1;\n}\n"
        : F64(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* +i8pv: O_j (64x144) += P (64x32 u8 codes, registers) V (32x144 s8:
 * smem V^T, the eight ones rows, then eight rows of the stage's K tile,
 * whose columns 136..143 nobody reads), exact s32: columns 128..135 hold
 * the rows' code sums.  (Integer wgmma has no n136.) */
#define ACC72                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22," \
    "%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43," \
    "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64," \
    "%65,%66,%67,%68,%69,%70,%71}"
static __device__ __forceinline__ void wgmma_pv_u8_ones(int (&d)[72], const uint32_t *a,
                                                        uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %77, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n144k32.s32.u8.s8 " ACC72
        ", {%72,%73,%74,%75}, %76, p;\n}\n"
        : R64(d), R8(d, 64)
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

/* S = Q K^T over KSTEPS k-steps of 32 bytes: 4 at head dim 128, 2 at 64
 * (the tiles' second halves are never read). */
template <int FMT, int KSTEPS = 4, typename SACC>
static __device__ __forceinline__ void issue_qk(SACC (&s)[64], uint64_t qd, uint32_t k_addr) {
    static_assert(KSTEPS == 2 || KSTEPS == 4, "head dim 64 or 128");
    const uint64_t kd = sw128_desc(k_addr);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        /* +32 bytes per k-step inside the swizzled 128-byte row */
        if (FMT == QVC_QK_INT8)
            wgmma_qk_s8(*(int(*)[64])s, qd + 2 * kk, kd + 2 * kk, kk);
        else
            wgmma_qk_e4m3(*(float(*)[64])s, qd + 2 * kk, kd + 2 * kk, kk);
    }
    wg_commit();
}

/* The partial's registers per thread: D / 2 (O's columns), and 4 more
 * where the ones rows give the row sums (EXPCAST: any path with them). */
#define PV_REGS(D, EXPCAST) ((D) / 2 + ((EXPCAST) ? 4 : 0))

/* The 4 k-steps (32 keys each) of O_j = P V for the tile at descriptor vd,
 * the first starting the partial; with ExpCast the n136 (head dim 64:
 * n72) form whose last 8 columns are the decoded row sums. */
template <int EXPCAST, int P5 = 0, int D = 128>
static __device__ __forceinline__ void pv_wgmmas(float (&part)[PV_REGS(D, EXPCAST)],
                                                 const uint32_t (&pa)[4][4], uint64_t vd) {
    static_assert(!P5 || EXPCAST, "E5M2 P comes with the ones rows");
    static_assert(D == 128 || (D == 64 && !P5), "head dim 64 (E4M3 P) or 128");
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        if constexpr (D == 64) {
            if (EXPCAST)
                wgmma_pv_ones_n72(*(float(*)[36])part, pa[c], vd + 2 * c, c);
            else
                wgmma_pv_n64(*(float(*)[32])part, pa[c], vd + 2 * c, c);
        } else if (P5)
            wgmma_pv_ones_p5(*(float(*)[68])part, pa[c], vd + 2 * c, c);
        else if (EXPCAST)
            wgmma_pv_ones(*(float(*)[68])part, pa[c], vd + 2 * c, c);
        else
            wgmma_pv(*(float(*)[64])part, pa[c], vd + 2 * c, c);
    }
}

/* Issue O_j = P V (one commit group); P5: P's codes are E5M2. */
template <int EXPCAST, int P5 = 0, int D = 128>
static __device__ __forceinline__ void issue_pv(float (&part)[PV_REGS(D, EXPCAST)],
                                                const uint32_t (&pa)[4][4], uint64_t vd) {
    wg_fence();
    pv_wgmmas<EXPCAST, P5, D>(part, pa, vd);
    wg_commit();
}

/* issue_pv with V in two E4M3 digits (QVA_V_E4M3X2): the hi tile's
 * product, then the lo tile's into the same partial, one commit group.
 * The lo product takes the n128 form, so that the ones rows count the P
 * codes once. */
template <int EXPCAST>
static __device__ __forceinline__ void issue_pv_digits(float (&part)[EXPCAST ? 68 : 64],
                                                       const uint32_t (&pa)[4][4], uint64_t vd,
                                                       uint64_t vd_lo) {
    wg_fence();
    pv_wgmmas<EXPCAST>(part, pa, vd);
#pragma unroll
    for (int c = 0; c < 4; ++c) wgmma_pv(*(float(*)[64])part, pa[c], vd_lo + 2 * c, 1);
    wg_commit();
}

/* Issue the +i8pv product O_j = P V (one commit group). */
static __device__ __forceinline__ void issue_pv_u8(int (&part)[72], const uint32_t (&pa)[4][4],
                                                   uint64_t vd) {
    wg_fence();
#pragma unroll
    for (int c = 0; c < 4; ++c) wgmma_pv_u8_ones(part, pa[c], vd + 2 * c, c);
    wg_commit();
}

/* ---- the E4M3 path: float scores, masked keys -inf ---- */
/* f0, f1: the score scales of the thread's rows g and g + 8. */
template <int FMT, typename SACC>
static __device__ __forceinline__ void scale_scores(const SACC (&acc)[64], float (&s)[16][4],
                                                    float f0, float f1, int key0, int nk,
                                                    int tig) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = (float)acc[nt * 4 + e] * (e < 2 ? f0 : f1);
    if (key0 + WS_KEYS > nk) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
            const int key = key0 + nt * 8 + 2 * tig;
            if (key >= nk) s[nt][0] = s[nt][2] = -INFINITY;
            if (key + 1 >= nk) s[nt][1] = s[nt][3] = -INFINITY;
        }
    }
}

/* ---- the INT8 path: integers until the max is known ---- */
/* ExpCast's code arithmetic (rounded by a magic add, clamped by the FMA's
 * saturation) lives in src/expcast_magic.h, shared with its CPU test
 * tests/test_expcast_magic.c. */
/* Low bytes of four words -> one word (3 PRMT). */
static __device__ __forceinline__ uint32_t pack_low_bytes(uint32_t a, uint32_t b, uint32_t c,
                                                          uint32_t d) {
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

/* Row max of the raw INT32 scores (masked keys pushed below any real
 * score), times the row's scale (f0 for row g, f1 for g + 8): equal to the
 * max of the scaled floats, since x -> x*f is monotone for f > 0.  FROM:
 * the caller knows the keys of column groups nt < FROM are valid. */
template <int TREE, int FROM = 0>
static __device__ __forceinline__ void int_row_max(int (&acc)[64], float f0, float f1, int key0,
                                                   int nk, int tig, float *mx) {
    if (key0 + WS_KEYS > nk) {
#pragma unroll
        for (int nt = FROM; nt < 16; ++nt) {
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
    mx[0] = (float)m0 * f0;
    mx[1] = (float)m1 * f1;
}

/* The exp2 / ExpCast arguments of chunk c (keys 32c..32c+31) of a block's
 * INT32 scores: t = x f + add, f and add per row (f0, a0 for row g; f1,
 * a1 for g + 8), x the score as a float (-inf for padding keys when MASK,
 * from column group FROM on), by ExpCast's saturating FMA where SAT. */
template <int MASK, int FROM, int SAT>
static __device__ __forceinline__ void chunk_args(const int (&acc)[64], int c, float f0, float f1,
                                                  float a0, float a1, int key0, int nk, int tig,
                                                  float (&t)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int nt = 4 * c + i;
            float x = __int2float_rn(acc[nt * 4 + e]);
            if (MASK && nt >= FROM && key0 + nt * 8 + 2 * tig + (e & 1) >= nk) x = -INFINITY;
            t[i][e] = SAT ? qvi_expcast_ts(x, (e < 2) ? f0 : f1, (e < 2) ? a0 : a1)
                          : __fmaf_rn(x, (e < 2) ? f0 : f1, (e < 2) ? a0 : a1);
        }
}

/* P codes of one block from the raw INT32 scores, one FMA per score
 * before the rounding (see attn8_ws_128x128.cu); pa[c] is the A fragment
 * of keys 32c..32c+31 (qvc_pack_p32's order).  SPLIT_SUM: the exp2 row sum
 * in 4 partial sums.  SUM = 0: no FP32 row sum (the exp2 codes' sum comes
 * from the ones row, QVA_P_SUM_CODES).  MASK: the
 * block holds padding keys (only the last one can), in column groups
 * nt >= FROM (the caller knows the others are valid).  f0, f1: the score
 * scales of rows g and g + 8 (equal with per-block query scales).
 * ec_add: ExpCast's addend 120 + beta (unused without EXPCAST).
 * ExpCast's codes come in the saturating form (qvi_expcast_ts: the FMA's
 * saturation is the clamp; the fused form's codes with one instruction
 * fewer, dev/cuda ws10).  The INT32 scores become floats by I2FP.F32.S32
 * (exact: |x| < 2^24), one instruction where the 1.5 * 2^23 magic add took
 * two (dev/cuda ws12). */
template <int EXPCAST, int MASK, int SPLIT_SUM, int SUM = 1, int FROM = 0>
static __device__ __forceinline__ void make_p_fused(const int (&acc)[64], float f0, float f1,
                                                    float m0, float m1, float ec_add, int key0,
                                                    int nk, int tig, float *rs,
                                                    uint32_t (&pa)[4][4]) {
    /* ExpCast: t / 128 = x (8f / 128) + c / 128, with c = A - 8m; EXPCAST 2
     * (+expcast-e5m2): four codes per doubling, x (4f / 128) + (A - 4m) / 128 */
    constexpr float per128 = EXPCAST == 2 ? 0.03125f : 0.0625f;
    const float fm0 = EXPCAST ? per128 * f0 : f0, fm1 = EXPCAST ? per128 * f1 : f1;
    const float c0 = EXPCAST == 2 ? 0.0078125f * qvi_expcast5_c(m0, ec_add)
                     : EXPCAST    ? 0.0078125f * qvi_expcast_c(m0, ec_add)
                                  : __fsub_rn(QVC_P_AMP, m0);
    const float c1 = EXPCAST == 2 ? 0.0078125f * qvi_expcast5_c(m1, ec_add)
                     : EXPCAST    ? 0.0078125f * qvi_expcast_c(m1, ec_add)
                                  : __fsub_rn(QVC_P_AMP, m1);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        float t[4][4];
        chunk_args<MASK, FROM, EXPCAST>(acc, c, fm0, fm1, c0, c1, key0, nk, tig, t);
        if (EXPCAST) {
#define EB(i, e) qvi_expcast_bits_sat(t[i][e])
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
            if (SUM && SPLIT_SUM) { /* 4 independent adds per row, then 2 levels */
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    rs[r] += (t[0][2 * r] + t[0][2 * r + 1]) + (t[1][2 * r] + t[1][2 * r + 1]) +
                             ((t[2][2 * r] + t[2][2 * r + 1]) + (t[3][2 * r] + t[3][2 * r + 1]));
            } else if (SUM) {
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

/* +i8pv's P codes of one block from the raw INT32 scores: u = rint(255 *
 * exp2(x f - m_b)), m_b the row's largest scaled score in this block (mb0
 * for row g, mb1 for g + 8), the rounding by the magic add 1.5 * 2^23 in
 * the FMA that scales by 255 (0 <= 255 t <= 255: the code is the word's
 * low byte); masked keys (MASK: the block holds padding keys) code 0.
 * pa[c]: keys 32c..32c+31 in the order of make_p_fused.  SUM (+fp32sum):
 * rs[0] and rs[1] (rows g, g + 8) also gather this thread's exp2 values
 * before their rounding, unscaled (the caller multiplies by 255). */
template <int MASK, int SUM>
static __device__ __forceinline__ void make_p_u8(const int (&acc)[64], float f0, float f1,
                                                 float mb0, float mb1, int key0, int nk, int tig,
                                                 float (&rs)[2], uint32_t (&pa)[4][4]) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        float a[4][4];
        uint32_t t[4][4];
        chunk_args<MASK, 0, 0>(acc, c, f0, f1, -mb0, -mb1, key0, nk, tig, a);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = ex2_ftz(a[i][e]);
                if (SUM) rs[e >> 1] += p;
                t[i][e] = __float_as_uint(__fmaf_rn(p, 255.0f, QVI_MAGIC));
            }
        pa[c][0] = pack_low_bytes(t[0][0], t[0][1], t[1][0], t[1][1]);
        pa[c][1] = pack_low_bytes(t[0][2], t[0][3], t[1][2], t[1][3]);
        pa[c][2] = pack_low_bytes(t[2][0], t[2][1], t[3][0], t[3][1]);
        pa[c][3] = pack_low_bytes(t[2][2], t[2][3], t[3][2], t[3][3]);
    }
}

/* O += part * vb over the first NN column groups of O, vb0 for row g
 * (elements 0, 1 of each quad) and vb1 for row g + 8 (elements 2, 3). */
template <int NN, int NO, int N>
static __device__ __forceinline__ void add_part(float (&o)[NO], const float (&part)[N], float vb0,
                                                float vb1) {
#pragma unroll
    for (int n = 0; n < NN; ++n) {
        o[n * 4 + 0] = __fmaf_rn(part[n * 4 + 0], vb0, o[n * 4 + 0]);
        o[n * 4 + 1] = __fmaf_rn(part[n * 4 + 1], vb0, o[n * 4 + 1]);
        o[n * 4 + 2] = __fmaf_rn(part[n * 4 + 2], vb1, o[n * 4 + 2]);
        o[n * 4 + 3] = __fmaf_rn(part[n * 4 + 3], vb1, o[n * 4 + 3]);
    }
}

/* ------------------------------------------------------------ host */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static encode_tiled_fn lookup_encode_tiled(void) {
    void *ptr = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                         cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        return (encode_tiled_fn)ptr;
    cudaGetLastError();
    return NULL;
}
/* Process-wide, shared by every context: a C++11 static, initialised once
 * even when two threads on two contexts get here together. */
static encode_tiled_fn get_encode_tiled(void) {
    static const encode_tiled_fn fn = lookup_encode_tiled();
    return fn;
}

/* A [rows][width] byte matrix (width 64 or 128) read as box_rows x 128
 * tiles, 128-byte swizzle: a 64-byte row lands in the first half of a
 * 128-byte tile row, and TMA fills the other half with zeros (the box
 * reaches past the row; out-of-bounds bytes count toward the
 * transaction as loaded ones). */
static qva_status make_map_w(CUtensorMap *map, const void *data, uint64_t rows, uint32_t box_rows,
                             uint64_t width) {
    encode_tiled_fn enc = get_encode_tiled();
    if (!enc) return qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled is not available");
    const cuuint64_t dims[2] = {width, rows}, strides[1] = {width};
    const cuuint32_t box[2] = {128, box_rows}, estr[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)data, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? QVA_OK
                             : qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled failed (%d)", (int)r);
}

/* A [rows][128] byte matrix read as box_rows x 128 tiles. */
static qva_status make_map(CUtensorMap *map, const void *data, uint64_t rows, uint32_t box_rows) {
    return make_map_w(map, data, rows, box_rows, 128);
}

#endif
