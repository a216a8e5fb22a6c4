/* The error decomposition (qva_error_terms_compute, the CPU reference's
 * qvi_quant_mask; docs/NUMERICS.md "Where the error comes from"):
 *  1. every bit on is qva_attention bit for bit, and the full term is the
 *     method's rel-L2; the FP32 engine with every bit on stays within
 *     FP32 rounding of the codes (the dequantization scales are right);
 *  2. each single-operand term equals a reference built here: the operand
 *     quantized with the library's quantizer, dequantized here, everything
 *     else FP32, attention in FP64 (Q, K, V, the V-Smooth means), or, for
 *     P, an FP32/FP64 re-implementation of the blockwise P codes;
 *  3. the terms of random cases are finite and positive and the full
 *     error is at least the largest single term (errors add roughly in
 *     quadrature);
 *  4. the errors of bad calls. */
#define TEST_RNG_SEED 0xD1B54A32D192ED03ull
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

enum { NTOK = 300, NPAD = 384, HD = 64, HEADS = 2 };
/* Tolerances, measured (see the printout): a term against its reference
 * is FP32 arithmetic against FP64, rel-L2 <= 2e-6 (measured <= 1.8e-7)
 * where the terms are 1e-4 .. 2e-2; the FP32 engine with every bit on
 * against the codes moves only by FP32 rounding of scores and partials
 * (a P code can flip; measured <= 6.8e-5). */
#define TOL_REF 2e-6
#define TOL_ENGINE 2e-4

typedef struct data {
    int64_t h, hkv, n, d;
    float *q, *k, *v;
    qva_tensor tq, tk, tv;
} data;

/* DiT-like heads: sharp queries, a common key offset (what K smoothing
 * removes), values with a per-channel offset and a few clusters (what
 * V-Smooth groups). */
static data make_data(int64_t h, int64_t hkv, int64_t n, int64_t d) {
    data x = {h, hkv, n, d, NULL, NULL, NULL, {0}, {0}, {0}};
    const size_t nq = (size_t)(h * n * d), nk = (size_t)(hkv * n * d);
    x.q = malloc(nq * sizeof *x.q), x.k = malloc(nk * sizeof *x.k);
    x.v = malloc(nk * sizeof *x.v);
    for (size_t i = 0; i < nq; ++i) x.q[i] = (float)(1.5 * rng_gauss());
    for (size_t i = 0; i < nk; ++i) x.k[i] = (float)(rng_gauss() + 0.7 * ((i % d) % 3));
    for (size_t i = 0; i < nk; ++i) {
        size_t tok = i / d, c = i % d;
        x.v[i] = (float)(0.4 * rng_gauss() + 1.5 * ((tok * 7) % 5 == c % 5) + 0.3 * (c % 4));
    }
    x.tq = qva_tensor_hnd(x.q, QVA_F32, QVA_DEVICE_CPU, 1, h, n, d);
    x.tk = qva_tensor_hnd(x.k, QVA_F32, QVA_DEVICE_CPU, 1, hkv, n, d);
    x.tv = qva_tensor_hnd(x.v, QVA_F32, QVA_DEVICE_CPU, 1, hkv, n, d);
    return x;
}

static void free_data(data *x) { free(x->q), free(x->k), free(x->v); }

/* A stateless config (what qva_error_terms_compute runs). */
static qva_config cfg_of(const char *m) {
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, m) == QVA_OK, "%s: %s", m, qva_last_error());
    c.layer = QVA_LAYER_NONE;
    c.vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
    c.vsmooth.warm_start = 0;
    return c;
}

static size_t out_elems(const data *x) { return (size_t)(x->h * x->n * x->d); }

/* The CPU reference with an operand mask; a malloc'd [1,H,N,D] output. */
static float *run_mask(const qva_config *c, const data *x, int mask) {
    float *out = calloc(out_elems(x), sizeof *out);
    qva_tensor to = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, 1, x->h, x->n, x->d);
    qva_context_t *ctx;
    qva_context_create(&ctx, QVA_DEVICE_CPU);
    qvi_context_lock(ctx);
    qva_status st = qvi_cpu_run(ctx, c, &x->tq, &x->tk, &x->tv, &to, NULL, mask);
    qvi_context_unlock(ctx);
    qva_context_free(ctx);
    CHECK(st == QVA_OK, "mask %d: %s", mask, qva_last_error());
    return out;
}

