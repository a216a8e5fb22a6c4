/* Validation of hostile input (issue 13, defects 2, 5 and 6): checked size,
 * stride, grid and schedule arithmetic; strict method strings and option
 * values; the aliasing rule of qva_attention; messages that name the real
 * cause.  Each case was accepted, wrapped or mis-described before. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

static qva_context_t *g_ctx;

/* Small valid CPU buffers: q, k, v, out of [1, 2, N, 64] f32, lse. */
enum { TB = 1, TH = 2, TN = 40, TD = 64 };
#define TELEMS (TB * TH * TN * TD)
static float g_buf[5 * TELEMS + TB * TH * TN]; /* q k v out spare, lse */

typedef struct call {
    qva_config c;
    qva_tensor q, k, v, o, l;
    int with_lse;
} call;

static call make_call(const char *method) {
    call x;
    for (size_t i = 0; i < sizeof g_buf / sizeof *g_buf; ++i)
        g_buf[i] = (float)((i * 7919u) % 1000u) / 1000.0f - 0.5f;
    qva_config_default(&x.c);
    qva_config_set_method(&x.c, method);
    x.q = qva_tensor_hnd(g_buf, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, TD);
    x.k = qva_tensor_hnd(g_buf + TELEMS, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, TD);
    x.v = qva_tensor_hnd(g_buf + 2 * TELEMS, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, TD);
    x.o = qva_tensor_hnd(g_buf + 3 * TELEMS, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, TD);
    x.l = qva_tensor_hnd(g_buf + 5 * TELEMS, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, 1);
    x.with_lse = 1;
    return x;
}

static qva_status run(call *x) {
    return qva_attention(g_ctx, &x->c, &x->q, &x->k, &x->v, &x->o,
                         x->with_lse ? &x->l : NULL);
}

static int has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

#define EXPECT(x, want, part, label)                                             \
    do {                                                                         \
        qva_status got_ = run(x);                                                \
        CHECK(got_ == (want), "%s: got %s (%s)", label, qva_status_string(got_), \
              qva_last_error());                                                 \
        CHECK(has(qva_last_error(), part), "%s: message '%s' lacks '%s'", label, \
              qva_last_error(), part);                                           \
    } while (0)

/* ------------------------------------------------------------ defect 2 */

/* (num_steps + 3) / 4 overflowed at INT_MAX (UB; wrapped to a negative
 * window, so step 0 was "plain" instead of "group"). */
static void test_schedule_int_max(void) {
    qva_config c;
    qva_config_default(&c);
    const int w = INT_MAX / 4 + 1; /* ceil(INT_MAX / 4) */
    CHECK(qva_schedule_action(&c.vsmooth, 0, INT_MAX) == QVA_STEP_GROUP, "step 0");
    CHECK(qva_schedule_action(&c.vsmooth, w - 1, INT_MAX) == QVA_STEP_REUSE,
          "last step of the window");
    CHECK(qva_schedule_action(&c.vsmooth, w, INT_MAX) == QVA_STEP_PLAIN, "after the window");
    CHECK(qva_schedule_action(&c.vsmooth, INT_MAX - 1, INT_MAX) == QVA_STEP_PLAIN, "last step");
    for (int n = INT_MAX - 3; n > 0 && n <= INT_MAX - 1; ++n) {
        int wn = n / 4 + (n % 4 != 0);
        CHECK(qva_schedule_action(&c.vsmooth, wn - 1, n) != QVA_STEP_PLAIN, "n=%d in", n);
        CHECK(qva_schedule_action(&c.vsmooth, wn, n) == QVA_STEP_PLAIN, "n=%d out", n);
    }
    call x = make_call("vc8");
    x.c.num_steps = INT_MAX;
    x.c.step = INT_MAX - 1;
    CHECK(run(&x) == QVA_OK, "vc8 at step INT_MAX-1 of INT_MAX: %s", qva_last_error());
}

/* grid_t*grid_h*grid_w: 8 x 1263665316 x 1824726041 wrapped (in int64) to
 * 32, so with prefix 96 it "matched" N = 128. */
