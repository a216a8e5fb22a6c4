/*
 * attn_draft_ws_128x128: DraftAttention2's phased kernel on Hopper's own
 * instructions (DA2 §3.2-3.3, C.3; docs/DRAFT.md §5).  A block-sparse
 * version of the dense 8-bit kernel's pipeline (attn_qk8_pv8_ws.cu):
 *
 *   one CTA per (video query region a, head bh): 128 packed query rows,
 *   warpgroup 0      producer: one thread walks the route of (bh, a) -- the
 *                    INT8 key regions, then every prefix block, then the
 *                    16-bit key regions -- and TMA-loads each block's K and
 *                    V^T into a 2-stage ring (mbarriers, 128-byte swizzle)
 *   warpgroups 1, 2  consumers, 64 query rows each, ONE online-softmax
 *                    state across the phases:
 *     INT8 phase     S = Q8 K8^T  wgmma m64n128k32 s8 (SS); P codes by
 *                    exp2 or ExpCast (ws4's fused score FMA); the block's
 *                    PV partial = P V8 by wgmma e4m3 (RS; with ExpCast the
 *                    n136 form whose ones rows give the decoded row sum),
 *                    rounded to FP16 with saturation (Table 6) and added;
 *                    entered and left by the Eq. 8 unit change
 *     16-bit phase   S = Q16 K16^T wgmma m64n128k16 bf16/f16 (SS); P in
 *                    16 bits from the S accumulator registers; O += P V16
 *                    by wgmma (RS) straight into the O accumulator
 *
 * Prefix queries (a text prefix; DA2 C.1: dense over every valid key) run
 * in the same kernel as extra CTAs whose walk is every prefix block and
 * then every video region in 16 bits; they come first in the launch order
 * (dw_work).  Before, a separate prep16 + mma.sync bf16 pass computed them.
 *
 * Empty lists cost nothing: the producer skips them and the consumers
 * never wait for them.  Query regions keep different numbers of key
 * blocks; with one CTA per region (24,360 at Wan2.2-720p, ~185 per SM) the
 * hardware block scheduler balances the load dynamically and the tail is
 * under one CTA's run time, so there is no persistent scheduler.
 *
 * Numerics against the CPU reference (src/cpu/draft.c), as the mma.sync
 * draft kernel (attn_draft.cu) except where marked:
 *   - INT8 scores exact (INT32); the P codes from one FMA per score (ws4):
 *     a code can differ by one step from the three-rounding reference
 *     (docs/NUMERICS.md, ws4);
 *   - 16-bit phase: p = exp2(s - m) by ex2.approx (2 ulp), the row sum of
 *     the FP32 p, P rounded to 16 bits; the PV product accumulates into O
 *     in the tensor core (the CPU adds a per-block FP32 partial): FP32
 *     summation order only.
 *   - 4-bit blocks are not handled here: a route with an NVFP4 phase runs
 *     the mma.sync kernel (qvc_draft_attention decides).
 *
 * Versions (QVA_DRAFT_KERNEL=mma|dw0..dw11; runtime default in attn_draft.cu;
 * H200 figures in bench/results/2026-11-30-h200-draft-kernels.md).  The
 * C7513/C7514 "serialized" notes that ptxas printed for dw0, dw3 and dw5
 * until 2026-11-30 came from reg_fence's "+r" constraint on float arrays
 * (f32<->b32 movs that NVVM hoisted above wgmma.wait_group); with typed
 * fences (ws_common.cuh) only dw1 is still serialized.  Figures taken
 * before that fix are of the serialized builds.
 *   dw0  per block: QK, softmax, PV in sequence; PV accumulates into O.
 *   dw1  16-bit phase software-pipelined (FA3's intra-warpgroup overlap):
 *        QK of block i and PV of block i-1 in flight together, the softmax
 *        of block i under PV of i-1; O rescaled after that PV lands.
 *        ptxas still serializes it (C7513: the 16-bit P of block i is
 *        written while PV(i-1) runs)
 *   dw2  dw0 with the PV product into a fresh per-block partial, added to
 *        O (the CPU's order)
 *   dw3  dw2 with the two consumer warpgroups in ping-pong in the 16-bit
 *        phase (ws5's named-barrier protocol)
 *   dw4  dw2 with the softmax scale folded into the exponent (one FMA per
 *        score, the max on the raw scores, the mask applied on reading,
 *        never written into the accumulators) and the INT8 partial's FP16
 *        rounding as one cvt.rn.satfinite.f16x2 per two values
 *   dw5  dw4 with QK of block i+1 issued right after PV of block i
 *        (spills 80 bytes: O, the partial and S live together)
 *   dw6  dw4 with K and V on separate full barriers: QK starts when K
 *        has landed, V may still be in flight
 *   dw7  dw3's ping-pong with dw4's softmax, PV accumulating into O
 *   dw8  dw4 with PV accumulating into O
 *   dw9  dw7 with the INT8 phase in ping-pong as well
 *   dw10 dw1 in FA3's form: the exponentials of block i computed in place
 *        (FP32) under PV(i-1), P packed to 16 bits and O rescaled after
 *        the wait -- no C7513; compile-checked, not yet run on the H200
 *   dw11 dw10 with the two warpgroups taking turns to issue (dw7's
 *        ping-pong): FA3's configuration; compile-checked, not yet run
 */
#include "ws_common.cuh"

#define DW_ROWS 128
#define DW_STAGES 2
#define DW_HALF 16384                  /* [128 rows][128 B] */
#define DW_Q16_OFF 0                   /* Q16: channels 0-63 | 64-127   */
#define DW_Q8_OFF (2 * DW_HALF)        /* Q8 [128][128 B]               */
#define DW_STAGE0 (3 * DW_HALF)
#define DW_STAGE_BYTES (4 * DW_HALF + 1024) /* K 32 KB | V 32 KB | ones */
#define DW_K_OFF(s) (DW_STAGE0 + (s) * DW_STAGE_BYTES)
#define DW_V_OFF(s) (DW_K_OFF(s) + 2 * DW_HALF)
/* INT8 V^T goes in the high half, so the ones rows follow it (n136) */
#define DW_V8_OFF(s) (DW_V_OFF(s) + DW_HALF)
#define DW_ONES_OFF(s) (DW_V_OFF(s) + 2 * DW_HALF)
#define DW_BAR_OFF (DW_STAGE0 + DW_STAGES * DW_STAGE_BYTES)
#define DW_SMEM_BYTES (DW_BAR_OFF + 64 + 1024)
#define DW_THREADS 384
#define DW_PRODUCER_REGS 24
#define DW_CONSUMER_REGS 240

