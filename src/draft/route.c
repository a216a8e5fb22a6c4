/*
 * The route of one head (src/draft/route.h): the router's three steps in
 * the order the CPU reference has always run them.  One composition for
 * the method and the route-quality report, so the report cannot drift
 * from what the method keeps.
 */
#include "draft/route.h"
#include "draft/router.h"

#include <stdlib.h>
#include <string.h>

qva_status qvi_draft_route_buf_alloc(int64_t R, int d, qvi_draft_route_buf *b) {
    memset(b, 0, sizeof *b);
    size_t rd = (size_t)R * (size_t)d, rr = (size_t)R * (size_t)R;
    b->qavg = malloc(sizeof(float) * (rd ? rd : 1));
    b->qmax = malloc(sizeof(float) * (rd ? rd : 1));
    b->kavg = malloc(sizeof(float) * (rd ? rd : 1));
    b->kmax = malloc(sizeof(float) * (rd ? rd : 1));
    b->A = malloc(sizeof(float) * (rr ? rr : 1));
    b->prec = malloc(rr ? rr : 1);
    if (b->qavg && b->qmax && b->kavg && b->kmax && b->A && b->prec)
        return QVA_OK;
    qvi_draft_route_buf_free(b);
    return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: router buffers for %lld regions",
                    (long long)R);
}

void qvi_draft_route_buf_free(qvi_draft_route_buf *b) {
    free(b->qavg), free(b->qmax), free(b->kavg), free(b->kmax);
    free(b->A), free(b->prec);
    memset(b, 0, sizeof *b);
}

qva_status qvi_draft_route_packed(const qva_config *cfg, const qvi_draft_plan *P,
                                const qvi_draft_layout *L, const float *qv,
                                const float *kv, const qvi_draft_route_buf *b,
                                int64_t quota[4]) {
    const int64_t R = L->regions;
    qvi_draft_pool(qv, L->count, R, L->c, P->d, b->qavg, b->qmax);
    qvi_draft_pool(kv, L->count, R, L->c, P->d, b->kavg, b->kmax);
    qva_status st = qvi_draft_map(b->qavg, b->qmax, b->kavg, b->kmax, R, P->d,
                                  P->sm_scale, cfg->draft.lambda, b->A);
    return st != QVA_OK ? st
                        : qvi_draft_route_head(b->A, R, &cfg->draft, P, quota, b->prec);
}