static float *run_attention(const qva_config *c, const data *x) {
    float *out = calloc(out_elems(x), sizeof *out);
    qva_tensor to = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, 1, x->h, x->n, x->d);
    qva_context_t *ctx;
    qva_context_create(&ctx, QVA_DEVICE_CPU);
    qva_status st = qva_attention(ctx, c, &x->tq, &x->tk, &x->tv, &to, NULL);
    qva_context_free(ctx);
    CHECK(st == QVA_OK, "qva_attention: %s", qva_last_error());
    return out;
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    qva_error_metrics m;
    qva_compare(a, ref, n, &m);
    return m.rel_l2;
}

/* ------------------------------------------------------------ 1. all on */

/* The test's heads and their exact attention, made once. */
static data g_x;
static float *g_exact;

static void test_all_on(const char *method) {
    const data x = g_x;
    qva_config c = cfg_of(method);
    float *a = run_attention(&c, &x), *m = run_mask(&c, &x, QVI_QUANT_ALL);
    float *e = run_mask(&c, &x, QVI_QUANT_ALL | QVI_QUANT_FP32_ENGINE);
    const float *ex = g_exact;
    const size_t n = out_elems(&x);
    CHECK(!memcmp(a, m, n * sizeof *a), "%s: mask ALL differs from qva_attention", method);
    qva_error_terms t;
    CHECK(qva_error_terms_compute(&c, &x.tq, &x.tk, &x.tv, &t) == QVA_OK, "%s: %s", method,
          qva_last_error());
    CHECK(t.full == rel_l2(a, ex, n), "%s: full %.9g is not the method's rel-L2 %.9g", method,
          t.full, rel_l2(a, ex, n));
    const double eng = rel_l2(e, a, n);
    printf("  %-16s full %.4e, FP32 engine all-on vs codes %.2e\n", method, t.full, eng);
    CHECK(eng <= TOL_ENGINE, "%s: FP32 engine with every bit on is %.3g from the codes",
          method, eng);
    free(a), free(m), free(e);
}

/* ------------------------------------------------------------ 2. references */

static int is_vc(const qva_config *c) {
    return c->method == QVA_METHOD_VC8 || c->method == QVA_METHOD_VC4;
}
static int smooths(const qva_config *c) {
    return c->method != QVA_METHOD_FP8;
}
static int is_fp4(const qva_config *c) {
    return c->method == QVA_METHOD_SAGE4 || c->method == QVA_METHOD_VC4;
}

/* Head h's operands as the method's quantizers see them, in rows of NPAD
 * (zero padded): K and V in the V-Smooth order (vc), K minus its channel
 * mean (all but fp8), Q and K rotated (+hadamard). */
static void method_operands(const qva_config *c, const data *x, int h, float *q, float *k,
                            float *v) {
    const size_t hs = (size_t)NTOK * HD;
    int32_t perm[NTOK];
    for (int i = 0; i < NTOK; ++i) perm[i] = i;
    if (is_vc(c))
        qva_vsmooth_permutation(x->v + h * hs, NTOK, HD, c->vsmooth.clusters, c->vsmooth.iters,
                                perm);
    memset(q, 0, NPAD * HD * sizeof *q), memset(k, 0, NPAD * HD * sizeof *k);
    memset(v, 0, NPAD * HD * sizeof *v);
    memcpy(q, x->q + h * hs, hs * sizeof *q);
    for (int i = 0; i < NTOK; ++i) {
        memcpy(k + i * HD, x->k + h * hs + (size_t)perm[i] * HD, HD * sizeof *k);
        memcpy(v + i * HD, x->v + h * hs + (size_t)perm[i] * HD, HD * sizeof *v);
    }
    if (smooths(c)) {
        float mean[HD];
        qvi_channel_mean(k, NTOK, HD, mean);
        for (int i = 0; i < NTOK; ++i)
            for (int ch = 0; ch < HD; ++ch) k[i * HD + ch] -= mean[ch];
    }
    if (c->hadamard) {
        float signs[HD];
        qvi_hadamard_signs(c, HD, signs);
        for (int i = 0; i < NTOK; ++i) {
            qva_hadamard(q + i * HD, HD, signs);
            qva_hadamard(k + i * HD, HD, signs);
        }
    }
}

