/* Configs: the paper defaults, method names (strict parsing), and the
 * V-Smooth step schedule. */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

/* ------------------------------------------------------------ config */
void qva_config_default(qva_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->method = QVA_METHOD_VC8;
    cfg->expcast = 1;
    cfg->hadamard_seed = 0x9e3779b97f4a7c15ull;
    /* Chosen by `qvattn sweep-vsmooth` (docs/NUMERICS.md, V-Smooth). */
    cfg->vsmooth.clusters = 32;
    cfg->vsmooth.iters = 2;
    cfg->vsmooth.warm_start = 1;
    cfg->vsmooth.block = QVI_BLOCK;
    cfg->vsmooth.schedule = QVA_SCHEDULE_PAPER;
    cfg->vsmooth.refresh_every = 4;
    cfg->draft.lambda = 0.2f;
    cfg->draft.frac_skip = 0.85f;
    cfg->draft.frac16 = 0.15f;
    cfg->draft.capacity = QVI_BLOCK;
    /* The MASS budget's defaults, used once draft@pM selects it. */
    cfg->draft.budget = QVA_DRAFT_BUDGET_QUOTA;
    cfg->draft.mass = 0.95f;
    cfg->draft.min_keep = 0.05f;
    cfg->draft.max_keep = 1.0f;
    cfg->draft.warmup_method = QVA_METHOD_BF16;
    cfg->check_finite = 1;
}

static const char *const method_names[QVA_METHOD_COUNT_] = {
    "exact", "bf16", "fp8", "sage8", "vc8", "sage4", "vc4", "draft"};

/* +codesum / +fp32sum: the dense 8-bit methods' exp2 P, E4M3 or +i8pv's
 * u8 codes (ExpCast sums its codes). */
int qvi_p_sum_applies(const qva_config *cfg) {
    return qvi_method_is_8bit(cfg->method) && cfg->expcast == QVA_EXPCAST_OFF;
}

/* +v2, +i8pv: the INT8-QK dense methods' V (and, for +i8pv, P). */
int qvi_v_code_applies(qva_method m) {
    return m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8;
}

/* +kprev: the smoothed INT8 K of the dense methods, whose codes give the
 * next call's mean. */
int qvi_k_mean_applies(qva_method m) {
    return m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8;
}

/* +vprev: the E4M3 V of sage8 and vc8, one digit (+i8pv's INT8 codes use
 * their whole range, +v2's second digit its first's). */
int qvi_v_scale_applies(const qva_config *cfg) {
    if (cfg->method == QVA_METHOD_DRAFT) /* its INT8 phase's V: +vsample only so far */
        return cfg->v_scale == QVA_V_SCALE_SAMPLE;
    return qvi_v_code_applies(cfg->method) && cfg->v_code == QVA_V_E4M3;
}

/* +pblock: the E4M3 P codes of sage8, vc8 and draft's INT8 phase (not
 * +i8pv, whose u8 codes already take each block's max; not with
 * +floormass, whose floor is the running max's). */
int qvi_p_max_applies(const qva_config *cfg) {
    return (qvi_v_code_applies(cfg->method) || cfg->method == QVA_METHOD_DRAFT) &&
           cfg->v_code != QVA_V_INT8_PV && cfg->p_floor == QVA_P_FLOOR_DROP;
}

/* +floormass: ExpCast's E4M3 codes in sage8 and vc8 (the E5M2 code has
 * no such floor; +i8pv codes P from exp2). */
int qvi_p_floor_applies(const qva_config *cfg) {
    return qvi_v_code_applies(cfg->method) &&
           (cfg->expcast == QVA_EXPCAST_PAPER || cfg->expcast == QVA_EXPCAST_CENTRED) &&
           cfg->v_code != QVA_V_INT8_PV;
}

