/*
 * Readers and writers of attention-input files (see io.h).
 *
 * Every length read from a file is checked against the file size before it
 * is trusted, so a hostile or truncated file yields an error, never a read
 * past a buffer.  Byte order is decoded explicitly (both formats are
 * little-endian on disk) so the code does not depend on the host.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* fseeko, ftello, stat */
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64
#endif

#include "io.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

/* safetensors' own reference limit; a larger header is corrupt or hostile */
#define QIO_ST_MAX_HEADER 100000000ull
/* numpy refuses headers past 10 kB by default; we allow a generous 1 MiB */
#define QIO_NPY_MAX_HEADER (1u << 20)
/* The library indexes tokens and channels with int. */
#define QIO_MAX_DIM 2147483647LL
/* 2^40 elements (4 TiB of f32): far past any real capture, and keeps every
 * byte count below overflow. */
#define QIO_MAX_ELEMS (1LL << 40)
#define QIO_JSON_MAX_DEPTH 64
#define QIO_CHUNK 65536

/* ------------------------------------------------------------ errors */
static qio_err fail(qio_error *e, qio_err code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static qio_err fail(qio_error *e, qio_err code, const char *fmt, ...) {
    if (!e) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->code = code;
    return code;
}

/* Prefixes the message with the file it concerns, once, at the top level,
 * so the inner parsers need not carry the path around. */
static void prefix_path(qio_error *e, const char *path) {
    size_t cap = sizeof e->msg - 1, pl = strlen(path), ml = strlen(e->msg);
    if (pl > cap / 2) pl = cap / 2; /* keep room for the message itself */
    size_t keep = ml < cap - pl - 2 ? ml : cap - pl - 2;
    memmove(e->msg + pl + 2, e->msg, keep);
    memcpy(e->msg, path, pl);
    e->msg[pl] = ':';
    e->msg[pl + 1] = ' ';
    e->msg[pl + 2 + keep] = '\0';
}

static void clear_error(qio_error *e) {
    if (!e) return;
    e->code = QIO_OK;
    e->msg[0] = '\0';
}

const char *qio_err_name(qio_err e) {
    static const char *const names[] = {
        "ok",      "argument", "open",   "truncated", "magic",
        "header",  "json",     "offsets", "dtype",    "rank",
        "missing", "shape",    "empty",  "head-dim",  "nonfinite",
        "order",   "nomem",    "write"};
    if ((unsigned)e >= sizeof names / sizeof names[0]) return "unknown";
    return names[e];
}

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

static uint64_t rd_le(const unsigned char *p, int nbytes) {
    uint64_t v = 0;
    for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

static void wr_le(unsigned char *p, uint64_t v, int nbytes) {
    for (int i = 0; i < nbytes; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

/* ------------------------------------------------------------ files */
/* Size of an open file, or -1. */
static int64_t file_size(FILE *f) {
    if (fseeko(f, 0, SEEK_END) != 0) return -1;
    off_t n = ftello(f);
    if (n < 0 || fseeko(f, 0, SEEK_SET) != 0) return -1;
    return (int64_t)n;
}

static qio_err open_read(const char *path, FILE **f, int64_t *size,
                         qio_error *err) {
    *f = fopen(path, "rb");
    if (!*f) return fail(err, QIO_E_OPEN, "cannot open: %s", strerror(errno));
    *size = file_size(*f);
    if (*size < 0) {
        fclose(*f);
        *f = NULL;
        return fail(err, QIO_E_OPEN, "cannot determine the file size");
    }
    return QIO_OK;
}

/* Reads exactly n bytes at pos; a short read means the file shrank or lied. */
static qio_err read_at(FILE *f, int64_t pos, void *buf, size_t n,
                       qio_error *err) {
    if (fseeko(f, (off_t)pos, SEEK_SET) != 0 || fread(buf, 1, n, f) != n)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: cannot read %zu bytes at offset %lld", n,
                    (long long)pos);
    return QIO_OK;
}

/* ------------------------------------------------------------ shapes */
typedef struct dims4 {
    int64_t B, H, N, D;
} dims4;

static const char *const QKV_NAMES[3] = {"q", "k", "v"};

static void fmt_shape(char *buf, size_t len, int rank, const int64_t *shape) {
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
static int64_t shape_elems(int rank, const int64_t *shape) {
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
static qio_err shape_to_dims(const char *name, int rank, const int64_t *shape,
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
static qio_err check_trio(const dims4 d[3], qio_error *err) {
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

static size_t elem_size(qva_dtype dt) { return dt == QVA_F32 ? 4 : 2; }

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
static qio_err read_trio(FILE *const f[3], const int64_t pos[3],
                         const qva_dtype dt[3], const dims4 d[3],
                         qio_qkv *out, qio_error *err) {
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

/* ------------------------------------------------------------ JSON */
/* A minimal parser for the safetensors header: enough JSON to walk any
 * valid document (so unknown keys and "__metadata__" can be skipped) plus
 * the few typed readers the tensor entries need. */
typedef struct jp {
    const char *s;
    size_t n, i;
    qio_error *err;
} jp;

static qio_err jp_fail(jp *p, const char *what) {
    return fail(p->err, QIO_E_JSON, "header JSON: %s at byte %zu", what, p->i);
}

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        ++p->i;
}

static int jp_peek(jp *p) {
    jp_ws(p);
    return p->i < p->n ? (unsigned char)p->s[p->i] : -1;
}

static qio_err jp_lit(jp *p, char c) {
    char what[32];
    if (jp_peek(p) != (unsigned char)c) {
        snprintf(what, sizeof what, "expected '%c'", c);
        return jp_fail(p, what);
    }
    ++p->i;
    return QIO_OK;
}

/* After an element of an object or array: 1 on ',', 0 on the closer. */
static qio_err jp_next(jp *p, char closer, int *more) {
    int c = jp_peek(p);
    if (c == ',' || c == (unsigned char)closer) {
        ++p->i;
        *more = c == ',';
        return QIO_OK;
    }
    char what[40];
    snprintf(what, sizeof what, "expected ',' or '%c'", closer);
    return jp_fail(p, what);
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* \uXXXX: the names we look for are ASCII, so other code points only need
 * to stay distinct from them ('?'). */
static qio_err jp_unicode(jp *p, char *out) {
    if (p->n - p->i < 4) return jp_fail(p, "truncated \\u escape");
    unsigned code = 0;
    for (int k = 0; k < 4; ++k) {
        int h = hexval((unsigned char)p->s[p->i++]);
        if (h < 0) return jp_fail(p, "bad \\u escape");
        code = code * 16 + (unsigned)h;
    }
    *out = code > 0 && code < 0x80 ? (char)code : '?';
    return QIO_OK;
}

static qio_err jp_escape(jp *p, char *out) {
    if (p->i >= p->n) return jp_fail(p, "unterminated string");
    char e = p->s[p->i++];
    switch (e) {
    case '"': case '\\': case '/': *out = e; return QIO_OK;
    case 'b': *out = '\b'; return QIO_OK;
    case 'f': *out = '\f'; return QIO_OK;
    case 'n': *out = '\n'; return QIO_OK;
    case 'r': *out = '\r'; return QIO_OK;
    case 't': *out = '\t'; return QIO_OK;
    case 'u': return jp_unicode(p, out);
    default: return jp_fail(p, "bad escape in string");
    }
}

/* Reads a string into buf (cap >= 1), truncating long ones: a truncated
 * name is longer than every name we compare with, so it never matches. */
static qio_err jp_string(jp *p, char *buf, size_t cap) {
    size_t len = 0;
    qio_err e = jp_lit(p, '"');
    if (e) return e;
    for (;;) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        char c = p->s[p->i++];
        if (c == '"') break;
        if ((unsigned char)c < 0x20) return jp_fail(p, "control character in string");
        if (c == '\\' && (e = jp_escape(p, &c)) != QIO_OK) return e;
        if (len + 1 < cap) buf[len++] = c;
    }
    buf[len] = '\0';
    return QIO_OK;
}

/* A non-negative integer no larger than 2^53 (what JSON writers keep
 * exact); fractions, exponents and signs are errors. */
static qio_err jp_uint(jp *p, uint64_t *out) {
    int c = jp_peek(p);
    if (c == '-') return jp_fail(p, "negative number");
    if (c < '0' || c > '9') return jp_fail(p, "expected a non-negative integer");
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (v > (1ull << 53)) return jp_fail(p, "integer too large");
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' ||
                        p->s[p->i] == 'E'))
        return jp_fail(p, "expected an integer, found a fraction");
    *out = v;
    return QIO_OK;
}

static qio_err jp_skip(jp *p, int depth);

static qio_err jp_skip_container(jp *p, int depth, char closer) {
    char key[8];
    int more = 1;
    ++p->i; /* the opener */
    if (jp_peek(p) == (unsigned char)closer) {
        ++p->i;
        return QIO_OK;
    }
    while (more) {
        qio_err e;
        if (closer == '}' && ((e = jp_string(p, key, sizeof key)) ||
                              (e = jp_lit(p, ':'))))
            return e;
        if ((e = jp_skip(p, depth + 1)) || (e = jp_next(p, closer, &more)))
            return e;
    }
    return QIO_OK;
}

static qio_err jp_skip_word(jp *p, const char *w) {
    size_t len = strlen(w);
    if (p->n - p->i < len || memcmp(p->s + p->i, w, len) != 0)
        return jp_fail(p, "unexpected token");
    p->i += len;
    return QIO_OK;
}

static qio_err jp_skip_number(jp *p) {
    size_t start = p->i;
    while (p->i < p->n && strchr("+-0123456789.eE", p->s[p->i]) &&
           p->s[p->i] != '\0')
        ++p->i;
    return p->i > start ? QIO_OK : jp_fail(p, "bad number");
}

/* Skips any JSON value (depth-limited: a fuzzer's [[[[... must not blow
 * the stack). */
static qio_err jp_skip(jp *p, int depth) {
    char scratch[8];
    if (depth > QIO_JSON_MAX_DEPTH) return jp_fail(p, "nesting too deep");
    int c = jp_peek(p);
    switch (c) {
    case '{': return jp_skip_container(p, depth, '}');
    case '[': return jp_skip_container(p, depth, ']');
    case '"': return jp_string(p, scratch, sizeof scratch);
    case 't': return jp_skip_word(p, "true");
    case 'f': return jp_skip_word(p, "false");
    case 'n': return jp_skip_word(p, "null");
    case -1: return jp_fail(p, "unexpected end of header");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return jp_skip_number(p);
        return jp_fail(p, "unexpected character");
    }
}

/* ------------------------------------------------------------ safetensors */
typedef struct st_entry {
    int present, have_dtype, have_shape, have_off;
    char dtype[24];
    int rank;          /* entries in "shape"; only the first 8 are kept */
    int64_t shape[8];
    uint64_t off[2];
} st_entry;

/* [a, b, ...] of non-negative integers; count gets the full length. */
static qio_err st_uint_array(jp *p, uint64_t *vals, int cap, int *count) {
    int more = 1;
    qio_err e = jp_lit(p, '[');
    *count = 0;
    if (e) return e;
    if (jp_peek(p) == ']') {
        ++p->i;
        return QIO_OK;
    }
    while (more) {
        uint64_t v = 0;
        if ((e = jp_uint(p, &v))) return e;
        if (*count < cap) vals[*count] = v;
        ++*count;
        if ((e = jp_next(p, ']', &more))) return e;
    }
    return QIO_OK;
}

static qio_err st_entry_field(jp *p, const char *key, st_entry *t) {
    uint64_t vals[8];
    int count;
    qio_err e;
    if (!strcmp(key, "dtype")) {
        t->have_dtype = 1;
        return jp_string(p, t->dtype, sizeof t->dtype);
    }
    if (!strcmp(key, "shape")) {
        if ((e = st_uint_array(p, vals, 8, &count))) return e;
        t->have_shape = 1;
        t->rank = count;
        for (int i = 0; i < count && i < 8; ++i) t->shape[i] = (int64_t)vals[i];
        return QIO_OK;
    }
    if (!strcmp(key, "data_offsets")) {
        if ((e = st_uint_array(p, vals, 2, &count))) return e;
        if (count != 2) return jp_fail(p, "data_offsets must hold 2 integers");
        t->have_off = 1;
        t->off[0] = vals[0];
        t->off[1] = vals[1];
        return QIO_OK;
    }
    return jp_skip(p, 2);
}

static qio_err st_entry_parse(jp *p, const char *name, st_entry *t) {
    char key[32];
    int more = 1;
    qio_err e = jp_lit(p, '{');
    if (e) return e;
    if (jp_peek(p) == '}') {
        ++p->i;
        more = 0;
    }
    while (more) {
        if ((e = jp_string(p, key, sizeof key)) || (e = jp_lit(p, ':')) ||
            (e = st_entry_field(p, key, t)) || (e = jp_next(p, '}', &more)))
            return e;
    }
    const char *lack = !t->have_dtype ? "dtype"
                       : !t->have_shape ? "shape"
                       : !t->have_off  ? "data_offsets" : NULL;
    if (lack)
        return fail(p->err, QIO_E_JSON, "header JSON: tensor '%s' lacks \"%s\"",
                    name, lack);
    t->present = 1;
    return QIO_OK;
}

static int qkv_index(const char *name) {
    for (int i = 0; i < 3; ++i)
        if (!strcmp(name, QKV_NAMES[i])) return i;
    return -1;
}

static qio_err st_top_member(jp *p, st_entry ent[3]) {
    char key[128];
    qio_err e;
    if ((e = jp_string(p, key, sizeof key)) || (e = jp_lit(p, ':'))) return e;
    int idx = qkv_index(key);
    if (idx >= 0) {
        if (ent[idx].present)
            return fail(p->err, QIO_E_JSON,
                        "header JSON: tensor '%s' appears twice", key);
        return st_entry_parse(p, key, &ent[idx]);
    }
    if (!strcmp(key, "__metadata__") && jp_peek(p) != '{')
        return jp_fail(p, "__metadata__ must be an object");
    return jp_skip(p, 1); /* metadata or a tensor we do not use */
}

static qio_err st_parse_header(const char *s, size_t n, st_entry ent[3],
                               qio_error *err) {
    jp p = {s, n, 0, err};
    int more = 1;
    memset(ent, 0, 3 * sizeof *ent);
    qio_err e = jp_lit(&p, '{');
    if (e) return e;
    if (jp_peek(&p) == '}') {
        ++p.i;
        more = 0;
    }
    while (more)
        if ((e = st_top_member(&p, ent)) || (e = jp_next(&p, '}', &more)))
            return e;
    if (jp_peek(&p) != -1) return jp_fail(&p, "trailing characters after the header object");
    return QIO_OK;
}

static qio_err st_dtype(const char *name, const char *s, qva_dtype *dt,
                        qio_error *err) {
    static const char *const known[] = {
        "F64", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8",
        "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
        "F6_E3M2", "C64"};
    if (!strcmp(s, "F32")) *dt = QVA_F32;
    else if (!strcmp(s, "BF16")) *dt = QVA_BF16;
    else if (!strcmp(s, "F16")) *dt = QVA_F16;
    else {
        for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i)
            if (!strcmp(s, known[i]))
                return fail(err, QIO_E_DTYPE,
                            "tensor '%s': dtype %s not supported (F32, BF16 "
                            "or F16)",
                            name, s);
        return fail(err, QIO_E_DTYPE, "tensor '%s': unknown dtype '%s'", name,
                    s);
    }
    return QIO_OK;
}

static const char *dtype_name(qva_dtype dt) {
    return dt == QVA_F32 ? "F32" : dt == QVA_BF16 ? "BF16" : "F16";
}

/* The entry's byte range must be exactly dtype x shape and lie inside the
 * data section; a consistent range past the end means a truncated file. */
static qio_err st_check_offsets(const char *name, const st_entry *t,
                                qva_dtype dt, uint64_t data_len,
                                qio_error *err) {
    char s[160];
    fmt_shape(s, sizeof s, t->rank, t->shape);
    uint64_t need = (uint64_t)shape_elems(t->rank, t->shape) * elem_size(dt);
    if (t->off[1] < t->off[0])
        return fail(err, QIO_E_OFFSETS,
                    "tensor '%s': data_offsets [%llu,%llu] end before they "
                    "begin",
                    name, (unsigned long long)t->off[0],
                    (unsigned long long)t->off[1]);
    if (t->off[1] - t->off[0] != need)
        return fail(err, QIO_E_OFFSETS,
                    "tensor '%s': data_offsets [%llu,%llu] hold %llu bytes but "
                    "%s %s needs %llu",
                    name, (unsigned long long)t->off[0],
                    (unsigned long long)t->off[1],
                    (unsigned long long)(t->off[1] - t->off[0]),
                    dtype_name(dt), s, (unsigned long long)need);
    if (t->off[1] > data_len)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: tensor '%s' needs data bytes [%llu,%llu) "
                    "but the data section has %llu",
                    name, (unsigned long long)t->off[0],
                    (unsigned long long)t->off[1],
                    (unsigned long long)data_len);
    return QIO_OK;
}

/* Validates the three entries: presence, dtype, shape, offsets, then the
 * shapes against each other. */
static qio_err st_validate(const st_entry ent[3], uint64_t data_len,
                           qva_dtype dt[3], dims4 d[3], qio_error *err) {
    for (int i = 0; i < 3; ++i)
        if (!ent[i].present)
            return fail(err, QIO_E_MISSING,
                        "no tensor named '%s' (the file needs q, k and v)",
                        QKV_NAMES[i]);
    for (int i = 0; i < 3; ++i) {
        qio_err e;
        if ((e = st_dtype(QKV_NAMES[i], ent[i].dtype, &dt[i], err)) ||
            (e = shape_to_dims(QKV_NAMES[i], ent[i].rank, ent[i].shape, &d[i],
                               err)) ||
            (e = st_check_offsets(QKV_NAMES[i], &ent[i], dt[i], data_len, err)))
            return e;
    }
    return check_trio(d, err);
}

/* Reads the length field and the header text (caller frees *hdr). */
static qio_err st_read_header(FILE *f, int64_t fsize, char **hdr,
                              uint64_t *hlen, qio_error *err) {
    unsigned char lenbuf[8];
    if (fsize < 8)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: %lld bytes, less than the 8-byte header "
                    "length",
                    (long long)fsize);
    qio_err e = read_at(f, 0, lenbuf, 8, err);
    if (e) return e;
    *hlen = rd_le(lenbuf, 8);
    if (*hlen > QIO_ST_MAX_HEADER)
        return fail(err, QIO_E_HEADER,
                    "header length %llu is absurd (limit %llu): not a "
                    "safetensors file?",
                    (unsigned long long)*hlen, QIO_ST_MAX_HEADER);
    if (*hlen < 2)
        return fail(err, QIO_E_HEADER,
                    "header length %llu is too small for a JSON object",
                    (unsigned long long)*hlen);
    if (*hlen > (uint64_t)(fsize - 8))
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: header length %llu but only %lld bytes "
                    "follow",
                    (unsigned long long)*hlen, (long long)(fsize - 8));
    *hdr = malloc((size_t)*hlen);
    if (!*hdr) return fail(err, QIO_E_NOMEM, "out of memory for the header");
    return read_at(f, 8, *hdr, (size_t)*hlen, err);
}

static qio_err st_load(FILE *f, int64_t fsize, qio_qkv *out, qio_error *err) {
    char *hdr = NULL;
    uint64_t hlen = 0;
    st_entry ent[3];
    qva_dtype dt[3];
    dims4 d[3];
    qio_err e = st_read_header(f, fsize, &hdr, &hlen, err);
    if (!e) e = st_parse_header(hdr, (size_t)hlen, ent, err);
    free(hdr);
    if (e) return e;
    uint64_t data_start = 8 + hlen, data_len = (uint64_t)fsize - data_start;
    if ((e = st_validate(ent, data_len, dt, d, err))) return e;
    FILE *fs[3] = {f, f, f};
    int64_t pos[3];
    for (int i = 0; i < 3; ++i) pos[i] = (int64_t)(data_start + ent[i].off[0]);
    out->format = "safetensors";
    return read_trio(fs, pos, dt, d, out, err);
}

qio_err qio_load_safetensors(const char *path, qio_qkv *out, qio_error *err) {
    FILE *f = NULL;
    int64_t fsize = 0;
    clear_error(err);
    if (!path || !out) return fail(err, QIO_E_ARG, "NULL argument");
    memset(out, 0, sizeof *out);
    qio_err e = open_read(path, &f, &fsize, err);
    if (!e) {
        e = st_load(f, fsize, out, err);
        fclose(f);
    }
    if (e) {
        qio_qkv_free(out);
        prefix_path(err, path);
    }
    return e;
}

/* ------------------------------------------------------------ npy */
/* The .npy header is a Python dict literal, e.g.
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 64, 128), }
 * parsed here with the same cursor type as the JSON. */
typedef struct npy_hdr {
    int have_descr, have_order, have_shape;
    char descr[32];
    int fortran;
    int rank;
    int64_t shape[8];
} npy_hdr;

static qio_err py_fail(jp *p, const char *what) {
    return fail(p->err, QIO_E_HEADER, "npy header: %s at byte %zu", what, p->i);
}

static qio_err py_string(jp *p, char *buf, size_t cap) {
    int q = jp_peek(p);
    size_t len = 0;
    if (q != '\'' && q != '"') return py_fail(p, "expected a quoted string");
    ++p->i;
    for (;;) {
        if (p->i >= p->n) return py_fail(p, "unterminated string");
        char c = p->s[p->i++];
        if (c == (char)q) break;
        if (c == '\\' && p->i < p->n) c = p->s[p->i++];
        if (len + 1 < cap) buf[len++] = c;
    }
    buf[len] = '\0';
    return QIO_OK;
}

static int py_word(jp *p, const char *w) {
    size_t len = strlen(w);
    if (p->n - p->i < len || memcmp(p->s + p->i, w, len) != 0) return 0;
    p->i += len;
    return 1;
}

static qio_err py_bool(jp *p, int *v) {
    jp_ws(p);
    if (py_word(p, "True")) *v = 1;
    else if (py_word(p, "False")) *v = 0;
    else return py_fail(p, "fortran_order must be True or False");
    return QIO_OK;
}

static qio_err py_int(jp *p, int64_t *v) {
    int c = jp_peek(p);
    if (c < '0' || c > '9') return py_fail(p, "shape must hold non-negative integers");
    int64_t x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > (1LL << 53)) return py_fail(p, "shape entry too large");
    }
    if (p->i < p->n && p->s[p->i] == 'L') ++p->i; /* Python 2 long */
    *v = x;
    return QIO_OK;
}

