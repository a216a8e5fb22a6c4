/*
 * The DraftAttention2 router on the device (src/cuda/draft/router.cu)
 * against the CPU reference (src/draft/router.h), bit for bit: pooled
 * descriptors (Eq. 1), the draft map (Eq. 2), the quotas, the precision
 * matrix (Algorithm 1) and the per-(head, query region, phase) key lists.
 * The CPU side runs the pieces qvi_cpu_draft's route_head() runs, on the
 * same stored inputs (bf16 / f16 / f32, HND or NHD).  Inputs: the "small"
 * synthetic preset, synthetic and random 2x12x20 grids with and without
 * prefix tokens (first or last), exact ties (zero Q, frame-periodic K),
 * larger grids for the ranking, and edge quotas.  The adaptive MASS
 * budget (draft@pM[/S4/S8/S16]) the same way against qvi_draft_route_head:
 * each head's quotas (the device computes them), masses from 0.5% to
 * 100%, active floors and caps, 4/8-bit splits, ties, an all-equal map and
 * 1100 heads (the heads' list starts span tiles).  Needs a GPU; prints
 * SKIP and exits 77 (CTest: skipped) without one.
 */
#include <cuda_runtime.h>

#define TEST_RNG_SEED 0xD7AF7A5EB0C1E2D3ull
#include "check.h"
#include "cuda_test_util.h"
#include "cuda_internal.h"
#include "draft/partition.h"
#include "draft/plan.h"
#include "draft/router.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* ------------------------------------------------------------ helpers */


static unsigned f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (unsigned)u;
}





/* ------------------------------------------------------------ inputs */

enum { SRC_RANDOM = 0, SRC_SYNTH, SRC_PRESET, SRC_ZERO_Q, SRC_TIED_K };

typedef struct dcase {
    const char *name;
    int src;
    int B, H, D, T, GH, GW, P, at_end;
    qva_dtype dt;
    int nhd;
    float lambda, sm_scale;
    const char *quotas; /* S0/S4/S8/S16, or pM[/S4/S8/S16] (MASS)          */
    const char *keep;   /* MASS: "min_keep/max_keep", NULL for the defaults */
} dcase;

/* A host tensor holding the stored bytes and the same bytes on the device. */
typedef struct host_dev {
    qva_tensor t;
    void *dev;
    qvc_view view;
} host_dev;

static void free_tensor(host_dev *x) {
    free(x->t.data);
    if (x->dev) cudaFree(x->dev);
    memset(x, 0, sizeof *x);
}

/* Stores f32 values x[B][H][N][D] (logical order) in the case's dtype and
 * layout, and uploads them. */
static int store_tensor(host_dev *x, const float *src, qva_dtype dt, int nhd, int B, int H,
                        int N, int D) {
    const size_t count = (size_t)B * H * N * D, es = qva_dtype_size(dt);
    memset(x, 0, sizeof *x);
    void *buf = malloc(count * es);
    if (!buf) {
        CHECK(0, "host allocation");
        return 0;
    }
    x->t = nhd ? qva_tensor_nhd(buf, dt, QVA_DEVICE_CPU, B, H, N, D)
               : qva_tensor_hnd(buf, dt, QVA_DEVICE_CPU, B, H, N, D);
    size_t i = 0;
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int n = 0; n < N; ++n)
                for (int c = 0; c < D; ++c, ++i) {
                    const float v = src[i];
                    const int64_t o = qvi_offset(&x->t, b, h, n, c);
                    if (dt == QVA_F32) ((float *)buf)[o] = v;
                    else if (dt == QVA_BF16) ((uint16_t *)buf)[o] = bf16_bits(qva_round_bf16(v));
                    else ((uint16_t *)buf)[o] = f16_bits(qva_round_f16(v));
                }
    if (!cuda_ok(cudaMalloc(&x->dev, count * es), "cudaMalloc input") ||
        !cuda_ok(cudaMemcpy(x->dev, buf, count * es, cudaMemcpyHostToDevice), "H2D input")) {
        free(buf);
        if (x->dev) cudaFree(x->dev);
        memset(x, 0, sizeof *x);
        return 0;
    }
    x->view.data = x->dev;
    x->view.dtype = (int)dt;
    x->view.B = B, x->view.H = H, x->view.N = N, x->view.D = D;
    x->view.sb = x->t.stride[0], x->view.sh = x->t.stride[1], x->view.sn = x->t.stride[2];
    x->view.hg = 1;
    return 1;
}

/* Random values: per-channel offset and gain, a few outliers, a few signed
 * zeros (the max keeps the first of +-0) and, in f32, a few tiny values
 * that make the FP64 sums round (so their order matters). */
static void fill_random(float *x, size_t rows, int D, qva_dtype dt) {
    float off[128], gain[128];
    for (int c = 0; c < D; ++c) {
        off[c] = 0.5f * rng_normal();
        gain[c] = (float)(0.25 + 2.0 * rng_unit());
    }
    for (size_t r = 0; r < rows; ++r)
        for (int c = 0; c < D; ++c) {
            float v = off[c] + gain[c] * rng_normal();
            const double u = rng_unit();
            if (u < 0.01) v *= 8.0f;
            else if (u < 0.012) v = 0.0f;
            else if (u < 0.014) v = -0.0f;
            else if (dt == QVA_F32 && u < 0.02) v = 1e-12f * rng_normal();
            x[r * D + c] = v;
        }
}

/* Builds q and k (logical f32 [B][H][N][D]) for a case; *spec_out gets the
 * resolved shape. */