int qvi_method_is_8bit(qva_method m) {
    return m == QVA_METHOD_FP8 || m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8;
}
int qvi_method_has_int8_q(qva_method m) {
    return m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8 || m == QVA_METHOD_DRAFT;
}
int qvi_method_is_quantized(qva_method m) {
    return qvi_method_is_8bit(m) || m == QVA_METHOD_SAGE4 || m == QVA_METHOD_VC4;
}

/* A plain decimal number, digits[.digits][e[+-]digits] (what %g prints),
 * read without strtod: no sign, blank, hex, inf or nan, and no locale.
 * Returns the characters read, 0 if s does not start with such a number. */
static size_t scan_decimal(const char *s, double *out) {
    const char *p = s;
    uint64_t mant = 0;
    int exp10 = 0, digits = 0;
    for (; isdigit((unsigned char)*p); ++p, ++digits) {
        if (mant < 100000000000000000ull) mant = mant * 10 + (uint64_t)(*p - '0');
        else if (exp10 < 10000) ++exp10; /* past 17 digits: scale only */
    }
    if (!digits) return 0;
    if (*p == '.') {
        if (!isdigit((unsigned char)p[1])) return 0;
        for (++p; isdigit((unsigned char)*p); ++p)
            if (mant < 100000000000000000ull) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                --exp10;
            }
    }
    if (*p == 'e' || *p == 'E') {
        const char *e = p + 1;
        int neg = *e == '-', x = 0, n = 0;
        if (*e == '+' || *e == '-') ++e;
        for (; isdigit((unsigned char)*e); ++e, ++n)
            if (x < 10000) x = x * 10 + (*e - '0');
        if (!n) return 0;
        exp10 += neg ? -x : x;
        p = e;
    }
    /* 10^k is exact in a double for k <= 22: one correctly rounded step. */
    double v = (double)mant;
    if (mant == 0) v = 0.0; /* 0e999 */
    else if (exp10 >= 0 && exp10 <= 22) v *= pow(10.0, exp10);
    else if (exp10 < 0 && exp10 >= -22) v /= pow(10.0, -exp10);
    else v *= pow(10.0, exp10);
    *out = v;
    return (size_t)(p - s);
}

/* The shape of a list of draft percentages, for parsing and messages. */
typedef struct pct_form {
    int n;             /* numbers in the list                        */
    const char *form;  /* "S0/S4/S8/S16"                             */
    const char *eg;    /* a valid method, e.g. "draft@85/0/7.5/7.5"  */
} pct_form;

/* Parses n '/'-separated percentages in [0,100] summing to 100 into f;
 * *end is where the method string goes on (its end or a '+' option). */
static qva_status parse_percentages(const char *s, const pct_form *pf, double *f,
                                    const char **end) {
    const int n = pf->n;
    for (int i = 0; i < n; ++i) {
        /* all but the last end at '/', the last at the end or a '+' option
         * (an exponent such as 1.5e+1 may hold a '+' too) */
        size_t tok = strcspn(s, i < n - 1 ? "/" : "/+"), len = scan_decimal(s, &f[i]);
        if (i == n - 1 && len > tok && (s[len] == 0 || s[len] == '+'))
            tok = len;
        const int shown = tok < 40 ? (int)tok : 40; /* quoted in messages */
        if ((i < n - 1) != (s[tok] == '/'))
            return qvi_fail(QVA_ERR_PARSE, "draft quotas need the form %s, e.g. %s",
                            pf->form, pf->eg);
        if (len != tok || tok == 0)
            return qvi_fail(QVA_ERR_PARSE,
                            "draft quota %d '%.*s' is not a plain decimal "
                            "number (digits with an optional fraction, no "
                            "sign, blank or hex), e.g. %s",
                            i + 1, shown, s, pf->eg);
        if (!isfinite(f[i]) || f[i] > 100)
            return qvi_fail(QVA_ERR_PARSE,
                            "draft quota %d '%.*s' is outside [0,100]: the "
                            "quotas are percentages, e.g. %s",
                            i + 1, shown, s, pf->eg);
        s += tok + (i < n - 1);
    }
    *end = s;
    double sum = 0.0;
    for (int i = 0; i < n; ++i)
        sum += f[i];
    if (fabs(sum - 100.0) > 1e-3)
        return n == 4 ? qvi_fail(QVA_ERR_PARSE, "draft quotas %g/%g/%g/%g do not sum to 100",
                                 f[0], f[1], f[2], f[3])
                      : qvi_fail(QVA_ERR_PARSE,
                                 "draft split %g/%g/%g (the 4/8/16-bit shares of the "
                                 "kept pairs) does not sum to 100",
                                 f[0], f[1], f[2]);
    return QVA_OK;
}

