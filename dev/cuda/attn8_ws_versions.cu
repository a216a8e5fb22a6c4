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
 *   ws49  the library kernel with DEFER_PEND: on V-Smooth's steps, block
 *         j's pending row sums are stored after block j + 1's QK is
 *         issued (under its latency) instead of between block j's PV wait
 *         and its release of the stage; the values and their order in
 *         the restore are the same, so the outputs should be bit-identical
 *         (not yet run: bench/NOTES.md, "The reuse step's restore, taken
 *         apart", put the stores and rescales at 1.3-2.1% of the reuse
 *         step)
 *   ws50  ws49 with DEFER_RESCALE: the pending sums' rescale for a row max
 *         that rose at block j also moved under block j + 1's QK (before
 *         block j's sums are stored there, so they are not rescaled);
 *         bit-identical by construction, not yet run
 *   ws51  the library kernel with LATE_RESCALE: O's rescale for a rising
 *         row max (64 FMUL) issued after the PV wgmma, under it, instead
 *         of between the QK wait and the P codes (the PV writes a fresh
 *         partial, not O); plain and V-Smooth steps; not yet run
 *   ws52  ws50 with LATE_RESCALE; not yet run
 *
 * ws37 (head dim 64 with four INT8 consumer warpgroups, 256 query rows a
 * CTA) was promoted; it is at 6872baa.  ws43 (the INT8 loop's block
 * scales in stage words) was promoted; it is at d316081.
 * ws44 (V-Smooth's pending row sums one word per block and quad) and the
 * diagnostics ws45-ws48 (the restore's parts left out) are at 2d64c00.
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


/* A version over the library's flags at head dim 64 or 128: INT8 QK, one
 * V code. */
template <template <int> class FLAGS>
static qva_status launch_int8_version(const char *name, const qvc_ops *ops, qvc_qk_format fmt,
                                      const qvc_attn_args *a, cudaStream_t st) {
    if (fmt != QVC_QK_INT8)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev %s: INT8 QK (sage8, vc8)", name);
    if (ops->v_t_lo)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: not V in two digits (+v2)");
    return ops->D == 64 ? attn8_launch<FLAGS<64> >(ops, a, st)
                        : attn8_launch<FLAGS<128> >(ops, a, st);
}

/* ------------------------------------------------------------ ws49-ws52 */
template <int D>
struct ws49_flags : attn8_ws_flags<QVC_QK_INT8, D> {
    static constexpr bool DEFER_PEND = true;
};

template <int D>
struct ws50_flags : ws49_flags<D> {
    static constexpr bool DEFER_RESCALE = true;
};

template <int D>
struct ws51_flags : attn8_ws_flags<QVC_QK_INT8, D> {
    static constexpr bool LATE_RESCALE = true;
};

template <int D>
struct ws52_flags : ws50_flags<D> {
    static constexpr bool LATE_RESCALE = true;
};

/* the driver's entry points, dev_attn8_wsN */
#define INT8_VERSION(N)                                                                    \
    extern "C" qva_status dev_attn8_ws##N(const qvc_ops *ops, qvc_qk_format fmt,          \
                                          const qvc_attn_args *a, cudaStream_t st) {      \
        return launch_int8_version<ws##N##_flags>("ws" #N, ops, fmt, a, st);             \
    }
INT8_VERSION(49)
INT8_VERSION(50)
INT8_VERSION(51)
INT8_VERSION(52)
#undef INT8_VERSION