static void test_draft_grid_overflow(void) {
    static const int grids[][4] = {
        {8, 1263665316, 1824726041, 96}, /* the audit's case          */
        {INT_MAX, INT_MAX, INT_MAX, 0},   /* 2^93                      */
        {1 << 21, 1 << 21, 1 << 21, 0},   /* exactly 2^63: just overflows */
        {3, 1 << 30, 1 << 30, 0},         /* fits int64, far above N   */
    };
    qva_context_t *ctx = g_ctx;
    float *buf = calloc((size_t)4 * 128 * 64, sizeof *buf);
    for (size_t g = 0; g < sizeof grids / sizeof *grids; ++g) {
        qva_config c;
        qva_config_default(&c);
        CHECK(qva_config_set_method(&c, "draft@85/0/0/15") == QVA_OK, "method");
        c.draft.grid_t = grids[g][0];
        c.draft.grid_h = grids[g][1];
        c.draft.grid_w = grids[g][2];
        c.draft.prefix_tokens = grids[g][3];
        qva_tensor t[4];
        for (int i = 0; i < 4; ++i)
            t[i] = qva_tensor_hnd(buf + (size_t)i * 128 * 64, QVA_F32, QVA_DEVICE_CPU, 1,
                                  1, 128, 64);
        qva_status st = qva_attention(ctx, &c, &t[0], &t[1], &t[2], &t[3], NULL);
        CHECK(st == QVA_ERR_SHAPE, "grid %d: got %s (%s)", (int)g, qva_status_string(st),
              qva_last_error());
        CHECK(has(qva_last_error(), "the sequence length N = 128") &&
                  has(qva_last_error(), g < 3 ? "overflows int64" : "= 3458764513820540928 but"),
              "grid %d: message '%s'", (int)g, qva_last_error());
        int warm = -1;
        st = qva_draft_step_check(&c, 128, 64, &warm);
        CHECK(st == QVA_ERR_SHAPE, "step_check grid %d: got %s", (int)g,
              qva_status_string(st));
    }
    /* the plain mismatch keeps its exact message */
    qva_config c;
    qva_config_default(&c);
    qva_config_set_method(&c, "draft@85/0/0/15");
    c.draft.grid_t = 1, c.draft.grid_h = 5, c.draft.grid_w = 5;
    int warm;
    CHECK(qva_draft_step_check(&c, 128, 64, &warm) == QVA_ERR_SHAPE &&
              has(qva_last_error(), "= 25 but the sequence length N = 128"),
          "small mismatch: %s", qva_last_error());
    c.draft.grid_t = 2, c.draft.grid_h = 8, c.draft.grid_w = 8;
    CHECK(qva_draft_step_check(&c, 128, 64, &warm) == QVA_OK, "2x8x8: %s", qva_last_error());
    c.draft.dense_warmup_steps = -1;
    CHECK(qva_draft_step_check(&c, 128, 64, &warm) == QVA_ERR_INVALID_ARGUMENT &&
              has(qva_last_error(), "dense_warmup_steps = -1"),
          "negative warm-up: %s", qva_last_error());
    CHECK(qva_draft_step_check(&c, (int64_t)1 << 40, 64, &warm) == QVA_ERR_SHAPE,
          "N = 2^40");
    free(buf);
}

/* qva_tensor_hnd strides wrapped to 0 for 2 x 2^30 x 2^30 x 128, and
 * check_tensor bounded each dimension but never the total. */