typedef struct dw_params {
    qvc_draft_ws_args w;
    int npre; /* prefix blocks */
} dw_params;

/* ------------------------------------------------------------ 16-bit wgmma */
/* S (64x128) += Q (64x16, smem) K^T (16x128, smem), both K-major. */
template <int F16>
static __device__ __forceinline__ void wgmma_qk16(float (&d)[64], uint64_t da, uint64_t db,
                                                  int acc) {
    if (F16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
            : F64(d)
            : "l"(da), "l"(db), "r"(acc));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ACC64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
            : F64(d)
            : "l"(da), "l"(db), "r"(acc));
}
/* O (64x128) += P (64x16, registers) V (16x128, smem V^T, K-major). */
template <int F16>
static __device__ __forceinline__ void wgmma_pv16(float (&d)[64], const uint32_t *a, uint64_t db) {
    if (F16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64
            ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : F64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ACC64
            ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : F64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* The same into a fresh block partial (scale-d 0 on the first k-step). */
template <int F16>
static __device__ __forceinline__ void wgmma_pv16_part(float (&d)[64], const uint32_t *a,
                                                       uint64_t db, int acc) {
    if (F16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64
            ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : F64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ACC64
            ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : F64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* First k-step of a fresh accumulator: outputs only (scale-d = 0), so
 * neither the compiler nor ptxas sees a read of the old values. */
#define W64(d) "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), \
    "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), \
    "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), \
    "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), \
    "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), \
    "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), \
    "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), \
    "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
template <int F16>
static __device__ __forceinline__ void wgmma_qk16_first(float (&d)[64], uint64_t da, uint64_t db) {
    if (F16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
            : W64(d)
            : "l"(da), "l"(db));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ACC64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
            : W64(d)
            : "l"(da), "l"(db));
}
template <int F16>
static __device__ __forceinline__ void wgmma_pv16_first(float (&d)[64], const uint32_t *a, uint64_t db) {
    if (F16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ACC64
            ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : W64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ACC64
            ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : W64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* Descriptor of k-step kk (16 channels = 32 bytes) of a [rows][128] 16-bit
 * tile stored as two swizzled halves of 64 channels, `half` bytes apart. */
static __device__ __forceinline__ uint64_t desc16(uint32_t addr, int kk, uint32_t half) {
    return sw128_desc(addr + (uint32_t)(kk >> 2) * half) + 2 * (kk & 3);
}

template <int F16>
static __device__ __forceinline__ void issue_qk16(float (&s)[64], uint32_t q_addr, uint32_t k_addr) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
        wgmma_qk16<F16>(s, desc16(q_addr, kk, DW_HALF), desc16(k_addr, kk, DW_HALF), kk);
    wg_commit();
}
/* dw4: the same with a write-only first k-step. */
template <int F16>
static __device__ __forceinline__ void issue_qk16_w(float (&s)[64], uint32_t q_addr, uint32_t k_addr) {
    wg_fence();
    wgmma_qk16_first<F16>(s, desc16(q_addr, 0, DW_HALF), desc16(k_addr, 0, DW_HALF));
#pragma unroll
    for (int kk = 1; kk < 8; ++kk)
        wgmma_qk16<F16>(s, desc16(q_addr, kk, DW_HALF), desc16(k_addr, kk, DW_HALF), 1);
    wg_commit();
}
template <int F16>
static __device__ __forceinline__ void issue_pv16(float (&o)[64], uint32_t (&pa)[8][4],
                                                  uint32_t v_addr) {
    /* P and O are final before the fence: otherwise the compiler may sink
     * their last writes between the wgmmas, and ptxas serializes them */
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) reg_fence(pa[kk]);
    reg_fence(o);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_pv16<F16>(o, pa[kk], desc16(v_addr, kk, DW_HALF));
    wg_commit();
}

/* The block partial P V (dw2, dw3): accumulating into O itself made
 * ptxas serialize the wgmmas (C7514, dw0/dw1); a fresh partial does not,
 * and it is the CPU's order (O += the block's FP32 partial). */
template <int F16>
static __device__ __forceinline__ void issue_pv16_part(float (&part)[64], const uint32_t (&pa)[8][4],
                                                       uint32_t v_addr) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_pv16_part<F16>(part, pa[kk], desc16(v_addr, kk, DW_HALF), kk);
    wg_commit();
}
template <int F16>
static __device__ __forceinline__ void issue_pv16_w(float (&part)[64], const uint32_t (&pa)[8][4],
                                                    uint32_t v_addr) {
    wg_fence();
    wgmma_pv16_first<F16>(part, pa[0], desc16(v_addr, 0, DW_HALF));
#pragma unroll
    for (int kk = 1; kk < 8; ++kk) wgmma_pv16_part<F16>(part, pa[kk], desc16(v_addr, kk, DW_HALF), 1);
    wg_commit();
}
static __device__ __forceinline__ void add_part16(float (&o)[64], const float (&part)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = __fadd_rn(o[i], part[i]);
}

/* ------------------------------------------------------------ softmax pieces */
/* Scores of a 16-bit block, keys >= valid at -inf; the row maxima (quad
 * reduced) raised by the running max m. */
static __device__ __forceinline__ void scores16(float (&s)[64], float f, int valid, int tig,
                                                const float *m, float *mx) {
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = __fmul_rn(s[i], f);
    if (valid < WS_KEYS) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
            const int key = nt * 8 + 2 * tig;
            if (key >= valid) s[nt * 4 + 0] = s[nt * 4 + 2] = -INFINITY;
            if (key + 1 >= valid) s[nt * 4 + 1] = s[nt * 4 + 3] = -INFINITY;
        }
    }
    float a0[4], a1[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        a0[q] = fmaxf(s[q * 4 + 0], s[q * 4 + 1]);
        a1[q] = fmaxf(s[q * 4 + 2], s[q * 4 + 3]);
    }
#pragma unroll
    for (int nt = 4; nt < 16; ++nt) {
        a0[nt & 3] = fmaxf(a0[nt & 3], fmaxf(s[nt * 4 + 0], s[nt * 4 + 1]));
        a1[nt & 3] = fmaxf(a1[nt & 3], fmaxf(s[nt * 4 + 2], s[nt * 4 + 3]));
    }
    mx[0] = fmaxf(m[0], qvc_quad_max(fmaxf(fmaxf(a0[0], a0[1]), fmaxf(a0[2], a0[3]))));
    mx[1] = fmaxf(m[1], qvc_quad_max(fmaxf(fmaxf(a1[0], a1[1]), fmaxf(a1[2], a1[3]))));
}

/* New running max mx: alpha per row (1 when it did not rise), m and l
 * updated; O is rescaled by the caller (it may be in flight). */
