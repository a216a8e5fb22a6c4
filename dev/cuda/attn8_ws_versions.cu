/*
 * Versions of the 8-bit Hopper kernel under trial.  Each is the library's
 * attn8_ws_128x128 (src/cuda/dense/attn8_ws.cuh) with other flags, or a
 * kernel of its own built from the same pieces; the driver (driver.c) runs
 * it through the library's preparation and checks it against the CPU
 * reference.  README.md says how to add one and how to promote it.
 *
 *   ws5   the library kernel without the short softmax chains: the row max
 *         as one chain and the exp2 row sum in one accumulator per row
 *         (measured as fast as the default on sage8, 1% slower on vc8
 *         with the two-warpgroup ping-pong kernel)
 *   ws44  the library kernel with PEND_QUADS: V-Smooth's pending row sums
 *         one word per block and quad, stored by every lane of the quad
 *         (one conversion and one store a block, at an address only the
 *         uniform block index moves), instead of a predicated pair of
 *         16-bit stores into the owning thread's fragment words and their
 *         per-thread addressing, which the reuse step's loop recomputes
 *         from the thread index every block (about 20 of its 509
 *         instructions on the near-full path)
 *
 * ws37 (head dim 64 with four INT8 consumer warpgroups, 256 query rows a
 * CTA) was promoted; it is at 6872baa.  ws43 (the INT8 loop's block
 * scales in stage words, STAGE_SCALES) was promoted; it is at d316081.
 * The versions of the three-warpgroup kernel's trial (ws27: the ping-pong
 * with each warpgroup's PV under its next softmax; ws28-ws30: diagnostic
 * loops without the softmax or the O update; ws31, ws32: three consumer
 * warpgroups, promoted) and ws9 (the restore's tiles from global memory)
 * are at commit 560527d, with the two-warpgroup ping-pong kernel they were
 * measured against; ws33 (one shared mean tile per batch) and ws34 (the
 * loop without CARRY) at 0c7dcb4; ws35, ws36 (a share of the exp2 path
 * on the FMA pipe, three warpgroups) at 40cc920.  bench/NOTES.md has what
 * each measured.
 */
#include "dense/attn8_ws.cuh"

/* ------------------------------------------------------------ ws5 */
struct ws5_flags : attn8_ws_flags<QVC_QK_INT8> {
    static constexpr bool SHORT_CHAINS = false;
};

extern "C" qva_status dev_attn8_ws5(const qvc_ops *ops, qvc_qk_format fmt,
                                    const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8 || ops->D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev ws5: INT8 QK (sage8, vc8) at head dim 128");
    if (ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: not V in two digits (+v2)");
    return attn8_launch<ws5_flags>(ops, a, st);
}


/* ------------------------------------------------------------ ws44 */
template <int D>
struct ws44_flags : attn8_ws_flags<QVC_QK_INT8, D> {
    static constexpr bool PEND_QUADS = true;
};

extern "C" qva_status dev_attn8_ws44(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev ws44: INT8 QK (sage8, vc8)");
    if (ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: not V in two digits (+v2)");
    return ops->D == 64 ? attn8_launch<ws44_flags<64> >(ops, a, st)
                        : attn8_launch<ws44_flags<128> >(ops, a, st);
}


/* ------------------------------------------------------------ ws45, ws46 */
/* Diagnostics (wrong outputs; perf only): the reuse step without the
 * restore's flush wgmma (ws45), without its pending sums (ws46), or
 * without either (ws47), or with its pending sums stored but never
 * rescaled (ws48). */
template <int DIAG>
struct diag_flags : attn8_ws_flags<QVC_QK_INT8, 128> {
    static constexpr int DIAG_RESTORE = DIAG;
};

extern "C" qva_status dev_attn8_ws45(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8 || ops->D != 128 || ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev ws45: INT8 QK at head dim 128");
    return attn8_launch<diag_flags<1> >(ops, a, st);
}

extern "C" qva_status dev_attn8_ws46(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8 || ops->D != 128 || ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev ws46: INT8 QK at head dim 128");
    return attn8_launch<diag_flags<2> >(ops, a, st);
}

extern "C" qva_status dev_attn8_ws47(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8 || ops->D != 128 || ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev ws47: INT8 QK at head dim 128");
    return attn8_launch<diag_flags<3> >(ops, a, st);
}

extern "C" qva_status dev_attn8_ws48(const qvc_ops *ops, qvc_qk_format fmt,
                                     const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8 || ops->D != 128 || ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev ws48: INT8 QK at head dim 128");
    return attn8_launch<diag_flags<4> >(ops, a, st);
}