static void test_tensor_totals(void) {
    const int64_t G = (int64_t)1 << 30;
    qva_tensor t = qva_tensor_hnd(g_buf, QVA_F32, QVA_DEVICE_CPU, 2, G, G, 128);
    CHECK(t.stride[0] == INT64_MAX, "hnd stride[0] = %lld, want saturated",
          (long long)t.stride[0]);
    CHECK(t.stride[1] == G * 128 && t.stride[2] == 128, "hnd inner strides");
    qva_tensor u = qva_tensor_nhd(g_buf, QVA_F32, QVA_DEVICE_CPU, 2, G, G, 128);
    CHECK(u.stride[0] == INT64_MAX && u.stride[2] == G * 128, "nhd strides");
    qva_tensor s = qva_tensor_hnd(g_buf, QVA_F32, QVA_DEVICE_CPU, 3, 5, 7, 64);
    CHECK(s.stride[0] == 5 * 7 * 64 && s.stride[1] == 7 * 64 && s.stride[2] == 64 &&
              s.stride[3] == 1, "small hnd strides");

    call x = make_call("sage8");
    x.q = x.k = x.v = t; /* the descriptors lie: they must be refused unread */
    x.o = qva_tensor_hnd(g_buf + 3 * TELEMS, QVA_F32, QVA_DEVICE_CPU, 2, G, G, 128);
    x.with_lse = 0;
    EXPECT(&x, QVA_ERR_SHAPE, "too large", "2 x 2^30 x 2^30 x 128 hnd");
    x.q = x.k = x.v = u;
    EXPECT(&x, QVA_ERR_SHAPE, "too large", "2 x 2^30 x 2^30 x 128 nhd");

    /* 2^49 bytes of f32 with honest strides: over QVA_MAX_TENSOR_BYTES */
    x = make_call("sage8");
    x.q = qva_tensor_hnd(g_buf, QVA_F32, QVA_DEVICE_CPU, 2, 1 << 20, 1 << 20, 64);
    EXPECT(&x, QVA_ERR_SHAPE, "too large", "2^49 bytes");
    /* exactly 2^48 bytes passes the size check (and then fails on B/H) */
    x.q = qva_tensor_hnd(g_buf, QVA_F32, QVA_DEVICE_CPU, 1, 1 << 20, 1 << 20, 64);
    EXPECT(&x, QVA_ERR_SHAPE, "must agree on B, H and D", "2^48 bytes");

    /* broadcast (stride 0) of an absurd element count: 2^96 elements */
    x = make_call("sage8");
    for (int i = 0; i < 3; ++i) x.q.shape[i] = G, x.q.stride[i] = 0;
    EXPECT(&x, QVA_ERR_SHAPE, "too large", "2^96 broadcast elements");
    /* strides whose span overflows int64 although each fits */
    x = make_call("sage8");
    x.k.stride[0] = x.k.stride[1] = x.k.stride[2] = INT64_MAX / 2;
    x.k.shape[0] = x.k.shape[1] = 1;
    x.k.shape[2] = 3;
    EXPECT(&x, QVA_ERR_SHAPE, "too large", "span overflow");

    /* B*H heads must fit an int (the backends count heads in int) */
    x = make_call("sage8");
    qva_tensor *all[4] = {&x.q, &x.k, &x.v, &x.o};
    for (int i = 0; i < 4; ++i) {
        all[i]->shape[0] = all[i]->shape[1] = 1 << 16;
        all[i]->stride[0] = all[i]->stride[1] = 0;
    }
    x.with_lse = 0;
    x.c.check_finite = 0;
    qva_status st = run(&x); /* out overlaps itself too; either refusal will do */
    CHECK(st == QVA_ERR_SHAPE, "2^32 heads: %s (%s)", qva_status_string(st), qva_last_error());
    x.o = qva_tensor_hnd(g_buf + 3 * TELEMS, QVA_F32, QVA_DEVICE_CPU, 1 << 16, 1 << 16, 1, 64);
    x.q.shape[2] = x.k.shape[2] = x.v.shape[2] = 1;
    EXPECT(&x, QVA_ERR_SHAPE, "B*H", "2^32 heads");
}

/* ------------------------------------------------------------ defect 5 */

static void test_messages(void) {
    /* qva_supports(CPU, NULL) printed "invalid config:" and a stale error */
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "stale-method-name") == QVA_ERR_PARSE, "stale");
    char why[256] = "x";
    CHECK(qva_supports(QVA_DEVICE_CPU, NULL, QVA_F32, 64, why, sizeof why) == 0, "NULL cfg");
    CHECK(!has(why, "stale-method-name") && has(why, "NULL"), "why = '%s'", why);
    CHECK(qva_supports(QVA_DEVICE_CPU, NULL, QVA_F32, 64, NULL, 0) == 0, "NULL cfg, no why");
    c.vsmooth.clusters = 0; /* an invalid config names its own problem */
    CHECK(qva_supports(QVA_DEVICE_CPU, &c, QVA_F32, 64, why, sizeof why) == 0, "bad cfg");
    CHECK(has(why, "vsmooth.clusters = 0") && !has(why, "stale"), "why = '%s'", why);
    qva_config_default(&c);
    CHECK(qva_supports(QVA_DEVICE_CPU, &c, QVA_F32, 64, why, sizeof why) == 1, "default");

    /* a tensor on device 5 was "on the cuda device" */
    call x = make_call("sage8");
    x.q.device = (qva_device)5;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "q: unknown device 5", "device 5");
    CHECK(!has(qva_last_error(), "cuda device"), "device 5 called cuda: %s", qva_last_error());
    x = make_call("sage8");
    x.o.device = (qva_device)-1;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out: unknown device -1", "device -1");
    if (!qva_cuda_available()) {
        x = make_call("sage8");
        x.k.device = QVA_DEVICE_CUDA;
        EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "k is on the cuda device but the context is cpu",
               "cuda tensor, cpu context");
    }

    /* qva_device_free(NULL) is free(NULL) on every build */
    CHECK(qva_device_free(NULL) == QVA_OK, "qva_device_free(NULL): %s", qva_last_error());
}