/* x (NPAD rows) replaced by its dequantized codes: INT8 with
 * rows_per_scale rows per scale, E4M3 per block (fp8) or NVFP4 rows. */
static void dequant_qk(const qva_config *c, float *x, int rows_per_scale) {
    if (is_fp4(c)) {
        float *r = malloc(NPAD * HD * sizeof *r);
        float g = qvi_quant_nvfp4_rows(x, NPAD, HD, r);
        for (int i = 0; i < NPAD * HD; ++i) x[i] = r[i] * g;
        free(r);
    } else if (c->method == QVA_METHOD_FP8) {
        qvi_f8 f;
        qvi_quant_e4m3_blocks(x, NPAD, HD, &f);
        for (int i = 0; i < NPAD * HD; ++i)
            x[i] = qva_e4m3_decode(f.codes[i]) * f.block_scale[i / (QVI_BLOCK * HD)];
        free(f.codes), free(f.block_scale), free(f.chan_scale);
    } else {
        qvi_i8 q8;
        qvi_quant_i8(x, NPAD, HD, rows_per_scale, &q8);
        for (int i = 0; i < NPAD * HD; ++i)
            x[i] = (float)q8.codes[i] * q8.scale[i / HD / rows_per_scale];
        free(q8.codes), free(q8.scale);
    }
}

/* VC Eq. 4 on the valid rows of v: block means (qvi_block_mean) into mu
 * [blocks][HD], v becomes the FP32 residual. */
static void split_means(float *v, float *mu) {
    for (int j = 0; j * QVI_BLOCK < NTOK; ++j) {
        const int r0 = j * QVI_BLOCK, r1 = r0 + QVI_BLOCK < NTOK ? r0 + QVI_BLOCK : NTOK;
        for (int ch = 0; ch < HD; ++ch) {
            mu[j * HD + ch] = qvi_block_mean(v, NTOK, HD, r0, ch);
            for (int i = r0; i < r1; ++i) v[i * HD + ch] -= mu[j * HD + ch];
        }
    }
}

/* The V of sage8/vc8/fp8 with the values (quant_v) and the V-Smooth means
 * (quant_mu) quantized or not; vc8's residual and means recombined. */
static void dequant_v(const qva_config *c, float *v, int quant_v, int quant_mu) {
    if (c->method == QVA_METHOD_FP8) {
        if (quant_v) dequant_qk(c, v, QVI_BLOCK);
        return;
    }
    const int vc = is_vc(c);
    float mu[NPAD / QVI_BLOCK * HD] = {0};
    qvi_v8 v8;
    CHECK(qvi_v8_prepare(v, NTOK, HD, NULL, vc, QVA_V_E4M3, &v8) == QVA_OK, "v8");
    if (vc) split_means(v, mu);
    for (int i = 0; i < NTOK; ++i)
        for (int ch = 0; ch < HD; ++ch) {
            const int j = i / QVI_BLOCK;
            float rq = qva_e4m3_decode(v8.codes[i * HD + ch]) * v8.chan_scale[ch];
            float mu_q = vc ? v8.mu_hat[j * HD + ch] * v8.chan_scale[ch] : 0.0f;
            v[i * HD + ch] = (quant_v ? rq : v[i * HD + ch]) + (quant_mu ? mu_q : mu[j * HD + ch]);
        }
    qvi_v8_free(&v8);
}

