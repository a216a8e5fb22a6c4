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
 * OVERLAP = 1 issues the QK product of block j+1 before the softmax of
 * block j (two S accumulators), so the tensor cores work while the CUDA
 * cores make P; OVERLAP = 0 is the plain sequence.  Both versions are kept:
 * QVA_ATTN_KERNEL selects one for benchmarking (runtime.cu).
 */
#include <cuda.h>

#include <type_traits>

#include "attn_common.cuh"

#define WS_ROWS 128   /* query rows per CTA: two consumer warpgroups x 64 */
#define WS_KEYS 128   /* keys per block */
#define WS_STAGES 2
#define WS_THREADS 384
#define WS_TILE 16384 /* 128 rows x 128 bytes */
#define WS_ONES 1024  /* 8 rows x 128 bytes of E4M3 1.0 */
#define WS_STAGE_BYTES (2 * WS_TILE + WS_ONES)
/* Shared memory, from a 1024-byte aligned base:
 *   Q | stage 0: V^T, ones, K | stage 1 ... | mbarriers */
#define WS_Q_OFF 0
#define WS_V_OFF(s) (WS_TILE + (s) * WS_STAGE_BYTES)
#define WS_ONES_OFF(s) (WS_V_OFF(s) + WS_TILE)
#define WS_K_OFF(s) (WS_ONES_OFF(s) + WS_ONES)
#define WS_BAR_OFF (WS_TILE + WS_STAGES * WS_STAGE_BYTES)
#define WS_SMEM_BYTES (WS_BAR_OFF + 8 * (1 + 2 * WS_STAGES) + 1024)
#define WS_CONSUMER_REGS 240
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

/* ------------------------------------------------------------ consumer */
typedef struct ws_params {
    qvc_ops ops;
    qvc_attn_args a;
} ws_params;

/* Issue S = Q K^T of the tile at k_off (4 k-steps of 32 channels). */
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

/* Scores in the log2 domain with the padding keys masked. */
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

/* Raise the running max of both rows; rescale O and l (VC Eq. 1). */
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
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float alpha = (mx[r] > m[r] && m[r] != -INFINITY) ? exp2f(m[r] - mx[r]) : 1.0f;
        l[r] *= alpha;
#pragma unroll
        for (int n = 0; n < 16; ++n) o[n * 4 + 2 * r] *= alpha, o[n * 4 + 2 * r + 1] *= alpha;
        m[r] = fmaxf(m[r], mx[r]);
    }
}

