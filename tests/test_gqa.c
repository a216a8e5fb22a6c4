/* The library side of qvattn.sdpa (issue 18): grouped K/V heads (GQA/MQA)
 * read without copies, head dims other than 64 and 128 by zero padding,
 * and stateless calls (QVA_LAYER_NONE).  Every comparison is bit for bit:
 *  - GQA against the same call with K/V repeated to the query heads, over
 *    the V-Smooth schedule (state per K/V head, steps 0..2);
 *  - a padded head dim against the call the caller would make with Q, K,
 *    V zero-padded to 64/128 and sm_scale = 1/sqrt(D), and against the
 *    CPU reference computing at D itself (no padding);
 *  - a stateless call against the same call on a fresh context. */
#define TEST_RNG_SEED 0x9E3779B97F4A7C15ull
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

static const char *const methods[] = {
    "exact", "bf16", "fp8", "sage8", "sage8+expcast", "sage8+nohadamard+fp32sum",
    "vc8+expcast", "sage4", "vc4", "draft@50/20/15/15+expcast"};
#define NMETHODS (sizeof methods / sizeof *methods)

/* Draft's grid for N = 200 tokens: 8 prefix tokens and a 1 x 8 x 24 grid. */
static qva_config config_of(const char *method) {
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, method) == QVA_OK, "%s: %s", method, qva_last_error());
    c.draft.grid_t = 1, c.draft.grid_h = 8, c.draft.grid_w = 24;
    c.draft.prefix_tokens = 8;
    return c;
}

static float *rand_buf(size_t n, float amp) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n && x; ++i) x[i] = amp * (float)(2.0 * rng_unit() - 1.0);
    return x;
}

static int is_vsmooth(const char *m) { return !strncmp(m, "vc", 2); }

/* ---------------------------------------------------------------- GQA */

/* q [B,H,N,D] HND; k, v [B,N,Hkv,D] (NHD: strided heads) against k, v
 * repeated to H heads (HND copies), on separate contexts, over steps
 * 0..2 of an 8-step schedule (V-Smooth: group, reuse, plain). */
/* A host buffer on dev: itself on the CPU, a device copy on CUDA (NULL on
 * failure). */
static void *on_device(qva_device dev, const void *x, size_t bytes) {
    if (dev == QVA_DEVICE_CPU) return (void *)x;
    void *d = NULL;
    if (qva_device_malloc(&d, bytes) != QVA_OK) return NULL;
    if (qva_memcpy_to_device(d, x, bytes) != QVA_OK) {
        qva_device_free(d);
        return NULL;
    }
    return d;
}

static void off_device(qva_device dev, void *d) {
    if (dev != QVA_DEVICE_CPU) qva_device_free(d);
}

/* out (and lse) of qva_attention on dev, copied back into the host buffers
 * o, l (n bytes of out, nl floats of lse). */
static qva_status run_on(qva_device dev, qva_context_t *ctx, const qva_config *c,
                         const qva_tensor *q, const qva_tensor *k, const qva_tensor *v,
                         qva_tensor o, qva_tensor l, size_t n, size_t nl) {
    if (dev == QVA_DEVICE_CPU) return qva_attention(ctx, c, q, k, v, &o, &l);
    void *host_o = o.data, *host_l = l.data;
    o.data = on_device(dev, host_o, n), l.data = on_device(dev, host_l, nl * 4);
    o.device = l.device = dev;
    qva_status st = o.data && l.data ? qva_attention(ctx, c, q, k, v, &o, &l)
                                     : QVA_ERR_OUT_OF_MEMORY;
    if (st == QVA_OK) st = qva_memcpy_to_host(host_o, o.data, n);
    if (st == QVA_OK) st = qva_memcpy_to_host(host_l, l.data, nl * 4);
    if (o.data) off_device(dev, o.data);
    if (l.data) off_device(dev, l.data);
    return st;
}

/* n random values in [-amp, amp] stored as dt (f32 as drawn, else rounded
 * by qvi_store_elem). */