/* (a, b, c) with optional trailing comma; () is a scalar. */
static qio_err py_shape(jp *p, npy_hdr *h) {
    if (jp_peek(p) != '(') return py_fail(p, "shape must be a tuple");
    ++p->i;
    h->rank = 0;
    while (jp_peek(p) != ')') {
        int64_t v = 0;
        qio_err e = py_int(p, &v);
        if (e) return e;
        if (h->rank >= 8) return fail(p->err, QIO_E_RANK,
                                      "npy shape has more than 8 dimensions");
        h->shape[h->rank++] = v;
        int c = jp_peek(p);
        if (c == ',') ++p->i;
        else if (c != ')') return py_fail(p, "expected ',' or ')' in shape");
    }
    ++p->i;
    h->have_shape = 1;
    return QIO_OK;
}

static qio_err py_skip_value(jp *p, int depth);

static qio_err py_skip_seq(jp *p, int depth, char closer) {
    ++p->i;
    while (jp_peek(p) != (unsigned char)closer) {
        qio_err e = py_skip_value(p, depth + 1);
        if (e) return e;
        int c = jp_peek(p);
        if (c == ',' || c == ':') ++p->i;
        else if (c != (unsigned char)closer) return py_fail(p, "bad literal");
    }
    ++p->i;
    return QIO_OK;
}

