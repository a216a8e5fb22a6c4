/*
 * The input q, k, v of a command: a synthetic preset, random data of a
 * given shape or a file, plus its video layout and the views evaluated.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "cli.h"

void workload_free(workload *w) {
    qio_qkv_free(&w->x);
    free(w->q16);
    free(w->k16);
    free(w->v16);
    w->q16 = w->k16 = w->v16 = NULL;
}

static int alloc_qkv(qio_qkv *x, int64_t B, int64_t H, int64_t N, int64_t D) {
    size_t n = (size_t)(B * H * N * D);
    x->B = B;
    x->H = H;
    x->Nq = x->N = N;
    x->D = D;
    x->q = malloc(n * sizeof(float));
    x->k = malloc(n * sizeof(float));
    x->v = malloc(n * sizeof(float));
    if (x->q && x->k && x->v) return RC_OK;
    qio_qkv_free(x);
    return runtime_error("out of memory for q, k, v (%zu floats each)", n);
}

/* --seed: digits (decimal, or hex after 0x), the whole string, < 2^64. */
static int parse_seed(const opts *o, uint64_t *seed) {
    char *end;
    if (!o->seed) return RC_OK;
    int hex = o->seed[0] == '0' && (o->seed[1] == 'x' || o->seed[1] == 'X');
    const char *digits = o->seed + (hex ? 2 : 0);
    if (!(hex ? isxdigit((unsigned char)*digits) : isdigit((unsigned char)*digits)))
        return usage_error("--seed expects a non-negative integer, got '%s'", o->seed);
    errno = 0;
    unsigned long long s = strtoull(digits, &end, hex ? 16 : 10);
    if (*end)
        return usage_error("--seed expects a non-negative integer, got '%s'", o->seed);
    if (errno == ERANGE)
        return usage_error("--seed %s is out of range (at most 2^64-1 = %llu)",
                           o->seed, (unsigned long long)UINT64_MAX);
    *seed = (uint64_t)s;
    return RC_OK;
}

