/*
 * attn8_ws_128x128: the Hopper 8-bit attention kernel (head dim 128, and
 * 64 in the same 128-wide tiles) of sage8, vc8 (INT8 QK) and fp8 (E4M3
 * QK); E4M3 PV, FP32 online softmax.
 *
 * QK with per-row (or per-block) Q and per-block K scales, E4M3 P codes
 * from exp2 or ExpCast, a fresh FP32 PV partial per 128-key block, the
 * V-Smooth rank-1 restore.  How the tensor cores are fed:
 *
 *   producer   warpgroup 0: one thread TMA-loads the Q tile and a ring of
 *              K / V^T (/ V-Smooth means) stages, each completing on an
 *              mbarrier; its registers go to the consumers (setmaxnreg)
 *   mainloop   warpgroups 1-3 (INT8; 1, 2 for E4M3), 64 query rows each:
 *                S = Q K^T   wgmma m64n128k32, A and B from shared memory
 *                P codes     built in registers (S accumulator layout)
 *                O_j = P V   wgmma m64n128k32 (n136 with ExpCast: eight
 *                            ones rows after V give the decoded row sum),
 *                            A from registers; with V in two E4M3 digits
 *                            (+v2) a second product on the lo tile, n128,
 *                            into the same partial (attn8_v2_flags)
 *                O += R M    V-Smooth's mean restore, one wgmma m64n128k16
 *                            (FP16) per 16 key blocks (attn8_restore.cuh)
 *   epilogue   out = O * chan_scale / l, and the LSE
 *
 * Every tile is 128-byte rows with the 128-byte swizzle, written by TMA and
 * read by wgmma through the same layout.  V^T is K-major with the key order
 * of qvc_pv_slot_key(), so the S accumulator fragment is the PV A fragment.
 *
 * The INT8 path's softmax (docs/NUMERICS.md): the row max on the integer
 * scores, each score to float by one I2FP (exact), the ExpCast argument t = x * 8f + (119.65 -
 * 8m) and the exp2 argument x * f + (8.807 - m) as one FMA per score, so a
 * code can differ by one step from the reference's three-rounding form.
 * ExpCast's FMA computes t/128 saturated to [0, 1], which is the clamp
 * (qvi_expcast_ts: the same codes, one instruction per score fewer).
 * Each of its three consumer warpgroups runs QK, softmax, PV and the O
 * update of a block in turn; the tensor pipe stays fed from the other two.
 * The fp8 path scales float scores and runs QK, softmax, PV in sequence
 * with two warpgroups.  Other schedules were tried in dev/cuda (its README
 * says what each taught).
 */
#include "dense/attn8_ws.cuh"

/* ------------------------------------------------------------ host */
extern "C" qva_status qvc_attn8_ws_128x128(const qvc_ops *ops, qvc_qk_format fmt,
                                           const qvc_attn_args *a, cudaStream_t st) {
    if (ops->D != 64 && ops->D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_ws_128x128: head dim %d (64 or 128)", ops->D);
    if (ops->v_t_lo && (fmt == QVC_QK_E4M3 || ops->D != 128))
        return qvi_fail(QVA_ERR_UNSUPPORTED, "attn8_ws_128x128: V's second digit takes INT8 QK "
                                             "at head dim 128");
    const int d64 = ops->D == 64;
    if (fmt == QVC_QK_E4M3)
        return d64 ? attn8_launch<attn8_ws_flags<QVC_QK_E4M3, 64>>(ops, a, st)
                   : attn8_launch<attn8_ws_flags<QVC_QK_E4M3, 128>>(ops, a, st);
    if (ops->v_t_lo) return attn8_launch<attn8_v2_flags>(ops, a, st);
    return d64 ? attn8_launch<attn8_ws_flags<QVC_QK_INT8, 64>>(ops, a, st)
               : attn8_launch<attn8_ws_flags<QVC_QK_INT8, 128>>(ops, a, st);
}