/* Skips the value of a key numpy would not write (tolerated, unused). */
static qio_err py_skip_value(jp *p, int depth) {
    char scratch[8];
    if (depth > QIO_JSON_MAX_DEPTH) return py_fail(p, "nesting too deep");
    int c = jp_peek(p);
    if (c == '\'' || c == '"') return py_string(p, scratch, sizeof scratch);
    if (c == '(') return py_skip_seq(p, depth, ')');
    if (c == '[') return py_skip_seq(p, depth, ']');
    if (c == '{') return py_skip_seq(p, depth, '}');
    size_t start = p->i;
    while (p->i < p->n && (isalnum((unsigned char)p->s[p->i]) ||
                           strchr("+-._", p->s[p->i])) && p->s[p->i] != '\0')
        ++p->i;
    return p->i > start ? QIO_OK : py_fail(p, "bad literal");
}

static qio_err py_member(jp *p, npy_hdr *h) {
    char key[32];
    qio_err e = py_string(p, key, sizeof key);
    if (e) return e;
    if (jp_peek(p) != ':') return py_fail(p, "expected ':'");
    ++p->i;
    if (!strcmp(key, "descr")) {
        if (jp_peek(p) == '[')
            return fail(p->err, QIO_E_DTYPE,
                        "structured dtype not supported: '<f4' or '<f2'");
        h->have_descr = 1;
        return py_string(p, h->descr, sizeof h->descr);
    }
    if (!strcmp(key, "fortran_order")) {
        h->have_order = 1;
        return py_bool(p, &h->fortran);
    }
    if (!strcmp(key, "shape")) return py_shape(p, h);
    return py_skip_value(p, 1);
}