/* Parses "S0/S4/S8/S16" percentages into the draft fractions (the QUOTA
 * budget). */
static qva_status parse_draft_quotas(const char *s, qva_draft_params *dp,
                                     const char **end) {
    static const pct_form form = {4, "S0/S4/S8/S16", "draft@85/0/7.5/7.5"};
    double f[4];
    qva_status st = parse_percentages(s, &form, f, end);
    if (st != QVA_OK)
        return st;
    dp->budget = QVA_DRAFT_BUDGET_QUOTA;
    dp->frac_skip = (float)(f[0] / 100);
    dp->frac4 = (float)(f[1] / 100);
    dp->frac8 = (float)(f[2] / 100);
    dp->frac16 = (float)(f[3] / 100);
    return QVA_OK;
}

/* Parses "pM" or "pM/S4/S8/S16" (s after the 'p') into the MASS budget:
 * M percent of the draft-map mass, the kept pairs split 4/8/16 by S4/S8/S16
 * (all 16-bit without them). */
static qva_status parse_draft_mass(const char *s, qva_draft_params *dp,
                                   const char **end) {
    static const pct_form form = {3, "pM/S4/S8/S16", "draft@p95/0/50/50"};
    double m, f[3] = {0.0, 0.0, 100.0};
    size_t len = scan_decimal(s, &m);
    size_t tok = strcspn(s, "/+");
    const int shown = tok < 40 ? (int)tok : 40;
    if (len == 0 || (s[len] && s[len] != '/' && s[len] != '+'))
        return qvi_fail(QVA_ERR_PARSE,
                        "draft mass 'p%.*s' is not a plain decimal percentage "
                        "(digits with an optional fraction), e.g. draft@p95",
                        shown, s);
    if (!(m > 0.0 && m <= 100.0))
        return qvi_fail(QVA_ERR_PARSE,
                        "draft mass p%.*s is outside (0,100]: each head keeps "
                        "region pairs until they hold this percentage of its "
                        "draft-map mass, e.g. draft@p95",
                        shown, s);
    s += len;
    *end = s;
    if (*s == '/') {
        qva_status st = parse_percentages(s + 1, &form, f, end);
        if (st != QVA_OK)
            return st;
    }
    dp->budget = QVA_DRAFT_BUDGET_MASS;
    dp->mass = (float)(m / 100);
    dp->frac_skip = 0.0f;
    dp->frac4 = (float)(f[0] / 100);
    dp->frac8 = (float)(f[1] / 100);
    dp->frac16 = (float)(f[2] / 100);
    return QVA_OK;
}

/* The method options: name, the config field it sets, and the value.
 * Options of one field are exclusive: a name may set it once. */
typedef struct method_option {
    const char *name;
    size_t field; /* offsetof(qva_config, ...), an int */
    int value;
} method_option;