static __device__ __forceinline__ void new_max(const float *mx, float *m, float *l,
                                               float *alpha) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        alpha[r] = (mx[r] > m[r] && m[r] != -INFINITY) ? exp2f(m[r] - mx[r]) : 1.0f;
        l[r] *= alpha[r];
        m[r] = fmaxf(m[r], mx[r]);
    }
}
static __device__ __forceinline__ void rescale_o(float (&o)[64], const float *alpha) {
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        o[n * 4 + 0] *= alpha[0], o[n * 4 + 1] *= alpha[0];
        o[n * 4 + 2] *= alpha[1], o[n * 4 + 3] *= alpha[1];
    }
}

/* p = 2^(s - m) (FP32 row sums in rs), packed to 16 bits as the PV A
 * fragments: k-step kk holds keys 16kk..16kk+15 (chunks 2kk, 2kk+1). */
template <int F16>
static __device__ __forceinline__ void probs16(const float (&s)[64], const float *m, float *rs,
                                               uint32_t (&pa)[8][4]) {
    const float m0 = m[0] == -INFINITY ? 0.0f : m[0], m1 = m[1] == -INFINITY ? 0.0f : m[1];
    float r0[2] = {0.0f, 0.0f}, r1[2] = {0.0f, 0.0f};
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const float *lo = s + 8 * kk, *hi = lo + 4;
        const float p0 = ex2_ftz(lo[0] - m0), p1 = ex2_ftz(lo[1] - m0);
        const float p2 = ex2_ftz(lo[2] - m1), p3 = ex2_ftz(lo[3] - m1);
        const float p4 = ex2_ftz(hi[0] - m0), p5 = ex2_ftz(hi[1] - m0);
        const float p6 = ex2_ftz(hi[2] - m1), p7 = ex2_ftz(hi[3] - m1);
        r0[kk & 1] += (p0 + p1) + (p4 + p5);
        r1[kk & 1] += (p2 + p3) + (p6 + p7);
        pa[kk][0] = qvc_pack2<F16>(p0, p1);
        pa[kk][1] = qvc_pack2<F16>(p2, p3);
        pa[kk][2] = qvc_pack2<F16>(p4, p5);
        pa[kk][3] = qvc_pack2<F16>(p6, p7);
    }
    rs[0] = qvc_quad_sum(r0[0] + r0[1]);
    rs[1] = qvc_quad_sum(r1[0] + r1[1]);
}

/* dw4: the row maxima from the raw scores, keys >= valid left out (the
 * accumulators are only read: writing the mask into them made ptxas
 * serialize the wgmmas), times f (> 0, so the max commutes with the
 * scaling), raised by m. */
static __device__ __forceinline__ void raw_max16(const float (&s)[64], float f, int valid, int tig,
                                                 const float *m, float *mx) {
    const int lim = valid - 2 * tig; /* key nt*8 + 2 tig + e1 is valid iff nt*8 + e1 < lim */
    float a0[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    float a1[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
        const bool v0 = nt * 8 < lim, v1 = nt * 8 + 1 < lim;
        a0[nt & 3] = fmaxf(a0[nt & 3], fmaxf(v0 ? s[nt * 4 + 0] : -INFINITY, v1 ? s[nt * 4 + 1] : -INFINITY));
        a1[nt & 3] = fmaxf(a1[nt & 3], fmaxf(v0 ? s[nt * 4 + 2] : -INFINITY, v1 ? s[nt * 4 + 3] : -INFINITY));
    }
    mx[0] = fmaxf(m[0], qvc_quad_max(fmaxf(fmaxf(a0[0], a0[1]), fmaxf(a0[2], a0[3]))) * f);
    mx[1] = fmaxf(m[1], qvc_quad_max(fmaxf(fmaxf(a1[0], a1[1]), fmaxf(a1[2], a1[3]))) * f);
}

/* dw4: p = 2^(x f - m) with one FMA per score; keys >= valid give 0. */
template <int F16>
static __device__ __forceinline__ void probs16_fused(const float (&s)[64], float f, const float *m,
                                                     int valid, int tig, float *rs,
                                                     uint32_t (&pa)[8][4]) {
    const float m0 = m[0] == -INFINITY ? 0.0f : -m[0], m1 = m[1] == -INFINITY ? 0.0f : -m[1];
    const int lim = valid - 2 * tig;
    float r0[2] = {0.0f, 0.0f}, r1[2] = {0.0f, 0.0f};
#define DW_P(x, nt, e1, mm) ((nt) * 8 + (e1) < lim ? ex2_ftz(__fmaf_rn((x), f, (mm))) : 0.0f)
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const float *lo = s + 8 * kk, *hi = lo + 4;
        const int na = 2 * kk, nb = 2 * kk + 1;
        const float p0 = DW_P(lo[0], na, 0, m0), p1 = DW_P(lo[1], na, 1, m0);
        const float p2 = DW_P(lo[2], na, 0, m1), p3 = DW_P(lo[3], na, 1, m1);
        const float p4 = DW_P(hi[0], nb, 0, m0), p5 = DW_P(hi[1], nb, 1, m0);
        const float p6 = DW_P(hi[2], nb, 0, m1), p7 = DW_P(hi[3], nb, 1, m1);
        r0[kk & 1] += (p0 + p1) + (p4 + p5);
        r1[kk & 1] += (p2 + p3) + (p6 + p7);
        pa[kk][0] = qvc_pack2<F16>(p0, p1);
        pa[kk][1] = qvc_pack2<F16>(p2, p3);
        pa[kk][2] = qvc_pack2<F16>(p4, p5);
        pa[kk][3] = qvc_pack2<F16>(p6, p7);
    }
#undef DW_P
    rs[0] = qvc_quad_sum(r0[0] + r0[1]);
    rs[1] = qvc_quad_sum(r1[0] + r1[1]);
}

/* The same for two values in one conversion: cvt.rn.satfinite rounds to
 * FP16 and clamps to +-65504 (NaN stays NaN), which is exactly
 * qvc_f16_sat (round_f16_sat); dw4 and later. */
static __device__ __forceinline__ float2 f16_sat2(float a, float b) {
    uint32_t h;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(h) : "f"(b), "f"(a));
    return __half22float2(*(const __half2 *)&h);
}

/* Eq. 8 unit change of O and l: enter divides by eta*delta_c, exit
 * multiplies (the mma.sync kernel's dg_phase_scale). */
static __device__ __forceinline__ void phase_scale(float (&o)[64], float *l, const float *dv,
                                                   float eta, int tig, int enter) {
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float sc = __fmul_rn(eta, __ldg(dv + n * 8 + 2 * tig + (e & 1)));
            o[n * 4 + e] = enter ? __fdiv_rn(o[n * 4 + e], sc) : __fmul_rn(o[n * 4 + e], sc);
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = enter ? __fdiv_rn(l[r], eta) : __fmul_rn(l[r], eta);
}