template <int FMT, int EXPCAST, int OVERLAP>
__global__ void __launch_bounds__(WS_THREADS, 1)
attn_qk8_pv8_ws_128x128(const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const ws_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const uint32_t bar_q = base + WS_BAR_OFF;
    const uint32_t bar_full = bar_q + 8, bar_empty = bar_q + 8 + 8 * WS_STAGES;
    const qvc_ops &ops = p.ops;
    const int bh = blockIdx.y, tile = blockIdx.x, nblk = ops.nblk;
    const int wg = threadIdx.x >> 7;

    /* The ones rows after each V tile never change: write them once. */
    for (int i = threadIdx.x; i < WS_STAGES * WS_ONES / 4; i += WS_THREADS)
        *(uint32_t *)(sm + WS_ONES_OFF(i / (WS_ONES / 4)) + 4 * (i % (WS_ONES / 4))) = 0x38383838u;
    if (threadIdx.x == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < WS_STAGES; ++s) {
            mbar_init(bar_full + 8 * s, 1);
            mbar_init(bar_empty + 8 * s, 2 * 128); /* every consumer thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
        if (threadIdx.x == 0) {
            mbar_expect_tx(bar_q, WS_TILE);
            tma_load_2d(base + WS_Q_OFF, &tq, 0, bh * ops.nq_pad + tile * WS_ROWS, bar_q);
            for (int j = 0; j < nblk; ++j) {
                const int s = j % WS_STAGES;
                mbar_wait(bar_empty + 8 * s, ((j / WS_STAGES) & 1) ^ 1);
                mbar_expect_tx(bar_full + 8 * s, 2 * WS_TILE);
                tma_load_2d(base + WS_K_OFF(s), &tk, 0, bh * ops.nk_pad + j * WS_KEYS,
                            bar_full + 8 * s);
                tma_load_2d(base + WS_V_OFF(s), &tv, 0, (bh * nblk + j) * 128, bar_full + 8 * s);
            }
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_CONSUMER_REGS));
    typedef typename std::conditional<FMT == QVC_QK_INT8, int, float>::type sacc_t;
    const int ctid = threadIdx.x - 128, cw = ctid >> 7; /* consumer warpgroup 0/1 */
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    const qvc_attn_args &a = p.a;
    const uint64_t qd = sw128_desc(base + WS_Q_OFF + cw * 64 * 128);
    const float dq = ops.q_scale[(size_t)bh * (ops.nq_pad / WS_ROWS) + tile];
    const float *kscale = ops.k_scale + (size_t)bh * nblk;
    const float *vblk = ops.v_blk + (size_t)bh * nblk;
    const float *vmu = ops.v_mu ? ops.v_mu + (size_t)bh * nblk * 128 : NULL;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    sacc_t sacc[64], snext[64];
    float part[EXPCAST ? 68 : 64];

    mbar_wait(bar_q, 0);
    mbar_wait(bar_full, 0);
    issue_qk<FMT>(sacc, qd, base + WS_K_OFF(0));
    wg_wait<0>();
    reg_fence(sacc);

    for (int j = 0; j < nblk; ++j) {
        const int s = j % WS_STAGES;
        const int sn = (j + 1) % WS_STAGES;
        if (OVERLAP && j + 1 < nblk) {
            /* QK of the next block runs while this block's P is made */
            mbar_wait(bar_full + 8 * sn, ((j + 1) / WS_STAGES) & 1);
            issue_qk<FMT>(snext, qd, base + WS_K_OFF(sn));
        }

        float sc[16][4];
        scale_scores<FMT>(sacc, sc, (dq * kscale[j]) * a.scale_log2, j * WS_KEYS, ops.nk, tig);
        online_max(sc, m, l, o);

        uint32_t pa[4][4];
        float rs[2] = {0.0f, 0.0f};
        const float mr0 = m[0] == -INFINITY ? 0.0f : m[0];
        const float mr1 = m[1] == -INFINITY ? 0.0f : m[1];
#pragma unroll
        for (int c = 0; c < 4; ++c) qvc_pack_p32(&sc[4 * c], mr0, mr1, EXPCAST, rs, pa[c]);

        const uint64_t vd = sw128_desc(base + WS_V_OFF(s));
        wg_fence();
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (EXPCAST)
                wgmma_pv_ones(*(float(*)[68])part, pa[c], vd + 2 * c, c);
            else
                wgmma_pv(*(float(*)[64])part, pa[c], vd + 2 * c, c);
        }
        wg_commit();
        wg_wait<0>(); /* PV of this block, and QK of the next if issued */
        reg_fence(part);
        mbar_arrive(bar_empty + 8 * s);

        if (EXPCAST) {
            rs[0] = part[64]; /* row g, column 128 + 2 tig: every column the same sum */
            rs[1] = part[66];
        } else {
            rs[0] = qvc_quad_sum(rs[0]);
            rs[1] = qvc_quad_sum(rs[1]);
        }
        l[0] += rs[0];
        l[1] += rs[1];
        const float vb = vblk[j];
        if (vmu) {
            const float *mu = vmu + (size_t)j * 128;
#pragma unroll
            for (int n = 0; n < 16; ++n) {
                const float2 mu2 = __ldg((const float2 *)(mu + n * 8 + 2 * tig));
                o[n * 4 + 0] += part[n * 4 + 0] * vb + rs[0] * mu2.x;
                o[n * 4 + 1] += part[n * 4 + 1] * vb + rs[0] * mu2.y;
                o[n * 4 + 2] += part[n * 4 + 2] * vb + rs[1] * mu2.x;
                o[n * 4 + 3] += part[n * 4 + 3] * vb + rs[1] * mu2.y;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 64; ++i) o[i] += part[i] * vb;
        }

        if (j + 1 < nblk) {
            if (OVERLAP) {
                reg_fence(snext);
#pragma unroll
                for (int i = 0; i < 64; ++i) sacc[i] = snext[i];
            } else {
                mbar_wait(bar_full + 8 * sn, ((j + 1) / WS_STAGES) & 1);
                issue_qk<FMT>(sacc, qd, base + WS_K_OFF(sn));
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
        const int row = tile * WS_ROWS + cw * 64 + warp * 16 + g + 8 * r;
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
        if (a.lse && tig == 0)
            a.lse[b * a.lsb + h * a.lsh + (int64_t)row * a.lsn] =
                empty ? -INFINITY : (m[r] + log2f(l[r]) - amp) * 0.69314718055994531f;
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

template <int FMT, int EXPCAST, int OVERLAP>
static qva_status launch_ws(const CUtensorMap *m, const ws_params *p, cudaStream_t st) {
    void (*k)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const ws_params) =
        attn_qk8_pv8_ws_128x128<FMT, EXPCAST, OVERLAP>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, WS_SMEM_BYTES);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn_qk8_pv8_ws smem attribute");
    dim3 grid((unsigned)(p->ops.nq_pad / WS_ROWS), (unsigned)p->ops.BH);
    k<<<grid, WS_THREADS, WS_SMEM_BYTES, st>>>(m[0], m[1], m[2], *p);
    return qvc_launch_check("attn_qk8_pv8_ws");
}

extern "C" qva_status qvc_attn_qk8_pv8_ws(const qvc_ops *ops, qvc_qk_format fmt,
                                          const qvc_attn_args *a, int overlap, cudaStream_t st) {
    if (ops->D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_qk8_pv8_ws: head dim %d (128 only)", ops->D);
    CUtensorMap maps[3];
    qva_status r;
    if ((r = make_map(&maps[0], ops->q_i8, (uint64_t)ops->BH * ops->nq_pad, 128)) != QVA_OK ||
        (r = make_map(&maps[1], ops->k_i8, (uint64_t)ops->BH * ops->nk_pad, 128)) != QVA_OK ||
        (r = make_map(&maps[2], ops->v_t, (uint64_t)ops->BH * ops->nblk * 128, 128)) != QVA_OK)
        return r;
    ws_params p;
    p.ops = *ops;
    p.a = *a;
    const int ec = a->expcast != 0;
#define QVC_WS_CASE(F, E, O)                                                   \
    if (fmt == F && ec == E && (overlap != 0) == O) return launch_ws<F, E, O>(maps, &p, st);
    QVC_WS_CASE(QVC_QK_INT8, 0, 0)
    QVC_WS_CASE(QVC_QK_INT8, 0, 1)
    QVC_WS_CASE(QVC_QK_INT8, 1, 0)
    QVC_WS_CASE(QVC_QK_INT8, 1, 1)
    QVC_WS_CASE(QVC_QK_E4M3, 0, 0)
    QVC_WS_CASE(QVC_QK_E4M3, 0, 1)
    QVC_WS_CASE(QVC_QK_E4M3, 1, 0)
    QVC_WS_CASE(QVC_QK_E4M3, 1, 1)
#undef QVC_WS_CASE
    return qvi_fail(QVA_ERR_UNSUPPORTED, "attn_qk8_pv8_ws: no variant");
}