static qio_err npy_parse_dict(const char *s, size_t n, npy_hdr *h,
                              qio_error *err) {
    jp p = {s, n, 0, err};
    memset(h, 0, sizeof *h);
    if (jp_peek(&p) != '{') return py_fail(&p, "expected '{'");
    ++p.i;
    while (jp_peek(&p) != '}') {
        qio_err e = py_member(&p, h);
        if (e) return e;
        int c = jp_peek(&p);
        if (c == ',') ++p.i;
        else if (c != '}') return py_fail(&p, "expected ',' or '}'");
    }
    ++p.i;
    if (jp_peek(&p) != -1) return py_fail(&p, "trailing characters after the dict");
    if (!h->have_descr || !h->have_order || !h->have_shape)
        return fail(err, QIO_E_HEADER,
                    "npy header lacks '%s'",
                    !h->have_descr ? "descr"
                    : !h->have_order ? "fortran_order" : "shape");
    return QIO_OK;
}

static qio_err npy_dtype(const char *name, const char *descr, qva_dtype *dt,
                         qio_error *err) {
    if (!strcmp(descr, "<f4")) *dt = QVA_F32;
    else if (!strcmp(descr, "<f2")) *dt = QVA_F16;
    else if (descr[0] == '>')
        return fail(err, QIO_E_DTYPE,
                    "tensor '%s': big-endian dtype '%s' not supported; save "
                    "little-endian ('<f4' or '<f2')",
                    name, descr);
    else if (strstr(descr, "V2") || strstr(descr, "bf") || strstr(descr, "bfloat"))
        return fail(err, QIO_E_DTYPE,
                    "tensor '%s': dtype '%s' looks like bfloat16, which is not "
                    "a numpy dtype; save float32/float16 or use safetensors "
                    "BF16",
                    name, descr);
    else
        return fail(err, QIO_E_DTYPE,
                    "tensor '%s': dtype '%s' not supported: '<f4' or '<f2'",
                    name, descr);
    return QIO_OK;
}