/* FP64 softmax attention of NTOK query rows over NTOK keys. */
static void attention64(const float *q, const float *k, const float *v, double scale,
                        float *out) {
    static double s[NTOK];
    for (int i = 0; i < NTOK; ++i) {
        double mx = -INFINITY, l = 0.0, o[HD] = {0};
        for (int j = 0; j < NTOK; ++j) {
            double acc = 0.0;
            for (int ch = 0; ch < HD; ++ch) acc += (double)q[i * HD + ch] * k[j * HD + ch];
            s[j] = acc * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < NTOK; ++j) {
            double p = exp(s[j] - mx);
            l += p;
            for (int ch = 0; ch < HD; ++ch) o[ch] += p * v[j * HD + ch];
        }
        for (int ch = 0; ch < HD; ++ch) out[i * HD + ch] = (float)(o[ch] / l);
    }
}

/* One block's P codes as the method makes them: ExpCast (VC Eq. 7) or
 * exp2 with the 8.807 offset cast to E4M3 (DA2 C.3).  w: decoded weights;
 * returns what enters l (decoded codes: ExpCast, +codesum; else the FP32
 * amplified exp2). */
static double block_codes(const float *s, int nk, float m, int expcast, int codesum,
                          double *w) {
    double l = 0.0;
    for (int t = 0; t < nk; ++t) {
        if (expcast) {
            w[t] = qva_e4m3_decode(qva_expcast_e4m3(s[t] - m));
            l += w[t];
        } else {
            float p = exp2f((s[t] - m) + QVI_SAGE_P_OFFSET);
            w[t] = qva_e4m3_decode(qva_e4m3_encode(p));
            l += codesum ? w[t] : (double)p;
        }
    }
    return l;
}

/* The P term of an 8-bit method, rebuilt: FP32 scores in channel order
 * (the library's arithmetic, so the same codes), the running max per key
 * block of 128, each block's codes against that max, and the blocks
 * combined in FP64 with weights 2^(m_j - m).  With V-Smooth (vc8) the
 * block's values are residual + mean and the mean is restored with the
 * block's row sum l_j (VC Eq. 6), which is not the sum of the decoded
 * codes on the exp2 path: part of the P term. */
static void p_term_ref(const qva_config *c, const float *q, const float *k, float *v,
                       float *out) {
    const float sl = qvi_sm_scale(c, HD) * QVI_LOG2E;
    float mu[NPAD / QVI_BLOCK * HD] = {0};
    if (is_vc(c)) split_means(v, mu);
    for (int i = 0; i < NTOK; ++i) {
        float s[QVI_BLOCK], m = -INFINITY;
        double w[QVI_BLOCK], num[HD] = {0}, den = 0.0, m_prev = -INFINITY;
        for (int j0 = 0; j0 < NTOK; j0 += QVI_BLOCK) {
            const int nk = NTOK - j0 < QVI_BLOCK ? NTOK - j0 : QVI_BLOCK;
            for (int t = 0; t < nk; ++t) {
                float acc = 0.0f;
                for (int ch = 0; ch < HD; ++ch) acc += q[i * HD + ch] * k[(j0 + t) * HD + ch];
                s[t] = acc * sl;
                m = s[t] > m ? s[t] : m;
            }
            const double alpha = m_prev == -INFINITY ? 1.0 : exp2((double)m_prev - m);
            const double lj =
                block_codes(s, nk, m, c->expcast, c->p_sum == QVA_P_SUM_CODES, w);
            den = den * alpha + lj;
            for (int ch = 0; ch < HD; ++ch) {
                double part = lj * mu[j0 / QVI_BLOCK * HD + ch];
                for (int t = 0; t < nk; ++t) part += w[t] * v[(j0 + t) * HD + ch];
                num[ch] = num[ch] * alpha + part;
            }
            m_prev = m;
        }
        for (int ch = 0; ch < HD; ++ch) out[i * HD + ch] = (float)(num[ch] / den);
    }
}

typedef enum ref_term { REF_Q, REF_K, REF_P, REF_V, REF_MU } ref_term;
static const int ref_mask[] = {QVI_QUANT_Q, QVI_QUANT_K, QVI_QUANT_P, QVI_QUANT_V,
                               QVI_QUANT_MU};
static const char *const ref_name[] = {"Q", "K", "P", "V", "mu"};

