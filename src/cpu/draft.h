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

#ifdef __cplusplus
}
#endif
#endif