static int make_inputs(const dcase *cs, dcase *rc, float **q, float **k) {
    *rc = *cs;
    qva_synthetic_spec spec;
    memset(&spec, 0, sizeof spec);
    if (cs->src == SRC_PRESET) {
        if (qva_synthetic_preset(cs->name, &spec) != QVA_OK) {
            CHECK(0, "preset %s", cs->name);
            return 0;
        }
        rc->B = spec.B, rc->H = spec.H, rc->D = spec.D;
        rc->T = spec.grid_t, rc->GH = spec.grid_h, rc->GW = spec.grid_w;
        rc->P = spec.prefix_tokens;
    }
    const int N = rc->P + rc->T * rc->GH * rc->GW;
    const size_t count = (size_t)rc->B * rc->H * N * rc->D;
    *q = malloc(count * sizeof(float));
    *k = malloc(count * sizeof(float));
    float *v = NULL;
    if (!*q || !*k) {
        CHECK(0, "host allocation");
        return 0;
    }
    if (cs->src == SRC_PRESET || cs->src == SRC_SYNTH) {
        if (cs->src == SRC_SYNTH) {
            snprintf(spec.name, sizeof spec.name, "router");
            spec.B = rc->B, spec.H = rc->H, spec.D = rc->D;
            spec.grid_t = rc->T, spec.grid_h = rc->GH, spec.grid_w = rc->GW;
            spec.prefix_tokens = rc->P;
            spec.seed = 0xD4AF7ull + (uint64_t)rc->D * 131u + (uint64_t)rc->P;
        }
        v = malloc(count * sizeof(float));
        qva_status st = v ? qva_synthetic_generate(&spec, *q, *k, v) : QVA_ERR_OUT_OF_MEMORY;
        free(v);
        CHECK(st == QVA_OK, "synthetic generate: %s", qva_last_error());
        return st == QVA_OK;
    }
    fill_random(*q, (size_t)rc->B * rc->H * N, rc->D, rc->dt);
    fill_random(*k, (size_t)rc->B * rc->H * N, rc->D, rc->dt);
    if (cs->src == SRC_ZERO_Q) {
        memset(*q, 0, count * sizeof(float)); /* every logit 0: A constant */
    } else if (cs->src == SRC_TIED_K) {
        /* Video keys repeat frame 0 in every frame: key regions a and
         * a + t*R_f have equal descriptors, so A has exact column ties. */
        const int hw = rc->GH * rc->GW, v0 = rc->at_end ? 0 : rc->P;
        for (int bh = 0; bh < rc->B * rc->H; ++bh)
            for (int t = 1; t < rc->T; ++t)
                memcpy(*k + ((size_t)bh * N + v0 + (size_t)t * hw) * rc->D,
                       *k + ((size_t)bh * N + v0) * rc->D, (size_t)hw * rc->D * sizeof(float));
    }
    return 1;
}

/* ------------------------------------------------------------ CPU side */

/* quota: the plan's (QUOTA; zeros under MASS); hq: each head's, as
 * qvi_draft_route_head gives them; T: the pairs kept by all heads. */
typedef struct cpu_ref {
    int BH, R, D;
    float *qavg, *qmax, *kavg, *kmax, *A;
    uint8_t *prec;
    int32_t *offsets, *cols;
    int64_t *hq;
    qvi_draft_plan plan;
    int64_t quota[4], T;
} cpu_ref;

static void cpu_ref_free(cpu_ref *r) {
    free(r->qavg), free(r->qmax), free(r->kavg), free(r->kmax), free(r->A);
    free(r->prec), free(r->offsets), free(r->cols), free(r->hq);
    memset(r, 0, sizeof *r);
}

/* Key lists of a precision matrix in the CSR layout of the router. */
static void csr_from_prec(const uint8_t *prec, int BH, int R, int32_t *offsets, int32_t *cols) {
    static const int pv[3] = {4, 8, 16};
    int32_t o = 0;
    for (int bh = 0; bh < BH; ++bh)
        for (int a = 0; a < R; ++a)
            for (int p = 0; p < 3; ++p) {
                offsets[((size_t)bh * R + a) * 3 + p] = o;
                const uint8_t *row = prec + ((size_t)bh * R + a) * R;
                for (int b = 0; b < R; ++b)
                    if (row[b] == pv[p]) cols[o++] = b;
            }
    offsets[(size_t)BH * R * 3] = o;
}

/* route_head() of src/cpu/draft.c for every head of the stored tensors. */
static int cpu_route(const qva_tensor *q, const qva_tensor *k, const qvi_draft_layout *lay,
                     const qva_config *cfg, cpu_ref *r) {
    const int B = (int)q->shape[0], H = (int)q->shape[1], D = (int)q->shape[3];
    const int64_t n = q->shape[2], R = lay->regions, M = R * R;
    memset(r, 0, sizeof *r);
    r->BH = B * H, r->R = (int)R, r->D = D;
    const size_t bh = (size_t)r->BH, rd = (size_t)R * D;
    r->qavg = malloc(bh * rd * 4), r->qmax = malloc(bh * rd * 4);
    r->kavg = malloc(bh * rd * 4), r->kmax = malloc(bh * rd * 4);
    r->A = malloc(bh * (size_t)M * 4);
    r->prec = malloc(bh * (size_t)M);
    r->offsets = malloc((bh * (size_t)R * 3 + 1) * 4);
    r->cols = malloc(bh * (size_t)M * 4 + 4);
    r->hq = malloc(bh * 4 * sizeof(int64_t));
    float *head = malloc((size_t)n * D * 4), *packed = malloc((size_t)lay->n_pack * D * 4);
    int ok = r->qavg && r->qmax && r->kavg && r->kmax && r->A && r->prec && r->offsets &&
             r->cols && r->hq && head && packed;
    CHECK(ok, "host allocation");
    if (ok) ok = qvi_draft_plan_make(cfg, q, &r->plan) == QVA_OK && r->plan.regions == R;
    memcpy(r->quota, r->plan.quota, sizeof r->quota);
    const size_t off = (size_t)lay->prefix_pad * D;
    for (int b = 0; ok && b < B; ++b)
        for (int h = 0; ok && h < H; ++h) {
            const size_t i = (size_t)b * H + h;
            qvi_load_head(q, b, h, head);
            qvi_draft_pack(lay, head, D, packed);
            qvi_draft_pool(packed + off, lay->count, R, lay->c, D, r->qavg + i * rd,
                           r->qmax + i * rd);
            qvi_load_head(k, b, h, head);
            qvi_draft_pack(lay, head, D, packed);
            qvi_draft_pool(packed + off, lay->count, R, lay->c, D, r->kavg + i * rd,
                           r->kmax + i * rd);
            ok = qvi_draft_map(r->qavg + i * rd, r->qmax + i * rd, r->kavg + i * rd,
                               r->kmax + i * rd, R, D, qvi_sm_scale(cfg, D), cfg->draft.lambda,
                               r->A + i * M) == QVA_OK &&
                 qvi_draft_route_head(r->A + i * M, R, &cfg->draft, &r->plan, r->hq + i * 4,
                                      r->prec + i * M) == QVA_OK;
        }
    CHECK(ok, "CPU route: %s", qva_last_error());
    if (ok) csr_from_prec(r->prec, r->BH, (int)R, r->offsets, r->cols);
    if (ok) r->T = r->offsets[(size_t)r->BH * R * 3];
    free(head), free(packed);
    return ok;
}

