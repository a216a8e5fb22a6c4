/*
 * .npy: a magic, a version, a header length and a Python dict literal
 * describing one array, then the data.  Three files (q, k, v) make an
 * input; the writer makes v1 files for tests.
 */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* numpy refuses headers past 10 kB by default; we allow a generous 1 MiB */
#define QIO_NPY_MAX_HEADER (1u << 20)

/* ------------------------------------------------------------ reading */
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

/* ------------------------------------------------------------ writing */
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