/* The reference output of one term for head h. */
static void term_reference(const qva_config *c, const data *x, int h, ref_term t,
                           float *out) {
    float *q = malloc(NPAD * HD * sizeof *q), *k = malloc(NPAD * HD * sizeof *k),
          *v = malloc(NPAD * HD * sizeof *v);
    method_operands(c, x, h, q, k, v);
    if (t == REF_Q) dequant_qk(c, q, qvi_q_rows_per_scale(c));
    if (t == REF_K) dequant_qk(c, k, QVI_BLOCK);
    if (t == REF_V || t == REF_MU) dequant_v(c, v, t == REF_V, t == REF_MU);
    if (t == REF_P) p_term_ref(c, q, k, v, out);
    else attention64(q, k, v, qvi_sm_scale(c, HD), out);
    free(q), free(k), free(v);
}

/* The library's term against the reference, head by head; the term must
 * also move the output measurably, or the comparison proves nothing. */
static void check_term(const char *method, ref_term t) {
    const data x = g_x;
    qva_config c = cfg_of(method);
    float *lib = run_mask(&c, &x, ref_mask[t]);
    const float *ex = g_exact;
    float *ref = malloc(out_elems(&x) * sizeof *ref);
    for (int h = 0; h < HEADS; ++h)
        term_reference(&c, &x, h, t, ref + (size_t)h * NTOK * HD);
    const double diff = rel_l2(lib, ref, out_elems(&x)), term = rel_l2(lib, ex, out_elems(&x));
    printf("  %-16s %-2s term %.4e, against its reference %.2e\n", method, ref_name[t], term,
           diff);
    CHECK(diff <= TOL_REF, "%s %s term: %.3g from its reference", method, ref_name[t], diff);
    CHECK(term >= 20 * TOL_REF, "%s %s term %.3g: too small to test", method, ref_name[t],
          term);
    free(lib), free(ref);
}

/* ExpCast changes only P: the P terms differ, the Q terms do not. */
static void test_expcast_moves_p_only(void) {
    const data x = g_x;
    qva_config a = cfg_of("sage8"), b = cfg_of("sage8+expcast");
    const size_t n = out_elems(&x);
    float *pa = run_mask(&a, &x, QVI_QUANT_P), *pb = run_mask(&b, &x, QVI_QUANT_P);
    float *qa = run_mask(&a, &x, QVI_QUANT_Q), *qb = run_mask(&b, &x, QVI_QUANT_Q);
    CHECK(rel_l2(pa, pb, n) > 1e-4, "P terms with and without ExpCast: %.3g apart",
          rel_l2(pa, pb, n));
    CHECK(!memcmp(qa, qb, n * sizeof *qa), "ExpCast changed the Q term");
    free(pa), free(pb), free(qa), free(qb);
}

/* ------------------------------------------------------------ 3. random cases */

static void test_terms_sane(const char *method, const data *x) {
    qva_config c = cfg_of(method);
    qva_error_terms t;
    qva_status st = qva_error_terms_compute(&c, &x->tq, &x->tk, &x->tv, &t);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    const double single[5] = {t.q, t.k, t.p, t.v, t.mu};
    double mx = 0.0;
    for (int i = 0; i < 5; ++i) {
        if (i == 4 && !is_vc(&c)) {
            CHECK(isnan(t.mu), "%s: mu term %g for a method without means", method, t.mu);
            continue;
        }
        CHECK(isfinite(single[i]) && single[i] > 0.0, "%s %s term %g", method, ref_name[i],
              single[i]);
        mx = single[i] > mx ? single[i] : mx;
    }
    printf("  %-16s full %.3e q %.3e k %.3e p %.3e v %.3e mu %.3e none %.2e\n", method, t.full,
           t.q, t.k, t.p, t.v, t.mu, t.none);
    CHECK(isfinite(t.full) && t.full >= 0.9 * mx, "%s: full %.3g below the largest term %.3g",
          method, t.full, mx);
    CHECK(t.none < 1e-5 && t.none < 0.1 * mx, "%s: nothing quantized still %.3g", method,
          t.none);
}

/* The terms' error directions: the full term's is qva_error_direction_compute
 * of qva_attention's output (the full term is that output bit for bit),
 * the terms themselves are qva_error_terms_compute's, a term that does not
 * apply has NaN, and +i8pv's lean (its u8 P codes drop the rows' tails)
 * sits in the P term; NULL dirs is refused. */