static const method_option method_options[] = {
    {"expcast", offsetof(qva_config, expcast), QVA_EXPCAST_PAPER},
    {"expcast-centred", offsetof(qva_config, expcast), QVA_EXPCAST_CENTRED},
    {"expcast-e5m2", offsetof(qva_config, expcast), QVA_EXPCAST_E5M2},
    {"hadamard", offsetof(qva_config, hadamard), 1},
    {"nohadamard", offsetof(qva_config, hadamard), 0},
    {"qblock", offsetof(qva_config, q_granularity), QVA_Q_PER_BLOCK},
    {"codesum", offsetof(qva_config, p_sum), QVA_P_SUM_CODES},
    {"fp32sum", offsetof(qva_config, p_sum), QVA_P_SUM_FP32},
    {"v2", offsetof(qva_config, v_code), QVA_V_E4M3X2},
    {"i8pv", offsetof(qva_config, v_code), QVA_V_INT8_PV},
    {"fp16acc", offsetof(qva_config, draft.int8_acc), QVA_DRAFT_ACC_FP16},
    {"kprev", offsetof(qva_config, k_mean), QVA_K_MEAN_PREVIOUS},
    {"vprev", offsetof(qva_config, v_scale), QVA_V_SCALE_PREVIOUS},
    {"ksample", offsetof(qva_config, k_mean), QVA_K_MEAN_SAMPLE},
    {"vsample", offsetof(qva_config, v_scale), QVA_V_SCALE_SAMPLE},
    {"floormass", offsetof(qva_config, p_floor), QVA_P_FLOOR_MEAN},
    {"pblock", offsetof(qva_config, p_max), QVA_P_MAX_BLOCK},
    {"pooled", offsetof(qva_config, skip_fill), QVA_SKIP_POOLED},
};
#define METHOD_OPTION_COUNT (sizeof method_options / sizeof method_options[0])

/* The fields the suffixes of a name set, as offsets (at most one option
 * of each field). */
typedef struct option_fields {
    size_t field[METHOD_OPTION_COUNT];
    int n;
} option_fields;

static int option_field_set(const option_fields *f, size_t field) {
    for (int i = 0; i < f->n; ++i)
        if (f->field[i] == field) return 1;
    return 0;
}

static qva_status parse_suffixes(const char *s, qva_config *c, option_fields *set) {
    set->n = 0;
    while (*s == '+') {
        ++s;
        size_t len = strcspn(s, "+");
        const method_option *opt = NULL;
        for (size_t i = 0; i < METHOD_OPTION_COUNT; ++i)
            if (strlen(method_options[i].name) == len && !strncmp(s, method_options[i].name, len))
                opt = &method_options[i];
        if (!opt)
            return qvi_fail(QVA_ERR_PARSE,
                            "unknown method option '+%.*s' (expected +expcast, "
                            "+expcast-centred, +expcast-e5m2, +hadamard, +nohadamard, +qblock, "
                            "+codesum, "
                            "+fp32sum, +v2, +i8pv, +fp16acc, +kprev, +vprev, +ksample, +vsample, "
                            "+floormass, +pblock or +pooled)",
                            (int)len, s);
        if (option_field_set(set, opt->field))
            return qvi_fail(QVA_ERR_PARSE,
                            "method option '+%.*s' given twice (or with another "
                            "option of the same setting)",
                            (int)len, s);
        set->field[set->n++] = opt->field;
        *(int *)((char *)c + opt->field) = opt->value;
        s += len;
    }
    if (*s)
        return qvi_fail(QVA_ERR_PARSE, "unexpected text '%s' in method", s);
    return QVA_OK;
}

/* The defaults a method name sets where no suffix does.  sage8 and vc8
 * rotate Q and K (+hadamard) and, without ExpCast, sum P's codes
 * (+codesum): each removes an error term SageAttention2's form keeps, at
 * the same speed; end to end the rotation is worth about 1 dB on vc8 and
 * the code sum 1.3-1.7 dB (docs/NUMERICS.md §3, "sage8's and vc8's
 * defaults"); +nohadamard and +fp32sum give the papers' form back. */