/* ------------------------------------------------------------ defect 6 */

static void test_strict_methods(void) {
    const char *bad[] = {
        "draft@0x55/0/0/15", "draft@ 85/0/0/15", "draft@85/ 0/0/15", "draft@85/0/0/15 ",
        "draft@+85/0/0/15", "draft@85/-0/0/15", "draft@85./0/0/15", "draft@.5/84.5/0/15",
        "draft@inf/0/0/15", "draft@nan/0/0/15", "draft@85/0/0/15e", "draft@85/0/0/0x0f",
        "draft@85/0/0/1e999", "draft@85/0/0/15/0", "draft@85//0/15", "draft@",
        "vc8+expcast+expcast", "sage8+hadamard+hadamard", "vc8+hadamard+expcast+hadamard",
        "draft@85/0/0/15+expcast+expcast", "vc8+", "vc8++expcast", " vc8", "vc8 ",
        "VC8", "vc8+EXPCAST", "sage8\tx", "sage8+qblock+qblock", "fp8+qblock",
        "bf16+qblock", "sage4+qblock", "exact+qblock", "vc8+QBLOCK"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        qva_config c, before;
        qva_config_default(&c);
        before = c;
        qva_status st = qva_config_set_method(&c, bad[i]);
        CHECK(st == QVA_ERR_PARSE, "'%s' accepted (%s)", bad[i], qva_status_string(st));
        CHECK(strlen(qva_last_error()) > 0, "'%s': no message", bad[i]);
        CHECK(!memcmp(&c, &before, sizeof c), "'%s' modified cfg", bad[i]);
    }
    /* the messages name the offending piece */
    qva_config c;
    qva_config_default(&c);
    qva_config_set_method(&c, "draft@0x55/0/0/15");
    CHECK(has(qva_last_error(), "'0x55' is not a plain decimal"), "%s", qva_last_error());
    qva_config_set_method(&c, "draft@ 85/0/0/15");
    CHECK(has(qva_last_error(), "' 85' is not a plain decimal"), "%s", qva_last_error());
    qva_config_set_method(&c, "vc8+expcast+expcast");
    CHECK(has(qva_last_error(), "'+expcast' given twice"), "%s", qva_last_error());
    qva_config_set_method(&c, "draft@101/0/0/0");
    CHECK(has(qva_last_error(), "outside [0,100]"), "%s", qva_last_error());
    /* still accepted: plain decimals, exponents (what %g prints) and any
     * option order */
    struct { const char *s; float skip, f4, f8, f16; } good[] = {
        {"draft@85/0/0/15", 0.85f, 0, 0, 0.15f},
        {"draft@85.0/0/7.50/7.5", 0.85f, 0, 0.075f, 0.075f},
        {"draft@8.5e1/0/0/1.5E+1", 0.85f, 0, 0, 0.15f},
        {"draft@33.333333/33.333333/33.333334/0", 0.33333333f, 0.33333333f, 0.33333334f, 0},
        {"draft@100/0/0/0", 1, 0, 0, 0},
        {"draft@0/0/0/100+expcast", 0, 0, 0, 1},
        {"draft@99.99999/0/0/0.00001", 0.9999999f, 0, 0, 1e-7f},
        {"draft@85/1e-05/0/14.99999", 0.85f, 1e-7f, 0, 0.1499999f}};
    for (size_t i = 0; i < sizeof good / sizeof *good; ++i) {
        qva_config_default(&c);
        CHECK(qva_config_set_method(&c, good[i].s) == QVA_OK, "'%s': %s", good[i].s,
              qva_last_error());
        CHECK_NEAR(c.draft.frac_skip, good[i].skip, 1e-7, good[i].s);
        CHECK_NEAR(c.draft.frac4, good[i].f4, 1e-7, good[i].s);
        CHECK_NEAR(c.draft.frac8, good[i].f8, 1e-7, good[i].s);
        CHECK_NEAR(c.draft.frac16, good[i].f16, 1e-7, good[i].s);
        char name[96], again[96];
        qva_config c2;
        qva_config_default(&c2);
        CHECK(qva_config_method_name(&c, name, sizeof name) == QVA_OK, "name");
        CHECK(qva_config_set_method(&c2, name) == QVA_OK, "canonical '%s' reparses: %s",
              name, qva_last_error());
        qva_config_method_name(&c2, again, sizeof again);
        CHECK(!strcmp(name, again), "round trip '%s' -> '%s'", name, again);
    }
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "vc8+hadamard+expcast") == QVA_OK && c.expcast &&
              c.hadamard, "option order");
    /* +expcast-e5m2: the dense 8-bit methods, named back as given; not draft */
    {
        char nm[96] = "";
        CHECK(qva_config_set_method(&c, "sage8+expcast-e5m2") == QVA_OK &&
                  c.expcast == QVA_EXPCAST_E5M2 &&
                  qva_config_method_name(&c, nm, sizeof nm) == QVA_OK &&
                  !strcmp(nm, "sage8+expcast-e5m2"), "sage8+expcast-e5m2: '%s' %s", nm,
              qva_last_error());
        CHECK(qva_config_set_method(&c, "draft@85/0/7.5/7.5+expcast-e5m2") == QVA_ERR_PARSE &&
                  has(qva_last_error(), "not draft"), "draft e5m2: %s", qva_last_error());
        qva_config_default(&c);
    }
    /* +qblock: the papers' per-block query scales, INT8 query methods only */
    qva_config_set_method(&c, "fp8+qblock");
    CHECK(has(qva_last_error(), "+qblock applies to the INT8 query methods"), "%s",
          qva_last_error());
    const char *qb[] = {"sage8+qblock", "vc8+qblock+expcast", "draft@85/0/7.5/7.5+qblock"};
    for (size_t i = 0; i < sizeof qb / sizeof *qb; ++i) {
        char name[96];
        qva_config_default(&c);
        CHECK(qva_config_set_method(&c, qb[i]) == QVA_OK && c.q_granularity == QVA_Q_PER_BLOCK,
              "'%s': %s", qb[i], qva_last_error());
        CHECK(qva_config_method_name(&c, name, sizeof name) == QVA_OK && has(name, "+qblock"),
              "'%s' names itself '%s'", qb[i], name);
        CHECK(qva_config_set_method(&c, "sage8") == QVA_OK && c.q_granularity == QVA_Q_PER_ROW,
              "a new method name resets the granularity to per row");
    }
}

