/*
 * The arithmetic of one block of attn_draft_ws_128x128 (attn_draft_ws.cuh
 * includes this after the layout, whose DW_HALF and DW_NEAR_FULL it
 * uses): the 16-bit wgmma forms, the softmax pieces of both phases, the
 * Eq. 8 unit change and the INT8 block's partial (FP32, or Table 6's FP16).
 */
#ifndef QVATTN_ATTN_DRAFT_WS_MATH_CUH
#define QVATTN_ATTN_DRAFT_WS_MATH_CUH

/* ------------------------------------------------------------ 16-bit wgmma */
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
#define QK16_RS(T)                                                                           \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                             \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " " ACC64                         \
    ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
/* S (64x128) = (ACC: +=) Q (64x16, the thread's A fragment in registers)
 * K^T (16x128, smem, K-major); ACC 0 is the first k-step, write-only. */
template <int F16, int ACC>
static __device__ __forceinline__ void wgmma_qk16(float (&d)[64], const uint32_t (&a)[4],
                                                  uint64_t db) {
    if (ACC) {
        if (F16)
            asm volatile(QK16_RS("f16") : F64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
        else
            asm volatile(QK16_RS("bf16") : F64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    } else {
        if (F16)
            asm volatile(QK16_RS("f16") : W64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
        else
            asm volatile(QK16_RS("bf16") : W64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
    }
}
#undef QK16_RS
#undef W64
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

/* Head dim 64: O (64x64) += P (64x16) V (16x64, the V^T tile's 64 rows). */
template <int F16>
static __device__ __forceinline__ void wgmma_pv16_n64(float (&d)[32], const uint32_t *a, uint64_t db) {
    if (F16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " ACC32
            ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
            : F32(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ACC32
            ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
            : F32(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* Descriptor of k-step kk (16 channels = 32 bytes) of a [rows][128] 16-bit
 * tile stored as two swizzled halves of 64 channels, `half` bytes apart. */
static __device__ __forceinline__ uint64_t desc16(uint32_t addr, int kk, uint32_t half) {
    return sw128_desc(addr + (uint32_t)(kk >> 2) * half) + 2 * (kk & 3);
}

/* The consumer thread's Q16 A fragments, loaded once per work item so that
 * the QK of every 16-bit block reads only K from shared memory (48 KB of
 * the 160 KB a block pair's wgmmas read) and builds no Q descriptors: rows
 * R and R + 8 of the Q16 tile at q_addr (two 64-channel halves DW_HALF
 * apart, 128-byte rows whose 16-byte chunks sit at chunk ^ (row & 7), the
 * TMA's 128-byte swizzle); k-step kk holds channels 16 kk + 2 tig (+1) in
 * words 0 (row R) and 1 (row R + 8), eight channels on in words 2 and 3. */
template <int D>
static __device__ __forceinline__ void load_q16_frags(uint32_t q_addr, int R, int tig,
                                                      uint32_t (&qf)[D / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int row = R + 8 * (u & 1), c = 16 * kk + 2 * tig + 8 * (u >> 1);
            const int byte = (c & 63) * 2;
            const uint32_t a = q_addr + (uint32_t)(c >> 6) * DW_HALF + (uint32_t)row * 128 +
                               (uint32_t)((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
            qf[kk][u] = ld_shared_u32(a);
        }
}

/* S = Q K^T of one block from Q's fragments, the first k-step write-only
 * (scale-d 0), so neither the compiler nor ptxas sees a read of the old S;
 * D / 16 k-steps (head dim 64: the K tile's first half only). */
template <int F16, int D = 128>
static __device__ __forceinline__ void issue_qk16(float (&s)[64], uint32_t (&qf)[D / 16][4],
                                                  uint32_t k_addr) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) reg_fence(qf[kk]);
    wg_fence();
    wgmma_qk16<F16, 0>(s, qf[0], desc16(k_addr, 0, DW_HALF));
#pragma unroll
    for (int kk = 1; kk < D / 16; ++kk) wgmma_qk16<F16, 1>(s, qf[kk], desc16(k_addr, kk, DW_HALF));
    wg_commit();
}
template <int F16, int D = 128>
static __device__ __forceinline__ void issue_pv16(float (&o)[D / 2], uint32_t (&pa)[8][4],
                                                  uint32_t v_addr) {
    /* P and O are final before the fence: otherwise the compiler may sink
     * their last writes between the wgmmas, and ptxas serializes them */
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) reg_fence(pa[kk]);
    reg_fence(o);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        if constexpr (D == 64)
            wgmma_pv16_n64<F16>(o, pa[kk], desc16(v_addr, kk, DW_HALF));
        else
            wgmma_pv16<F16>(o, pa[kk], desc16(v_addr, kk, DW_HALF));
    }
    wg_commit();
}

/* ------------------------------------------------------------ softmax pieces */
/* The row maxima from the raw scores, keys >= valid left out (the
 * accumulators are only read: writing the mask into them made ptxas
 * serialize the wgmmas), times f (> 0, so the max commutes with the
 * scaling), raised by m.  FROM: the caller knows that the keys of column
 * groups nt < FROM are valid (valid >= 8 FROM), so only the others are
 * masked. */
template <int FROM = 0>
static __device__ __forceinline__ void raw_max16(const float (&s)[64], float f, int valid, int tig,
                                                 const float *m, float *mx) {
    const int lim = valid - 2 * tig; /* key nt*8 + 2 tig + e1 is valid iff nt*8 + e1 < lim */
    /* The four chains start at their first column group, not at -inf:
     * fmaxf(-inf, x) is x but for a NaN x, and a chain of NaNs only ever
     * meets fmaxf below (the quad, m), which drops it as it drops -inf,
     * so mx is the same and a max per chain is saved. */
    float a0[4], a1[4];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
        const bool v0 = nt < FROM || nt * 8 < lim, v1 = nt < FROM || nt * 8 + 1 < lim;
        const float b0 = fmaxf(v0 ? s[nt * 4 + 0] : -INFINITY, v1 ? s[nt * 4 + 1] : -INFINITY);
        const float b1 = fmaxf(v0 ? s[nt * 4 + 2] : -INFINITY, v1 ? s[nt * 4 + 3] : -INFINITY);
        a0[nt & 3] = nt < 4 ? b0 : fmaxf(a0[nt & 3], b0);
        a1[nt & 3] = nt < 4 ? b1 : fmaxf(a1[nt & 3], b1);
    }
    mx[0] = fmaxf(m[0], qvc_quad_max(fmaxf(fmaxf(a0[0], a0[1]), fmaxf(a0[2], a0[3]))) * f);
    mx[1] = fmaxf(m[1], qvc_quad_max(fmaxf(fmaxf(a1[0], a1[1]), fmaxf(a1[2], a1[3]))) * f);
}

/* p = 2^(x f - m) with one FMA per score; keys >= valid give 0 (FROM as
 * in raw_max16).  rs: this thread's part of the rows' sums (its 32
 * scores); the quad's four parts make a row's. */
template <int F16, int FROM = 0>
static __device__ __forceinline__ void probs16_fused(const float (&s)[64], float f, const float *m,
                                                     int valid, int tig, float *rs,
                                                     uint32_t (&pa)[8][4]) {
    const float m0 = -qvc_softmax_shift(m[0]), m1 = -qvc_softmax_shift(m[1]);
    const int lim = valid - 2 * tig;
    float r0[2], r1[2]; /* from the first two k-steps' sums: p >= +0, so 0 + x is x */
#define DW_P(x, nt, e1, mm) \
    ((nt) < FROM || (nt) * 8 + (e1) < lim ? ex2_ftz(__fmaf_rn((x), f, (mm))) : 0.0f)
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const float *lo = s + 8 * kk, *hi = lo + 4;
        const int na = 2 * kk, nb = 2 * kk + 1;
        const float p0 = DW_P(lo[0], na, 0, m0), p1 = DW_P(lo[1], na, 1, m0);
        const float p2 = DW_P(lo[2], na, 0, m1), p3 = DW_P(lo[3], na, 1, m1);
        const float p4 = DW_P(hi[0], nb, 0, m0), p5 = DW_P(hi[1], nb, 1, m0);
        const float p6 = DW_P(hi[2], nb, 0, m1), p7 = DW_P(hi[3], nb, 1, m1);
        r0[kk & 1] = kk < 2 ? (p0 + p1) + (p4 + p5) : r0[kk & 1] + ((p0 + p1) + (p4 + p5));
        r1[kk & 1] = kk < 2 ? (p2 + p3) + (p6 + p7) : r1[kk & 1] + ((p2 + p3) + (p6 + p7));
        pa[kk][0] = qvc_pack2<F16>(p0, p1);
        pa[kk][1] = qvc_pack2<F16>(p2, p3);
        pa[kk][2] = qvc_pack2<F16>(p4, p5);
        pa[kk][3] = qvc_pack2<F16>(p6, p7);
    }
#undef DW_P
    rs[0] = r0[0] + r0[1];
    rs[1] = r1[0] + r1[1];
}

/* Two values rounded to FP16 with saturation in one conversion:
 * cvt.rn.satfinite rounds to FP16 and clamps to +-65504 (NaN stays NaN),
 * which is exactly qvc_f16_sat (round_f16_sat). */
static __device__ __forceinline__ float2 f16_sat2(float a, float b) {
    uint32_t h;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(h) : "f"(b), "f"(a));
    return __half22float2(*(const __half2 *)&h);
}

/* Eq. 8 unit change of O and l on leaving the INT8 phase: O_c times
 * eta*delta_c, l times eta (the mma.sync kernel's dg_phase_scale, exit).
 * Its entry (O_c / (eta*delta_c), l / eta) is the identity here: the INT8
 * phase is the walk's first, so O and l are still zero, and eta*delta_c
 * is positive (prep writes delta_c = 1 where a channel's scale is not
 * positive), so every quotient is +0, as on the CPU. */
template <int N>
static __device__ __forceinline__ void phase_exit(float (&o)[N], float *l, const float *dv,
                                                  float eta, int tig) {
#pragma unroll
    for (int n = 0; n < N / 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            o[n * 4 + e] = __fmul_rn(o[n * 4 + e], __fmul_rn(eta, __ldg(dv + n * 8 + 2 * tig + (e & 1))));
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = __fmul_rn(l[r], eta);
}

/* ------------------------------------------------------------ INT8 phase */
/* One INT8 block's softmax: the row max on the integer scores, the new
 * running max (O and l rescaled), and the E4M3 P codes by one FMA per
 * score; rs gets the FP32 row sums (quad-partial) without ExpCast.  Keys
 * of column groups >= FROM masked by valid (all valid: no mask). */
template <int EXPCAST, int MASK, int FROM, int N>
static __device__ __forceinline__ void softmax8_part(int (&sacc)[64], const float (&f)[2], int valid,
                                                     float ec_add, int tig, float (&m)[2],
                                                     float (&l)[2], float (&o)[N],
                                                     float (&rs)[2], uint32_t (&pa)[4][4]) {
    float mx[2];
    rs[0] = rs[1] = 0.0f;
    int_row_max<1, FROM>(sacc, f[0], f[1], 0, valid, tig, mx);
    mx[0] = fmaxf(mx[0], m[0]);
    mx[1] = fmaxf(mx[1], m[1]);
    qvc_softmax_raise<QVC_SM_SKIP_UNCHANGED>(mx, m, l, qvc_rows_of(o));
    make_p_fused<EXPCAST, MASK, 1, 1, FROM>(sacc, f[0], f[1], m[0], m[1], ec_add, 0, valid, tig, rs,
                                            pa);
}
template <int EXPCAST, int N>
static __device__ __forceinline__ void softmax8(int (&sacc)[64], const float (&f)[2], int valid,
                                                float ec_add, int tig, float (&m)[2], float (&l)[2],
                                                float (&o)[N], float (&rs)[2],
                                                uint32_t (&pa)[4][4]) {
    if (valid >= WS_KEYS)
        softmax8_part<EXPCAST, 0, 0>(sacc, f, valid, ec_add, tig, m, l, o, rs, pa);
    else if (valid >= DW_NEAR_FULL)
        softmax8_part<EXPCAST, 1, DW_NEAR_FULL / 8>(sacc, f, valid, ec_add, tig, m, l, o, rs, pa);
    else
        softmax8_part<EXPCAST, 1, 0>(sacc, f, valid, ec_add, tig, m, l, o, rs, pa);
}

/* O += the block's PV partial, in FP32 or (acc16) rounded to FP16 with
 * saturation (Table 6); l += its row sum (ExpCast: the decoded sum from the
 * ones rows, the partial's columns D..D+7).  acc16 is uniform over the
 * call: a branch per block, where a second copy of the loop made ptxas
 * spill (120 bytes of stack). */
template <int EXPCAST, int D = 128>
static __device__ __forceinline__ void add_part8(float (&o)[D / 2], float (&l)[2],
                                                 const float (&part)[PV_REGS(D, EXPCAST)],
                                                 float (&rs)[2], int acc16) {
    if (EXPCAST) {
        rs[0] = part[D / 2], rs[1] = part[D / 2 + 2];
    } else {
        rs[0] = qvc_quad_sum(rs[0]);
        rs[1] = qvc_quad_sum(rs[1]);
    }
    if (acc16) {
#pragma unroll
        for (int i2 = 0; i2 < D / 2; i2 += 2) {
            const float2 h = f16_sat2(part[i2], part[i2 + 1]);
            o[i2] = __fadd_rn(o[i2], h.x);
            o[i2 + 1] = __fadd_rn(o[i2 + 1], h.y);
        }
    } else {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = __fadd_rn(o[i], part[i]);
    }
    l[0] = __fadd_rn(l[0], rs[0]);
    l[1] = __fadd_rn(l[1], rs[1]);
}

#endif