static void method_defaults(qva_config *c, const option_fields *set) {
    const int sage8 = c->method == QVA_METHOD_SAGE8;
    const int int8_qk = sage8 || c->method == QVA_METHOD_VC8;
    if (!option_field_set(set, offsetof(qva_config, hadamard))) c->hadamard = int8_qk;
    if (!option_field_set(set, offsetof(qva_config, p_sum)))
        c->p_sum = int8_qk && qvi_p_sum_applies(c) ? QVA_P_SUM_CODES : QVA_P_SUM_FP32;
}

void qvi_method_defaults(qva_config *cfg) {
    const option_fields none = {{0}, 0};
    method_defaults(cfg, &none);
}

/* Whether the method's name spells setting `field` at its zero value
 * (+nohadamard, +fp32sum): where the method's default is not zero. */
static int names_zero(const qva_config *c, size_t field) {
    qva_config d = *c;
    qvi_method_defaults(&d);
    return *(const int *)((const char *)&d + field) != 0;
}

/* The options a method name sets, at their values without the option. */
static void clear_method_options(qva_config *c) {
    c->expcast = 0;
    c->hadamard = 0;
    c->q_granularity = QVA_Q_PER_ROW;
    c->p_sum = QVA_P_SUM_FP32;
    c->v_code = QVA_V_E4M3;
    c->draft.int8_acc = QVA_DRAFT_ACC_FP32;
    c->k_mean = QVA_K_MEAN_CALL;
    c->v_scale = QVA_V_SCALE_CALL;
    c->p_floor = QVA_P_FLOOR_DROP;
    c->p_max = QVA_P_MAX_ROW;
    c->skip_fill = QVA_SKIP_DROP;
}

/* The index of the method whose name is the part of `name` before its first
 * '+' or '@', into *found; *base_len: that part's length. */
static qva_status find_method(const char *name, int *found, size_t *base_len) {
    const size_t base = strcspn(name, "+@");
    *base_len = base;
    *found = -1;
    for (int i = 0; i < QVA_METHOD_COUNT_; ++i)
        if (strlen(method_names[i]) == base && !strncmp(name, method_names[i], base))
            *found = i;
    if (*found < 0)
        return qvi_fail(QVA_ERR_PARSE,
                        "unknown method '%s' (valid: exact, bf16, fp8, sage8, "
                        "vc8, sage4, vc4, draft@S0/S4/S8/S16, draft@pM[/S4/S8/S16]; options "
                        "+expcast, +expcast-centred, +expcast-e5m2, +hadamard, +nohadamard, "
                        "+qblock, "
                        "+codesum, +fp32sum, +v2, +i8pv, +fp16acc, +kprev, +vprev, +ksample, "
                        "+vsample, +floormass, +pblock, +pooled)",
                        name);
    return QVA_OK;
}

/* The options that were turned off by name (+nohadamard, +fp32sum) where
 * they do not apply. */
static qva_status check_explicit_offs(const qva_config *c, const option_fields *set) {
    if (!c->hadamard && option_field_set(set, offsetof(qva_config, hadamard)) &&
        !qvi_method_is_quantized(c->method))
        return qvi_fail(QVA_ERR_PARSE, "+nohadamard applies to quantized methods, not %s",
                        method_names[c->method]);
    if (c->p_sum == QVA_P_SUM_FP32 && option_field_set(set, offsetof(qva_config, p_sum)) &&
        !qvi_p_sum_applies(c))
        return qvi_fail(QVA_ERR_PARSE,
                        "+fp32sum applies to the exp2 P of fp8, sage8 and vc8 "
                        "(ExpCast always sums its codes), not %s%s",
                        method_names[c->method], c->expcast ? " with +expcast" : "");
    return QVA_OK;
}