/* Magic and version; returns the header text length and where it starts. */
static qio_err npy_preamble(FILE *f, int64_t fsize, uint64_t *hlen,
                            int64_t *hstart, qio_error *err) {
    unsigned char pre[12];
    static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    size_t got = fsize < 12 ? (size_t)fsize : 12;
    if (fseeko(f, 0, SEEK_SET) != 0 || fread(pre, 1, got, f) != got)
        return fail(err, QIO_E_OPEN, "cannot read the file");
    if (got < 6 || memcmp(pre, magic, 6) != 0)
        return got < 6 && memcmp(pre, magic, got) == 0
                   ? fail(err, QIO_E_TRUNCATED, "file truncated inside the npy magic")
                   : fail(err, QIO_E_MAGIC, "not a .npy file (bad magic)");
    if (got < 8) return fail(err, QIO_E_TRUNCATED, "file truncated after the npy magic");
    int major = pre[6];
    if (major < 1 || major > 3)
        return fail(err, QIO_E_HEADER, "npy format version %d.%d not supported",
                    major, pre[7]);
    int lbytes = major == 1 ? 2 : 4;
    if (got < (size_t)(8 + lbytes))
        return fail(err, QIO_E_TRUNCATED, "file truncated inside the npy header length");
    *hlen = rd_le(pre + 8, lbytes);
    *hstart = 8 + lbytes;
    if (*hlen > QIO_NPY_MAX_HEADER)
        return fail(err, QIO_E_HEADER,
                    "npy header length %llu too long (limit %u)",
                    (unsigned long long)*hlen, QIO_NPY_MAX_HEADER);
    if ((int64_t)*hlen > fsize - *hstart)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: npy header of %llu bytes but %lld follow",
                    (unsigned long long)*hlen, (long long)(fsize - *hstart));
    return QIO_OK;
}