/* dw10: p = 2^(x f - m) written over the scores in place (keys >= valid
 * give 0), with the row sums; the 16-bit packing comes later. */
static __device__ __forceinline__ void exp16_inplace(float (&s)[64], float f, const float *m,
                                                     int valid, int tig, float *rs) {
    const float m0 = m[0] == -INFINITY ? 0.0f : -m[0], m1 = m[1] == -INFINITY ? 0.0f : -m[1];
    const int lim = valid - 2 * tig;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
        const bool v0 = nt * 8 < lim, v1 = nt * 8 + 1 < lim;
        s[nt * 4 + 0] = v0 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 0], f, m0)) : 0.0f;
        s[nt * 4 + 1] = v1 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 1], f, m0)) : 0.0f;
        s[nt * 4 + 2] = v0 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 2], f, m1)) : 0.0f;
        s[nt * 4 + 3] = v1 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 3], f, m1)) : 0.0f;
        r0 += s[nt * 4 + 0] + s[nt * 4 + 1];
        r1 += s[nt * 4 + 2] + s[nt * 4 + 3];
    }
    rs[0] = qvc_quad_sum(r0);
    rs[1] = qvc_quad_sum(r1);
}

/* dw10: the probabilities in 16 bits as the PV A fragments (the layout
 * probs16 writes). */
template <int F16>
static __device__ __forceinline__ void pack_p16(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const float *lo = s + 8 * kk, *hi = lo + 4;
        pa[kk][0] = qvc_pack2<F16>(lo[0], lo[1]);
        pa[kk][1] = qvc_pack2<F16>(lo[2], lo[3]);
        pa[kk][2] = qvc_pack2<F16>(hi[0], hi[1]);
        pa[kk][3] = qvc_pack2<F16>(hi[2], hi[3]);
    }
}

/* ------------------------------------------------------------ INT8 phase */
/* One INT8 block's softmax: the row max on the integer scores, the new
 * running max (O and l rescaled), and the E4M3 P codes by one FMA per
 * score; rs gets the FP32 row sums (quad-partial) without ExpCast. */
template <int EXPCAST>
static __device__ __forceinline__ void softmax8(int (&sacc)[64], float f, int valid, int tig,
                                                float (&m)[2], float (&l)[2], float (&o)[64],
                                                float (&rs)[2], uint32_t (&pa)[4][4]) {
    float mx[2], alpha[2];
    rs[0] = rs[1] = 0.0f;
    int_row_max<1>(sacc, f, 0, valid, tig, mx);
    mx[0] = fmaxf(mx[0], m[0]);
    mx[1] = fmaxf(mx[1], m[1]);
    new_max(mx, m, l, alpha);
    rescale_o(o, alpha);
    if (valid < WS_KEYS)
        make_p_fused<EXPCAST, 1, 1>(sacc, f, m[0], m[1], 0, valid, tig, rs, pa);
    else
        make_p_fused<EXPCAST, 0, 1>(sacc, f, m[0], m[1], 0, valid, tig, rs, pa);
}

/* O += the block's PV partial rounded to FP16 with saturation (Table 6),
 * l += its row sum (ExpCast: the decoded sum from the ones rows). */
template <int EXPCAST, int VER>
static __device__ __forceinline__ void add_part8(float (&o)[64], float (&l)[2],
                                                 const float (&part)[EXPCAST ? 68 : 64],
                                                 float (&rs)[2]) {
    if (EXPCAST) {
        rs[0] = part[64], rs[1] = part[66];
    } else {
        rs[0] = qvc_quad_sum(rs[0]);
        rs[1] = qvc_quad_sum(rs[1]);
    }
#pragma unroll
    for (int i2 = 0; i2 < 64; i2 += 2) {
        if (VER >= 4) {
            const float2 h = f16_sat2(part[i2], part[i2 + 1]);
            o[i2] = __fadd_rn(o[i2], h.x);
            o[i2 + 1] = __fadd_rn(o[i2 + 1], h.y);
        } else {
            o[i2] = __fadd_rn(o[i2], qvc_f16_sat(part[i2]));
            o[i2 + 1] = __fadd_rn(o[i2 + 1], qvc_f16_sat(part[i2 + 1]));
        }
    }
    l[0] = __fadd_rn(l[0], rs[0]);
    l[1] = __fadd_rn(l[1], rs[1]);
}

/* ------------------------------------------------------------ the kernel */
/* Block i of the CTA's walk: INT8 regions first, then the prefix blocks,
 * then the 16-bit regions.  A prefix-query CTA (dense) walks every prefix
 * block and then every video region, all in 16 bits (docs/DRAFT.md §5:
 * prefix queries attend to all valid keys). */
typedef struct dw_walk {
    int e1, nb8, npre, e2, total, dense;
} dw_walk;

/* The CTA's work item.  The first npre * BH linear block indices are the
 * prefix-query CTAs (each walks R + npre blocks, about R / 16 times a
 * video CTA's list), so the block scheduler starts them first and they
 * cannot form a tail; then one CTA per (video region, head). */
static __device__ __forceinline__ void dw_work(const qvc_draft_ws_args &w, int npre, int &a,
                                               int &bh, dw_walk &wk) {
    const int64_t idx = (int64_t)blockIdx.y * gridDim.x + blockIdx.x, nd = (int64_t)npre * w.BH;
    wk.npre = npre;
    if (idx < nd) {
        bh = (int)(idx % w.BH), a = (int)(idx / w.BH);
        wk.dense = 1, wk.e1 = wk.e2 = 0, wk.nb8 = 0;
        wk.total = npre + w.R;
        return;
    }
    bh = (int)((idx - nd) / w.R), a = (int)((idx - nd) % w.R);
    const int32_t *off = w.offsets + ((int64_t)bh * w.R + a) * 3;
    wk.dense = 0;
    wk.e1 = off[1];
    wk.nb8 = off[2] - off[1];
    wk.e2 = off[2];
    wk.total = wk.nb8 + npre + (off[3] - off[2]);
}

/* The video region of 16-bit block i >= npre. */
static __device__ __forceinline__ int video_block(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                  int i) {
    return wk.dense ? i - wk.npre : w.cols[wk.e2 + i - wk.npre];
}

/* Valid keys of 16-bit block i: a prefix block or a video region. */
static __device__ __forceinline__ int block_valid(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                  int i) {
    return i < wk.npre ? min(w.prefix - i * DW_ROWS, DW_ROWS) : w.count[video_block(w, wk, i)];
}