/* ------------------------------------------------------------ comparison */

/* Counts bit mismatches of [BH][rows][cols] f32 arrays; prints the first. */
static long cmp_f32(const char *tag, const char *what, const float *gpu, const float *cpu,
                    int BH, int rows, int cols) {
    long bad = 0;
    for (int bh = 0; bh < BH; ++bh)
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < cols; ++j) {
                const size_t o = ((size_t)bh * rows + i) * cols + j;
                if (same_bits(gpu[o], cpu[o])) continue;
                if (bad < 5)
                    fprintf(stderr, "  [%s] %s bh %d [%d][%d]: gpu %.9g (0x%08x) cpu %.9g (0x%08x)\n",
                            tag, what, bh, i, j, (double)gpu[o], f32_bits(gpu[o]),
                            (double)cpu[o], f32_bits(cpu[o]));
                ++bad;
            }
    return bad;
}

static long cmp_u8(const char *tag, const char *what, const uint8_t *gpu, const uint8_t *cpu,
                   int BH, int R) {
    long bad = 0;
    for (int bh = 0; bh < BH; ++bh)
        for (int i = 0; i < R * R; ++i) {
            const size_t o = (size_t)bh * R * R + i;
            if (gpu[o] == cpu[o]) continue;
            if (bad < 5)
                fprintf(stderr, "  [%s] %s bh %d pair (%d,%d): gpu %d cpu %d\n", tag, what, bh,
                        i / R, i % R, gpu[o], cpu[o]);
            ++bad;
        }
    return bad;
}

static long cmp_i32(const char *tag, const char *what, const int32_t *gpu, const int32_t *cpu,
                    size_t n) {
    long bad = 0;
    for (size_t i = 0; i < n; ++i) {
        if (gpu[i] == cpu[i]) continue;
        if (bad < 5)
            fprintf(stderr, "  [%s] %s [%zu]: gpu %d cpu %d\n", tag, what, i, gpu[i], cpu[i]);
        ++bad;
    }
    return bad;
}

/* ------------------------------------------------------------ one case */

/* qvc_draft_pool16 of x into host out[0, rd) (avg) and out[rd, 2 rd) (max). */
/* The rows of K's pooled descriptors [BH*R][D] back in channel order
 * (qvc_dr_kslot is its own inverse). */
static void unslot_k(float *x, size_t rows, int D) {
    float row[128];
    for (size_t r = 0; r < rows; ++r) {
        float *p = x + r * (size_t)D;
        for (int c = 0; c < D; ++c) row[c] = p[qvc_dr_kslot(c, D)];
        memcpy(p, row, (size_t)D * sizeof(float));
    }
}

/* qvc_draft_pool16 of x into out (avg, then max), K's (kslots) back in
 * channel order. */
static int pool16_of(const qvc_view *x, const qvc_draft_layout *dl, int BH, int R, int D,
                     int kslots, float *out, size_t rd, cudaStream_t st) {
    float *dev = NULL;
    int ok = cuda_ok(cudaMalloc((void **)&dev, 2 * rd * 4), "cudaMalloc pool16");
    if (ok) {
        const qva_status s = qvc_draft_pool16(x, dl, BH, dev, dev + rd, kslots, st);
        CHECK(s == QVA_OK, "qvc_draft_pool16: %s", qva_last_error());
        ok = s == QVA_OK && cuda_ok(cudaStreamSynchronize(st), "pool16 sync") &&
             cuda_ok(cudaMemcpy(out, dev, 2 * rd * 4, cudaMemcpyDeviceToHost), "D2H pool16");
    }
    cudaFree(dev);
    if (ok && kslots) unslot_k(out, 2 * (size_t)BH * R, D);
    return ok;
}

/* The draft prep pools beside its pack, whose threads hold a region's rows
 * spread over them; the sums must still run in path order.  Region 0,
 * channel 5 holds 2^60, 1, -2^60 in slots 0, 1 and 16: in path order
 * 2^60 + 1 rounds to 2^60 and the sum is 0, while slots 0 and 16 belong to
 * one thread and slot 1 to another, so a sum over the threads' partials
 * gives 1.  Channel 6 holds negative values, -0 in slot 3 and +0 in slot 7:
 * the max is the first zero, -0. */