static void test_directions(const data *x) {
    static const char *const methods[] = {"sage8+i8pv", "vc8+expcast"};
    for (int m = 0; m < 2; ++m) {
        qva_config c = cfg_of(methods[m]);
        qva_error_terms t, t0;
        qva_error_term_directions d;
        CHECK(qva_error_terms_directions_compute(&c, &x->tq, &x->tk, &x->tv, &t, &d) == QVA_OK &&
                  qva_error_terms_compute(&c, &x->tq, &x->tk, &x->tv, &t0) == QVA_OK,
              "%s: %s", methods[m], qva_last_error());
        CHECK(!memcmp(&t, &t0, sizeof t), "%s: the terms differ from qva_error_terms_compute",
              methods[m]);
        float *out = run_attention(&c, x);
        qva_error_direction full;
        CHECK(qva_error_direction_compute(out, g_exact, x->h, x->n, &x->tv, &full) == QVA_OK &&
                  full.sharpen == d.full.sharpen && full.cos == d.full.cos,
              "%s: full direction %g/%g against the output's %g/%g", methods[m], d.full.sharpen,
              d.full.cos, full.sharpen, full.cos);
        free(out);
        CHECK(isnan(d.mu.cos) == !is_vc(&c), "%s: mu direction %g", methods[m], d.mu.cos);
        printf("  %-16s err-cos full %+.3f q %+.3f k %+.3f p %+.3f v %+.3f\n", methods[m],
               d.full.cos, d.q.cos, d.k.cos, d.p.cos, d.v.cos);
        const double other = fmax(fabs(d.q.cos), fmax(fabs(d.k.cos), fabs(d.v.cos)));
        if (m == 0) /* measured: p +0.29, the others within 0.05 */
            CHECK(d.p.cos > 0.2 && d.p.cos > 3.0 * other,
                  "+i8pv's lean not in its P term: p %g, the others up to %g", d.p.cos, other);
    }
    qva_config c = cfg_of("sage8");
    qva_error_terms t;
    CHECK(qva_error_terms_directions_compute(&c, &x->tq, &x->tk, &x->tv, &t, NULL) ==
              QVA_ERR_INVALID_ARGUMENT, "NULL dirs");
}

/* GQA (4 query heads over 2) and a padded head dim (48): the terms run
 * through the same padding as qva_attention. */
static void test_gqa_padded(void) {
    data x = make_data(4, 2, 200, 48);
    qva_config c = cfg_of("vc8+expcast"), ce = cfg_of("exact");
    float *a = run_attention(&c, &x), *ex = run_attention(&ce, &x);
    qva_error_terms t;
    CHECK(qva_error_terms_compute(&c, &x.tq, &x.tk, &x.tv, &t) == QVA_OK, "gqa: %s",
          qva_last_error());
    CHECK(t.full == rel_l2(a, ex, out_elems(&x)), "gqa/D=48: full %.9g vs %.9g", t.full,
          rel_l2(a, ex, out_elems(&x)));
    CHECK(isfinite(t.q) && isfinite(t.mu) && t.none < 1e-5, "gqa/D=48 terms");
    free(a), free(ex), free_data(&x);
}

/* ------------------------------------------------------------ 4. errors */

static void expect_error(const qva_config *c, const data *x, const qva_tensor *q,
                         qva_status want, const char *pattern, const char *what) {
    qva_error_terms t = {0, 0, 0, 0, 0, 0, 0};
    qva_status st = qva_error_terms_compute(c, q, &x->tk, &x->tv, &t);
    CHECK(st == want && strstr(qva_last_error(), pattern), "%s: status %d, '%s'", what,
          (int)st, qva_last_error());
    CHECK(isnan(t.full) && isnan(t.q) && isnan(t.none), "%s: terms not NaN", what);
}