/* Whether each code option applies to the method and the other options. */
static qva_status check_code_options(const qva_config *c) {
    if (c->expcast && !(qvi_method_is_8bit(c->method) || c->method == QVA_METHOD_DRAFT))
        return qvi_fail(QVA_ERR_PARSE,
                        "+expcast applies to the 8-bit methods (fp8, sage8, "
                        "vc8, draft's INT8 phase), not %s",
                        method_names[c->method]);
    if (c->expcast == QVA_EXPCAST_E5M2 && c->method == QVA_METHOD_DRAFT)
        return qvi_fail(QVA_ERR_PARSE, "+expcast-e5m2 applies to fp8, sage8 and vc8, not draft "
                                       "(its INT8 phase codes P in E4M3)");
    if (c->hadamard && !qvi_method_is_quantized(c->method))
        return qvi_fail(QVA_ERR_PARSE,
                        "+hadamard applies to quantized methods, not %s",
                        method_names[c->method]);
    if (c->q_granularity && !qvi_method_has_int8_q(c->method))
        return qvi_fail(QVA_ERR_PARSE,
                        "+qblock applies to the INT8 query methods (sage8, vc8, "
                        "draft), not %s",
                        method_names[c->method]);
    if (c->p_sum && !qvi_p_sum_applies(c))
        return qvi_fail(QVA_ERR_PARSE,
                        "+codesum applies to the exp2 P of fp8, sage8 and vc8 "
                        "(ExpCast always sums its codes), not %s%s",
                        method_names[c->method], c->expcast ? " with +expcast" : "");
    if (c->v_code && !qvi_v_code_applies(c->method))
        return qvi_fail(QVA_ERR_PARSE, "%s applies to the V of sage8 and vc8, not %s",
                        c->v_code == QVA_V_INT8_PV ? "+i8pv" : "+v2", method_names[c->method]);
    if (c->draft.int8_acc && c->method != QVA_METHOD_DRAFT)
        return qvi_fail(QVA_ERR_PARSE,
                        "+fp16acc applies to draft's INT8 phase (DA2 Table 6's FP16 "
                        "partials), not %s",
                        method_names[c->method]);
    return QVA_OK;
}

/* Whether each statistics, P-tail and skip option applies. */
static qva_status check_other_options(const qva_config *c) {
    if (c->k_mean && !qvi_k_mean_applies(c->method))
        return qvi_fail(QVA_ERR_PARSE,
                        "%s applies to the INT8 K of sage8 and vc8 (the smoothed K), not %s",
                        c->k_mean == QVA_K_MEAN_SAMPLE ? "+ksample" : "+kprev",
                        method_names[c->method]);
    if (c->v_scale && !qvi_v_scale_applies(c))
        return qvi_fail(QVA_ERR_PARSE,
                        "%s applies to one E4M3 digit of V in sage8 and vc8 (not with +v2 "
                        "or +i8pv; +vsample also to draft's INT8 phase), not %s%s",
                        c->v_scale == QVA_V_SCALE_SAMPLE ? "+vsample" : "+vprev",
                        method_names[c->method], c->v_code ? " with that V code" : "");
    if (c->v_code == QVA_V_INT8_PV && c->expcast)
        return qvi_fail(QVA_ERR_PARSE,
                        "+i8pv codes P as unsigned INT8 from exp2; ExpCast's codes are "
                        "E4M3 (drop +expcast or +i8pv)");
    if (c->p_floor && !qvi_p_floor_applies(c))
        return qvi_fail(QVA_ERR_PARSE,
                        "+floormass applies to ExpCast's E4M3 P codes in sage8 and vc8 "
                        "(with +expcast or +expcast-centred), not %s%s",
                        method_names[c->method],
                        c->expcast == QVA_EXPCAST_E5M2 ? " with +expcast-e5m2"
                        : c->expcast                   ? ""
                                                      : " without ExpCast");
    if (c->skip_fill && c->method != QVA_METHOD_DRAFT)
        return qvi_fail(QVA_ERR_PARSE,
                        "+pooled applies to draft's skipped region pairs, not %s",
                        method_names[c->method]);
    if (c->p_max && !qvi_p_max_applies(c))
        return qvi_fail(QVA_ERR_PARSE,
                        "+pblock applies to the E4M3 P codes of sage8, vc8 and draft (not with +i8pv, "
                        "whose codes take each block's max already, nor +floormass), not %s%s",
                        method_names[c->method],
                        c->v_code == QVA_V_INT8_PV ? " with +i8pv"
                        : c->p_floor               ? " with +floormass"
                                                  : "");
    return QVA_OK;
}