/* One opened .npy: header validated, data position and size checked. */
typedef struct npy_file {
    FILE *f;
    int64_t data_pos;
    qva_dtype dt;
    dims4 d;
} npy_file;

static qio_err npy_check_data(const char *name, const npy_hdr *h,
                              const npy_file *nf, int64_t fsize,
                              qio_error *err) {
    char s[160];
    fmt_shape(s, sizeof s, h->rank, h->shape);
    int64_t need = shape_elems(h->rank, h->shape) * (int64_t)elem_size(nf->dt);
    if (fsize - nf->data_pos < need)
        return fail(err, QIO_E_TRUNCATED,
                    "file truncated: tensor '%s' %s needs %lld data bytes, "
                    "%lld present",
                    name, s, (long long)need, (long long)(fsize - nf->data_pos));
    return QIO_OK;
}

static qio_err npy_open(const char *path, const char *name, npy_file *nf,
                        qio_error *err) {
    int64_t fsize = 0, hstart = 0;
    uint64_t hlen = 0;
    npy_hdr h;
    qio_err e = open_read(path, &nf->f, &fsize, err);
    if (e) return e;
    if ((e = npy_preamble(nf->f, fsize, &hlen, &hstart, err))) return e;
    char *txt = malloc((size_t)hlen + 1);
    if (!txt) return fail(err, QIO_E_NOMEM, "out of memory for the npy header");
    e = read_at(nf->f, hstart, txt, (size_t)hlen, err);
    if (!e) e = npy_parse_dict(txt, (size_t)hlen, &h, err);
    free(txt);
    if (e) return e;
    if ((e = npy_dtype(name, h.descr, &nf->dt, err))) return e;
    if (h.fortran)
        return fail(err, QIO_E_ORDER,
                    "tensor '%s': fortran_order is True; save a C-order "
                    "array (np.ascontiguousarray)",
                    name);
    if ((e = shape_to_dims(name, h.rank, h.shape, &nf->d, err))) return e;
    nf->data_pos = hstart + (int64_t)hlen;
    return npy_check_data(name, &h, nf, fsize, err);
}