static void *rand_typed(size_t n, float amp, qva_dtype dt) {
    float *x = rand_buf(n, amp);
    if (dt == QVA_F32 || !x) return x;
    void *y = malloc(n * qva_dtype_size(dt));
    qva_tensor t = qva_tensor_hnd(y, dt, QVA_DEVICE_CPU, 1, 1, (int64_t)n, 1);
    for (size_t i = 0; y && i < n; ++i) qvi_store_elem(&t, (int64_t)i, x[i]);
    free(x);
    return y;
}

/* The methods that keep statistics from a layer's previous call (+kprev,
 * +vprev): their state is per K/V head, so grouped calls must keep it as
 * the repeated heads do; on CUDA they take 16-bit inputs. */
static const char *const carried_methods[] = {"sage8+kprev+vprev", "vc8+expcast+kprev+vprev"};
#define NCARRIED (sizeof carried_methods / sizeof *carried_methods)

static int steps_of(const char *method) {
    return is_vsmooth(method) || strstr(method, "prev") ? 3 : 1;
}

/* Grouped K/V on dev against the same call with K/V repeated to the query
 * heads (torch's enable_gqa), bit for bit, over the V-Smooth schedule (and
 * over three calls of a layer for the carried statistics). */
static void gqa_matches_repeated_dt(qva_device dev, const char *method, int64_t H, int64_t Hkv,
                                    int64_t D, qva_dtype dt) {
    const int64_t B = 2, N = 200, g = H / Hkv;
    const size_t es = qva_dtype_size(dt);
    const size_t nq = (size_t)(B * H * N * D), nkv = (size_t)(B * Hkv * N * D);
    const size_t nl = (size_t)(B * H * N);
    void *q = rand_typed(nq, 1.0f, dt), *k = rand_typed(nkv, 1.0f, dt),
         *v = rand_typed(nkv, 1.0f, dt);
    void *kx = malloc(nq * es), *vx = malloc(nq * es);
    void *o1 = malloc(nq * es), *o2 = malloc(nq * es);
    float *l1 = malloc(nl * sizeof *l1), *l2 = malloc(nl * sizeof *l2);
    qva_tensor tk = qva_tensor_nhd(k, dt, QVA_DEVICE_CPU, B, Hkv, N, D);
    qva_tensor tv = qva_tensor_nhd(v, dt, QVA_DEVICE_CPU, B, Hkv, N, D);
    qva_tensor tkx = qva_tensor_hnd(kx, dt, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor tvx = qva_tensor_hnd(vx, dt, QVA_DEVICE_CPU, B, H, N, D);
    for (int64_t b = 0; b < B; ++b) /* the repeat_interleave of torch's enable_gqa */
        for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < N; ++n)
                for (int64_t c = 0; c < D; ++c) {
                    qvi_store_elem(&tkx, qvi_offset(&tkx, b, h, n, c),
                                   qvi_load_elem(&tk, qvi_offset(&tk, b, h / g, n, c)));
                    qvi_store_elem(&tvx, qvi_offset(&tvx, b, h, n, c),
                                   qvi_load_elem(&tv, qvi_offset(&tv, b, h / g, n, c)));
                }
    qva_tensor tq = qva_tensor_hnd(q, dt, QVA_DEVICE_CPU, B, H, N, D);
    tq.data = on_device(dev, q, nq * es), tk.data = on_device(dev, k, nkv * es);
    tv.data = on_device(dev, v, nkv * es), tkx.data = on_device(dev, kx, nq * es);
    tvx.data = on_device(dev, vx, nq * es);
    tq.device = tk.device = tv.device = tkx.device = tvx.device = dev;
    qva_tensor t1 = qva_tensor_hnd(o1, dt, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor t2 = qva_tensor_hnd(o2, dt, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor s1 = qva_tensor_hnd(l1, QVA_F32, QVA_DEVICE_CPU, B, H, N, 1);
    qva_tensor s2 = qva_tensor_hnd(l2, QVA_F32, QVA_DEVICE_CPU, B, H, N, 1);
    const char *where = dev == QVA_DEVICE_CPU ? "cpu" : "cuda";
    qva_context_t *ca = NULL, *cb = NULL;
    CHECK(qva_context_create(&ca, dev) == QVA_OK && qva_context_create(&cb, dev) == QVA_OK,
          "%s contexts: %s", where, qva_last_error());
    qva_config c = config_of(method);
    c.layer = 3, c.num_steps = 8;
    char why[512] = "";
    CHECK(qva_supports_heads(dev, &c, dt, D, H, Hkv, why, sizeof why) == 1,
          "%s %s H=%lld Hkv=%lld not supported: %s", where, method, (long long)H,
          (long long)Hkv, why);
    const int steps = steps_of(method);
    for (int s = 0; s < steps && ca && cb && tq.data && tk.data && tv.data && tkx.data && tvx.data;
         ++s) {
        c.step = s;
        qva_status st = run_on(dev, ca, &c, &tq, &tk, &tv, t1, s1, nq * es, nl);
        CHECK(st == QVA_OK, "%s %s H=%lld Hkv=%lld: %s", where, method, (long long)H,
              (long long)Hkv, qva_last_error());
        st = run_on(dev, cb, &c, &tq, &tkx, &tvx, t2, s2, nq * es, nl);
        CHECK(st == QVA_OK, "%s %s repeated: %s", where, method, qva_last_error());
        CHECK(!memcmp(o1, o2, nq * es) && !memcmp(l1, l2, nl * 4),
              "%s %s H=%lld Hkv=%lld D=%lld step %d: grouped K/V differs from repeated K/V",
              where, method, (long long)H, (long long)Hkv, (long long)D, s);
        if (dev == QVA_DEVICE_CPU && strstr(method, "kprev")) /* state per K/V head */
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < Hkv; ++h) {
                    const qvi_vs_state *st_g = qvi_context_vs_state(ca, c.layer, b, h);
                    CHECK(st_g && st_g->kmean_d == D, "%s: no K mean kept for b %lld kv head "
                          "%lld after step %d", method, (long long)b, (long long)h, s);
                }
    }
    qva_context_free(ca);
    qva_context_free(cb);
    if (tq.data) off_device(dev, (void *)tq.data);
    if (tk.data) off_device(dev, (void *)tk.data);
    if (tv.data) off_device(dev, (void *)tv.data);
    if (tkx.data) off_device(dev, (void *)tkx.data);
    if (tvx.data) off_device(dev, (void *)tvx.data);
    free(q), free(k), free(v), free(kx), free(vx), free(o1), free(o2), free(l1), free(l2);
}

static void gqa_matches_repeated(qva_device dev, const char *method, int64_t H, int64_t Hkv,
                                 int64_t D) {
    gqa_matches_repeated_dt(dev, method, H, Hkv, D, QVA_F32);
}

/* The carried statistics over grouped heads, in bf16 (CUDA's inputs for
 * them) on both backends; GQA at D 64 and MQA at D 128. */
static void gqa_carried(qva_device dev) {
    for (size_t m = 0; m < NCARRIED; ++m) {
        gqa_matches_repeated_dt(dev, carried_methods[m], 4, 2, 64, QVA_BF16);
        gqa_matches_repeated_dt(dev, carried_methods[m], 4, 1, 128, QVA_BF16);
    }
}

static void test_gqa_errors(void) {
    const int64_t N = 40, D = 64;
    float *q = rand_buf((size_t)(6 * N * D), 1.0f), *o = malloc((size_t)(6 * N * D) * 4);
    float *k = rand_buf((size_t)(4 * N * D), 1.0f), *v = rand_buf((size_t)(4 * N * D), 1.0f);
    qva_context_t *ctx;
    qva_context_create(&ctx, QVA_DEVICE_CPU);
    qva_config c = config_of("sage8");
    qva_tensor tq = qva_tensor_hnd(q, QVA_F32, QVA_DEVICE_CPU, 1, 6, N, D);
    qva_tensor to = qva_tensor_hnd(o, QVA_F32, QVA_DEVICE_CPU, 1, 6, N, D);
    qva_tensor tk = qva_tensor_hnd(k, QVA_F32, QVA_DEVICE_CPU, 1, 4, N, D);
    qva_tensor tv = qva_tensor_hnd(v, QVA_F32, QVA_DEVICE_CPU, 1, 4, N, D);
    qva_status st = qva_attention(ctx, &c, &tq, &tk, &tv, &to, NULL); /* 6 over 4 */
    CHECK(st == QVA_ERR_SHAPE && strstr(qva_last_error(), "multiple of H_kv"),
          "6 heads over 4: %s", qva_last_error());
    tk.shape[1] = 3; /* 6 over 3 for k, 4 for v */
    st = qva_attention(ctx, &c, &tq, &tk, &tv, &to, NULL);
    CHECK(st == QVA_ERR_SHAPE && strstr(qva_last_error(), "same heads"), "k 3, v 4: %s",
          qva_last_error());
    tv.shape[1] = 3;
    CHECK(qva_attention(ctx, &c, &tq, &tk, &tv, &to, NULL) == QVA_OK, "6 over 3: %s",
          qva_last_error());
    CHECK(qva_attention_check(QVA_DEVICE_CPU, &c, &tq, &tk, &tv, NULL, NULL) == QVA_OK,
          "check without out: %s", qva_last_error());
    to.shape[1] = 3; /* out takes q's heads */
    CHECK(qva_attention(ctx, &c, &tq, &tk, &tv, &to, NULL) == QVA_ERR_SHAPE, "out heads");
    char why[256];
    CHECK(qva_supports_heads(QVA_DEVICE_CPU, &c, QVA_BF16, 128, 32, 8, why, sizeof why) == 1,
          "cpu gqa: %s", why);
    CHECK(qva_supports_heads(QVA_DEVICE_CPU, &c, QVA_BF16, 128, 6, 4, why, sizeof why) == 0 &&
              strstr(why, "multiple"), "6 over 4: %s", why);
    CHECK(qva_supports(QVA_DEVICE_CPU, &c, QVA_BF16, 80, why, sizeof why) == 1 &&
              strstr(why, "zero-padded to 128"), "cpu D 80: %s", why);
    CHECK(qva_supports(QVA_DEVICE_CPU, &c, QVA_BF16, 129, why, sizeof why) == 0 &&
              strstr(why, "at most 128"), "cpu D 129: %s", why);
    if (!qva_cuda_available())
        CHECK(qva_supports_heads(QVA_DEVICE_CUDA, &c, QVA_BF16, 128, 32, 8, why, sizeof why) == 0
                  && why[0], "cuda gqa without a device: '%s'", why);
    qva_context_free(ctx);
    free(q), free(o), free(k), free(v);
}

/* CUDA: every method with a kernel runs grouped K/V (bit for bit equal to
 * repeated K/V, as on the CPU); head dims off 64/128 are still refused. */
static void test_cuda_gqa(void) {
    if (!qva_cuda_available()) {
        printf("test_gqa: no CUDA device, the CUDA grouped calls not run\n");
        return;
    }
    for (size_t m = 0; m < NMETHODS; ++m) {
        if (!strcmp(methods[m], "exact")) continue; /* the CPU ground truth only */
        gqa_matches_repeated(QVA_DEVICE_CUDA, methods[m], 4, 2, 64);
        gqa_matches_repeated(QVA_DEVICE_CUDA, methods[m], 4, 1, 128); /* MQA */
    }
    gqa_carried(QVA_DEVICE_CUDA);
    char why[512];
    qva_config c = config_of("sage8");
    CHECK(qva_supports(QVA_DEVICE_CUDA, &c, QVA_BF16, 80, why, sizeof why) == 0 &&
              strstr(why, "zero-pad"), "cuda D 80: %s", why);
}

/* ---------------------------------------------------------------- head dims */

/* A [B,H,N,D] f32 head-major buffer widened to dp channels with zeros. */
static float *widen(const float *x, int64_t rows, int64_t D, int64_t dp) {
    float *y = calloc((size_t)(rows * dp), sizeof *y);
    for (int64_t r = 0; r < rows; ++r) memcpy(y + r * dp, x + r * D, (size_t)D * sizeof *x);
    return y;
}

/* A call at head dim D against (1) the same call on inputs zero-padded to
 * dp channels with sm_scale 1/sqrt(D), and (2) the CPU reference computing
 * at D unpadded (the backend called directly; not for +hadamard, whose
 * rotation runs over the padded width).  Inputs bf16 in NHD memory, out
 * f16: the copies keep every layout and dtype. */
static void padded_matches(const char *method, int64_t D) {
    const int64_t B = 1, H = 2, Hkv = 1, N = 200, dp = D <= 64 ? 64 : 128;
    const size_t nq = (size_t)(B * H * N * D), nkv = (size_t)(B * Hkv * N * D);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
    float *r = rand_buf(nq + 2 * nkv, 1.0f);
    qva_tensor tq = qva_tensor_nhd(q, QVA_BF16, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor tk = qva_tensor_nhd(k, QVA_BF16, QVA_DEVICE_CPU, B, Hkv, N, D);
    qva_tensor tv = qva_tensor_nhd(v, QVA_BF16, QVA_DEVICE_CPU, B, Hkv, N, D);
    for (size_t i = 0; i < nq; ++i) qvi_store_elem(&tq, (int64_t)i, r[i]);
    for (size_t i = 0; i < nkv; ++i) qvi_store_elem(&tk, (int64_t)i, r[nq + i]);
    for (size_t i = 0; i < nkv; ++i) qvi_store_elem(&tv, (int64_t)i, 2.0f * r[nq + nkv + i]);
    /* the padded copies, HND f32 (the bf16 values exactly) */
    float *fq = malloc(nq * 4), *fk = malloc(nkv * 4), *fv = malloc(nkv * 4);
    for (int64_t h = 0; h < H; ++h) qvi_load_head(&tq, 0, h, fq + h * N * D);
    qvi_load_head(&tk, 0, 0, fk);
    qvi_load_head(&tv, 0, 0, fv);
    float *pq = widen(fq, B * H * N, D, dp), *pk = widen(fk, B * Hkv * N, D, dp),
          *pv = widen(fv, B * Hkv * N, D, dp);
    uint16_t *bq = malloc((size_t)(B * H * N * dp) * 2);
    uint16_t *bk = malloc((size_t)(B * Hkv * N * dp) * 2);
    uint16_t *bv = malloc((size_t)(B * Hkv * N * dp) * 2);
    qva_tensor pq_t = qva_tensor_hnd(bq, QVA_BF16, QVA_DEVICE_CPU, B, H, N, dp);
    qva_tensor pk_t = qva_tensor_hnd(bk, QVA_BF16, QVA_DEVICE_CPU, B, Hkv, N, dp);
    qva_tensor pv_t = qva_tensor_hnd(bv, QVA_BF16, QVA_DEVICE_CPU, B, Hkv, N, dp);
    for (int64_t i = 0; i < B * H * N * dp; ++i) qvi_store_elem(&pq_t, i, pq[i]);
    for (int64_t i = 0; i < B * Hkv * N * dp; ++i) qvi_store_elem(&pk_t, i, pk[i]);
    for (int64_t i = 0; i < B * Hkv * N * dp; ++i) qvi_store_elem(&pv_t, i, pv[i]);

    uint16_t *o = malloc(nq * 2), *po = malloc((size_t)(B * H * N * dp) * 2), *uo = malloc(nq * 2);
    float l[2 * 200], pl[2 * 200], ul[2 * 200];
    qva_tensor to = qva_tensor_nhd(o, QVA_F16, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor uo_t = qva_tensor_nhd(uo, QVA_F16, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor po_t = qva_tensor_hnd(po, QVA_F16, QVA_DEVICE_CPU, B, H, N, dp);
    qva_tensor tl = qva_tensor_hnd(l, QVA_F32, QVA_DEVICE_CPU, B, H, N, 1);
    qva_tensor tpl = qva_tensor_hnd(pl, QVA_F32, QVA_DEVICE_CPU, B, H, N, 1);
    qva_tensor tul = qva_tensor_hnd(ul, QVA_F32, QVA_DEVICE_CPU, B, H, N, 1);
    qva_context_t *c1, *c2, *c3;
    qva_context_create(&c1, QVA_DEVICE_CPU);
    qva_context_create(&c2, QVA_DEVICE_CPU);
    qva_context_create(&c3, QVA_DEVICE_CPU);
    qva_config c = config_of(method);
    CHECK(qva_attention(c1, &c, &tq, &tk, &tv, &to, &tl) == QVA_OK, "%s D=%lld: %s", method,
          (long long)D, qva_last_error());
    qva_config cp = c;
    cp.sm_scale = 1.0f / sqrtf((float)D);
    CHECK(qva_attention(c2, &cp, &pq_t, &pk_t, &pv_t, &po_t, &tpl) == QVA_OK, "%s padded: %s",
          method, qva_last_error());
    int same = !memcmp(l, pl, sizeof l);
    for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
            for (int64_t ch = 0; ch < D; ++ch)
                same &= ((uint16_t *)to.data)[qvi_offset(&to, 0, h, n, ch)] ==
                        po[qvi_offset(&po_t, 0, h, n, ch)];
    CHECK(same, "%s D=%lld: differs from the caller-padded call", method, (long long)D);
    /* (draft's NVFP4 blocks need D % 16 == 0 unpadded; padded they run) */
    /* (a rotation of the zero-padded rows is not the unpadded one's) */
    if (!c.hadamard && (strncmp(method, "draft", 5) || D % 16 == 0)) {
        qva_status st = !strncmp(method, "draft", 5)
                            ? qvi_cpu_draft(c3, &c, &tq, &tk, &tv, &uo_t, &tul)
                            : qvi_cpu_attention(c3, &c, &tq, &tk, &tv, &uo_t, &tul);
        CHECK(st == QVA_OK, "%s unpadded: %s", method, qva_last_error());
        CHECK(!memcmp(o, uo, nq * 2) && !memcmp(l, ul, sizeof l),
              "%s D=%lld: differs from the unpadded CPU reference", method, (long long)D);
    }
    qva_context_free(c1), qva_context_free(c2), qva_context_free(c3);
    free(q), free(k), free(v), free(r), free(fq), free(fk), free(fv), free(pq), free(pk);
    free(pv), free(bq), free(bk), free(bv), free(o), free(po), free(uo);
}

/* exact at D = 80 against attention computed here in FP64, unpadded. */
static void test_padded_exact_vs_naive(void) {
    const int N = 150, D = 80;
    float *q = rand_buf((size_t)N * D, 1.0f), *k = rand_buf((size_t)N * D, 1.0f),
          *v = rand_buf((size_t)N * D, 1.0f), *o = malloc((size_t)N * D * 4);
    qva_tensor tq = qva_tensor_hnd(q, QVA_F32, QVA_DEVICE_CPU, 1, 1, N, D), tk = tq, tv = tq,
               to = tq;
    tk.data = k, tv.data = v, to.data = o;
    qva_context_t *ctx;
    qva_context_create(&ctx, QVA_DEVICE_CPU);
    qva_config c = config_of("exact");
    CHECK(qva_attention(ctx, &c, &tq, &tk, &tv, &to, NULL) == QVA_OK, "exact D=80: %s",
          qva_last_error());
    double worst = 0.0, s[150];
    for (int i = 0; i < N; ++i) {
        double mx = -INFINITY, l = 0.0;
        for (int j = 0; j < N; ++j) {
            double dot = 0.0;
            for (int ch = 0; ch < D; ++ch) dot += (double)q[i * D + ch] * k[j * D + ch];
            s[j] = dot / sqrt((double)D);
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < N; ++j) l += (s[j] = exp(s[j] - mx));
        for (int ch = 0; ch < D; ++ch) {
            double acc = 0.0;
            for (int j = 0; j < N; ++j) acc += s[j] * v[j * D + ch];
            double e = fabs(acc / l - o[i * D + ch]);
            worst = e > worst ? e : worst;
        }
    }
    CHECK(worst < 1e-6, "exact D=80 vs FP64 unpadded: max error %g", worst);
    qva_context_free(ctx);
    free(q), free(k), free(v), free(o);
}

/* ---------------------------------------------------------------- stateless */

/* vc8+expcast (the default config) with layer QVA_LAYER_NONE: a call on a
 * shared context gives what it gives on a fresh one, whatever ran there
 * before; it leaves a stateful layer's schedule as it was. */
static void test_stateless(void) {
    const int64_t B = 1, H = 2, N = 300, D = 64;
    const size_t n = (size_t)(B * H * N * D);
    float *q = rand_buf(n, 1.0f), *k = rand_buf(n, 1.0f), *v = rand_buf(n, 1.0f);
    float *q2 = rand_buf(n, 1.0f), *v2 = rand_buf(n, 3.0f);
    float *o[6];
    for (int i = 0; i < 6; ++i) o[i] = malloc(n * sizeof(float));
    qva_tensor tq = qva_tensor_hnd(q, QVA_F32, QVA_DEVICE_CPU, B, H, N, D), tk = tq, tv = tq;
    tk.data = k, tv.data = v;
    qva_tensor tq2 = tq, tv2 = tq;
    tq2.data = q2, tv2.data = v2;
    qva_tensor to[6];
    for (int i = 0; i < 6; ++i) to[i] = tq, to[i].data = o[i];
    qva_config c;
    qva_config_default(&c); /* vc8+expcast, warm start, paper schedule */
    c.layer = QVA_LAYER_NONE;
    qva_context_t *shared, *fresh;
    qva_context_create(&shared, QVA_DEVICE_CPU);
    qva_context_create(&fresh, QVA_DEVICE_CPU);
    CHECK(qva_attention(shared, &c, &tq, &tk, &tv, &to[0], NULL) == QVA_OK, "%s", qva_last_error());
    CHECK(qva_attention(shared, &c, &tq2, &tk, &tv2, &to[1], NULL) == QVA_OK, "other inputs");
    CHECK(qva_attention(shared, &c, &tq, &tk, &tv, &to[2], NULL) == QVA_OK, "again");
    CHECK(qva_attention(fresh, &c, &tq, &tk, &tv, &to[3], NULL) == QVA_OK, "fresh");
    CHECK(!memcmp(o[0], o[2], n * 4) && !memcmp(o[0], o[3], n * 4),
          "stateless: identical inputs gave different outputs");
    /* the symptom: layer 0 warm-starts k-means from the last call */
    qva_config s = c;
    s.layer = 0;
    qva_context_t *st;
    qva_context_create(&st, QVA_DEVICE_CPU);
    qva_attention(st, &s, &tq, &tk, &tv, &to[4], NULL);
    qva_attention(st, &s, &tq2, &tk, &tv2, &to[5], NULL);
    qva_attention(st, &s, &tq, &tk, &tv, &to[5], NULL);
    CHECK(memcmp(o[4], o[5], n * 4) != 0,
          "layer 0 (stateful) repeated its output: this test no longer shows the state");
    /* a stateful schedule around stateless calls: step 1 reuses step 0's
     * permutation as if the stateless call had not run */
    s.num_steps = 8;
    qva_context_reset(st);
    s.step = 0;
    qva_attention(st, &s, &tq, &tk, &tv, &to[4], NULL);
    s.step = 1;
    qva_attention(st, &s, &tq2, &tk, &tv2, &to[4], NULL); /* reference: step 1 */
    qva_context_reset(st);
    s.step = 0;
    qva_attention(st, &s, &tq, &tk, &tv, &to[5], NULL);
    CHECK(qva_attention(st, &c, &tq2, &tk, &tv2, &to[5], NULL) == QVA_OK, "stateless between");
    s.step = 1;
    qva_attention(st, &s, &tq2, &tk, &tv2, &to[5], NULL);
    CHECK(!memcmp(o[4], o[5], n * 4), "a stateless call changed layer 0's schedule");
    qva_context_free(shared), qva_context_free(fresh), qva_context_free(st);
    free(q), free(k), free(v), free(q2), free(v2);
    for (int i = 0; i < 6; ++i) free(o[i]);
}

int main(void) {
    for (size_t m = 0; m < NMETHODS; ++m) {
        gqa_matches_repeated(QVA_DEVICE_CPU, methods[m], 4, 2, 64);
        gqa_matches_repeated(QVA_DEVICE_CPU, methods[m], 4, 1, 128); /* MQA */
    }
    gqa_carried(QVA_DEVICE_CPU);
    test_gqa_errors();
    test_cuda_gqa();
    const int64_t dims[] = {24, 80, 100};
    for (size_t m = 0; m < NMETHODS; ++m)
        for (size_t i = 0; i < sizeof dims / sizeof *dims; ++i) padded_matches(methods[m], dims[i]);
    test_padded_exact_vs_naive();
    test_stateless();
    return check_summary("test_gqa");
}
