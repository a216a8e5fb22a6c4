/*
 * The q/k/v tensors both formats hold: shape checks, element conversions
 * and the chunked data reads and writes.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* The library indexes tokens and channels with int. */
#define QIO_MAX_DIM 2147483647LL
/* 2^40 elements (4 TiB of f32): far past any real capture, and keeps every
 * byte count below overflow. */
#define QIO_MAX_ELEMS (1LL << 40)
/* Bytes converted per read or write: no second full-size buffer. */
#define QIO_CHUNK 65536

/* ------------------------------------------------------------ conversions */
float qio_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float qio_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    uint32_t u = exp == 31 ? sign | 0x7F800000u | (man << 13)
                           : sign | ((exp + 112u) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t qio_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* Rounds a subnormal-range magnitude (below 2^-14) to f16 units of 2^-24. */
static uint16_t f16_subnormal(uint32_t ax) {
    if (ax < 0x33000000u) return 0; /* <= 2^-25 rounds (to even) to zero */
    uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return (uint16_t)q; /* q == 0x400 is the smallest normal: still right */
}

uint16_t qio_f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ax = u & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u;    /* NaN */
    if (ax >= 0x477FF000u) return sign | 0x7C00u;   /* >= 65520: Inf */
    if (ax < 0x38800000u) return sign | f16_subnormal(ax);
    uint32_t h = (ax - 0x38000000u) >> 13; /* rebias 127 -> 15 */
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
}

/* ------------------------------------------------------------ shapes */
const char *const QKV_NAMES[3] = {"q", "k", "v"};

void fmt_shape(char *buf, size_t len, int rank, const int64_t *shape) {
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < rank && i < 8 && used < len; ++i)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld",
                                 i ? "," : "", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

static void fmt_dims(char *buf, size_t len, const dims4 *d) {
    int64_t s[4] = {d->B, d->H, d->N, d->D};
    fmt_shape(buf, len, 4, s);
}

/* Elements of a shape, or -1 if a dimension is negative or the product
 * passes QIO_MAX_ELEMS. */
int64_t shape_elems(int rank, const int64_t *shape) {
    int64_t total = 1;
    for (int i = 0; i < rank; ++i) {
        if (shape[i] < 0) return -1;
        if (shape[i] && total > QIO_MAX_ELEMS / shape[i]) return -1;
        total *= shape[i];
    }
    return total;
}

static qio_err check_dims_range(const char *name, int rank,
                                const int64_t *shape, qio_error *err) {
    char s[160];
    fmt_shape(s, sizeof s, rank, shape);
    for (int i = 0; i < rank; ++i)
        if (shape[i] < 0 || shape[i] > QIO_MAX_DIM)
            return fail(err, QIO_E_SHAPE,
                        "tensor '%s' shape %s: dimension out of range", name,
                        s);
    if (shape_elems(rank, shape) < 0)
        return fail(err, QIO_E_SHAPE,
                    "tensor '%s' shape %s: too many elements", name, s);
    return QIO_OK;
}

/* Maps an on-disk [H,N,D] or [B,H,N,D] shape to dims, checking what the
 * library can run: N > 0 and D in {64, 128}. */
qio_err shape_to_dims(const char *name, int rank, const int64_t *shape,
                      dims4 *d, qio_error *err) {
    char s[160];
    fmt_shape(s, sizeof s, rank, shape);
    if (rank != 3 && rank != 4)
        return fail(err, QIO_E_RANK,
                    "tensor '%s' has rank %d (shape %s); expected [H,N,D] or "
                    "[B,H,N,D]",
                    name, rank, s);
    qio_err e = check_dims_range(name, rank, shape, err);
    if (e) return e;
    const int64_t *t = shape + rank - 3;
    d->B = rank == 4 ? shape[0] : 1;
    d->H = t[0];
    d->N = t[1];
    d->D = t[2];
    if (d->N == 0)
        return fail(err, QIO_E_EMPTY, "tensor '%s' has N = 0 tokens (shape %s)",
                    name, s);
    if (d->B == 0 || d->H == 0 || d->D == 0)
        return fail(err, QIO_E_SHAPE, "tensor '%s' has a zero dimension (%s)",
                    name, s);
    if (d->D != 64 && d->D != 128)
        return fail(err, QIO_E_HEAD_DIM,
                    "tensor '%s': head dim D=%lld not supported: 64 or 128",
                    name, (long long)d->D);
    return QIO_OK;
}

/* k and v must agree exactly; q must agree with them on B, H and D. */
qio_err check_trio(const dims4 d[3], qio_error *err) {
    char a[96], b[96];
    if (memcmp(&d[1], &d[2], sizeof d[1]) != 0) {
        fmt_dims(a, sizeof a, &d[1]);
        fmt_dims(b, sizeof b, &d[2]);
        return fail(err, QIO_E_SHAPE,
                    "k %s and v %s have different shapes ([B,H,N,D])", a, b);
    }
    if (d[0].B != d[1].B || d[0].H != d[1].H || d[0].D != d[1].D) {
        fmt_dims(a, sizeof a, &d[0]);
        fmt_dims(b, sizeof b, &d[1]);
        return fail(err, QIO_E_SHAPE,
                    "q %s does not match k %s in B, H or D ([B,H,N,D])", a, b);
    }
    return QIO_OK;
}