static void test_pool_order(cudaStream_t st) {
    const int T = 1, GH = 12, GW = 20, D = 128, N = T * GH * GW;
    qvi_partition part;
    qvi_draft_layout lay;
    qvc_draft_layout dl;
    memset(&part, 0, sizeof part), memset(&lay, 0, sizeof lay), memset(&dl, 0, sizeof dl);
    host_dev q;
    memset(&q, 0, sizeof q);
    float *x = malloc((size_t)N * D * 4), *packed = NULL, *got = NULL, *avg = NULL, *mx = NULL;
    if (!x || qvi_partition_build(GH, GW, QVI_BLOCK, &part) != QVA_OK ||
        qvi_draft_layout_build(&part, T, 0, 0, &lay) != QVA_OK ||
        qvc_draft_layout_upload(&part, T, 0, 0, &dl) != QVA_OK) {
        CHECK(0, "pool order: set-up: %s", qva_last_error());
        goto done;
    }
    fill_random(x, (size_t)N, D, QVA_BF16);
    const int32_t *slot = lay.pack_to_orig + lay.prefix_pad; /* region 0 */
    for (int i = 0; i < lay.count[0]; ++i) x[(size_t)slot[i] * D + 5] = 0.0f;
    x[(size_t)slot[0] * D + 5] = 0x1p60f;
    x[(size_t)slot[1] * D + 5] = 1.0f;
    x[(size_t)slot[16] * D + 5] = -0x1p60f;
    for (int i = 0; i < lay.count[0]; ++i) x[(size_t)slot[i] * D + 6] = -1.0f - (float)(i % 5);
    x[(size_t)slot[3] * D + 6] = -0.0f;
    x[(size_t)slot[7] * D + 6] = 0.0f;
    const int R = (int)lay.regions;
    const size_t rd = (size_t)R * D;
    packed = malloc((size_t)lay.n_pack * D * 4), got = malloc(2 * rd * 4);
    avg = malloc(rd * 4), mx = malloc(rd * 4);
    if (!packed || !got || !avg || !mx || !store_tensor(&q, x, QVA_BF16, 0, 1, 1, N, D)) {
        CHECK(0, "pool order: allocation");
        goto done;
    }
    qvi_load_head(&q.t, 0, 0, x);
    qvi_draft_pack(&lay, x, D, packed);
    qvi_draft_pool(packed + (size_t)lay.prefix_pad * D, lay.count, R, lay.c, D, avg, mx);
    CHECK(avg[5] == 0.0f && mx[6] == 0.0f && signbit(mx[6]),
          "pool order: the crafted channels (path-order avg %g, max %g)", (double)avg[5],
          (double)mx[6]);
    if (pool16_of(&q.view, &dl, 1, R, D, 0, got, rd, st)) {
        const long b1 = cmp_f32("pool order", "avg", got, avg, 1, R, D);
        const long b2 = cmp_f32("pool order", "max", got + rd, mx, 1, R, D);
        CHECK(b1 == 0 && b2 == 0, "pool order: avg %ld, max %ld differ from the CPU's", b1, b2);
    }
done:
    free(x), free(packed), free(got), free(avg), free(mx);
    free_tensor(&q);
    qvc_draft_layout_free(&dl);
    qvi_draft_layout_free(&lay);
    qvi_partition_free(&part);
}