/* First packed row of the CTA's query block (in one head's n_pack rows)
 * and its valid rows. */
static __device__ __forceinline__ int64_t query_row0(const qvc_draft_ws_args &w,
                                                     const dw_walk &wk, int a) {
    return wk.dense ? (int64_t)a * DW_ROWS : w.prefix_pad + (int64_t)a * DW_ROWS;
}
static __device__ __forceinline__ int query_valid(const qvc_draft_ws_args &w, const dw_walk &wk,
                                                  int a) {
    return wk.dense ? min(w.prefix - a * DW_ROWS, DW_ROWS) : w.count[a];
}

template <int F16, int EXPCAST, int VER>
__global__ void __launch_bounds__(DW_THREADS, 1)
attn_draft_ws_128x128(const __grid_constant__ CUtensorMap tq16,
                      const __grid_constant__ CUtensorMap tk16,
                      const __grid_constant__ CUtensorMap tv16,
                      const __grid_constant__ CUtensorMap tq8,
                      const __grid_constant__ CUtensorMap tk8,
                      const __grid_constant__ CUtensorMap tv8, const dw_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const uint32_t bar_q8 = base + DW_BAR_OFF, bar_q16 = bar_q8 + 8;
    const uint32_t bar_full = bar_q8 + 16, bar_empty = bar_full + 8 * DW_STAGES;
    /* dw6: V tiles complete on their own barriers, so QK can start when K
     * has landed */
    const int SPLIT = VER == 6;
    const uint32_t bar_fullv = bar_empty + 8 * DW_STAGES;
    const qvc_draft_ws_args &w = p.w;
    const int R = w.R;
    int a, bh;
    dw_walk wk;
    dw_work(w, p.npre, a, bh, wk);
    const int64_t hr = (int64_t)bh * R;

    if (EXPCAST)
        for (int i = threadIdx.x; i < DW_STAGES * 256; i += DW_THREADS)
            *(uint32_t *)(sm + DW_ONES_OFF(i / 256) + 4 * (i % 256)) = 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(bar_q8, 1);
        mbar_init(bar_q16, 1);
        for (int s = 0; s < DW_STAGES; ++s) {
            mbar_init(bar_full + 8 * s, 1);
            mbar_init(bar_empty + 8 * s, 256); /* every consumer thread */
            if (SPLIT) mbar_init(bar_fullv + 8 * s, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (threadIdx.x < 128) {
        /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(DW_PRODUCER_REGS));
        if (threadIdx.x != 0) return;
        const int64_t nv = (int64_t)R * DW_ROWS;
        const int qrow16 = (int)((int64_t)bh * w.n_pack + query_row0(w, wk, a));
        if (wk.nb8) {
            mbar_expect_tx(bar_q8, DW_HALF);
            tma_load_2d(base + DW_Q8_OFF, &tq8, 0, (int)((int64_t)bh * nv + (int64_t)a * DW_ROWS), bar_q8);
        }
        mbar_expect_tx(bar_q16, 2 * DW_HALF);
        tma_load_2d(base + DW_Q16_OFF, &tq16, 0, qrow16, bar_q16);
        tma_load_2d(base + DW_Q16_OFF + DW_HALF, &tq16, 64, qrow16, bar_q16);
        for (int j = 0; j < wk.total; ++j) {
            const int s = j % DW_STAGES;
            const uint32_t full = bar_full + 8 * s, fullv = SPLIT ? bar_fullv + 8 * s : full;
            mbar_wait(bar_empty + 8 * s, ((j / DW_STAGES) & 1) ^ 1);
            if (j < wk.nb8) {
                const int b = w.cols[wk.e1 + j];
                const int row = (int)((hr + b) * DW_ROWS);
                if (SPLIT) {
                    mbar_expect_tx(full, DW_HALF);
                    mbar_expect_tx(fullv, DW_HALF);
                } else {
                    mbar_expect_tx(full, 2 * DW_HALF);
                }
                tma_load_2d(base + DW_K_OFF(s), &tk8, 0, row, full);
                tma_load_2d(base + DW_V8_OFF(s), &tv8, 0, row, fullv);
            } else {
                const int i = j - wk.nb8;
                const int64_t k0 = i < wk.npre ? (int64_t)i * DW_ROWS
                                               : w.prefix_pad + (int64_t)video_block(w, wk, i) * DW_ROWS;
                const int row = (int)((int64_t)bh * w.n_pack + k0);
                if (SPLIT) {
                    mbar_expect_tx(full, 2 * DW_HALF);
                    mbar_expect_tx(fullv, 2 * DW_HALF);
                } else {
                    mbar_expect_tx(full, 4 * DW_HALF);
                }
                tma_load_2d(base + DW_K_OFF(s), &tk16, 0, row, full);
                tma_load_2d(base + DW_K_OFF(s) + DW_HALF, &tk16, 64, row, full);
                tma_load_2d(base + DW_V_OFF(s), &tv16, 0, row, fullv);
                tma_load_2d(base + DW_V_OFF(s) + DW_HALF, &tv16, 64, row, fullv);
            }
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(DW_CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7;
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int j = 0; /* blocks consumed: the ring position */

    /* 1. INT8 blocks, inside the Eq. 8 unit change */
    if (wk.nb8) {
        const float *dv = w.dv + (int64_t)bh * 128;
        phase_scale(o, l, dv, w.eta, tig, 1);
        const uint64_t qd = sw128_desc(base + DW_Q8_OFF + cw * 64 * 128);
        const float dq = w.q8s[hr + a];
        mbar_wait(bar_q8, 0);
        if (VER == 9) {
            /* dw7's ping-pong in the INT8 phase: one warpgroup issues PV
             * of block i and QK of i+1 while the other makes its P */
            int sacc[64];
            int s = j % DW_STAGES;
            mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
            issue_qk<QVC_QK_INT8>(sacc, qd, base + DW_K_OFF(s));
            wg_wait<0>();
            reg_fence(sacc);
            if (cw == 1) named_arrive(1, 256);
            for (int i = 0; i < wk.nb8; ++i, ++j) {
                s = j % DW_STAGES;
                const int sn = (j + 1) % DW_STAGES, more = i + 1 < wk.nb8;
                const int b = w.cols[wk.e1 + i];
                const float f = __fmul_rn(__fmul_rn(dq, w.k8s[hr + b]), w.scale_log2);
                float rs[2];
                uint32_t pa[4][4];
                softmax8<EXPCAST>(sacc, f, w.count[b], tig, m, l, o, rs, pa);
                if (more) mbar_wait(bar_full + 8 * sn, ((j + 1) / DW_STAGES) & 1);
                named_sync(1 + cw, 256);
                float part[EXPCAST ? 68 : 64];
                issue_pv<EXPCAST>(part, pa, sw128_desc(base + DW_V8_OFF(s)));
                /* always issued (no wgmma on a divergent path); after the
                 * last INT8 block it re-reads this K tile, unused */
                issue_qk<QVC_QK_INT8>(sacc, qd, base + DW_K_OFF(more ? sn : s));
                named_arrive(2 - cw, 256);
                wg_wait<1>(); /* PV of block i; QK of i+1 may still run */
                reg_fence(part);
                mbar_arrive(bar_empty + 8 * s);
                add_part8<EXPCAST, VER>(o, l, part, rs);
                wg_wait<0>();
                reg_fence(sacc);
            }
            if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
        } else {
            for (int i = 0; i < wk.nb8; ++i, ++j) {
                const int s = j % DW_STAGES, b = w.cols[wk.e1 + i];
                const float f = __fmul_rn(__fmul_rn(dq, w.k8s[hr + b]), w.scale_log2);
                int sacc[64];
                mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
                issue_qk<QVC_QK_INT8>(sacc, qd, base + DW_K_OFF(s));
                wg_wait<0>();
                reg_fence(sacc);
                float rs[2];
                uint32_t pa[4][4];
                softmax8<EXPCAST>(sacc, f, w.count[b], tig, m, l, o, rs, pa);
                float part[EXPCAST ? 68 : 64];
                if (SPLIT) mbar_wait(bar_fullv + 8 * s, (j / DW_STAGES) & 1);
                issue_pv<EXPCAST>(part, pa, sw128_desc(base + DW_V8_OFF(s)));
                wg_wait<0>();
                reg_fence(part);
                mbar_arrive(bar_empty + 8 * s);
                add_part8<EXPCAST, VER>(o, l, part, rs);
            }
        }
        phase_scale(o, l, dv, w.eta, tig, 0);
    }

    /* 2. 16-bit blocks: every prefix block, then the 16-bit regions */
    const int nb16 = wk.total - wk.nb8;
    const uint32_t qa = base + DW_Q16_OFF + cw * 64 * 128;
    mbar_wait(bar_q16, 0);
    if (VER == 0) {
        for (int i = 0; i < nb16; ++i, ++j) {
            const int s = j % DW_STAGES;
            const int valid = block_valid(w, wk, i);
            float sacc[64];
            mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
            issue_qk16<F16>(sacc, qa, base + DW_K_OFF(s));
            wg_wait<0>();
            reg_fence(sacc);
            float mx[2], alpha[2], rs[2];
            scores16(sacc, w.scale_log2, valid, tig, m, mx);
            new_max(mx, m, l, alpha);
            rescale_o(o, alpha);
            uint32_t pa[8][4];
            probs16<F16>(sacc, m, rs, pa);
            issue_pv16<F16>(o, pa, base + DW_V_OFF(s));
            wg_wait<0>();
            reg_fence(o);
            mbar_arrive(bar_empty + 8 * s);
            l[0] += rs[0];
            l[1] += rs[1];
        }
    } else if (VER == 2 || VER == 4 || VER == 6 || VER == 8) {
        /* dw2: scores scaled, then masked and maxed; dw4/dw6/dw8: the max
         * on the raw scores and one FMA per exponent; dw6 waits for V
         * apart; dw8 accumulates PV into O */
        for (int i = 0; i < nb16; ++i, ++j) {
            const int s = j % DW_STAGES;
            const int valid = block_valid(w, wk, i);
            float sacc[64];
            mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
            issue_qk16<F16>(sacc, qa, base + DW_K_OFF(s));
            wg_wait<0>();
            reg_fence(sacc);
            float mx[2], alpha[2], rs[2];
            if (VER >= 4)
                raw_max16(sacc, w.scale_log2, valid, tig, m, mx);
            else
                scores16(sacc, w.scale_log2, valid, tig, m, mx);
            new_max(mx, m, l, alpha);
            rescale_o(o, alpha);
            uint32_t pa[8][4];
            if (VER >= 4)
                probs16_fused<F16>(sacc, w.scale_log2, m, valid, tig, rs, pa);
            else
                probs16<F16>(sacc, m, rs, pa);
            if (SPLIT) mbar_wait(bar_fullv + 8 * s, (j / DW_STAGES) & 1);
            if (VER == 8) { /* PV straight into O */
                issue_pv16<F16>(o, pa, base + DW_V_OFF(s));
                wg_wait<0>();
                reg_fence(o);
                mbar_arrive(bar_empty + 8 * s);
            } else {
                float part[64];
                issue_pv16_part<F16>(part, pa, base + DW_V_OFF(s));
                wg_wait<0>();
                reg_fence(part);
                mbar_arrive(bar_empty + 8 * s);
                add_part16(o, part);
            }
            l[0] += rs[0];
            l[1] += rs[1];
        }
    } else if (VER == 5 && nb16 > 0) {
        /* dw4 with QK of block i+1 issued right after PV of block i, so it
         * runs under the partial's add and the barrier bookkeeping */
        float sacc[64];
        int s = j % DW_STAGES;
        mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
        issue_qk16_w<F16>(sacc, qa, base + DW_K_OFF(s));
        wg_wait<0>();
        reg_fence(sacc);
        for (int i = 0; i < nb16; ++i, ++j) {
            s = j % DW_STAGES;
            const int sn = (j + 1) % DW_STAGES, more = i + 1 < nb16;
            float mx[2], alpha[2], rs[2];
            raw_max16(sacc, w.scale_log2, block_valid(w, wk, i), tig, m, mx);
            new_max(mx, m, l, alpha);
            rescale_o(o, alpha);
            uint32_t pa[8][4];
            probs16_fused<F16>(sacc, w.scale_log2, m, block_valid(w, wk, i), tig, rs, pa);
            if (more) mbar_wait(bar_full + 8 * sn, ((j + 1) / DW_STAGES) & 1);
            float part[64];
            issue_pv16_w<F16>(part, pa, base + DW_V_OFF(s));
            /* always issued (no wgmma on a divergent path); after the last
             * block it re-reads this K tile, unused */
            issue_qk16_w<F16>(sacc, qa, base + DW_K_OFF(more ? sn : s));
            wg_wait<1>(); /* PV of block i; QK of i+1 may still run */
            reg_fence(part);
            add_part16(o, part);
            mbar_arrive(bar_empty + 8 * s);
            l[0] += rs[0];
            l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
    } else if ((VER == 7 || VER == 9) && nb16 > 0) {
        /* dw3's ping-pong with dw4's softmax and PV accumulating into O
         * (the C7514 that forced a fresh partial came from the "+r" fences
         * on float arrays, ws_common.cuh): 64 fewer live registers and no
         * partial add.  Warpgroup 0 issues first. */
        float sacc[64];
        int s = j % DW_STAGES;
        mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
        issue_qk16_w<F16>(sacc, qa, base + DW_K_OFF(s));
        wg_wait<0>();
        reg_fence(sacc);
        if (cw == 1) named_arrive(1, 256);
        for (int i = 0; i < nb16; ++i, ++j) {
            s = j % DW_STAGES;
            const int sn = (j + 1) % DW_STAGES, more = i + 1 < nb16, valid = block_valid(w, wk, i);
            float mx[2], alpha[2], rs[2];
            raw_max16(sacc, w.scale_log2, valid, tig, m, mx);
            new_max(mx, m, l, alpha);
            rescale_o(o, alpha);
            uint32_t pa[8][4];
            probs16_fused<F16>(sacc, w.scale_log2, m, valid, tig, rs, pa);
            if (more) mbar_wait(bar_full + 8 * sn, ((j + 1) / DW_STAGES) & 1);
            named_sync(1 + cw, 256);
            issue_pv16<F16>(o, pa, base + DW_V_OFF(s));
            /* always issued (no wgmma on a divergent path); after the last
             * block it re-reads this K tile, unused */
            issue_qk16_w<F16>(sacc, qa, base + DW_K_OFF(more ? sn : s));
            named_arrive(2 - cw, 256);
            wg_wait<1>(); /* PV of block i; QK of i+1 may still run */
            reg_fence(o);
            mbar_arrive(bar_empty + 8 * s);
            l[0] += rs[0];
            l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
        if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
    } else if (VER == 3 && nb16 > 0) {
        /* ping-pong (ws5): named barriers 1 and 2 make one warpgroup issue
         * its GEMMs (PV of block i, QK of i+1) while the other one makes
         * its P; warpgroup 0 goes first */
        float sacc[64];
        int s = j % DW_STAGES;
        mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
        issue_qk16<F16>(sacc, qa, base + DW_K_OFF(s));
        wg_wait<0>();
        reg_fence(sacc);
        if (cw == 1) named_arrive(1, 256);
        for (int i = 0; i < nb16; ++i, ++j) {
            s = j % DW_STAGES;
            const int sn = (j + 1) % DW_STAGES, more = i + 1 < nb16;
            float mx[2], alpha[2], rs[2];
            scores16(sacc, w.scale_log2, block_valid(w, wk, i), tig, m, mx);
            new_max(mx, m, l, alpha);
            rescale_o(o, alpha);
            uint32_t pa[8][4];
            probs16<F16>(sacc, m, rs, pa);
            if (more) mbar_wait(bar_full + 8 * sn, ((j + 1) / DW_STAGES) & 1);
            named_sync(1 + cw, 256);
            float part[64];
            issue_pv16_part<F16>(part, pa, base + DW_V_OFF(s));
            /* always issued, so that no wgmma sits on a divergent path;
             * after the last block it re-reads this K tile, unused */
            issue_qk16<F16>(sacc, qa, base + DW_K_OFF(more ? sn : s));
            named_arrive(2 - cw, 256);
            wg_wait<1>(); /* PV of block i; QK of i+1 may still run */
            reg_fence(part);
            add_part16(o, part);
            mbar_arrive(bar_empty + 8 * s);
            l[0] += rs[0];
            l[1] += rs[1];
            wg_wait<0>();
            reg_fence(sacc);
        }
        if (cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
    } else if ((VER == 1 || VER >= 10) && nb16 > 0) {
        /* Software pipeline: QK of block i and PV of block i-1 in flight
         * together, P of block i-1 waiting in pa.
         *   dw1   the softmax of block i writes its 16-bit P (pn) while
         *         PV(i-1) runs: ptxas serializes (C7513)
         *   dw10  FA3's form: the row max and the exponentials of block i
         *         go into the S registers in FP32 under PV(i-1); P is
         *         packed to 16 bits, and O rescaled, after PV(i-1) lands,
         *         so no register a running wgmma reads is written
         *   dw11  dw10 with the warpgroups taking turns to issue (dw7's
         *         named barriers, warpgroup 0 first) */
        constexpr bool FA3 = VER >= 10, PP = VER == 11;
        uint32_t pa[8][4];
        int sp = j % DW_STAGES; /* stage of the block whose P is in pa */
        {
            const int valid = block_valid(w, wk, 0);
            float sacc[64];
            mbar_wait(bar_full + 8 * sp, (j / DW_STAGES) & 1);
            if (FA3)
                issue_qk16_w<F16>(sacc, qa, base + DW_K_OFF(sp));
            else
                issue_qk16<F16>(sacc, qa, base + DW_K_OFF(sp));
            wg_wait<0>();
            reg_fence(sacc);
            float mx[2], alpha[2], rs[2];
            if (FA3)
                raw_max16(sacc, w.scale_log2, valid, tig, m, mx);
            else
                scores16(sacc, w.scale_log2, valid, tig, m, mx);
            new_max(mx, m, l, alpha);
            rescale_o(o, alpha);
            if (FA3)
                probs16_fused<F16>(sacc, w.scale_log2, m, valid, tig, rs, pa);
            else
                probs16<F16>(sacc, m, rs, pa);
            l[0] += rs[0];
            l[1] += rs[1];
            ++j;
        }
        if (PP && cw == 1) named_arrive(1, 256);
        for (int i = 1; i < nb16; ++i, ++j) {
            const int s = j % DW_STAGES;
            const int valid = block_valid(w, wk, i);
            float sacc[64];
            mbar_wait(bar_full + 8 * s, (j / DW_STAGES) & 1);
            if (PP) named_sync(1 + cw, 256);
            if (FA3)
                issue_qk16_w<F16>(sacc, qa, base + DW_K_OFF(s));
            else
                issue_qk16<F16>(sacc, qa, base + DW_K_OFF(s));
            issue_pv16<F16>(o, pa, base + DW_V_OFF(sp));
            if (PP) named_arrive(2 - cw, 256);
            wg_wait<1>(); /* QK(i) done, PV(i-1) may still run */
            reg_fence(sacc);
            float mx[2], alpha[2], rs[2];
            uint32_t pn[8][4];
            if (FA3) {
                raw_max16(sacc, w.scale_log2, valid, tig, m, mx);
                new_max(mx, m, l, alpha);
                exp16_inplace(sacc, w.scale_log2, m, valid, tig, rs);
            } else {
                scores16(sacc, w.scale_log2, valid, tig, m, mx);
                new_max(mx, m, l, alpha);
                probs16<F16>(sacc, m, rs, pn);
            }
            wg_wait<0>();
            reg_fence(o);
            mbar_arrive(bar_empty + 8 * sp);
            rescale_o(o, alpha);
            l[0] += rs[0];
            l[1] += rs[1];
            if (FA3) {
                pack_p16<F16>(sacc, pa);
            } else {
#pragma unroll
                for (int kk = 0; kk < 8; ++kk)
#pragma unroll
                    for (int e = 0; e < 4; ++e) pa[kk][e] = pn[kk][e];
            }
            sp = s;
        }
        if (PP && cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
        issue_pv16<F16>(o, pa, base + DW_V_OFF(sp));
        wg_wait<0>();
        reg_fence(o);
        mbar_arrive(bar_empty + 8 * sp);
    }

    /* ---- epilogue: qvi_row_finish, scattered back to the sequence order */
    const qvc_attn_args &A = w.a;
    const int b = bh / A.H, h = bh % A.H, cnt = query_valid(w, wk, a);
    const int64_t row0 = query_row0(w, wk, a);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int lr = cw * 64 + warp * 16 + g + 8 * r;
        if (lr >= cnt) continue;
        const int64_t orig = w.pack[row0 + lr];
        const bool empty = m[r] == -INFINITY || !(l[r] > 0.0f);
        const int64_t ob = b * A.osb + h * A.osh + orig * A.osn;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = n * 8 + 2 * tig;
            qvc_store_out2(A.out, A.out_dtype, ob + col,
                           empty ? 0.0f : __fdiv_rn(o[n * 4 + 2 * r], l[r]),
                           empty ? 0.0f : __fdiv_rn(o[n * 4 + 2 * r + 1], l[r]));
        }
        if (A.lse && tig == 0)
            A.lse[b * A.lsb + h * A.lsh + orig * A.lsn] =
                empty ? -INFINITY : __fmul_rn(__fadd_rn(m[r], log2f(l[r])), 0.69314718055994531f);
    }
}

/* ------------------------------------------------------------ host */
/* A [rows][128] 16-bit matrix read as box_rows x 64 tiles (128 bytes
 * wide, the swizzle span), 128-byte swizzle. */
static qva_status make_map16(CUtensorMap *map, const void *data, uint64_t rows, uint32_t box_rows) {
    encode_tiled_fn enc = get_encode_tiled();
    if (!enc) return qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled is not available");
    const cuuint64_t dims[2] = {128, rows}, strides[1] = {256};
    const cuuint32_t box[2] = {64, box_rows}, estr[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)data, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? QVA_OK
                             : qvi_fail(QVA_ERR_DEVICE, "cuTensorMapEncodeTiled failed (%d)", (int)r);
}

template <int F16, int EXPCAST, int VER>
static qva_status launch_dw(const CUtensorMap *m, const dw_params *p, cudaStream_t st) {
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
              const CUtensorMap, const CUtensorMap, const dw_params) =
        attn_draft_ws_128x128<F16, EXPCAST, VER>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, DW_SMEM_BYTES);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn_draft_ws smem attribute");
    /* linear index = prefix-query CTAs, then video CTAs (dw_work) */
    const dim3 grid((unsigned)(p->w.R + p->npre), (unsigned)p->w.BH);
    k<<<grid, DW_THREADS, DW_SMEM_BYTES, st>>>(m[0], m[1], m[2], m[3], m[4], m[5], *p);
    return qvc_launch_check("attn_draft_ws");
}

template <int VER>
static qva_status launch_ver(const CUtensorMap *m, const dw_params *p, cudaStream_t st) {
    const int f16 = p->w.f16 != 0, ec = p->w.expcast != 0;
    if (f16) return ec ? launch_dw<1, 1, VER>(m, p, st) : launch_dw<1, 0, VER>(m, p, st);
    return ec ? launch_dw<0, 1, VER>(m, p, st) : launch_dw<0, 0, VER>(m, p, st);
}

extern "C" qva_status qvc_attn_draft_ws(const qvc_draft_ws_args *w, int version, cudaStream_t st) {
    if (version < 0 || version > 11)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "attn_draft_ws: no version %d", version);
    if (w->prefix_pad % DW_ROWS || w->n_pack != w->prefix_pad + (int64_t)w->R * DW_ROWS ||
        (int64_t)w->BH * w->n_pack > INT32_MAX)
        return qvi_fail(QVA_ERR_SHAPE, "attn_draft_ws: layout (n_pack %lld, prefix_pad %lld, R %d, BH %d)",
                        (long long)w->n_pack, (long long)w->prefix_pad, w->R, w->BH);
    const uint64_t rows16 = (uint64_t)w->BH * w->n_pack, rows8 = (uint64_t)w->BH * w->R * DW_ROWS;
    /* Without an INT8 phase the 8-bit maps are never read: point them at
     * a valid 16-bit buffer. */
    const void *q8 = w->q8 ? (const void *)w->q8 : (const void *)w->q16;
    const void *k8 = w->k8 ? (const void *)w->k8 : (const void *)w->k16;
    const void *v8 = w->v8t ? (const void *)w->v8t : (const void *)w->v16t;
    CUtensorMap maps[6];
    qva_status r;
    if ((r = make_map16(&maps[0], w->q16, rows16, DW_ROWS)) != QVA_OK ||
        (r = make_map16(&maps[1], w->k16, rows16, DW_ROWS)) != QVA_OK ||
        (r = make_map16(&maps[2], w->v16t, rows16, DW_ROWS)) != QVA_OK ||
        (r = make_map(&maps[3], q8, w->q8 ? rows8 : DW_ROWS, DW_ROWS)) != QVA_OK ||
        (r = make_map(&maps[4], k8, w->k8 ? rows8 : DW_ROWS, DW_ROWS)) != QVA_OK ||
        (r = make_map(&maps[5], v8, w->v8t ? rows8 : DW_ROWS, DW_ROWS)) != QVA_OK)
        return r;
    dw_params p;
    p.w = *w;
    p.npre = (int)(w->prefix_pad / DW_ROWS);
    switch (version) {
    case 0: return launch_ver<0>(maps, &p, st);
    case 1: return launch_ver<1>(maps, &p, st);
    case 2: return launch_ver<2>(maps, &p, st);
    case 3: return launch_ver<3>(maps, &p, st);
    case 4: return launch_ver<4>(maps, &p, st);
    case 5: return launch_ver<5>(maps, &p, st);
    case 6: return launch_ver<6>(maps, &p, st);
    case 7: return launch_ver<7>(maps, &p, st);
    case 8: return launch_ver<8>(maps, &p, st);
    case 9: return launch_ver<9>(maps, &p, st);
    case 10: return launch_ver<10>(maps, &p, st);
    default: return launch_ver<11>(maps, &p, st);
    }
}
