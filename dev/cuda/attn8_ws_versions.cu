/*
 * Versions of the 8-bit Hopper kernel under trial.  Each is the library's
 * attn8_ws_128x128 (src/cuda/dense/attn8_ws.cuh) with other flags, or a
 * kernel of its own built from the same pieces; the driver (driver.c) runs
 * it through the library's preparation and checks it against the CPU
 * reference.  README.md says how to add one and how to promote it.
 *
 *   ws5   the library kernel without the short softmax chains: the row max
 *         as one chain and the exp2 row sum in one accumulator per row
 *         (measured as fast as the default on sage8, 1% slower on vc8)
 */
#include "dense/attn8_ws.cuh"

struct ws5_flags : attn8_ws_flags<QVC_QK_INT8> {
    static constexpr bool SHORT_CHAINS = false;
};

/* The tensor maps and parameters every version launches with. */
static qva_status version_args(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                               CUtensorMap *maps, attn8_params *p) {
    if (fmt != QVC_QK_INT8)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "dev attn8 versions: INT8 QK only (sage8, vc8)");
    const qva_status r = attn8_maps(ops, maps);
    if (r != QVA_OK) return r;
    p->ops = *ops;
    p->a = *a;
    return QVA_OK;
}

template <class F>
static qva_status launch_version(const qvc_ops *ops, qvc_qk_format fmt, const qvc_attn_args *a,
                                 cudaStream_t st) {
    CUtensorMap maps[3];
    attn8_params p;
    const qva_status r = version_args(ops, fmt, a, maps, &p);
    if (r != QVA_OK) return r;
    return attn8_launch<F>(maps, &p, st);
}

extern "C" qva_status dev_attn8_ws5(const qvc_ops *ops, qvc_qk_format fmt,
                                    const qvc_attn_args *a, cudaStream_t st) {
    return launch_version<ws5_flags>(ops, fmt, a, st);
}