static void test_errors(void) {
    data x = make_data(1, 1, 130, 64);
    qva_config c = cfg_of("sage8");
    qva_error_terms t;
    CHECK(qva_error_terms_compute(&c, &x.tq, &x.tk, &x.tv, NULL) == QVA_ERR_INVALID_ARGUMENT,
          "NULL terms");
    expect_error(NULL, &x, &x.tq, QVA_ERR_INVALID_ARGUMENT, "cfg is NULL", "NULL cfg");
    expect_error(&c, &x, NULL, QVA_ERR_INVALID_ARGUMENT, "q is NULL", "NULL q");
    qva_config e = cfg_of("exact"), b = cfg_of("bf16"), d = cfg_of("draft@85/0/7.5/7.5");
    expect_error(&e, &x, &x.tq, QVA_ERR_UNSUPPORTED, "nothing", "exact");
    expect_error(&b, &x, &x.tq, QVA_ERR_UNSUPPORTED, "not decomposed", "bf16");
    d.draft.grid_t = 1, d.draft.grid_h = 10, d.draft.grid_w = 13;
    expect_error(&d, &x, &x.tq, QVA_ERR_UNSUPPORTED, "draft mixes", "draft");
    qva_tensor gq = x.tq;
    gq.device = QVA_DEVICE_CUDA;
    expect_error(&c, &x, &gq, QVA_ERR_INVALID_ARGUMENT, "CUDA device", "cuda q");
    qva_tensor sq = x.tq;
    sq.shape[3] = 32;
    expect_error(&c, &x, &sq, QVA_ERR_SHAPE, "agree", "head dims differ");
    qva_config bad = c;
    bad.method = (qva_method)99;
    expect_error(&bad, &x, &x.tq, QVA_ERR_INVALID_ARGUMENT, "unknown method", "bad method");
    qva_config v = cfg_of("vc8");
    sq = x.tq, sq.shape[2] = 100; /* V-Smooth needs self-attention */
    expect_error(&v, &x, &sq, QVA_ERR_SHAPE, "self-attention", "vc8 cross");
    x.q[5] = NAN;
    expect_error(&c, &x, &x.tq, QVA_ERR_NONFINITE, "not finite", "NaN q");
    c.check_finite = 0; /* without the scan the terms are what NaN makes them */
    CHECK(qva_error_terms_compute(&c, &x.tq, &x.tk, &x.tv, &t) == QVA_OK && !isfinite(t.full),
          "NaN without check_finite: full %g", t.full);
    free_data(&x);
}

int main(void) {
    static const char *const all_on[] = {"sage8", "sage8+qblock", "vc8", "vc8+expcast",
                                         "fp8", "fp8+expcast", "sage8+nohadamard+fp32sum",
                                         "sage4", "vc4"};
    g_x = make_data(HEADS, HEADS, NTOK, HD);
    qva_config ce = cfg_of("exact");
    g_exact = run_attention(&ce, &g_x);
    printf("1. every bit on\n");
    for (size_t i = 0; i < sizeof all_on / sizeof *all_on; ++i) test_all_on(all_on[i]);
    printf("2. single terms against references\n");
    static const char *const qk[] = {"sage8", "sage8+qblock", "vc8", "fp8",
                                     "sage8+nohadamard", "sage4"};
    for (size_t i = 0; i < sizeof qk / sizeof *qk; ++i) {
        check_term(qk[i], REF_Q);
        check_term(qk[i], REF_K);
    }
    static const char *const pv[] = {"sage8", "sage8+fp32sum", "sage8+expcast", "vc8", "fp8"};
    for (size_t i = 0; i < sizeof pv / sizeof *pv; ++i) {
        check_term(pv[i], REF_P);
        check_term(pv[i], REF_V);
    }
    check_term("vc8", REF_MU);
    test_expcast_moves_p_only();
    printf("3. random cases\n");
    data x = make_data(HEADS, HEADS, NTOK, HD); /* fresh draws */
    static const char *const sane[] = {"sage8", "vc8", "vc8+expcast", "fp8", "sage4", "vc4"};
    for (size_t i = 0; i < sizeof sane / sizeof *sane; ++i) test_terms_sane(sane[i], &x);
    free_data(&x);
    test_gqa_padded();
    test_directions(&g_x);
    test_errors();
    free(g_exact), free_data(&g_x);
    return check_summary("test_decompose");
}