static int load_synthetic(const opts *o, const char *name, workload *w) {
    qva_synthetic_spec spec;
    qva_status st = qva_synthetic_preset(name, &spec);
    if (st != QVA_OK) return usage_error("%s", qva_last_error());
    int rc = parse_seed(o, &spec.seed);
    if (rc) return rc;
    int64_t N = (int64_t)spec.prefix_tokens +
                (int64_t)spec.grid_t * spec.grid_h * spec.grid_w;
    if ((rc = alloc_qkv(&w->x, spec.B, spec.H, N, spec.D))) return rc;
    st = qva_synthetic_generate(&spec, w->x.q, w->x.k, w->x.v);
    if (st != QVA_OK) return lib_error(st, "generating the synthetic preset");
    snprintf(w->source, sizeof w->source, "synthetic:%s", spec.name);
    w->format = "synthetic";
    w->has_grid = 1;
    w->grid[0] = spec.grid_t;
    w->grid[1] = spec.grid_h;
    w->grid[2] = spec.grid_w;
    w->prefix = spec.prefix_tokens;
    return RC_OK;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Standard normal by Box-Muller: bench data needs no more than that. */
static void fill_normal(float *x, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((double)(splitmix(s) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(splitmix(s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
        x[i] = (float)(r * cos(t));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(t));
    }
}

static int load_random(const opts *o, workload *w) {
    int v[4], count;
    uint64_t seed = 0;
    int rc = parse_int_list(o->shape, "shape", 1, INT_MAX, v, 4, &count);
    if (rc) return rc;
    if (count != 4) return usage_error("--shape expects B,H,N,D");
    if (v[3] != 64 && v[3] != 128)
        return usage_error("--shape: head dim D=%d not supported: 64 or 128", v[3]);
    if ((double)v[0] * v[1] * v[2] * v[3] > 1e10)
        return usage_error("--shape %s is too large", o->shape);
    if ((rc = parse_seed(o, &seed)) || (rc = alloc_qkv(&w->x, v[0], v[1], v[2], v[3])))
        return rc;
    size_t n = (size_t)v[0] * v[1] * v[2] * v[3];
    fill_normal(w->x.q, n, &seed);
    fill_normal(w->x.k, n, &seed);
    fill_normal(w->x.v, n, &seed);
    snprintf(w->source, sizeof w->source, "random:%s", o->shape);
    w->format = "random";
    return RC_OK;
}

static int load_file(const char *path, workload *w) {
    qio_error err;
    if (qio_load_qkv(path, &w->x, &err) != QIO_OK)
        return runtime_error("cannot load input (%s): %s", qio_err_name(err.code),
                             err.msg);
    snprintf(w->source, sizeof w->source, "%s", path);
    w->format = w->x.format;
    return RC_OK;
}

/* --dtype: f32 (default), bf16 or f16. */
static int parse_dtype(const char *s, qva_dtype *dt) {
    if (!s || !strcmp(s, "f32")) *dt = QVA_F32;
    else if (!strcmp(s, "bf16")) *dt = QVA_BF16;
    else if (!strcmp(s, "f16")) *dt = QVA_F16;
    else return usage_error("--dtype %s: f32, bf16 or f16", s);
    return RC_OK;
}

/* n values rounded to the 16-bit dtype (round to nearest even): the codes
 * into *codes, the rounded values back into x. */
static int round_to_16(float *x, size_t n, qva_dtype dt, uint16_t **codes) {
    uint16_t *c = malloc(n * sizeof *c);
    if (!c) return runtime_error("out of memory for 16-bit q, k, v (%zu values)", n);
    for (size_t i = 0; i < n; ++i) {
        c[i] = dt == QVA_BF16 ? qio_f32_to_bf16(x[i]) : qio_f32_to_f16(x[i]);
        x[i] = dt == QVA_BF16 ? qio_bf16_to_f32(c[i]) : qio_f16_to_f32(c[i]);
    }
    *codes = c;
    return RC_OK;
}

static int apply_dtype(workload *w) {
    const qio_qkv *x = &w->x;
    if (w->dtype == QVA_F32) return RC_OK;
    const size_t nq = (size_t)(x->B * x->H * x->Nq * x->D);
    const size_t nk = (size_t)(x->B * x->H * x->N * x->D);
    int rc;
    if ((rc = round_to_16(x->q, nq, w->dtype, &w->q16)) ||
        (rc = round_to_16(x->k, nk, w->dtype, &w->k16)) ||
        (rc = round_to_16(x->v, nk, w->dtype, &w->v16)))
        return rc;
    return RC_OK;
}

/* Exactly one source; `dflt` preset when none is given. */
int load_workload(const opts *o, const char *dflt, workload *w) {
    int given = !!o->input + !!o->synthetic + !!o->shape;
    memset(w, 0, sizeof *w);
    if (given > 1)
        return usage_error("give only one of --input, --synthetic, --shape");
    int rc = parse_dtype(o->dtype, &w->dtype);
    if (rc) return rc;
    if (o->input) rc = load_file(o->input, w);
    else if (o->shape) rc = load_random(o, w);
    else rc = load_synthetic(o, o->synthetic ? o->synthetic : dflt, w);
    return rc ? rc : apply_dtype(w);
}

/* --grid/--prefix override the preset's layout; T*H*W + P must equal N. */
int resolve_grid(const opts *o, workload *w) {
    int g[3], count;
    w->prefix_at_end = o->prefix_at_end;
    if (!o->grid) {
        if (o->prefix != UNSET && !w->has_grid)
            return usage_error("--prefix needs --grid T,H,W");
        if (o->prefix != UNSET) w->prefix = o->prefix;
    } else {
        int rc = parse_int_list(o->grid, "grid", 1, INT_MAX, g, 3, &count);
        if (rc) return rc;
        if (count != 3) return usage_error("--grid expects T,H,W");
        memcpy(w->grid, g, sizeof g);
        w->prefix = opt_or(o->prefix, 0);
        w->has_grid = 1;
    }
    if (!w->has_grid) return RC_OK;
    if (w->prefix < 0) return usage_error("--prefix must be >= 0");
    const int64_t grid[3] = {w->grid[0], w->grid[1], w->grid[2]};
    int64_t thw, total;
    if (!qvi_prod_i64(grid, 3, &thw) || !qvi_add_i64(thw, w->prefix, &total))
        return usage_error("grid %dx%dx%d + prefix %d: T*H*W+P overflows int64, "
                           "but the input has N=%lld",
                           w->grid[0], w->grid[1], w->grid[2], w->prefix,
                           (long long)w->x.N);
    if (total != w->x.N)
        return usage_error(
            "grid %dx%dx%d + prefix %d: T*H*W+P = %lld tokens, but the input "
            "has N=%lld%s",
            w->grid[0], w->grid[1], w->grid[2], w->prefix,
            (long long)total, (long long)w->x.N,
            thw < w->x.N && o->prefix == UNSET ? " (missing --prefix?)" : "");
    return RC_OK;
}

int make_views(const opts *o, const workload *w, int allow_rows, views *vw) {
    const qio_qkv *x = &w->x;
    int64_t H = x->H, R = x->Nq;
    if (o->heads != UNSET) {
        if (o->heads < 1 || o->heads > x->H)
            return usage_error("--heads %d: the input has H=%lld heads", o->heads,
                               (long long)x->H);
        H = o->heads;
    }
    if (allow_rows && o->query_sample != UNSET) {
        if (o->query_sample < 1 || o->query_sample > x->Nq)
            return usage_error("--query-sample %d: the input has %lld query rows",
                               o->query_sample, (long long)x->Nq);
        R = o->query_sample;
    }
    const int half = w->dtype != QVA_F32;
    vw->q = qva_tensor_hnd(half ? (void *)w->q16 : (void *)x->q, w->dtype, QVA_DEVICE_CPU, x->B,
                           x->H, x->Nq, x->D);
    vw->k = qva_tensor_hnd(half ? (void *)w->k16 : (void *)x->k, w->dtype, QVA_DEVICE_CPU, x->B,
                           x->H, x->N, x->D);
    vw->v = qva_tensor_hnd(half ? (void *)w->v16 : (void *)x->v, w->dtype, QVA_DEVICE_CPU, x->B,
                           x->H, x->N, x->D);
    vw->q.shape[1] = vw->k.shape[1] = vw->v.shape[1] = H;
    vw->q.shape[2] = R;
    vw->q.stride[2] *= x->Nq / R; /* evenly spaced rows: 0, s, 2s, ... */
    vw->B = x->B;
    vw->H = H;
    vw->R = R;
    vw->N = x->N;
    vw->D = x->D;
    vw->out_elems = (size_t)(vw->B * H * R * vw->D);
    return RC_OK;
}

