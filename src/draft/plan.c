/*
 * DraftAttention2 plan: the one place that validates a draft call and
 * decides what it computes (warm-up, region counts, quotas, the low-bit
 * operands needed, the dense rows, eta), for the CPU reference and the
 * CUDA backend alike; docs/DRAFT.md ("Plan", "Validation").
 */
#include "draft/plan.h"
#include "draft/budget.h"
#include "checked.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ quotas */

/* Fractions in [0,1] summing to 1 within 1e-4 (DA2 C.1 quotas). */
static qva_status check_fractions(const float f[4]) {
    static const char *name[4] = {"frac_skip", "frac4", "frac8", "frac16"};
    double sum = 0.0;
    for (int i = 0; i < 4; ++i) {
        if (!(f[i] >= 0.0f && f[i] <= 1.0f))
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                            "draft: %s = %g is outside [0, 1]", name[i],
                            (double)f[i]);
        sum += (double)f[i];
    }
    if (fabs(sum - 1.0) > 1e-4)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: fractions skip/4/8/16 sum to %.6f, not 1", sum);
    return QVA_OK;
}

qva_status qvi_draft_quotas(const qva_draft_params *p, int64_t pairs,
                            int64_t quota[4]) {
    const float f[4] = {p->frac_skip, p->frac4, p->frac8, p->frac16};
    qva_status st = check_fractions(f);
    if (st != QVA_OK)
        return st;
    if (pairs < 0 || pairs > INT64_MAX / 2000000)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft: %lld region pairs",
                        (long long)pairs);
    /* Exact rational arithmetic: fraction i is u[i]/U with u in ppm; the
     * largest remainders get one more, ties favouring 16, 8, 4, skip
     * (qvi_budget_split, which the CUDA router runs per head too). */
    int64_t u[4];
    for (int i = 0; i < 4; ++i)
        u[i] = llround((double)f[i] * 1e6);
    qvi_budget_split(u, pairs, quota);
    return QVA_OK;
}

uint64_t qvi_draft_ppm_of(uint64_t x, int64_t ppm, int round_up) {
    return qvi_budget_ppm_of(x, ppm, round_up); /* the device's too */
}

/* ------------------------------------------------------------ Eq. 8 eta */

float qvi_draft_eta(int expcast) {
    /* ExpCast puts the row max at 2^8; the exp2 path adds 8.807. */
    return expcast ? exp2f(-QVI_EXPCAST_LOG2_AMP) : QVI_SAGE_ETA;
}

/* ------------------------------------------------------------ validation */

/* The budget mode, and under MASS its share, bounds and split (the
 * fractions themselves are checked with the quotas). */
static qva_status check_budget(const qva_draft_params *p) {
    if (p->budget != QVA_DRAFT_BUDGET_QUOTA && p->budget != QVA_DRAFT_BUDGET_MASS)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: budget = %d is not a qva_draft_budget "
                        "(QVA_DRAFT_BUDGET_QUOTA = 0, QVA_DRAFT_BUDGET_MASS = 1)",
                        p->budget);
    if (p->budget == QVA_DRAFT_BUDGET_QUOTA)
        return QVA_OK; /* mass, min_keep and max_keep are not read */
    if (!(p->mass > 0.0f && p->mass <= 1.0f))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: mass = %g is outside (0, 1]: the share of each "
                        "head's draft-map mass its kept pairs must reach",
                        (double)p->mass);
    if (!(p->min_keep >= 0.0f && p->min_keep <= p->max_keep && p->max_keep <= 1.0f))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: min_keep = %g and max_keep = %g need 0 <= "
                        "min_keep <= max_keep <= 1 (shares of the R^2 region "
                        "pairs a head keeps)",
                        (double)p->min_keep, (double)p->max_keep);
    if (p->frac_skip != 0.0f)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: the mass budget decides what each head skips: "
                        "frac_skip = %g must be 0 and frac4/frac8/frac16 split "
                        "the kept pairs (sum 1)",
                        (double)p->frac_skip);
    const float f[4] = {p->frac_skip, p->frac4, p->frac8, p->frac16};
    return check_fractions(f);
}