static void run_case(const dcase *cs, cudaStream_t st) {
    dcase c;
    float *qf = NULL, *kf = NULL;
    host_dev q, k;
    memset(&q, 0, sizeof q);
    memset(&k, 0, sizeof k);
    qvi_partition part;
    memset(&part, 0, sizeof part);
    qvi_draft_layout lay;
    memset(&lay, 0, sizeof lay);
    qvc_draft_layout dl;
    memset(&dl, 0, sizeof dl);
    qvc_draft_route_buf buf;
    memset(&buf, 0, sizeof buf);
    cpu_ref ref;
    memset(&ref, 0, sizeof ref);
    float *g_f = NULL, *gA = NULL;
    uint8_t *gprec = NULL, *prec_of_gA = NULL;
    int32_t *goff = NULL, *gcols = NULL;
    int64_t *ghq = NULL, *hq_of_gA = NULL;

    if (!make_inputs(cs, &c, &qf, &kf)) goto done;
    const int N = c.P + c.T * c.GH * c.GW, BH = c.B * c.H, D = c.D;
    char tag[160];
    snprintf(tag, sizeof tag, "%s %dx%dx%d P=%d%s BH=%d D=%d %s %s draft@%s%s%s l=%g", cs->name,
             c.T, c.GH, c.GW, c.P, c.at_end ? "(end)" : "", BH, D, dtype_name(c.dt),
             c.nhd ? "NHD" : "HND", c.quotas, c.keep ? " keep " : "", c.keep ? c.keep : "",
             (double)c.lambda);
    if (!store_tensor(&q, qf, c.dt, c.nhd, c.B, c.H, N, D) ||
        !store_tensor(&k, kf, c.dt, c.nhd, c.B, c.H, N, D))
        goto done;

    qva_config cfg;
    qva_config_default(&cfg);
    char method[64];
    snprintf(method, sizeof method, "draft@%s", c.quotas);
    CHECK(qva_config_set_method(&cfg, method) == QVA_OK, "[%s] method: %s", tag, qva_last_error());
    cfg.draft.lambda = c.lambda;
    cfg.sm_scale = c.sm_scale;
    if (c.keep)
        CHECK(sscanf(c.keep, "%f/%f", &cfg.draft.min_keep, &cfg.draft.max_keep) == 2,
              "[%s] keep '%s'", tag, c.keep);
    const int mass = cfg.draft.budget == QVA_DRAFT_BUDGET_MASS;
    cfg.draft.grid_t = c.T, cfg.draft.grid_h = c.GH, cfg.draft.grid_w = c.GW;
    cfg.draft.prefix_tokens = c.P, cfg.draft.prefix_at_end = c.at_end;

    if (qvi_partition_build(c.GH, c.GW, QVI_BLOCK, &part) != QVA_OK ||
        qvi_draft_layout_build(&part, c.T, c.P, c.at_end, &lay) != QVA_OK) {
        CHECK(0, "[%s] partition/layout: %s", tag, qva_last_error());
        goto done;
    }
    const int R = (int)lay.regions;
    const size_t M = (size_t)R * R;
    if (!cpu_route(&q.t, &k.t, &lay, &cfg, &ref)) goto done;

    qva_status s = qvc_draft_layout_upload(&part, c.T, c.P, c.at_end, &dl);
    CHECK(s == QVA_OK, "[%s] layout upload: %s", tag, qva_last_error());
    if (s != QVA_OK) goto done;
    CHECK(dl.regions == R && dl.n == N && dl.prefix_pad == lay.prefix_pad &&
              dl.n_pack == lay.n_pack,
          "[%s] device layout fields", tag);
    s = qvc_draft_route_alloc(&buf, BH, R, D);
    CHECK(s == QVA_OK, "[%s] alloc: %s", tag, qva_last_error());
    if (s != QVA_OK) goto done;
    s = qvc_draft_route(&q.view, &k.view, &cfg, &dl, &buf, st);
    CHECK(s == QVA_OK, "[%s] route: %s", tag, qva_last_error());
    if (s != QVA_OK) goto done;
    if (!cuda_ok(cudaStreamSynchronize(st), "route sync")) goto done;

    /* The packing the device read from. */
    {
        int32_t *p2o = malloc((size_t)lay.n_pack * 4), *cnt = malloc((size_t)R * 4);
        if (p2o && cnt &&
            cuda_ok(cudaMemcpy(p2o, dl.pack_to_orig, (size_t)lay.n_pack * 4, cudaMemcpyDeviceToHost), "D2H") &&
            cuda_ok(cudaMemcpy(cnt, dl.count, (size_t)R * 4, cudaMemcpyDeviceToHost), "D2H")) {
            CHECK(cmp_i32(tag, "pack_to_orig", p2o, lay.pack_to_orig, (size_t)lay.n_pack) == 0,
                  "[%s] pack map differs", tag);
            CHECK(cmp_i32(tag, "count", cnt, lay.count, (size_t)R) == 0, "[%s] counts differ", tag);
        }
        free(p2o), free(cnt);
    }

    const int64_t T1 = mass ? -1 : ref.quota[1] + ref.quota[2] + ref.quota[3];
    CHECK(buf.mass == mass && memcmp(buf.quota, ref.quota, sizeof ref.quota) == 0 &&
              buf.retained == T1,
          "[%s] quotas gpu %lld/%lld/%lld/%lld (T %lld) cpu %lld/%lld/%lld/%lld (T %lld)", tag,
          (long long)buf.quota[0], (long long)buf.quota[1], (long long)buf.quota[2],
          (long long)buf.quota[3], (long long)buf.retained, (long long)ref.quota[0],
          (long long)ref.quota[1], (long long)ref.quota[2], (long long)ref.quota[3],
          (long long)T1);

    const size_t rd = (size_t)BH * R * D;
    g_f = malloc(2 * rd * 4);
    gA = malloc((size_t)BH * M * 4);
    gprec = malloc((size_t)BH * M);
    prec_of_gA = malloc((size_t)BH * M);
    goff = malloc(((size_t)BH * R * 3 + 1) * 4);
    gcols = malloc((size_t)BH * M * 4 + 4);
    ghq = malloc((size_t)BH * 4 * sizeof(int64_t));
    hq_of_gA = malloc((size_t)BH * 4 * sizeof(int64_t));
    if (!g_f || !gA || !gprec || !prec_of_gA || !goff || !gcols || !ghq || !hq_of_gA) {
        CHECK(0, "host allocation");
        goto done;
    }
    const struct { const char *name; const float *dev, *cpu; } pooled[4] = {
        {"avg(Q)", buf.qavg, ref.qavg}, {"max(Q)", buf.qmax, ref.qmax},
        {"avg(K)", buf.kavg, ref.kavg}, {"max(K)", buf.kmax, ref.kmax}};
    for (int i = 0; i < 4; ++i) {
        if (!cuda_ok(cudaMemcpy(g_f, pooled[i].dev, rd * 4, cudaMemcpyDeviceToHost), "D2H pooled"))
            goto done;
        if (i >= 2) unslot_k(g_f, (size_t)BH * R, D); /* K's slot order */
        long bad = cmp_f32(tag, pooled[i].name, g_f, pooled[i].cpu, BH, R, D);
        CHECK(bad == 0, "[%s] %s: %ld of %zu differ", tag, pooled[i].name, bad, rd);
    }
    if (D == 64 || D == 128) { /* the draft call's pooling, beside its 16-bit pack */
        const host_dev *x[2] = {&q, &k};
        const float *want[2][2] = {{ref.qavg, ref.qmax}, {ref.kavg, ref.kmax}};
        for (int w = 0; w < 2; ++w) {
            long b1 = -1, b2 = -1;
            if (pool16_of(&x[w]->view, &dl, BH, R, D, w, g_f, rd, st)) {
                b1 = cmp_f32(tag, w ? "pool16 avg(K)" : "pool16 avg(Q)", g_f, want[w][0], BH, R, D);
                b2 = cmp_f32(tag, w ? "pool16 max(K)" : "pool16 max(Q)", g_f + rd, want[w][1], BH,
                             R, D);
            }
            CHECK(b1 == 0 && b2 == 0, "[%s] qvc_draft_pool16 %s: avg %ld, max %ld differ", tag,
                  w ? "K" : "Q", b1, b2);
        }
    }
    if (!cuda_ok(cudaMemcpy(gA, buf.A, (size_t)BH * M * 4, cudaMemcpyDeviceToHost), "D2H A") ||
        !cuda_ok(cudaMemcpy(gprec, buf.prec, (size_t)BH * M, cudaMemcpyDeviceToHost), "D2H prec") ||
        !cuda_ok(cudaMemcpy(goff, buf.offsets, ((size_t)BH * R * 3 + 1) * 4, cudaMemcpyDeviceToHost),
                 "D2H offsets"))
        goto done;
    if (ref.T > 0 &&
        !cuda_ok(cudaMemcpy(gcols, buf.cols, (size_t)ref.T * 4, cudaMemcpyDeviceToHost),
                 "D2H cols"))
        goto done;

    long bad = cmp_f32(tag, "A", gA, ref.A, BH, R, R);
    CHECK(bad == 0,
          "[%s] draft map: %ld of %zu differ (a 1-ulp difference can only come from "
          "libm vs CUDA exp at an f32 rounding boundary, docs/DRAFT.md §3)",
          tag, bad, (size_t)BH * M);
    /* The ranking alone (and under MASS each head's count): the CPU's
     * route of a head on the device's own A. */
    for (int bh = 0; bh < BH; ++bh)
        qvi_draft_route_head(gA + (size_t)bh * M, R, &cfg.draft, &ref.plan, hq_of_gA + bh * 4,
                             prec_of_gA + (size_t)bh * M);
    bad = cmp_u8(tag, "prec vs route(gpu A)", gprec, prec_of_gA, BH, R);
    CHECK(bad == 0, "[%s] ranking of the device map: %ld pairs differ", tag, bad);
    if (mass) { /* the heads' quotas, found on the device */
        if (!cuda_ok(cudaMemcpy(ghq, buf.head_quota, (size_t)BH * 4 * sizeof(int64_t),
                                cudaMemcpyDeviceToHost),
                     "D2H head quotas"))
            goto done;
        long badq = 0;
        for (int bh = 0; bh < BH; ++bh) {
            const int64_t *g = ghq + bh * 4, *w = hq_of_gA + bh * 4;
            if (!memcmp(g, w, 4 * sizeof(int64_t))) continue;
            if (badq++ < 5)
                fprintf(stderr, "  [%s] head %d quotas gpu %lld/%lld/%lld/%lld, route(gpu A) "
                                "%lld/%lld/%lld/%lld\n", tag, bh, (long long)g[0], (long long)g[1],
                        (long long)g[2], (long long)g[3], (long long)w[0], (long long)w[1],
                        (long long)w[2], (long long)w[3]);
        }
        CHECK(badq == 0, "[%s] per-head quotas: %ld heads differ", tag, badq);
        badq = memcmp(hq_of_gA, ref.hq, (size_t)BH * 4 * sizeof(int64_t)) != 0;
        CHECK(badq == 0, "[%s] per-head quotas of the CPU route differ", tag);
    }
    bad = cmp_u8(tag, "prec", gprec, ref.prec, BH, R);
    CHECK(bad == 0, "[%s] precision matrix: %ld of %zu differ", tag, bad, (size_t)BH * M);
    bad = cmp_i32(tag, "offsets", goff, ref.offsets, (size_t)BH * R * 3 + 1);
    CHECK(bad == 0, "[%s] CSR offsets: %ld differ", tag, bad);
    bad = cmp_i32(tag, "cols", gcols, ref.cols, (size_t)ref.T);
    CHECK(bad == 0, "[%s] CSR key regions: %ld differ", tag, bad);
    /* Every head keeps exactly its quotas. */
    int64_t kmin = INT64_MAX, kmax = 0;
    for (int bh = 0; bh < BH; ++bh) {
        int64_t n[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < M; ++i) {
            const uint8_t p = gprec[(size_t)bh * M + i];
            n[p == 4 ? QVI_Q_4 : p == 8 ? QVI_Q_8 : p == 16 ? QVI_Q_16 : QVI_Q_SKIP] += 1;
        }
        const int64_t *w = ref.hq + bh * 4;
        CHECK(!memcmp(n, w, sizeof n), "[%s] head %d keeps %lld/%lld/%lld/%lld, quota "
              "%lld/%lld/%lld/%lld", tag, bh, (long long)n[0], (long long)n[1], (long long)n[2],
              (long long)n[3], (long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3]);
        const int64_t kept = (int64_t)M - w[0];
        kmin = kept < kmin ? kept : kmin;
        kmax = kept > kmax ? kept : kmax;
    }
    printf("  %-96s R=%-4d kept %lld..%lld ok\n", tag, R, (long long)kmin, (long long)kmax);

done:
    free(g_f), free(gA), free(gprec), free(prec_of_gA), free(goff), free(gcols);
    free(ghq), free(hq_of_gA);
    cpu_ref_free(&ref);
    qvc_draft_route_free(&buf);
    qvc_draft_layout_free(&dl);
    qvi_draft_layout_free(&lay);
    qvi_partition_free(&part);
    free_tensor(&q), free_tensor(&k);
    free(qf), free(kf);
}