static void test_option_values(void) {
    /* q_granularity: a known value, and per block only where Q is INT8 */
    {
        call y = make_call("sage8");
        y.c.q_granularity = 2;
        EXPECT(&y, QVA_ERR_INVALID_ARGUMENT, "q_granularity = 2", "q_granularity 2");
        y.c.q_granularity = -1;
        EXPECT(&y, QVA_ERR_INVALID_ARGUMENT, "q_granularity = -1", "q_granularity -1");
        call z = make_call("fp8");
        z.c.q_granularity = QVA_Q_PER_BLOCK;
        EXPECT(&z, QVA_ERR_INVALID_ARGUMENT, "applies to sage8, vc8 and draft", "fp8 per block");
    }
    /* expcast: a qva_expcast_mode; the centred beta and the E5M2 code run
     * on the CPU and give other codes than the paper's */
    {
        call y = make_call("vc8+expcast");
        y.c.expcast = 4;
        EXPECT(&y, QVA_ERR_INVALID_ARGUMENT, "expcast = 4", "expcast 4");
        static float paper[TELEMS];
        y.c.expcast = QVA_EXPCAST_PAPER;
        CHECK(run(&y) == QVA_OK, "expcast: %s", qva_last_error());
        memcpy(paper, g_buf + 3 * TELEMS, sizeof paper);
        y.c.expcast = QVA_EXPCAST_E5M2;
        CHECK(run(&y) == QVA_OK, "expcast-e5m2: %s", qva_last_error());
        CHECK(memcmp(paper, g_buf + 3 * TELEMS, sizeof paper) != 0,
              "the E5M2 code reaches the P values");
        call dr = make_call("draft@85/0/7.5/7.5+expcast");
        dr.c.expcast = QVA_EXPCAST_E5M2;
        EXPECT(&dr, QVA_ERR_INVALID_ARGUMENT, "not draft", "draft with the E5M2 code");
        y.c.expcast = QVA_EXPCAST_CENTRED;
        CHECK(run(&y) == QVA_OK, "expcast-centred: %s", qva_last_error());
        CHECK(memcmp(paper, g_buf + 3 * TELEMS, sizeof paper) != 0,
              "the centred beta reaches the P codes");
    }
    /* vsmooth.refresh_every <= 0 quietly became 4 */
    call x = make_call("vc8");
    x.c.vsmooth.refresh_every = -3;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "vsmooth.refresh_every = -3", "refresh_every -3");
    x.c.vsmooth.refresh_every = 0;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "vsmooth.refresh_every = 0", "refresh_every 0");
    x.c.vsmooth.refresh_every = INT_MIN;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "refresh_every", "refresh_every INT_MIN");
    x.c.vsmooth.refresh_every = 1;
    CHECK(run(&x) == QVA_OK, "refresh_every 1: %s", qva_last_error());
    x.c.vsmooth.refresh_every = INT_MAX;
    x.c.num_steps = 40;
    CHECK(run(&x) == QVA_OK, "refresh_every INT_MAX: %s", qva_last_error());
    char why[200];
    x.c.vsmooth.refresh_every = -3;
    CHECK(!qva_supports(QVA_DEVICE_CPU, &x.c, QVA_F32, 64, why, sizeof why) &&
              has(why, "refresh_every"), "supports: '%s'", why);

    /* qva_vsmooth_permutation had no cap on iterations (2^31 never ends) */
    enum { N = 256, D = 64 };
    float *v = malloc(sizeof(float) * N * D);
    int32_t perm[N];
    for (int i = 0; i < N * D; ++i) v[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    qva_status st = qva_vsmooth_permutation(v, N, D, 8, INT_MAX, perm);
    CHECK(st == QVA_ERR_INVALID_ARGUMENT && has(qva_last_error(), "iters = 2147483647"),
          "iters INT_MAX: %s (%s)", qva_status_string(st), qva_last_error());
    st = qva_vsmooth_permutation(v, N, D, 8, QVA_VSMOOTH_MAX_ITERS + 1, perm);
    CHECK(st == QVA_ERR_INVALID_ARGUMENT, "iters 1001");
    st = qva_vsmooth_permutation(v, N, D, QVA_VSMOOTH_MAX_CLUSTERS + 1, 1, perm);
    CHECK(st == QVA_ERR_INVALID_ARGUMENT && has(qva_last_error(), "clusters = 4097"),
          "clusters 4097: %s", qva_last_error());
    st = qva_vsmooth_permutation(v, N, D, 8, -1, perm);
    CHECK(st == QVA_ERR_INVALID_ARGUMENT, "iters -1");
    st = qva_vsmooth_permutation(v, N, D, 8, QVA_VSMOOTH_MAX_ITERS, perm);
    CHECK(st == QVA_OK, "iters at the cap: %s", qva_last_error());
    x = make_call("vc8"); /* the same caps as qva_attention */
    x.c.vsmooth.iters = QVA_VSMOOTH_MAX_ITERS + 1;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "vsmooth.iters = 1001", "attention iters cap");
    free(v);
}