qva_status qvi_draft_validate(const qva_config *cfg, const qva_tensor *q) {
    const qva_draft_params *p = &cfg->draft;
    int64_t n = q->shape[2];
    if (p->grid_t < 1 || p->grid_h < 1 || p->grid_w < 1)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: grid %dx%dx%d must have every dimension >= 1",
                        p->grid_t, p->grid_h, p->grid_w);
    if (p->prefix_tokens < 0 || p->prefix_tokens >= n)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: prefix_tokens = %d must be in [0, N = %lld)",
                        p->prefix_tokens, (long long)n);
    const int64_t grid[3] = {p->grid_t, p->grid_h, p->grid_w};
    int64_t video, total;
    if (!qvi_prod_i64(grid, 3, &video) || !qvi_add_i64(video, p->prefix_tokens, &total))
        return qvi_fail(QVA_ERR_SHAPE,
                        "draft: grid T*H*W + prefix = %d*%d*%d + %d overflows "
                        "int64: far more than the sequence length N = %lld",
                        p->grid_t, p->grid_h, p->grid_w, p->prefix_tokens,
                        (long long)n);
    if (total != n)
        return qvi_fail(QVA_ERR_SHAPE,
                        "draft: grid T*H*W + prefix = %lld*%d*%d + %d = %lld "
                        "but the sequence length N = %lld",
                        (long long)p->grid_t, p->grid_h, p->grid_w,
                        p->prefix_tokens, (long long)total, (long long)n);
    if (p->dense_warmup_steps < 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: dense_warmup_steps = %d must be >= 0",
                        p->dense_warmup_steps);
    if (!qvi_draft_warmup_method_ok(p->warmup_method))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: warmup_method = %d must be a dense method (bf16, the "
                        "default; exact, fp8, sage8, vc8, sage4, vc4)",
                        (int)p->warmup_method);
    if (p->capacity < 1)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: capacity = %d must be positive", p->capacity);
    if (p->capacity != QVI_BLOCK)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "draft: capacity %d unsupported; the region capacity "
                        "must equal the attention block (%d)",
                        p->capacity, QVI_BLOCK);
    if (!(p->lambda >= 0.0f && p->lambda <= 1.0f))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: lambda = %g is outside [0, 1]", (double)p->lambda);
    if (p->int8_acc != QVA_DRAFT_ACC_FP32 && p->int8_acc != QVA_DRAFT_ACC_FP16)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: int8_acc = %d (QVA_DRAFT_ACC_FP32 or QVA_DRAFT_ACC_FP16)",
                        p->int8_acc);
    return check_budget(p);
}

/* Eq. 20: regions per frame ceil(H*W / C); -1 for a grid or capacity that
 * is unset (the callers' own checks then speak). */
int64_t qvi_draft_regions_per_frame(const qva_draft_params *dp) {
    if (dp->grid_h <= 0 || dp->grid_w <= 0 || dp->capacity <= 0)
        return -1; /* int fields: the int64 product cannot overflow */
    return ((int64_t)dp->grid_h * dp->grid_w + dp->capacity - 1) / dp->capacity;
}

qva_status qvi_draft_mass_bounds(const qva_draft_params *dp, int64_t M, int64_t *mass_ppm,
                                 int64_t *keep_min, int64_t *keep_max) {
    qva_status st = check_budget(dp);
    if (st != QVA_OK)
        return st;
    if (dp->budget != QVA_DRAFT_BUDGET_MASS)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "draft: the mass bounds of a QUOTA budget");
    if (M < 0 || M > INT64_MAX / 2000000) /* as qvi_draft_quotas */
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft: %lld region pairs", (long long)M);
    *mass_ppm = llround((double)dp->mass * 1e6);
    *keep_min = (int64_t)qvi_draft_ppm_of((uint64_t)M, llround((double)dp->min_keep * 1e6), 1);
    *keep_max = (int64_t)qvi_draft_ppm_of((uint64_t)M, llround((double)dp->max_keep * 1e6), 0);
    return QVA_OK;
}

/* The MASS budget's integers (validated by check_budget): p in parts per
 * million, the floor rounded up and the cap down to whole pairs.  The
 * quotas stay zero: each head gets its own (qvi_draft_route_head). */
static qva_status plan_mass(const qva_draft_params *dp, qvi_draft_plan *p) {
    p->mass = 1;
    return qvi_draft_mass_bounds(dp, p->regions * p->regions, &p->mass_ppm, &p->keep_min,
                                 &p->keep_max);
}

