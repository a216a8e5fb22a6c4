/*
 * The route of one head as DraftAttention2 takes it (src/draft/route.c):
 * pooling (DA2 Eq. 1), the draft map (Eq. 2) and the ranking with the
 * plan's quotas (Algorithm 1), composed once.  The CPU reference
 * (src/cpu/draft.c) routes every head with it and the route-quality report
 * (src/draft_report.c) reads the kept set from it, so the report judges
 * exactly the pairs the method keeps.  docs/DRAFT.md §3.
 */
#ifndef QVATTN_DRAFT_ROUTE_H
#define QVATTN_DRAFT_ROUTE_H

#include "draft/partition.h"
#include "draft/plan.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The router's buffers of one head (R = the layout's regions). */
typedef struct qvi_draft_route_buf {
    float *qavg, *qmax, *kavg, *kmax; /* R*d pooled descriptors         */
    float *A;                         /* R*R draft map                  */
    uint8_t *prec;                    /* R*R: 16, 8, 4 or 0 (skipped)    */
} qvi_draft_route_buf;

/* Allocates every buffer for R regions of d channels (all or nothing). */
qva_status qvi_draft_route_buf_alloc(int64_t R, int d, qvi_draft_route_buf *b);
void qvi_draft_route_buf_free(qvi_draft_route_buf *b);

/*
 * Routes one head: qv and kv are the packed video part of its Q and K (R
 * blocks of c rows of P->d channels, f32 as loaded, before any 16-bit
 * rounding); b->prec receives the precision of each region pair (a*R + b).
 * Everything else in b is scratch the caller may read afterwards.  The
 * assignment is qvi_draft_route_head's: the plan's quotas (Algorithm 1),
 * or this head's own under the MASS budget; quota receives the head's
 * counts.  Both callers take it, so the report judges what the method keeps.
 */
qva_status qvi_draft_route_packed(const qva_config *cfg, const qvi_draft_plan *P,
                                const qvi_draft_layout *L, const float *qv,
                                const float *kv, const qvi_draft_route_buf *b,
                                int64_t quota[4]);

#ifdef __cplusplus
}
#endif
#endif