qva_status qva_config_set_method(qva_config *cfg, const char *name) {
    if (!cfg || !name) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL argument");
    qva_config c = *cfg;
    clear_method_options(&c);
    int found;
    size_t base;
    qva_status st;
    if ((st = find_method(name, &found, &base)) != QVA_OK) return st;
    c.method = (qva_method)found;
    const char *rest = name + base;
    if (c.method == QVA_METHOD_DRAFT) {
        if (*rest != '@')
            return qvi_fail(QVA_ERR_PARSE,
                            "draft needs quotas: draft@S0/S4/S8/S16 (or a mass "
                            "budget: draft@pM, draft@pM/S4/S8/S16)");
        st = rest[1] == 'p' ? parse_draft_mass(rest + 2, &c.draft, &rest)
                            : parse_draft_quotas(rest + 1, &c.draft, &rest);
        if (st != QVA_OK) return st;
    } else if (*rest == '@') {
        return qvi_fail(QVA_ERR_PARSE, "only draft takes @quotas");
    }
    option_fields set;
    if ((st = parse_suffixes(rest, &c, &set)) != QVA_OK || (st = check_explicit_offs(&c, &set)))
        return st;
    method_defaults(&c, &set);
    if ((st = check_code_options(&c)) || (st = check_other_options(&c))) return st;
    *cfg = c;
    return QVA_OK;
}

/* draft@pM, with /S4/S8/S16 unless every kept pair is 16-bit. */
static int draft_mass_name(const qva_draft_params *dp, char *buf, size_t len) {
    if (dp->frac4 == 0.0f && dp->frac8 == 0.0f && dp->frac16 == 1.0f)
        return snprintf(buf, len, "draft@p%g", 100.0 * dp->mass);
    return snprintf(buf, len, "draft@p%g/%g/%g/%g", 100.0 * dp->mass,
                    100.0 * dp->frac4, 100.0 * dp->frac8, 100.0 * dp->frac16);
}