/* ------------------------------------------------------------ data */
static float decode_elem(const unsigned char *p, qva_dtype dt) {
    if (dt == QVA_F32) {
        uint32_t u = (uint32_t)rd_le(p, 4);
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    uint16_t h = (uint16_t)rd_le(p, 2);
    return dt == QVA_BF16 ? qio_bf16_to_f32(h) : qio_f16_to_f32(h);
}

size_t elem_size(qva_dtype dt) { return dt == QVA_F32 ? 4 : 2; }

static qio_err nonfinite_error(const char *name, const dims4 *d, int64_t idx,
                               float x, qio_error *err) {
    int64_t dd = idx % d->D, n = idx / d->D % d->N;
    int64_t h = idx / (d->D * d->N) % d->H, b = idx / (d->D * d->N * d->H);
    return fail(err, QIO_E_NONFINITE,
                "tensor '%s' has %s at [b=%lld,h=%lld,n=%lld,d=%lld] "
                "(element %lld)",
                name, isnan(x) ? "NaN" : (x > 0 ? "+Inf" : "-Inf"),
                (long long)b, (long long)h, (long long)n, (long long)dd,
                (long long)idx);
}

/* Decodes count elements at file position pos into dst, in chunks so a
 * large tensor needs no second full-size buffer, rejecting NaN/Inf. */
static qio_err read_convert(FILE *f, int64_t pos, qva_dtype dt,
                            const dims4 *d, const char *name, float *dst,
                            qio_error *err) {
    unsigned char buf[QIO_CHUNK];
    size_t es = elem_size(dt), per = sizeof buf / es;
    int64_t count = d->B * d->H * d->N * d->D, done = 0;
    if (fseeko(f, (off_t)pos, SEEK_SET) != 0)
        return fail(err, QIO_E_TRUNCATED, "cannot seek to tensor '%s'", name);
    while (done < count) {
        size_t want = (size_t)(count - done) < per ? (size_t)(count - done)
                                                   : per;
        if (fread(buf, es, want, f) != want)
            return fail(err, QIO_E_TRUNCATED,
                        "file truncated inside tensor '%s'", name);
        for (size_t i = 0; i < want; ++i) {
            float x = decode_elem(buf + i * es, dt);
            if (!isfinite(x)) return nonfinite_error(name, d, done + (int64_t)i,
                                                     x, err);
            dst[done + (int64_t)i] = x;
        }
        done += (int64_t)want;
    }
    return QIO_OK;
}

/* Allocates and fills the three f32 buffers from their file positions. */
qio_err read_trio(FILE *const f[3], const int64_t pos[3],
                  const qva_dtype dt[3], const dims4 d[3], qio_qkv *out,
                  qio_error *err) {
    float **dst[3] = {&out->q, &out->k, &out->v};
    for (int i = 0; i < 3; ++i) {
        size_t n = (size_t)(d[i].B * d[i].H * d[i].N * d[i].D);
        *dst[i] = malloc(n * sizeof(float));
        if (!*dst[i])
            return fail(err, QIO_E_NOMEM,
                        "out of memory for tensor '%s' (%zu floats)",
                        QKV_NAMES[i], n);
        qio_err e = read_convert(f[i], pos[i], dt[i], &d[i], QKV_NAMES[i],
                                 *dst[i], err);
        if (e) return e;
        out->file_dtype[i] = dt[i];
    }
    out->B = d[0].B;
    out->H = d[0].H;
    out->Nq = d[0].N;
    out->N = d[1].N;
    out->D = d[0].D;
    return QIO_OK;
}

void qio_qkv_free(qio_qkv *x) {
    if (!x) return;
    free(x->q);
    free(x->k);
    free(x->v);
    memset(x, 0, sizeof *x);
}

/* ------------------------------------------------------------ writing */
qio_err check_desc(const qio_tensor_desc *t, int64_t *elems, qio_error *err) {
    if (!t->name || !*t->name || t->rank < 0 || t->rank > 8 ||
        (t->dtype != QVA_F32 && t->dtype != QVA_BF16 && t->dtype != QVA_F16))
        return fail(err, QIO_E_ARG, "bad tensor descriptor");
    *elems = shape_elems(t->rank, t->shape);
    if (*elems < 0) return fail(err, QIO_E_ARG, "tensor '%s': bad shape", t->name);
    if (*elems > 0 && !t->data)
        return fail(err, QIO_E_ARG, "tensor '%s': no data", t->name);
    return QIO_OK;
}

static void encode_elem(unsigned char *p, float x, qva_dtype dt) {
    uint32_t u;
    if (dt == QVA_F32) {
        memcpy(&u, &x, sizeof u);
        wr_le(p, u, 4);
    } else {
        wr_le(p, dt == QVA_BF16 ? qio_f32_to_bf16(x) : qio_f32_to_f16(x), 2);
    }
}

static int write_data(FILE *f, const float *x, int64_t n, qva_dtype dt) {
    unsigned char buf[QIO_CHUNK];
    size_t es = elem_size(dt), per = sizeof buf / es;
    for (int64_t done = 0; done < n;) {
        size_t m = (size_t)(n - done) < per ? (size_t)(n - done) : per;
        for (size_t i = 0; i < m; ++i) encode_elem(buf + i * es, x[done + (int64_t)i], dt);
        if (fwrite(buf, es, m, f) != m) return -1;
        done += (int64_t)m;
    }
    return 0;
}

/* Writes header bytes then every tensor's data; closes f. */
qio_err write_file(FILE *f, const char *path, const void *head,
                   size_t head_len, const qio_tensor_desc *t,
                   const int64_t *elems, int count, qio_error *err) {
    int bad = fwrite(head, 1, head_len, f) != head_len;
    for (int i = 0; i < count && !bad; ++i)
        bad = write_data(f, t[i].data, elems[i], t[i].dtype) != 0;
    if (fclose(f) != 0) bad = 1;
    return bad ? fail(err, QIO_E_WRITE, "%s: write failed", path) : QIO_OK;
}