/* The aliasing rule: out and lse overlap neither the inputs nor each
 * other nor themselves; the inputs may share memory. */
static void test_aliasing(void) {
    call x = make_call("sage8");
    CHECK(run(&x) == QVA_OK, "baseline: %s", qva_last_error());

    x = make_call("sage8");
    x.o.data = g_buf + TELEMS / 2; /* second half of q, first half of k */
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out overlaps the memory of q", "out partly over q");
    x = make_call("sage8");
    x.o.data = g_buf + TELEMS - 1; /* one element into q's last one */
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out overlaps the memory of q", "last element");
    x = make_call("sage8");
    x.o = x.q; /* exact aliasing: no in-place attention */
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out overlaps the memory of q", "out == q");
    x = make_call("sage8");
    x.o.data = x.v.data;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out overlaps the memory of v", "out == v");
    x = make_call("sage8");
    x.l.data = (float *)x.k.data + 5;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "lse overlaps the memory of k", "lse in k");
    x = make_call("sage8");
    x.l.data = (float *)x.o.data + TELEMS - 1;
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out and lse overlap", "lse over out's tail");
    x = make_call("sage8"); /* an NHD out interleaved in q's range */
    x.o = qva_tensor_nhd(g_buf, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, TD);
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out overlaps", "nhd out over q");
    /* a bf16 out spans 2 bytes per element: one element into lse, then
     * right before it */
    x = make_call("sage8");
    x.o.dtype = QVA_BF16;
    x.o.data = (uint16_t *)(void *)x.l.data - (TELEMS - 1);
    EXPECT(&x, QVA_ERR_INVALID_ARGUMENT, "out and lse overlap", "bf16 out over lse");
    x.o.data = (uint16_t *)(void *)x.l.data - TELEMS;
    CHECK(run(&x) == QVA_OK, "bf16 out right before lse: %s", qva_last_error());

    /* an output overlapping itself */
    x = make_call("sage8");
    x.o.stride[1] = 0;
    EXPECT(&x, QVA_ERR_SHAPE, "out overlaps itself", "out stride 0");
    x = make_call("sage8");
    x.o.stride[2] = TD / 2;
    EXPECT(&x, QVA_ERR_SHAPE, "out overlaps itself: stride[2] = 32", "out rows overlap");
    x = make_call("sage8");
    x.o.stride[1] = x.o.stride[2] = TD; /* (h=1, n=0) == (h=0, n=1) */
    x.o.stride[0] = 0; /* B = 1: any stride */
    EXPECT(&x, QVA_ERR_SHAPE, "stride[1] == stride[2]", "out equal strides");
    x = make_call("sage8");
    x.l.stride[2] = 0;
    EXPECT(&x, QVA_ERR_SHAPE, "lse overlaps itself", "lse stride 0");

    /* allowed: inputs sharing memory, outputs right next to the inputs,
     * a size-1 dimension with any stride, padded output rows */
    x = make_call("sage8");
    x.k.data = x.v.data = x.q.data;
    CHECK(run(&x) == QVA_OK, "q == k == v: %s", qva_last_error());
    x = make_call("sage8");
    x.o.data = g_buf + TELEMS; /* right after q; k, v moved past out */
    x.k.data = g_buf + 2 * TELEMS;
    x.v.data = g_buf + 3 * TELEMS;
    x.l.data = g_buf + 5 * TELEMS;
    CHECK(run(&x) == QVA_OK, "adjacent: %s", qva_last_error());
    x = make_call("sage8");
    x.o.stride[0] = 0; /* B = 1 */
    CHECK(run(&x) == QVA_OK, "size-1 dim with stride 0: %s", qva_last_error());
    x = make_call("sage8"); /* out rows padded to 2*D in the spare buffer */
    x.o = qva_tensor_hnd(g_buf + 3 * TELEMS, QVA_F32, QVA_DEVICE_CPU, TB, TH, TN, TD);
    x.o.stride[2] = 2 * TD;
    x.o.stride[1] = 2 * TD * TN;
    x.with_lse = 0;
    CHECK(run(&x) == QVA_OK, "padded out rows: %s", qva_last_error());
}

/* With arguments, only the named groups run (e.g. `test_validation
 * aliasing`), so one group can be checked in isolation. */
int main(int argc, char **argv) {
    static const struct { const char *name; void (*fn)(void); } groups[] = {
        {"schedule", test_schedule_int_max}, {"grid", test_draft_grid_overflow},
        {"totals", test_tensor_totals},      {"messages", test_messages},
        {"methods", test_strict_methods},    {"options", test_option_values},
        {"aliasing", test_aliasing}};
    if (qva_context_create(&g_ctx, QVA_DEVICE_CPU) != QVA_OK) return 1;
    for (size_t i = 0; i < sizeof groups / sizeof *groups; ++i) {
        int run_it = argc < 2;
        for (int a = 1; a < argc; ++a) run_it |= !strcmp(argv[a], groups[i].name);
        if (run_it) groups[i].fn();
    }
    qva_context_free(g_ctx);
    return check_summary("test_validation");
}