void qvi_draft_stats_add(qva_draft_stats *st, int64_t M, int64_t skipped) {
    const double share = M > 0 ? (double)(M - skipped) / (double)M : 0.0;
    st->kept_min = st->heads == 0 || share < st->kept_min ? share : st->kept_min;
    st->kept_max = st->heads == 0 || share > st->kept_max ? share : st->kept_max;
    st->kept_mean += share; /* a sum until qvi_draft_stats_finish divides */
    st->heads += 1;
    st->pairs = M;
}

void qvi_draft_stats_finish(qva_draft_stats *st) {
    if (st->heads > 0)
        st->kept_mean /= (double)st->heads;
}

qva_status qvi_draft_plan_make(const qva_config *cfg, const qva_tensor *q,
                               qvi_draft_plan *p) {
    memset(p, 0, sizeof(*p));
    qva_status st = qvi_draft_validate(cfg, q);
    if (st != QVA_OK)
        return st;
    const qva_draft_params *dp = &cfg->draft;
    p->n = q->shape[2];
    p->d = (int)q->shape[3];
    p->warmup = cfg->step < dp->dense_warmup_steps;
    /* validate() bounded C = 128 and the grid by N */
    p->rf = (int)qvi_draft_regions_per_frame(dp);
    p->regions = (int64_t)dp->grid_t * p->rf;
    st = dp->budget == QVA_DRAFT_BUDGET_MASS ? plan_mass(dp, p)
                                             : qvi_draft_quotas(dp, p->regions * p->regions,
                                                                p->quota);
    if (st != QVA_OK)
        return st;
    if (p->mass) { /* some head may get these phases */
        p->with4 = !p->warmup && p->keep_max > 0 && llround((double)dp->frac4 * 1e6) > 0;
        p->with8 = !p->warmup && p->keep_max > 0 && llround((double)dp->frac8 * 1e6) > 0;
    } else {
        p->with4 = !p->warmup && p->quota[QVI_Q_4] > 0;
        p->with8 = !p->warmup && p->quota[QVI_Q_8] > 0;
    }
    if (p->with4 && p->d % 16 != 0)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "draft: the NVFP4 path needs D %% 16 == 0 (D = %d)", p->d);
    if (p->warmup) {
        p->dense_row0 = 0;
        p->dense_rows = p->n;
    } else {
        p->dense_row0 = dp->prefix_at_end ? p->n - dp->prefix_tokens : 0;
        p->dense_rows = dp->prefix_tokens;
    }
    p->sm_scale = qvi_sm_scale(cfg, q->shape[3]);
    p->scale_log2 = p->sm_scale * QVI_LOG2E;
    p->expcast = cfg->expcast; /* the qva_expcast_mode: its beta reaches the P codes */
    p->q_rows_per_scale = qvi_q_rows_per_scale(cfg);
    p->eta = qvi_draft_eta(p->expcast);
    p->p_block = cfg->p_max == QVA_P_MAX_BLOCK;
    p->pooled = !p->warmup && cfg->skip_fill == QVA_SKIP_POOLED;
    p->int8_acc16 = dp->int8_acc == QVA_DRAFT_ACC_FP16;
    p->v_sample = cfg->v_scale == QVA_V_SCALE_SAMPLE;
    p->use_f16 = q->dtype == QVA_F16;
    return QVA_OK;
}

int qvi_draft_warmup_method_ok(qva_method m) {
    return (unsigned)m < QVA_METHOD_COUNT_ && m != QVA_METHOD_DRAFT;
}

int qvi_draft_warmup_config(const qva_config *cfg, qva_config *out) {
    const qva_method wm = cfg->draft.warmup_method;
    if (cfg->method != QVA_METHOD_DRAFT || cfg->step >= cfg->draft.dense_warmup_steps ||
        wm == QVA_METHOD_BF16 || !qvi_draft_warmup_method_ok(wm))
        return 0; /* qvi_draft_validate refuses the last */
    *out = *cfg;
    out->method = wm;
    if (!qvi_method_is_8bit(out->method)) out->expcast = 0;
    if (!qvi_method_has_int8_q(out->method)) out->q_granularity = QVA_Q_PER_ROW;
    if (!qvi_p_max_applies(out)) out->p_max = QVA_P_MAX_ROW;
    if (!qvi_v_scale_applies(out)) out->v_scale = QVA_V_SCALE_CALL;
    out->skip_fill = QVA_SKIP_DROP;
    qvi_method_defaults(out); /* the rotation and code sum the method's name gives */
    return 1;
}
