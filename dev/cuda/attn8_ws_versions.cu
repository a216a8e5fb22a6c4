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
 *
 * ws37 (head dim 64 with four INT8 consumer warpgroups, 256 query rows a
 * CTA) was promoted; it is at 6872baa.  ws43 (the INT8 loop's block
 * scales in stage words) was promoted; it is at d316081.
 * ws44 (V-Smooth's pending row sums one word per block and quad) and the
 * diagnostics ws45-ws48 (the restore's parts left out) are at 2d64c00.
 * ws49-ws52 (the reuse step's pending sums and their rescale under the
 * next QK; O's rescale after the PV issue) are at 3488159; ws51 was
 * promoted for the code sum's plain steps (LATE_RESCALE_PMODES).
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