static qio_err npy_trio(const char *const paths[3], npy_file nf[3],
                        qio_qkv *out, qio_error *err) {
    dims4 d[3];
    qio_err e;
    for (int i = 0; i < 3; ++i) {
        if ((e = npy_open(paths[i], QKV_NAMES[i], &nf[i], err))) {
            prefix_path(err, paths[i]);
            return e;
        }
        d[i] = nf[i].d;
    }
    if ((e = check_trio(d, err))) return e;
    FILE *fs[3] = {nf[0].f, nf[1].f, nf[2].f};
    int64_t pos[3] = {nf[0].data_pos, nf[1].data_pos, nf[2].data_pos};
    qva_dtype dt[3] = {nf[0].dt, nf[1].dt, nf[2].dt};
    out->format = "npy";
    return read_trio(fs, pos, dt, d, out, err);
}

qio_err qio_load_npy_trio(const char *const paths[3], qio_qkv *out,
                          qio_error *err) {
    npy_file nf[3];
    clear_error(err);
    if (!paths || !out || !paths[0] || !paths[1] || !paths[2])
        return fail(err, QIO_E_ARG, "NULL argument");
    memset(out, 0, sizeof *out);
    memset(nf, 0, sizeof nf);
    qio_err e = npy_trio(paths, nf, out, err);
    for (int i = 0; i < 3; ++i)
        if (nf[i].f) fclose(nf[i].f);
    if (e) qio_qkv_free(out);
    return e;
}

/* ------------------------------------------------------------ dispatch */
#define QIO_PATH_MAX 4096

/* "a,b,c" -> three paths (each non-empty). */
static qio_err split_trio(const char *input, char buf[3][QIO_PATH_MAX],
                          qio_error *err) {
    const char *s = input;
    for (int i = 0; i < 3; ++i) {
        const char *end = i < 2 ? strchr(s, ',') : s + strlen(s);
        if (!end || end == s || (size_t)(end - s) >= QIO_PATH_MAX ||
            (i == 2 && strchr(s, ',')))
            return fail(err, QIO_E_ARG,
                        "input '%s': expected three comma-separated .npy "
                        "paths q,k,v",
                        input);
        memcpy(buf[i], s, (size_t)(end - s));
        buf[i][end - s] = '\0';
        s = end + 1;
    }
    return QIO_OK;
}

static qio_err load_trio_paths(char buf[3][QIO_PATH_MAX], qio_qkv *out,
                               qio_error *err) {
    const char *p[3] = {buf[0], buf[1], buf[2]};
    return qio_load_npy_trio(p, out, err);
}

static int starts_with_npy_magic(const char *path) {
    unsigned char b[6] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(b, 1, 6, f);
    fclose(f);
    return got == 6 && !memcmp(b, "\x93NUMPY", 6);
}

qio_err qio_load_qkv(const char *input, qio_qkv *out, qio_error *err) {
    char buf[3][QIO_PATH_MAX];
    struct stat st;
    clear_error(err);
    if (!input || !*input || !out) return fail(err, QIO_E_ARG, "no input given");
    memset(out, 0, sizeof *out);
    if (strchr(input, ',')) {
        qio_err e = split_trio(input, buf, err);
        return e ? e : load_trio_paths(buf, out, err);
    }
    if (stat(input, &st) != 0)
        return fail(err, QIO_E_OPEN, "%s: cannot open: %s", input,
                    strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        for (int i = 0; i < 3; ++i)
            if (snprintf(buf[i], QIO_PATH_MAX, "%s/%s.npy", input,
                         QKV_NAMES[i]) >= QIO_PATH_MAX)
                return fail(err, QIO_E_ARG, "directory path too long");
        return load_trio_paths(buf, out, err);
    }
    if (starts_with_npy_magic(input))
        return fail(err, QIO_E_ARG,
                    "%s: a single .npy holds one tensor; pass "
                    "q.npy,k.npy,v.npy or a directory holding them",
                    input);
    return qio_load_safetensors(input, out, err);
}