qva_status qva_config_method_name(const qva_config *cfg, char *buf, size_t len) {
    if (!cfg || !buf || len == 0 || (unsigned)cfg->method >= QVA_METHOD_COUNT_)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "bad arguments");
    int n;
    const qva_draft_params *dp = &cfg->draft;
    if (cfg->method == QVA_METHOD_DRAFT && dp->budget == QVA_DRAFT_BUDGET_MASS)
        n = draft_mass_name(dp, buf, len);
    else if (cfg->method == QVA_METHOD_DRAFT)
        n = snprintf(buf, len, "draft@%g/%g/%g/%g", 100.0 * dp->frac_skip,
                     100.0 * dp->frac4, 100.0 * dp->frac8, 100.0 * dp->frac16);
    else
        n = snprintf(buf, len, "%s", method_names[cfg->method]);
    if (n >= 0 && (size_t)n < len && cfg->expcast)
        n += snprintf(buf + n, len - (size_t)n, "%s",
                      cfg->expcast == QVA_EXPCAST_CENTRED ? "+expcast-centred"
                      : cfg->expcast == QVA_EXPCAST_E5M2  ? "+expcast-e5m2"
                                                          : "+expcast");
    const int zero_h = names_zero(cfg, offsetof(qva_config, hadamard));
    const int zero_p = names_zero(cfg, offsetof(qva_config, p_sum));
    if (n >= 0 && (size_t)n < len && (zero_h ? !cfg->hadamard : cfg->hadamard))
        n += snprintf(buf + n, len - (size_t)n, zero_h ? "+nohadamard" : "+hadamard");
    if (n >= 0 && (size_t)n < len && cfg->q_granularity == QVA_Q_PER_BLOCK)
        n += snprintf(buf + n, len - (size_t)n, "+qblock");
    if (n >= 0 && (size_t)n < len &&
        (zero_p ? cfg->p_sum == QVA_P_SUM_FP32 : cfg->p_sum == QVA_P_SUM_CODES))
        n += snprintf(buf + n, len - (size_t)n, zero_p ? "+fp32sum" : "+codesum");
    if (n >= 0 && (size_t)n < len && cfg->v_code == QVA_V_E4M3X2)
        n += snprintf(buf + n, len - (size_t)n, "+v2");
    if (n >= 0 && (size_t)n < len && cfg->v_code == QVA_V_INT8_PV)
        n += snprintf(buf + n, len - (size_t)n, "+i8pv");
    if (n >= 0 && (size_t)n < len && cfg->method == QVA_METHOD_DRAFT &&
        dp->int8_acc == QVA_DRAFT_ACC_FP16)
        n += snprintf(buf + n, len - (size_t)n, "+fp16acc");
    if (n >= 0 && (size_t)n < len && cfg->k_mean == QVA_K_MEAN_PREVIOUS &&
        qvi_k_mean_applies(cfg->method))
        n += snprintf(buf + n, len - (size_t)n, "+kprev");
    if (n >= 0 && (size_t)n < len && cfg->k_mean == QVA_K_MEAN_SAMPLE &&
        qvi_k_mean_applies(cfg->method))
        n += snprintf(buf + n, len - (size_t)n, "+ksample");
    if (n >= 0 && (size_t)n < len && cfg->v_scale == QVA_V_SCALE_PREVIOUS &&
        qvi_v_scale_applies(cfg))
        n += snprintf(buf + n, len - (size_t)n, "+vprev");
    if (n >= 0 && (size_t)n < len && cfg->v_scale == QVA_V_SCALE_SAMPLE &&
        qvi_v_scale_applies(cfg))
        n += snprintf(buf + n, len - (size_t)n, "+vsample");
    if (n >= 0 && (size_t)n < len && cfg->p_floor == QVA_P_FLOOR_MEAN && qvi_p_floor_applies(cfg))
        n += snprintf(buf + n, len - (size_t)n, "+floormass");
    if (n >= 0 && (size_t)n < len && cfg->p_max == QVA_P_MAX_BLOCK && qvi_p_max_applies(cfg))
        n += snprintf(buf + n, len - (size_t)n, "+pblock");
    if (n >= 0 && (size_t)n < len && cfg->skip_fill == QVA_SKIP_POOLED &&
        cfg->method == QVA_METHOD_DRAFT)
        n += snprintf(buf + n, len - (size_t)n, "+pooled");
    return (n < 0 || (size_t)n >= len)
               ? qvi_fail(QVA_ERR_INVALID_ARGUMENT, "buffer too small")
               : QVA_OK;
}

/* ------------------------------------------------------------ schedule */
qva_step_action qva_schedule_action(const qva_vsmooth_params *p, int step,
                                    int num_steps) {
    if (p->schedule == QVA_SCHEDULE_ALWAYS || num_steps <= 0)
        return QVA_STEP_GROUP;
    int window = num_steps / 4 + (num_steps % 4 != 0); /* ceil(n/4): VC App. A */
    int every = p->refresh_every > 0 ? p->refresh_every : 4;
    if (step >= window)
        return p->schedule == QVA_SCHEDULE_DEMEAN ? QVA_STEP_REUSE : QVA_STEP_PLAIN;
    return step % every == 0 ? QVA_STEP_GROUP : QVA_STEP_REUSE;
}

