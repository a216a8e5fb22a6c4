/*
 * DraftAttention2 on the CPU (src/cpu/draft.c): the pure pieces of the
 * phased attention that the tests check.  The plan, the partition and the
 * router it runs over are the shared lower layer in src/draft/; the entry
 * point qvi_cpu_draft is declared in internal.h.  docs/DRAFT.md gives the
 * numerics with DA2 equation numbers.
 */
#ifndef QVATTN_CPU_DRAFT_H
#define QVATTN_CPU_DRAFT_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ phases */
/*
 * DA2 Eq. 8 unit change of the INT8 phase, with s_c = eta * dv[c] (f32):
 * enter: acc_c = acc_c / s_c, l = l / eta; exit: acc_c = acc_c * s_c,
 * l = l * eta (IEEE division and multiplication).  dv[c] must be nonzero.
 * eta comes from the plan (qvi_draft_eta, src/draft/plan.h).
 */
void qvi_draft_phase_enter(float *acc, float *l, int d, float eta,
                           const float *dv);
void qvi_draft_phase_exit(float *acc, float *l, int d, float eta,
                          const float *dv);
/* The same in FP64 (for checking that the pair is an identity). */
void qvi_draft_phase_enter_f64(double *acc, double *l, int d, double eta,
                               const double *dv);
void qvi_draft_phase_exit_f64(double *acc, double *l, int d, double eta,
                              const double *dv);

/* ------------------------------------------------------------ probes */
/*
 * For tests: qvi_cpu_draft with the router's route filtered after the
 * fact.  Operands, scales and quotas are the call's own (the low-bit
 * scales come from the whole video part whatever the route), so a probe
 * that drops pairs computes the same per-block quantities over fewer
 * blocks: what a ring merge of key subsets needs (docs/DRAFT.md, "LSE").
 *   keep        NULL, or B*H*R*R flags ([b*H + h][a*R + b']): a routed pair
 *               whose flag is 0 is skipped
 *   drop_prefix video queries skip the prefix keys (prefix queries stay
 *               dense over every key)
 *   prec_out    NULL, or B*H*R*R: each head's precision matrix, filtered
 */
typedef struct qvi_draft_probe {
    const uint8_t *keep;
    int drop_prefix;
    uint8_t *prec_out;
} qvi_draft_probe;
qva_status qvi_cpu_draft_probe(qva_context_t *ctx, const qva_config *cfg,
                               const qva_tensor *q, const qva_tensor *k,
                               const qva_tensor *v, const qva_tensor *out,
                               const qva_tensor *lse, const qvi_draft_probe *probe);

#ifdef __cplusplus
}
#endif
#endif