/* ------------------------------------------------------------ writers */
/* A growable string for the header text. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_json_str(sbuf *b, const char *s) {
    sb_str(b, "\"");
    for (; *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            sb_fmt(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\"");
}

static qio_err check_desc(const qio_tensor_desc *t, int64_t *elems,
                          qio_error *err) {
    if (!t->name || !*t->name || t->rank < 0 || t->rank > 8 ||
        (t->dtype != QVA_F32 && t->dtype != QVA_BF16 && t->dtype != QVA_F16))
        return fail(err, QIO_E_ARG, "bad tensor descriptor");
    *elems = shape_elems(t->rank, t->shape);
    if (*elems < 0) return fail(err, QIO_E_ARG, "tensor '%s': bad shape", t->name);
    if (*elems > 0 && !t->data)
        return fail(err, QIO_E_ARG, "tensor '%s': no data", t->name);
    return QIO_OK;
}

static void st_header_text(sbuf *b, const qio_tensor_desc *t, int count,
                           const int64_t *elems, const char *const *meta,
                           int n_meta) {
    uint64_t off = 0;
    sb_str(b, "{");
    if (n_meta > 0) {
        sb_str(b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; ++i) {
            if (i) sb_str(b, ",");
            sb_json_str(b, meta[2 * i]);
            sb_str(b, ":");
            sb_json_str(b, meta[2 * i + 1]);
        }
        sb_str(b, "}");
    }
    for (int i = 0; i < count; ++i) {
        uint64_t bytes = (uint64_t)elems[i] * elem_size(t[i].dtype);
        if (i || n_meta > 0) sb_str(b, ",");
        sb_json_str(b, t[i].name);
        sb_fmt(b, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(t[i].dtype));
        for (int r = 0; r < t[i].rank; ++r)
            sb_fmt(b, "%s%lld", r ? "," : "", (long long)t[i].shape[r]);
        sb_fmt(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
               (unsigned long long)(off + bytes));
        off += bytes;
    }
    sb_str(b, "}");
    while ((8 + b->len) % 8) sb_str(b, " "); /* data starts 8-aligned */
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
static qio_err write_file(FILE *f, const char *path, const void *head,
                          size_t head_len, const qio_tensor_desc *t,
                          const int64_t *elems, int count, qio_error *err) {
    int bad = fwrite(head, 1, head_len, f) != head_len;
    for (int i = 0; i < count && !bad; ++i)
        bad = write_data(f, t[i].data, elems[i], t[i].dtype) != 0;
    if (fclose(f) != 0) bad = 1;
    return bad ? fail(err, QIO_E_WRITE, "%s: write failed", path) : QIO_OK;
}

qio_err qio_write_safetensors(const char *path, const qio_tensor_desc *t,
                              int count, const char *const *meta, int n_meta,
                              qio_error *err) {
    int64_t elems[64];
    sbuf b = {0};
    clear_error(err);
    if (!path || count < 0 || count > 64 || (count && !t) || n_meta < 0 ||
        (n_meta && !meta))
        return fail(err, QIO_E_ARG, "bad arguments to the safetensors writer");
    for (int i = 0; i < count; ++i) {
        qio_err e = check_desc(&t[i], &elems[i], err);
        if (e) return e;
    }
    st_header_text(&b, t, count, elems, meta, n_meta);
    if (b.oom) {
        free(b.s);
        return fail(err, QIO_E_NOMEM, "out of memory for the header");
    }
    unsigned char lenbuf[8];
    wr_le(lenbuf, b.len, 8);
    FILE *f = fopen(path, "wb");
    qio_err e = QIO_OK;
    if (!f) e = fail(err, QIO_E_WRITE, "%s: cannot create: %s", path, strerror(errno));
    else if (fwrite(lenbuf, 1, 8, f) != 8) {
        fclose(f);
        e = fail(err, QIO_E_WRITE, "%s: write failed", path);
    } else {
        e = write_file(f, path, b.s, b.len, t, elems, count, err);
    }
    free(b.s);
    return e;
}

qio_err qio_write_npy(const char *path, const qio_tensor_desc *t,
                      qio_error *err) {
    int64_t elems;
    char dict[512];
    clear_error(err);
    if (!path || !t) return fail(err, QIO_E_ARG, "NULL argument");
    qio_err e = check_desc(t, &elems, err);
    if (e) return e;
    if (t->dtype == QVA_BF16)
        return fail(err, QIO_E_DTYPE, "bf16 is not a numpy dtype");
    int len = snprintf(dict, sizeof dict,
                       "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       t->dtype == QVA_F32 ? "<f4" : "<f2");
    for (int r = 0; r < t->rank; ++r)
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld%s",
                        (long long)t->shape[r],
                        (r + 1 < t->rank || t->rank == 1) ? ", " : "");
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    /* numpy pads so the data starts 64-aligned, ending in '\n' */
    while ((10 + len + 1) % 64) dict[len++] = ' ';
    dict[len++] = '\n';
    unsigned char head[10 + sizeof dict];
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    wr_le(head + 8, (uint64_t)len, 2);
    memcpy(head + 10, dict, (size_t)len);
    FILE *f = fopen(path, "wb");
    if (!f) return fail(err, QIO_E_WRITE, "%s: cannot create: %s", path, strerror(errno));
    return write_file(f, path, head, 10 + (size_t)len, t, &elems, 1, err);
}