/* ------------------------------------------------------------ errors */

static void test_errors(cudaStream_t st) {
    qvi_partition part;
    qvc_draft_layout dl;
    qvc_draft_route_buf buf;
    memset(&dl, 0, sizeof dl);
    memset(&buf, 0, sizeof buf);
    if (qvi_partition_build(12, 20, QVI_BLOCK, &part) != QVA_OK) {
        CHECK(0, "partition");
        return;
    }
    const int T = 2, N = T * 240, D = 64;
    float *x = calloc((size_t)N * D, sizeof(float));
    host_dev q;
    memset(&q, 0, sizeof q);
    if (x && store_tensor(&q, x, QVA_F32, 0, 1, 1, N, D) &&
        qvc_draft_layout_upload(&part, T, 0, 0, &dl) == QVA_OK) {
        qva_config cfg;
        qva_config_default(&cfg);
        qva_config_set_method(&cfg, "draft@85/0/7.5/7.5");
        CHECK(qvc_draft_route_alloc(&buf, 1, dl.regions + 1, D) == QVA_OK, "alloc");
        CHECK(qvc_draft_route(&q.view, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_SHAPE,
              "buffers for another R");
        qvc_draft_route_free(&buf);
        CHECK(qvc_draft_route_alloc(&buf, 1, dl.regions, D) == QVA_OK, "alloc");
        cfg.draft.lambda = 1.5f;
        CHECK(qvc_draft_route(&q.view, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_INVALID_ARGUMENT,
              "lambda 1.5");
        cfg.draft.lambda = 0.2f;
        cfg.draft.frac_skip = 0.5f; /* fractions sum to 0.65 */
        CHECK(qvc_draft_route(&q.view, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_INVALID_ARGUMENT,
              "bad fractions");
        CHECK(qvc_draft_route(NULL, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_INVALID_ARGUMENT,
              "NULL q");
        qva_config_set_method(&cfg, "draft@p95");
        cfg.draft.mass = 0.0f;
        CHECK(qvc_draft_route(&q.view, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_INVALID_ARGUMENT,
              "MASS: mass 0");
        cfg.draft.mass = 0.95f, cfg.draft.frac_skip = 0.5f, cfg.draft.frac16 = 0.5f;
        CHECK(qvc_draft_route(&q.view, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_INVALID_ARGUMENT,
              "MASS: frac_skip 0.5");
        cfg.draft.frac_skip = 0.0f, cfg.draft.frac16 = 1.0f, cfg.draft.min_keep = 0.7f,
        cfg.draft.max_keep = 0.6f;
        CHECK(qvc_draft_route(&q.view, &q.view, &cfg, &dl, &buf, st) == QVA_ERR_INVALID_ARGUMENT,
              "MASS: min_keep above max_keep");
        qva_config_set_method(&cfg, "draft@85/0/7.5/7.5");
        cfg.draft.min_keep = 0.05f, cfg.draft.max_keep = 1.0f;
        qvc_view bad = q.view;
        bad.N = N + 1;
        CHECK(qvc_draft_route(&bad, &bad, &cfg, &dl, &buf, st) == QVA_ERR_SHAPE, "N mismatch");
        CHECK(qvc_draft_pool16(&bad, &dl, 1, buf.qavg, buf.qmax, 0, st) == QVA_ERR_SHAPE,
              "pool16: N mismatch");
        CHECK(qvc_draft_pool16(&q.view, &dl, 2, buf.qavg, buf.qmax, 0, st) == QVA_ERR_SHAPE,
              "pool16: B*H mismatch");
        CHECK(qvc_draft_pool16(&q.view, &dl, 1, NULL, buf.qmax, 0, st) == QVA_ERR_INVALID_ARGUMENT,
              "pool16: NULL avg");
        qvc_view d96 = q.view;
        d96.D = 96;
        CHECK(qvc_draft_pool16(&d96, &dl, 1, buf.qavg, buf.qmax, 0, st) == QVA_ERR_SHAPE,
              "pool16: D 96");
        qvc_draft_route_free(&buf);
        CHECK(qvc_draft_route_alloc(&buf, 1, 1, 129) == QVA_ERR_SHAPE, "D 129");
    }
    qvc_draft_route_free(&buf);
    qvc_draft_layout_free(&dl);
    free_tensor(&q);
    free(x);
    qvi_partition_free(&part);
    CHECK(cudaGetLastError() == cudaSuccess, "no sticky CUDA error after the error paths");
}

/* ------------------------------------------------------------ main */

static const dcase CASES[] = {
    /* name       src         B  H  D    T  GH  GW   P end dtype     nhd  lambda sm    quotas  keep */
    {"small", SRC_PRESET, 0, 0, 0, 0, 0, 0, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    {"small", SRC_PRESET, 0, 0, 0, 0, 0, 0, 0, 0, QVA_BF16, 1, 0.2f, 0.0f, "0/40/30/30", NULL},
    {"small", SRC_PRESET, 0, 0, 0, 0, 0, 0, 0, 0, QVA_F16, 0, 0.5f, 0.0f, "50/10/20/20", NULL},
    {"synth", SRC_SYNTH, 1, 2, 64, 2, 12, 20, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "50/10/20/20", NULL},
    {"synth", SRC_SYNTH, 1, 2, 128, 2, 12, 20, 0, 0, QVA_F32, 1, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    {"synth", SRC_SYNTH, 1, 2, 128, 2, 12, 20, 77, 0, QVA_BF16, 1, 0.2f, 0.0f, "70/10/10/10", NULL},
    {"synth", SRC_SYNTH, 1, 2, 64, 2, 12, 20, 77, 1, QVA_F32, 0, 0.2f, 0.0f, "40/20/20/20", NULL},
    {"synth", SRC_SYNTH, 2, 3, 64, 2, 12, 20, 128, 0, QVA_F32, 1, 0.0f, 0.0f, "60/0/0/40", NULL},
    {"random", SRC_RANDOM, 2, 3, 128, 2, 12, 20, 0, 0, QVA_BF16, 1, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 2, 12, 20, 130, 0, QVA_F32, 0, 0.0f, 0.3f, "40/20/20/20", NULL},
    {"random", SRC_RANDOM, 1, 2, 128, 2, 12, 20, 5, 1, QVA_F16, 1, 1.0f, 0.0f, "25/25/25/25", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 2, 12, 20, 33, 1, QVA_F32, 1, 0.2f, 0.0f, "0/0/0/100", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 2, 12, 20, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "100/0/0/0", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "0/100/0/0", NULL},
    {"zero-Q ties", SRC_ZERO_Q, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "60/10/15/15", NULL},
    {"zero-Q ties", SRC_ZERO_Q, 1, 2, 128, 5, 30, 40, 17, 0, QVA_BF16, 1, 0.2f, 0.0f, "85/5/5/5", NULL},
    {"tied-K", SRC_TIED_K, 1, 2, 128, 3, 12, 20, 20, 0, QVA_BF16, 0, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    {"tied-K", SRC_TIED_K, 1, 3, 64, 6, 16, 24, 0, 0, QVA_F32, 1, 0.3f, 0.0f, "50/10/20/20", NULL},
    {"random", SRC_RANDOM, 2, 2, 64, 4, 30, 40, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "85/5/5/5", NULL},
    {"synth", SRC_SYNTH, 1, 2, 128, 6, 45, 80, 0, 0, QVA_BF16, 1, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 1, 8, 8, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "0/0/0/100", NULL}, /* R=1 */
    {"random", SRC_RANDOM, 1, 2, 64, 1, 8, 8, 3, 0, QVA_F32, 0, 0.2f, 0.0f, "50/0/0/50", NULL},
    /* the map's channel pad (D not a multiple of the mma's k16) */
    {"random", SRC_RANDOM, 1, 2, 72, 3, 12, 20, 9, 0, QVA_F32, 0, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    {"random", SRC_RANDOM, 1, 1, 40, 2, 12, 20, 0, 1, QVA_BF16, 0, 0.2f, 0.0f, "50/0/20/30", NULL},
    /* 870 regions: 8 query regions per map CTA (one n8 tile), as HunyuanVideo-720p */
    {"random", SRC_RANDOM, 1, 1, 64, 30, 45, 80, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "85/0/0/15", NULL},
    /* from 1,674 regions (D 128) or 1,738 (D 64) on, two map CTAs of 8
     * query regions no longer fit an SM: 4 a CTA, whose mixture deals each
     * row of a half in 4 pieces (dr_launch_map, dr_map_kernel) */
    {"random", SRC_RANDOM, 1, 1, 128, 58, 45, 80, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "85/0/0/15", NULL},
    {"random", SRC_RANDOM, 1, 1, 64, 60, 45, 80, 3, 0, QVA_F32, 0, 0.2f, 0.0f, "85/0/7.5/7.5", NULL},
    /* from 3,350 regions (D 128) on, 4 no longer fit: 2 a CTA, each half
     * one row in 8 pieces (a 1080p grid, 68 x 120, reaches it at 53 frames) */
    {"random", SRC_RANDOM, 1, 1, 128, 116, 45, 80, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "85/0/0/15", NULL},
    /* the adaptive MASS budget: each head's K on the device */
    {"small", SRC_PRESET, 0, 0, 0, 0, 0, 0, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p95", NULL},
    {"small", SRC_PRESET, 0, 0, 0, 0, 0, 0, 0, 0, QVA_BF16, 1, 0.2f, 0.0f, "p90/0/50/50", NULL},
    {"synth", SRC_SYNTH, 1, 2, 64, 2, 12, 20, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "p50", NULL},
    {"synth", SRC_SYNTH, 1, 2, 128, 2, 12, 20, 77, 0, QVA_F32, 1, 0.2f, 0.0f, "p90/20/30/50", NULL},
    {"synth", SRC_SYNTH, 2, 3, 64, 2, 12, 20, 128, 1, QVA_F16, 0, 0.0f, 0.0f, "p100", NULL},
    {"random", SRC_RANDOM, 2, 3, 128, 2, 12, 20, 0, 0, QVA_BF16, 1, 0.2f, 0.0f, "p95/0/50/50", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 2, 12, 20, 33, 1, QVA_F32, 0, 1.0f, 0.3f, "p0.5", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p99.9/30/30/40", NULL},
    /* floors and caps that bind; a cap of none and a floor of all */
    {"random", SRC_RANDOM, 1, 3, 64, 2, 12, 20, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "p50", "0.6/1"},
    {"random", SRC_RANDOM, 1, 3, 64, 2, 12, 20, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "p99/0/50/50", "0/0.2"},
    {"synth", SRC_SYNTH, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p90/20/30/50", "0.3/0.45"},
    {"synth", SRC_SYNTH, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p95", "0/0"},
    {"synth", SRC_SYNTH, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p50/0/50/50", "1/1"},
    /* ties and a degenerate map: zero Q makes every entry equal */
    {"zero-Q ties", SRC_ZERO_Q, 1, 2, 64, 2, 12, 20, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p90", NULL},
    {"zero-Q ties", SRC_ZERO_Q, 1, 2, 128, 5, 30, 40, 17, 0, QVA_BF16, 1, 0.2f, 0.0f, "p50/20/30/50", NULL},
    {"tied-K", SRC_TIED_K, 1, 2, 128, 3, 12, 20, 20, 0, QVA_BF16, 0, 0.2f, 0.0f, "p95/0/50/50", NULL},
    {"tied-K", SRC_TIED_K, 1, 3, 64, 6, 16, 24, 0, 0, QVA_F32, 1, 0.3f, 0.0f, "p90", NULL},
    /* larger grids (several histogram CTAs per head), R = 1, many heads */
    {"random", SRC_RANDOM, 2, 2, 64, 4, 30, 40, 0, 0, QVA_BF16, 0, 0.2f, 0.0f, "p95/10/20/70", NULL},
    {"synth", SRC_SYNTH, 1, 2, 128, 6, 45, 80, 0, 0, QVA_BF16, 1, 0.2f, 0.0f, "p95", NULL},
    {"random", SRC_RANDOM, 1, 2, 64, 1, 8, 8, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p50", NULL},
    {"random", SRC_RANDOM, 11, 100, 64, 2, 8, 8, 0, 0, QVA_F32, 0, 0.2f, 0.0f, "p90/0/50/50", NULL},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

int main(void) {
    if (!qva_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return 77; /* CTest's SKIP_RETURN_CODE: reported as skipped */
    }
    cudaStream_t st;
    if (!cuda_ok(cudaStreamCreate(&st), "cudaStreamCreate")) return check_summary("cuda_test_draft");
    for (int i = 0; i < NCASES; ++i) run_case(&CASES[i], st);
    test_pool_order(st);
    test_errors(st);
    cudaStreamDestroy(st);
    return check_summary("cuda_test_draft");
}
